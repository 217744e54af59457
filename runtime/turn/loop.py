"""The agentic loop: model steps and tool calls until done, as UI stream chunks.

One universal loop (seed 002 "Streaming and layering"): assemble, call the model,
emit chunks, validate and execute tool calls, loop until no tool calls, the step
limit, abort or error. It knows nothing about storage or transport; the caller
(``Think``) records and relays what it yields.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

from thinkray.runtime.abort import AbortError, AbortSignal, abortable
from thinkray.runtime.chunks import (
    LoopChunk,
    ReasoningEndChunk,
    ToolInputAvailableChunk,
    ToolInputErrorChunk,
    ToolOutputAvailableChunk,
    ToolOutputDeniedChunk,
    ToolOutputErrorChunk,
    tool_output_available,
    tool_output_error,
)
from thinkray.runtime.models.base import (
    Content,
    FinishReason,
    Model,
    ModelError,
    ModelEvent,
    ModelMessage,
    ModelRequest,
    ReasoningContent,
    ReasoningEnd,
    TextContent,
    ToolCall,
    ToolCallContent,
    ToolResultContent,
)
from thinkray.runtime.observability.tracing import TurnTrace
from thinkray.runtime.tools.base import Tool, ToolContext, ToolInputError, run_tool, tool_spec
from thinkray.runtime.turn.context import user_model_messages
from thinkray.runtime.usage import Usage

log = logging.getLogger("thinkray.loop")

_Call = tuple[str, str, Any, str | None, Any]
"""A tool call of the step: ``(tool_call_id, tool_name, input, input_error, raw_input)``
(``raw_input``: the model's arguments as parsed JSON, what is stored)."""

_ResultChunk = ToolOutputAvailableChunk | ToolOutputErrorChunk | ToolOutputDeniedChunk

TOOL_OUTCOMES = {
    "tool-output-available": "ok",
    "tool-output-error": "error",
    "tool-output-denied": "denied",
}
"""A tool call's outcome (metrics and spans) by its result chunk's type."""


@dataclass
class RetryPolicy:
    """Transient model failures (overload, rate limit, 5xx) are retried with
    exponential backoff, but only while the failing step has emitted nothing."""

    max_retries: int = 3
    base_delay: float = 0.5
    max_delay: float = 20.0

    def delay(self, attempt: int, error: ModelError) -> float:
        """Seconds to wait before retry ``attempt`` (1-based): the provider's
        ``retry_after`` when it sent one, else ``base_delay * 2**(attempt-1)`` with
        ±20% jitter; never more than ``max_delay``."""
        if error.retry_after is not None:
            return min(self.max_delay, max(0.0, error.retry_after))
        return min(self.max_delay, self.base_delay * (2 ** (attempt - 1))) * (
            0.8 + 0.4 * random.random()
        )


@dataclass(frozen=True)
class ToolDenial:
    """A permission check's "no". ``reason`` is the call's error result for the model.

    ``by_user`` marks a refusal a human gave (or an approval nobody answered): the call
    ends as the AI SDK's ``tool-output-denied`` instead of ``tool-output-error``.
    """

    reason: str
    by_user: bool = False


PermissionCheck = Callable[[str, Any, str], Awaitable["str | ToolDenial | None"]]
"""``(tool_name, input, tool_call_id)`` -> ``None`` to allow; a reason string (an
error result) or a :class:`ToolDenial` to refuse."""


ToolExecutor = Callable[[Tool, Any, ToolContext, Any], Awaitable[Any]]
"""``(tool, validated_input, ctx, raw_input)`` -> the call's output: how a permitted,
valid call is executed (default :func:`run_tool`; an agent's durable tool-call ledger
records the call and runs it or waits for its executor). Raises like ``run_tool``."""


@dataclass
class LoopHooks:
    """Callbacks of :func:`run_loop`: ``on_step_finish(step, usage, finish_reason)``
    after every step (``"error"`` for a failed step that was billed),
    ``on_retry(attempt, error, delay)`` before a retry wait,
    ``check_permission`` before each tool call and ``execute_tool`` to run one;
    ``on_model_call(outcome)`` after each model call (``ok``, ``aborted`` or ``error``:
    retries are calls) and ``on_tool_outcome(tool_name, outcome)`` as each tool call ends (``ok``,
    ``error`` or ``denied``). ``trace``: the turn's spans, while tracing is on (a
    ``chat`` span per model call and an ``execute_tool`` span per tool call).
    ``record_call(tool, tool_call_id, input)`` as soon as the model produced a valid call,
    before its ``tool-input-available`` chunk is yielded (the turn writes the call's
    row with its next batch, and shows no consumer a call before that batch is
    durable). ``calls_decided()`` once a step's model call ended with tool calls,
    before any of them is checked or run (the turn commits the step's calls there,
    in one write, and releases their chunks)."""

    on_step_finish: Callable[[int, Usage, str], Any] | None = None
    on_retry: Callable[[int, ModelError, float], Any] | None = None
    check_permission: PermissionCheck | None = None
    execute_tool: ToolExecutor | None = None
    on_model_call: Callable[[str], Any] | None = None
    on_tool_outcome: Callable[[str, str], Any] | None = None
    trace: TurnTrace | None = None
    record_call: Callable[[Tool, str, Any], Any] | None = None
    calls_decided: Callable[[], Awaitable[Any]] | None = None
    # ``take_steered()`` at a step boundary the loop goes on from: user messages that
    # joined the turn meanwhile (the ``steer`` busy policy). Each is yielded as a
    # ``data-steer`` chunk and read by the model before its next call.
    take_steered: Callable[[], list[dict[str, Any]]] | None = None


@dataclass
class LoopResult:
    """Filled in by :func:`run_loop` as it goes: steps run, the last finish reason and
    the usage summed over the steps (kept when the loop raises)."""

    steps: int = 0
    finish_reason: FinishReason = "stop"
    usage: Usage = field(default_factory=Usage)


async def run_loop(
    model: Model,
    *,
    system: str,
    messages: list[ModelMessage],
    tools: dict[str, Tool],
    signal: AbortSignal,
    max_steps: int = 10,
    message_id: str | None = None,
    retry: RetryPolicy | None = None,
    hooks: LoopHooks | None = None,
    result: LoopResult | None = None,
    tool_context: dict[str, Any] | None = None,
    request_options: dict[str, Any] | None = None,
) -> AsyncGenerator[LoopChunk, None]:
    """Yield UI chunks for one assistant turn. Raises AbortError or ModelError."""
    retry = retry or RetryPolicy()
    hooks = hooks or LoopHooks()
    result = result if result is not None else LoopResult()
    history = list(messages)
    specs = [tool_spec(t) for t in tools.values()]
    yield {"type": "start", "messageId": message_id} if message_id else {"type": "start"}

    for step in range(max_steps):
        request = ModelRequest(
            system=system, messages=history, tools=specs, **(request_options or {})
        )
        yield {"type": "start-step"}
        st = _StepState()
        attempt = 0
        trace = hooks.trace
        # The model call, retried while it fails transiently before emitting anything.
        # Kept inline (no nested generator) so that closing this generator closes the
        # model stream and ends the call's span and metric at once.
        while True:
            st.emitted = False
            chat_span = trace.chat_start(model, step, attempt, request) if trace else None
            chat_error: BaseException | None = None
            call_started = time.perf_counter()
            try:
                async for ev in abortable(model.stream(request), signal):
                    if not st.emitted and trace is not None:
                        trace.chat_first_chunk(chat_span, call_started)
                    st.emitted = True
                    chunk = st.on_event(ev, tools, hooks, chat_span)
                    if chunk is not None:
                        yield chunk
                break
            except BaseException as exc:
                chat_error = exc
                delay = _retry_delay(exc, st, attempt, retry, step, result, hooks)
                if delay is None:
                    raise
                attempt += 1
            finally:
                _end_model_call(hooks, chat_span, chat_error, st)
            await _sleep_or_abort(delay, signal)

        _end_step(step, st, hooks, result, history)
        if st.calls:
            if hooks.calls_decided is not None:
                await hooks.calls_decided()
            tool_results: list[ToolResultContent] = []
            denials: dict[str, str] = {}  # call id -> reason, for tool-output-denied
            async for out in _execute_calls(st.calls, tools, signal, tool_context, hooks, denials):
                tool_results.append(_tool_result(out, st.calls, denials))
                yield out
            history.append(
                ModelMessage(role="tool", content=_in_call_order(tool_results, st.calls))
            )
        yield {"type": "finish-step"}
        result.finish_reason = st.finish_reason
        steered = _steered(hooks, st, step + 1 < max_steps)
        for message in steered:
            steer = {"type": "data-steer", "id": message["id"], "data": {"message": message}}
            yield cast("LoopChunk", steer)  # a data chunk: the loop's one
            history.extend(user_model_messages(message))
        if steered:
            continue
        if not st.calls or st.finish_reason not in ("tool-calls", "stop", "other"):
            break
    yield {"type": "finish", "finishReason": result.finish_reason}


def _end_step(
    step: int, st: _StepState, hooks: LoopHooks, result: LoopResult, history: list[ModelMessage]
) -> None:
    """A step's model call is over: count it and its usage, tell the hook, and put the
    assistant's message into the history the next call reads."""
    result.steps = step + 1
    result.usage = result.usage + st.usage
    if hooks.on_step_finish:
        hooks.on_step_finish(step, st.usage, st.finish_reason)
    if st.assistant_content:
        history.append(ModelMessage(role="assistant", content=st.assistant_content))


def _steered(hooks: LoopHooks, st: _StepState, more_steps: bool) -> list[dict[str, Any]]:
    """Messages that join the turn at this boundary: taken only when another model
    call may follow (a step that ended with tool calls, or with the model done), so a
    message taken is always read; otherwise they wait for a turn of their own."""
    if hooks.take_steered is None or not more_steps:
        return []
    if st.finish_reason not in ("tool-calls", "stop", "other"):
        return []
    return list(hooks.take_steered())


class _StepState:
    """What one step gathers from the model's stream: the assistant message for the
    history, the tool calls to run, the finish reason and usage."""

    def __init__(self) -> None:
        self.assistant_content: list[Content] = []
        self.calls: list[_Call] = []
        self.finish_reason: FinishReason = "stop"
        self.usage = Usage()
        self.emitted = False
        self._text: dict[str, list[str]] = {}
        self._reasoning: dict[str, list[str]] = {}

    def on_event(
        self, ev: ModelEvent, tools: dict[str, Tool], hooks: LoopHooks, chat_span: Any
    ) -> LoopChunk | None:
        """Fold ``ev`` into the step; the chunk to yield for it, or None."""
        # A tagged union: ``ev.type ==`` narrows ``ev`` (most frequent first).
        if ev.type == "text-delta":
            self._text[ev.id].append(ev.delta)
            return {"type": "text-delta", "id": ev.id, "delta": ev.delta}
        if ev.type == "reasoning-delta":
            self._reasoning[ev.id].append(ev.delta)
            return {"type": "reasoning-delta", "id": ev.id, "delta": ev.delta}
        if ev.type == "tool-input-delta":
            return {"type": "tool-input-delta", "toolCallId": ev.id, "inputTextDelta": ev.delta}
        if ev.type == "text-start":
            self._text[ev.id] = []
            return {"type": "text-start", "id": ev.id}
        if ev.type == "text-end":
            self.assistant_content.append(TextContent(text="".join(self._text[ev.id])))
            return {"type": "text-end", "id": ev.id}
        if ev.type == "reasoning-start":
            self._reasoning[ev.id] = []
            return {"type": "reasoning-start", "id": ev.id}
        if ev.type == "reasoning-end":
            self.assistant_content.append(
                ReasoningContent(
                    text="".join(self._reasoning.get(ev.id, ())),
                    signature=ev.signature,
                    redacted_data=ev.redacted_data,
                )
            )
            return _reasoning_end(ev)
        if ev.type == "tool-input-start":
            return {
                "type": "tool-input-start",
                "toolCallId": ev.id,
                "toolName": ev.tool_name,
                "dynamic": True,
            }
        if ev.type == "tool-call":
            return self._on_tool_call(ev, tools, hooks)
        if ev.type == "step-finish":
            self.finish_reason = ev.finish_reason
            self.usage = ev.usage
            if hooks.trace is not None:
                hooks.trace.chat_response(chat_span, ev.provider_metadata)
        return None

    def _on_tool_call(
        self, ev: ToolCall, tools: dict[str, Tool], hooks: LoopHooks
    ) -> ToolInputAvailableChunk | ToolInputErrorChunk:
        call_chunk, call = _validate_call(ev, tools)
        self.calls.append(call)
        # The model is shown the arguments it produced (the chunk's parsed JSON, as
        # stored), never the validated object the tool runs with: that one has
        # defaults filled in and is no JSON.
        self.assistant_content.append(
            ToolCallContent(tool_call_id=call[0], tool_name=call[1], input=call_chunk["input"])
        )
        # Recorded before the chunk is yielded: no consumer sees a call a crash would erase.
        if hooks.record_call is not None and call[3] is None:
            hooks.record_call(tools[call[1]], call[0], call_chunk["input"])
        return call_chunk


def _retry_delay(
    exc: BaseException,
    st: _StepState,
    attempt: int,
    retry: RetryPolicy,
    step: int,
    result: LoopResult,
    hooks: LoopHooks,
) -> float | None:
    """Seconds to wait before retrying a failed model call, or None to give up (the
    caller re-raises ``exc``)."""
    if not isinstance(exc, ModelError):
        return None
    if not exc.transient or st.emitted or attempt >= retry.max_retries:
        if exc.usage is not None:
            # The broken step was billed for what it read: record that
            # usage (its message keeps the partial output), never zero.
            result.usage = result.usage + exc.usage
            if hooks.on_step_finish:
                hooks.on_step_finish(step, exc.usage, "error")
        return None
    delay = retry.delay(attempt + 1, exc)
    if hooks.on_retry:
        hooks.on_retry(attempt + 1, exc, delay)
    return delay


def _end_model_call(
    hooks: LoopHooks, chat_span: Any, chat_error: BaseException | None, st: _StepState
) -> None:
    """A model call's metric and the end of its span, however the call ended."""
    outcome = _call_outcome(chat_error)
    if hooks.on_model_call is not None:
        hooks.on_model_call(outcome)
    if hooks.trace is not None:
        hooks.trace.chat_end(
            chat_span,
            outcome=outcome,
            finish_reason=st.finish_reason,
            usage=getattr(chat_error, "usage", None) if chat_error else st.usage,
            error=chat_error,
            output=st.assistant_content,
        )


def _tool_result(
    chunk: _ResultChunk, calls: list[_Call], denials: dict[str, str]
) -> ToolResultContent:
    """What the model reads for a call's result chunk."""
    call_id = chunk["toolCallId"]
    name = _name_of(calls, call_id)
    if chunk["type"] == "tool-output-available":
        return ToolResultContent(tool_call_id=call_id, tool_name=name, output=chunk["output"])
    if chunk["type"] == "tool-output-error":
        return ToolResultContent(
            tool_call_id=call_id, tool_name=name, output=chunk["errorText"], is_error=True
        )
    return ToolResultContent(
        tool_call_id=call_id,
        tool_name=name,
        output=denials.get(call_id, "denied"),
        is_error=True,
    )


def _in_call_order(results: list[ToolResultContent], calls: list[_Call]) -> list[ToolResultContent]:
    # Keep results in call order for providers that care.
    order = {c[0]: i for i, c in enumerate(calls)}
    results.sort(key=lambda r: order.get(r.tool_call_id, 0))
    return results


def _call_outcome(error: BaseException | None) -> str:
    """A model call's outcome for metrics and spans: ok, aborted (the turn was aborted
    or its consumer went away) or error."""
    if error is None:
        return "ok"
    if isinstance(error, AbortError | GeneratorExit | asyncio.CancelledError):
        return "aborted"
    return "error"


def _reasoning_end(ev: ReasoningEnd) -> ReasoningEndChunk:
    chunk: ReasoningEndChunk = {"type": "reasoning-end", "id": ev.id}
    meta = {}
    if ev.signature:
        meta["signature"] = ev.signature
    if ev.redacted_data:
        meta["redactedData"] = ev.redacted_data
    if meta:
        chunk["providerMetadata"] = {"anthropic": meta}
    return chunk


def _name_of(calls: list[_Call], call_id: str) -> str:
    for c in calls:
        if c[0] == call_id:
            return c[1]
    return "unknown"


def _validate_call(
    ev: ToolCall, tools: dict[str, Tool]
) -> tuple[ToolInputAvailableChunk | ToolInputErrorChunk, _Call]:
    raw = ev.input
    try:
        parsed = json.loads(raw) if raw and raw.strip() else {}
    except json.JSONDecodeError:
        parsed = raw
    t = tools.get(ev.tool_name)
    error: str | None = None
    value: Any = parsed
    if t is None:
        error = f"unknown tool {ev.tool_name!r}; available: {', '.join(sorted(tools)) or 'none'}"
    else:
        try:
            value = t.validate(parsed)
        except ToolInputError as exc:
            error = str(exc)
    if error is not None:
        error_chunk: ToolInputErrorChunk = {
            "type": "tool-input-error",
            "toolCallId": ev.tool_call_id,
            "toolName": ev.tool_name,
            "input": parsed,
            "errorText": error,
            "dynamic": True,
        }
        return error_chunk, (ev.tool_call_id, ev.tool_name, parsed, error, parsed)
    chunk: ToolInputAvailableChunk = {
        "type": "tool-input-available",
        "toolCallId": ev.tool_call_id,
        "toolName": ev.tool_name,
        "input": parsed,
        "dynamic": True,
    }
    return chunk, (ev.tool_call_id, ev.tool_name, value, None, parsed)


async def _execute_calls(
    calls: list[_Call],
    tools: dict[str, Tool],
    signal: AbortSignal,
    tool_context: dict[str, Any] | None,
    hooks: LoopHooks,
    denials: dict[str, str],
) -> AsyncIterator[_ResultChunk]:
    """Run valid calls concurrently; yield each result as it completes. A call refused
    with ``ToolDenial(by_user=True)`` yields ``tool-output-denied`` and leaves its
    reason in ``denials`` (the chunk has no room for it; the model still reads it)."""
    queue: asyncio.Queue[_ResultChunk] = asyncio.Queue()
    ctx_extra = dict(tool_context or {})

    execute = hooks.execute_tool or _run_tool

    async def outcome_of(
        call_id: str, name: str, value: Any, input_error: str | None, raw_input: Any
    ) -> _ResultChunk:
        if input_error is not None:
            # The model sees the validation error as this call's result; the tool never ran.
            return tool_output_error(call_id, input_error)
        if hooks.check_permission is not None:
            try:
                denied = await hooks.check_permission(name, value, call_id)
            except AbortError:
                return tool_output_error(call_id, f"aborted: {signal.reason or 'aborted'}")
            except Exception as exc:  # a broken hook must not hang the turn: refuse the call
                log.exception("permission check for %s failed", name)
                denied = f"permission check failed: {type(exc).__name__}: {exc}"
            if isinstance(denied, ToolDenial) and denied.by_user:
                denials[call_id] = denied.reason
                return {"type": "tool-output-denied", "toolCallId": call_id}
            if denied:
                reason = denied.reason if isinstance(denied, ToolDenial) else denied
                return tool_output_error(call_id, reason)
        ctx = ToolContext(
            tool_call_id=call_id,
            tool_name=name,
            signal=signal,
            session_id=ctx_extra.get("session_id"),
            run_id=ctx_extra.get("run_id"),
            agent=ctx_extra.get("agent"),
            extras=ctx_extra,
        )
        try:
            output = await execute(tools[name], value, ctx, raw_input)
        except AbortError:
            return tool_output_error(call_id, f"aborted: {signal.reason or 'aborted'}")
        except Exception as exc:  # any tool failure is a result for the model
            return tool_output_error(call_id, f"{type(exc).__name__}: {exc}")
        return tool_output_available(call_id, output)

    async def one(
        call_id: str, name: str, value: Any, input_error: str | None, raw_input: Any
    ) -> None:
        # Each call runs in its own task: its execute_tool span is current there, so a
        # tool that calls a sub-agent or the bridge carries it across the actor boundary.
        trace = hooks.trace
        if trace is None:
            chunk = await outcome_of(call_id, name, value, input_error, raw_input)
        else:
            with trace.tool(name, call_id, raw_input) as tool_span:
                chunk = await outcome_of(call_id, name, value, input_error, raw_input)
                error = chunk.get("errorText") or denials.get(call_id)
                tool_span.outcome(
                    TOOL_OUTCOMES[chunk["type"]], chunk.get("output"), str(error) if error else None
                )
        if hooks.on_tool_outcome is not None:
            hooks.on_tool_outcome(name, TOOL_OUTCOMES[chunk["type"]])
        await queue.put(chunk)

    tasks = [asyncio.ensure_future(one(*c)) for c in calls]
    try:
        for _ in tasks:
            yield await queue.get()
    finally:
        for task in tasks:
            task.cancel()
    signal.throw_if_aborted()


async def _run_tool(t: Tool, value: Any, ctx: ToolContext, raw_input: Any) -> Any:
    return await run_tool(t, value, ctx)


async def _sleep_or_abort(delay: float, signal: AbortSignal) -> None:
    if delay <= 0:
        return
    try:
        await asyncio.wait_for(signal.wait(), timeout=delay)
    except TimeoutError:
        return
    raise AbortError(signal.reason or "aborted")
