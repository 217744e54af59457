"""Per-run state: everything one turn needs lives here, never on the agent.

An agent serves several sessions at once (one run per session). A turn's history,
options, recorder and model belong to its :class:`RunState`; the hooks get the turn's
:class:`ChatOptions` (``options.history`` is the turn's view of its session), so two
overlapping turns of different sessions never see each other's state.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from thinkray.runtime.abort import AbortController, AbortSignal
from thinkray.runtime.chunks import UIChunk
from thinkray.runtime.errors import (  # re-exported: the errors live in thinkray.runtime.errors
    NoRunError as NoRunError,
)
from thinkray.runtime.turn.loop import LoopHooks, LoopResult
from thinkray.runtime.turn.stream import RunStream
from thinkray.runtime.usage import Usage

if TYPE_CHECKING:
    from thinkray.runtime.tools.base import Tool
    from thinkray.runtime.turn.recorder import Recorder

__all__ = ["ChatOptions", "ChatResult", "RunState", "RunStatus", "StreamCallback"]

RunStatus = Literal["completed", "aborted", "error", "interrupted", "superseded"]
"""How a run ended: ``completed`` (the model finished), ``aborted`` (explicit abort,
clear, delete or shutdown; partial output kept) or ``error`` (the error is reported).
``superseded``: a queued message dropped for a newer one (the ``latest`` busy
policy); no turn ran for it."""


class StreamCallback(Protocol):
    """The seed's StreamCallback. Methods may be sync or async.

    ``on_event`` receives each UI chunk (a JSON-ready dict), in order. A callback
    that raises is detached for the rest of the run; the run goes on (a consumer
    going away is not an abort). ``on_done`` or ``on_error`` is called once, last."""

    def on_event(self, chunk: UIChunk) -> Any:
        """One UI chunk, in order."""
        ...

    def on_done(self) -> Any:
        """The run ended (completed or aborted)."""
        ...

    def on_error(self, error: str) -> Any:
        """The run failed with ``error``."""
        ...


@dataclass
class ChatOptions:
    """One turn, as its hooks see it (``prepare_turn``, ``assemble_context``,
    ``on_chat_message``, ``check_tool_permission``, ``system_prompt_for``,
    ``message_metadata``). Belongs to the run: never shared between turns."""

    session_id: str
    run_id: str
    message_id: str
    signal: AbortSignal
    tools: dict[str, Tool] = field(default_factory=dict)
    hooks: LoopHooks = field(default_factory=LoopHooks)
    result: LoopResult = field(default_factory=LoopResult)
    request_options: dict[str, Any] = field(default_factory=dict)
    model: Any = None  # this turn's model (per-turn switch, seed 002); None: get_model()
    model_selection: dict[str, Any] | None = None  # {provider_id, model_id, variant}
    user_message_id: str | None = None  # the user message this turn answers; None: a rerun
    # The session's visible history as this turn sees it (ends with the user message).
    history: list[dict[str, Any]] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)  # per-turn scratch space for hooks
    emitter: Callable[[UIChunk], Awaitable[None]] | None = field(default=None, repr=False)

    async def emit(self, chunk: UIChunk) -> None:
        """Push ``chunk`` into this turn's stream by the same path as the model's chunks
        (recorder, replayable stream, callback), in call order. For hooks and tools:
        ``prepare_turn`` notes, approval requests. Chunks emitted before the stream
        started are held and delivered right after its first chunk (``start``).

        Raises :class:`NoRunError` for options that belong to no run."""
        if self.emitter is None:
            raise NoRunError("these ChatOptions belong to no run: nothing to emit into")
        await self.emitter(chunk)


@dataclass
class ChatResult:
    """How one turn ended. ``message`` is the stored assistant message (None when
    nothing was produced, or the session was cleared under the run)."""

    run_id: str
    session_id: str
    message_id: str
    status: RunStatus
    message: dict[str, Any] | None
    error: str | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    steps: int = 0
    user_message_id: str | None = None
    # True when the user message had been answered before: nothing ran, ``message``
    # is the stored answer (a resent message id replays its turn, never runs it again).
    replayed: bool = False
    # A message queued under the ``latest`` busy policy that a newer one replaced
    # (status ``superseded``): the newer message's id.
    superseded_by: str | None = None
    # A message that joined a running turn (the ``steer`` busy policy): that run's id
    # (``run_id`` and the result are that run's).
    steered_into: str | None = None

    @property
    def text(self) -> str:
        """The assistant message's text parts, joined."""
        if not self.message:
            return ""
        return "".join(
            p.get("text", "") for p in self.message.get("parts", ()) if p.get("type") == "text"
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field plus ``text`` (the message is not copied)."""
        fields = {name: getattr(self, name) for name in self.__dataclass_fields__}
        return {**fields, "text": self.text}


@dataclass
class RunState:
    """A run in flight: its ids, abort controller, replayable stream and task, and the
    turn's own state (``options``, once the turn prepared them)."""

    run_id: str
    session_id: str
    controller: AbortController
    stream: RunStream
    task: asyncio.Future[ChatResult] | None = None
    started_at: float = field(default_factory=time.time)
    model: Any = None  # resolved before the turn runs (per-turn model switch)
    model_selection: dict[str, Any] | None = None
    options: ChatOptions | None = None
    # Tokens of the steps finished so far (the live view's "tokens this turn").
    usage: Usage = field(default_factory=Usage)
    # True once the turn's history is fixed (its recorder exists): until then the turn
    # itself (on_user_message, prepare_turn, the model switch) may still rewrite it.
    prepared: bool = False
    # ``emit`` before the stream started holds chunks here; the runner then sets ``sink``.
    pending: list[UIChunk] = field(default_factory=list, repr=False)
    sink: Callable[[UIChunk], Awaitable[None]] | None = field(default=None, repr=False)
    recorder: Recorder | None = field(default=None, repr=False)  # once the turn prepared
    # Tool-input chunks recorded and not yet delivered: they go out once the batch that
    # holds them (and the calls' rows) is durable (see TurnRunner._emit); since when.
    gated: list[UIChunk] = field(default_factory=list, repr=False)
    gated_at: float | None = field(default=None, repr=False)
    # Opens the gate from a timer: a model that pauses after a call (a long think, a
    # stalled stream) must not hide the call from clients for longer than a batch.
    gate_opener: Callable[[], Coroutine[Any, Any, None]] | None = field(default=None, repr=False)
    # Held while a chunk is recorded and delivered, so the gate's timer and the turn's
    # own chunks go out in the order they were recorded.
    emit_lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    user_message_id: str | None = None  # the user message the run answers (None: a rerun)
    # Ids of messages that join this turn at its next step boundary (``steer``).
    steers: list[str] = field(default_factory=list, repr=False)

    async def emit(self, chunk: UIChunk) -> None:
        """See :meth:`ChatOptions.emit` (which delegates here)."""
        if self.sink is None:
            self.pending.append(chunk)
        else:
            await self.sink(chunk)
