"""Worker agents (seed 003 §2.2), blocking or async tools of other agents (§1.5).

A :class:`WorkerAgent` is a named one-shot agent: instructions, a model, its own
tools, a typed input and a typed output. Every :meth:`WorkerAgent.run` starts from
nothing but the input — no history, no session, no memory of earlier calls — so it
can be called from a script (``asyncio.run(worker.run(...))``), an API handler, a
cron job, or by another agent as a tool.

Fresh context: ``run`` calls :func:`thinkray.runtime.turn.loop.run_loop` directly with a message
list built from the input, rather than building a throw-away :class:`Think`. The loop
is the one every agent uses (same tool validation, retries, abort), and what a
``Think`` would add — a session store, a turn lock, a recorder, fibers — is state a
worker must not have: with nothing to load there is nothing that could leak from one
call into the next, and a call costs no database at all. Observability is opt-in: given
a ``session_store`` the run is recorded into it as its own (ephemeral) session whose
metadata correlates it with the caller (``parent_run_id``, ``parent_tool_call_id``).

Structured output follows pydantic-ai: for a pydantic ``output_type`` the model gets a
``final_result`` tool whose input schema is the output model. Invalid input to that
tool goes back to the model as a tool error, and so does a plain-text answer (as a
user nudge), until ``max_steps`` is used up; then :class:`WorkerOutputError`.

As a tool (:meth:`WorkerAgent.as_tool`): ``blocking`` awaits the run (the caller's
abort signal is chained, so aborting the parent turn aborts the worker); ``async``
starts a job in a :class:`~thinkray.runtime.durable.jobs.JobRegistry` and returns
``{"job_id": ...}`` at once; the ``check_job`` tool polls it, or a registry listener pushes its result wherever the
user wants it (seed 003 §1.5: polling and push).
:func:`~thinkray.runtime.durable.jobs.async_tool` makes any coroutine an async tool
the same way.

Jobs, async tools and their ``check_job`` / ``cancel_job`` companions live in
:mod:`thinkray.runtime.durable.jobs` (durable state, like fibers and schedules); their
names are re-exported here, where they were first defined.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import re
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from thinkray.runtime.abort import AbortController, AbortError, AbortSignal
from thinkray.runtime.chunks import tool_output_error
from thinkray.runtime.durable.jobs import (  # re-exported: the jobs live in durable.jobs
    JOB_PROGRESS_CHUNK as JOB_PROGRESS_CHUNK,
)
from thinkray.runtime.durable.jobs import (
    JobContext as JobContext,
)
from thinkray.runtime.durable.jobs import (
    JobListener as JobListener,
)
from thinkray.runtime.durable.jobs import (
    JobRegistry,
    cancel_job_tool,
    check_job_tool,
    dump_output,
    job_parent,
    resolve_registry,
)
from thinkray.runtime.durable.jobs import (
    async_tool as async_tool,
)
from thinkray.runtime.durable.jobs import (
    current_job as current_job,
)
from thinkray.runtime.durable.jobs import (
    job_progress_chunk as job_progress_chunk,
)
from thinkray.runtime.durable.jobs import (
    stream_progress as stream_progress,
)
from thinkray.runtime.errors import (
    InvalidArgumentError,
    InvalidTypeError,
    ModelNotConfiguredError,
)
from thinkray.runtime.errors import (
    WorkerDepthError as WorkerDepthError,
)
from thinkray.runtime.errors import (  # re-exported: the errors live in thinkray.runtime.errors
    WorkerError as WorkerError,
)
from thinkray.runtime.errors import (
    WorkerInputError as WorkerInputError,
)
from thinkray.runtime.errors import (
    WorkerOutputError as WorkerOutputError,
)
from thinkray.runtime.errors import (
    WorkerTimeoutError as WorkerTimeoutError,
)
from thinkray.runtime.messages import new_id
from thinkray.runtime.models.base import Model, ModelMessage, TextContent
from thinkray.runtime.tools.base import (
    ModelTool,
    Tool,
    ToolContext,
    ToolInputError,
)
from thinkray.runtime.turn.builder import MessageBuilder
from thinkray.runtime.turn.context import to_model_messages
from thinkray.runtime.turn.loop import LoopChunk, LoopResult, RetryPolicy, run_loop
from thinkray.runtime.turn.persistence import PersistCache, prepare_message
from thinkray.runtime.turn.recorder import Recorder
from thinkray.runtime.typed_model import TypedModel
from thinkray.runtime.usage import Usage

if TYPE_CHECKING:
    from typing_extensions import TypeIs  # typing.TypeIs from Python 3.13

log = logging.getLogger("thinkray.worker")

T = TypeVar("T")

FINAL_RESULT_TOOL = "final_result"
DEFAULT_MAX_DEPTH = 5
ToolMode = Literal["blocking", "async"]
"""``blocking``: the calling turn waits for the worker's output. ``async``: the call
returns ``{"job_id": ...}`` at once and the worker runs as a background job."""

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_NUDGE = (
    "Your answer was not accepted: respond by calling the `final_result` tool with "
    "the result (its input must match the tool's schema). Plain text is not accepted."
)
_FINAL_DESCRIPTION = (
    "The final response which ends this task. Call it exactly once, when you are "
    "done, with input matching this schema."
)


MessagesBuilder = Callable[[Any], Any]
"""``build_messages(input) -> str | list[ModelMessage | dict]`` (may be async): the
worker's prompt for one call, built from the validated input only."""


