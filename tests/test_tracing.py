"""Traces of a turn in process, through the real OpenTelemetry SDK (in-memory exporter):
the GenAI span tree and attributes, content opt-in, errors, bad attributes, a caller's
trace continued, the bounded exporter, and log records carrying the turn's ids."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import StatusCode
from thinkray.runtime import Think, tool
from thinkray.runtime.models.testing import ScriptedModel, fail, reply, tool_call
from thinkray.runtime.observability import logs, tracing
from thinkray.runtime.observability.exporter import BoundedSpanProcessor
from thinkray.runtime.observability.metrics import RecordingMetrics, set_metrics_sink
from thinkray.runtime.turn.loop import RetryPolicy

from tests.otel_support import in_memory_spans


@pytest.fixture
def spans():
    with in_memory_spans() as (_, exporter):
        yield exporter


@pytest.fixture
def recorded():
    sink = RecordingMetrics()
    previous = set_metrics_sink(sink)
    yield sink
    set_metrics_sink(previous)


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool
def explode(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(f"boom: {reason}")


class Calculator(Think):
    def get_tools(self):
        return {"add": add, "explode": explode}


def by_name(finished):
    out = {}
    for s in finished:
        out.setdefault(s.name, []).append(s)
    return out


def tool_turn_model() -> ScriptedModel:
    return ScriptedModel(
        [
            reply(
                tool_call("add", {"a": 2, "b": 3}, id="call-add"),
                tool_call("explode", {"reason": "x"}, id="call-boom"),
                usage={"input": 100, "output": 20, "cache_read": 30, "cache_write": 5},
                finish_reason="tool-calls",
            ),
            reply("five", usage={"input": 150, "output": 7}),
        ]
    )


async def test_turn_span_tree_follows_the_genai_conventions(store, spans, recorded):
    agent = Calculator(store, model=tool_turn_model())
    result = await agent.chat("add 2 and 3")
    assert result.status == "completed"
    finished = spans.get_finished_spans()
    named = by_name(finished)
    (turn,) = named["invoke_agent " + (agent.agent_name or "Calculator")]
    chats = named.get("chat scripted")
    assert chats is not None, sorted(named)
    assert len(chats) == 2
    (add_span,) = named["execute_tool add"]
    (boom_span,) = named["execute_tool explode"]

    # the tree: every span of the turn is a child of invoke_agent, in one trace
    for child in (*chats, add_span, boom_span):
        assert child.parent is not None and child.parent.span_id == turn.context.span_id
        assert child.context.trace_id == turn.context.trace_id
    assert turn.parent is None

    a = turn.attributes
    assert a["gen_ai.operation.name"] == "invoke_agent"
    assert a["gen_ai.conversation.id"] == result.session_id
    assert a["thinkray.run.id"] == result.run_id
    assert a["thinkray.run.status"] == "completed"
    assert a["gen_ai.usage.output_tokens"] == 27
    assert turn.status.status_code != StatusCode.ERROR

    first, second = sorted(chats, key=lambda s: s.attributes["thinkray.step"])
    assert first.kind == trace.SpanKind.CLIENT
    assert first.attributes["gen_ai.operation.name"] == "chat"
    assert first.attributes["gen_ai.request.model"] == "scripted"
    assert first.attributes["gen_ai.provider.name"] == agent.get_model().provider_id
    assert first.attributes["gen_ai.response.finish_reasons"] == ("tool-calls",)
    # the conventions' input tokens include the cached ones
    assert first.attributes["gen_ai.usage.input_tokens"] == 135
    assert first.attributes["gen_ai.usage.cache_read.input_tokens"] == 30
    assert first.attributes["gen_ai.usage.cache_creation.input_tokens"] == 5
    assert first.attributes["gen_ai.usage.output_tokens"] == 20
    assert "gen_ai.response.time_to_first_chunk" in first.attributes
    assert second.attributes["gen_ai.response.finish_reasons"] == ("stop",)

    assert add_span.attributes["gen_ai.tool.name"] == "add"
    assert add_span.attributes["gen_ai.tool.call.id"] == "call-add"
    assert add_span.status.status_code != StatusCode.ERROR
    assert boom_span.status.status_code == StatusCode.ERROR
    assert "boom: x" in (boom_span.status.description or "")

    # contents are opt-in: none by default
    for s in finished:
        for key in s.attributes:
            assert key not in {
                "gen_ai.input.messages",
                "gen_ai.output.messages",
                "gen_ai.system_instructions",
                "gen_ai.tool.call.arguments",
                "gen_ai.tool.call.result",
            }, (s.name, key)

    # the same turn's metrics
    assert recorded.total("thinkray_turns_total", status="completed") == 1
    assert recorded.total("thinkray_tool_calls_total", tool="add", outcome="ok") == 1
    assert recorded.total("thinkray_tool_calls_total", tool="explode", outcome="error") == 1
    assert recorded.total("thinkray_tokens_total", model="scripted", kind="input") == 250
    assert recorded.total("thinkray_tokens_total", model="scripted", kind="cache_read") == 30
    assert recorded.total("thinkray_model_calls_total", outcome="ok") == 2
    assert len(recorded.observed("thinkray_ttfc_seconds")) == 1
    assert len(recorded.observed("thinkray_turn_seconds", status="completed")) == 1


async def test_contents_are_recorded_when_the_user_opts_in(store, spans):
    tracing.capture_content(True)
    agent = Calculator(store, model=tool_turn_model())
    await agent.chat("add 2 and 3")
    named = by_name(spans.get_finished_spans())
    first = min(named["chat scripted"], key=lambda s: s.attributes["thinkray.step"])
    assert "add 2 and 3" in first.attributes["gen_ai.input.messages"]
    assert "call-add" in first.attributes["gen_ai.output.messages"]
    (add_span,) = named["execute_tool add"]
    assert add_span.attributes["gen_ai.tool.call.arguments"] == '{"a": 2, "b": 3}'
    assert add_span.attributes["gen_ai.tool.call.result"] == "5"


async def test_a_failed_model_call_and_retries_are_spans_with_errors(store, spans, recorded):
    model = ScriptedModel(
        [reply(fail("overloaded", transient=True)), reply("ok"), reply(fail("bad request"))]
    )
    agent = Think(store, model=model)
    agent.retry_policy = RetryPolicy(base_delay=0.0)
    ok = await agent.chat("hi")
    assert ok.status == "completed"
    bad = await agent.chat("again")
    assert bad.status == "error"
    named = by_name(spans.get_finished_spans())
    chats = named["chat scripted"]
    assert [s.status.status_code == StatusCode.ERROR for s in chats] == [True, False, True]
    assert [s.attributes["thinkray.attempt"] for s in chats] == [0, 1, 0]
    assert chats[0].attributes["error.type"] == "ModelError"
    turns = sorted(
        (s for s in spans.get_finished_spans() if s.name.startswith("invoke_agent")),
        key=lambda s: s.start_time,
    )
    assert [t.attributes["thinkray.run.status"] for t in turns] == ["completed", "error"]
    assert turns[1].status.status_code == StatusCode.ERROR
    assert recorded.total("thinkray_model_calls_total", outcome="error") == 2
    assert recorded.total("thinkray_turns_total", status="error") == 1


async def test_abort_ends_spans_without_calling_it_an_error(store, spans, recorded):
    from thinkray.runtime.models.testing import pause

    agent = Think(store, model=ScriptedModel([reply("a", pause(30), "b")]))
    run = agent.start_chat("wait")
    while not any(c.get("type") == "text-delta" for c in run.stream.chunks):
        await asyncio.sleep(0.01)
    agent.abort(run_id=run.run_id, reason="user")
    result = await run.task
    assert result.status == "aborted"
    named = by_name(spans.get_finished_spans())
    (chat,) = named["chat scripted"]
    assert chat.attributes["thinkray.aborted"] is True
    assert chat.status.status_code != StatusCode.ERROR
    (turn,) = [s for s in spans.get_finished_spans() if s.name.startswith("invoke_agent")]
    assert turn.attributes["thinkray.run.status"] == "aborted"
    assert recorded.total("thinkray_aborts_total") == 1
    assert recorded.total("thinkray_model_calls_total", outcome="aborted") == 1


async def test_a_turn_continues_the_callers_trace(store, spans):
    agent = Think(store, model=ScriptedModel([reply("hi")]))
    with trace.get_tracer("caller", tracer_provider=_provider(spans)).start_as_current_span(
        "request"
    ) as request:
        carrier = tracing.inject()
    assert carrier and "traceparent" in carrier
    # What an actor does with the carrier a handle sent: the turn's task is created
    # while the caller's context is current.
    with tracing.attached(carrier):
        run = agent.start_chat("hello")
    await run.task
    (turn,) = [s for s in spans.get_finished_spans() if s.name.startswith("invoke_agent")]
    assert turn.context.trace_id == request.get_span_context().trace_id
    assert turn.parent.span_id == request.get_span_context().span_id


def _provider(exporter):
    return tracing._provider


async def test_unserializable_span_attributes_are_dropped_not_raised(store, spans):
    class Tagged(Think):
        def span_attributes(self, session_id, run_id):
            return {"tenant": "acme", "blob": {"not": "allowed"}, "obj": object(), "n": 3}

    before = tracing.dropped_attributes
    agent = Tagged(store, model=ScriptedModel([reply("hi")]))
    result = await agent.chat("hi")
    assert result.status == "completed"
    (turn,) = [s for s in spans.get_finished_spans() if s.name.startswith("invoke_agent")]
    assert turn.attributes["tenant"] == "acme" and turn.attributes["n"] == 3
    assert "blob" not in turn.attributes and "obj" not in turn.attributes
    assert tracing.dropped_attributes == before + 2


async def test_tracing_off_records_nothing_and_injects_nothing(store):
    assert not tracing.enabled()  # no provider installed in this process
    assert tracing.inject() is None
    agent = Calculator(store, model=tool_turn_model())
    result = await agent.chat("add")
    assert result.status == "completed"


class _Stuck(SpanExporter):
    """An exporter whose endpoint never answers: every export blocks until released."""

    def __init__(self):
        self.release = threading.Event()
        self.calls = 0

    def export(self, spans):
        self.calls += 1
        self.release.wait(30)
        return SpanExportResult.FAILURE

    def shutdown(self):
        self.release.set()


async def test_an_exporter_that_hangs_never_blocks_a_turn_and_drops_are_counted(store, recorded):
    stuck = _Stuck()
    processor = BoundedSpanProcessor(stuck, max_queue=4, max_batch=2, interval=0.01)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracing.set_tracer_provider(provider)
    try:
        agent = Calculator(store, model=ScriptedModel([reply("ok")] * 6))
        for i in range(6):  # every turn completes while the exporter is stuck
            assert (await agent.chat(f"turn {i}")).status == "completed"
        assert stuck.calls >= 1
        assert processor.dropped > 0
        assert recorded.total("thinkray_spans_dropped_total") == processor.dropped
    finally:
        tracing.set_tracer_provider(None)
        stuck.release.set()
        processor.shutdown()


async def test_exporter_failures_are_counted_and_the_thread_goes_on():
    class Flaky(SpanExporter):
        def __init__(self):
            self.n = 0
            self.got = []

        def export(self, spans):
            self.n += 1
            if self.n == 1:
                raise ConnectionError("collector down")
            self.got.extend(spans)
            return SpanExportResult.SUCCESS

    flaky = Flaky()
    processor = BoundedSpanProcessor(flaky, max_queue=100, max_batch=1, interval=0.01)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    for i in range(3):
        tracer.start_span(f"s{i}").end()
    assert processor.force_flush(10_000)
    assert processor.dropped == 1 and processor.failed_batches == 1
    assert sorted(s.name for s in flaky.got) == ["s1", "s2"]
    processor.shutdown()


async def test_log_records_of_a_turn_carry_its_ids(store, spans, caplog):
    seen = []

    @tool
    def note(text: str) -> str:
        """Log something."""
        logging.getLogger("thinkray.test.tool").warning("noting %s", text)
        return "noted"

    class Noter(Think):
        def get_tools(self):
            return {"note": note}

    agent = Noter(
        store,
        model=ScriptedModel(
            [reply(tool_call("note", {"text": "x"}), finish_reason="tool-calls"), reply("done")]
        ),
    )
    with caplog.at_level(logging.WARNING, logger="thinkray"):
        result = await agent.chat("note it")
    outside = logging.getLogger("thinkray.test").makeRecord(
        "thinkray.test", logging.INFO, __file__, 1, "outside", (), None
    )
    seen = [r for r in caplog.records if r.name == "thinkray.test.tool"]
    assert len(seen) == 1
    record = seen[0]
    assert record.run_id == result.run_id
    assert record.session_id == result.session_id
    assert record.root_run_id == result.run_id  # started here: its own root
    assert record.agent == (agent.agent_name or "Noter")
    (turn,) = [s for s in spans.get_finished_spans() if s.name.startswith("invoke_agent")]
    assert record.trace_id == format(turn.context.trace_id, "032x")
    assert outside.run_id == "-" and outside.session_id == "-"
    # the default format names them, and formats a record from outside a turn too
    formatter = logging.Formatter(logs.LOG_FORMAT)
    assert f"run={result.run_id}" in formatter.format(record)
    assert "run=-" in formatter.format(outside)


async def test_the_root_run_id_crosses_to_a_sub_agent_with_tracing_off(tmp_path, caplog):
    """What a handle and a session actor do with the carrier (inject on the caller's
    side, attached around starting the turn on the other), tracing off: the sub-agent's
    records name the run that started the exchange."""
    from thinkray.storage import DuckDBSessionStore

    assert not tracing.enabled()
    inner_store = DuckDBSessionStore(tmp_path / "inner.duckdb")
    outer_store = DuckDBSessionStore(tmp_path / "outer.duckdb")

    @tool
    def work() -> str:
        """Log from inside the sub-agent's turn."""
        logging.getLogger("thinkray.test.inner").warning("inner work")
        return "done"

    class Inner(Think):
        def get_tools(self):
            return {"work": work}

    inner = Inner(
        inner_store,
        model=ScriptedModel(
            [reply(tool_call("work", {}), finish_reason="tool-calls"), reply("ok")]
        ),
    )
    carriers = []

    @tool
    async def delegate() -> str:
        """Hand work to the sub-agent, as a handle would."""
        carrier = tracing.inject()
        carriers.append(carrier)
        with tracing.attached(carrier):
            run = inner.start_chat("do it")
        return (await run.task).status

    class Outer(Think):
        def get_tools(self):
            return {"delegate": delegate}

    outer = Outer(
        outer_store,
        model=ScriptedModel(
            [reply(tool_call("delegate", {}), finish_reason="tool-calls"), reply("all done")]
        ),
    )
    try:
        with caplog.at_level(logging.WARNING, logger="thinkray"):
            result = await outer.chat("go")
    finally:
        inner.close()
        outer.close()
    assert result.status == "completed"
    (carrier,) = carriers
    assert carrier == {"x-thinkray-root-run": result.run_id}  # no trace headers: off
    (record,) = [r for r in caplog.records if r.name == "thinkray.test.inner"]
    assert record.root_run_id == result.run_id
    assert record.run_id != result.run_id  # the sub-agent's own run
    assert record.trace_id == "-"


