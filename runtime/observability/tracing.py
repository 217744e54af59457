"""Traces: OpenTelemetry spans following the GenAI semantic conventions.

Spans a turn produces (names and attributes from the conventions' ``gen_ai.*``
registry; thinkray's own under ``thinkray.*``)::

    invoke_agent {agent}          one per turn (gen_ai.conversation.id = session id)
      chat {model}                one per model call, retries included (kind CLIENT)
      execute_tool {tool}         one per tool call, errors recorded
        thinkray.delegate         the orchestrator hands a task to a sub-agent
          invoke_agent {sub}      ... whose turn continues the trace in its own actor
        thinkray.bridge           a call into the shared workspace's bridge actor
      thinkray.compaction         a history compaction inside the turn
    thinkray.wake                 an agent woken for a call (in the caller's trace)
    thinkray.hibernate            an agent put to sleep

Only the OpenTelemetry *API* is imported (a light dependency). Nothing is recorded
until a tracer provider is installed — by the application, by
:func:`thinkray.runtime.observability.setup.configure_from_env`, or in each actor
process from the same environment. While none is, every helper here returns at the
first line (``enabled()`` is one global lookup and an ``isinstance``): tracing off costs
nothing measurable (``tests/bench/bench_tracing.py``).

Crossing actors: :func:`inject` puts the current span context into a small dict of
W3C ``traceparent``/``tracestate`` headers, which travels with the Ray call;
:func:`attached` makes it current on the other side, so a sub-agent's spans are
children of the orchestrator's tool call and a turn started through a handle
continues its caller's trace.

Message contents (prompts, completions, tool arguments and results) are recorded only
when the user opts in, as the conventions ask: ``capture_content(True)`` or the
environment variable ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``.

Bad input never breaks a turn: an attribute value OpenTelemetry cannot carry (a dict,
an object) is dropped — and counted in :data:`dropped_attributes` — not raised, and a
failing span processor or exporter is isolated by the SDK and by
:class:`thinkray.runtime.observability.exporter.BoundedSpanProcessor`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import (
    NoOpTracerProvider,
    ProxyTracerProvider,
    Span,
    SpanKind,
    Status,
    StatusCode,
)
from thinkray.runtime.observability.context import ROOT_RUN_HEADER, inherited_root, root_run

if TYPE_CHECKING:
    from thinkray.runtime.usage import Usage

__all__ = [
    "CONTENT_ENV",
    "TurnTrace",
    "attached",
    "capture_content",
    "current_ids",
    "enabled",
    "extract",
    "inject",
    "safe_attributes",
    "set_attributes",
    "span",
    "start_span",
]

log = logging.getLogger("thinkray.tracing")

TRACER_NAME = "thinkray"
CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
MAX_CONTENT_CHARS = 16_384
"""A recorded message or tool payload is cut to this many characters (opt-in content
must not turn one span into megabytes)."""

dropped_attributes = 0
"""Attribute values dropped because OpenTelemetry cannot carry them (this process)."""

_enabled = False  # sticky: a global provider, once installed, stays (set once)
_forced_off = os.environ.get("THINKRAY_TRACING", "").lower() in ("0", "false", "off")
_capture: bool | None = None
_provider: trace.TracerProvider | None = None  # set_tracer_provider's, over the global
_tracer_cache: trace.Tracer | None = None


def enabled() -> bool:
    """Whether spans are recorded: a real tracer provider is installed (thinkray's own,
    :func:`set_tracer_provider`, or OpenTelemetry's global one) and tracing was not
    turned off (``THINKRAY_TRACING=0``)."""
    global _enabled
    if _enabled:
        return True
    if _forced_off:
        return False
    provider = trace.get_tracer_provider()
    if isinstance(provider, ProxyTracerProvider | NoOpTracerProvider):
        return False
    _enabled = True
    return True


def set_tracer_provider(provider: trace.TracerProvider | None) -> None:
    """Send thinkray's spans to ``provider`` instead of OpenTelemetry's global one
    (which the API lets a process set only once); None goes back to the global one.
    For tests and for embedding thinkray beside an application with its own."""
    global _provider, _enabled, _tracer_cache
    _provider = provider
    _tracer_cache = None
    _enabled = provider is not None and not _forced_off


def _tracer() -> trace.Tracer:
    global _tracer_cache
    if _tracer_cache is None:
        _tracer_cache = (_provider or trace.get_tracer_provider()).get_tracer(TRACER_NAME)
    return _tracer_cache


def capture_content(on: bool | None = None) -> bool:
    """Whether message contents go into spans; ``on`` sets it for this process (None:
    leave it). Default: the ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``
    environment variable, off unless ``true``."""
    global _capture
    if on is not None:
        _capture = on
    if _capture is None:
        _capture = os.environ.get(CONTENT_ENV, "").strip().lower() in ("true", "1", "yes")
    return _capture


# -- attributes -----------------------------------------------------------------------


def _valid(value: Any) -> bool:
    if isinstance(value, str | bool | int | float):
        return True
    if isinstance(value, list | tuple):
        kinds = {type(v) for v in value}
        return len(kinds) <= 1 and all(isinstance(v, str | bool | int | float) for v in value)
    return False


def safe_attributes(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """``attributes`` without the values OpenTelemetry cannot carry (None is skipped
    quietly; anything else invalid is dropped and counted in
    :data:`dropped_attributes`)."""
    global dropped_attributes
    out: dict[str, Any] = {}
    if not attributes:
        return out
    for key, value in attributes.items():
        if value is None:
            continue
        if _valid(value):
            out[key] = list(value) if isinstance(value, tuple) else value
        else:
            dropped_attributes += 1
            log.debug("span attribute %s dropped: %s is not serializable", key, type(value))
    return out


def set_attributes(target: Span | None, attributes: Mapping[str, Any]) -> None:
    """Set what is valid of ``attributes`` on ``target`` (None: nothing). Never raises."""
    if target is None:
        return
    try:
        target.set_attributes(safe_attributes(attributes))
    except Exception:  # a broken span implementation loses the attribute, not the turn
        log.debug("setting span attributes failed", exc_info=True)


def _content(value: Any) -> str:
    """A payload as JSON text (its repr if it is no JSON), cut to MAX_CONTENT_CHARS."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, default=str, ensure_ascii=False)
        except Exception:
            text = repr(value)
    return text if len(text) <= MAX_CONTENT_CHARS else text[:MAX_CONTENT_CHARS] + "…"


# -- spans ----------------------------------------------------------------------------


def start_span(
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    parent: otel_context.Context | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
) -> Span | None:
    """Start a span that is *not* made current (end it with :func:`end_span`); its
    parent is ``parent`` or the current context. None while tracing is off."""
    if not enabled():
        return None
    try:
        return _tracer().start_span(
            name, context=parent, kind=kind, attributes=safe_attributes(attributes)
        )
    except Exception:
        log.debug("starting span %s failed", name, exc_info=True)
        return None


def end_span(
    target: Span | None,
    error: BaseException | str | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> None:
    """Set ``attributes``, record ``error`` (an exception or a message: status ERROR,
    ``error.type``) and end the span. None: nothing. Never raises."""
    if target is None:
        return
    try:
        if attributes:
            target.set_attributes(safe_attributes(attributes))
        if error is not None:
            _record_error(target, error)
        target.end()
    except Exception:
        log.debug("ending a span failed", exc_info=True)


def record_error(target: Span | None, error: BaseException | str) -> None:
    """Mark ``target`` failed with ``error`` (status ERROR, ``error.type``, the exception
    recorded). None: nothing. Never raises."""
    if target is None:
        return
    try:
        _record_error(target, error)
    except Exception:
        log.debug("recording an error on a span failed", exc_info=True)


def _record_error(target: Span, error: BaseException | str) -> None:
    if isinstance(error, BaseException):
        target.record_exception(error)
        target.set_attribute("error.type", type(error).__qualname__)
        target.set_status(Status(StatusCode.ERROR, str(error)[:512]))
    else:
        target.set_attribute("error.type", error.split(":", 1)[0][:64] or "error")
        target.set_status(Status(StatusCode.ERROR, error[:512]))


@contextlib.contextmanager
def span(
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    parent: otel_context.Context | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
) -> Iterator[Span | None]:
    """A span made current for the ``with`` block (enter and leave it in one task; not
    across an async generator's ``yield``). An exception leaving the block is
    recorded and re-raised. Yields None while tracing is off."""
    target = start_span(name, attributes, parent=parent, kind=kind)
    if target is None:
        yield None
        return
    token = otel_context.attach(trace.set_span_in_context(target, parent))
    try:
        yield target
    except BaseException as exc:
        end_span(target, exc)
        raise
    else:
        end_span(target)
    finally:
        otel_context.detach(token)


def make_current(ctx: otel_context.Context) -> None:
    """Make ``ctx`` current for the rest of the running task, with no detach: for a
    task's own context (a turn's task), which ends with the task."""
    otel_context.attach(ctx)


# -- crossing actors ------------------------------------------------------------------


def inject() -> dict[str, str] | None:
    """What travels with a call to another actor: the current trace context as W3C
    headers (``traceparent``, maybe ``tracestate``/``baggage``; only while tracing) and
    the exchange's root run id (``x-thinkray-root-run``; whenever a turn is running, so
    logs correlate across actors with tracing off too). None when there is neither."""
    carrier: dict[str, str] = {}
    if enabled():
        try:
            propagate.inject(carrier)
        except Exception:
            log.debug("injecting the trace context failed", exc_info=True)
    root = root_run()
    if root is not None:
        carrier[ROOT_RUN_HEADER] = root
    return carrier or None


def extract(carrier: Mapping[str, str] | None) -> otel_context.Context | None:
    """The OpenTelemetry context :func:`inject` sent (None for None, tracing off, or
    garbage: a bad header starts a new trace, it never fails the call)."""
    if not carrier or not enabled():
        return None
    try:
        return propagate.extract(dict(carrier))
    except Exception:
        log.debug("extracting a trace context failed", exc_info=True)
        return None


@contextlib.contextmanager
def attached(carrier: Mapping[str, str] | None) -> Iterator[None]:
    """Make the caller's context (from :func:`inject`) current for the block: spans
    started inside — a turn's task created there too — are its children, and a turn
    started inside names the caller's root run id."""
    if not carrier:
        yield
        return
    root = carrier.get(ROOT_RUN_HEADER)
    root_token = inherited_root.set(root if isinstance(root, str) else None)
    ctx = extract(carrier)
    token = otel_context.attach(ctx) if ctx is not None else None
    try:
        yield
    finally:
        if token is not None:
            otel_context.detach(token)
        inherited_root.reset(root_token)


def current_ids() -> tuple[str, str] | None:
    """``(trace_id, span_id)`` of the current span as hex, or None (logs carry them)."""
    if not enabled():
        return None
    sc = trace.get_current_span().get_span_context()
    if not sc.is_valid:
        return None
    return format(sc.trace_id, "032x"), format(sc.span_id, "016x")


# -- one turn -------------------------------------------------------------------------


class TurnTrace:
    """The spans of one turn: ``invoke_agent`` and, under it, a ``chat`` span per model
    call and an ``execute_tool`` span per tool call. Created by the turn runner only
    while tracing is on (:meth:`start` returns None otherwise), so the loop's checks
    are ``if trace is not None``."""

    __slots__ = ("context", "span", "content", "_first_chunk")

    def __init__(self, target: Span) -> None:
        self.span = target
        self.context = trace.set_span_in_context(target)
        self.content = capture_content()
        self._first_chunk: float | None = None

    @classmethod
    def start(
        cls,
        *,
        agent_name: str,
        agent_class: str,
        session_id: str,
        run_id: str,
        namespace: str | None,
        model: str | None = None,
        provider: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> TurnTrace | None:
        """The turn's ``invoke_agent`` span, a child of the current context (the
        caller's, carried across the actor boundary); None while tracing is off."""
        target = start_span(
            f"invoke_agent {agent_name}",
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": agent_name,
                "gen_ai.agent.id": f"{namespace}/{agent_name}" if namespace else agent_name,
                "gen_ai.conversation.id": session_id,
                "gen_ai.provider.name": provider,
                "gen_ai.request.model": model,
                "thinkray.agent.class": agent_class,
                "thinkray.namespace": namespace,
                "thinkray.run.id": run_id,
                **(extra or {}),
            },
        )
        return cls(target) if target is not None else None

    def end(
        self, status: str, error: str | None, usage: Usage, steps: int, finish: str | None
    ) -> None:
        """End the turn's span with its outcome (``thinkray.run.status``: completed,
        aborted or error — only ``error`` sets the span's status to ERROR)."""
        end_span(
            self.span,
            error if status == "error" else None,
            {
                "thinkray.run.status": status,
                "thinkray.run.steps": steps,
                "gen_ai.response.finish_reasons": [finish] if finish else None,
                **_usage_attributes(usage),
            },
        )

    # -- model calls --------------------------------------------------------------------

    def chat_start(self, model: Any, step: int, attempt: int, request: Any) -> Span | None:
        """A ``chat {model}`` span for one model call (a retry is another call)."""
        model_id = getattr(model, "model_id", None) or type(model).__name__
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": getattr(model, "provider_id", None),
            "gen_ai.request.model": model_id,
            "thinkray.step": step,
            "thinkray.attempt": attempt,
        }
        max_tokens = getattr(request, "max_tokens", None)
        if isinstance(max_tokens, int):
            attributes["gen_ai.request.max_tokens"] = max_tokens
        if self.content:
            attributes["gen_ai.system_instructions"] = _content(getattr(request, "system", ""))
            attributes["gen_ai.input.messages"] = _content(
                [m.model_dump(mode="json") for m in getattr(request, "messages", ())]
            )
        return start_span(f"chat {model_id}", attributes, parent=self.context, kind=SpanKind.CLIENT)

    def chat_first_chunk(self, target: Span | None, started: float) -> None:
        """The call's first streamed event arrived (``started``: ``perf_counter()`` when
        the call began)."""
        set_attributes(
            target, {"gen_ai.response.time_to_first_chunk": time.perf_counter() - started}
        )

    def chat_response(self, target: Span | None, provider_metadata: Mapping[str, Any]) -> None:
        """The provider's response id and model, from a step's ``provider_metadata``
        (``{"anthropic": {"message_id": ..., "model": ...}}``)."""
        for meta in provider_metadata.values():
            if isinstance(meta, Mapping):
                set_attributes(
                    target,
                    {
                        "gen_ai.response.id": meta.get("message_id") or meta.get("id"),
                        "gen_ai.response.model": meta.get("model"),
                    },
                )
                return

    def chat_end(
        self,
        target: Span | None,
        *,
        outcome: str = "ok",
        finish_reason: str | None = None,
        usage: Usage | None = None,
        error: BaseException | None = None,
        output: Sequence[Any] = (),
    ) -> None:
        """End a ``chat`` span. ``outcome``: ok (finish reason and usage recorded; the
        conventions' input tokens include the cached ones), aborted (the turn was
        aborted mid-call: ``thinkray.aborted``, not an error) or error (the call's
        error recorded, with the usage it was billed if any). ``output``: the
        assistant content produced (recorded only with content capture on)."""
        attributes: dict[str, Any] = {}
        if outcome == "ok" and finish_reason is not None:
            attributes["gen_ai.response.finish_reasons"] = [finish_reason]
        if outcome == "aborted":
            attributes["thinkray.aborted"] = True
        if usage is not None:
            attributes.update(_usage_attributes(usage))
        if self.content and output:
            attributes["gen_ai.output.messages"] = _content(
                [c.model_dump(mode="json") if hasattr(c, "model_dump") else c for c in output]
            )
        end_span(target, error if outcome == "error" else None, attributes)

    # -- tool calls ---------------------------------------------------------------------

    @contextlib.contextmanager
    def tool(self, name: str, call_id: str, arguments: Any) -> Iterator[ToolSpan]:
        """An ``execute_tool {name}`` span, current for the block (a tool that calls a
        sub-agent or the bridge passes it on). Run it inside the call's own task."""
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.type": "function",
        }
        if self.content:
            attributes["gen_ai.tool.call.arguments"] = _content(arguments)
        with span(f"execute_tool {name}", attributes, parent=self.context) as target:
            yield ToolSpan(target, self.content)