@dataclass
class WorkerResult(Generic[T]):
    """One run: the validated output and what it cost."""

    output: T
    run_id: str
    steps: int
    usage: Usage
    messages: list[ModelMessage]
    session_id: str | None = None


class _StringInput(TypedModel):
    model_config = ConfigDict(extra="forbid")
    input: str = Field(description="The task input for this worker.")


def _format_errors(exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ())) or "input"
        problems.append(f"{loc}: {err.get('msg')}")
    return "; ".join(problems)


def _is_model(value: Model | Callable[[], Model]) -> TypeIs[Model]:
    # Duck-typed, as the loop uses a model: anything with ``stream``; else a factory.
    return hasattr(value, "stream")


def _check_type(kind: str, value: Any) -> type:
    if value is str or (isinstance(value, type) and issubclass(value, BaseModel)):
        return value
    raise InvalidTypeError(f"{kind} must be str or a pydantic BaseModel subclass, got {value!r}")


class WorkerAgent(Generic[T]):
    """A stateless one-shot agent. See the module docstring for the design.

    ``model`` is a :class:`~thinkray.runtime.models.base.Model` or a zero-argument factory of one.
    ``tools`` may contain other ``WorkerAgent`` instances (used as blocking tools).
    ``persist=True`` records runs into the calling agent's store when the worker runs
    as a tool (a direct ``run`` records only into an explicit ``session_store``).
    """

    stateless: ClassVar[bool] = True
    """No owner of jobs: async tools called by this worker start their jobs in the
    registry they were given, else in ``self.jobs`` (see ``resolve_registry``)."""

    def __init__(
        self,
        name: str,
        *,
        instructions: str,
        model: Model | Callable[[], Model],
        tools: Sequence[Tool | WorkerAgent[Any]] | Mapping[str, Tool] | None = None,
        input_type: type[BaseModel] | type[str] = str,
        output_type: type[BaseModel] | type[str] = str,
        max_steps: int = 8,
        timeout: float | None = None,
        build_messages: MessagesBuilder | None = None,
        description: str | None = None,
        persist: bool = False,
        retry: RetryPolicy | None = None,
        max_depth: int = DEFAULT_MAX_DEPTH,
    ) -> None:
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            raise InvalidArgumentError(
                f"invalid worker name {name!r}: 1-64 letters, digits, '_' or '-' "
                "(it is also the tool name)"
            )
        if not isinstance(max_steps, int) or max_steps < 1:
            raise InvalidArgumentError("max_steps must be an int >= 1")
        if timeout is not None and timeout <= 0:
            raise InvalidArgumentError("timeout must be > 0 seconds")
        self.name = name
        self.instructions = instructions
        if model is None:
            raise ModelNotConfiguredError(
                f"worker {name!r} has no model: pass model= (a Model or a factory of one)"
            )
        self._model = model
        self.input_type = _check_type("input_type", input_type)
        self.output_type = _check_type("output_type", output_type)
        self.max_steps = max_steps
        self.timeout = timeout
        self.build_messages = build_messages
        self.description = description or (instructions.strip().splitlines() or [name])[0]
        self.persist = persist
        self.retry = retry or RetryPolicy()
        self.max_depth = max_depth
        self.tools: dict[str, Tool] = {}
        if isinstance(tools, Mapping):
            self.tools.update(tools)
        else:
            for t in tools or ():
                t = t.as_tool() if isinstance(t, WorkerAgent) else t
                self.tools[t.name] = t
        if self.structured and FINAL_RESULT_TOOL in self.tools:
            raise InvalidArgumentError(
                f"the tool name {FINAL_RESULT_TOOL!r} is reserved for the output"
            )
        self.jobs = JobRegistry()  # used by async tools when there is no owning agent

    def __repr__(self) -> str:
        return f"WorkerAgent({self.name!r})"

    @property
    def structured(self) -> bool:
        """Whether the output is a pydantic model (returned through the reserved
        final-result tool) rather than text."""
        return self.output_type is not str

    def get_model(self) -> Model:
        """The model for a run: the one given, or a fresh one from the factory."""
        model = self._model
        if _is_model(model):
            return model
        return model()

    # -- input ---------------------------------------------------------------------------

    def validate_input(self, input: Any) -> Any:
        """The input as ``input_type``; raises :class:`WorkerInputError` otherwise."""
        if self.input_type is str:
            if not isinstance(input, str):
                raise WorkerInputError(
                    f"worker {self.name!r} takes a string input, got {type(input).__name__}"
                )
            if not input.strip():
                raise WorkerInputError(f"worker {self.name!r}: the input is empty")
            return input
        model_type: type[BaseModel] = self.input_type
        try:
            if isinstance(input, model_type):
                # Instances may come from model_construct or be mutated: check again.
                return model_type.model_validate(input.model_dump())
            if isinstance(input, (str, bytes)):
                return model_type.model_validate_json(input)
            if isinstance(input, BaseModel):
                input = input.model_dump()
            return model_type.model_validate(input)
        except ValidationError as exc:
            raise WorkerInputError(
                f"invalid input for worker {self.name!r}: {_format_errors(exc)}"
            ) from exc

    async def _prompt(self, value: Any) -> list[ModelMessage]:
        if self.build_messages is not None:
            built = self.build_messages(value)
            if inspect.isawaitable(built):
                built = await built
        elif isinstance(value, str):
            built = value
        else:
            built = value.model_dump_json(indent=2)
        if isinstance(built, str):
            messages = [ModelMessage(role="user", content=[TextContent(text=built)])]
        else:
            messages = [
                m if isinstance(m, ModelMessage) else ModelMessage.model_validate(m) for m in built
            ]
        if not messages:
            raise WorkerInputError(f"worker {self.name!r}: build_messages produced no messages")
        return messages

    def _tools_for_run(self) -> dict[str, Tool]:
        tools = dict(self.tools)
        if self.structured:

            def accept(output: BaseModel, ctx: ToolContext) -> str:
                ctx.extras["worker_outputs"].append(output)
                return "Final result received."

            tools[FINAL_RESULT_TOOL] = ModelTool(
                FINAL_RESULT_TOOL,
                self.output_type,
                accept,
                _FINAL_DESCRIPTION,
                wants_context=True,
            )
        return tools

    # -- running -------------------------------------------------------------------------

    async def run(
        self,
        input: Any,
        *,
        signal: AbortSignal | None = None,
        session_store: Any = None,
        parent: Mapping[str, Any] | None = None,
        depth: int = 0,
    ) -> T:
        """Run once on ``input`` (fresh context) and return the validated output."""
        result = await self.run_detailed(
            input, signal=signal, session_store=session_store, parent=parent, depth=depth
        )
        return result.output

    async def run_detailed(
        self,
        input: Any,
        *,
        signal: AbortSignal | None = None,
        session_store: Any = None,
        parent: Mapping[str, Any] | None = None,
        depth: int = 0,
    ) -> WorkerResult[T]:
        """Like :meth:`run`, returning steps, usage, the transcript and the trace session.

        Raises :class:`WorkerInputError` before any model call, :class:`AbortError` when
        ``signal`` fires, :class:`WorkerTimeoutError` after ``timeout``,
        :class:`WorkerOutputError` without a valid output, and the model's
        :class:`~thinkray.runtime.models.base.ModelError` when it fails for good.
        """
        value = self.validate_input(input)
        if depth > self.max_depth:
            raise WorkerDepthError(
                f"worker {self.name!r} nested {depth} deep (max_depth={self.max_depth})"
            )
        prompt = await self._prompt(value)
        model = self.get_model()
        run = self._start_run(value, prompt, signal, session_store, parent, depth)
        try:
            return await self._steps(run, model)
        except AbortError as exc:
            run.status, run.error = "aborted", exc.reason
            self._finalize_aborted(run.recorder, run.builder, exc.reason)
            if run.timed_out:
                run.status = "timeout"
                raise WorkerTimeoutError(exc.reason) from exc
            raise
        except asyncio.CancelledError:
            run.status, run.error = "aborted", "cancelled"
            self._finalize_aborted(run.recorder, run.builder, "cancelled")
            raise
        except WorkerOutputError:
            raise
        except Exception as exc:
            run.status, run.error = "error", f"{type(exc).__name__}: {exc}"
            if run.recorder is not None:
                run.recorder.record({"type": "error", "errorText": run.error})
            raise
        finally:
            self._end_run(run)

    def _start_run(
        self,
        value: Any,
        prompt: list[ModelMessage],
        signal: AbortSignal | None,
        session_store: Any,
        parent: Mapping[str, Any] | None,
        depth: int,
    ) -> _RunState:
        """A run's state: its abort controller following ``signal``, the timeout timer,
        the trace session when a store is given, and the tools' context."""
        run = _RunState(run_id=new_id("wrk"), history=list(prompt))
        controller = run.controller
        if signal is not None:
            # The caller's reason is kept (AbortSignal.follow would say "aborted by parent").
            run.unfollow = signal.add_listener(controller.abort)
        if self.timeout is not None:

            def on_timeout() -> None:
                run.timed_out = True
                controller.abort(f"worker {self.name!r} timed out after {self.timeout}s")

            run.timer = asyncio.get_running_loop().call_later(self.timeout, on_timeout)
        if session_store is not None:
            run.trace = _Trace(session_store, self, run.run_id, dict(parent or {}), value, prompt)
        run.tools = self._tools_for_run()
        run.tool_context = {
            "agent": self,
            "run_id": run.run_id,
            "session_id": run.trace.session_id if run.trace else None,
            "worker": self.name,
            "worker_depth": depth,
            "worker_outputs": run.outputs,
            "session_store": session_store,
        }
        return run

    async def _steps(self, run: _RunState, model: Model) -> WorkerResult[Any]:
        """Model steps until an output is in (text, or a valid ``final_result`` call),
        nudging a structured worker that answered in text, within ``max_steps``."""
        while run.steps < self.max_steps:
            step_text, step_called = await self._step(run, model)
            if run.outputs:
                run.status = "completed"
                return self._result(run.outputs[0], run)
            if step_called:
                break  # the step budget ran out while the model was still calling tools
            if not self.structured:
                run.status = "completed"
                return self._result("".join(step_text), run)
            run.last_problem = "the model answered in text instead of calling final_result"
            if run.steps >= self.max_steps:
                break
            nudge = ModelMessage(role="user", content=[TextContent(text=_NUDGE)])
            run.history.append(nudge)
            if run.trace is not None:
                run.trace.user(_NUDGE)
        run.error = f"worker {self.name!r} produced no valid output within {self.max_steps} steps"
        if run.last_problem:
            run.error += f"; last problem: {run.last_problem}"
        raise WorkerOutputError(run.error)

    async def _step(self, run: _RunState, model: Model) -> tuple[list[str], bool]:
        """One call of the agentic loop (it may take several model steps) into a new
        assistant message; the last step's text and whether that step called a tool."""
        message_id = new_id("msg")
        run.recorder = run.trace.recorder(message_id) if run.trace else None
        builder = run.recorder.builder if run.recorder else MessageBuilder(message_id)
        run.builder = builder
        loop_result = LoopResult()
        gen = run_loop(
            model,
            system=self.instructions,
            messages=run.history,
            tools=run.tools,
            signal=run.controller.signal,
            max_steps=self.max_steps - run.steps,
            message_id=message_id,
            retry=self.retry,
            result=loop_result,
            tool_context=run.tool_context,
        )
        step = await self._consume(run, builder, gen)
        run.steps += loop_result.steps
        run.usage = run.usage + loop_result.usage
        run.history.extend(to_model_messages([builder.snapshot()]))
        if run.trace is not None and run.recorder is not None:
            run.trace.finish_message(run.recorder, {"status": "completed"})
            run.recorder = None
        return step

    async def _consume(
        self, run: _RunState, builder: MessageBuilder, gen: AsyncGenerator[LoopChunk, None]
    ) -> tuple[list[str], bool]:
        """Record the loop's chunks; the last step's text and whether it called a tool.
        Stops at the end of the step that delivered the output, like pydantic-ai."""
        step_text: list[str] = []
        step_called = False
        async with contextlib.aclosing(gen):
            async for chunk in gen:
                if run.recorder is not None:
                    run.recorder.record(chunk)
                else:
                    builder.apply(chunk)
                if chunk["type"] == "text-delta":
                    step_text.append(chunk["delta"])
                elif chunk["type"] == "start-step":
                    step_text, step_called = [], False
                elif chunk["type"] == "tool-input-available":
                    step_called = True
                elif chunk["type"] == "tool-input-error":
                    step_called = True
                    if chunk["toolName"] == FINAL_RESULT_TOOL:
                        run.last_problem = chunk["errorText"]
                elif chunk["type"] == "finish-step" and run.outputs:
                    break
        return step_text, step_called

    def _end_run(self, run: _RunState) -> None:
        """Stop the timer, stop following the caller's signal, and close the trace
        with the run's outcome."""
        if run.timer is not None:
            run.timer.cancel()
        if run.unfollow is not None:
            run.unfollow()
        if run.trace is not None:
            if run.recorder is not None:
                run.trace.finish_message(run.recorder, {"status": run.status})
            run.trace.close(run.status, run.steps, run.usage, run.error)

    def _finalize_aborted(
        self, recorder: Recorder | None, builder: MessageBuilder | None, reason: str
    ) -> None:
        # In-flight tool calls are finalized so the recorded trace is truthful.
        if recorder is None:
            return
        for call_id in recorder.builder.unfinished_tool_calls():
            recorder.record(tool_output_error(call_id, f"aborted: {reason}"))
        recorder.record({"type": "abort", "reason": reason})

    def _result(self, output: Any, run: _RunState) -> WorkerResult[Any]:
        return WorkerResult(
            output=output,
            run_id=run.run_id,
            steps=run.steps,
            usage=run.usage,
            messages=run.history,
            session_id=run.trace.session_id if run.trace else None,
        )

    # -- as a tool -----------------------------------------------------------------------

    def as_tool(
        self,
        mode: ToolMode = "blocking",
        *,
        name: str | None = None,
        description: str | None = None,
        registry: JobRegistry | None = None,
        follow_parent: bool = False,
    ) -> Tool:
        """This worker as a tool for another agent.

        ``async`` mode: jobs go to ``registry``, else to the calling agent's registry
        (:meth:`JobRegistry.for_agent`, persisted in its database), else to
        ``self.jobs``. A job outlives the turn that started it; ``follow_parent=True``
        aborts it with the calling turn instead.
        """
        if mode not in ("blocking", "async"):
            raise InvalidArgumentError(f"mode must be 'blocking' or 'async', got {mode!r}")
        return WorkerTool(
            self,
            mode,
            name=name or self.name,
            description=description,
            registry=registry,
            follow_parent=follow_parent,
        )

    def job_tools(
        self,
        registry: JobRegistry | None = None,
        *,
        name: str | None = None,
        check_name: str = "check_job",
        cancel_name: str | None = "cancel_job",
    ) -> dict[str, Tool]:
        """The async tool and its companions ``check_job`` and ``cancel_job`` (None:
        without it), sharing one registry."""
        start = self.as_tool("async", name=name, registry=registry)
        check = check_job_tool(registry, name=check_name, fallback=self.jobs)
        tools = {start.name: start, check.name: check}
        if cancel_name is not None:
            cancel = cancel_job_tool(registry, name=cancel_name, fallback=self.jobs)
            tools[cancel.name] = cancel
        return tools