async def test_the_ingress_continues_a_clients_trace(spans):
    """An HTTP request's traceparent becomes the parent of the request's SERVER span,
    and what the app sends on (through a handle) carries that span."""
    import httpx
    from thinkray.actors.ingress.app import TraceContext

    seen = []

    async def app(scope, receive, send):
        seen.append(tracing.inject())
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    client_trace, client_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    transport = httpx.ASGITransport(app=TraceContext(app))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        response = await client.post(
            "/api/chat", headers={"traceparent": f"00-{client_trace}-{client_span}-01"}
        )
        plain = await client.get("/api/chat")
    assert response.status_code == 201 and plain.status_code == 201
    post, get = sorted(spans.get_finished_spans(), key=lambda s: s.start_time)
    assert post.kind == trace.SpanKind.SERVER and post.name == "POST"
    assert format(post.context.trace_id, "032x") == client_trace
    assert format(post.parent.span_id, "016x") == client_span
    assert post.attributes["http.response.status_code"] == 201
    assert post.attributes["url.path"] == "/api/chat"
    assert get.parent is None  # no traceparent: the request starts a trace
    # what the app sent on names the request's span as its parent
    sent = seen[0]["traceparent"].split("-")
    assert sent[1] == client_trace and sent[2] == format(post.context.span_id, "016x")
