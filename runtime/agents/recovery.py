"""Recovery at wake: turns whose process died mid-run are closed truthfully.

A run's chunk log gets its final chunk when the run ends (completed, aborted or
failed). A log without one belongs to a run that was cut off: the actor was killed, or
its node went away. Waking is the constructor path, so the agent's constructor closes
every such run before anything reads the history:

- the partial assistant message stays (partial output is never lost) and its metadata
  says ``status: "interrupted"``;
- its text and reasoning parts that were still streaming are closed, and tool calls
  left without output become tool errors (so no prompt carries an unresolved call);
- the chunk log gets the chunks a client needs to end the stream the same way (the
  ``*-end`` of open parts, ``tool-output-error`` for open calls, then ``error``), the
  last one final, so a resume replays a complete stream and the run is not found open
  again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from thinkray.runtime.chunks import UIChunk
from thinkray.runtime.turn.persistence import enforce_row_size
from thinkray.storage.protocols import SessionStore
from thinkray.storage.types import ChunkWrite, PartWrite, StreamFlush

log = logging.getLogger("thinkray.recovery")

__all__ = [
    "INTERRUPTED_ERROR",
    "CallOutcome",
    "RecoveredRun",
    "close_stream_of_stopped_run",
    "recover_interrupted_runs",
]

INTERRUPTED_ERROR = "interrupted: the agent stopped before the turn finished"
"""The error a cut-off run ends with (its stream's ``error`` chunk, its open tool calls)."""

_OPEN_TOOL_STATES = ("input-streaming", "input-available", "approval-requested")


CallOutcome = Callable[[str, str], "dict[str, Any] | None"]
"""``(run_id, tool_call_id)`` -> what the agent's durable tool-call row says of an open
call, as the part's fields: ``{"state": "output-available", "output": ...}``,
``{"state": "output-error", "errorText": ...}``, ``{"state": "output-denied"}``, or an
open state (``approval-requested``, ``input-available``: the call is still awaiting
approval or its executor); None when there is no row (the call is interrupted)."""

_OPEN_OUTCOMES = ("approval-requested", "input-available")


@dataclass(frozen=True)
class RecoveredRun:
    """A run closed at wake: its id, session and assistant message (None when the
    message was gone, e.g. its session was deleted), and the tool calls left open
    because their durable rows are (awaiting approval, or held by an executor)."""

    run_id: str
    session_id: str | None
    message_id: str | None
    open_calls: tuple[str, ...] = ()


def recover_interrupted_runs(
    store: SessionStore, outcome: CallOutcome | None = None
) -> list[RecoveredRun]:
    """Close every run whose chunk log has no final chunk (see the module doc). With
    ``outcome`` (the agent's durable tool calls), a call left without output gets what
    its row says instead of the interrupted error: its stored result or error, or it
    stays open while its row is awaiting approval or an executor.

    Call it only where no run of this store is in flight: the agent's constructor.
    Returns what was closed, oldest first. Idempotent: a closed run's log is final."""
    recovered = []
    for run_id in store.open_generations():
        chunks = store.get_chunks(run_id)
        start = next((c for c in chunks if c.get("type") == "start"), None)
        message_id = start.get("messageId") if start else None
        row = store.get_message_row(message_id) if isinstance(message_id, str) else None
        if row is None:
            # Nothing left to mark (the session was cleared or deleted): drop the log.
            store.delete_chunks([run_id])
            recovered.append(RecoveredRun(run_id, None, None))
            continue

        def known(call_id: str, run_id: str = run_id) -> dict[str, Any] | None:
            return outcome(run_id, call_id) if outcome is not None else None

        closing = _closing_chunks(chunks, known)
        writes, still_open = _closed_parts(row.message, known)
        metadata = dict(row.message.get("metadata") or {})
        metadata["status"] = "interrupted"
        envelope = {"id": row.id, "role": row.role, "metadata": metadata, "parts": []}
        store.flush_stream(
            StreamFlush(
                session_id=row.session_id,
                message=envelope,
                use_head=False,
                parts=writes,
                chunks=[
                    ChunkWrite(run_id, len(chunks) + i, chunk, i == len(closing) - 1)
                    for i, chunk in enumerate(closing)
                ],
            )
        )
        log.warning(
            "run %s was interrupted (message %s, session %s): closed at wake",
            run_id,
            row.id,
            row.session_id,
        )
        recovered.append(RecoveredRun(run_id, row.session_id, row.id, tuple(still_open)))
    return recovered


def close_stream_of_stopped_run(
    store: SessionStore, session_id: str, run_id: str, outcome: CallOutcome | None = None
) -> list[UIChunk]:
    """For a run the agent stops under it (a forced hibernation, ``Think.close``): write
    the chunks that close what its log left open, but not the final ``error``, and
    return them followed by that ``error``: what its live consumers must be given.

    The log stays without a final chunk, so the next wake still finds the run cut off:
    :func:`recover_interrupted_runs` closes its message, may resume it, and appends
    only the ``error`` (nothing else is left open). The stored replay then ends
    exactly as the live stream did. Call it once the run's recorder has flushed and
    its tool calls' rows say what a wake would (the calls died with the run)."""
    chunks = store.get_chunks(run_id)
    known = (lambda call_id: outcome(run_id, call_id)) if outcome is not None else _unknown
    closing = _closing_chunks(chunks, known)
    body = closing[:-1]
    if body:
        store.flush_stream(
            StreamFlush(
                session_id=session_id,
                chunks=[ChunkWrite(run_id, len(chunks) + i, c) for i, c in enumerate(body)],
            )
        )
    return closing


def _unknown(call_id: str) -> None:
    return None


def _closing_chunks(
    chunks: list[dict[str, Any]], known: Callable[[str], dict[str, Any] | None]
) -> list[UIChunk]:
    """The chunks that end a cut-off stream: what the log left open, then ``error``."""
    open_text: dict[str, None] = {}
    open_reasoning: dict[str, None] = {}
    open_calls: dict[str, None] = {}
    for chunk in chunks:
        kind = chunk.get("type")
        ident = str(chunk.get("id"))
        call = str(chunk.get("toolCallId"))
        if kind == "text-start":
            open_text[ident] = None
        elif kind == "text-end":
            open_text.pop(ident, None)
        elif kind == "reasoning-start":
            open_reasoning[ident] = None
        elif kind == "reasoning-end":
            open_reasoning.pop(ident, None)
        elif kind in ("tool-input-start", "tool-input-available"):
            open_calls[call] = None
        elif kind in (
            "tool-output-available",
            "tool-output-error",
            "tool-input-error",
            "tool-output-denied",
        ):
            open_calls.pop(call, None)
    closing: list[UIChunk] = []
    closing.extend({"type": "text-end", "id": i} for i in open_text)
    closing.extend({"type": "reasoning-end", "id": i} for i in open_reasoning)
    for call in open_calls:
        outcome = known(call) or {}
        state = outcome.get("state")
        if state == "output-available":
            closing.append(
                {"type": "tool-output-available", "toolCallId": call, "output": outcome["output"]}
            )
        elif state == "output-denied":
            closing.append({"type": "tool-output-denied", "toolCallId": call})
        elif state not in _OPEN_OUTCOMES:
            error = outcome.get("errorText", INTERRUPTED_ERROR)
            closing.append({"type": "tool-output-error", "toolCallId": call, "errorText": error})
    closing.append({"type": "error", "errorText": INTERRUPTED_ERROR})
    return closing


def _closed_parts(
    message: dict[str, Any], known: Callable[[str], dict[str, Any] | None]
) -> tuple[list[PartWrite], list[str]]:
    """Writes that close the message's parts left open by the cut-off run, and the
    tool calls that stay open (their durable rows are)."""
    writes = []
    still_open = []
    for idx, part in enumerate(message.get("parts") or ()):
        kind = part.get("type")
        if kind == "dynamic-tool" and part.get("state") in _OPEN_TOOL_STATES:
            outcome = known(str(part.get("toolCallId")))
            if outcome is None:
                fixed = dict(part, state="output-error", errorText=INTERRUPTED_ERROR)
            else:
                fixed = {**part, **outcome}
                if outcome.get("state") in _OPEN_OUTCOMES:
                    still_open.append(str(part.get("toolCallId")))
                    if fixed == part:
                        continue
        elif kind in ("text", "reasoning") and part.get("state") == "streaming":
            fixed = dict(part, state="done")
        else:
            continue
        writes.append(PartWrite(message["id"], idx, enforce_row_size(fixed)))
    return writes, still_open
