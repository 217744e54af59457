"""Background jobs of an agent: async tools (seed 003 §1.5, §4.2).

An async tool's call returns ``{"job_id": ...}`` at once and its work runs as a job in
the agent's :class:`JobRegistry`; the ``check_job`` tool polls it, or a registry
listener pushes its result wherever the user wants it (seed 003 §1.5: polling and
push). :func:`async_tool` makes any coroutine an async tool; a
:class:`~thinkray.runtime.agents.worker.WorkerAgent` in ``async`` mode is one too.
Jobs live here, with fibers and schedules, because they are durable state of the same
kind: rows in the agent's database that a wake resumes
(:class:`~thinkray.runtime.durable.services.DurableServices`).

Async tools on the durable model:

- The call that starts a job is an ordinary durable tool call: its ledger row
  (:mod:`thinkray.runtime.tools.durable`) completes at once with ``{"job_id", ...}``.
  The job row's ``parent`` names that call (``run_id``, ``tool_call_id``, the ledger
  row id ``tool_call_row``, ``session_id``); the job id is ``job-<row id>``.
- Progress: the work calls ``job.report_progress(fraction | dict, message)`` (its
  :class:`JobContext`, also :func:`current_job`); the report is written on the job
  row, shows in ``check_job`` and in the agent's ``get_job`` / ``list_jobs``,
  and goes out as a transient ``data-job-progress`` chunk into the turn running in
  the job's session, if one is (:func:`stream_progress`).
- Cancellation: ``cancel_job`` (the model's tool, :func:`cancel_job_tool`) and the
  remote ``Think.cancel_job`` mark the job ``cancelled`` at once and fire
  its work's abort signal. A result the work returns after that follows the agent's
  ``late_tool_results``: dropped, or kept flagged on the row (``late``); it is never
  heard by listeners, so never pushed into a conversation.
- Aborting the turn that started a job does not cancel the job: a job is meant to
  outlive its turn (the user stops the answer, not the research it launched). A tool
  that wants otherwise says so (``follow_parent=True``); then the turn's abort
  cancels the job like ``cancel_job``.
- A wake finds the dead incarnation's ``running`` jobs and marks them ``interrupted``
  (:meth:`DurableServices.start <thinkray.runtime.durable.services.DurableServices.start>`);
  push listeners hear those outcomes when they subscribe.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from thinkray.runtime.abort import AbortController, AbortError, AbortSignal
from thinkray.runtime.errors import (
    InvalidArgumentError,
    InvalidStateError,
    OperationTimeoutError,
    UnknownJobError,
)
from thinkray.runtime.tools.base import ModelTool, Tool, ToolContext, ToolExecutionError
from thinkray.runtime.tools.durable import LatePolicy, ToolCallLedger
from thinkray.runtime.typed_model import TypedModel
from thinkray.storage.errors import DatabaseClosedError
from thinkray.storage.protocols import JobRecord, JobStore, SessionStore
from thinkray.storage.records import JOB_FINISHED

log = logging.getLogger("thinkray.worker")  # the logger's name predates this module


def dump_output(value: Any) -> Any:
    """A worker output as JSON-ready data (tool results, job results)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return value


# -- jobs (async tools) -------------------------------------------------------------------

JobListener = Callable[[JobRecord], Any]
"""Called with the job on every transition (``running``, then a finished status); may
be async. This is the push half of seed 003 §1.5: the user decides where it goes.
Subscribed with ``progress=True`` it is also called on each progress report (the
status still ``running``)."""

_REGISTRY_ATTR = "_thinkray_jobs"
JOB_PROGRESS_CHUNK = "data-job-progress"
_CURRENT_JOB: contextvars.ContextVar[JobContext | None] = contextvars.ContextVar(
    "thinkray_current_job", default=None
)


def current_job() -> JobContext | None:
    """The :class:`JobContext` of the job whose work is running here (also inside the
    tools of a worker run as an async tool), else None."""
    return _CURRENT_JOB.get()


