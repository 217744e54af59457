"""Compaction and tool-output pruning (seed 002 "Compaction").

Compaction replaces a stretch of history with a summary so the next turn fits.

**Threshold.** ``usable = model.context_window - reserve`` with
``reserve = min(config.reserve_tokens, model.max_output_tokens)``; auto-compaction
fires when ``context_window_used >= usable`` (the session rollup the seed defines,
``SessionInfo.context_window_used``), before the turn's model call, against the model
the turn will use (:meth:`CompactionMixin.model_for_turn`).

**Rollups after a compaction.** The seed's ``summary_tokens`` is "for the next
rollup": a compaction resets the context part of the session rollups to what the next
call will carry — ``prompt_tokens = summary_tokens + tail tokens``, completion,
reasoning and cache counts 0 — in the same transaction, so every reader of
``context_window_used`` (the threshold, the per-turn model switch check, a status
UI) sees the room it made. ``total_tokens`` and ``cost_usd`` (what was billed) are
kept; the rollup before the compaction is kept in ``metadata.compaction.rollup_before``.

**Artifact.** A synthetic assistant message whose only part is
``{"type": "data-compaction", "data": {summary, tail_start_id, auto, summary_tokens,
covers: {first_id, last_id}, hidden_at}}``, inserted into the tree right above the
first message of the tail (``SessionStore.insert_before``): every path reads the
summary, then the tail, so the stored history is in the order the model reads it
(the head does not move). The summarized messages are soft-hidden with ``set_hidden(..., hidden_at)`` — never
deleted — in the same transaction. ``covers`` is the first and last summarized message
in path order, as a mapping because the store's rewind reads a *list* as the exact
ids covered and a mapping as a range on the path. Exactly the messages on the path
between them whose ``hidden_at`` equals ``data.hidden_at`` were hidden by this
compaction (:func:`summarized_ids`): what a rewind past the compaction un-hides. No table of its own: the part is the
record (``thinkray.storage.session_store`` indexes ``parts.type``); :meth:`list_compactions`
reads them back.

**The model's view** is the summary followed by every visible message from
``tail_start_id`` on (:func:`compaction_view`), and the summary is system-level, as
seed 000 has it ("replaced with a single system message containing the summary";
:func:`~thinkray.runtime.turn.context.to_model_messages` makes it a ``system``
message, which the Anthropic adapter joins to the system prompt). A compaction
written before it was inserted above its tail sits after the tail; the view moves it
first.

**Tail.** The tail is counted in messages of the model's view, as the seed's default
reads: ``tail_turns = 2`` is "one user message + one assistant response". A trailing
user message still waiting for its answer always stays and is not counted. Tokens
are estimated as ``ceil(chars / 4)`` of a plain-text rendering (:func:`estimate_tokens`,
:func:`render_message`): cheap, provider-neutral, and only ever compared against
budgets. If the tail is over ``tail_budget_pct * usable``, it drops to one message
and a warning is logged (the seed's default).

**Summarizer.** One no-tools call through the same loop (:func:`thinkray.runtime.turn.loop.run_loop`,
``max_steps=1``, no loop retries), with ``temperature``, a hard ``max_output_tokens``
cap, a ``timeout`` and :data:`SUMMARY_SYSTEM_PROMPT` (sections Goal / Progress /
Decisions / Next Steps). Its input is a plain transcript of the summarized messages.
Its usage is recorded in the compaction's metadata, not added to the session rollups.

**Failure ladder.**

- Transient (``ModelError.transient``, timeout): retry ``retry_on_transient`` times
  with ``retry_backoff * 2**n`` backoff (status ``retrying`` while a run waits), then
  give up: auto-compaction logs a warning and the turn proceeds uncompacted; a manual
  one raises :class:`SummarizerError`. Nothing is written.
- Spec limit (the transcript exceeds the summarizer's input: its context window minus
  the output cap and the system prompt): prune tool outputs (just enough) and retry if
  ``prune_tool_outputs``; if still too big, summarize in chunks and concatenate if
  ``chunked_summarize``; else keep head + tail and drop the middle if ``drop_middle``;
  else raise :class:`CompactionSpecLimitError` having written nothing (outputs pruned
  by an enabled prune rung stay pruned: pruning is a valid pass of its own).

**Pruning** (:meth:`CompactionMixin.prune_tool_outputs`) walks completed turns from
the newest old one backwards and replaces the output of completed tool calls of
unprotected tools with ``<output pruned, N tokens>`` (input and state kept), until the
target is reclaimed. It never touches the current turn or the last two turns. It runs
on request and automatically as the first rung before a summary that would not fit
(pruning is lossy, so it reclaims only what the summarizer cannot take).

**Progress.** Auto-compaction runs before the turn's stream exists; its outcome goes
out through ``ChatOptions.emit`` (which holds it until the stream started, so it lands
right after ``start``) as a transient ``data-status`` chunk
(``data: {kind: "compaction", state: "done" | "failed" | "skipped", message:
"summarized N earlier messages", ...}``): live and in the replay log, never a stored
part — a ``data-compaction`` part on the turn's own message would make
``to_model_messages`` read that whole message as a summary.

**Hooks used** (see :class:`CompactionMixin`): ``Think.prepare_turn`` (auto-compaction
runs there, after the user message landed and before the assistant message exists:
the synthetic message goes above the tail, which ends with that user message, the
assistant message's parent), ``Think.context_view`` (the view) and
``Think.reserve_session`` (busy while a manual compaction runs).
``Think.compact_for_model`` (the per-turn model switch) may call
``compact(session, auto=True, model=...)`` from inside its own turn, before the stream
(``Think.own_turn``). An abort during auto-compaction aborts the turn; the user
message stays, nothing of the compaction is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ConfigDict, Field
from thinkray.runtime.abort import AbortController, AbortError, AbortSignal
from thinkray.runtime.chunks import DataChunk, UIChunk
from thinkray.runtime.errors import (  # re-exported: the errors live in thinkray.runtime.errors
    CompactionError as CompactionError,
)
from thinkray.runtime.errors import (
    CompactionSpecLimitError as CompactionSpecLimitError,
)
from thinkray.runtime.errors import InvalidArgumentError
from thinkray.runtime.errors import (
    NothingToCompactError as NothingToCompactError,
)
from thinkray.runtime.errors import (
    SummarizerError as SummarizerError,
)
from thinkray.runtime.messages import new_id
from thinkray.runtime.models.base import ModelError, ModelMessage, TextContent
from thinkray.runtime.observability import tracing
from thinkray.runtime.observability.metrics import metrics
from thinkray.runtime.remote import idempotent, remote
from thinkray.runtime.turn.context import render_output
from thinkray.runtime.turn.loop import LoopResult, RetryPolicy, run_loop
from thinkray.runtime.typed_model import TypedModel
from thinkray.runtime.usage import Usage
from thinkray.storage.types import PartWrite, StreamFlush

if TYPE_CHECKING:
    from thinkray.runtime.agents.runs import ChatOptions
    from thinkray.runtime.capabilities.host import CompactionHost

log = logging.getLogger("thinkray.compaction")

CHARS_PER_TOKEN = 4
PRUNE_STUB = "<output pruned, {tokens} tokens>"
_STUB_RE = re.compile(r"^<output pruned, \d+ tokens>$")
PROTECTED_RECENT_TURNS = 2
"""Pruning never touches the current turn or this many completed turns before it."""

SUMMARY_SYSTEM_PROMPT = """\
You summarize a conversation between a user and an AI assistant so that the assistant \
can continue the work without the original messages.

