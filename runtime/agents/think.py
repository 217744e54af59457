"""``Think``: the opinionated chat agent base class (seed 000), without Ray.

Subclass and override ``get_model`` (and, as needed, the other override points). One
instance owns one :class:`~thinkray.storage.protocols.SessionStore` and serves several
sessions, at most one turn per session at a time. ``Think`` itself is the agent's
face: override points, hooks and the remote-callable surface (``@remote``). The work is
done by parts it composes, each with one responsibility:

- :class:`~thinkray.runtime.agents.sessions.SessionManager` (``agent.sessions``):
  create, switch, branch, threads, rewind, the current session;
- :class:`~thinkray.runtime.agents.turns.TurnRunner` (``agent.turns``): the turn,
  one run per session, abort, reservations, replayable run streams;
- :class:`~thinkray.runtime.durable.services.DurableServices` (``agent.durable``):
  fibers, schedules and background jobs, resumed on wake.

No turn state lives on the agent: each turn's history, options, recorder and model
belong to its run (:mod:`thinkray.runtime.agents.runs`), and the hooks receive them.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, ClassVar, Literal

from pydantic import BaseModel
from thinkray.runtime.abort import AbortController, AbortSignal
from thinkray.runtime.agents import model_switch
from thinkray.runtime.agents.context import AgentContext, context_being_constructed
from thinkray.runtime.agents.midturn import BusyPolicy, check_policy
from thinkray.runtime.agents.recovery import (
    INTERRUPTED_ERROR,
    RecoveredRun,
    recover_interrupted_runs,
)
from thinkray.runtime.agents.runs import ChatOptions, ChatResult, RunState, StreamCallback
from thinkray.runtime.agents.sessions import (
    CURRENT_SESSION_KEY,
    RewindResult,
    SessionManager,
    UnrewindResult,
    resend_message,
)
from thinkray.runtime.agents.state import AgentState, StateSource
from thinkray.runtime.agents.turns import ORPHAN_ERROR, TurnRunner
from thinkray.runtime.chunks import UIChunk, from_chunk_log
from thinkray.runtime.durable.fibers import FiberManager
from thinkray.runtime.durable.jobs import JobRegistry
from thinkray.runtime.durable.schedules import Scheduler
from thinkray.runtime.durable.services import DurableServices
from thinkray.runtime.errors import (  # re-exported: the errors live in thinkray.runtime.errors
    InvalidConfigError as InvalidConfigError,
)
from thinkray.runtime.errors import (
    ModelNotConfiguredError,
    StateChangeRefusedError,
    UnknownJobError,
    UnknownRunError,
)
from thinkray.runtime.messages import Role, parse_message
from thinkray.runtime.models.base import Model, ModelMessage
from thinkray.runtime.remote import idempotent, remote
from thinkray.runtime.status import SessionStatus, StatusBoard
from thinkray.runtime.tools.base import Tool, ToolContext
from thinkray.runtime.tools.durable import LatePolicy, ToolCallLedger, ToolPolicy, policy_of
from thinkray.runtime.turn.context import prune_tool_calls, to_model_messages
from thinkray.runtime.turn.loop import RetryPolicy, ToolDenial, run_loop
from thinkray.runtime.turn.persistence import ROW_MAX_BYTES, enforce_row_size, prepare_message
from thinkray.runtime.turn.recorder import DEFAULT_FLUSH_INTERVAL
from thinkray.runtime.turn.stream import Pacing, RunStream
from thinkray.runtime.usage import Usage
from thinkray.storage.protocols import HEAD, SessionStore
from thinkray.storage.records import ToolCallRecord
from thinkray.storage.types import PartWrite, SearchHit, SessionInfo, StreamFlush

log = logging.getLogger("thinkray.think")

__all__ = [
    "CONFIG_KEY",
    "CURRENT_SESSION_KEY",
    "ORPHAN_ERROR",
    "ChatOptions",
    "ChatResult",
    "InvalidConfigError",
    "RunState",
    "StreamCallback",
    "Think",
]

CONFIG_KEY = "think.config"


class _StartsAfterInit(type):
    """Runs ``on_start`` once the whole constructor chain finished, so a subclass's
    ``__init__`` never races its own ``on_start`` (no ordering tricks needed)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        agent = super().__call__(*args, **kwargs)
        agent.on_start()
        return agent