def _check_progress(progress: Any, message: Any) -> None:
    if isinstance(progress, bool) or not (
        progress is None or isinstance(progress, (int, float, dict))
    ):
        raise InvalidArgumentError(
            f"progress is a fraction in [0, 1], a dict or None, not {type(progress).__name__}"
        )
    if isinstance(progress, (int, float)) and not 0.0 <= float(progress) <= 1.0:
        raise InvalidArgumentError(f"progress fraction {progress!r} is outside [0, 1]")
    if message is not None and not isinstance(message, str):
        raise InvalidArgumentError("a progress message is a string")


@dataclass
class JobContext:
    """What a job's work may know and do: its id, the abort signal (fired by
    :meth:`JobRegistry.cancel`, or by the turn it follows), and progress reports."""

    job_id: str
    signal: AbortSignal
    registry: JobRegistry

    @property
    def record(self) -> JobRecord | None:
        """The job as the registry has it now."""
        return self.registry.get(self.job_id)

    def report_progress(
        self, progress: float | dict[str, Any] | None = None, message: str | None = None
    ) -> bool:
        """Record progress (a fraction in [0, 1] or a dict, and/or a short text) on the
        job row; it shows in ``check_job``/``get_job``/``list_jobs`` and goes out as a
        ``data-job-progress`` chunk into the turn running in the job's session. False
        (nothing written) once the job is no longer running (cancelled, say).

        Raises:
            InvalidArgumentError: a progress that is not a fraction in [0, 1], a dict or
                None, or a message that is not a string.
        """
        return self.registry.report_progress(self.job_id, progress, message)


