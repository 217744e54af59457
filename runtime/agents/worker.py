"""Worker agents (seed 003 §2.2) and async tool jobs (§1.5).

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
starts a job in a :class:`JobRegistry` and returns ``{"job_id": ...}`` at once; the
``check_job`` tool polls it, or a registry listener pushes its result wherever the
user wants it (seed 003 §1.5: polling and push). :func:`async_tool` makes any
coroutine an async tool the same way.

Async tools on the durable model (seed 003 §1.5, §4.2):

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
import json
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from thinkray.runtime.abort import AbortController, AbortError, AbortSignal
from thinkray.runtime.chunks import tool_output_error
from thinkray.runtime.errors import (
    InvalidArgumentError,
    InvalidStateError,
    InvalidTypeError,
    ModelNotConfiguredError,
    OperationTimeoutError,
    UnknownJobError,
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
    ToolExecutionError,
    ToolInputError,
)
from thinkray.runtime.tools.durable import LatePolicy, ToolCallLedger
from thinkray.runtime.turn.builder import MessageBuilder
from thinkray.runtime.turn.context import to_model_messages
from thinkray.runtime.turn.loop import LoopResult, RetryPolicy, run_loop
from thinkray.runtime.turn.persistence import PersistCache, prepare_message
from thinkray.runtime.turn.recorder import Recorder
from thinkray.runtime.usage import Usage
from thinkray.storage.errors import DatabaseClosedError
from thinkray.storage.protocols import JobRecord, JobStore, SessionStore
from thinkray.storage.records import JOB_FINISHED

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


class _StringInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input: str = Field(description="The task input for this worker.")


def _format_errors(exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ())) or "input"
        problems.append(f"{loc}: {err.get('msg')}")
    return "; ".join(problems)


def dump_output(value: Any) -> Any:
    """A worker output as JSON-ready data (tool results, job results)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return value


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
        run_id = new_id("wrk")
        controller = AbortController()
        # The caller's reason is kept (AbortSignal.follow would say "aborted by parent").
        unfollow = signal.add_listener(controller.abort) if signal is not None else None
        timed_out = False
        timer: asyncio.TimerHandle | None = None
        if self.timeout is not None:

            def on_timeout() -> None:
                nonlocal timed_out
                timed_out = True
                controller.abort(f"worker {self.name!r} timed out after {self.timeout}s")

            timer = asyncio.get_running_loop().call_later(self.timeout, on_timeout)

        trace = (
            _Trace(session_store, self, run_id, dict(parent or {}), value, prompt)
            if session_store is not None
            else None
        )
        outputs: list[Any] = []
        tools = self._tools_for_run()
        tool_context = {
            "agent": self,
            "run_id": run_id,
            "session_id": trace.session_id if trace else None,
            "worker": self.name,
            "worker_depth": depth,
            "worker_outputs": outputs,
            "session_store": session_store,
        }
        history = list(prompt)
        steps = 0
        usage = Usage()
        last_problem: str | None = None
        status, error = "error", None
        recorder: Recorder | None = None
        builder: MessageBuilder | None = None
        try:
            while steps < self.max_steps:
                message_id = new_id("msg")
                recorder = trace.recorder(message_id) if trace else None
                builder = recorder.builder if recorder else MessageBuilder(message_id)
                loop_result = LoopResult()
                step_text: list[str] = []
                step_called = False
                gen = run_loop(
                    model,
                    system=self.instructions,
                    messages=history,
                    tools=tools,
                    signal=controller.signal,
                    max_steps=self.max_steps - steps,
                    message_id=message_id,
                    retry=self.retry,
                    result=loop_result,
                    tool_context=tool_context,
                )
                async with contextlib.aclosing(gen):
                    async for chunk in gen:
                        if recorder is not None:
                            recorder.record(chunk)
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
                                last_problem = chunk["errorText"]
                        elif chunk["type"] == "finish-step" and outputs:
                            break  # the output is in: end here, like pydantic-ai
                steps += loop_result.steps
                usage = usage + loop_result.usage
                history.extend(to_model_messages([builder.snapshot()]))
                if trace is not None and recorder is not None:
                    trace.finish_message(recorder, {"status": "completed"})
                    recorder = None
                if outputs:
                    status = "completed"
                    return self._result(outputs[0], run_id, steps, usage, history, trace)
                if step_called:
                    break  # the step budget ran out while the model was still calling tools
                if not self.structured:
                    status = "completed"
                    return self._result("".join(step_text), run_id, steps, usage, history, trace)
                last_problem = "the model answered in text instead of calling final_result"
                if steps >= self.max_steps:
                    break
                nudge = ModelMessage(role="user", content=[TextContent(text=_NUDGE)])
                history.append(nudge)
                if trace is not None:
                    trace.user(_NUDGE)
            error = f"worker {self.name!r} produced no valid output within {self.max_steps} steps"
            if last_problem:
                error += f"; last problem: {last_problem}"
            raise WorkerOutputError(error)
        except AbortError as exc:
            status, error = "aborted", exc.reason
            self._finalize_aborted(recorder, builder, exc.reason)
            if timed_out:
                status = "timeout"
                raise WorkerTimeoutError(exc.reason) from exc
            raise
        except asyncio.CancelledError:
            status, error = "aborted", "cancelled"
            self._finalize_aborted(recorder, builder, "cancelled")
            raise
        except WorkerOutputError:
            raise
        except Exception as exc:
            status, error = "error", f"{type(exc).__name__}: {exc}"
            if recorder is not None:
                recorder.record({"type": "error", "errorText": error})
            raise
        finally:
            if timer is not None:
                timer.cancel()
            if unfollow is not None:
                unfollow()
            if trace is not None:
                if recorder is not None:
                    trace.finish_message(recorder, {"status": status})
                trace.close(status, steps, usage, error)

    def _finalize_aborted(
        self, recorder: Recorder | None, builder: MessageBuilder | None, reason: str
    ) -> None:
        # In-flight tool calls are finalized so the recorded trace is truthful.
        if recorder is None:
            return
        for call_id in recorder.builder.unfinished_tool_calls():
            recorder.record(tool_output_error(call_id, f"aborted: {reason}"))
        recorder.record({"type": "abort", "reason": reason})

    def _result(
        self,
        output: Any,
        run_id: str,
        steps: int,
        usage: Usage,
        history: list[ModelMessage],
        trace: _Trace | None,
    ) -> WorkerResult[Any]:
        return WorkerResult(
            output=output,
            run_id=run_id,
            steps=steps,
            usage=usage,
            messages=history,
            session_id=trace.session_id if trace else None,
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
        registry = _resolve_registry(self.registry, ctx, self.worker.jobs)
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


def _resolve_registry(
    registry: JobRegistry | None, ctx: ToolContext, fallback: JobRegistry | None
) -> JobRegistry:
    if registry is not None:
        return registry
    if ctx.agent is not None and not isinstance(ctx.agent, WorkerAgent):
        return JobRegistry.for_agent(ctx.agent)
    if fallback is not None:
        return fallback
    if ctx.agent is not None:
        return JobRegistry.for_agent(ctx.agent)
    raise ToolExecutionError("no job registry: pass registry= when there is no owning agent")


class _CheckJobInput(BaseModel):
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
        reg = _resolve_registry(registry, ctx, fallback)
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


class _CancelJobInput(BaseModel):
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

    def cancel(input: _CancelJobInput, ctx: ToolContext) -> dict[str, Any]:
        reg = _resolve_registry(registry, ctx, fallback)
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

    def start(input: InputT, ctx: ToolContext) -> dict[str, Any]:
        reg = _resolve_registry(registry, ctx, None)
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
