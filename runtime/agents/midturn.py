"""Messages sent while a turn runs: the busy policy (seed 002's queued sends; seed 003:
"a user sends a message to a persistent agent while it's mid-generation; the agent
picks it up automatically in its next loop iteration").

A session runs one turn at a time. A user message that arrives while its session is
busy (a turn in flight, a reservation, or messages already waiting) is handled by the
agent's ``on_busy`` policy, overridable per call (``chat(..., on_busy=...)``):

- ``reject``: refused with :class:`~thinkray.runtime.errors.SessionBusyError` (the
  default, and the only behaviour before this module);
- ``queue``: stored, then answered by its own turn once the ones before it ended
  (FIFO per session);
- ``latest``: stored like ``queue``, and every message still waiting in the session's
  queue is dropped as ``superseded`` (its waiter gets a result with
  ``status="superseded"`` and ``superseded_by``; it never reaches the model);
- ``steer``: injected into the running turn at its next step boundary: the model
  reads it (after the step's tool results) before its next call, and the turn goes on
  (one more step even if the model had finished). Stored in the assistant message as a
  ``data-steer`` part, where it is in the history. A turn that ends before a boundary
  leaves it waiting: it is then answered by its own turn, as ``queue``;
- ``interrupt``: the running turn is aborted (its partial answer kept, as any abort)
  and the message answered next, ahead of what waits.

Every waiting message is a row of the agent's database
(:class:`~thinkray.storage.protocols.TurnQueueStore`) before the sender hears back, so
a crash or a hibernation never loses one; the agent is busy (it does not hibernate)
while its queue holds any, and a wake runs what a crash left. Each message id is
answered once: a resend of a waiting message follows the same entry, of an answered
one replays its answer (:mod:`~thinkray.runtime.agents.replay`), of a superseded one
returns the same ``superseded`` result.

:func:`decide` is the policy (a pure function); :class:`TurnQueue` the mechanism.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from thinkray.runtime.abort import AbortController, AbortSignal
from thinkray.runtime.agents.replay import Answered, check_resent
from thinkray.runtime.agents.runs import ChatResult, RunState, StreamCallback
from thinkray.runtime.chunks import UIChunk
from thinkray.runtime.errors import InvalidArgumentError, MessageIdConflictError, SessionBusyError
from thinkray.runtime.messages import new_id
from thinkray.runtime.turn.stream import RunStream
from thinkray.storage.records import QueuedTurn

if TYPE_CHECKING:
    from thinkray.runtime.agents.turns import TurnRunner
    from thinkray.runtime.tools.base import Tool
    from thinkray.storage.protocols import TurnQueueStore

log = logging.getLogger("thinkray.midturn")

__all__ = ["BUSY_POLICIES", "BusyPolicy", "QueueAction", "TurnQueue", "check_policy", "decide"]

BusyPolicy = Literal["reject", "queue", "latest", "steer", "interrupt"]
"""What a user message does when its session is busy (see the module doc)."""

BUSY_POLICIES: tuple[str, ...] = get_args(BusyPolicy)

QueueAction = Literal["run", "reject", "queue", "latest", "steer", "interrupt"]
"""What :func:`decide` says to do with one message."""

MAX_ATTEMPTS = 3
"""Turns a queued message may start that all die with the process before it is failed."""

STEER_CHUNK = "data-steer"


def check_policy(value: Any) -> BusyPolicy:
    """``value`` if it is a busy policy; :class:`InvalidArgumentError` otherwise."""
    if value not in BUSY_POLICIES:
        raise InvalidArgumentError(
            f"unknown busy policy {str(value)[:40]!r}; one of {', '.join(BUSY_POLICIES)}"
        )
    return value


def decide(
    policy: BusyPolicy, *, running: bool, reserved: bool, waiting: int, has_message: bool
) -> QueueAction:
    """The policy: what a turn does given the session's state. ``running``: a turn is
    in flight; ``reserved``: an operation holds the session; ``waiting``: messages in
    its queue; ``has_message``: the turn brings a user message (a rerun of the history
    brings none, and has nothing to queue)."""
    if not (running or reserved or waiting):
        return "run"
    if policy == "reject" or not has_message:
        return "reject"
    if policy in ("steer", "interrupt") and not running:
        return "queue"  # nothing to steer into or interrupt: wait for the session
    return policy


@dataclass
class Waiter:
    """A queued message's caller side in this incarnation: the run it will be (its
    ids, stream and a future for its result) and what ``start_chat`` was given."""

    run: RunState
    result: asyncio.Future[ChatResult]
    callback: StreamCallback | None
    tools: dict[str, Tool]


class TurnQueue:
    """The queue of the turn runner: durable rows plus this incarnation's waiters."""

    def __init__(self, runner: TurnRunner) -> None:
        self.runner = runner
        self._store: TurnQueueStore | None = None
        self._absent = False
        self.waiters: dict[str, Waiter] = {}  # message id -> waiter
        self.by_run: dict[str, str] = {}  # a waiter's run id -> message id
        self.waiting: dict[str, list[str]] = {}  # session id -> message ids, in order
        self.ahead: set[str] = set()  # waiting interrupts (they go first)
        self.running: set[str] = set()  # message ids whose queued turn runs here
        self.closing = False
        # Told when the queue starts or stops holding work (waiting or running): the
        # actor layer has the namespace wake the agent at once if its process dies
        # meanwhile, instead of leaving the messages for the next caller.
        self.on_work: Callable[[bool], None] | None = None
        self._reported = False

    # -- storage --------------------------------------------------------------------

    def store(self, create: bool = True) -> TurnQueueStore | None:
        """The agent's queue store (None: ``create`` is False and it has none yet)."""
        if self._store is None and not create and self._absent:
            return None  # looked already; only this object creates it
        if self._store is None:
            stores = getattr(self.runner.agent.store, "stores", None)
            if stores is None:
                if create:
                    raise InvalidArgumentError(
                        "this agent's store keeps no queue: use on_busy='reject'"
                    )
                return None
            self._store = stores().turn_queue(create=create)
            self._absent = self._store is None
        return self._store

    def recover(self) -> None:
        """The wake path: rows a dead incarnation left ``running`` wait again (or fail
        after :data:`MAX_ATTEMPTS`); every waiting row is indexed to be run."""
        store = self.store(create=False)
        if store is None:
            return
        store.requeue_running(max_attempts=MAX_ATTEMPTS)
        for row in store.waiting():
            self.waiting.setdefault(row.session_id, []).append(row.id)
            if row.seq < 0:
                self.ahead.add(row.id)
        for sid in self.waiting:
            self._show(sid)

    def pending(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """What waits (of one session), as the status shows it."""
        store = self.store(create=False)
        if store is None:
            return []
        return [_entry(row) for row in store.waiting(session_id)]

    def has_waiting(self, session_id: str | None = None) -> bool:
        """Whether messages wait (in one session, or in any)."""
        if session_id is None:
            return any(self.waiting.values())
        return bool(self.waiting.get(session_id))

    def _show(self, session_id: str) -> None:
        self.runner.status.set_queue(session_id, self.pending(session_id))
        self._report()

    def watch_work(self, callback: Callable[[bool], None]) -> None:
        """Call ``callback(busy)`` whenever the queue starts (True) or stops (False)
        holding work, waiting or running; at once if it holds some now."""
        self.on_work = callback
        self._reported = False
        self._report()

    def _report(self) -> None:
        busy = bool(self.running) or any(self.waiting.values())
        if busy != self._reported and self.on_work is not None:
            self._reported = busy
            self.on_work(busy)

    # -- a message arrives while its session is busy ---------------------------------

    def existing(self, sid: str, message_id: str) -> RunState | None:
        """A message id this queue knows: the same entry again (a resend), or its
        outcome. None for an id the queue never had."""
        store = self.store(create=False)
        row = store.get(message_id) if store is not None else None
        if row is None:
            return None
        if row.session_id != sid:
            raise MessageIdConflictError(
                f"message id {message_id!r} is already queued in another session of this "
                "agent (message ids are unique per agent); send it under a new id",
                message_id,
                sid,
            )
        waiter = self.waiters.get(message_id)
        if waiter is not None:
            return _follower(waiter)
        if row.status == "queued":  # queued by an earlier incarnation: wait for it here
            return self._wait_for(row)
        if row.status == "running":
            for run in self.runner.runs.values():
                if run.user_message_id == message_id and run.task is not None:
                    follower = RunState(run.run_id, sid, run.controller, run.stream)
                    follower.task = asyncio.ensure_future(_shielded(run.task))
                    return follower
            return None
        if row.status == "steered":
            return self._steered_again(row)
        if row.status == "superseded":
            return self._finished(row, _superseded_result(row))
        if row.status in ("cancelled", "failed"):
            outcome = row.outcome
            return self._finished(row, _row_result(row, outcome.get("status", "aborted")))
        return None  # running or answered: the turn runner finds it in the store

    def _steered_again(self, row: QueuedTurn) -> RunState | None:
        """A resent message that joined a turn: that turn (followed while it runs,
        else its answer replayed)."""
        runner = self.runner
        run = runner.runs.get(str(row.outcome.get("run_id")))
        if run is not None and run.task is not None:
            follower = RunState(run.run_id, row.session_id, run.controller, run.stream)
            follower.task = asyncio.ensure_future(_shielded(run.task))
            return follower
        answer = runner.agent.store.get_message(str(row.outcome.get("message_id")))
        if answer is None:
            return None
        return runner.replay_answer(row.session_id, Answered(row.id, answer))

    def _wait_for(self, row: QueuedTurn) -> RunState:
        """A waiter for a row this incarnation has none for (the sender's resend after
        a crash or a hibernation)."""
        sid = row.session_id
        run = RunState(
            row.run_id, sid, AbortController(), RunStream(row.run_id, sid, row.assistant_id)
        )
        waiter = Waiter(run, asyncio.get_running_loop().create_future(), None, {})
        run.task = waiter.result
        self.waiters[row.id] = waiter
        self.by_run[row.run_id] = row.id
        if row.id not in self.waiting.get(sid, ()):
            self.waiting.setdefault(sid, []).append(row.id)
        return _follower(waiter)

    def enqueue(
        self,
        sid: str,
        message: dict[str, Any],
        action: QueueAction,
        *,
        run_id: str | None,
        signal: AbortSignal | None,
        callback: StreamCallback | None,
        tools: dict[str, Tool],
    ) -> RunState:
        """Store the message (acknowledged once committed) and return the run it will
        be: its stream fills when its turn starts; its task resolves with its result."""
        store = self.store()
        assert store is not None
        runner = self.runner
        current = runner.runs.get(runner.session_runs.get(sid, ""))
        row = QueuedTurn(
            id=message["id"],
            session_id=sid,
            message=message,
            mode=action,
            run_id=run_id or new_id("run"),
            assistant_id=new_id("msg"),
            target_run=current.run_id if action == "steer" and current else None,
        )
        with store.transaction():
            row, created = store.add(row, first=action == "interrupt")
            superseded = self._supersede(store, sid, row.id) if action == "latest" else []
        if not created:
            raise SessionBusyError(sid, row.run_id)  # a race lost to the same id: resend
        run = RunState(
            row.run_id,
            sid,
            AbortController(parent=signal),
            RunStream(row.run_id, sid, row.assistant_id),
        )
        loop = asyncio.get_running_loop()
        waiter = Waiter(run, loop.create_future(), callback, tools)
        run.task = waiter.result
        self.waiters[row.id] = waiter
        self.by_run[row.run_id] = row.id
        self._line_up(sid, row.id, first=action == "interrupt")
        for old in superseded:
            self._settle(old.id, _superseded_result(old))
        if action == "steer" and current is not None:
            current.steers.append(row.id)
        if action == "interrupt" and current is not None:
            current.controller.abort(f"interrupted by message {row.id}")
        self._show(sid)
        return run

    def _line_up(self, sid: str, message_id: str, *, first: bool) -> None:
        """Index a waiting message: at the end, or (``first``) after the other
        interrupts, ahead of the rest (the store orders them alike)."""
        order = self.waiting.setdefault(sid, [])
        if first:
            self.ahead.add(message_id)
            at = next((i for i, m in enumerate(order) if m not in self.ahead), len(order))
            order.insert(at, message_id)
        else:
            order.append(message_id)

    def _supersede(self, store: TurnQueueStore, sid: str, newest: str) -> list[QueuedTurn]:
        """``latest``: every other message waiting in the session's queue (not those
        joining the running turn, nor an interrupt about to run) is superseded."""
        doomed = [
            r.id
            for r in store.waiting(sid)
            if r.id != newest and r.mode in ("queue", "latest", "reject")
        ]
        return store.move(
            doomed, "superseded", outcome={"status": "superseded", "superseded_by": newest}
        )

    # -- running what waits -----------------------------------------------------------

    def drain(self, sid: str) -> None:
        """Start the session's next waiting message if the session is free (called
        when a run ends, a reservation is released, or the agent woke)."""
        runner = self.runner
        if self.closing or sid in runner.session_runs or sid in runner.reserved:
            return
        store = self.store(create=False)
        if store is None:
            return
        while self.waiting.get(sid):
            message_id = self.waiting[sid].pop(0)
            self.ahead.discard(message_id)
            claimed = store.move([message_id], "running", attempts=1)
            if claimed and self._start(store, claimed[0]):
                break
        if not self.waiting.get(sid):
            self.waiting.pop(sid, None)
        self._show(sid)

    def drain_all(self) -> None:
        """:meth:`drain` every session with messages waiting (the wake)."""
        for sid in list(self.waiting):
            self.drain(sid)

    def _start(self, store: TurnQueueStore, row: QueuedTurn) -> bool:
        """Run a claimed row's turn; False when it needed none (answered already: a
        crash after its answer, before its row said so)."""
        runner = self.runner
        waiter = self.waiters.get(row.id)
        try:
            answered = check_resent(runner.agent.store, row.session_id, row.id)
        except MessageIdConflictError as exc:
            self._fail(store, row, str(exc))
            return False
        if answered is not None:
            replay = runner.replay_answer(row.session_id, answered)
            if waiter is not None:
                _mirror_all(replay.stream, waiter.run.stream)
            assert replay.task is not None
            replay.task.add_done_callback(lambda t: self._done(row.id, t))
            return False
        fresh = row.attempts > 1  # it started before and died: new ids, as a resend gets
        run = waiter.run if waiter is not None and not fresh else None
        if run is None:
            run_id = new_id("run") if fresh else row.run_id
            assistant = new_id("msg") if fresh else row.assistant_id
            run = RunState(
                run_id,
                row.session_id,
                AbortController(),
                RunStream(run_id, row.session_id, assistant),
            )
            if waiter is not None:
                _mirror_all(run.stream, waiter.run.stream)
        callback = waiter.callback if waiter is not None else None
        tools = waiter.tools if waiter is not None else {}
        runner.launch(run, row.message, callback, tools)
        assert run.task is not None
        self.running.add(row.id)
        run.task.add_done_callback(lambda t: self._done(row.id, t))
        return True

    def _done(self, message_id: str, task: asyncio.Future[ChatResult]) -> None:
        """A queued message's turn ended: its row says how, its waiter gets the result.
        A turn cancelled with the agent (closing) leaves its row ``running``: the next
        wake runs it again."""
        if task.cancelled():
            waiter = self.waiters.pop(message_id, None)
            if waiter is not None:
                self.by_run.pop(waiter.run.run_id, None)
                waiter.result.cancel()
            return
        exc = task.exception()
        store = self.store(create=False)
        if exc is not None:
            if store is not None and not self.closing:
                store.move(
                    [message_id],
                    "failed",
                    only_from=("running",),
                    outcome={"status": "error", "error": str(exc)},
                )
            self._settle(message_id, exc)
            return
        result = task.result()
        if store is not None and not self.closing:
            with contextlib.suppress(Exception):  # a closed store: the wake settles it
                store.move(
                    [message_id],
                    "answered",
                    only_from=("running",),
                    outcome={
                        "status": result.status,
                        "run_id": result.run_id,
                        "message_id": result.message_id,
                    },
                )
        self._settle(message_id, result)

    def _fail(self, store: TurnQueueStore, row: QueuedTurn, error: str) -> None:
        store.move(
            [row.id], "failed", only_from=("running",), outcome={"status": "error", "error": error}
        )
        self._settle(row.id, _row_result(row, "error", error))

    def _settle(self, message_id: str, outcome: ChatResult | BaseException) -> None:
        waiter = self.waiters.pop(message_id, None)
        self.ahead.discard(message_id)
        self.running.discard(message_id)
        for order in self.waiting.values():
            if message_id in order:
                order.remove(message_id)
        self._report()
        if waiter is None:
            return
        self.by_run.pop(waiter.run.run_id, None)
        if not waiter.run.stream.done:
            if isinstance(outcome, ChatResult) and outcome.status == "superseded":
                waiter.run.stream.push(_superseded_chunk(outcome))
            waiter.run.stream.close(
                outcome.error if isinstance(outcome, ChatResult) else str(outcome)
            )
        if not waiter.result.done():
            if isinstance(outcome, BaseException):
                waiter.result.set_exception(outcome)
            else:
                waiter.result.set_result(outcome)

    def _finished(self, row: QueuedTurn, result: ChatResult) -> RunState:
        """A run that runs nothing: the outcome the row records, at once."""
        run = RunState(
            new_id("run"), row.session_id, AbortController(), RunStream("", row.session_id)
        )
        run.stream.run_id = run.run_id
        if result.status == "superseded":
            run.stream.push(_superseded_chunk(result))
        run.stream.close(result.error)
        fut: asyncio.Future[ChatResult] = asyncio.get_running_loop().create_future()
        fut.set_result(result)
        run.task = fut
        return run

    # -- steering ---------------------------------------------------------------------

    def take_steers(self, run: RunState) -> list[dict[str, Any]]:
        """The messages waiting to join ``run`` (its next step boundary is now)."""
        ids, run.steers = list(run.steers), []
        store = self.store(create=False)
        if store is None or not ids:
            return []
        out = []
        for message_id in ids:
            row = store.get(message_id)
            if row is not None and row.status == "queued":
                out.append(row.message)
        return out

    def steered(self, run: RunState, message_id: str) -> None:
        """The ``data-steer`` part of ``message_id`` was written with the turn's
        message (same transaction): the row says where it went, its waiter follows
        the run from there and gets the run's result."""
        store = self.store(create=False)
        if store is None:
            return
        outcome = {"status": "steered", "run_id": run.run_id, "message_id": run.stream.message_id}
        store.move([message_id], "steered", outcome=outcome)
        waiter = self.waiters.get(message_id)
        for order in self.waiting.values():
            if message_id in order:
                order.remove(message_id)
        self._show(run.session_id)
        if waiter is None:
            return
        start = len(run.stream.chunks)
        _mirror(run.stream, waiter.run.stream, start)
        self.by_run[waiter.run.run_id] = message_id
        self.runner.aliases[waiter.run.run_id] = run.run_id
        assert run.task is not None

        def joined(task: asyncio.Future[ChatResult]) -> None:
            if task.cancelled():
                self._settle(message_id, asyncio.CancelledError())
                return
            exc = task.exception()
            if exc is not None:
                self._settle(message_id, exc)
                return
            result = dataclasses.replace(
                task.result(), steered_into=run.run_id, user_message_id=message_id
            )
            self._settle(message_id, result)

        run.task.add_done_callback(joined)

    # -- cancelling -------------------------------------------------------------------

    def cancel(self, run_id: str, reason: str) -> bool:
        """Abort a waiting message by its run id: it never runs (``cancelled``)."""
        message_id = self.by_run.get(run_id)
        store = self.store(create=False)
        if message_id is None or store is None:
            return False
        moved = store.move(
            [message_id], "cancelled", outcome={"status": "aborted", "error": reason}
        )
        if not moved:
            return False
        row = moved[0]
        self._settle(message_id, _row_result(row, "aborted"))
        self._show(row.session_id)
        return True

    def cancel_session(self, sid: str, reason: str) -> None:
        """The session was cleared or deleted: what waits in it is cancelled."""
        store = self.store(create=False)
        if store is None:
            return
        rows = store.move(
            [r.id for r in store.waiting(sid)],
            "cancelled",
            outcome={"status": "aborted", "error": reason},
        )
        for row in rows:
            self._settle(row.id, _row_result(row, "aborted"))
        self.waiting.pop(sid, None)
        self._show(sid)

    def close(self) -> None:
        """The agent closes: waiters hear it (cancelled), rows stay for the next wake."""
        self.closing = True
        for waiter in list(self.waiters.values()):
            waiter.result.cancel()
            if not waiter.run.stream.done:
                waiter.run.stream.close(
                    "the agent closed before this message's turn; it runs when the agent wakes"
                )
        self.waiters.clear()
        self.by_run.clear()


def _entry(row: QueuedTurn) -> dict[str, Any]:
    return {
        "message_id": row.id,
        "run_id": row.run_id,
        "mode": row.mode,
        "queued_at": int(row.created_at * 1000),
    }


def _row_result(row: QueuedTurn, status: str, error: str | None = None) -> ChatResult:
    return ChatResult(
        run_id=row.run_id,
        session_id=row.session_id,
        message_id="",
        status=status,  # type: ignore[arg-type]
        message=None,
        error=error or row.outcome.get("error"),
        user_message_id=row.id,
    )


def _superseded_result(row: QueuedTurn) -> ChatResult:
    result = _row_result(row, "superseded")
    result.superseded_by = row.outcome.get("superseded_by")
    result.error = None
    return result


def _superseded_chunk(result: ChatResult) -> UIChunk:
    """What a superseded message's stream says (transient: no message stores it)."""
    chunk: dict[str, Any] = {
        "type": "data-superseded",
        "data": {"messageId": result.user_message_id, "supersededBy": result.superseded_by},
        "transient": True,
    }
    return chunk  # type: ignore[return-value]


def _follower(waiter: Waiter) -> RunState:
    """Another caller of the same waiting message: the same stream, its own wait (a
    cancelled caller must not cancel the entry)."""
    run = waiter.run
    follower = RunState(run.run_id, run.session_id, run.controller, run.stream)
    follower.task = asyncio.ensure_future(_shielded(waiter.result))
    return follower


async def _shielded(fut: asyncio.Future[ChatResult]) -> ChatResult:
    return await asyncio.shield(fut)


def _mirror(src: RunStream, dst: RunStream, start: int) -> None:
    """Copy ``src``'s chunks from ``start`` into ``dst``, then close it as ``src``."""

    async def copy() -> None:
        async for batch in src.follow(start):
            for chunk in batch:
                dst.push(chunk)
        dst.close(src.error)

    _keep(asyncio.ensure_future(copy()))


def _mirror_all(src: RunStream, dst: RunStream) -> None:
    _mirror(src, dst, 0)


_TASKS: set[asyncio.Future[Any]] = set()


def _keep(task: asyncio.Future[Any]) -> None:
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)
