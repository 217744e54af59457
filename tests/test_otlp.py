"""Sending traces to a collector, as the README says: OTEL_EXPORTER_OTLP_ENDPOINT in the
environment, the real OTLP/HTTP exporter, a collector on loopback that decodes the
protobuf it receives. And a collector that never answers: every turn still completes,
the spans it could not take are dropped and counted. Each case runs in its own process
(a process sets its global tracer provider once)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from tests.helpers import json_report


@pytest.fixture
def collector():
    received: list[trace_service_pb2.ExportTraceServiceRequest] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = trace_service_pb2.ExportTraceServiceRequest()
            request.ParseFromString(body)
            received.append((self.path, self.headers.get("Content-Type"), request))
            reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", received
    server.shutdown()
    server.server_close()


RUN_TURNS = textwrap.dedent(
    """
    import asyncio, json, sys, tempfile
    from thinkray.runtime.observability import setup
    how = setup.configure_from_env()
    from thinkray.runtime import Think, tool
    from thinkray.runtime.models.testing import ScriptedModel, reply, tool_call
    from thinkray.storage import DuckDBSessionStore

    @tool
    def add(a: int, b: int) -> int:
        "Add."
        return a + b

    class Calc(Think):
        def get_tools(self):
            return {"add": add}

    turns = int(sys.argv[1])
    steps = [reply(tool_call("add", {"a": 1, "b": 2}), finish_reason="tool-calls"), reply("3")]
    statuses = []
    with tempfile.TemporaryDirectory() as root:
        store = DuckDBSessionStore(root + "/a.duckdb")
        agent = Calc(store, model=ScriptedModel(steps * turns))
        for i in range(turns):
            statuses.append(asyncio.run(agent.chat(f"turn {i}")).status)
        agent.close()
    processor = setup.processor_in_use
    processor.force_flush(3000)
    print(json.dumps({"how": how, "statuses": statuses, "dropped": processor.dropped,
                      "exported": processor.exported}))
    """
)


def _run(env: dict[str, str], turns: int) -> dict:
    env = {**os.environ, **env}
    env.pop("THINKRAY_TRACING", None)
    out = subprocess.run(
        [sys.executable, "-c", RUN_TURNS, str(turns)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json_report(out.stdout)


def test_spans_reach_a_collector_over_otlp_http(collector):
    endpoint, received = collector
    result = _run(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "agents-test"}, turns=2
    )
    assert result["how"] == "otlp"
    assert result["statuses"] == ["completed", "completed"]
    assert result["dropped"] == 0 and result["exported"] > 0
    paths = {path for path, _, _ in received}
    assert paths == {"/v1/traces"}
    assert {ctype for _, ctype, _ in received} == {"application/x-protobuf"}
    spans, services = [], set()
    for _, _, request in received:
        for rs in request.resource_spans:
            for attr in rs.resource.attributes:
                if attr.key == "service.name":
                    services.add(attr.value.string_value)
            for ss in rs.scope_spans:
                spans.extend(ss.spans)
    assert services == {"agents-test"}
    assert len(spans) == result["exported"]
    names = [s.name for s in spans]
    assert names.count("invoke_agent local") == 2
    assert names.count("execute_tool add") == 2
    assert names.count("chat scripted") == 4
    tool = next(s for s in spans if s.name == "execute_tool add")
    attrs = {a.key: a.value for a in tool.attributes}
    assert attrs["gen_ai.tool.name"].string_value == "add"
    turn = next(s for s in spans if s.name == "invoke_agent local")
    assert tool.trace_id in {s.trace_id for s in spans if s.name == "invoke_agent local"}
    assert turn.parent_span_id == b""


def test_a_collector_that_never_answers_slows_no_turn_and_drops_are_counted():
    # A TCP listener that accepts and never replies: each export hangs until its
    # timeout. The turns must complete anyway; what did not fit is dropped and counted.
    sink = socket.socket()
    sink.bind(("127.0.0.1", 0))
    sink.listen(64)
    try:
        result = _run(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink.getsockname()[1]}",
                "OTEL_EXPORTER_OTLP_TIMEOUT": "2",
                "OTEL_BSP_MAX_QUEUE_SIZE": "8",
            },
            turns=40,
        )
    finally:
        sink.close()
    assert result["how"] == "otlp"
    assert result["statuses"] == ["completed"] * 40
    assert result["exported"] == 0
    assert result["dropped"] > 0