Write Markdown with exactly these four sections, in this order, and nothing else:

## Goal
What the user wants overall, including constraints and preferences they stated.

## Progress
What has been done so far: results, files and identifiers touched, tool findings \
that still matter.

## Decisions
Choices made and why, including approaches that were rejected.

## Next Steps
What remains to be done, open questions, and what the assistant was about to do.

Be concise and factual. Keep exact names, paths, numbers, commands and error messages. \
Do not invent anything. Do not call tools. Do not address the user."""

_SUMMARY_REQUEST = (
    "Summarize the conversation below.\n\n<conversation>\n{transcript}\n</conversation>"
)
_CHUNK_REQUEST = (
    "Summarize part {index} of {count} of a long conversation (the parts are summarized "
    "separately and joined).\n\n<conversation>\n{transcript}\n</conversation>"
)
_OMITTED = "[... {count} messages omitted from the middle to fit the summarizer's input ...]"


# -- estimates and rendering ------------------------------------------------------------


def estimate_tokens(text: str) -> int:
    """``ceil(len(text) / 4)``: a provider-neutral estimate, used only against budgets."""
    return math.ceil(len(text) / CHARS_PER_TOKEN) if text else 0


def _json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"))
    except (TypeError, ValueError):
        return str(value)


def compaction_part(message: dict[str, Any]) -> dict[str, Any] | None:
    """The ``data-compaction`` part of a synthetic compaction message, else None."""
    if message.get("role") != "assistant":
        return None
    for part in message.get("parts", ()):
        if part.get("type") == "data-compaction":
            return part
    return None


def render_message(message: dict[str, Any]) -> str:
    """A message as plain transcript text (what the summarizer reads and what token
    estimates measure). Reasoning is left out: the summary keeps conclusions."""
    lines: list[str] = []
    for part in message.get("parts", ()):
        ptype = part.get("type")
        if ptype == "text" and part.get("text"):
            lines.append(part["text"])
        elif ptype == "file":
            lines.append(f"[file {part.get('filename') or ''} {part.get('mediaType') or ''}]")
        elif ptype == "dynamic-tool":
            state = part.get("state")
            lines.append(f"[tool call {part.get('toolName')} {_json(part.get('input'))}]")
            if state == "output-available":
                lines.append(f"[tool result] {render_output(part.get('output'))}")
            elif state == "output-error":
                lines.append(f"[tool error] {part.get('errorText') or ''}")
            elif state == "output-denied":
                lines.append("[tool call denied]")
        elif ptype == "data-compaction":
            data = part.get("data") or {}
            lines.append(f"[summary of the earlier conversation]\n{data.get('summary', '')}")
    return f"{str(message.get('role', '')).upper()}:\n" + "\n".join(lines)


def message_tokens(message: dict[str, Any]) -> int:
    """Estimated tokens of one stored message (its rendered parts)."""
    return estimate_tokens(render_message(message))


def is_pruned(output: Any) -> bool:
    """True if a tool output is already the pruned stub."""
    return isinstance(output, str) and bool(_STUB_RE.match(output))


def compaction_view(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The model's view of a visible history: the latest compaction's summary, then
    every message from its ``tail_start_id`` on (the synthetic message first: it sits
    there in the tree, or, written by an older version, after its tail). Without a compaction the history is returned as is. If the tail start is
    not in the history (a branch copied the messages under new ids), the summary is
    followed by every other visible message: only the tail and later survive a copy."""
    index = None
    for i in range(len(messages) - 1, -1, -1):
        if compaction_part(messages[i]) is not None:
            index = i
            break
    if index is None:
        return list(messages)
    synthetic = messages[index]
    part = compaction_part(synthetic) or {}
    tail_start = (part.get("data") or {}).get("tail_start_id")
    start = 0
    for i, message in enumerate(messages):
        if message.get("id") == tail_start:
            start = i
            break
    return [synthetic, *(m for m in messages[start:] if m is not synthetic)]