class JobRegistry:
    """Background jobs of one owner (an agent, or a worker used without one).

    Contract:
    - ``start`` schedules the work and returns its ``running`` record at once; the id
      is an idempotency key (starting an existing id returns that job, nothing new).
      The record's ``parent`` links it to the tool call that started it (``run_id``,
      ``tool_call_id``, the ledger row ``tool_call_row``, ``session_id``).
    - Every transition is written through (when a job store is given) before listeners
      run, so a job reported done is durable. Results must be JSON/msgpack-ready.
    - Progress (:meth:`report_progress`, ``JobContext.report_progress``) is written on
      the running job's row; progress listeners hear it.
    - A job ends ``completed``, ``failed`` (the error text is kept), or ``cancelled``.
      :meth:`cancel` (or the abort of the signal the job follows) marks it ``cancelled``
      at once — written and heard by listeners then — and fires the work's abort signal;
      the work is cooperative (as tools are: it is not killed, ``force=True`` also
      cancels its task). What the work returns after that is a late result: per
      ``late_results`` it is dropped (``discard``, the default) or kept flagged on the
      row (``store``: ``record.late``); it never changes the status and never reaches a
      listener, so it is never pushed into a conversation.
    - Jobs found ``running`` in the database by a new registry belonged to a dead
      incarnation and become ``interrupted`` (workers are re-run from the start by the
      caller, seed 003 §2.2); those records are in :attr:`recovered` and are replayed
      to each listener that subscribes (so a push listener reports them as the jobs'
      outcomes).
    - ``aclose`` (hibernation) stops running jobs and marks them ``interrupted``.
    """

    def __init__(
        self,
        store: JobStore | None = None,
        *,
        listeners: Sequence[JobListener] = (),
        late_results: LatePolicy = "discard",
    ) -> None:
        if late_results not in ("discard", "store"):
            raise InvalidArgumentError(
                f"late_results must be 'discard' or 'store', not {late_results!r}"
            )
        self._store = store
        self.late_results: LatePolicy = late_results
        self._records: dict[str, JobRecord] = {}
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._controllers: dict[str, AbortController] = {}
        self._listeners: list[JobListener] = []
        self._progress_listeners: list[JobListener] = []
        self._closing = False
        self.interrupted = 0
        self.recovered: list[JobRecord] = []
        if self._store is not None:
            running = [r.id for r in self._store.rows("running")]
            self.interrupted = self._store.interrupt_running(
                "interrupted: the agent stopped before the job finished"
            )
            for jid in running:
                rec = self._store.get(jid)
                if rec is not None and rec.status == "interrupted":
                    self.recovered.append(rec)
        for listener in listeners:
            self.subscribe(listener)

    @classmethod
    def for_agent(cls, agent: Any) -> JobRegistry:
        """The registry of ``agent``, created on first use and persisted in the agent's
        database when it has a session store (``agent.store.stores().jobs()``; kept in
        memory only when it has none, or when that store is closed). Late results follow
        the agent's ``late_tool_results``; a Think agent's running turns get the jobs'
        progress as ``data-job-progress`` chunks (see :func:`stream_progress`)."""
        registry = getattr(agent, _REGISTRY_ATTR, None)
        if isinstance(registry, JobRegistry):
            return registry
        jobs: JobStore | None = None
        store = getattr(agent, "store", None)
        if isinstance(store, SessionStore):
            with contextlib.suppress(DatabaseClosedError):
                jobs = store.stores().jobs()
        late: LatePolicy = (
            "store" if getattr(agent, "late_tool_results", None) == "store" else "discard"
        )
        registry = cls(jobs, late_results=late)
        if getattr(agent, "turns", None) is not None:
            registry.subscribe(stream_progress(agent), progress=True, replay=False)
        setattr(agent, _REGISTRY_ATTR, registry)
        return registry

    @staticmethod
    def existing(agent: Any) -> JobRegistry | None:
        """The registry of ``agent`` if one was created, else None (never creates)."""
        registry = getattr(agent, _REGISTRY_ATTR, None)
        return registry if isinstance(registry, JobRegistry) else None

    # -- lifecycle of a job --------------------------------------------------------------

    def start(
        self,
        work: Callable[[Any], Awaitable[Any]],
        *,
        kind: str = "job",
        input: Any = None,
        parent: dict[str, Any] | None = None,
        job_id: str | None = None,
        signal: AbortSignal | None = None,
        with_context: bool = False,
    ) -> JobRecord:
        """Start ``await work(signal)`` in the background (``work(job)`` with the
        job's :class:`JobContext` when ``with_context``; :func:`current_job` gives it
        to any work). ``signal``: the job follows it (its abort cancels the job)."""
        if self._closing:
            raise InvalidStateError("the job registry is closed")
        if job_id is not None:
            existing = self.get(job_id)
            if existing is not None:
                return existing
        jid = job_id or f"job_{uuid.uuid4().hex[:20]}"
        now = time.time()
        record = JobRecord(
            id=jid,
            status="running",
            kind=kind,
            input=input,
            parent={k: v for k, v in (parent or {}).items() if v is not None},
            created_at=now,
            updated_at=now,
        )
        if self._store is not None:
            self._store.insert(record)
        self._records[jid] = record
        controller = AbortController()
        self._controllers[jid] = controller
        context = JobContext(jid, controller.signal, self)
        task = asyncio.ensure_future(self._run(jid, work, context, with_context))
        self._tasks[jid] = task
        self._notify(record)
        # Every abort (cancel, or the followed signal) marks the job cancelled at once.
        controller.signal.add_listener(lambda reason: self._aborted(jid, reason))
        if signal is not None:  # the followed signal's reason is kept
            unfollow = signal.add_listener(controller.abort)
            task.add_done_callback(lambda _: unfollow())
        return record

    async def _run(
        self,
        jid: str,
        work: Callable[[Any], Awaitable[Any]],
        context: JobContext,
        with_context: bool,
    ) -> None:
        _CURRENT_JOB.set(context)  # this task's own context: seen by the work only
        try:
            result = await work(context if with_context else context.signal)
        except AbortError as exc:
            self._finish(jid, "cancelled", error=exc.reason)
        except asyncio.CancelledError:
            if self._closing:
                self._finish(jid, "interrupted", error="interrupted: the agent stopped")
            else:
                self._finish(jid, "cancelled", error="cancelled")
            raise
        except Exception as exc:
            if self._is_cancelled(jid):
                self._late(jid, error=f"{type(exc).__name__}: {exc}")
            else:
                self._finish(jid, "failed", error=f"{type(exc).__name__}: {exc}")
        else:
            if self._is_cancelled(jid):
                self._late(jid, result=result)
            else:
                try:
                    self._finish(jid, "completed", result=dump_output(result))
                except Exception as exc:  # an unstorable result is a failure, not a hang
                    self._finish(jid, "failed", error=f"result could not be stored: {exc}")
        finally:
            self._tasks.pop(jid, None)
            self._controllers.pop(jid, None)

    def _is_cancelled(self, jid: str) -> bool:
        record = self._records.get(jid)
        return record is not None and record.status == "cancelled"

    def _aborted(self, jid: str, reason: str) -> None:
        self._finish(jid, "cancelled", error=reason)

    def _late(self, jid: str, *, result: Any = None, error: str | None = None) -> None:
        """The work of a cancelled job ended anyway: keep or drop what it produced, per
        ``late_results``. Never a transition, never heard by listeners."""
        if self.late_results == "discard":
            log.info("job %s: result after cancellation discarded", jid)
            return
        try:
            value = dump_output(result)
            if self._store is not None:
                stored = self._store.store_late(jid, result=value, error=error)
                if stored is not None:
                    self._records[jid] = stored
                    return
            record = self._records.get(jid)
            if record is not None:
                record.late = {"result": value, "error": error, "at": time.time()}
        except Exception as exc:
            log.warning("job %s: could not store its late result: %s", jid, exc)

    def _finish(
        self, jid: str, status: str, *, result: Any = None, error: str | None = None
    ) -> None:
        record = self._records.get(jid)
        if record is None or record.finished:
            return
        if self._store is not None:
            try:
                stored = self._store.update(jid, status, result=result, error=error)
            except Exception as exc:
                if status == "completed":
                    raise
                log.warning("job %s: could not store %s: %s", jid, status, exc)
                stored = None
            if stored is not None:
                record = stored
        if record.status == "running":
            record.status, record.result, record.error = status, result, error
            record.updated_at = time.time()
        self._records[jid] = record
        self._notify(record)

    def _notify(self, record: JobRecord, *, progress: bool = False) -> None:
        listeners = self._progress_listeners if progress else self._listeners
        for listener in list(listeners):
            _call_listener(listener, record)

    # -- progress ------------------------------------------------------------------------

    def report_progress(
        self,
        job_id: str,
        progress: float | dict[str, Any] | None = None,
        message: str | None = None,
    ) -> bool:
        """Record a running job's progress on its row and tell progress listeners.
        False (nothing written) if the job is not running here.

        Raises:
            InvalidArgumentError: a malformed progress or message.
            InvalidInputError: an unencodable progress (with a job store).
        """
        _check_progress(progress, message)
        record = self._records.get(job_id)
        if record is None or record.finished or job_id not in self._tasks:
            return False
        if self._store is not None:
            stored = self._store.set_progress(job_id, progress, message)
            if stored is None or stored.finished:
                return False
            record = stored
        else:
            record.progress, record.message = progress, message
            record.updated_at = time.time()
        self._records[job_id] = record
        self._notify(record, progress=True)
        return True

    # -- queries and control -------------------------------------------------------------

    def subscribe(
        self, listener: JobListener, *, progress: bool = False, replay: bool = True
    ) -> Callable[[], None]:
        """Push: call ``listener(job)`` on every transition (and on every progress
        report with ``progress=True``). With ``replay`` (the default) it is first called
        with each job this registry found cut off by a dead incarnation (now
        ``interrupted``: :attr:`recovered`), so their outcome is reported too. Returns
        the remover."""
        self._listeners.append(listener)
        if progress:
            self._progress_listeners.append(listener)
        if replay:
            for record in self.recovered:
                _call_listener(listener, record)

        def remove() -> None:
            for listeners in (self._listeners, self._progress_listeners):
                if listener in listeners:
                    listeners.remove(listener)

        return remove

    def get(self, job_id: str) -> JobRecord | None:
        """The job (from memory, else from the job store), or ``None`` if unknown."""
        record = self._records.get(job_id)
        if record is None and self._store is not None:
            record = self._store.get(job_id)
        return record

    def jobs(self, status: str | None = None) -> list[JobRecord]:
        """Jobs oldest first, optionally only those with ``status``.

        Raises:
            InvalidInputError: an unknown status (with a job store).
        """
        if self._store is not None:
            return self._store.rows(status)
        records = sorted(self._records.values(), key=lambda r: (r.created_at, r.id))
        return [r for r in records if status is None or r.status == status]

    @property
    def running(self) -> int:
        """How many jobs' work is running now (a cancelled job's work that has not
        ended yet counts: it is still going)."""
        return len(self._tasks)

    def has_running(self) -> bool:
        """True while a job's work runs: an agent should not hibernate then."""
        return bool(self._tasks)

    async def wait(self, job_id: str, timeout: float | None = None) -> JobRecord:
        """The job once finished; ``TimeoutError`` if it is still running after
        ``timeout`` seconds (the job goes on). A cancelled job is finished at once,
        even while its work winds down."""
        record = self.get(job_id)
        if record is None:
            raise UnknownJobError(f"unknown job {job_id!r}")
        task = self._tasks.get(job_id)
        if task is not None and not record.finished:
            done = asyncio.Event()
            remove = self.subscribe(
                lambda rec: done.set() if rec.id == job_id and rec.finished else None,
                replay=False,
            )
            waiter = asyncio.ensure_future(done.wait())
            try:
                finished, _ = await asyncio.wait(
                    {waiter, task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                remove()
                waiter.cancel()
            if not finished:
                raise OperationTimeoutError(f"job {job_id!r} still running after {timeout}s")
            record = self.get(job_id) or record
        return record

    def cancel(self, job_id: str, reason: str = "cancelled", *, force: bool = False) -> bool:
        """Cancel a running job: it is marked ``cancelled`` with ``reason`` at once
        (written, listeners told) and its work's abort signal fires; with ``force`` its
        task is cancelled too. Whatever the work returns afterwards follows
        ``late_results``. False if the job is not running here (unknown, finished, or
        of another incarnation)."""
        record = self._records.get(job_id)
        controller = self._controllers.get(job_id)
        if record is None or record.finished or controller is None:
            return False
        controller.abort(reason)
        self._finish(job_id, "cancelled", error=reason)  # when the signal was already fired
        if force:
            task = self._tasks.get(job_id)
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        return True

    async def aclose(self) -> None:
        """Stop running jobs (hibernation): they end ``interrupted``."""
        self._closing = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


def _call_listener(listener: JobListener, record: JobRecord) -> None:
    try:
        out = listener(record)
        if inspect.isawaitable(out):
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                if inspect.iscoroutine(out):
                    out.close()
                log.warning("job listener for %s is async but no event loop runs", record.id)
                return
            task = asyncio.ensure_future(out)
            task.add_done_callback(_log_listener_failure)
    except Exception:
        log.exception("job listener failed for %s", record.id)


def job_progress_chunk(record: JobRecord) -> dict[str, Any]:
    """The ``data-job-progress`` chunk for ``record`` (transient: it goes out on the
    stream but is no part of the stored message; the job row is the durable state)."""
    data: dict[str, Any] = {
        "jobId": record.id,
        "status": record.status,
        "kind": record.kind,
        "progress": record.progress,
        "message": record.message,
    }
    for key, field_ in (("tool_call_id", "toolCallId"), ("run_id", "runId")):
        if record.parent.get(key) is not None:
            data[field_] = record.parent[key]
    if record.finished and record.error is not None:
        data["error"] = record.error
    return {"type": JOB_PROGRESS_CHUNK, "id": record.id, "data": data, "transient": True}


def stream_progress(agent: Any) -> JobListener:
    """A progress listener that sends each report (and the job's end) as a
    ``data-job-progress`` chunk into the turn running in the job's session, when one
    is (none: the row alone keeps it). :meth:`JobRegistry.for_agent` subscribes it for
    a Think agent."""

    async def listener(record: JobRecord) -> None:
        if record.status == "running" and record.progress is None and record.message is None:
            return  # the start: the tool's own output says so
        session_id = record.parent.get("session_id")
        turns = getattr(agent, "turns", None)
        if not session_id or turns is None:
            return
        run_id = turns.session_runs.get(session_id)
        run = turns.runs.get(run_id) if run_id else None
        if run is None:
            return
        await run.emit(job_progress_chunk(record))

    return listener


def _log_listener_failure(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("async job listener failed: %s", task.exception())


def _stateless(agent: Any) -> bool:
    # A stateless agent (a WorkerAgent says so with ``stateless = True``) is no owner
    # of jobs: its tools' jobs go to the fallback they were given (the worker's
    # ``jobs``). A class attribute, not an isinstance check: the worker module imports
    # this one. Read on the type so an object answering any attribute is not taken.
    return getattr(type(agent), "stateless", False) is True


def resolve_registry(
    registry: JobRegistry | None, ctx: ToolContext, fallback: JobRegistry | None
) -> JobRegistry:
    """Where a tool call's jobs go: ``registry`` if given, else the calling agent's
    (:meth:`JobRegistry.for_agent`), else ``fallback`` when the caller is a stateless
    worker (or there is none).

    Raises:
        ToolExecutionError: no registry, no calling agent and no fallback.
    """
    if registry is not None:
        return registry
    if ctx.agent is not None and not _stateless(ctx.agent):
        return JobRegistry.for_agent(ctx.agent)
    if fallback is not None:
        return fallback
    if ctx.agent is not None:
        return JobRegistry.for_agent(ctx.agent)
    raise ToolExecutionError("no job registry: pass registry= when there is no owning agent")


class _CheckJobInput(TypedModel):
    model_config = ConfigDict(extra="forbid")
    job_id: str = Field(min_length=1, description="The job_id an async tool returned.")
    wait_seconds: float = Field(
        0.0, ge=0, le=300, description="Wait up to this long for the job to finish."
    )


def check_job_tool(
    registry: JobRegistry | None = None,
    *,
    name: str = "check_job",
    fallback: JobRegistry | None = None,
) -> Tool:
    """The polling half of async tools: status and, once finished, result or error.

    Without ``registry`` it reads the calling agent's registry (the one async tools of
    that agent write to), else ``fallback``.
    """

    async def check(input: _CheckJobInput, ctx: ToolContext) -> dict[str, Any]:
        reg = resolve_registry(registry, ctx, fallback)
        record = reg.get(input.job_id)
        if record is None:
            raise ToolExecutionError(f"unknown job {input.job_id!r}")
        if not record.finished and input.wait_seconds > 0:
            with contextlib.suppress(TimeoutError):
                record = await reg.wait(input.job_id, input.wait_seconds)
        out: dict[str, Any] = {"job_id": record.id, "status": record.status}
        if record.status == "completed":
            out["result"] = record.result
        elif record.status in JOB_FINISHED:
            out["error"] = record.error
        else:
            out["running_for_seconds"] = round(time.time() - record.created_at, 3)
        if record.progress is not None:
            out["progress"] = record.progress
        if record.message is not None:
            out["progress_message"] = record.message
        return out

    return ModelTool(
        name,
        _CheckJobInput,
        check,
        "Check a background job started by an async tool: its status and progress, and "
        "its result or error once finished.",
        wants_context=True,
    )


class _CancelJobInput(TypedModel):
    model_config = ConfigDict(extra="forbid")
    job_id: str = Field(min_length=1, description="The job_id an async tool returned.")
    reason: str = Field("cancelled by the assistant", description="Why it is cancelled.")


def cancel_job_tool(
    registry: JobRegistry | None = None,
    *,
    name: str = "cancel_job",
    fallback: JobRegistry | None = None,
) -> Tool:
    """The model's way to cancel a background job (seed 003 §4.2): the job ends
    ``cancelled`` and its work's abort signal fires. Registry as for
    :func:`check_job_tool`."""

    # async: a cancel fires the job's abort signal, whose waiters live on the loop
    async def cancel(input: _CancelJobInput, ctx: ToolContext) -> dict[str, Any]:
        reg = resolve_registry(registry, ctx, fallback)
        cancelled = reg.cancel(input.job_id, input.reason)
        record = reg.get(input.job_id)
        if record is None:
            raise ToolExecutionError(f"unknown job {input.job_id!r}")
        return {"job_id": record.id, "status": record.status, "cancelled": cancelled}

    return ModelTool(
        name,
        _CancelJobInput,
        cancel,
        "Cancel a running background job started by an async tool.",
        wants_context=True,
    )


def job_parent(ctx: ToolContext) -> dict[str, Any]:
    """How a job started by the tool call ``ctx`` is linked to it: the run, the
    model's tool call id, the ledger row of that call (``tool_call_row``: the call id,
    or ``<id>~<run>`` when a scripted model repeats ids across runs), the session and
    the agent."""
    row = ctx.tool_call_id
    ledger = getattr(ctx.agent, "tool_calls", None)
    if isinstance(ledger, ToolCallLedger):
        row = ledger.record_id(ctx.tool_call_id, ctx.run_id)
    return {
        "run_id": ctx.run_id,
        "tool_call_id": ctx.tool_call_id,
        "tool_call_row": row,
        "session_id": ctx.session_id,
        "agent": getattr(ctx.agent, "agent_name", None) or getattr(ctx.agent, "name", None),
    }


InputT = TypeVar("InputT", bound=BaseModel)


def async_tool(
    name: str,
    input_type: type[InputT],
    work: Callable[[InputT, JobContext], Awaitable[Any]],
    description: str,
    *,
    registry: JobRegistry | None = None,
    follow_parent: bool = False,
) -> Tool:
    """An async (fire-and-forget) tool, seed 003 §1.5: a call starts ``await
    work(input, job)`` as a background job and returns ``{"job_id", "status",
    "note"}`` at once. The work reports progress with ``job.report_progress(...)``
    and should watch ``job.signal`` (fired by a cancel). The call is an ordinary
    durable tool call: its ledger row completes with the job id, and the job row's
    ``parent`` names that call (:func:`job_parent`).

    Aborting the turn that started the job does not cancel the job (it outlives the
    turn, like a worker's async tool) unless ``follow_parent=True``. Jobs go to
    ``registry``, else to the calling agent's registry."""

    # async: starting a job schedules its task on the agent's loop (a plain def tool
    # would run in a thread)
    async def start(input: InputT, ctx: ToolContext) -> dict[str, Any]:
        reg = resolve_registry(registry, ctx, None)
        parent = job_parent(ctx)

        async def run(job: JobContext) -> Any:
            return await work(input, job)

        job = reg.start(
            run,
            kind=name,
            input=input.model_dump(mode="json"),
            parent=parent,
            job_id=f"job-{parent['tool_call_row']}",
            signal=ctx.signal if follow_parent else None,
            with_context=True,
        )
        return {
            "job_id": job.id,
            "status": job.status,
            "note": "running in the background: call check_job with this job_id for the result",
        }

    return ModelTool(name, input_type, start, description, wants_context=True)


__all__ = [
    "JOB_PROGRESS_CHUNK",
    "JobContext",
    "JobListener",
    "JobRegistry",
    "async_tool",
    "cancel_job_tool",
    "check_job_tool",
    "current_job",
    "dump_output",
    "job_parent",
    "job_progress_chunk",
    "resolve_registry",
    "stream_progress",
]