class WorkerTool:
    """A :class:`WorkerAgent` behind the :class:`~thinkray.runtime.tools.base.Tool` protocol."""

    def __init__(
        self,
        worker: WorkerAgent[Any],
        mode: ToolMode,
        *,
        name: str,
        description: str | None,
        registry: JobRegistry | None,
        follow_parent: bool,
    ) -> None:
        self.worker = worker
        self.mode = mode
        self.name = name
        self.registry = registry
        self.follow_parent = follow_parent
        base = description or worker.description
        if mode == "async":
            base += (
                " Runs in the background: returns a job_id at once; call check_job with it "
                "to get the result."
            )
        self.description = base
        if worker.input_type is str:
            self._schema_model: type[BaseModel] = _StringInput
        else:
            self._schema_model = worker.input_type
        self._schema = ModelTool(name, self._schema_model, lambda x: x).input_schema

    @property
    def input_schema(self) -> dict[str, Any]:
        """The worker's ``input_type`` schema (``{"input": str}`` for text workers)."""
        return self._schema

    def validate(self, raw_input: Any) -> Any:
        """Parse the model's input into the worker's ``input_type`` (text workers
        take ``{"input": ...}``), then apply the worker's own ``validate_input``.

        Raises:
            ToolInputError: invalid JSON, a schema mismatch, or a rejected input.
        """
        if isinstance(raw_input, str):
            try:
                raw_input = json.loads(raw_input) if raw_input.strip() else {}
            except json.JSONDecodeError as exc:
                raise ToolInputError(f"input is not valid JSON: {exc}") from exc
        try:
            parsed = self._schema_model.model_validate(raw_input or {})
        except ValidationError as exc:
            raise ToolInputError(
                f"invalid input for tool {self.name!r}: {_format_errors(exc)}"
            ) from exc
        value = parsed.input if isinstance(parsed, _StringInput) else parsed
        try:
            return self.worker.validate_input(value)
        except WorkerInputError as exc:
            raise ToolInputError(str(exc)) from exc

    def _trace_store(self, ctx: ToolContext) -> Any:
        if not self.worker.persist:
            return None
        store = ctx.extras.get("session_store")
        if store is None:
            store = getattr(ctx.agent, "store", None)
        return store if hasattr(store, "create_session") else None

    async def execute(self, input: Any, ctx: ToolContext) -> Any:
        """Blocking mode: run the worker (aborted with the call) and return its output.
        Async mode: start it as a job in the registry and return
        ``{"job_id", "status", "note"}`` at once."""
        parent = job_parent(ctx)
        depth = int(ctx.extras.get("worker_depth", -1)) + 1
        store = self._trace_store(ctx)
        if self.mode == "blocking":
            output = await self.worker.run(
                input, signal=ctx.signal, session_store=store, parent=parent, depth=depth
            )
            return dump_output(output)
        registry = resolve_registry(self.registry, ctx, self.worker.jobs)
        worker = self.worker

        async def work(signal: AbortSignal) -> Any:
            output = await worker.run(
                input, signal=signal, session_store=store, parent=parent, depth=depth
            )
            return dump_output(output)

        job = registry.start(
            work,
            kind=f"worker:{worker.name}",
            input=dump_output(input),
            parent=parent,
            job_id=f"job-{parent['tool_call_row']}",
            signal=ctx.signal if self.follow_parent else None,
        )
        return {
            "job_id": job.id,
            "status": job.status,
            "note": "running in the background: call check_job with this job_id for the result",
        }


