"""Durable fibers (seed 000 "Durable fibers"): long-running methods that survive eviction.

``spawn_fiber("do_work", payload)`` persists a ``running`` row, then runs
``await host.do_work(payload, ctx)`` as an asyncio task. The method may
``ctx.stash(data)`` (or ``manager.stash_fiber(data)``) to persist a checkpoint, and
should watch ``ctx.signal`` for cooperative cancellation.

Lifecycle::

    spawn → running → [stash checkpoints] → completed
                                           → failed (after max retries)
                                           → cancelled (cooperative)
                                           → interrupted (found orphaned on wake)
                                               → running (restarted from checkpoint)
                                               | failed | interrupted (host handled it)

Retries: ``attempts`` counts attempts started (the first run is 1). An exception, or
an interruption found on wake, starts another attempt while ``attempts <= max_retries``
(so at most ``max_retries + 1`` attempts in all, crash loops included); then the fiber
is ``failed`` with the last error.

Recovery (the constructor path). Every ``running`` row that is not an asyncio task of
this manager belongs to a previous incarnation: :meth:`FiberManager.recover` marks it
``interrupted`` and — with ``recover=True`` — resumes it. For each interrupted fiber
the host's optional ``on_fiber_recovered(fiber: FiberRecord)`` (sync or async) is
called first:

- it returns a truthy value: the host took care of it. The fiber stays
  ``interrupted`` (terminal, never offered again) unless the hook itself changed its
  status (say with ``cancel_fiber``);
- it returns a false-y value (or raises, which is logged): the default applies — the
  method no longer on the host → ``failed`` ("recovery failed: ... has no method");
  attempts exhausted → ``failed``; otherwise restart with ``ctx.checkpoint`` = the
  last stash, ``ctx.attempt`` = attempts + 1 and ``ctx.recovered`` = True.

Hibernation/eviction: :meth:`FiberManager.close` cancels the tasks WITHOUT touching
their rows, so they stay ``running`` and the next incarnation recovers them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from thinkray.runtime.abort import AbortController, AbortError, AbortSignal
from thinkray.runtime.errors import InvalidArgumentError, InvalidStateError, OperationTimeoutError
from thinkray.storage.codec import pack
from thinkray.storage.errors import FiberNotFoundError
from thinkray.storage.protocols import FiberRecord, FiberStore
from thinkray.storage.records import FiberStatus

log = logging.getLogger("thinkray.fibers")

__all__ = [
    "FiberContext",
    "FiberManager",
    "FiberNotFoundError",
    "FiberRecord",
    "FiberStore",
    "current_fiber",
]

RECOVERY_HOOK = "on_fiber_recovered"
_GONE = object()  # a fiber no longer running (deleted or finished elsewhere)
DEFAULT_RETENTION_SECONDS = 7 * 24 * 3600.0


@dataclass
class FiberContext:
    """What a fiber method gets as its second argument."""

    fiber_id: str
    method: str
    attempt: int
    checkpoint: Any
    signal: AbortSignal
    recovered: bool = False
    _stash: Callable[[str, Any], None] | None = field(default=None, repr=False)

    def stash(self, data: Any) -> None:
        """Persist ``data`` as this fiber's checkpoint (msgpack-able). A restart after
        a failure or an eviction gets it back as ``ctx.checkpoint``."""
        if self._stash is None:
            raise InvalidStateError("this fiber context is detached")
        self._stash(self.fiber_id, data)
        self.checkpoint = data


@dataclass
class _Active:
    fiber_id: str
    controller: AbortController
    task: asyncio.Task[None] | None = None
    ctx: FiberContext | None = None


_current: contextvars.ContextVar[tuple[FiberManager, FiberContext] | None] = contextvars.ContextVar(
    "thinkray_current_fiber", default=None
)


def current_fiber() -> FiberContext | None:
    """The context of the fiber running in this asyncio task (inherited by tasks it
    creates), or None outside fibers."""
    cur = _current.get()
    return cur[1] if cur else None


class FiberManager:
    """Runs and recovers the fibers of one host object over a :class:`FiberStore`.

    ``spawn_fiber`` needs a running event loop. Construction does not: recovery marks
    orphans ``interrupted`` at once and, when no loop is running yet (a Ray actor's
    ``__init__``), defers the restarts to :meth:`start` (or to the first
    ``spawn_fiber``/``wait``).
    """

    def __init__(
        self,
        store: FiberStore,
        host: object,
        *,
        recover: bool = True,
        retry_backoff: float = 0.1,
        max_backoff: float = 10.0,
        retention_seconds: float | None = DEFAULT_RETENTION_SECONDS,
    ) -> None:
        self.store = store
        self.host = host
        self.auto_recover = recover
        self.retry_backoff = retry_backoff
        self.max_backoff = max_backoff
        self.retention_seconds = retention_seconds
        self._active: dict[str, _Active] = {}
        self._resume_task: asyncio.Task[list[str]] | None = None
        self._resume_pending = False
        self._closed = False
        self.recover(restart=recover)

    # -- spawning ----------------------------------------------------------------------

    def spawn_fiber(self, method: str, payload: Any = None, *, max_retries: int = 3) -> str:
        """Persist a ``running`` fiber and start ``host.<method>(payload, ctx)``.

        Raises before writing anything if the host has no such method, the payload is
        not msgpack-able, or no event loop is running."""
        self._check_open()
        asyncio.get_running_loop()  # RuntimeError outside a loop, before any write
        if not callable(getattr(self.host, method, None)):
            raise InvalidArgumentError(
                f"{type(self.host).__name__} has no method {method!r} to run as a fiber"
            )
        record = self.store.insert_fiber(method, payload, max_retries=max_retries)
        self._start(record, attempt=1, checkpoint=None, recovered=False)
        self._kick_resume()
        return record.id

    def _start(
        self, record: FiberRecord, *, attempt: int, checkpoint: Any, recovered: bool
    ) -> None:
        active = _Active(record.id, AbortController())
        self._active[record.id] = active
        active.task = asyncio.get_running_loop().create_task(
            self._run(active, record, attempt, checkpoint, recovered),
            name=f"fiber:{record.id}:{record.method}",
        )

    async def _run(
        self,
        active: _Active,
        record: FiberRecord,
        attempt: int,
        checkpoint: Any,
        recovered: bool,
    ) -> None:
        fid = record.id
        signal = active.controller.signal
        try:
            fn = getattr(self.host, record.method, None)
            if not callable(fn):
                error = f"{type(self.host).__name__} has no method {record.method!r}"
                self._finish(fid, "failed", error=error)
                return
            while True:
                try:
                    result = await self._call(fn, active, record, attempt, checkpoint, recovered)
                except asyncio.CancelledError:
                    # close() (hibernation/eviction): the row stays ``running`` for the
                    # next incarnation. Nothing is written here: the database may be
                    # closing right after.
                    raise
                except Exception as exc:
                    if signal.aborted:
                        return  # cancelled: cancel_fiber already wrote the status
                    retry = await self._after_failure(record, attempt, exc, signal)
                    if retry is None:
                        return
                    attempt, checkpoint, recovered = retry, self._checkpoint_of(fid), False
                    if checkpoint is _GONE:
                        return
                    continue
                if not signal.aborted:
                    self._complete(fid, result)
                return
        finally:
            if self._active.get(fid) is active:
                del self._active[fid]

    async def _call(
        self,
        fn: Any,
        active: _Active,
        record: FiberRecord,
        attempt: int,
        checkpoint: Any,
        recovered: bool,
    ) -> Any:
        """One attempt: ``fn(payload, ctx)`` with this attempt's context current."""
        ctx = FiberContext(
            fiber_id=record.id,
            method=record.method,
            attempt=attempt,
            checkpoint=checkpoint,
            signal=active.controller.signal,
            recovered=recovered,
            _stash=self._stash,
        )
        active.ctx = ctx
        token = _current.set((self, ctx))
        try:
            result = fn(record.payload, ctx)
            if inspect.isawaitable(result):
                result = await result
            return result
        finally:
            _current.reset(token)

    async def _after_failure(
        self, record: FiberRecord, attempt: int, exc: Exception, signal: AbortSignal
    ) -> int | None:
        """Record a failed attempt; the next attempt's number after the backoff, or None
        when the fiber is finished (out of retries, deleted or aborted meanwhile)."""
        fid = record.id
        if isinstance(exc, AbortError):
            error = f"aborted: {exc.reason}"
        else:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if attempt > record.max_retries:
            log.warning("fiber %s failed after %d attempts: %s", fid, attempt, error)
            self._finish(fid, "failed", error=error)
            return None
        log.info("fiber %s attempt %d failed, retrying: %s", fid, attempt, error)
        attempt += 1
        try:
            self.store.update_fiber(fid, attempts=attempt, error=error, expect_status="running")
        except FiberNotFoundError:
            return None  # deleted while it ran
        delay = min(self.retry_backoff * 2 ** (attempt - 2), self.max_backoff)
        if delay > 0:
            # Not wait_for: on 3.11 it can swallow the cancel of a close.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await signal.wait()
        return None if signal.aborted else attempt

    def _checkpoint_of(self, fiber_id: str) -> Any:
        """The stored checkpoint of a fiber still running, else :data:`_GONE`."""
        latest = self.store.get_fiber(fiber_id)
        if latest is None or latest.status != "running":
            return _GONE
        return latest.checkpoint

    def _complete(self, fiber_id: str, result: Any) -> None:
        try:
            pack(result, "fiber result")
        except ValueError as exc:
            self._finish(fiber_id, "failed", error=str(exc))
            return
        self._finish(fiber_id, "completed", result=result, error=None)

    def _finish(self, fiber_id: str, status: FiberStatus, **fields: Any) -> None:
        try:
            self.store.update_fiber(fiber_id, status=status, expect_status="running", **fields)
        except FiberNotFoundError:
            log.info("fiber %s was deleted while it ran", fiber_id)

    # -- inside a fiber ----------------------------------------------------------------

    def _stash(self, fiber_id: str, data: Any) -> None:
        self.store.set_checkpoint(fiber_id, data)

    def stash_fiber(self, data: Any) -> None:
        """Persist ``data`` as the checkpoint of the fiber running in this task.
        Raises RuntimeError outside a fiber of this manager."""
        cur = _current.get()
        if cur is None or cur[0] is not self:
            raise InvalidStateError("stash_fiber() called outside a running fiber")
        cur[1].stash(data)

    # -- control -----------------------------------------------------------------------

    def cancel_fiber(self, fiber_id: str, reason: str = "cancelled") -> bool:
        """Cooperative cancel: mark the fiber ``cancelled`` and fire its signal (the
        method sees ``ctx.signal.aborted``; whatever it returns afterwards is dropped).
        A fiber not running here (interrupted, awaiting recovery) is just marked.
        False for an unknown or already finished fiber."""
        try:
            record = self.store.update_fiber(
                fiber_id,
                status="cancelled",
                error=reason,
                expect_status=("running", "interrupted"),
            )
        except FiberNotFoundError:
            return False
        active = self._active.get(fiber_id)
        if active is not None:
            active.controller.abort(reason)
        return record is not None

    def prune(self, older_than: float) -> int:
        """Delete finished fibers last updated more than ``older_than`` seconds ago."""
        return self.store.delete_finished(older_than)

    def get_fiber(self, fiber_id: str) -> FiberRecord | None:
        """A fiber's record; raises FiberNotFoundError if unknown."""
        return self.store.get_fiber(fiber_id)

    def list_fibers(self, status: str | Iterable[str] | None = None) -> list[FiberRecord]:
        """Fiber records, optionally of one status."""
        return self.store.list_fibers(status)

    def active_fibers(self) -> list[str]:
        """Ids of fibers running in this process (a host with any should not hibernate)."""
        return list(self._active)

    @property
    def has_work(self) -> bool:
        """True while fibers run here or recovered fibers wait to be restarted."""
        return bool(self._active) or self._resume_pending or self._resume_task is not None

    async def wait(self, fiber_id: str, timeout: float | None = None) -> FiberRecord:
        """Wait until the fiber's task here ends (restarts included), then return its
        row. Returns at once for a fiber not running here. Raises TimeoutError (the
        fiber keeps running) or FiberNotFoundError."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        self._kick_resume()
        while True:
            remaining = None if deadline is None else max(deadline - loop.time(), 0.0)
            resume = self._resume_task
            active = self._active.get(fiber_id)
            target: asyncio.Future[Any] | None = None
            if active is not None and active.task is not None:
                target = active.task
            elif resume is not None and not resume.done():
                target = resume
            if target is None:
                break
            done, _ = await asyncio.wait({target}, timeout=remaining)
            if not done:
                raise OperationTimeoutError(f"fiber {fiber_id} still running after {timeout}s")
        record = self.store.get_fiber(fiber_id)
        if record is None:
            raise FiberNotFoundError(f"fiber {fiber_id!r} not found")
        return record

    # -- recovery ----------------------------------------------------------------------

    def recover(self, *, restart: bool = True) -> list[FiberRecord]:
        """Mark every ``running`` row not running here ``interrupted``; with
        ``restart``, resume the interrupted fibers (now if a loop is running, else at
        :meth:`start`). Returns the rows just marked. Also prunes finished fibers older
        than ``retention_seconds``."""
        self._check_open()
        orphans = [r for r in self.store.list_fibers("running") if r.id not in self._active]
        if orphans:
            self.store.mark_interrupted([r.id for r in orphans])
            log.info("found %d interrupted fiber(s): %s", len(orphans), [r.id for r in orphans])
        if self.retention_seconds is not None:
            self.store.delete_finished(self.retention_seconds)
        if restart:
            self._resume_pending = True
            self._kick_resume()
        for r in orphans:
            r.status = "interrupted"
        return orphans

    async def start(self) -> list[str]:
        """Run the deferred recovery (call from the first async context after
        construction). Returns the ids restarted. Idempotent."""
        self._kick_resume()
        task = self._resume_task
        if task is None:
            return []
        return await asyncio.shield(task)

    def _kick_resume(self) -> None:
        if not self._resume_pending or self._closed:
            return
        if self._resume_task is not None and not self._resume_task.done():
            return  # a pass is under way; its end starts another one
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop yet (constructor path); start() will do it
        self._resume_pending = False
        task = loop.create_task(self.resume_interrupted(), name="fibers:recover")
        self._resume_task = task

        def _done(t: asyncio.Task[list[str]]) -> None:
            if self._resume_task is t:
                self._resume_task = None
            if not t.cancelled() and t.exception() is not None:
                log.error("fiber recovery failed", exc_info=t.exception())
            self._kick_resume()

        task.add_done_callback(_done)

    async def resume_interrupted(self) -> list[str]:
        """Apply the recovery rule (module docstring) to every interrupted fiber not
        yet handled. Returns the ids restarted."""
        restarted: list[str] = []
        for record in self.store.list_fibers("interrupted"):
            if record.recovery_handled or record.id in self._active or self._closed:
                continue
            if await self._call_hook(record):
                self.store.update_fiber(
                    record.id, recovery_handled=True, expect_status="interrupted"
                )
                continue
            current = self.store.get_fiber(record.id)
            if current is None or current.status != "interrupted" or record.id in self._active:
                continue  # the hook resolved it some other way
            if not callable(getattr(self.host, current.method, None)):
                self.store.update_fiber(
                    current.id,
                    status="failed",
                    error=(
                        f"recovery failed: {type(self.host).__name__} has no method "
                        f"{current.method!r} any more"
                    ),
                    expect_status="interrupted",
                )
                continue
            if current.attempts > current.max_retries:
                self.store.update_fiber(
                    current.id,
                    status="failed",
                    error=(
                        f"interrupted on attempt {current.attempts} and max_retries="
                        f"{current.max_retries} is exhausted"
                        + (f"; last error: {current.error}" if current.error else "")
                    ),
                    expect_status="interrupted",
                )
                continue
            attempt = current.attempts + 1
            updated = self.store.update_fiber(
                current.id, status="running", attempts=attempt, expect_status="interrupted"
            )
            if updated is None:
                continue
            self._start(updated, attempt=attempt, checkpoint=updated.checkpoint, recovered=True)
            restarted.append(current.id)
        return restarted

    async def _call_hook(self, record: FiberRecord) -> bool:
        hook = getattr(self.host, RECOVERY_HOOK, None)
        if not callable(hook):
            return False
        try:
            handled = hook(record)
            if inspect.isawaitable(handled):
                handled = await handled
        except Exception:
            log.exception("%s(%s) raised; applying the default recovery", RECOVERY_HOOK, record.id)
            return False
        return bool(handled)

    # -- lifecycle ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidStateError("fiber manager is closed")

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    async def close(self) -> None:
        """Hibernation/eviction: cancel every fiber task here WITHOUT changing its row
        (it stays ``running``; the next incarnation recovers it). Idempotent. Close
        the manager before the database."""
        if self._closed:
            return
        tasks = self._cancel_tasks()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._active.clear()
        self._resume_task = None

    def stop(self) -> None:
        """:meth:`close` without waiting, for a synchronous close (``Think.close``):
        every fiber task and the recovery pass (the one the constructor started, say)
        are cancelled, rows untouched, so none of them touches the database after it
        was closed. Idempotent."""
        if not self._closed:
            self._cancel_tasks()

    def _cancel_tasks(self) -> list[asyncio.Task[Any]]:
        self._closed = True
        self._resume_pending = False
        tasks: list[asyncio.Task[Any]] = [a.task for a in self._active.values() if a.task]
        if self._resume_task is not None:
            tasks.append(self._resume_task)
        for task in tasks:
            task.cancel()
        return tasks