class Think(metaclass=_StartsAfterInit):
    """Override points (seed 000): ``get_model``, ``get_system_prompt``, ``get_tools``,
    ``get_max_steps``, ``assemble_context``, ``on_chat_message``, ``on_chat_error``,
    ``get_workspace``. Lifecycle hooks: ``on_start`` (after construction: every wake
    runs it), ``on_user_message`` (before a user message lands).

    Turn hooks for capabilities layered on top (``thinkray.runtime.agents.agent.Agent``
    uses them; each default is a no-op, so a plain subclass behaves as without them):
    ``prepare_turn`` (before the stream; may emit and rewrite the history),
    ``context_view`` (which messages the model sees), ``system_prompt_for`` (the prompt
    given the turn's tools), ``check_tool_permission`` (with the turn's options),
    ``message_metadata`` (extra assistant metadata), ``reserve_session`` (hold a session
    busy outside a turn) and ``own_turn``.

    Construction: ``store`` is a :class:`SessionStore`, a database path, or None (in
    memory); ``model`` the default model; ``context`` the agent's identity (name,
    namespace, storage root), passed by the host that builds it.

    Oversized input is refused, never cut short: a message given to ``chat`` (and the
    other turn entry points) larger than ``max_user_message_bytes`` — its parts and
    metadata as stored; default :data:`~thinkray.runtime.turn.persistence.ROW_MAX_BYTES`,
    the 1.8 MB a stored row holds, so a message within it is stored whole — raises
    :class:`~thinkray.runtime.errors.MessageTooLargeError` (a ``UserError``) before
    anything is written. (Seed 000 truncates oversized rows with a ``[truncated]``
    marker; for tool output the agent produced that stays so, but a user's message
    truncated in silence would have the model answer something the user never sent.)
    Raising the limit above the row cap does not lift the cap on a single part."""

    max_persisted_messages: int | None = None
    max_user_message_bytes: int = ROW_MAX_BYTES
    flush_interval: float = DEFAULT_FLUSH_INTERVAL
    retry_policy: RetryPolicy = RetryPolicy()
    prune_keep_last: int = 2
    keep_chunk_logs: int = 2  # at least the current run's and the last finished run's
    recent_results: int = 64  # finished runs whose ChatResult wait_run still returns
    recover_fibers: bool = True  # restart interrupted fibers from their checkpoint on wake
    models: dict[str, Model] | None = None  # model_id -> Model, for per-turn selection
    observe_turns: bool = True  # turns are traced and measured (a host's warm-up is not)
    # True: a namespace always runs this agent in a Ray actor of its own, even with
    # placement "hosts" (CPU-heavy tools, native code that could take its siblings down)
    dedicated_actor: bool = False
    late_tool_results: LatePolicy = "discard"  # a result for a cancelled call: or "store"
    # A generation cut off by a crash: "fail" closes it (interrupted); "resume" also
    # answers on from its durable tool calls once none is open (see on_wake).
    recover_generations: Literal["fail", "resume"] = "fail"
    # Synced state (runtime/agents/state.py): a pydantic model class, its initial value
    # (a model instance or its data; None: the model's defaults), whether clients may
    # set it, and its largest size as JSON.
    state_model: ClassVar[type[BaseModel] | None] = None
    initial_state: ClassVar[BaseModel | dict[str, Any] | None] = None
    client_can_set_state: ClassVar[bool] = False
    max_state_bytes: ClassVar[int] = ROW_MAX_BYTES
    # A user message sent while its session is busy: "reject" (SessionBusyError),
    # "queue", "latest", "steer" or "interrupt" (see thinkray.runtime.agents.midturn);
    # each turn entry point takes ``on_busy=`` to override it for one message.
    on_busy: BusyPolicy = "reject"
    # The longest a tool call's input chunks wait for the step's batch (which commits
    # the call's row with them) before they are committed and sent on their own: a
    # model that pauses after a call must not hide it from clients. Seconds.
    tool_input_gate: float = 0.05
    # True: on a slow disk, with other turns running in the process, a turn's durable
    # points (its user message, its final persist) wait for the disk in a worker
    # thread instead of on the event loop, so agents sharing a loop never wait on each
    # other's fdatasync (TurnRunner._durably). None: the placement decides (agent hosts
    # set True on the agents they run; alone on a loop, in place: a thread hop costs
    # more than it saves there). False: always in place.
    syncs_off_loop: bool | None = None

    def __init__(
        self,
        store: SessionStore | str | os.PathLike[str] | None = None,
        *,
        model: Model | None = None,
        context: AgentContext | None = None,
    ) -> None:
        if store is None or isinstance(store, (str, os.PathLike)):
            from thinkray.storage.session_store import DuckDBSessionStore

            store = DuckDBSessionStore(store if store is not None else ":memory:")
        self.store: SessionStore = store
        self.context = context or context_being_constructed() or AgentContext()
        self._model = model
        self._config: dict[str, Any] | None = None
        check_policy(self.on_busy)
        self.status = StatusBoard()
        self.turns = TurnRunner(self, self.status)
        self.sessions = SessionManager(store, self.turns)
        self.durable = DurableServices(store.stores().fibers(), self, recover=self.recover_fibers)
        self.tool_calls = ToolCallLedger(
            store.stores().tool_calls(), late_results=self.late_tool_results
        )
        # The constructor is the wake path: tool calls this agent's executors held when
        # the old process died are failed (or put back, per tool), deadlines and leases
        # of open calls re-armed (past ones swept at once), then runs cut off by the
        # crash are closed, their tool calls as their durable rows say.
        self._constructed = False
        self.tool_calls.arm = self._arm_tool_call_alarm
        self.recovered_tool_calls = self.tool_calls.recover(self._tool_policies())
        if self.tool_calls.open_at_wake:
            self.tool_calls.cancel_unreleased(store.open_generations(), INTERRUPTED_ERROR)
        self.recovered_runs: list[RecoveredRun] = recover_interrupted_runs(
            store, self._call_outcome
        )
        self._resumes: set[asyncio.Task[Any]] = set()
        # Messages a dead incarnation had queued wait again (on_wake runs them).
        self.turns.queue.recover()
        self.tool_calls.on_settled = self.on_tool_call_settled
        self.synced_state = AgentState(
            type(self), lambda: store.stores().agent_state(), self.max_state_bytes
        )
        self._constructed = True

    # -- identity ---------------------------------------------------------------------

    @property
    def agent_name(self) -> str:
        """The agent's name in its namespace (``context.name``)."""
        return self.context.name

    @property
    def namespace(self) -> str:
        """The agent's namespace (``context.namespace``)."""
        return self.context.namespace

    @property
    def storage_root(self) -> str | None:
        """The storage root of the agent's namespace (``context.storage_root``)."""
        return self.context.storage_root

    # -- override points --------------------------------------------------------------

    def get_model(self) -> Model:
        """The default model: the one given as ``model=``, unless overridden.

        Raises:
            ModelNotConfiguredError: no model was given and this is not overridden.
        """
        if self._model is not None:
            return self._model
        raise ModelNotConfiguredError(
            f"{type(self).__name__} has no model: override get_model() or pass model="
        )

    def get_system_prompt(self) -> str:
        """The system prompt (may be async in a subclass)."""
        return "You are a helpful assistant."

    def get_tools(self) -> dict[str, Tool]:
        """The agent's tools by name (may be async in a subclass)."""
        return {}

    def _tool_policies(self) -> dict[str, ToolPolicy]:
        """The tools' policies for recovery on wake (tools from a synchronous
        ``get_tools``; an async one, or one that fails now, gives the defaults)."""
        try:
            tools = self.get_tools()
        except Exception:
            return {}
        if inspect.isawaitable(tools):
            close = getattr(tools, "close", None)  # a coroutine never awaited
            if callable(close):
                close()
            return {}
        return {name: policy_of(t) for name, t in dict(tools).items()}

    def get_max_steps(self) -> int:
        """The most model steps one turn may take."""
        return 10

    async def assemble_context(self, options: ChatOptions) -> list[ModelMessage]:
        """The model's view of the turn's history (``options.history``), through
        ``context_view``, with older tool calls pruned."""
        messages = self.context_view(options.history)
        return prune_tool_calls(to_model_messages(messages), self.prune_keep_last)

    def context_view(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Hook: the stored messages the model sees (e.g. a summary plus the tail after a
        compaction). Must not mutate ``messages``. Default: all of them."""
        return messages

    async def prepare_turn(self, options: ChatOptions) -> bool:
        """Hook: runs once per turn after the user message landed and the history was
        loaded (``options.history``), before the assistant message exists and before
        the model is called. It may ``await options.emit(chunk)`` (held until the stream
        starts) and may change the stored history, e.g. compact it; return True then,
        so the turn reloads the history (and the assistant message's parent). Raising
        ends the turn like an error in the stream (AbortError: aborted)."""
        return False

    async def system_prompt_for(self, options: ChatOptions, tools: dict[str, Tool]) -> str:
        """Hook: the system prompt of this turn, given its resolved tools
        (``get_tools()`` plus ``options.tools``). Default: ``get_system_prompt()``."""
        prompt: str = await _maybe_await(self.get_system_prompt())
        return prompt

    def span_attributes(self, session_id: str, run_id: str) -> dict[str, Any]:
        """Hook: extra attributes for the turn's ``invoke_agent`` span (called only
        while tracing is on). Values OpenTelemetry cannot carry (dicts, objects) are
        dropped, never raised."""
        return {}

    def message_metadata(self, options: ChatOptions) -> dict[str, Any]:
        """Hook: extra ``metadata`` for the turn's assistant message, merged when the
        turn ends (``usage``, ``status``, ``finishReason`` and ``model`` win)."""
        return {}

    async def on_chat_message(self, options: ChatOptions) -> AsyncIterator[UIChunk]:
        """The default turn: the agentic loop. Override for full control; yield UI chunks."""
        model = options.model if options.model is not None else self.get_model()
        tools = dict(await _maybe_await(self.get_tools()))
        tools.update(options.tools)
        messages = await self.assemble_context(options)
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
        """The agent's workspace (None: none)."""
        return None

    def on_start(self) -> None:
        """Called once the constructor finished: every wake or restart runs it."""

    async def on_user_message(self, session_id: str, message: dict[str, Any]) -> dict[str, Any]:
        """The ``message.user`` hook: runs before a user message lands (e.g. to attach a
        ``snapshot_id`` to its metadata). Return the message to store."""
        return message

    def on_step_usage(self, session_id: str, usage: Usage) -> None:
        """Called with each step's usage after it was added to the rollups."""

    def get_request_options(self) -> dict[str, Any]:
        """Extra :class:`~thinkray.runtime.models.base.ModelRequest` fields for a turn."""
        return {}

    async def check_tool_permission(
        self, tool_name: str, input: Any, call_id: str, options: ChatOptions | None = None
    ) -> str | ToolDenial | None:
        """Return ``None`` to allow a tool call; a reason (a ``tool-output-error`` the
        model reads) or a :class:`~thinkray.runtime.turn.loop.ToolDenial` (``by_user=True``:
        the call ends ``tool-output-denied``) to refuse it. ``options`` is the turn's:
        session, run, signal and ``emit`` (e.g. to ask a human with
        ``tool-approval-request``)."""
        return None

    def resolve_model(self, selection: dict[str, Any] | None) -> Model:
        """The model for a ``{provider_id, model_id, variant}`` selection (None: the
        default). Default: ``self.models[model_id]``, else ``get_model()`` if it
        matches. Override to build models per provider or variant."""
        return model_switch.resolve_model(self, selection)

    async def compact_for_model(
        self, session_id: str, model: Model, *, fit_below: int | None = None
    ) -> None:
        """Make room before switching to a model with a smaller context window.
        ``fit_below``: the new model's usable tokens; write a compaction only if the
        context it leaves is below it (a refused switch must write nothing).
        Default: ``self.compact(session_id, auto=True, model=, fit_below=)`` when the
        agent has one."""
        await model_switch.compact_for_model(self, session_id, model, fit_below=fit_below)

    # -- configuration ----------------------------------------------------------------

    @idempotent
    @remote
    def configure(self, config: dict[str, Any]) -> None:
        """Store the agent's configuration (a dict; persisted in its database)."""
        if not isinstance(config, dict):
            raise InvalidConfigError("config must be a dict")
        self.store.set_config(CONFIG_KEY, config)
        self._config = dict(config)

    @idempotent
    @remote
    def get_config(self) -> dict[str, Any] | None:
        """The configuration stored by ``configure`` (None if never configured)."""
        if self._config is None:
            self._config = self.store.get_config(CONFIG_KEY)
        return self._config

    # -- sessions (SessionManager) ----------------------------------------------------

    @property
    def current_session_id(self) -> str | None:
        """The current session's id (None: none yet)."""
        return self.sessions.current_id

    @idempotent
    @remote
    def get_current_session_id(self) -> str | None:
        """The current session's id (None: none yet)."""
        return self.sessions.current_id

    @remote
    def create_session(self, name: str = "New Chat", **kwargs: Any) -> SessionInfo:
        """Create a session and make it current."""
        return self.sessions.create(name, **kwargs)

    @remote
    def switch_session(self, session_id: str) -> list[dict[str, Any]]:
        """Make an existing session current; returns its visible history."""
        return self.sessions.switch(session_id)

    @idempotent
    @remote
    def get_sessions(self, **kwargs: Any) -> list[SessionInfo]:
        """Every session (filters as ``SessionStore.list_sessions``)."""
        return self.store.list_sessions(**kwargs)

    @idempotent
    @remote
    def get_session(self, session_id: str | None = None) -> SessionInfo:
        """One session (default: the current one)."""
        return self.store.get_session(self.sessions.resolve(session_id))

    @remote
    def rename_session(self, session_id: str, name: str) -> None:
        """Rename a session."""
        self.store.rename_session(session_id, name)

    @remote
    def delete_session(self, session_id: str) -> None:
        """Delete a session; a run in flight on it is aborted."""
        self.sessions.delete(session_id)

    @remote
    def clear_messages(self, session_id: str | None = None) -> None:
        """Clear a session's messages. An in-flight run is aborted and its pending
        writes are discarded (the clear-during-stream guard)."""
        self.sessions.clear(session_id)

    @idempotent
    @remote
    def get_history(
        self, session_id: str | None = None, *, leaf_id: str | None = None
    ) -> list[dict[str, Any]]:
        """The visible history of a session (default: current). With ``leaf_id``, the
        branch ending at that message, whole, as it read there: an edited or rewound
        branch keeps its old messages (hidden from the current view since) readable
        this way; only what a compaction on that branch summarized is left out.

        Raises:
            SessionNotFoundError: no such session (or none selected).
            MessageNotFoundError: ``leaf_id`` is not a message of the session.
        """
        return self.sessions.history(self.sessions.resolve(session_id), leaf_id)

    @idempotent
    @remote
    def message_count(self, session_id: str | None = None) -> int:
        """How many visible messages a session has."""
        return self.store.message_count(self.sessions.resolve(session_id))

    @idempotent
    @remote
    def get_message(self, message_id: str) -> dict[str, Any] | None:
        """One message by id (None if unknown)."""
        return self.store.get_message(message_id)

    @idempotent
    @remote
    def search(self, query: str, limit: int = 10, session_id: str | None = None) -> list[SearchHit]:
        """Search the agent's stored messages, every session or one (``session_id``):
        ranked hits (BM25), best first, one per message, each with its session,
        message id, role and a snippet. See ``SessionStore.search_messages``.

        Raises:
            InvalidInputError: an empty or oversized query; ``limit`` outside 1-100.
            SessionNotFoundError: ``session_id`` names no session.
        """
        return self.store.search_messages(query, limit=limit, session_id=session_id)

    @idempotent
    @remote
    def children(self, message_id: str) -> list[dict[str, Any]]:
        """The messages whose parent is ``message_id`` (the branches at that point)."""
        return self.store.children(message_id)

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
        return self.sessions.branch(parent_session_id, from_message_id, metadata, name=name)

    @remote
    def thread(self, key: str | None = None) -> SessionInfo:
        """Create or get the thread ``key`` (seed 001; None: "default"). A thread is a
        session: chat in it with ``session_id=info.id``."""
        return self.sessions.thread(key)

    @idempotent
    @remote
    def list_threads(self) -> list[SessionInfo]:
        """Every thread."""
        return self.store.list_threads()

    @remote
    def clone_thread(
        self, src_key: str, dst_key: str, from_message_id: str | None = None
    ) -> SessionInfo:
        """Copy a thread's visible history (to ``from_message_id``) into a new thread."""
        return self.sessions.clone_thread(src_key, dst_key, from_message_id)

    @remote
    def delete_thread(self, key: str) -> None:
        """Delete a thread (its run in flight is aborted)."""
        self.sessions.delete_thread(key)

    @remote
    def rewind(
        self, session_id: str, user_message_id: str, *, include_target: bool = False
    ) -> RewindResult:
        """Soft-hide everything after a user message; the next turn appends after it
        (``include_target``: hide the message too, to send an edited one instead)."""
        return self.sessions.rewind(session_id, user_message_id, include_target=include_target)

    @remote
    def unrewind(self, session_id: str) -> UnrewindResult:
        """Undo the latest rewind; turns taken since stay on their own branch."""
        return self.sessions.unrewind(session_id)

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
        new = resend_message(rewound, message)
        return await self.chat(new, callback, session_id=session_id, **kwargs)

    # -- synced state (AgentState) ------------------------------------------------------

    @property
    def state(self) -> Any:
        """The current state (a fresh ``state_model`` instance; None for a class
        without state). Change it with :meth:`set_state`."""
        return self.synced_state.current() if self.synced_state.enabled else None

    def validate_state_change(self, state: Any, source: StateSource) -> None:
        """Hook: raise (e.g. :class:`~thinkray.runtime.errors.StateChangeRefusedError`)
        to refuse a change that fits the model; ``state`` is the validated model
        instance, ``source`` who sends it. Clients reach it only where
        ``client_can_set_state`` lets them. Default: every change is accepted."""

    def on_state_update(self, state: Any, source: StateSource) -> None:
        """Hook: called after a change was stored and sent to the subscribers (what it
        raises is logged, the change stands)."""

    def _change_state(self, value: Any, source: StateSource, origin: str | None) -> dict[str, Any]:
        state, data = self.synced_state.check(value)
        self.validate_state_change(state, source)
        change = self.synced_state.store(data, origin=origin, sent=value)
        try:
            self.on_state_update(self.synced_state.current(), source)
        except Exception:
            log.exception("on_state_update of %s failed", type(self).__name__)
        return change.to_dict()

    @idempotent
    @remote
    def get_state(self) -> Any:
        """The current state (a ``state_model`` instance).

        Raises:
            NoAgentStateError: the class declares no ``state_model``.
        """
        return self.synced_state.current()

    @remote
    def set_state(self, state: Any) -> Any:
        """Replace the state (a ``state_model`` instance or its data) as the server:
        validated, stored, then sent to every connected client. Returns the stored
        state.

        Raises:
            InvalidAgentStateError: it does not fit the model (nothing stored).
            NoAgentStateError: the class declares no ``state_model``.
        """
        self._change_state(state, "server", None)
        return self.synced_state.current()

    @idempotent
    @remote
    def state_snapshot(self) -> dict[str, Any]:
        """The state as clients see it: ``{"state": <JSON>, "version": n, ...}``."""
        return self.synced_state.snapshot().to_dict()

    @remote
    def set_client_state(self, state: Any, origin: str | None = None) -> dict[str, Any]:
        """A client's state change (what the ingress calls): refused unless
        ``client_can_set_state``, then validated like :meth:`set_state` and checked by
        ``validate_state_change`` with source ``client``. ``origin``: the sending
        connection, which is not sent its own change back. Returns the change as
        :meth:`state_snapshot` does.

        Raises:
            StateChangeRefusedError: clients may not set this agent's state, or the
                hook refused (nothing stored).
            InvalidAgentStateError: it does not fit the model (nothing stored).
        """
        if not self.client_can_set_state and self.synced_state.enabled:
            raise StateChangeRefusedError(
                f"clients may not set the state of {type(self).__name__} "
                "(client_can_set_state is off)"
            )
        return self._change_state(state, "client", origin)

    # -- status, abort, reservations (TurnRunner) -------------------------------------

    @idempotent
    @remote
    def get_status(self, session_id: str | None = None) -> SessionStatus:
        """The session's status (idle, busy, retrying or error), with the messages
        waiting for their turn (``queue``)."""
        return self.status.get(self.sessions.resolve(session_id))

    @idempotent
    @remote
    def queued_messages(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """The messages waiting for a turn (of one session; None: every session),
        first to run first: ``message_id``, ``run_id``, ``mode``, ``queued_at``."""
        sid = self.sessions.resolve(session_id) if session_id is not None else None
        return self.turns.queue.pending(sid)

    @idempotent
    @remote
    def queued_message(self, message_id: str) -> dict[str, Any] | None:
        """What became of a message sent while its session was busy: its row
        (``status``: queued, running, answered, steered, superseded, cancelled or
        failed; ``outcome``), or None if it was never queued."""
        store = self.turns.queue.store(create=False)
        row = store.get(message_id) if store is not None else None
        return row.to_dict() if row is not None else None

    @idempotent
    @remote
    def abort(
        self,
        session_id: str | None = None,
        *,
        run_id: str | None = None,
        reason: str = "aborted by user",
    ) -> bool:
        """Abort the run in flight (by session or run id). False if there is none."""
        return self.turns.abort(session_id or self.sessions.current_id, run_id, reason)

    @contextlib.contextmanager
    def reserve_session(self, session_id: str, operation: str = "reserved") -> Iterator[None]:
        """Hold ``session_id`` busy for an operation that is not a turn (a manual
        compaction, say): raises :class:`SessionBusyError` if a run or another
        reservation holds it; while held, ``start_chat`` raises SessionBusyError and the
        status reads busy (``message=operation``). The previous status comes back after.
        The session's own turn must not reserve (see :meth:`own_turn`)."""
        with self.turns.reserve(session_id, operation):
            yield

    def own_turn(self, session_id: str) -> RunState | None:
        """The session's turn if the caller runs inside it (its own task) before its
        history is fixed (``on_user_message``, ``prepare_turn``, the model switch), else
        None. Such a caller already holds the session and may rewrite its history, and
        may ``emit`` into the turn's stream (held until the stream starts)."""
        return self.turns.own_turn(session_id)

    @idempotent
    @remote
    def active_run(self, session_id: str | None = None) -> str | None:
        """The run id in flight on a session (default: current), or None."""
        return self.turns.active_run(session_id or self.sessions.current_id)

    def run_stream(self, session_id: str | None = None) -> RunStream | None:
        """The current run's stream, else the last finished run's (for resume)."""
        return self.turns.run_stream(self.sessions.resolve(session_id))

    def stream_of(self, run_id: str) -> RunStream | None:
        """The stream of a run in flight or of a session's last finished run."""
        return self.turns.stream_of(run_id)

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
        on_busy: BusyPolicy | None = None,
    ) -> ChatResult:
        """Run one turn and return its result. ``message=None`` answers the current
        history again (after a rewind, say). Raises before writing anything for an
        invalid message, an unknown session or a busy session (``on_busy``, default
        the agent's :attr:`on_busy`, says what a busy session does instead)."""
        run = self.start_chat(
            message,
            callback,
            session_id=session_id,
            signal=signal,
            tools=tools,
            run_id=run_id,
            role=role,
            on_busy=on_busy,
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
        on_busy: BusyPolicy | None = None,
    ) -> RunState:
        """Start a turn in the background; returns its :class:`RunState` at once
        (``run_id``, ``stream``, ``task``). Validation errors raise here. On a busy
        session (``on_busy``, default :attr:`on_busy`) the run may wait for its turn:
        its stream fills and its task resolves once it ran (or was superseded,
        steered into the running turn, or cancelled). Every entry point (the handle,
        HTTP, WebSocket, an ACP server) starts turns here, so one policy applies."""
        return self.turns.start(
            message,
            callback,
            session_id=session_id,
            signal=signal,
            tools=tools,
            run_id=run_id,
            role=role,
            on_busy=on_busy,
        )

    @remote
    async def stream_chat(
        self,
        message: str | dict[str, Any] | None = None,
        *,
        session_id: str | None = None,
        run_id: str | None = None,
        role: Role = "user",
        on_busy: BusyPolicy | None = None,
    ) -> AsyncIterator[UIChunk]:
        """Run one turn and yield its UI chunks as they are produced. Leaving early
        detaches: the turn goes on (stop it with :meth:`abort`). Raises like
        :meth:`chat` before anything is written."""
        run = self.start_chat(
            message, session_id=session_id, run_id=run_id, role=role, on_busy=on_busy
        )
        async for batch in run.stream.follow():
            for chunk in batch:
                yield chunk

    def replay(
        self,
        session_id: str | None = None,
        run_id: str | None = None,
        *,
        coalesce: float | Pacing = 0.0,
    ) -> tuple[str | None, bool, AsyncIterator[list[UIChunk]]]:
        """What :meth:`resume` reads: ``(run_id, live, batches)`` for the run in flight
        (by id, else the session's), else its last finished run — from memory while
        the agent is live, from the chunk log in the database after a wake. ``run_id``
        is None when there is nothing to replay."""
        stream = self.stream_of(run_id) if run_id else self.run_stream(session_id)
        if stream is not None:
            return stream.run_id, not stream.done, stream.follow(coalesce=coalesce)
        generations = self.store.chunk_generations()
        wanted = run_id or (generations[-1] if generations else None)
        if wanted is None or wanted not in generations:
            return None, False, _no_batches()
        return wanted, False, _one_batch(from_chunk_log(self.store.get_chunks(wanted)))

    @idempotent
    @remote
    async def resume(
        self, session_id: str | None = None, run_id: str | None = None
    ) -> AsyncIterator[UIChunk]:
        """Replay the current (else the last) run's chunks from index 0, then the live
        tail: exactly once, contiguous. Nothing to replay: an empty stream."""
        _, _, batches = self.replay(session_id, run_id)
        async for batch in batches:
            for chunk in batch:
                yield chunk

    # -- background jobs (async tools, seed 003 §1.5 and §4.2) --------------------------

    @idempotent
    @remote
    def get_job(self, job_id: str) -> dict[str, Any] | None:
        """One job's row (status, progress, result or error, the tool call that started
        it in ``parent``); None if unknown."""
        record = JobRegistry.for_agent(self).get(job_id)
        return record.to_dict() if record is not None else None

    @idempotent
    @remote
    def list_jobs(self, status: str | None = None) -> list[dict[str, Any]]:
        """Jobs oldest first, optionally only those with ``status``."""
        return [r.to_dict() for r in JobRegistry.for_agent(self).jobs(status)]

    @idempotent
    @remote
    def cancel_job(self, job_id: str, reason: str = "cancelled by request") -> dict[str, Any]:
        """Cancel a running job (its work's abort signal fires; see
        ``JobRegistry.cancel``) and return its row; a finished job is returned as it is
        (cancelling again changes nothing).

        Raises:
            UnknownJobError: no such job.
        """
        registry = JobRegistry.for_agent(self)
        registry.cancel(job_id, reason)
        record = registry.get(job_id)
        if record is None:
            raise UnknownJobError(f"unknown job {job_id!r}")
        return record.to_dict()

    # -- durable tool calls (seed 003 §1; thinkray.runtime.tools.durable) ---------------

    @remote
    async def claim_tool_calls(
        self,
        tool_names: list[str],
        executor: str,
        limit: int = 1,
        wait: float = 0.0,
        lease: float | None = None,
    ) -> list[dict[str, Any]]:
        """For a decoupled executor (another actor, an external worker pool): claim up
        to ``limit`` pending calls of ``tool_names`` (waiting up to ``wait`` s for one).
        Each claimed call is ``executing`` and held by ``executor`` until its
        ``lease_until`` (``lease`` seconds, default the tool policy's): renew it with
        :meth:`renew_tool_call` while working, report with :meth:`submit_tool_result`.
        A claim not renewed in time lapses and the call goes to the next claimant.
        Two executors never hold the same call."""
        records = await self.tool_calls.claim(tool_names, executor, limit, min(wait, 60.0), lease)
        return [r.to_dict() for r in records]

    @remote
    def renew_tool_call(
        self, tool_call_id: str, executor: str, lease: float | None = None
    ) -> dict[str, Any]:
        """An executor's heartbeat: its claim holds ``lease`` more seconds from now
        (default: the tool policy's). Returns the call (``lease_until`` updated).

        Raises:
            UnknownToolCallError: no such call.
            ClaimLostError: ``executor`` no longer holds it (lapsed, claimed again,
                cancelled or finished): stop working on it."""
        return self.tool_calls.renew(tool_call_id, executor, lease).to_dict()

    @remote
    def submit_tool_result(
        self, tool_call_id: str, executor: str, result: Any = None, error: str | None = None
    ) -> str:
        """An executor's outcome for a call it holds (``error`` set: it failed); the
        waiting turn goes on. ``accepted``, or for a call cancelled meanwhile
        ``discarded-late`` / ``stored-late`` (``late_tool_results``).

        Raises:
            UnknownToolCallError: no such call.
            ClaimLostError: ``executor`` does not hold it (its claim lapsed, or another
                executor claimed it since).
            ToolCallStateError: the call finished.
            InvalidInputError: a result that cannot be stored."""
        return self.tool_calls.submit(tool_call_id, executor, result=result, error=error)

    @idempotent
    @remote
    def get_tool_call(self, tool_call_id: str) -> dict[str, Any] | None:
        """One tool call's row (None if unknown)."""
        rec = self.tool_calls.store.get(tool_call_id)
        return rec.to_dict() if rec is not None else None

    @idempotent
    @remote
    def list_tool_calls(
        self, status: str | list[str] | None = None, run_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Tool calls, oldest first (by status and run)."""
        return [r.to_dict() for r in self.tool_calls.store.rows(status, run_id=run_id)]

    @idempotent
    @remote
    async def wait_run(self, run_id: str) -> ChatResult:
        """The result of a run: waits while it is in flight; a finished run's result is
        kept among the agent's recent results (the last ``recent_results``, in memory).

        Raises:
            UnknownRunError: no such run is in flight or among the recent results (it
                never ran here, ran before the agent last woke, or is too old)."""
        run = self.turns.runs.get(run_id)
        if run is not None and run.task is not None:
            return await asyncio.shield(run.task)
        waiter = self.turns.queue.waiters.get(self.turns.queue.by_run.get(run_id, ""))
        if waiter is not None:
            return await asyncio.shield(waiter.result)
        result = self.turns.results.get(run_id)
        if result is None:
            raise UnknownRunError(
                f"no run {run_id!r} in flight or among the last {self.recent_results} "
                "results (results do not survive hibernation; the stored message does)"
            )
        return result

    # -- fibers and alarms (seed 000 "Durable fibers"; DurableServices) ---------------

    @property
    def fibers(self) -> FiberManager:
        """The fiber manager (fibers live in the agent's database)."""
        return self.durable.fibers

    @fibers.setter
    def fibers(self, manager: FiberManager) -> None:
        if manager is not self.durable.fibers:
            # The replaced manager's recovery pass (started by the constructor) must not
            # resume fibers next to the new one, nor outlive the database.
            self.durable.fibers.stop()
        self.durable.fibers = manager

    @property
    def scheduler(self) -> Scheduler:
        """The scheduler (schedules live in the agent's database)."""
        return self.durable.scheduler

    @remote
    def spawn_fiber(self, method: str, payload: Any = None, *, max_retries: int = 3) -> str:
        """Run ``await self.<method>(payload, ctx)`` durably; returns the fiber id."""
        return self.durable.fiber_manager().spawn_fiber(method, payload, max_retries=max_retries)

    def stash_fiber(self, data: Any) -> None:
        """Checkpoint the running fiber; a recovered fiber gets it as ``ctx.checkpoint``."""
        self.durable.fiber_manager().stash_fiber(data)

    @remote
    def cancel_fiber(self, fiber_id: str) -> bool:
        """Cancel a fiber; False if it is not running."""
        return self.durable.fiber_manager().cancel_fiber(fiber_id)

    @idempotent
    @remote
    def get_fiber(self, fiber_id: str) -> Any:
        """A fiber's record."""
        return self.durable.fiber_manager().get_fiber(fiber_id)

    @idempotent
    @remote
    def list_fibers(self, status: str | None = None) -> list[Any]:
        """Fiber records, optionally of one status."""
        return self.durable.fiber_manager().list_fibers(status)

    @idempotent
    @remote
    async def wait_fiber(self, fiber_id: str, timeout: float | None = None) -> Any:
        """Wait for a fiber to finish; returns its record."""
        return await self.durable.fiber_manager().wait(fiber_id, timeout)

    @remote
    def schedule(self, when: Any, method: str, payload: Any = None) -> str:
        """Call ``self.<method>(payload)`` at ``when`` (seconds from now, a datetime, or a
        5-field cron string). Persisted; a hibernated agent is woken when it is due."""
        scheduler = self.durable.schedules()
        schedule_id = scheduler.schedule(when, method, payload)
        scheduler.start()
        return schedule_id

    @remote
    def schedule_every(self, seconds: float, method: str, payload: Any = None) -> str:
        """Call ``self.<method>(payload)`` every ``seconds``."""
        scheduler = self.durable.schedules()
        schedule_id = scheduler.schedule_every(seconds, method, payload)
        scheduler.start()
        return schedule_id

    @remote
    def cancel_schedule(self, schedule_id: str) -> bool:
        """Cancel a schedule; False if unknown."""
        return self.durable.schedules().cancel_schedule(schedule_id)

    @idempotent
    @remote
    def list_schedules(self) -> list[Any]:
        """Every schedule record."""
        return self.durable.schedules().list_schedules()

    async def on_wake(self) -> None:
        """First async entry after construction: resume interrupted fibers and run
        due schedules (the actor calls this right after binding); with
        ``recover_generations = "resume"``, answer on for every generation the crash
        cut off whose tool calls are all settled (those awaiting an approval or an
        executor resume when it comes)."""
        await self.durable.start()
        self.turns.queue.drain_all()  # messages a crash or a hibernation left waiting
        if self.recover_generations == "resume":
            for run in self.recovered_runs:
                if run.session_id is not None and not run.open_calls:
                    self._spawn_resume(run.session_id, run.run_id)

    # -- generation recovery (seed 003 §3.2) ------------------------------------------

    def _call_outcome(self, run_id: str, tool_call_id: str) -> dict[str, Any] | None:
        """What the durable row of a call says, as its message part's fields."""
        rec = self.tool_calls.store.get(self.tool_calls.record_id(tool_call_id, run_id))
        if rec is None:
            return None
        if rec.status == "completed":
            return {"state": "output-available", "output": rec.result}
        if rec.status == "denied":
            return {"state": "output-denied"}
        if rec.status == "awaiting-approval":
            return {"state": "approval-requested"}
        if rec.status in ("pending", "executing"):
            return {"state": "input-available"}  # an executor or a retry will finish it
        return {"state": "output-error", "errorText": rec.error or rec.status}

    def on_tool_call_settled(self, record: ToolCallRecord) -> None:
        """Hook called when a tool call is settled (an approval decided, an executor's
        result taken, a deadline passed) with no turn waiting for it (its run was cut
        off by a crash): the call's message part gets its outcome; with
        ``recover_generations = "resume"``, the run's calls are finished and the
        generation answers on."""
        if record.session_id is None:
            return
        if record.run_id and self.turns.runs.get(record.run_id) is not None:
            return  # the run is live: it takes the decision itself
        if self.recover_generations != "resume":
            if record.run_id is not None:
                try:
                    self._write_outcomes(record.session_id, record.run_id, [record.id])
                except Exception:
                    log.exception("could not write the outcome of tool call %s", record.id)
            return
        self._spawn_resume(record.session_id, record.run_id)

    # -- the tool-call alarm (leases and deadlines; ToolCallLedger.sweep) ---------------

    _TOOL_CALL_ALARM = "sweep_tool_calls"

    def _arm_tool_call_alarm(self, at: float) -> None:
        """A one-shot schedule at ``at`` that runs :meth:`sweep_tool_calls`: schedules
        live in the database and the namespace keeps the next one, so the sweep happens
        even if this process dies and the agent hibernates meanwhile."""
        scheduler = self.durable.schedules()
        scheduler.schedule(max(0.0, at - time.time()), self._TOOL_CALL_ALARM)
        if self._constructed:
            with contextlib.suppress(RuntimeError):  # no loop yet: on_wake starts it
                scheduler.start()

    def sweep_tool_calls(self, payload: Any = None) -> dict[str, list[str]]:
        """The tool-call alarm: cancel open calls past their deadline (asks included)
        and put lapsed claims back to ``pending``; re-arms itself for what is due next.
        Returns the ids it moved."""
        expired, lapsed = self.tool_calls.sweep(alarm=True)
        return {"expired": [r.id for r in expired], "lapsed": [r.id for r in lapsed]}

    def _spawn_resume(self, session_id: str, run_id: str | None) -> None:
        task = asyncio.ensure_future(self._resume_generation(session_id, run_id))
        self._resumes.add(task)
        task.add_done_callback(self._resumes.discard)

    async def _resume_generation(self, session_id: str, run_id: str | None) -> None:
        """Finish a cut-off run's settled calls (approved or put back: execute them
        once, through the ledger), write their outcomes into the message, then re-issue
        the model call with them: a new turn answering the session's history. Nothing
        happens while a call of the run is still open (awaiting approval, or held by an
        executor)."""
        try:
            if run_id is not None:
                rows = self.tool_calls.store.rows(run_id=run_id)
                tools = await _maybe_await(self.get_tools())
                for rec in rows:
                    if rec.status == "pending" and rec.tool_name in tools:
                        t = tools[rec.tool_name]
                        ctx = ToolContext(
                            tool_call_id=rec.id,
                            tool_name=rec.tool_name,
                            signal=AbortController().signal,
                            session_id=session_id,
                            run_id=run_id,
                            agent=self,
                        )
                        with contextlib.suppress(Exception):  # its outcome is in the row
                            await self.tool_calls.execute(t, t.validate(rec.input), ctx, rec.input)
                rows = self.tool_calls.store.rows(run_id=run_id)
                if any(not r.finished for r in rows):
                    return
                self._write_outcomes(session_id, run_id, [r.id for r in rows])
            self.start_chat(None, session_id=session_id)
        except Exception:
            log.exception("could not resume generation %s of session %s", run_id, session_id)

    def _write_outcomes(self, session_id: str, run_id: str, record_ids: list[str]) -> None:
        """Write the durable outcome of each call into its message part."""
        ids = {rid.split("~", 1)[0] for rid in record_ids}
        writes = []
        for message in self.store.get_history(session_id)[-8:]:
            for idx, part in enumerate(message.get("parts") or ()):
                call_id = part.get("toolCallId")
                if part.get("type") != "dynamic-tool" or call_id not in ids:
                    continue
                outcome = self._call_outcome(run_id, call_id)
                if outcome is not None and {**part, **outcome} != part:
                    fixed = enforce_row_size({**part, **outcome})
                    writes.append(PartWrite(message["id"], idx, fixed))
        if writes:
            self.store.flush_stream(StreamFlush(session_id=session_id, parts=writes))
            for w in writes:
                self.turns.persist_cache.forget(w.message_id)

    def has_pending_work(self) -> bool:
        """True while fibers or scheduled tasks run here, or messages wait for their
        turn: do not hibernate."""
        return self.durable.has_pending_work() or self.turns.queue.has_waiting()

    def next_alarm_at(self) -> float | None:
        """Epoch seconds of the next due schedule (what a waker needs), or None. Now,
        while messages wait for their turn (a forced hibernation wakes it at once)."""
        if self.turns.queue.has_waiting():
            return time.time()
        return self.durable.next_alarm_at()

    async def aclose(self) -> None:
        """Stop fibers and timers without marking them finished (hibernation)."""
        await self.durable.aclose()

    # -- storage upkeep ---------------------------------------------------------------

    def finalize_orphaned_tool_calls(
        self, session_id: str, history: list[dict[str, Any]] | None = None
    ) -> int:
        """A tool call left without output (a run that died with the process) becomes a
        tool error, so the next prompt never carries an unresolved call. Returns the
        number finalized. Calls belonging to a run in flight are left alone."""
        return self.turns.finalize_orphaned_tool_calls(session_id, history)

    def persist_message(self, session_id: str, message: dict[str, Any]) -> None:
        """Upsert a whole message through the same sanitize/row-size/cache pipeline."""
        message = prepare_message(parse_message(message, role=message.get("role", "user")))
        self.store.upsert_message(session_id, message, parent_id=HEAD)
        self.turns.persist_cache.forget(message["id"])

    def close(self) -> None:
        """End every run in flight as interrupted (see ``TurnRunner.interrupt_all``),
        stop timers and close the store."""
        self.turns.interrupt_all()
        self.durable.stop()
        self.store.close()


async def _no_batches() -> AsyncIterator[list[UIChunk]]:
    return
    yield  # an async generator that yields nothing


async def _one_batch(chunks: list[UIChunk]) -> AsyncIterator[list[UIChunk]]:
    if chunks:
        yield chunks


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value