class ToolSpan:
    """What a tool call reports on its span: its result, or its error (an error result
    of the model's tool call — a failed tool, invalid input, a denial — marks the span
    ERROR with ``error.type``)."""

    __slots__ = ("span", "content")

    def __init__(self, target: Span | None, content: bool) -> None:
        self.span = target
        self.content = content

    def outcome(self, kind: str, result: Any = None, error: str | None = None) -> None:
        """``kind``: ok, error or denied."""
        target = self.span
        if target is None:
            return
        try:
            target.set_attribute("thinkray.tool.outcome", kind)
            if self.content and result is not None:
                target.set_attribute("gen_ai.tool.call.result", _content(result))
            if kind != "ok":
                target.set_attribute("error.type", "denied" if kind == "denied" else "tool_error")
                target.set_status(Status(StatusCode.ERROR, (error or kind)[:512]))
        except Exception:
            log.debug("recording a tool outcome failed", exc_info=True)


def _usage_attributes(usage: Usage) -> dict[str, Any]:
    return {
        "gen_ai.usage.input_tokens": usage.input + usage.cache_read + usage.cache_write,
        "gen_ai.usage.output_tokens": usage.output,
        "gen_ai.usage.cache_read.input_tokens": usage.cache_read,
        "gen_ai.usage.cache_creation.input_tokens": usage.cache_write,
        "gen_ai.usage.reasoning.output_tokens": usage.reasoning or None,
        "thinkray.usage.cost_usd": usage.cost_usd,
    }