def summarized_ids(store: Any, session_id: str, compaction_message_id: str) -> list[str]:
    """The ids a compaction hid (path order): the messages on the path to the synthetic
    message, between ``covers.first_id`` and ``covers.last_id``, whose ``hidden_at`` is the
    compaction's. What "rewinding past a compaction" un-hides."""
    rows = store.get_path(session_id, leaf_id=compaction_message_id)
    part = compaction_part(rows[-1].message) if rows else None
    if part is None:
        raise InvalidArgumentError(f"message {compaction_message_id!r} is not a compaction")
    data = part.get("data") or {}
    covers = data.get("covers") or {}
    if isinstance(covers, dict):
        first, last = covers.get("first_id"), covers.get("last_id")
    else:  # an explicit list of ids
        first, last = (covers[0], covers[-1]) if covers else (None, None)
    hidden_at = data.get("hidden_at")
    out: list[str] = []
    inside = False
    for row in rows:
        if row.id == first:
            inside = True
        if inside and row.hidden_at is not None and row.hidden_at == hidden_at:
            out.append(row.id)
        if row.id == last:
            break
    return out


def _turn_groups(messages: list[dict[str, Any]]) -> list[list[int]]:
    """Indexes grouped by turn: a turn starts at each user message."""
    groups: list[list[int]] = []
    for i, message in enumerate(messages):
        if message.get("role") == "user" or not groups:
            groups.append([i])
        else:
            groups[-1].append(i)
    return groups


# -- configuration ----------------------------------------------------------------------


class SmartRecovery(TypedModel):
    """The seed's spec-limit ladder, tried in this order."""

    model_config = ConfigDict(extra="forbid")

    prune_tool_outputs: bool = True
    chunked_summarize: bool = True
    drop_middle: bool = True


