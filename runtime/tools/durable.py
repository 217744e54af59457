"""Durable tool calls (seed 003 §1.1-1.7): every tool call of a turn is a row of the
agent's database, written ``pending`` before anything runs and moved by atomic
compare-and-set transitions (:class:`~thinkray.storage.protocols.ToolCallStore`):

    pending → executing → completed | failed
    pending → awaiting-approval → pending | denied
    any open status → cancelled-by-user | cancelled-by-timeout | cancelled-by-error

Who executes a call is the tool's :class:`ToolPolicy`:

- ``inline`` (the default): the turn claims the call and runs the tool itself.
- ``local``: a decoupled executor in the same agent (:class:`LocalExecutor`) claims
  it; the turn only waits for the result.
- ``external``: another actor or process claims it through the agent's remote API
  (``claim_tool_calls`` / ``submit_tool_result``), e.g. a worker pool reading the
  pending calls of its tool names; the turn waits for the result.

Exactly once: a claim is a compare-and-set ``pending → executing``, so of two racing
executors one wins. A call found finished (a turn re-run after recovery) gives back
its stored outcome without running again. A call an inline or local executor held
when the agent's process died is retried only if its tool says so
(``on_crash="retry"``), else it fails.

External claims are leases (SQS's visibility timeout): a claim holds for the
policy's ``lease`` seconds unless its executor renews it (``renew``; the built-in
:class:`~thinkray.runtime.tools.worker.ToolCallWorker` does while it runs the tool).
A lapsed claim goes back to ``pending`` for another executor (at the next claim, or
when the agent's alarm fires), and the old executor's result is refused
(:class:`~thinkray.runtime.errors.ClaimLostError`): an external call runs at least
once, and ``attempts`` says how often it was claimed.

Deadlines: every external call has one (its policy's ``deadline``: ``timeout`` or
:data:`~thinkray.runtime.tools.base.DEFAULT_EXTERNAL_TIMEOUT`), stored on its row with
the call. Past it the call is ``cancelled-by-timeout`` and the waiting turn goes on
with that error, whether the turn noticed (its own timer) or the agent's alarm did
after a crash and a wake: the ledger arms the agent's scheduler (``arm``) for the
earliest lease or deadline of its open calls, so a hibernated agent is woken to
sweep them. Recovery at wake re-arms every open call's deadline and lease.

Cancellation: aborting the turn cancels its open calls ``cancelled-by-user``; a tool
that runs past its ``timeout`` is ``cancelled-by-timeout``; a turn that fails
cancels its open calls ``cancelled-by-error``. A result that arrives for a cancelled
call never resumes anything; it is discarded, or kept beside the call flagged as
late when the agent's policy is ``late_results="store"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any, Literal, cast

from thinkray.runtime.abort import AbortController, AbortError, AbortSignal
from thinkray.runtime.errors import (
    ClaimLostError,
    ToolCallStateError,
    ToolExecutionError,
    ToolTimeoutError,
    UnknownToolCallError,
)
from thinkray.runtime.tools.base import Tool, ToolContext, ToolPolicy, run_tool
from thinkray.storage.codec import pack
from thinkray.storage.errors import InvalidInputError
from thinkray.storage.protocols import ToolCallStore
from thinkray.storage.records import ToolCallRecord

log = logging.getLogger("thinkray.tools.durable")

LatePolicy = Literal["discard", "store"]
OPEN = ("pending", "awaiting-approval", "executing")
MAX_LEASE = 24 * 3600.0  # the longest lease an executor may ask for


class WriteBehind:
    """The ledger's store, with the turn's writes that may wait (a recorded call's
    row, an inline call's result) queued until the turn's next batch commits them in
    its own transaction (:meth:`drain`, called by the recorder): a tool call then costs
    no commit of its own. Any other use of the store drains the queue first, so
    everything that reads or moves a call sees every write before it, in order; and
    what must be durable before something happens (a claimed call's row before its
    tool runs) is drained right there."""

    def __init__(self, store: ToolCallStore) -> None:
        self.inner = store
        self._queue: list[Callable[[], Any]] = []

    @property
    def pending(self) -> bool:
        """Whether writes wait in the queue."""
        return bool(self._queue)

    def defer(self, write: Callable[[], Any]) -> None:
        """Queue ``write`` (it runs inside the transaction of the next drain)."""
        self._queue.append(write)

    def drain(self) -> None:
        """Run the queued writes, in order, in one batch (joining one that is open:
        the recorder's)."""
        while self._queue:
            writes, self._queue = self._queue, []
            with self.inner.batch():
                for write in writes:
                    write()

    def __getattr__(self, name: str) -> Any:
        self.drain()
        return getattr(self.inner, name)


def policy_of(t: Tool) -> ToolPolicy:
    """The tool's policy (``t.policy`` if it has one, else inline with no timeout)."""
    policy = getattr(t, "policy", None)
    return policy if isinstance(policy, ToolPolicy) else ToolPolicy()


class ToolCallLedger:
    """The agent's durable tool calls: records, executes or waits for each call of a
    turn, and takes results and claims from decoupled executors.

    One per agent (one writer per database). Its methods are called from the agent's
    event loop; results from other executors arrive through :meth:`submit` (the
    agent's remote API) and wake the turn waiting for them."""

    def __init__(self, store: ToolCallStore, *, late_results: LatePolicy = "discard") -> None:
        if late_results not in ("discard", "store"):
            raise InvalidInputError(
                f"late_results must be 'discard' or 'store', not {late_results!r}"
            )
        # The store, behind the queue of writes the turn's batches carry (WriteBehind).
        self.behind = WriteBehind(store)
        self.store: ToolCallStore = cast(ToolCallStore, self.behind)
        # Rows recorded and not written yet (queued); rows recorded to be claimed by
        # this ledger in the same batch (an inline call the turn will run), and their
        # claimed records once the batch ran: by row id.
        self._unwritten: dict[str, ToolCallRecord] = {}
        self._claiming: set[str] = set()
        self._preclaimed: dict[str, ToolCallRecord] = {}
        self.late_results: LatePolicy = late_results
        self.executor_id = f"inline-{uuid.uuid4().hex[:8]}"
        self._waiters: dict[str, asyncio.Future[ToolCallRecord]] = {}
        self._pending = asyncio.Event()  # set when a decoupled call becomes claimable
        self._local: dict[str, AbortController] = {}  # calls local executors run now
        # Rows written when the model produced the call (record) that the turn has not
        # released yet (permission unchecked): no executor may claim them. By
        # (tool_call_id, run_id): the row id.
        self._held: dict[tuple[str, str | None], str] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.round_trips: list[float] = []  # submit -> waiting turn resumed (seconds)
        # Called with a call an executor finished while no turn waited for it.
        self.on_settled: Callable[[ToolCallRecord], None] | None = None
        # The tools' policies by name (the agent's, and every tool a turn ran): a claim's
        # lease and an approved call's deadline come from them.
        self.policies: dict[str, ToolPolicy] = {}
        # Asked to call :meth:`sweep` (with ``alarm=True``) at an epoch time: the agent's
        # scheduler, whose alarms survive hibernation and crashes. None: no alarm (the
        # turn's own timers and the claim-time sweep still apply).
        self.arm: Callable[[float], None] | None = None
        self._armed: float | None = None  # the earliest alarm asked for and not yet run
        # Whether recover() found open calls (if not, none can be unreleased either).
        self.open_at_wake = True

    # -- the turn's side ------------------------------------------------------------

    def record(
        self,
        t: Tool,
        tool_call_id: str,
        run_id: str | None,
        session_id: str | None,
        input: Any,
        *,
        claim: bool = False,
    ) -> None:
        """Queue the row of a call the model just produced, to be written before anyone
        is shown the call (the turn's next batch, which the turn commits before it
        releases the call's chunks): ``pending``, held from executors until
        :meth:`execute` releases it (after the turn's permission check). ``claim``
        (an inline tool whose permission needs no check): claimed by this ledger in
        the same batch, so running it needs no write of its own. A call that already
        has its row (a re-run) is left as it is."""
        policy = policy_of(t)
        row_id, rec = self._peek(tool_call_id, run_id)
        if rec is not None:
            return
        self._unwritten[row_id] = ToolCallRecord(
            id=row_id,
            tool_name=t.name,
            run_id=run_id,
            session_id=session_id,
            input=input,
            durable=policy.decoupled,
        )
        self.behind.defer(lambda: self._write_recorded(row_id))
        if claim and not policy.decoupled:
            self._claiming.add(row_id)
            self.behind.defer(lambda: self._claim_recorded(row_id))
        self._held[(tool_call_id, run_id)] = row_id

    def _write_recorded(self, row_id: str) -> None:
        rec = self._unwritten.pop(row_id, None)
        if rec is not None:
            self.store.insert(rec)

    def _claim_recorded(self, row_id: str) -> None:
        if row_id in self._claiming:
            got = self.store.transition(
                row_id, ["pending"], "executing", executor=self.executor_id, claim=True
            )
            if got is not None:
                self._preclaimed[row_id] = got

    def _peek(self, tool_call_id: str, run_id: str | None) -> tuple[str, ToolCallRecord | None]:
        """:meth:`_lookup` without draining the queue (rows queued count as written)."""

        def get(row_id: str) -> ToolCallRecord | None:
            queued = self._unwritten.get(row_id)
            return queued if queued is not None else self.behind.inner.get(row_id)

        rec = get(tool_call_id)
        if rec is None or rec.run_id is None or run_id is None or rec.run_id == run_id:
            return tool_call_id, rec
        scoped = f"{tool_call_id}~{run_id}"
        return scoped, get(scoped)

    def refuse(self, tool_call_id: str, run_id: str | None, reason: str) -> None:
        """The turn refused a call it recorded (its permission check said no): its row,
        never released, is ``denied`` with ``reason``."""
        self._held.pop((tool_call_id, run_id), None)
        row_id, rec = self._lookup(tool_call_id, run_id)
        if rec is not None and rec.status == "pending" and not rec.attempts:
            self.store.transition(row_id, ["pending"], "denied", error=reason)

    def cancel_unreleased(self, run_ids: Iterable[str], reason: str) -> int:
        """At wake: rows recorded for runs that died before releasing them (no permission
        decision, never claimed) are ``cancelled-by-error``: their turn failed under
        them, and nothing may run a call nobody allowed. Returns how many."""
        runs = set(run_ids)
        moved = 0
        for rec in self.store.rows("pending"):
            if (
                rec.run_id in runs
                and not rec.attempts
                and rec.executor is None
                and rec.approval is None
                and self.store.transition(rec.id, ["pending"], "cancelled-by-error", error=reason)
            ):
                moved += 1
        return moved

    async def execute(self, t: Tool, value: Any, ctx: ToolContext, raw_input: Any = None) -> Any:
        """Run (or wait for) the call ``ctx.tool_call_id`` of tool ``t`` and return its
        output. Raises AbortError on abort, :class:`ToolTimeoutError` on timeout, and
        :class:`ToolExecutionError` (the call's error) when it failed."""
        policy = policy_of(t)
        self.policies[t.name] = policy
        deadline = self.deadline_for(t.name) if policy.decoupled else None

        def fresh(call_id: str) -> ToolCallRecord:
            # Written before anything runs. An inline call is written already claimed
            # (executing, by this ledger): one write instead of insert-then-claim.
            return ToolCallRecord(
                id=call_id,
                tool_name=t.name,
                status="pending" if policy.decoupled else "executing",
                executor=None if policy.decoupled else self.executor_id,
                attempts=0 if policy.decoupled else 1,
                run_id=ctx.run_id,
                session_id=ctx.session_id,
                input=raw_input if raw_input is not None else _plain(value),
                durable=policy.decoupled,
                deadline_at=deadline,
            )

        call_id, rec, created = self._row_of(ctx, fresh)
        if not created and self._preclaimed.pop(call_id, None) is rec:
            pass  # claimed by this ledger when recorded, its row durable: run it
        elif not created:
            if rec.finished:
                return _outcome(rec)  # ran before (a re-run turn): never again
            if not policy.decoupled:
                claimed = self.store.transition(
                    call_id, ["pending"], "executing", executor=self.executor_id, claim=True
                )
                if claimed is None:  # another executor holds it: wait for its result
                    until = rec.deadline_at
                    if until is None and policy.deadline is not None:
                        until = time.time() + policy.deadline
                    return await self._wait(call_id, ctx.signal, until)
        if policy.decoupled:
            return await self._decoupled(t, value, ctx, rec, fresh_row=created)
        limit = asyncio.timeout(policy.deadline)
        try:
            async with limit:
                output = await run_tool(t, value, ctx)
        except AbortError as exc:
            self._cancel(call_id, "cancelled-by-user", f"aborted: {exc.reason}")
            raise
        except TimeoutError as exc:
            if not limit.expired():  # the tool's own TimeoutError: an ordinary failure
                self._failed(call_id, f"TimeoutError: {exc}")
                raise
            self._cancel(call_id, "cancelled-by-timeout", f"timed out after {policy.deadline} s")
            raise ToolTimeoutError(f"tool {t.name!r} timed out after {policy.deadline} s") from None
        except Exception as exc:
            self._failed(call_id, f"{type(exc).__name__}: {exc}")
            raise
        return self._completed(call_id, output, ctx.signal)

    def _completed(self, call_id: str, output: Any, signal: AbortSignal) -> Any:
        """This ledger's inline execution of ``call_id`` returned ``output``. Its row
        moves with the turn's next batch (no commit of its own): nothing else can move
        an inline call while its turn runs but the turn's abort, and an abort's
        cancellation reads the ledger, which writes this move first. A result that
        cannot be stored, or a turn already aborted, takes the direct path."""
        try:
            pack(output, "tool call result")
        except InvalidInputError:
            return self._finish(call_id, "completed", self.executor_id, result=output)
        if signal.aborted:
            return self._finish(call_id, "completed", self.executor_id, result=output)
        executor = self.executor_id
        self.behind.defer(lambda: self._finish(call_id, "completed", executor, result=output))
        return output

    async def _decoupled(
        self, t: Tool, value: Any, ctx: ToolContext, rec: ToolCallRecord, *, fresh_row: bool
    ) -> Any:
        """Hand a decoupled call to its executor and wait for the outcome, until the
        call's deadline (armed on the agent's alarm too)."""
        policy = policy_of(t)
        deadline = self.deadline_for(t.name)
        if not fresh_row and rec.deadline_at is None and deadline is not None:
            # A row written before its deadline was known (an ask, an older file).
            rec = self.store.set_deadline(rec.id, deadline) or rec
        if rec.deadline_at is not None:
            self.arm_at(rec.deadline_at)
        if rec.status == "pending":
            if policy.executor == "local":
                self._spawn_local(t, value, ctx)
            else:
                self._pending.set()
        return await self._wait(rec.id, ctx.signal, rec.deadline_at)

    def _row_of(
        self, ctx: ToolContext, fresh: Callable[[str], ToolCallRecord]
    ) -> tuple[str, ToolCallRecord, bool]:
        """The call's row id, its row, and whether it was just created (``fresh``)."""
        rec: ToolCallRecord | None
        held = self._held.pop((ctx.tool_call_id, ctx.run_id), None)
        if held is not None and held in self._claiming:
            # Claimed when recorded: its row is made durable before the tool runs (the
            # turn's batch wrote it already, unless no batch ran since).
            self._claiming.discard(held)
            self.behind.drain()
            claimed = self._preclaimed.get(held)
            if claimed is not None:
                return held, claimed, False
        try:
            if held is not None:  # recorded when the model produced it: released now
                rec = self.store.get(held)
                if rec is not None:
                    return held, rec, False
            # A provider's call id is new: insert at once (the insert checks for the id
            # in its own transaction); only a known id needs a look (a re-run, or a
            # scripted model repeating its ids).
            return ctx.tool_call_id, self.store.insert(fresh(ctx.tool_call_id)), True
        except InvalidInputError:
            call_id, rec = self._lookup(ctx.tool_call_id, ctx.run_id)
            if rec is None:
                return call_id, self.store.insert(fresh(call_id)), True
            return call_id, rec, False

    def _failed(self, call_id: str, error: str) -> None:
        """Record that this ledger's inline execution of a call raised (the caller
        re-raises the tool's own exception for the model)."""
        with contextlib.suppress(ToolExecutionError, ToolCallStateError):
            self._finish(call_id, "failed", self.executor_id, error=error)

    def record_id(self, tool_call_id: str, run_id: str | None) -> str:
        """The row id of the model's call ``tool_call_id`` in run ``run_id``: the call
        id itself, unless another run already used it (providers' ids are unique, but
        scripted test models repeat theirs); then ``<call id>~<run id>``. The same run
        (a turn re-run after recovery) always gets the same row: exactly once."""
        return self._lookup(tool_call_id, run_id)[0]

    def _lookup(self, tool_call_id: str, run_id: str | None) -> tuple[str, ToolCallRecord | None]:
        """:meth:`record_id` and the row under it (None: none yet), reading as few
        rows as it can (one, for a provider's fresh id)."""
        rec = self.store.get(tool_call_id)
        if rec is None or rec.run_id is None or run_id is None or rec.run_id == run_id:
            return tool_call_id, rec
        scoped = f"{tool_call_id}~{run_id}"
        return scoped, self.store.get(scoped)

    async def _wait(self, call_id: str, signal: AbortSignal, deadline_at: float | None) -> Any:
        """Wait for a decoupled executor's result, until the call's deadline (epoch
        seconds; None: none) or an abort."""
        rec = self.store.get(call_id)
        if rec is not None and rec.finished:
            return _outcome(rec)
        timeout = None if deadline_at is None else max(0.0, deadline_at - time.time())
        future = self._waiters.get(call_id)
        if future is None or future.done():
            future = asyncio.get_running_loop().create_future()
            self._waiters[call_id] = future
        aborted: asyncio.Future[Any] = asyncio.ensure_future(signal.wait())
        waiting: set[asyncio.Future[Any]] = {future, aborted}
        try:
            done, _ = await asyncio.wait(
                waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if future in done:
                return _outcome(future.result())
            if aborted in done:
                self._cancel(call_id, "cancelled-by-user", f"aborted: {signal.reason}")
                raise AbortError(signal.reason or "aborted")
            if not self._cancel(call_id, "cancelled-by-timeout", "timed out: past its deadline"):
                settled = self.store.get(call_id)  # finished in the same instant: it holds
                if settled is not None and settled.finished:
                    return _outcome(settled)
            raise ToolTimeoutError(f"tool call {call_id!r} timed out: past its deadline")
        finally:
            aborted.cancel()
            if self._waiters.get(call_id) is future:
                del self._waiters[call_id]

    def _spawn_local(self, t: Tool, value: Any, ctx: ToolContext) -> None:
        """The ``local`` executor: a task of this agent, decoupled from the turn, that
        claims the call like any executor and reports through :meth:`submit`. Its own
        abort signal fires when the call is cancelled."""
        executor = f"local-{uuid.uuid4().hex[:8]}"
        controller = AbortController()
        call_id = self.record_id(ctx.tool_call_id, ctx.run_id)
        local_ctx = ToolContext(
            tool_call_id=call_id,
            tool_name=ctx.tool_name,
            signal=controller.signal,
            session_id=ctx.session_id,
            run_id=ctx.run_id,
            agent=ctx.agent,
            extras=ctx.extras,
        )

        async def run() -> None:
            if (
                self.store.transition(
                    call_id, ["pending"], "executing", executor=executor, claim=True
                )
                is None
            ):
                return  # someone else claimed it
            self._local[call_id] = controller
            try:
                outcome = await _run_local(t, value, local_ctx)
            finally:
                self._local.pop(call_id, None)
            if outcome is None:
                return  # cancelled: the call's status says so already
            try:
                self._report_local(call_id, executor, *outcome)
            except Exception as exc:
                # Writing the result back failed: without this the turn waiting for the
                # call would wait forever. The call is cancelled by that error (the
                # turn sees it as the call's error result).
                log.exception("the local executor of tool call %s could not report", call_id)
                self._cancel(
                    call_id,
                    "cancelled-by-error",
                    f"the result could not be reported: {type(exc).__name__}: {exc}",
                )

        task = asyncio.ensure_future(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _report_local(self, call_id: str, executor: str, output: Any, error: str | None) -> None:
        """The local executor's outcome, through :meth:`submit` like any executor's. A
        result that cannot be stored fails the call instead."""
        with contextlib.suppress(ToolCallStateError, UnknownToolCallError):
            if error is not None:
                self.submit(call_id, executor, error=error)
                return
            try:
                self.submit(call_id, executor, result=output)
            except InvalidInputError as exc:
                self.submit(call_id, executor, error=f"result cannot be stored: {exc}")

    def cancel_run(self, run_id: str, status: str, reason: str) -> int:
        """Cancel every open call of run ``run_id`` (``status``: one of the
        ``cancelled-by-*``); returns how many moved."""
        moved = 0
        for rec in self.store.rows(OPEN, run_id=run_id):
            if self._cancel(rec.id, status, reason):
                moved += 1
        return moved

    def _cancel(self, call_id: str, status: str, reason: str) -> bool:
        self._claiming.discard(call_id)
        self._preclaimed.pop(call_id, None)
        moved = self.store.transition(call_id, OPEN, status, error=reason)
        if moved is not None:
            self._resolve(moved)
            local = self._local.get(call_id)
            if local is not None:  # a local executor runs it: stop it too
                local.abort(reason)
        return moved is not None

    def _finish(
        self,
        call_id: str,
        status: str,
        executor: str,
        *,
        result: Any = None,
        error: str | None = None,
    ) -> Any:
        try:
            done = self.store.transition(
                call_id, ["executing"], status, executor=executor, result=result, error=error
            )
        except InvalidInputError as exc:  # a result that cannot be stored
            done = self.store.transition(
                call_id,
                ["executing"],
                "failed",
                executor=executor,
                error=f"the tool's result cannot be stored: {exc}",
            )
        if done is None:  # cancelled meanwhile: a late result
            rec = self.store.get(call_id)
            if rec is not None and rec.cancelled:
                self._late(rec, result, error)
                return _outcome(rec)
            raise ToolCallStateError(f"tool call {call_id!r} is no longer held by {executor!r}")
        self._resolve(done)
        return _outcome(done)

    def _late(self, rec: ToolCallRecord, result: Any, error: str | None) -> str:
        if self.late_results == "store":
            self.store.store_late(rec.id, result=result, error=error)
            return "stored-late"
        log.info("discarded a late result for cancelled tool call %s", rec.id)
        return "discarded-late"

    def _resolve(self, rec: ToolCallRecord) -> bool:
        """Wake the turn waiting for ``rec``; False when none waits."""
        future = self._waiters.get(rec.id)
        if future is not None and not future.done():
            future.set_result(rec)
            return True
        return False

    # -- decoupled executors' side (the agent's remote API) ---------------------------

    async def claim(
        self,
        tool_names: Iterable[str],
        executor: str,
        limit: int = 1,
        wait: float = 0.0,
        lease: float | None = None,
    ) -> list[ToolCallRecord]:
        """Claim up to ``limit`` pending decoupled calls of ``tool_names`` for
        ``executor`` (each claim a compare-and-set: two executors never get one call),
        waiting up to ``wait`` seconds for one to appear. Each claim holds for ``lease``
        seconds (default: its tool's policy) unless :meth:`renew` extends it; lapsed
        claims and calls past their deadline are swept first, so a call whose
        executor died is claimable again once its lease is over."""
        names = sorted(set(tool_names))
        if not names or not executor or limit < 1:
            raise InvalidInputError("claim needs tool names, an executor name and a limit >= 1")
        _check_lease(lease)
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            self._pending.clear()
            self.sweep()
            claimed = []
            held = set(self._held.values())
            for rec in self.store.rows("pending", tool_names=names):
                if not rec.durable or rec.id in held:
                    continue
                until = time.time() + self._lease(rec.tool_name, lease)
                got = self.store.transition(
                    rec.id,
                    ["pending"],
                    "executing",
                    executor=executor,
                    claim=True,
                    lease_until=until,
                )
                if got is not None:
                    self.arm_at(until)
                    claimed.append(got)
                    if len(claimed) >= limit:
                        break
            left = deadline - time.monotonic()
            if claimed or left <= 0:
                return claimed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._pending.wait(), left)

    def renew(self, call_id: str, executor: str, lease: float | None = None) -> ToolCallRecord:
        """The holder's heartbeat: its claim on ``call_id`` holds ``lease`` more seconds
        (default: the tool's policy) from now. Returns the call.

        Raises:
            UnknownToolCallError: no such call.
            ClaimLostError: ``executor`` does not hold the call (its claim lapsed, the
                call was claimed again, cancelled or finished); stop working on it.
        """
        _check_lease(lease)
        rec = self.store.get(call_id)
        if rec is None:
            raise UnknownToolCallError(f"no tool call {call_id!r}")
        renewed = self.store.renew(
            call_id, executor, time.time() + self._lease(rec.tool_name, lease)
        )
        if renewed is None:
            now = self.store.get(call_id) or rec
            held = f", held by {now.executor!r}" if now.executor else ""
            raise ClaimLostError(
                f"tool call {call_id!r} is {now.status}{held}: {executor!r} does not hold "
                "it (its claim lapsed, or the call was claimed again, cancelled or finished)"
            )
        return renewed

    def submit(
        self, call_id: str, executor: str, *, result: Any = None, error: str | None = None
    ) -> str:
        """An executor's outcome for a call it claimed: ``error`` None completes it
        with ``result``, else fails it. Returns ``accepted``, or for a call cancelled
        meanwhile ``discarded-late`` / ``stored-late`` (the late-result policy; a late
        result never resumes a turn).

        Raises:
            UnknownToolCallError: no such call.
            ClaimLostError: ``executor`` does not hold the call (its claim lapsed, or
                another executor claimed it since); nothing changed.
            ToolCallStateError: the call finished already; nothing changed.
            InvalidInputError: a result that cannot be stored; nothing changed.
        """
        if error is not None and not isinstance(error, str):
            raise InvalidInputError("error must be a string or None")
        rec = self.store.get(call_id)
        if rec is None:
            raise UnknownToolCallError(f"no tool call {call_id!r}")
        if rec.cancelled:
            return self._late(rec, result, error)
        if rec.status != "executing" or rec.executor != executor:
            raise _lost(rec, executor)
        started = time.perf_counter()
        status = "completed" if error is None else "failed"
        done = self.store.transition(
            call_id, ["executing"], status, executor=executor, result=result, error=error
        )
        if done is None:  # moved between the read and the write: report what it is now
            now = self.store.get(call_id)
            if now is not None and now.cancelled:
                return self._late(now, result, error)
            raise _lost(now or rec, executor)
        if not self._resolve(done) and self.on_settled is not None:
            self.on_settled(done)  # no turn waits (its run was cut off): the agent decides
        self.round_trips.append(time.perf_counter() - started)
        del self.round_trips[:-1000]
        return "accepted"

    # -- leases, deadlines and the alarm ---------------------------------------------

    def deadline_for(self, tool_name: str, now: float | None = None) -> float | None:
        """The deadline (epoch seconds) a call of ``tool_name`` written ``now`` gets
        from its policy, or None (no limit)."""
        seconds = self.policies.get(tool_name, ToolPolicy()).deadline
        if seconds is None:
            return None
        return (time.time() if now is None else now) + seconds

    def _lease(self, tool_name: str, lease: float | None) -> float:
        return lease if lease is not None else self.policies.get(tool_name, ToolPolicy()).lease

    def arm_at(self, at: float) -> None:
        """Make sure the agent's alarm sweeps no later than ``at`` (epoch seconds)."""
        if self.arm is None or (self._armed is not None and self._armed <= at):
            return
        self._armed = at
        try:
            self.arm(at)
        except Exception:  # the turn's own timers still apply; the next arm tries again
            self._armed = None
            log.exception("could not arm the tool-call alarm for %s", at)

    def sweep(
        self, now: float | None = None, *, alarm: bool = False
    ) -> tuple[list[ToolCallRecord], list[ToolCallRecord]]:
        """Cancel every open call past its deadline (``cancelled-by-timeout``; an ask's
        audit row says ``timeout``) and put every lapsed claim back to ``pending``, in
        one transaction; wake the turns waiting for the cancelled ones (or tell the
        agent, ``on_settled``, when none waits) and the claimers waiting for work; arm
        the alarm for what is due next. ``alarm``: this is the alarm firing. Returns
        ``(expired, lapsed)``."""
        now = time.time() if now is None else now
        if alarm:
            self._armed = None
        with self.store.transaction():
            expired = self.store.expire(now)
            for rec in expired:
                if rec.approval is not None and rec.approval.get("decision") == "timeout":
                    self.store.audit(rec.id, "timeout", by=None, reason="expired unanswered")
            lapsed = self.store.lapse(now)
        for rec in expired:
            local = self._local.get(rec.id)
            if local is not None:
                local.abort(rec.error or "timed out")
            if not self._resolve(rec) and self.on_settled is not None:
                try:
                    self.on_settled(rec)
                except Exception:
                    log.exception("on_settled failed for expired tool call %s", rec.id)
        if lapsed:
            log.warning("claims lapsed (back to pending): %s", [r.id for r in lapsed])
            self._pending.set()
        upcoming = self.store.next_deadline()
        if upcoming is not None:
            self.arm_at(upcoming)
        return expired, lapsed

    def recover(self, policies: dict[str, ToolPolicy]) -> dict[str, int]:
        """After a wake: calls found ``executing`` by this agent's own (inline or
        local) executors died with the old process. Each is retried (back to
        ``pending``) if its tool's policy says ``on_crash="retry"``, else failed.
        External claims stay their executors' until their leases lapse; an open call
        of an external tool without a deadline or lease (written by an older build)
        gets one from now. Then the sweep: past deadlines (asks included) are
        cancelled, lapsed leases put back, and the alarm armed for the rest. Returns
        counts by outcome."""
        self.policies.update(policies)
        counts = {"retried": 0, "failed": 0, "expired": 0, "lapsed": 0}
        now = time.time()
        open_rows = self.store.rows(OPEN)
        # Nothing open (most wakes): nothing can have died, expired or lapsed, and
        # nothing is due (a final call has no due time), so there is no sweep to run.
        self.open_at_wake = bool(open_rows)
        if not open_rows:
            return counts
        for rec in open_rows:
            policy = policies.get(rec.tool_name, ToolPolicy())
            external = rec.lease_until is not None or (
                rec.durable and policy.executor == "external"
            )
            if rec.status == "executing" and not external:
                self._recover_own(rec, policy, counts)
            elif rec.status == "executing" and rec.lease_until is None and rec.executor:
                self.store.renew(rec.id, rec.executor, now + policy.lease)
            if rec.deadline_at is None:
                self._rearm_deadline(rec, external, now)
        expired, lapsed = self.sweep(now)
        counts["expired"], counts["lapsed"] = len(expired), len(lapsed)
        return counts

    def _rearm_deadline(self, rec: ToolCallRecord, external: bool, now: float) -> None:
        """A deadline for an open call that has none: an ask's expiry, or an external
        call's policy deadline from now."""
        if rec.status == "awaiting-approval":
            expires = (rec.approval or {}).get("expires_at")
            if isinstance(expires, (int, float)):
                self.store.set_deadline(rec.id, float(expires), expect=["awaiting-approval"])
        elif external:
            deadline = self.deadline_for(rec.tool_name, now)
            if deadline is not None:
                self.store.set_deadline(rec.id, deadline)

    def _recover_own(self, rec: ToolCallRecord, policy: ToolPolicy, counts: dict[str, int]) -> None:
        if policy.on_crash == "retry":
            # The same id again (``attempts`` counts the claims): the tool said it is
            # safe to run twice.
            moved = self.store.transition(rec.id, ["executing"], "pending")
            counts["retried"] += moved is not None
            if moved is not None and moved.durable:
                self._pending.set()
        else:
            moved = self.store.transition(
                rec.id,
                ["executing"],
                "failed",
                # The tool ran, or had run and its result was not committed yet (an
                # inline result lands with the turn's next batch): either way the turn
                # was interrupted, and the call is not run again.
                error=(
                    "interrupted: the agent's process died while the tool ran (or before "
                    "its result was recorded); not re-run"
                ),
            )
            counts["failed"] += moved is not None


def _check_lease(lease: float | None) -> None:
    if lease is None:
        return
    if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not 0 < lease <= MAX_LEASE:
        raise InvalidInputError(f"lease must be a number of seconds in (0, {MAX_LEASE:g}]")


def _lost(rec: ToolCallRecord, executor: str) -> ToolCallStateError:
    """The error for ``executor`` acting on a call it does not hold."""
    held = f", held by {rec.executor!r}" if rec.executor else ""
    if rec.finished and rec.executor == executor:
        return ToolCallStateError(
            f"tool call {rec.id!r} is {rec.status}; {executor!r} cannot report on it again"
        )
    if rec.finished:
        return ClaimLostError(
            f"tool call {rec.id!r} is {rec.status}{held}: {executor!r} does not hold it; "
            "its result is refused"
        )
    return ClaimLostError(
        f"tool call {rec.id!r} is {rec.status}{held}: {executor!r} does not hold it (its "
        "claim lapsed or the call was claimed again); its result is refused"
    )


async def _run_local(t: Tool, value: Any, ctx: ToolContext) -> tuple[Any, str | None] | None:
    """Run a local executor's tool: ``(output, None)``, ``(None, error)`` when it raised,
    or None when the call was cancelled (its abort signal fired). A CancelledError
    the tool raises while its executor was not cancelled (a task the tool awaited was
    cancelled under it) is the tool's failure, never a silent end of the executor."""
    try:
        return await run_tool(t, value, ctx), None
    except AbortError:
        return None
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the executor itself is being stopped (the agent is closing)
        return None, f"CancelledError: {exc or 'the tool was cancelled'}"
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"


def _outcome(rec: ToolCallRecord) -> Any:
    """A finished call's output, or its failure as an exception for the loop."""
    if rec.status == "completed":
        return rec.result
    if rec.status == "cancelled-by-timeout":
        raise ToolTimeoutError(rec.error or "timed out")
    if rec.status == "cancelled-by-user":
        raise AbortError(rec.error or "aborted")
    raise ToolExecutionError(rec.error or rec.status)


def _plain(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if callable(dump) else value