@dataclass
class _RunState:
    """One run of :meth:`WorkerAgent.run_detailed`, shared by its helpers: what the
    outcome is recorded from (steps, usage, status, error) and what must be undone at
    the end (the timer, the listener on the caller's signal, the open trace message)."""

    run_id: str
    history: list[ModelMessage]
    controller: AbortController = field(default_factory=AbortController)
    unfollow: Callable[[], None] | None = None
    timer: asyncio.TimerHandle | None = None
    timed_out: bool = False
    trace: _Trace | None = None
    tools: dict[str, Tool] = field(default_factory=dict)
    tool_context: dict[str, Any] = field(default_factory=dict)
    outputs: list[Any] = field(default_factory=list)
    steps: int = 0
    usage: Usage = field(default_factory=Usage)
    last_problem: str | None = None
    status: str = "error"
    error: str | None = None
    recorder: Recorder | None = None
    builder: MessageBuilder | None = None


# -- tracing into a session store ---------------------------------------------------------


class _Trace:
    """Records one worker run into a session store as its own ephemeral session."""

    def __init__(
        self,
        store: Any,
        worker: WorkerAgent[Any],
        run_id: str,
        parent: dict[str, Any],
        value: Any,
        prompt: list[ModelMessage],
    ) -> None:
        self.store = store
        self.worker = worker
        self.run_id = run_id
        metadata = {
            "kind": "worker",
            "worker": worker.name,
            "run_id": run_id,
            "ephemeral": True,  # hidden from the caller's session list unless asked for
            "parent_run_id": parent.get("run_id"),
            "parent_tool_call_id": parent.get("tool_call_id"),
            "parent_session_id": parent.get("session_id"),
            "input": dump_output(value),
            "status": "running",
        }
        info = store.create_session(
            f"worker:{worker.name}",
            metadata=metadata,
            parent_session_id=parent.get("session_id"),
        )
        self.session_id: str = info.id
        self.cache = PersistCache()
        self.last_id: str | None = None
        for message in prompt:
            text = "\n".join(c.text for c in message.content if isinstance(c, TextContent))
            if text and message.role in ("user", "system"):
                self.user(text, role=message.role)

    def user(self, text: str, role: str = "user") -> None:
        message = prepare_message(
            {
                "id": new_id("msg"),
                "role": role,
                "metadata": {"worker": self.worker.name},
                "parts": [{"type": "text", "text": text}],
            }
        )
        self.store.append_message(self.session_id, message)
        self.last_id = message["id"]

    def recorder(self, message_id: str) -> Recorder:
        # No chunk log: the parent's chunk-log pruning keeps its own last runs, and the
        # parts already hold everything the worker did.
        return Recorder(
            self.store,
            self.session_id,
            self.run_id,
            message_id,
            parent_id=self.last_id,
            cache=self.cache,
            record_chunks=False,
        )

    def finish_message(self, recorder: Recorder, metadata: dict[str, Any]) -> None:
        try:
            message = recorder.finish(metadata)
            self.last_id = message["id"]
        except Exception:
            log.exception("worker %s: recording run %s failed", self.worker.name, self.run_id)

    def close(self, status: str, steps: int, usage: Usage, error: str | None) -> None:
        try:
            self.store.update_session(
                self.session_id,
                metadata={"status": status, "steps": steps, "error": error},
            )
            totals = {k: v for k, v in usage.to_dict().items() if k != "cost_usd" and v}
            if totals and hasattr(self.store, "add_usage"):
                self.store.add_usage(self.session_id, totals)
        except Exception:
            log.exception("worker %s: closing trace of %s failed", self.worker.name, self.run_id)


__all__ = [
    "FINAL_RESULT_TOOL",
    "JOB_PROGRESS_CHUNK",
    "JobContext",
    "JobListener",
    "JobRegistry",
    "ToolMode",
    "WorkerAgent",
    "WorkerDepthError",
    "WorkerError",
    "WorkerInputError",
    "WorkerOutputError",
    "WorkerResult",
    "WorkerTimeoutError",
    "WorkerTool",
    "async_tool",
    "cancel_job_tool",
    "check_job_tool",
    "current_job",
    "dump_output",
    "job_parent",
    "job_progress_chunk",
    "stream_progress",
]
