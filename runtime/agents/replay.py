"""A resent message id: replay the turn that answered it, never run a second one.

A user message id is the turn's idempotency key (a client retrying a POST, a handle
re-sending after a lost reply). When a turn brings an id the store already holds:

- in another session: refused (:class:`MessageIdConflictError`): ids are unique per
  agent file, and storing the message under the other session or dropping it would
  both lose the user's text;
- in this session, answered (its last answer ended ``completed``, ``aborted`` or
  ``error``): the answer is replayed (the run's chunk log when it is still kept, else
  chunks rebuilt from the stored message) and nothing runs or is written;
- in this session, unanswered or cut off by a crash (``interrupted``) and still the
  latest turn: the turn answers it anew (the documented recovery after a
  ``RunInterruptedError``), without storing it twice;
- in this session but rewound, or followed by another user message with no answer of
  its own: refused as well.

A resend while its own run is still in flight never gets here: the session is busy
(:class:`~thinkray.runtime.status.SessionBusyError`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from thinkray.runtime.chunks import UIChunk, from_chunk_log
from thinkray.runtime.errors import MessageIdConflictError
from thinkray.runtime.turn.stream import RunStream

__all__ = ["Answered", "answer_chunks", "check_resent", "message_chunks"]

FINAL_STATUSES = frozenset({"completed", "aborted", "error"})
"""Statuses of an answer that is a run's result (``interrupted`` is not: that run died)."""


@dataclass(frozen=True)
class Answered:
    """A resent message that was answered: ``answer`` is its last stored answer."""

    message_id: str
    answer: dict[str, Any]


def check_resent(store: Any, session_id: str, message_id: str) -> Answered | None:
    """What a turn bringing ``message_id`` to ``session_id`` does: None to run (a new
    id, or one to answer anew), :class:`Answered` to replay. Raises
    :class:`MessageIdConflictError` for an id it may neither store nor answer."""
    owner = store.message_session(message_id)
    if owner is None:
        return None
    if owner != session_id:
        raise MessageIdConflictError(
            f"message id {message_id!r} is already used by another session of this agent "
            "(message ids are unique per agent); send the message under a new id",
            message_id,
            session_id,
        )
    history = store.get_history(session_id)
    ids = [m["id"] for m in history]
    if message_id not in ids:
        raise MessageIdConflictError(
            f"message {message_id!r} is in session {session_id!r} but not on its current "
            "path (rewound, or on another branch); send it again under a new id",
            message_id,
            session_id,
        )
    at = ids.index(message_id)
    answers: list[dict[str, Any]] = []
    for later in history[at + 1 :]:
        if later.get("role") == "user":
            break
        if later.get("role") == "assistant":
            answers.append(later)
    if answers and _status(answers[-1]) in FINAL_STATUSES:
        return Answered(message_id, answers[-1])
    if all(m.get("role") != "user" for m in history[at + 1 :]):
        return None  # the latest turn, never answered or its run died: answer it now
    if answers:
        return Answered(message_id, answers[-1])
    raise MessageIdConflictError(
        f"message {message_id!r} of session {session_id!r} was followed by other "
        "messages before it was answered; send it again under a new id",
        message_id,
        session_id,
    )


def _status(message: dict[str, Any]) -> str | None:
    metadata = message.get("metadata")
    return metadata.get("status") if isinstance(metadata, dict) else None


def answer_chunks(store: Any, finished: list[RunStream], answer: dict[str, Any]) -> list[UIChunk]:
    """The chunks that streamed ``answer``: from a finished run's stream in memory,
    else its chunk log, else rebuilt from the stored message (the log was pruned)."""
    for stream in finished:
        if stream.done and stream.message_id == answer["id"] and stream.chunks:
            return list(stream.chunks)
    for generation in reversed(store.chunk_generations()):
        chunks = store.get_chunks(generation)
        first = chunks[0] if chunks else {}
        if first.get("type") == "start" and first.get("messageId") == answer["id"]:
            return from_chunk_log(chunks)
    return message_chunks(answer)


def message_chunks(message: dict[str, Any]) -> list[UIChunk]:
    """A stored assistant message as the UI chunks that rebuild it on a client: one
    block per text or reasoning part, each tool call with its outcome, data parts,
    files and sources, steps as they were marked, then ``finish`` with the metadata."""
    out: list[dict[str, Any]] = [{"type": "start", "messageId": message["id"]}]
    in_step = False
    for index, part in enumerate(message.get("parts") or ()):
        kind = str(part.get("type", ""))
        if kind == "step-start":
            if in_step:
                out.append({"type": "finish-step"})
            out.append({"type": "start-step"})
            in_step = True
        else:
            out.extend(_part_chunks(index, kind, part))
    if in_step:
        out.append({"type": "finish-step"})
    metadata = message.get("metadata") or {}
    finish: dict[str, Any] = {"type": "finish", "messageMetadata": metadata}
    if metadata.get("finishReason"):
        finish["finishReason"] = metadata["finishReason"]
    out.append(finish)
    return cast("list[UIChunk]", out)


def _part_chunks(index: int, kind: str, part: dict[str, Any]) -> list[dict[str, Any]]:
    if kind in ("text", "reasoning"):
        block = f"{kind}-{index}"
        start: dict[str, Any] = {"type": f"{kind}-start", "id": block}
        if part.get("providerMetadata"):
            start["providerMetadata"] = part["providerMetadata"]
        delta = {"type": f"{kind}-delta", "id": block, "delta": part.get("text", "")}
        return [start, delta, {"type": f"{kind}-end", "id": block}]
    if kind == "dynamic-tool":
        return _tool_chunks(part)
    if kind.startswith("data-"):
        data = {"type": kind, "data": part.get("data")}
        if "id" in part:
            data["id"] = part["id"]
        return [data]
    if kind in ("file", "source-url", "source-document"):
        return [dict(part)]  # the chunk carries the part's own fields
    return []


def _tool_chunks(part: dict[str, Any]) -> list[dict[str, Any]]:
    call = part.get("toolCallId")
    out: list[dict[str, Any]] = [
        {
            "type": "tool-input-available",
            "toolCallId": call,
            "toolName": part.get("toolName"),
            "input": part.get("input"),
            "dynamic": True,
        }
    ]
    state = part.get("state")
    if state == "output-available":
        out.append(
            {
                "type": "tool-output-available",
                "toolCallId": call,
                "output": part.get("output"),
                "dynamic": True,
            }
        )
    elif state == "output-error":
        out.append(
            {
                "type": "tool-output-error",
                "toolCallId": call,
                "errorText": part.get("errorText", ""),
                "dynamic": True,
            }
        )
    elif state == "output-denied":
        out.append({"type": "tool-output-denied", "toolCallId": call})
    return out
