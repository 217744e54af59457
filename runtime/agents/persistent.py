"""Persistent agents (seed 003 §2.1): a named long-lived agent driven by its inbox.

A :class:`PersistentAgent` is a :class:`~thinkray.runtime.agents.think.Think` whose turns are not
started by a caller but by its own reactive loop over the ``inbox`` table of its
database (:class:`~thinkray.storage.protocols.InboxStore`):

- :meth:`~PersistentAgent.send` inserts a ``pending`` row (idempotent on the message
  id; the id is returned only after the commit) and kicks the loop.
- The loop asks :meth:`~PersistentAgent.pending_work` (default: pending rows, oldest
  first). If there is any, it claims the rows (``processing``), appends them to the
  agent's conversation as user messages (``metadata.sender``), runs one turn, hands
  the result to :meth:`~PersistentAgent.write_output` (default: the reply text on
  every row, ``done``), and asks again at once. Messages that arrived during the
  generation are picked up by the next cycle without the loop going idle; it goes
  idle only when nothing is pending.
- Batching: every row pending when a cycle starts goes into that ONE generation
  cycle (``max_batch`` caps it). A chat agent that was busy answers what piled up the
  way a person catching up does — one coherent reply that sees all of it — instead of
  N turns that each ignore the messages behind them; it is also one model call, not
  N. Each row of the batch gets that reply. Set ``max_batch = 1`` for one turn per
  message.
- Memory: the conversation is one session of the agent's store, so history
  accumulates across cycles (and across hibernation). :meth:`build_context` is the
  user's context-window hook (default: ``Think.assemble_context``, the full history
  with older tool calls pruned); :meth:`write_output` is the output hook.

Sleep and wake (the Ray actor): :meth:`has_pending_work` is True while the loop runs
or rows are pending, so the actor never hibernates mid-loop, and False when idle, so
the idle timer hibernates it. Waking is the constructor path: rows a dead incarnation
left ``processing`` go back to ``pending`` (failed after ``max_attempts``), and
:meth:`on_wake` (called by the actor right after binding) starts draining them. A
``send`` through a handle to a hibernated agent binds it first, so sending wakes it;
a row written into a hibernated agent's file (a webhook, say) is drained on the next
wake.

Other agents use a persistent agent through :func:`persistent_agent_tool`: blocking
(send, then wait for the reply) or fire-and-forget (returns the message id; the
companion :func:`persistent_reply_tool` reads the reply later). The target is
anything with async ``send``/``wait_reply``: a local agent, or :class:`HandleTarget`
around a Ray ``AgentHandle`` (duck-typed: this module does not import ray).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ConfigDict, Field
from thinkray.runtime.agents.context import AgentContext, context_being_constructed
from thinkray.runtime.agents.think import ChatOptions, ChatResult, Think
from thinkray.runtime.durable.jobs import JobRegistry
from thinkray.runtime.errors import (
    AgentClosedError as AgentClosedError,
)
from thinkray.runtime.errors import (  # re-exported: the errors live in thinkray.runtime.errors
    InboxMessageFailedError as InboxMessageFailedError,
)
from thinkray.runtime.errors import InvalidArgumentError, InvalidTypeError, OperationTimeoutError
from thinkray.runtime.messages import message_text, parse_message
from thinkray.runtime.models.base import Model, ModelMessage
from thinkray.runtime.remote import idempotent, remote
from thinkray.runtime.status import SessionBusyError
from thinkray.runtime.tools.base import ModelTool, Tool, ToolContext, ToolExecutionError
from thinkray.runtime.turn.persistence import check_message_size, prepare_message
from thinkray.runtime.typed_model import TypedModel
from thinkray.storage.errors import DatabaseClosedError, InboxMessageNotFoundError
from thinkray.storage.protocols import InboxRow, InboxStore, SessionStore

log = logging.getLogger("thinkray.persistent")

INBOX_SESSION_KEY = "persistent.session"


def _open_store(store: SessionStore | str | os.PathLike[str] | None) -> SessionStore:
    if store is None or isinstance(store, (str, os.PathLike)):
        from thinkray.storage.session_store import DuckDBSessionStore

        return DuckDBSessionStore(store if store is not None else ":memory:")
    return store


class PersistentAgent(Think):
    """A long-lived agent with an inbox. See the module docstring.

    ``name``, ``instructions`` and ``tools`` are the seed's "named entity with its own
    instructions, model configuration and tool set"; subclasses may override
    ``get_system_prompt``/``get_tools``/``get_model`` instead. In Ray the actor sets
    ``agent_name`` to the agent's name in its namespace.
    """

    max_batch: int | None = None  # rows per generation cycle; None = all pending rows
    max_attempts: int = 3  # cycles that may die with a row before it is failed
    inbox_session_name: str = "inbox"

    def __init__(
        self,
        store: SessionStore | str | os.PathLike[str] | None = None,
        *,
        model: Model | None = None,
        name: str | None = None,
        instructions: str | None = None,
        tools: Sequence[Tool] | Mapping[str, Tool] | None = None,
        context: AgentContext | None = None,
    ) -> None:
        store = _open_store(store)
        self.inbox: InboxStore = store.stores().inbox()
        # The constructor is the wake path: nobody else holds this file, so a row
        # still `processing` belongs to a dead incarnation.
        self.recovered, self.gave_up = self.inbox.requeue_processing(max_attempts=self.max_attempts)
        self.instructions = instructions
        if isinstance(tools, Mapping):
            self._own_tools: dict[str, Tool] = dict(tools)
        else:
            self._own_tools = {t.name: t for t in tools or ()}
        self._loop_task: asyncio.Task[None] | None = None
        self._dirty = False
        self._closing = False
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self.current_batch: list[InboxRow] = []
        self.cycles = 0  # generation cycles run by this instance
        self.idle_transitions = 0  # times the loop went idle (nothing pending)
        if context is None:
            context = context_being_constructed() or AgentContext(name=name or type(self).__name__)
        elif name is not None and name != context.name:
            context = dataclasses.replace(context, name=name)
        super().__init__(store, model=model, context=context)

    # -- the entity --------------------------------------------------------------------

    def get_system_prompt(self) -> str:
        """The agent's ``instructions``, or Think's default prompt when it has none."""
        if self.instructions is not None:
            return self.instructions
        return super().get_system_prompt()

    def get_tools(self) -> dict[str, Tool]:
        """The ``tools`` given at construction, by name (a fresh dict)."""
        return dict(self._own_tools)

    # -- user hooks --------------------------------------------------------------------

    def pending_work(self) -> list[InboxRow]:
        """What the next cycle takes (may be async). Default: pending inbox rows,
        oldest first, at most ``max_batch``. Rows returned must be inbox rows; the loop
        claims those still pending and ignores the others. If this is async, override
        :meth:`has_pending_inbox` too."""
        return self.inbox.pending(limit=self.max_batch)

    async def build_context(self, rows: list[InboxRow], options: ChatOptions) -> list[ModelMessage]:
        """The model's context for a cycle answering ``rows`` (already appended to the
        history). Default: ``Think.assemble_context`` — the full history, older tool
        calls pruned. Override for windowing or summaries."""
        return await Think.assemble_context(self, options)

    async def write_output(self, rows: list[InboxRow], result: ChatResult) -> None:
        """Write a completed cycle's output back (may write elsewhere too). Default:
        the assistant reply text on every row of the batch, marked ``done``. Rows this
        hook leaves unfinished are marked done with the reply text afterwards."""
        self.inbox.complete(
            [r.id for r in rows], result.text, extra={"reply_message_id": result.message_id}
        )

    async def assemble_context(self, options: ChatOptions) -> list[ModelMessage]:
        """Think's hook, routed to :meth:`build_context` with the cycle's batch."""
        return await self.build_context(list(self.current_batch), options)

    # -- inbox API ---------------------------------------------------------------------

    @remote
    async def send(
        self,
        content: str | dict[str, Any],
        *,
        sender: str | None = None,
        message_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> str:
        """Put a message in the inbox and wake the loop. Returns the message id once
        the row is committed. Idempotent on ``message_id`` (a repeat returns the id and
        changes nothing). ``content`` is text or a UIMessage dict (its parts are kept).
        A message over ``max_user_message_bytes`` raises ``MessageTooLargeError``
        before anything is written."""
        if isinstance(content, str):
            if not content.strip():
                raise InvalidArgumentError("message content is empty")
            stored: Any = content
        elif isinstance(content, dict):
            stored = parse_message(content, role="user")["parts"]
        else:
            raise InvalidTypeError(
                f"content must be a string or a UIMessage dict, not {type(content)}"
            )
        parts = [{"type": "text", "text": stored}] if isinstance(stored, str) else stored
        # Refused whole before the inbox row exists, never stored cut short later.
        check_message_size({"parts": parts, "metadata": metadata}, self.max_user_message_bytes)
        row, _created = self.inbox.insert(
            stored, sender=sender, message_id=message_id, metadata=metadata
        )
        if not row.finished:
            self._kick()
        return row.id

    @idempotent
    @remote
    async def wait_reply(self, message_id: str, timeout: float | None = None) -> str:
        """The reply to ``message_id`` once its row is done. Raises
        :class:`InboxMessageFailedError` if it failed, ``TimeoutError`` after
        ``timeout`` seconds, and a NotFoundError for an unknown id."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            row = self.inbox.require(message_id)
            if row.status == "done":
                return row.reply or ""
            if row.status == "failed":
                raise InboxMessageFailedError(message_id, row.error)
            if self._closing:
                raise AgentClosedError(f"agent {self.agent_name!r} closed before replying")
            if row.status == "pending":
                self._kick()  # self-healing: a pending row always has a loop behind it
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise OperationTimeoutError(f"no reply to {message_id!r} within {timeout}s")
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            waiters = self._waiters.setdefault(message_id, [])
            waiters.append(future)
            try:
                await asyncio.wait_for(future, remaining)
            except TimeoutError:
                raise OperationTimeoutError(
                    f"no reply to {message_id!r} within {timeout}s"
                ) from None
            finally:
                if future in waiters:
                    waiters.remove(future)
                if not waiters:
                    self._waiters.pop(message_id, None)

    @idempotent
    @remote
    def get_reply(self, message_id: str) -> dict[str, Any]:
        """The row's state without waiting: ``id``, ``status``, ``reply``, ``error``."""
        row = self.inbox.get(message_id)
        if row is None:
            raise InboxMessageNotFoundError(f"inbox message {message_id!r} not found")
        return {
            "id": row.id,
            "status": row.status,
            "sender": row.sender,
            "reply": row.reply,
            "error": row.error,
        }

    @idempotent
    @remote
    def list_inbox(self, status: str | None = None) -> list[dict[str, Any]]:
        """Inbox rows oldest first (only those with ``status`` when given), as dicts.

        Raises:
            InvalidInputError: an unknown status.
        """
        return [r.to_dict() for r in self.inbox.rows(status)]

    @idempotent
    @remote
    def inbox_session_id(self) -> str:
        """The session holding the agent's conversation (created on first use)."""
        sid = self.store.get_config(INBOX_SESSION_KEY)
        if sid and self.store.has_session(sid):
            return sid
        info = self.store.create_session(
            self.inbox_session_name, metadata={"kind": "persistent-inbox"}
        )
        self.store.set_config(INBOX_SESSION_KEY, info.id)
        if self.current_session_id is None:
            self.sessions.set_current(info.id)
        return info.id

    def get_history(
        self, session_id: str | None = None, *, leaf_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Think's history, defaulting to the inbox conversation while no session is
        current."""
        if session_id is None and self.current_session_id is None:
            session_id = self.inbox_session_id()
        return super().get_history(session_id, leaf_id=leaf_id)

    # -- the loop ----------------------------------------------------------------------

    @property
    def loop_running(self) -> bool:
        """Whether the inbox loop's task is alive (it drains rows until none is pending)."""
        return self._loop_task is not None and not self._loop_task.done()

    def _kick(self) -> None:
        self._dirty = True
        if self._closing or self.loop_running:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no event loop (sync caller): on_wake or the next send starts it
        self._loop_task = loop.create_task(self._run_loop())

    def start(self) -> None:
        """Start draining pending rows now (``on_wake`` does this in an actor)."""
        self._kick()

    async def _run_loop(self) -> None:
        try:
            while not self._closing:
                self._dirty = False
                rows = self.pending_work()
                if inspect.isawaitable(rows):
                    rows = await rows
                if not rows:
                    # No await between this check and the task ending: a send that
                    # lands after it sees the loop finished and starts a new one.
                    if self._dirty:
                        continue
                    break
                if not await self._cycle(list(rows)) and not self._dirty:
                    break  # nothing claimable (rows no longer pending): do not spin
        except asyncio.CancelledError:
            raise
        except DatabaseClosedError:
            if not self._closing:
                log.warning("agent %s: database closed under the inbox loop", self.agent_name)
        except Exception:
            log.exception("agent %s: inbox loop failed", self.agent_name)
        finally:
            self.idle_transitions += 1

    async def _cycle(self, rows: list[InboxRow]) -> bool:
        """One generation cycle over ``rows``; False if none of them could be claimed."""
        claimed = self.inbox.claim([r.id for r in rows])
        if not claimed:
            return False
        self.cycles += 1
        ids = [r.id for r in claimed]
        try:
            sid = self.inbox_session_id()
            for row in claimed:
                await self._append_row(sid, row)
            self.current_batch = claimed
            try:
                result = await self._run_turn(sid)
            finally:
                self.current_batch = []
        except asyncio.CancelledError:
            raise  # the process is going away: the rows stay `processing` → requeued
        except Exception as exc:
            if self._closing:
                return True
            log.warning("agent %s: cycle failed: %s", self.agent_name, exc)
            self.inbox.fail(ids, f"{type(exc).__name__}: {exc}")
            self._notify(ids)
            return True
        if self._closing and result.status != "completed":
            return True  # aborted by closing: requeued by aclose / the next construction
        try:
            if result.status == "completed":
                await self.write_output(claimed, result)
                left = [i for i in ids if (r := self.inbox.get(i)) is not None and not r.finished]
                if left:
                    self.inbox.complete(left, result.text)
            else:
                self.inbox.fail(ids, result.error or f"generation {result.status}")
        except Exception as exc:
            log.warning("agent %s: write_output failed: %s", self.agent_name, exc)
            self.inbox.fail(ids, f"write_output failed: {type(exc).__name__}: {exc}")
        self._notify(ids)
        return True

    async def _append_row(self, sid: str, row: InboxRow) -> None:
        parts = (
            [{"type": "text", "text": row.content}]
            if isinstance(row.content, str)
            else list(row.content or [])
        )
        metadata = {"sender": row.sender, "inbox_id": row.id, **(row.metadata or {})}
        message = {"id": row.id, "role": "user", "metadata": metadata, "parts": parts}
        message = await self.on_user_message(sid, message)
        # The row id is the message id: re-appending after a crash is a no-op.
        self.store.append_message(sid, prepare_message(message))

    async def _run_turn(self, sid: str) -> ChatResult:
        while True:
            try:
                return await self.chat(None, session_id=sid)
            except SessionBusyError:
                # Someone is chatting on this session directly: queue behind that turn.
                run_id = self.turns.active_run(sid)
                run = self.turns.runs.get(run_id) if run_id else None
                if run is None or run.task is None:
                    await asyncio.sleep(0.01)
                    continue
                with contextlib.suppress(Exception):
                    await asyncio.shield(run.task)

    def _notify(self, ids: Sequence[str], error: BaseException | None = None) -> None:
        for mid in ids:
            for future in self._waiters.get(mid, ()):
                if not future.done():
                    if error is None:
                        future.set_result(None)
                    else:
                        future.set_exception(error)

    # -- lifecycle ---------------------------------------------------------------------

    def has_pending_work(self) -> bool:
        """True while the loop runs, work is pending, async jobs run, or Think has
        fibers/schedules in flight."""
        if super().has_pending_work() or self.loop_running:
            return True
        jobs = JobRegistry.existing(self)
        if jobs is not None and jobs.has_running():
            return True  # async tool jobs started by this agent are still running
        if self._closing:
            return False
        try:
            pending = self.has_pending_inbox()
        except DatabaseClosedError:
            return False
        if pending:
            self._kick()  # pending work with no loop behind it: start one
        return pending

    def has_pending_inbox(self) -> bool:
        """Whether :meth:`pending_work` has anything (sync: the actor asks this to decide
        whether it may hibernate). An async ``pending_work`` override should override
        this too; by default it then falls back to "any pending inbox row"."""
        if type(self).pending_work is PersistentAgent.pending_work:
            return self.inbox.has_pending()
        rows = self.pending_work()
        if inspect.isawaitable(rows):
            if inspect.iscoroutine(rows):
                rows.close()
            return self.inbox.has_pending()
        return bool(rows)

    async def on_wake(self) -> None:
        """Think's wake (fibers, schedules), then tell waiters about rows given up on
        and start draining what is pending."""
        await super().on_wake()
        if self.recovered or self.gave_up:
            log.info(
                "agent %s: %d message(s) requeued after a restart, %d given up",
                self.agent_name,
                self.recovered,
                self.gave_up,
            )
        if self.gave_up:
            self._notify([r.id for r in self.inbox.rows("failed")])
        if self.has_pending_inbox():
            self._kick()

    async def _stop_loop(self, reason: str) -> None:
        self._closing = True
        task = self._loop_task
        if task is None or task.done():
            return
        sid = self.store.get_config(INBOX_SESSION_KEY)
        if sid:
            self.abort(sid, reason=reason)
        try:
            await asyncio.wait_for(asyncio.shield(task), 5.0)
        except (TimeoutError, asyncio.CancelledError):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        except Exception:
            pass

    async def aclose(self) -> None:
        """Hibernation: stop the loop, put an interrupted batch back to ``pending``,
        release waiters (they get :class:`AgentClosedError`), stop fibers/timers."""
        await self._stop_loop("agent hibernating")
        with contextlib.suppress(DatabaseClosedError):
            self.inbox.requeue_processing()
        closed = AgentClosedError(f"agent {self.agent_name!r} closed before replying")
        self._notify(list(self._waiters), closed)
        jobs = JobRegistry.existing(self)
        if jobs is not None:
            await jobs.aclose()  # they end `interrupted` (force-hibernation only)
        await super().aclose()

    def close(self) -> None:
        """Cancel the loop, fail every waiter with :class:`AgentClosedError`, then
        Think's close (abort runs, stop timers, close the store)."""
        self._closing = True
        if self._loop_task is not None and not self._loop_task.done():
            self._loop_task.cancel()
        closed = AgentClosedError(f"agent {self.agent_name!r} closed before replying")
        self._notify(list(self._waiters), closed)
        super().close()

    async def dispose(self, *, purge: bool = False) -> None:
        """Stop the loop and close the agent's database. Unanswered messages stay in
        the inbox (answered on the next start) unless ``purge`` deletes every row."""
        await self.aclose()
        if purge:
            with contextlib.suppress(DatabaseClosedError):
                self.inbox.delete([r.id for r in self.inbox.rows()])
        self.close()


# -- as a tool for other agents -----------------------------------------------------------


class HandleTarget:
    """A persistent agent behind a Ray ``AgentHandle`` (its ``send``/``wait_reply``/``get_reply`` remote methods), as
    a ``send``/``wait_reply`` target. Duck-typed: no ray import here."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def __repr__(self) -> str:
        return f"HandleTarget({self.handle!r})"

    async def send(
        self,
        content: str | dict[str, Any],
        *,
        sender: str | None = None,
        message_id: str | None = None,
    ) -> str:
        """:meth:`PersistentAgent.send` on the remote agent; returns the message id."""
        return await self.handle.send.remote(content, sender=sender, message_id=message_id)

    async def wait_reply(self, message_id: str, timeout: float | None = None) -> str:
        """:meth:`PersistentAgent.wait_reply` on the remote agent (same errors)."""
        return await self.handle.wait_reply.remote(message_id, timeout=timeout)

    async def get_reply(self, message_id: str) -> dict[str, Any]:
        """:meth:`PersistentAgent.get_reply` on the remote agent, without waiting."""
        return await self.handle.get_reply.remote(message_id)


class _SendInput(TypedModel):
    model_config = ConfigDict(extra="forbid")
    message: str = Field(min_length=1, description="The message to send to the agent.")


class _ReadReplyInput(TypedModel):
    model_config = ConfigDict(extra="forbid")
    message_id: str = Field(min_length=1, description="The message_id the send returned.")
    wait_seconds: float = Field(
        0.0, ge=0, le=300, description="Wait up to this long for the reply."
    )


def _sender_of(ctx: ToolContext) -> str:
    agent = ctx.agent
    return (
        getattr(agent, "agent_name", None)
        or getattr(agent, "name", None)
        or (f"session:{ctx.session_id}" if ctx.session_id else "agent")
    )


def persistent_agent_tool(
    target: Any,
    *,
    name: str,
    description: str,
    wait: bool = True,
    timeout: float | None = None,
    reply_tool_name: str | None = None,
) -> Tool:
    """A tool that sends the model's message to a persistent agent's inbox.

    ``wait=True``: send, then wait for the reply (returned as text). The message id is
    derived from the tool call id, so a retried call is not delivered twice. Aborting
    the calling turn stops the wait; the target still answers (its inbox is its own).
    ``wait=False``: return ``{"message_id": ...}`` at once; read the reply with
    :func:`persistent_reply_tool` (named ``reply_tool_name``).
    """
    reader = reply_tool_name or f"{name}_reply"

    async def send(input: _SendInput, ctx: ToolContext) -> Any:
        if wait and target is ctx.agent:
            # Its loop is busy running this very turn: the reply could never come.
            raise ToolExecutionError("an agent cannot wait for a reply from its own inbox")
        message_id = await target.send(
            input.message, sender=_sender_of(ctx), message_id=f"tc-{ctx.tool_call_id}"
        )
        if not wait:
            return {
                "message_id": message_id,
                "status": "sent",
                "note": f"call {reader} with this message_id to read the reply",
            }
        try:
            return await target.wait_reply(message_id, timeout=timeout)
        except TimeoutError:
            raise ToolExecutionError(
                f"no reply within {timeout}s (message_id {message_id}; it may still come)"
            ) from None

    return ModelTool(name, _SendInput, send, description, wants_context=True)


def persistent_reply_tool(target: Any, *, name: str, description: str | None = None) -> Tool:
    """Companion of a fire-and-forget :func:`persistent_agent_tool`: the reply (or the
    message's status while it is not answered yet)."""

    async def read(input: _ReadReplyInput, ctx: ToolContext) -> dict[str, Any]:
        mid = input.message_id
        status = None
        get_reply = getattr(target, "get_reply", None)
        if get_reply is not None:
            state = get_reply(mid)
            if inspect.isawaitable(state):
                state = await state
            if state["status"] in ("done", "failed") or input.wait_seconds <= 0:
                return _reply_view(state)
            status = state["status"]
        try:
            text = await target.wait_reply(mid, timeout=max(input.wait_seconds, 0.01))
        except TimeoutError:
            return {"message_id": mid, "status": status or "pending"}
        except InboxMessageFailedError as exc:
            return {"message_id": mid, "status": "failed", "error": exc.error}
        return {"message_id": mid, "status": "done", "reply": text}

    return ModelTool(
        name,
        _ReadReplyInput,
        read,
        description or "Read the reply to a message sent earlier (or its status).",
        wants_context=True,
    )


def _reply_view(state: dict[str, Any]) -> dict[str, Any]:
    out = {"message_id": state["id"], "status": state["status"]}
    if state["status"] == "done":
        out["reply"] = state.get("reply") or ""
    elif state["status"] == "failed":
        out["error"] = state.get("error")
    return out


def persistent_agent_tools(
    target: Any,
    *,
    name: str,
    description: str,
    wait: bool = True,
    timeout: float | None = None,
) -> dict[str, Tool]:
    """The send tool, plus its reply reader when ``wait=False``."""
    tools = {
        name: persistent_agent_tool(
            target, name=name, description=description, wait=wait, timeout=timeout
        )
    }
    if not wait:
        reader = persistent_reply_tool(target, name=f"{name}_reply")
        tools[reader.name] = reader
    return tools


def inbox_notifier(target: Any, *, sender: str = "jobs") -> Any:
    """A :class:`~thinkray.runtime.durable.jobs.JobRegistry` listener that pushes each finished job
    into a persistent agent's inbox (seed 003 §1.5 "push": the status appears in the
    conversation and triggers the agent's loop). Idempotent per job."""

    async def listener(job: Any) -> None:
        if not job.finished:
            return
        if job.status == "completed":
            text = f"[job {job.id} completed] result: {job.result}"
        else:
            text = f"[job {job.id} {job.status}] {job.error or ''}".rstrip()
        await target.send(text, sender=sender, message_id=f"job-done-{job.id}")

    return listener


def history_text(agent: Think, session_id: str | None = None) -> list[tuple[str, str]]:
    """``(role, text)`` of a persistent agent's conversation (handy in tests)."""
    return [(m["role"], message_text(m)) for m in agent.get_history(session_id)]


__all__ = [
    "AgentClosedError",
    "HandleTarget",
    "InboxMessageFailedError",
    "PersistentAgent",
    "history_text",
    "inbox_notifier",
    "persistent_agent_tool",
    "persistent_agent_tools",
    "persistent_reply_tool",
]