class CompactionConfig(TypedModel):
    """Compaction settings. The first five fields are the seed's normative shape; the
    rest configure the summarizer and pruning. Per session (or thread), overrides live
    in the session row's ``settings["compaction"]`` (JSON fields only), merged over the
    store-wide default settings, then over the agent default
    (:attr:`CompactionMixin.compaction_config`).
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    reserve_tokens: int = Field(20_000, ge=0)
    tail_turns: int = Field(2, ge=1)
    tail_budget_pct: float = Field(0.25, gt=0, le=1)
    retry_on_transient: int = Field(2, ge=0)
    smart_recovery: SmartRecovery = Field(default_factory=SmartRecovery)

    auto: bool = True
    summary_model: Any = Field(default=None, exclude=True)
    """A :class:`~thinkray.runtime.models.base.Model`, a zero-argument factory returning one, or None
    (the agent's model). Pick the provider's cheapest tier. Not persisted."""
    temperature: float = Field(0.2, ge=0, le=2)
    max_output_tokens: int = Field(2_048, ge=16)
    timeout: float = Field(60.0, gt=0)
    retry_backoff: float = Field(1.0, ge=0)
    protected_tools: tuple[str, ...] = ("todo", "todo_write", "todowrite", "task", "taskstate")
    """Tool names (or globs) whose outputs pruning never touches."""
    prune_min_tokens: int = Field(64, ge=0)
    """Outputs smaller than this are not worth a stub."""

    def reserve_for(self, model: Any) -> int:
        """``min(reserve_tokens, model.max_output_tokens)`` (the seed's default)."""
        max_output = getattr(model, "max_output_tokens", None)
        return min(self.reserve_tokens, max_output) if max_output else self.reserve_tokens

    def usable(self, model: Any) -> int:
        """Tokens usable before compaction fires for ``model``: window minus reserve."""
        return int(getattr(model, "context_window", 0)) - self.reserve_for(model)

    def merged(self, overrides: dict[str, Any] | None) -> CompactionConfig:
        """A copy with ``overrides`` applied (validated: a bad value raises)."""
        if not overrides:
            return self
        data = self.model_dump()
        for key, value in overrides.items():
            if key == "smart_recovery" and isinstance(value, dict):
                data["smart_recovery"] = {**data["smart_recovery"], **value}
            else:
                data[key] = value
        merged = CompactionConfig.model_validate(data)
        merged.summary_model = self.summary_model
        return merged


@dataclass
class PruneResult:
    """What :meth:`Compaction.prune_tool_outputs` did: ``pruned`` tool outputs
    replaced by a stub, ``reclaimed_tokens`` (estimated) saved, in the messages
    ``message_ids``."""

    pruned: int = 0
    reclaimed_tokens: int = 0
    message_ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Every field, as a dict."""
        return {
            "pruned": self.pruned,
            "reclaimed_tokens": self.reclaimed_tokens,
            "message_ids": self.message_ids,
        }


@dataclass
class CompactionResult:
    """What one compaction wrote: the synthetic summary message ``message_id``, the
    ``summarized`` messages it hid (``covers``: first and last id, path order), where
    the kept tail starts, the recovery ``strategy`` used, any ``warnings`` and the
    pruning done on the way (``pruned``)."""

    session_id: str
    message_id: str
    summary: str
    summary_tokens: int
    tail_start_id: str
    covers: tuple[str, str]
    auto: bool
    summarized: int
    strategy: str  # "one-shot" | "pruned" | "chunked" | "drop-middle"
    tail_messages: int
    warnings: list[str] = field(default_factory=list)
    pruned: PruneResult | None = None

    def to_dict(self) -> dict[str, Any]:
        """Every field, as a JSON-ready dict."""
        return {
            "session_id": self.session_id,
            "message_id": self.message_id,
            "summary": self.summary,
            "summary_tokens": self.summary_tokens,
            "tail_start_id": self.tail_start_id,
            "covers": list(self.covers),
            "auto": self.auto,
            "summarized": self.summarized,
            "strategy": self.strategy,
            "tail_messages": self.tail_messages,
            "warnings": list(self.warnings),
            "pruned": self.pruned.to_dict() if self.pruned else None,
        }


@dataclass
class _Plan:
    summarized: list[dict[str, Any]]  # view order (an earlier summary first)
    hide_ids: list[str]  # path order
    tail: list[dict[str, Any]]
    tail_tokens: int
    warnings: list[str]


# -- the mixin ----------------------------------------------------------------------------


COMPACTION_SETTINGS_KEY = "compaction"
"""Where a session's (or the store-wide default) settings keep compaction overrides."""


class Compaction:
    """Auto and manual compaction and tool-output pruning, attached to an agent by
    composition (``agent.compaction``; :class:`~thinkray.runtime.agents.agent.Agent`
    builds one). Works against :class:`~thinkray.runtime.capabilities.host.CompactionHost`:
    the agent's store, status, sessions and turns, plus its ``compaction_config``,
    ``get_summary_model(config)`` and ``model_for_turn(session_id, message)``.

    - ``get_compaction_config(session_id)`` merges the session's effective
      ``settings["compaction"]`` over the agent default (the store-wide default
      settings, then the session's or thread's own);
      ``set_compaction_config(session_id, overrides | None)``.
    - ``compaction_threshold(session_id, model)``, ``needs_compaction(session_id, model)``.
    - ``await compact(session_id, auto=False, model=None)`` → :class:`CompactionResult`
      (``auto=True``: best effort, ``None`` when it could not compact).
    - ``prune_tool_outputs(session_id, target_tokens=None)`` → :class:`PruneResult`.
    - ``list_compactions(session_id)``.
    - ``await prepare_turn(options)``: the turn hook (auto-compaction with a progress
      note through ``options.emit``); the view hook is :func:`compaction_view`.

    A manual compaction holds the session with ``reserve_session``.
    """

    def __init__(self, host: CompactionHost) -> None:
        self.host = host

    # -- configuration --------------------------------------------------------------

    @idempotent
    @remote
    def get_compaction_config(self, session_id: str | None = None) -> CompactionConfig:
        """The session's effective config: agent default, store-wide then session overrides."""
        config = self.host.compaction_config
        sid = session_id or self.host.current_session_id
        if sid is None:
            return config
        store = self.host.store
        effective = getattr(store, "get_effective_settings", None)
        settings = effective(sid) if effective is not None else store.get_session(sid).settings
        overrides = (settings or {}).get(COMPACTION_SETTINGS_KEY)
        return config.merged(overrides) if isinstance(overrides, dict) else config

    @remote
    def set_compaction_config(
        self, session_id: str | None, overrides: dict[str, Any] | CompactionConfig | None
    ) -> CompactionConfig:
        """Store per-session overrides (validated first; None clears them)."""
        sid = self.host.sessions.resolve(session_id)
        if isinstance(overrides, CompactionConfig):
            overrides = overrides.model_dump()
        if overrides is not None:
            self.host.compaction_config.merged(overrides)  # raises on a bad value, before any write
        info = self.host.store.get_session(sid)
        settings = dict(info.settings or {})
        if overrides:
            settings[COMPACTION_SETTINGS_KEY] = dict(overrides)
        else:
            settings.pop(COMPACTION_SETTINGS_KEY, None)
        self.host.store.update_session(sid, settings=settings)
        return self.get_compaction_config(sid)

    # -- threshold ------------------------------------------------------------------

    @idempotent
    @remote
    def compaction_threshold(self, session_id: str | None = None, model: Any = None) -> int:
        """``usable = context_window - min(reserve_tokens, max_output_tokens)``."""
        model = model or self.host.get_model()
        return self.get_compaction_config(session_id).usable(model)

    @idempotent
    @remote
    def needs_compaction(self, session_id: str | None = None, model: Any = None) -> bool:
        """``context_window_used >= usable`` for ``model`` (default ``get_model()``)."""
        sid = self.host.sessions.resolve(session_id)
        used = self.host.store.get_session(sid).context_window_used
        return used >= self.compaction_threshold(sid, model)

    # -- pruning --------------------------------------------------------------------

    @remote
    def prune_tool_outputs(
        self, session_id: str | None = None, *, target_tokens: int | None = None
    ) -> PruneResult:
        """Stub out old tool outputs (newest old turn first) until ``target_tokens``
        are reclaimed (None: everything eligible). Writes through ``flush_stream``."""
        sid = self.host.sessions.resolve(session_id)
        config = self.get_compaction_config(sid)
        history = self.host.store.get_history(sid)
        groups = _turn_groups(history)
        protect = PROTECTED_RECENT_TURNS
        if self._run_in_flight(sid):
            protect += 1  # the current turn, on top of the two before it
        candidates = groups[: max(0, len(groups) - protect)]
        result = PruneResult()
        writes: list[PartWrite] = []
        for group in reversed(candidates):
            for index in reversed(group):
                message = history[index]
                if message.get("role") != "assistant":
                    continue
                for idx, part in enumerate(message.get("parts", ())):
                    if target_tokens is not None and result.reclaimed_tokens >= target_tokens:
                        break
                    if (
                        part.get("type") != "dynamic-tool"
                        or part.get("state") != "output-available"
                    ):
                        continue
                    if self._is_protected(part.get("toolName", ""), config):
                        continue
                    output = part.get("output")
                    if is_pruned(output):
                        continue
                    tokens = estimate_tokens(render_output(output))
                    if tokens < max(config.prune_min_tokens, 1):
                        continue
                    stub = PRUNE_STUB.format(tokens=tokens)
                    writes.append(PartWrite(message["id"], idx, dict(part, output=stub)))
                    result.pruned += 1
                    result.reclaimed_tokens += tokens - estimate_tokens(stub)
                    if message["id"] not in result.message_ids:
                        result.message_ids.append(message["id"])
        if writes:
            self.host.store.flush_stream(StreamFlush(session_id=sid, parts=writes))
            for mid in result.message_ids:
                self.host.turns.persist_cache.forget(mid)
        return result

    @staticmethod
    def _is_protected(tool_name: str, config: CompactionConfig) -> bool:
        return any(fnmatch.fnmatchcase(tool_name, p) for p in config.protected_tools)

    # -- compaction -----------------------------------------------------------------

    @remote
    async def compact(
        self,
        session_id: str | None = None,
        *,
        auto: bool = False,
        model: Any = None,
        fit_below: int | None = None,
    ) -> CompactionResult | None:
        """Compact now. ``model``: the model the tail budget is measured against
        (default ``get_model()``; the per-turn model switch passes the new one).
        ``fit_below``: write only if the context the compaction leaves (summary plus
        tail) is below that many tokens, else write nothing at all (the model switch
        passes the new model's usable tokens; the prune rung is skipped then, as
        pruning writes).

        Manual (``auto=False``): raises :class:`CompactionError` (nothing written) when
        it cannot. ``auto=True`` is best effort, as auto-compaction is: a failure is
        logged and ``None`` returned. Refused with :class:`SessionBusyError` while a run
        is in flight, unless called from that run itself (a turn making room for
        itself, e.g. ``Think.compact_for_model``)."""
        sid = self.host.sessions.resolve(session_id)
        self.host.store.get_session(sid)
        # The session's own turn (before its stream) already holds the session.
        run = self.host.own_turn(sid)
        hold: Any = contextlib.nullcontext()
        if run is None:
            hold = self.host.reserve_session(sid, "compaction")
        with hold:
            if auto:
                result = await self._try_compact(
                    sid,
                    model=model,
                    signal=run.controller.signal if run is not None else None,
                    emit=run.emit if run is not None else None,
                    fit_below=fit_below,
                )
            else:
                result = await self._compact(
                    sid, auto=False, signal=None, model=model, fit_below=fit_below
                )
        return result

    @idempotent
    @remote
    def list_compactions(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """Every compaction on the session's current path, oldest first (hidden ones
        included), as ``{"message_id", "hidden", **data}``."""
        sid = self.host.sessions.resolve(session_id)
        out = []
        for row in self.host.store.get_path(sid):
            part = compaction_part(row.message)
            if part is not None:
                out.append({"message_id": row.id, "hidden": row.hidden, **(part.get("data") or {})})
        return out

    def _plan(self, sid: str, config: CompactionConfig, usable: int) -> _Plan:
        history = self.host.store.get_history(sid)
        if not history:
            raise NothingToCompactError(f"nothing to compact: session {sid!r} has no messages")
        view = compaction_view(history)
        body = view[1:] if compaction_part(view[0]) is not None else list(view)
        earlier = view[:1] if len(body) < len(view) else []
        if body and body[-1].get("role") == "user":
            body = body[:-1]  # the prompt waiting for its answer stays, uncounted
        warnings: list[str] = []
        n = config.tail_turns
        budget = int(config.tail_budget_pct * max(usable, 0))
        tail_tokens = sum(message_tokens(m) for m in body[-n:])
        if n > 1 and len(body) > 1 and tail_tokens > budget:
            warnings.append(
                f"the last {n} messages (~{tail_tokens} tokens) exceed the tail budget "
                f"({budget} tokens); keeping only the last one"
            )
            n = 1
            tail_tokens = message_tokens(body[-1])
            log.warning("compaction of %s: %s", sid, warnings[-1])
        if len(body) <= n:
            raise NothingToCompactError(
                f"nothing to compact: session {sid!r} has nothing before its last "
                f"{n} message(s) to summarize"
            )
        tail = body[-n:]
        summarized = [*earlier, *body[:-n]]
        order = {m["id"]: i for i, m in enumerate(history)}
        hide_ids = sorted((m["id"] for m in summarized), key=order.__getitem__)
        return _Plan(summarized, hide_ids, tail, tail_tokens, warnings)

    def _input_cap(self, model: Any, config: CompactionConfig) -> int:
        window = int(getattr(model, "context_window", 0) or 0)
        output = self._output_cap(model, config)
        overhead = estimate_tokens(SUMMARY_SYSTEM_PROMPT) + estimate_tokens(_CHUNK_REQUEST) + 16
        return max(1, window - output - overhead)

    @staticmethod
    def _output_cap(model: Any, config: CompactionConfig) -> int:
        max_output = getattr(model, "max_output_tokens", None)
        return min(config.max_output_tokens, max_output) if max_output else config.max_output_tokens

    async def _compact(self, sid: str, *, auto: bool, **options: Any) -> CompactionResult:
        """:meth:`_compact_now` (same arguments), traced and counted."""
        host = self.host
        attributes = {"gen_ai.conversation.id": sid, "thinkray.compaction.auto": auto}
        with tracing.span("thinkray.compaction", attributes) as span:
            result = await self._compact_now(sid, auto=auto, **options)
            tracing.set_attributes(span, {"thinkray.compaction.strategy": result.strategy})
        tags = {"namespace": getattr(host, "namespace", None) or "-", "agent": type(host).__name__}
        metrics().count("thinkray_compactions_total", 1, tags)
        return result

    async def _compact_now(
        self,
        sid: str,
        *,
        auto: bool,
        signal: AbortSignal | None,
        config: CompactionConfig | None = None,
        model: Any = None,
        fit_below: int | None = None,
    ) -> CompactionResult:
        config = config or self.get_compaction_config(sid)
        model = model or self.host.get_model()
        usable = config.usable(model)
        plan = self._plan(sid, config, usable)
        summarizer = self.host.get_summary_model(config)
        cap = self._input_cap(summarizer, config)
        strategy = "one-shot"
        pruned: PruneResult | None = None
        total = sum(message_tokens(m) for m in plan.summarized)
        recovery = config.smart_recovery
        # Pruning writes: a compaction that may yet be refused (fit_below) skips it.
        if total > cap and recovery.prune_tool_outputs and fit_below is None:
            pruned = self.prune_tool_outputs(sid, target_tokens=total - cap)
            if pruned.pruned:
                plan = self._plan(sid, config, usable)
                total = sum(message_tokens(m) for m in plan.summarized)
                strategy = "pruned"
        texts = [render_message(m) for m in plan.summarized]
        usage = Usage()
        if total <= cap:
            summary, usage = await self._summarize(
                sid,
                summarizer,
                config,
                _SUMMARY_REQUEST.format(transcript="\n\n".join(texts)),
                signal,
            )
        elif recovery.chunked_summarize:
            strategy = "chunked"
            chunks = list(_chunks(texts, cap))
            summaries = []
            for i, chunk in enumerate(chunks, 1):
                request = _CHUNK_REQUEST.format(
                    index=i, count=len(chunks), transcript="\n\n".join(chunk)
                )
                text, step_usage = await self._summarize(sid, summarizer, config, request, signal)
                usage = usage + step_usage
                summaries.append(
                    text if len(chunks) == 1 else f"### Part {i} of {len(chunks)}\n\n{text}"
                )
            summary = "\n\n".join(summaries)
        elif recovery.drop_middle:
            strategy = "drop-middle"
            kept = _head_and_tail(texts, cap)
            summary, usage = await self._summarize(
                sid,
                summarizer,
                config,
                _SUMMARY_REQUEST.format(transcript="\n\n".join(kept)),
                signal,
            )
        else:
            raise CompactionSpecLimitError(
                f"the history to summarize (~{total} tokens) exceeds the summarizer's input "
                f"({cap} tokens) and no recovery is enabled; start a new session, or prune "
                "tool outputs first (prune_tool_outputs)"
            )
        if strategy == "chunked" or not usage.output:
            summary_tokens = estimate_tokens(summary)
        else:
            summary_tokens = usage.output
        after = summary_tokens + plan.tail_tokens  # the context the compaction leaves
        if fit_below is not None and after >= fit_below:
            raise CompactionError(
                f"the compaction would leave ~{after} tokens in context (summary "
                f"{summary_tokens} + tail {plan.tail_tokens}), not below {fit_below}; "
                "nothing was written"
            )
        return self._write_compaction(
            sid,
            plan,
            summary,
            summary_tokens,
            auto=auto,
            strategy=strategy,
            usage=usage,
            summarizer=summarizer,
            pruned=pruned,
        )

    def _write_compaction(
        self,
        sid: str,
        plan: _Plan,
        summary: str,
        summary_tokens: int,
        *,
        auto: bool,
        strategy: str,
        usage: Usage,
        summarizer: Any,
        pruned: PruneResult | None,
    ) -> CompactionResult:
        now = time.time()
        before = self.host.store.get_session(sid)
        after = summary_tokens + plan.tail_tokens
        rollup = dict(before.usage)
        rollup.update(
            prompt_tokens=after,
            completion_tokens=0,
            reasoning_tokens=0,
            cache_read=0,
            cache_write=0,
        )
        covers = (plan.hide_ids[0], plan.hide_ids[-1])
        data = {
            "summary": summary,
            "tail_start_id": plan.tail[0]["id"],
            "auto": auto,
            "summary_tokens": summary_tokens,
            # A range on the path, as a mapping: the store's rewind reads a *list* as
            # the exact ids covered, so a two-item list would give back only two.
            "covers": {"first_id": covers[0], "last_id": covers[1]},
            "hidden_at": now,
        }
        metadata = {
            "synthetic": True,
            "compaction": {
                "strategy": strategy,
                "summarized": len(plan.hide_ids),
                "tail_messages": len(plan.tail),
                "tail_tokens": plan.tail_tokens,
                "context_window_used_at": before.context_window_used,
                "context_window_after": after,
                "rollup_before": dict(before.usage),
                "summary_model": getattr(summarizer, "model_id", None),
                "summarizer_usage": usage.to_dict(),
                "warnings": list(plan.warnings),
            },
        }
        message: dict[str, Any] = {
            "id": new_id("msg"),
            "role": "assistant",
            "metadata": metadata,
            "parts": [{"type": "data-compaction", "data": data}],
        }
        with self.host.store.transaction():
            # Right above the tail: the stored history reads the summary, then the tail.
            self.host.store.insert_before(sid, message, plan.tail[0]["id"])
            self.host.store.set_hidden(sid, plan.hide_ids, now)
            self.host.store.set_usage(sid, rollup)
        log.info(
            "compacted %s: %d messages into ~%d tokens (%s, %s)",
            sid,
            len(plan.hide_ids),
            summary_tokens,
            strategy,
            "auto" if auto else "manual",
        )
        return CompactionResult(
            session_id=sid,
            message_id=message["id"],
            summary=summary,
            summary_tokens=summary_tokens,
            tail_start_id=data["tail_start_id"],
            covers=covers,
            auto=auto,
            summarized=len(plan.hide_ids),
            strategy=strategy,
            tail_messages=len(plan.tail),
            warnings=list(plan.warnings),
            pruned=pruned,
        )

    async def _summarize(
        self,
        sid: str,
        model: Any,
        config: CompactionConfig,
        request: str,
        signal: AbortSignal | None,
    ) -> tuple[str, Usage]:
        """One summary with the transient-retry rung of the ladder."""
        attempts = config.retry_on_transient + 1
        for attempt in range(1, attempts + 1):
            try:
                result = await self._summarize_once(model, config, request, signal)
            except SummarizerError as exc:
                if not exc.transient or attempt == attempts:
                    raise
                delay = config.retry_backoff * (2 ** (attempt - 1))
                log.info(
                    "summarizer for %s failed (%s); retry %d in %.2fs", sid, exc, attempt, delay
                )
                if self._run_in_flight(sid):
                    self.host.status.retrying(
                        sid, attempt, f"summarizer: {exc} (retry {attempt} in {delay:.1f}s)"
                    )
                await _sleep(delay, signal)
                continue
            run_id = self.host.active_run(sid) if attempt > 1 else None
            if run_id is not None:
                self.host.status.busy(sid, run_id)
            return result
        raise AssertionError("unreachable")

    async def _summarize_once(
        self, model: Any, config: CompactionConfig, request: str, signal: AbortSignal | None
    ) -> tuple[str, Usage]:
        controller = AbortController(parent=signal)
        result = LoopResult()
        deltas: list[str] = []

        async def run() -> None:
            async for chunk in run_loop(
                model,
                system=SUMMARY_SYSTEM_PROMPT,
                messages=[ModelMessage(role="user", content=[TextContent(text=request)])],
                tools={},
                signal=controller.signal,
                max_steps=1,
                retry=RetryPolicy(max_retries=0),  # the ladder owns retries
                result=result,
                request_options={
                    "temperature": config.temperature,
                    "max_output_tokens": self._output_cap(model, config),
                },
            ):
                if chunk["type"] == "text-delta":
                    deltas.append(chunk["delta"])

        try:
            await asyncio.wait_for(run(), timeout=config.timeout)
        except TimeoutError:
            controller.abort("summarizer timed out")
            raise SummarizerError(
                f"the summarizer timed out after {config.timeout:g}s", transient=True
            ) from None
        except ModelError as exc:
            raise SummarizerError(f"the summarizer failed: {exc}", transient=exc.transient) from exc
        summary = "".join(deltas).strip()
        if not summary:
            raise SummarizerError("the summarizer returned an empty summary")
        return summary, result.usage

    # -- Think hooks ----------------------------------------------------------------

    def _run_in_flight(self, sid: str) -> bool:
        return self.host.active_run(sid) is not None

    async def _try_compact(
        self,
        sid: str,
        *,
        config: CompactionConfig | None = None,
        model: Any = None,
        signal: AbortSignal | None = None,
        emit: Callable[[UIChunk], Awaitable[None]] | None = None,
        fit_below: int | None = None,
    ) -> CompactionResult | None:
        """Auto-compaction: a failure is a warning and the turn goes on uncompacted
        (never "the chat just stops"); the outcome is a note through ``emit`` (the
        turn's stream; None outside a turn)."""
        try:
            result = await self._compact(
                sid, auto=True, signal=signal, config=config, model=model, fit_below=fit_below
            )
        except AbortError:
            raise
        except Exception as exc:  # the turn goes on uncompacted: never "the chat stops"
            log.warning("auto-compaction of %s failed, continuing without it: %s", sid, exc)
            if emit is not None:
                await emit(_status_note("failed", f"could not summarize earlier turns: {exc}"))
            return None
        if emit is not None:
            await emit(
                _status_note(
                    "done",
                    f"summarized {result.summarized} earlier messages",
                    summarized=result.summarized,
                    compactionMessageId=result.message_id,
                    summaryTokens=result.summary_tokens,
                    strategy=result.strategy,
                    warnings=result.warnings,
                )
            )
        return result

    async def prepare_turn(self, options: ChatOptions) -> bool:
        """The turn hook: compact first when the coming turn would overflow its model's
        window. Returns True when it rewrote the history."""
        changed = False
        sid = options.session_id
        config = self.get_compaction_config(sid)
        if not config.auto:
            return changed
        model = options.model if options.model is not None else self.host.model_for_turn(sid, None)
        if not self.needs_compaction(sid, model):
            return changed
        if options.user_message_id is None:
            # A turn without a new user message answers the history as it stands.
            text = "auto-compaction needs a new user message; this turn runs uncompacted"
            log.warning("%s: %s", sid, text)
            await options.emit(_status_note("skipped", text))
            return changed
        result = await self._try_compact(
            sid, config=config, model=model, signal=options.signal, emit=options.emit
        )
        return changed or result is not None


def _status_note(state: str, message: str, **extra: Any) -> DataChunk:
    """A transient ``data-status`` chunk: shown live, never stored as a part (a stored
    data part would change how the assistant message is read back)."""
    return {
        "type": "data-status",
        "data": {"kind": "compaction", "state": state, "message": message, **extra},
        "transient": True,
    }


def _chunks(texts: list[str], cap: int) -> Iterator[list[str]]:
    """Consecutive groups of transcript entries that each fit ``cap`` tokens; an entry
    too big on its own is cut to fit."""
    limit_chars = cap * CHARS_PER_TOKEN
    current: list[str] = []
    size = 0
    for text in texts:
        tokens = estimate_tokens(text) + 1
        if tokens > cap:
            text = text[: max(0, limit_chars - 64)] + "\n[... cut to fit ...]"
            tokens = estimate_tokens(text) + 1
        if current and size + tokens > cap:
            yield current
            current, size = [], 0
        current.append(text)
        size += tokens
    if current:
        yield current


def _head_and_tail(texts: list[str], cap: int) -> list[str]:
    """The first and last entries that fit half of ``cap`` each, with a marker."""
    half = max(1, (cap - estimate_tokens(_OMITTED) - 8) // 2)
    head: list[str] = []
    used = 0
    for text in texts:
        t = estimate_tokens(text) + 1
        if used + t > half:
            break
        head.append(text)
        used += t
    tail: list[str] = []
    used = 0
    for text in reversed(texts[len(head) :]):
        t = estimate_tokens(text) + 1
        if used + t > half:
            break
        tail.insert(0, text)
        used += t
    omitted = len(texts) - len(head) - len(tail)
    if not head and not tail and texts:  # even one entry is too big: cut the first
        return [texts[0][: half * CHARS_PER_TOKEN], _OMITTED.format(count=len(texts) - 1)]
    return [*head, _OMITTED.format(count=omitted), *tail] if omitted else [*head, *tail]


async def _sleep(delay: float, signal: AbortSignal | None) -> None:
    if delay <= 0:
        return
    if signal is None:
        await asyncio.sleep(delay)
        return
    try:
        await asyncio.wait_for(signal.wait(), timeout=delay)
    except TimeoutError:
        return
    raise AbortError(signal.reason or "aborted")
