"""``Think``: the opinionated chat agent base class (seed 000), without Ray.

Subclass and override ``get_model`` (and, as needed, the other override points). One
instance owns one :class:`~thinkray.storage.protocols.SessionStore`; it keeps several named
sessions and runs at most one turn per session at a time. A turn (seed 000 §1–9):

1. validate and idempotently append the user message, reload the history;
2. give the run its own abort controller (chained to the caller's signal);
3. run the ``prepare_turn`` hook (compaction, say), then ``on_chat_message`` — by
   default the agentic loop over ``assemble_context``;
4. fold every chunk into the assistant message, write it in batches (recorder),
   append it to the run's replayable stream and deliver it to the callback;
5. on completion, abort or error persist what was produced (sanitized, row-capped,
   unchanged parts skipped), enforce ``max_persisted_messages``, and report.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from thinkray.runtime.abort import AbortController, AbortError, AbortSignal, abortable
from thinkray.runtime.agents import lifecycle
from thinkray.runtime.durable.fibers import FiberManager
from thinkray.runtime.durable.schedules import Scheduler
from thinkray.runtime.messages import Role, new_id, parse_message
from thinkray.runtime.models.base import Model, ModelError, ModelMessage
from thinkray.runtime.remote import remote
from thinkray.runtime.status import SessionBusyError, SessionStatus, StatusBoard
from thinkray.runtime.tools.base import Tool
from thinkray.runtime.turn.context import prune_tool_calls, to_model_messages
from thinkray.runtime.turn.loop import LoopHooks, LoopResult, RetryPolicy, ToolDenial, run_loop
from thinkray.runtime.turn.persistence import PersistCache, enforce_row_size, prepare_message
from thinkray.runtime.turn.recorder import DEFAULT_FLUSH_INTERVAL, Recorder
from thinkray.runtime.turn.stream import RunStream
from thinkray.runtime.usage import Usage
from thinkray.storage.fibers import FiberStore
from thinkray.storage.protocols import HEAD, SessionStore
from thinkray.storage.types import PartWrite, SessionInfo, StreamFlush

log = logging.getLogger("thinkray.think")

CURRENT_SESSION_KEY = "think.current_session"
CONFIG_KEY = "think.config"
ORPHAN_ERROR = "aborted by restart: the tool call did not complete before the agent restarted"


class StreamCallback(Protocol):
    """The seed's StreamCallback. Methods may be sync or async.

    ``on_event`` receives each UI chunk as a JSON-ready dict, in order. A callback
    that raises is detached for the rest of the run; the run goes on (a consumer
    going away is not an abort).
    """

    def on_event(self, chunk: dict[str, Any]) -> Any: ...

    def on_done(self) -> Any: ...

    def on_error(self, error: str) -> Any: ...


@dataclass
class ChatOptions:
    """What ``on_chat_message`` gets for one turn."""

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
    state: dict[str, Any] = field(default_factory=dict)  # per-turn scratch space for hooks
    emitter: Callable[[dict[str, Any]], Awaitable[None]] | None = field(default=None, repr=False)

    async def emit(self, chunk: dict[str, Any]) -> None:
        """Push ``chunk`` into this turn's stream by the same path as the model's chunks
        (recorder, replayable stream, callback), in call order. For hooks and tools:
        ``prepare_turn`` notes, approval requests. Chunks emitted before the stream
        started are held and delivered right after its first chunk (``start``)."""
        if self.emitter is None:
            raise RuntimeError("these ChatOptions belong to no run: nothing to emit into")
        await self.emitter(chunk)


@dataclass
class ChatResult:
    run_id: str
    session_id: str
    message_id: str
    status: str  # "completed" | "aborted" | "error"
    message: dict[str, Any] | None
    error: str | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    steps: int = 0
    user_message_id: str | None = None

    @property
    def text(self) -> str:
        if not self.message:
            return ""
        return "".join(
            p.get("text", "") for p in self.message.get("parts", ()) if p.get("type") == "text"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "session_id": self.session_id,
            "message_id": self.message_id,
            "status": self.status,
            "message": self.message,
            "error": self.error,
            "finish_reason": self.finish_reason,
            "usage": self.usage,
            "steps": self.steps,
            "user_message_id": self.user_message_id,
            "text": self.text,
        }


@dataclass
class RunState:
    run_id: str
    session_id: str
    controller: AbortController
    stream: RunStream
    task: asyncio.Future[ChatResult] | None = None
    started_at: float = field(default_factory=time.time)
    model: Any = None  # resolved by lifecycle.prepare_turn_model before the turn runs
    model_selection: dict[str, Any] | None = None
    # True once the turn's history is fixed (its recorder exists): until then the turn
    # itself (on_user_message, prepare_turn, the model switch) may still rewrite it.
    prepared: bool = False
    # ``emit`` before the stream started holds chunks here; ``_turn`` then sets ``sink``.
    pending: list[dict[str, Any]] = field(default_factory=list, repr=False)
    sink: Callable[[dict[str, Any]], Awaitable[None]] | None = field(default=None, repr=False)

    async def emit(self, chunk: dict[str, Any]) -> None:
        """See :meth:`ChatOptions.emit` (which delegates here)."""
        if self.sink is None:
            self.pending.append(chunk)
        else:
            await self.sink(chunk)


class Think:
    """Override points (seed 000): ``get_model``, ``get_system_prompt``, ``get_tools``,
    ``get_max_steps``, ``assemble_context``, ``on_chat_message``, ``on_chat_error``,
    ``get_workspace``. Lifecycle hooks: ``on_start`` (the constructor path, run on
    every wake), ``on_user_message`` (before a user message lands).

    Turn hooks for capabilities layered on top (``thinkray.runtime.agents.agent.Agent``'s mixins use
    them; each default is a no-op, so a plain subclass behaves as without them):
    ``prepare_turn`` (before the stream; may emit and rewrite the history),
    ``context_view`` (which messages the model sees), ``system_prompt_for`` (the prompt
    given the turn's tools), ``check_tool_permission`` (with the turn's options),
    ``message_metadata`` (extra assistant metadata), ``reserve_session`` (hold a session
    busy outside a turn) and ``own_turn``."""

    max_persisted_messages: int | None = None
    flush_interval: float = DEFAULT_FLUSH_INTERVAL
    retry_policy: RetryPolicy = RetryPolicy()
    prune_keep_last: int = 2
    keep_chunk_logs: int = 2  # the current run's and the last finished run's
    recover_fibers: bool = True  # restart interrupted fibers from their checkpoint on wake
    models: dict[str, Model] | None = None  # model_id -> Model, for per-turn selection

    def __init__(
        self,
        store: SessionStore | str | os.PathLike[str] | None = None,
        *,
        model: Model | None = None,
    ) -> None:
        if store is None or isinstance(store, (str, os.PathLike)):
            from thinkray.storage.session_store import DuckDBSessionStore

            store = DuckDBSessionStore(store if store is not None else ":memory:")
        self.store: SessionStore = store
        self._model = model
        self.status = StatusBoard()
        self.messages: list[dict[str, Any]] = []
        self._runs: dict[str, RunState] = {}
        self._session_runs: dict[str, str] = {}
        self._reserved: dict[str, str] = {}  # session id -> operation (reserve_session)
        self._last_stream: dict[str, RunStream] = {}
        self._clear_generation: dict[str, int] = {}
        self._persist_cache = PersistCache()
        self._config: dict[str, Any] | None = None
        self._trimmed = False
        self._current_session_id: str | None = self.store.get_config(CURRENT_SESSION_KEY)
        if self._current_session_id and not self.store.has_session(self._current_session_id):
            self._current_session_id = None
        self.fibers: FiberManager | None = None
        self.scheduler: Scheduler | None = None
        db = getattr(self.store, "db", None)
        if db is not None:
            fiber_store = FiberStore(db)
            self.fibers = FiberManager(fiber_store, self, recover=self.recover_fibers)
            self.scheduler = Scheduler(fiber_store, self)
        self.on_start()

    # -- override points --------------------------------------------------------------

    def get_model(self) -> Model:
        if self._model is not None:
            return self._model
        raise NotImplementedError("override get_model() or pass model= to Think")

    def get_system_prompt(self) -> str:
        return "You are a helpful assistant."

    def get_tools(self) -> dict[str, Tool]:
        return {}

    def get_max_steps(self) -> int:
        return 10

    async def assemble_context(self) -> list[ModelMessage]:
        """The model's view of ``self.messages``; older tool calls pruned."""
        messages = self.context_view(self.messages)
        return prune_tool_calls(to_model_messages(messages), self.prune_keep_last)

    def context_view(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Hook: the stored messages the model sees (e.g. a summary plus the tail after a
        compaction). Must not mutate ``messages``. Default: all of them."""
        return messages

    async def prepare_turn(self, options: ChatOptions) -> bool:
        """Hook: runs once per turn after the user message landed and the history was
        loaded (``self.messages``), before the assistant message exists and before the
        model is called. It may ``await options.emit(chunk)`` (held until the stream
        starts) and may change the stored history, e.g. compact it; return True then,
        so the turn reloads the history (and the assistant message's parent). Raising
        ends the turn like an error in the stream (AbortError: aborted)."""
        return False

    async def system_prompt_for(self, options: ChatOptions, tools: dict[str, Tool]) -> str:
        """Hook: the system prompt of this turn, given its resolved tools
        (``get_tools()`` plus ``options.tools``). Default: ``get_system_prompt()``."""
        return await _maybe_await(self.get_system_prompt())

    def message_metadata(self, options: ChatOptions) -> dict[str, Any]:
        """Hook: extra ``metadata`` for the turn's assistant message, merged when the
        turn ends (``usage``, ``status``, ``finishReason`` and ``model`` win)."""
        return {}

    async def on_chat_message(self, options: ChatOptions) -> AsyncIterator[dict[str, Any]]:
        """The default turn: the agentic loop. Override for full control; yield UI chunks."""
        model = options.model if options.model is not None else self.get_model()
        tools = dict(await _maybe_await(self.get_tools()))
        tools.update(options.tools)
        messages = await self.assemble_context()
        async for chunk in run_loop(
            model,
            system=await self.system_prompt_for(options, tools),
            messages=messages,
            tools=tools,
            signal=options.signal,
            max_steps=self.get_max_steps(),
            message_id=options.message_id,
            retry=self.retry_policy,
            hooks=options.hooks,
            result=options.result,
            tool_context={
                "session_id": options.session_id,
                "run_id": options.run_id,
                "agent": self,
                "emit": options.emit,  # a tool's ctx.extras["emit"]: into this turn's stream
            },
            request_options=options.request_options,
        ):
            yield chunk

    async def on_chat_error(self, error: BaseException) -> BaseException | str:
        """Log, transform or replace an error before it is reported. Passthrough."""
        return error

    def get_workspace(self) -> Any:
        return None

    def on_start(self) -> None:
        """Called at the end of construction: every wake or restart runs it."""

    async def on_user_message(self, session_id: str, message: dict[str, Any]) -> dict[str, Any]:
        """The ``message.user`` hook: runs before a user message lands (e.g. to attach a
        ``snapshot_id`` to its metadata). Return the message to store."""
        return message

    def on_step_usage(self, session_id: str, usage: Usage) -> None:
        """Called with each step's usage after it was added to the rollups."""

    # -- configuration ----------------------------------------------------------------

    @remote
    def configure(self, config: dict[str, Any]) -> None:
        if not isinstance(config, dict):
            raise TypeError("config must be a dict")
        self.store.set_config(CONFIG_KEY, config)
        self._config = dict(config)

    @remote
    def get_config(self) -> dict[str, Any] | None:
        if self._config is None:
            self._config = self.store.get_config(CONFIG_KEY)
        return self._config

    # -- sessions ---------------------------------------------------------------------

    @property
    def current_session_id(self) -> str | None:
        return self._current_session_id

    @remote
    def get_current_session_id(self) -> str | None:
        return self._current_session_id

    def _set_current(self, session_id: str | None) -> None:
        if session_id != self._current_session_id:
            self._current_session_id = session_id
            if session_id is None:
                self.store.delete_config(CURRENT_SESSION_KEY)
            else:
                self.store.set_config(CURRENT_SESSION_KEY, session_id)

    @remote
    def create_session(self, name: str = "New Chat", **kwargs: Any) -> SessionInfo:
        info = self.store.create_session(name, **kwargs)
        self._set_current(info.id)
        self.messages = []
        return info

    @remote
    def switch_session(self, session_id: str) -> list[dict[str, Any]]:
        self.store.get_session(session_id)  # not found is an error, never a create
        self._set_current(session_id)
        self.messages = self.store.get_history(session_id)
        return self.messages

    @remote
    def get_sessions(self, **kwargs: Any) -> list[SessionInfo]:
        return self.store.list_sessions(**kwargs)

    @remote
    def get_session(self, session_id: str | None = None) -> SessionInfo:
        return self.store.get_session(self._sid(session_id))

    @remote
    def rename_session(self, session_id: str, name: str) -> None:
        self.store.rename_session(session_id, name)

    @remote
    def delete_session(self, session_id: str) -> None:
        self.store.get_session(session_id)
        self._invalidate(session_id, "session deleted")
        self.store.delete_session(session_id)
        self._last_stream.pop(session_id, None)
        if self._current_session_id == session_id:
            self._set_current(None)
            self.messages = []

    @remote
    def clear_messages(self, session_id: str | None = None) -> None:
        """Clear a session's messages. An in-flight run is aborted and its pending
        writes are discarded (the clear-during-stream guard)."""
        sid = self._sid(session_id)
        self.store.get_session(sid)
        self._invalidate(sid, "session cleared")
        self.store.clear_messages(sid)
        self._persist_cache.forget()
        if sid == self._current_session_id:
            self.messages = []

    def _invalidate(self, session_id: str, reason: str) -> None:
        self._clear_generation[session_id] = self._clear_generation.get(session_id, 0) + 1
        run_id = self._session_runs.get(session_id)
        if run_id is not None:
            self._runs[run_id].controller.abort(reason)

    @remote
    def get_history(
        self, session_id: str | None = None, *, leaf_id: str | None = None
    ) -> list[dict[str, Any]]:
        return self.store.get_history(self._sid(session_id), leaf_id=leaf_id)

    @remote
    def message_count(self, session_id: str | None = None) -> int:
        return self.store.message_count(self._sid(session_id))

    @remote
    def get_message(self, message_id: str) -> dict[str, Any] | None:
        return self.store.get_message(message_id)

    @remote
    def children(self, message_id: str) -> list[dict[str, Any]]:
        return self.store.children(message_id)

    # -- lifecycle: branch, rewind, per-turn model (seed 002; runtime/lifecycle.py) ----

    @remote
    def branch(
        self,
        parent_session_id: str,
        from_message_id: str,
        metadata: dict[str, Any] | None = None,
        *,
        name: str | None = None,
    ) -> SessionInfo:
        """Fork the parent's visible history up to ``from_message_id`` into a new
        session (not made current). Refused while the parent has a run in flight."""
        return lifecycle.branch(self, parent_session_id, from_message_id, metadata, name=name)

    @remote
    def thread(self, key: str | None = None) -> SessionInfo:
        """Create or get the thread ``key`` (seed 001; None: "default"). A thread is a
        session: chat in it with ``session_id=info.id``."""
        return lifecycle.thread(self, key)

    @remote
    def list_threads(self) -> list[SessionInfo]:
        return self.store.list_threads()

    @remote
    def clone_thread(
        self, src_key: str, dst_key: str, from_message_id: str | None = None
    ) -> SessionInfo:
        """Copy a thread's visible history (to ``from_message_id``) into a new thread."""
        return lifecycle.clone_thread(self, src_key, dst_key, from_message_id)

    @remote
    def delete_thread(self, key: str) -> None:
        lifecycle.delete_thread(self, key)

    @remote
    def rewind(
        self, session_id: str, user_message_id: str, *, include_target: bool = False
    ) -> lifecycle.RewindResult:
        """Soft-hide everything after a user message; the next turn appends after it
        (``include_target``: hide the message too, to send an edited one instead)."""
        return lifecycle.rewind(self, session_id, user_message_id, include_target=include_target)

    @remote
    def unrewind(self, session_id: str) -> lifecycle.UnrewindResult:
        """Undo the latest rewind; turns taken since stay on their own branch."""
        return lifecycle.unrewind(self, session_id)

    @remote
    async def resend(
        self,
        session_id: str,
        user_message_id: str,
        message: str | dict[str, Any] | None = None,
        callback: StreamCallback | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        """Rewind over a user message (hiding it) and send ``message`` (edited text or a
        message; ``None`` resends the original under a new id) in its place."""
        rewound = self.rewind(session_id, user_message_id, include_target=True)
        new = lifecycle.resend_message(rewound, message)
        return await self.chat(new, callback, session_id=session_id, **kwargs)

    def resolve_model(self, selection: dict[str, Any] | None) -> Model:
        """The model for a ``{provider_id, model_id, variant}`` selection (None: the
        default). Default: ``self.models[model_id]``, else ``get_model()`` if it
        matches. Override to build models per provider or variant."""
        return lifecycle.resolve_model(self, selection)

    async def compact_for_model(self, session_id: str, model: Model) -> None:
        """Make room before switching to a model with a smaller context window.
        Default: ``self.compact(session_id, auto=True)`` when the agent has one."""
        await lifecycle.compact_for_model(self, session_id, model)

    def _sid(self, session_id: str | None) -> str:
        sid = session_id or self._current_session_id
        if sid is None:
            from thinkray.storage.types import SessionNotFoundError

            raise SessionNotFoundError("no session selected: create or switch to one first")
        return sid

    # -- status and abort -------------------------------------------------------------

    @remote
    def get_status(self, session_id: str | None = None) -> SessionStatus:
        return self.status.get(self._sid(session_id))

    @remote
    def abort(
        self,
        session_id: str | None = None,
        *,
        run_id: str | None = None,
        reason: str = "aborted by user",
    ) -> bool:
        """Abort the run in flight (by session or run id). False if there is none."""
        if run_id is None:
            sid = session_id or self._current_session_id
            run_id = self._session_runs.get(sid) if sid else None
        run = self._runs.get(run_id) if run_id else None
        if run is None:
            return False
        return run.controller.abort(reason)

    @contextlib.contextmanager
    def reserve_session(self, session_id: str, operation: str = "reserved") -> Iterator[None]:
        """Hold ``session_id`` busy for an operation that is not a turn (a manual
        compaction, say): raises :class:`SessionBusyError` if a run or another
        reservation holds it; while held, ``start_chat`` raises SessionBusyError and the
        status reads busy (``message=operation``). The previous status comes back after.
        The session's own turn must not reserve (see :meth:`own_turn`)."""
        holder = self._session_runs.get(session_id) or self._reserved.get(session_id)
        if holder is not None:
            raise SessionBusyError(session_id, holder)
        previous = self.status.get(session_id)
        self._reserved[session_id] = operation
        self.status.set(
            session_id,
            SessionStatus(state="busy", started_at=int(time.time() * 1000), message=operation),
        )
        try:
            yield
        finally:
            del self._reserved[session_id]
            self.status.set(session_id, previous)

    def own_turn(self, session_id: str) -> RunState | None:
        """The session's turn if the caller runs inside it (its own task) before its
        history is fixed (``on_user_message``, ``prepare_turn``, the model switch), else
        None. Such a caller already holds the session and may rewrite its history, and
        may ``emit`` into the turn's stream (held until the stream starts)."""
        run = self._runs.get(self._session_runs.get(session_id, ""))
        if run is None or run.prepared or run.task is not asyncio.current_task():
            return None
        return run

    @remote
    def active_run(self, session_id: str | None = None) -> str | None:
        sid = session_id or self._current_session_id
        return self._session_runs.get(sid) if sid else None

    def run_stream(self, session_id: str | None = None) -> RunStream | None:
        """The current run's stream, else the last finished run's (for resume)."""
        sid = self._sid(session_id)
        run_id = self._session_runs.get(sid)
        if run_id is not None:
            return self._runs[run_id].stream
        return self._last_stream.get(sid)

    def stream_of(self, run_id: str) -> RunStream | None:
        run = self._runs.get(run_id)
        if run is not None:
            return run.stream
        for stream in self._last_stream.values():
            if stream.run_id == run_id:
                return stream
        return None

    # -- the turn ---------------------------------------------------------------------

    @remote
    async def chat(
        self,
        message: str | dict[str, Any] | None = None,
        callback: StreamCallback | None = None,
        *,
        session_id: str | None = None,
        signal: AbortSignal | None = None,
        tools: dict[str, Tool] | None = None,
        run_id: str | None = None,
        role: Role = "user",
    ) -> ChatResult:
        """Run one turn and return its result. ``message=None`` answers the current
        history again (after a rewind, say). Raises before writing anything for an
        invalid message, an unknown session or a busy session."""
        run = self.start_chat(
            message,
            callback,
            session_id=session_id,
            signal=signal,
            tools=tools,
            run_id=run_id,
            role=role,
        )
        assert run.task is not None
        return await run.task

    def start_chat(
        self,
        message: str | dict[str, Any] | None = None,
        callback: StreamCallback | None = None,
        *,
        session_id: str | None = None,
        signal: AbortSignal | None = None,
        tools: dict[str, Tool] | None = None,
        run_id: str | None = None,
        role: Role = "user",
    ) -> RunState:
        """Start a turn in the background; returns its :class:`RunState` at once
        (``run_id``, ``stream``, ``task``). Validation errors raise here."""
        user_msg = parse_message(message, role=role) if message is not None else None
        if session_id is None and self._current_session_id is None:
            session_id = self.create_session().id
        sid = self._sid(session_id)
        self.store.get_session(sid)  # unknown id: a clear error, never a silent create
        if sid in self._session_runs:
            raise SessionBusyError(sid, self._session_runs[sid])
        if sid in self._reserved:
            raise SessionBusyError(sid, self._reserved[sid])
        if user_msg is None and not self.store.message_count(sid):
            raise ValueError("nothing to answer: the session is empty and no message was given")
        run_id = run_id or new_id("run")
        if run_id in self._runs:
            raise ValueError(f"run id {run_id!r} is already in flight")
        controller = AbortController(parent=signal)
        message_id = new_id("msg")
        run = RunState(run_id, sid, controller, RunStream(run_id, sid, message_id))
        self._runs[run_id] = run
        self._session_runs[sid] = run_id
        self.status.busy(sid, run_id)
        run.task = asyncio.ensure_future(self._turn(run, user_msg, callback, tools or {}))
        return run

    async def _turn(
        self,
        run: RunState,
        user_msg: dict[str, Any] | None,
        callback: StreamCallback | None,
        tools: dict[str, Tool],
    ) -> ChatResult:
        sid = run.session_id
        signal = run.controller.signal
        generation = self._clear_generation.get(sid, 0)
        stale = lambda: self._clear_generation.get(sid, 0) != generation  # noqa: E731
        recorder: Recorder | None = None
        options: ChatOptions | None = None
        status, error_text, finish_reason = "completed", None, None
        result = LoopResult()
        step_usage = Usage()
        user_id = None
        try:
            if user_msg is not None:
                user_msg = await self.on_user_message(sid, user_msg)
                user_msg = prepare_message(user_msg)
                user_id = user_msg["id"]
            # This turn's model (seed 002 per-turn switch): resolved and fitted to its
            # context window before the message lands, so a refused switch writes nothing.
            run.model, run.model_selection = await lifecycle.prepare_turn_model(self, sid, user_msg)
            if user_msg is not None:
                self.store.append_message(sid, user_msg)  # a repeated id is a no-op
            history = self.store.get_history(sid)
            if self.finalize_orphaned_tool_calls(sid, history):
                history = self.store.get_history(sid)
            self.messages = history  # the turn's view (switch_session restores others)

            def on_step_finish(step: int, usage: Usage, reason: str) -> None:
                nonlocal step_usage
                step_usage = step_usage + usage
                if not stale():
                    self.store.add_usage(sid, usage.to_dict())
                    self.on_step_usage(sid, usage)

            def on_retry(attempt: int, exc: ModelError, delay: float) -> None:
                self.status.retrying(sid, attempt, f"{exc} (retry {attempt} in {delay:.1f}s)")

            async def check_permission(name: str, value: Any, call_id: str) -> Any:
                return await self.check_tool_permission(name, value, call_id, options)

            options = ChatOptions(
                session_id=sid,
                run_id=run.run_id,
                message_id=run.stream.message_id or new_id("msg"),
                signal=signal,
                tools=tools,
                hooks=LoopHooks(
                    on_step_finish=on_step_finish,
                    on_retry=on_retry,
                    check_permission=check_permission,
                ),
                result=result,
                request_options=self.get_request_options(),
                model=run.model,
                model_selection=run.model_selection,
                user_message_id=user_id,
                emitter=run.emit,
            )
            if await self.prepare_turn(options):
                history = self.messages = self.store.get_history(sid)
            recorder = Recorder(
                self.store,
                sid,
                run.run_id,
                options.message_id,
                parent_id=history[-1]["id"] if history else None,
                cache=self._persist_cache,
                flush_interval=self.flush_interval,
                is_stale=stale,
            )
            run.prepared = True

            async def sink(chunk: dict[str, Any]) -> None:  # ChatOptions.emit, once started
                nonlocal callback
                callback = await self._emit(run, recorder, callback, chunk)

            # Chunks emitted before the stream started (prepare_turn's, say) wait in
            # run.pending and go out right after the first chunk ("start"); from then on
            # ChatOptions.emit writes through ``sink``, the path the model's chunks take.
            async def open_stream() -> None:
                run.sink = sink
                for held in run.pending:
                    await sink(held)
                run.pending.clear()

            async for chunk in abortable(self.on_chat_message(options), signal):
                if self.status.get(sid).state == "retrying":
                    self.status.busy(sid, run.run_id)
                callback = await self._emit(run, recorder, callback, chunk)
                if run.sink is None:
                    await open_stream()
            if run.sink is None:
                await open_stream()
            finish_reason = result.finish_reason
        except AbortError as exc:
            status = "aborted"
            if recorder is not None:
                if run.sink is None:
                    await open_stream()
                # In-flight tool calls are finalized, so the stored turn is truthful and
                # the next prompt carries no unresolved call.
                for call_id in recorder.builder.unfinished_tool_calls():
                    callback = await self._emit(
                        run,
                        recorder,
                        callback,
                        {
                            "type": "tool-output-error",
                            "toolCallId": call_id,
                            "errorText": f"aborted: {exc.reason}",
                        },
                    )
                callback = await self._emit(
                    run, recorder, callback, {"type": "abort", "reason": exc.reason}
                )
        except asyncio.CancelledError:
            # The hosting task was cancelled (actor shutdown): persist what we have.
            status = "aborted"
            if recorder is not None:
                self._finish_recorder(recorder, run, options, "aborted", step_usage, None, stale)
                recorder = None
            self._end_run(run, "aborted")
            raise
        except Exception as exc:
            status = "error"
            replaced = await self.on_chat_error(exc)
            error_text = str(replaced) or type(exc).__name__
            log.warning("run %s failed: %s", run.run_id, error_text)
            if recorder is not None:
                if run.sink is None:
                    await open_stream()
                callback = await self._emit(
                    run, recorder, callback, {"type": "error", "errorText": error_text}
                )
        message = None
        if recorder is not None:
            message = self._finish_recorder(
                recorder, run, options, status, step_usage, finish_reason, stale
            )
            if message is not None and not self._trimmed:
                self.messages = [*self.messages, message]
            elif not stale():
                self.messages = self.store.get_history(sid)
        self._end_run(run, status, error_text)
        if callback is not None:
            if status == "error":
                await _call(callback, "on_error", error_text)
            else:
                await _call(callback, "on_done")
        return ChatResult(
            run_id=run.run_id,
            session_id=sid,
            message_id=run.stream.message_id or "",
            status=status,
            message=message,
            error=error_text,
            finish_reason=finish_reason,
            usage=step_usage.to_dict(),
            steps=result.steps,
            user_message_id=user_id,
        )

    def _finish_recorder(
        self,
        recorder: Recorder,
        run: RunState,
        options: ChatOptions | None,
        status: str,
        usage: Usage,
        finish_reason: str | None,
        stale: Callable[[], bool],
    ) -> dict[str, Any] | None:
        metadata: dict[str, Any] = {}
        if options is not None:
            try:
                metadata.update(self.message_metadata(options))
            except Exception:  # a hook's failure must not lose the turn's message
                log.exception("message_metadata of run %s failed", run.run_id)
        metadata.update(usage=usage.to_dict(), status=status)
        if finish_reason:
            metadata["finishReason"] = finish_reason
        model = self._model_info(run)
        if model:
            metadata["model"] = model
        try:
            message = recorder.finish(metadata)
        except Exception:
            log.exception("final persist of run %s failed", run.run_id)
            raise
        if stale():
            return None
        self._enforce_max_persisted(run.session_id)
        self._prune_chunk_logs()
        return message

    def _model_info(self, run: RunState | None = None) -> dict[str, Any] | None:
        return lifecycle.model_info(self, run)

    async def _emit(
        self,
        run: RunState,
        recorder: Recorder,
        callback: StreamCallback | None,
        chunk: dict[str, Any],
    ) -> StreamCallback | None:
        recorder.record(chunk)
        run.stream.push(chunk)
        if callback is None:
            return None
        try:
            result = callback.on_event(chunk)
            if inspect.isawaitable(result):
                await result
            return callback
        except Exception as exc:  # the consumer went away: detach, never cancel
            log.info("run %s: callback detached (%s)", run.run_id, exc)
            return None

    def _end_run(self, run: RunState, status: str, error: str | None = None) -> None:
        run.sink = _discard  # a straggler's late emit goes nowhere (the message is final)
        if self._runs.pop(run.run_id, None) is None:
            return
        self._session_runs.pop(run.session_id, None)
        run.stream.close(error)
        self._last_stream[run.session_id] = run.stream
        if status == "error":
            self.status.error(run.session_id, error or "error")
        else:
            self.status.idle(run.session_id)

    def get_request_options(self) -> dict[str, Any]:
        """Extra :class:`~thinkray.runtime.models.base.ModelRequest` fields for this turn."""
        return {}

    async def check_tool_permission(
        self, tool_name: str, input: Any, call_id: str, options: ChatOptions | None = None
    ) -> str | ToolDenial | None:
        """Return ``None`` to allow a tool call; a reason (a ``tool-output-error`` the
        model reads) or a :class:`~thinkray.runtime.turn.loop.ToolDenial` (``by_user=True``: the call
        ends ``tool-output-denied``) to refuse it. ``options`` is the turn's: session,
        run, signal and ``emit`` (e.g. to ask a human with ``tool-approval-request``)."""
        return None

    # -- fibers and alarms (seed 000 "Durable fibers") -------------------------------

    def _fiber_manager(self) -> FiberManager:
        if self.fibers is None:
            raise RuntimeError("fibers need a store with a database (DuckDBSessionStore)")
        return self.fibers

    def _scheduler(self) -> Scheduler:
        if self.scheduler is None:
            raise RuntimeError("schedules need a store with a database (DuckDBSessionStore)")
        return self.scheduler

    @remote
    def spawn_fiber(self, method: str, payload: Any = None, *, max_retries: int = 3) -> str:
        """Run ``await self.<method>(payload, ctx)`` durably; returns the fiber id."""
        return self._fiber_manager().spawn_fiber(method, payload, max_retries=max_retries)

    def stash_fiber(self, data: Any) -> None:
        """Checkpoint the running fiber; a recovered fiber gets it as ``ctx.checkpoint``."""
        self._fiber_manager().stash_fiber(data)

    @remote
    def cancel_fiber(self, fiber_id: str) -> bool:
        return self._fiber_manager().cancel_fiber(fiber_id)

    @remote
    def get_fiber(self, fiber_id: str) -> Any:
        return self._fiber_manager().get_fiber(fiber_id)

    @remote
    def list_fibers(self, status: str | None = None) -> list[Any]:
        return self._fiber_manager().list_fibers(status)

    @remote
    async def wait_fiber(self, fiber_id: str, timeout: float | None = None) -> Any:
        return await self._fiber_manager().wait(fiber_id, timeout)

    @remote
    def schedule(self, when: Any, method: str, payload: Any = None) -> str:
        """Call ``self.<method>(payload)`` at ``when`` (seconds from now, a datetime, or a
        5-field cron string). Persisted; a hibernated agent is woken when it is due."""
        schedule_id = self._scheduler().schedule(when, method, payload)
        self._scheduler().start()
        return schedule_id

    @remote
    def schedule_every(self, seconds: float, method: str, payload: Any = None) -> str:
        schedule_id = self._scheduler().schedule_every(seconds, method, payload)
        self._scheduler().start()
        return schedule_id

    @remote
    def cancel_schedule(self, schedule_id: str) -> bool:
        return self._scheduler().cancel_schedule(schedule_id)

    @remote
    def list_schedules(self) -> list[Any]:
        return self._scheduler().list_schedules()

    async def on_wake(self) -> None:
        """First async entry after construction: resume interrupted fibers and run
        due schedules (the actor calls this right after binding)."""
        if self.fibers is not None:
            await self.fibers.start()
        if self.scheduler is not None:
            self.scheduler.start()

    def has_pending_work(self) -> bool:
        """True while fibers or scheduled tasks run here: do not hibernate."""
        fibers = self.fibers is not None and self.fibers.has_work
        scheduled = self.scheduler is not None and self.scheduler.busy
        from thinkray.runtime.agents.worker import JobRegistry

        jobs = JobRegistry.existing(self)
        return bool(fibers or scheduled or (jobs is not None and jobs.has_running()))

    def next_alarm_at(self) -> float | None:
        """Epoch seconds of the next due schedule (what a waker needs), or None."""
        return self.scheduler.next_due_at() if self.scheduler is not None else None

    async def aclose(self) -> None:
        """Stop fibers and timers without marking them finished (hibernation)."""
        if self.fibers is not None and not self.fibers.closed:
            await self.fibers.close()
        if self.scheduler is not None:
            await self.scheduler.close()
        from thinkray.runtime.agents.worker import JobRegistry

        jobs = JobRegistry.existing(self)
        if jobs is not None:
            await jobs.aclose()

    # -- storage upkeep ---------------------------------------------------------------

    def finalize_orphaned_tool_calls(
        self, session_id: str, history: list[dict[str, Any]] | None = None
    ) -> int:
        """A tool call left without output (a run that died with the process) becomes a
        tool error, so the next prompt never carries an unresolved call. Returns the
        number finalized. Calls belonging to a run in flight are left alone."""
        if session_id in self._session_runs and self._session_runs[session_id] in self._runs:
            active = self._runs[self._session_runs[session_id]].stream.message_id
        else:
            active = None
        writes: list[PartWrite] = []
        if history is None:
            history = self.store.get_history(session_id)
        for message in history[-8:]:
            if message.get("role") != "assistant" or message["id"] == active:
                continue
            for idx, part in enumerate(message.get("parts", ())):
                if part.get("type") == "dynamic-tool" and part.get("state") in (
                    "input-streaming",
                    "input-available",
                    "approval-requested",  # the approval died with the process
                ):
                    fixed = dict(part, state="output-error", errorText=ORPHAN_ERROR)
                    writes.append(PartWrite(message["id"], idx, enforce_row_size(fixed)))
        if writes:
            self.store.flush_stream(StreamFlush(session_id=session_id, parts=writes))
            for w in writes:
                self._persist_cache.forget(w.message_id)
        return len(writes)

    def _enforce_max_persisted(self, session_id: str) -> None:
        self._trimmed = False
        limit = self.max_persisted_messages
        if limit is None:
            return
        path = self.store.get_path(session_id)
        visible = [row for row in path if not row.hidden]
        excess = len(visible) - limit
        if excess > 0:
            doomed = [row.id for row in visible[:excess]]
            self.store.delete_messages(session_id, doomed)
            self._trimmed = True
            for mid in doomed:
                self._persist_cache.forget(mid)

    def _prune_chunk_logs(self) -> None:
        keep = max(self.keep_chunk_logs, 1)
        generations = self.store.chunk_generations()
        active = set(self._runs)
        doomed = [g for g in generations[:-keep] if g not in active]
        if doomed:
            self.store.delete_chunks(doomed)

    def persist_message(self, session_id: str, message: dict[str, Any]) -> None:
        """Upsert a whole message through the same sanitize/row-size/cache pipeline."""
        message = prepare_message(parse_message(message, role=message.get("role", "user")))
        self.store.upsert_message(session_id, message, parent_id=HEAD)
        self._persist_cache.forget(message["id"])

    def close(self) -> None:
        for run in list(self._runs.values()):
            run.controller.abort("closing")
        if self.scheduler is not None:
            self.scheduler.stop()
        self.store.close()


async def _discard(chunk: dict[str, Any]) -> None:
    """The emit sink of a finished run."""


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


async def _call(callback: Any, name: str, *args: Any) -> None:
    fn: Callable[..., Any] | None = getattr(callback, name, None)
    if fn is None:
        return
    try:
        result = fn(*args)
        if isinstance(result, Awaitable) or inspect.isawaitable(result):
            await result
    except Exception as exc:
        log.info("callback %s failed: %s", name, exc)
