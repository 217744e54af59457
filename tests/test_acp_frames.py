"""``thinkray acp`` given bad frames (issue 25, part 1): every one gets its JSON-RPC
error (-32700 parse error, -32600 invalid request, -32601 unknown method, -32602 bad
params, -32002 unknown session) and the process stays up and keeps serving; only the
end of its input ends it (exit 0). Raw bytes on the real process's stdin, as a broken
or hostile editor would send them; no Ray, no npm."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from thinkray.runtime.acp.stdio import CheckedTransport, frame_problem

from tests.acp_support import Server, error_of


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path / "root")
    yield s
    s.kill()


BAD_FRAMES = [
    (b"{not json", (None, -32700)),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {', (None, -32700)),
    (b"\xff\xfe\x00garbage", (None, -32700)),
    (b"[1, 2, 3]", (None, -32600)),  # a batch: not ACP
    (b'[{"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {}}]', (None, -32600)),
    (b"42", (None, -32600)),
    (b'"initialize"', (None, -32600)),
    (b"null", (None, -32600)),
    (b'{"id": 3, "method": "initialize", "params": {"protocolVersion": 1}}', (3, -32600)),
    (b'{"jsonrpc": "1.0", "id": 4, "method": "initialize"}', (4, -32600)),
    (b'{"jsonrpc": "2.0", "id": 5, "method": 17}', (5, -32600)),
    (b'{"jsonrpc": "2.0", "id": {"x": 1}, "method": "initialize"}', (None, -32600)),
    (b'{"jsonrpc": "2.0", "id": [6], "result": {}}', (None, -32600)),
    (b'{"jsonrpc": "2.0", "id": true, "method": "initialize"}', (None, -32600)),
    (b'{"jsonrpc": "2.0", "id": 7, "method": "session/new", "params": "cwd"}', (7, -32600)),
    (b'{"jsonrpc": "2.0"}', (None, -32600)),
    (b'{"jsonrpc": "2.0", "id": 8, "method": "no/such/method", "params": {}}', (8, -32601)),
    (b'{"jsonrpc": "2.0", "id": 9, "method": "_thinkray/unknown", "params": {}}', (9, -32601)),
    (b'{"jsonrpc": "2.0", "id": 10, "method": "session/new", "params": {"cwd": 5}}', (10, -32602)),
    (b'{"jsonrpc": "2.0", "id": 11, "method": "session/new"}', (11, -32602)),
    (
        b'{"jsonrpc": "2.0", "id": 12, "method": "session/prompt", "params": {"sessionId": "x"}}',
        (12, -32602),
    ),
    (
        b'{"jsonrpc": "2.0", "id": "s", "method": "session/load", "params": {"sessionId": [5]}}',
        ("s", -32602),
    ),
    (b'{"jsonrpc": "2.0", "id": 13, "method": "session/prompt", "params": [1, 2]}', (13, -32602)),
]


def test_bad_frames_get_json_rpc_errors_and_the_process_stays_up(server):
    for raw, expected in BAD_FRAMES:
        server.send(raw)
        assert error_of(server.read()) == expected, raw
        assert server.proc.poll() is None, raw
    # Frames that get no answer, as JSON-RPC says: notifications (even unknown or with
    # bad params), a response to nothing we asked, blank lines.
    server.send(b'{"jsonrpc": "2.0", "method": "no/such/notification", "params": {}}')
    server.send(b'{"jsonrpc": "2.0", "method": "session/cancel", "params": {"nope": 1}}')
    server.send(b'{"jsonrpc": "2.0", "id": 99, "result": {}}')
    server.send(b"   ")
    # Still serving: initialize, a session, a turn with a tool whose print() must not
    # reach the protocol (read() parses every stdout line).
    init = server.request("initialize", {"protocolVersion": 1})
    assert init["result"]["protocolVersion"] == 1
    sid = server.request("session/new", {"cwd": "/tmp/x", "mcpServers": []})["result"]["sessionId"]
    done = server.request(
        "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "weather Lima"}]}
    )
    assert done["result"] == {"stopReason": "end_turn"}
    assert server.close() == 0, server.stderr


def test_requests_the_agent_refuses_are_typed_errors(server):
    server.request("initialize", {"protocolVersion": 1})
    prompt = {"prompt": [{"type": "text", "text": "hi"}]}
    unknown = server.request("session/prompt", {"sessionId": "no-such", **prompt})
    assert error_of(unknown)[1] == -32002
    for method in ("session/load", "session/resume"):
        missing = server.request(method, {"sessionId": "no-such", "cwd": "/", "mcpServers": []})
        assert error_of(missing)[1] == -32002, method
    sid = server.request("session/new", {"cwd": "/tmp/x", "mcpServers": []})["result"]["sessionId"]
    image = {"type": "image", "data": "AAAA", "mimeType": "image/png"}
    refused = server.request("session/prompt", {"sessionId": sid, "prompt": [image]})
    assert error_of(refused)[1] == -32602
    assert "image" in refused["error"]["data"]["details"]
    empty = server.request("session/prompt", {"sessionId": sid, "prompt": []})
    assert error_of(empty)[1] == -32602
    # A prompt while the session's turn runs: refused, the turn unharmed.
    server.send(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "session/prompt",
            "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "slow 60"}]},
        }
    )
    while server.read().get("method") != "session/update":
        pass  # the first words: the turn is running
    busy = server.request("session/prompt", {"sessionId": sid, **prompt})
    assert error_of(busy)[1] == -32600
    assert "busy" in busy["error"]["data"]["details"] or "run" in busy["error"]["data"]["details"]
    while (message := server.read()).get("id") != 1:
        pass
    assert message["result"] == {"stopReason": "end_turn"}
    # Nothing of the refused requests was stored.
    server.request("session/close", {"sessionId": sid})
    assert server.close() == 0


def test_end_of_input_inside_a_frame_exits_cleanly(server):
    server.request("initialize", {"protocolVersion": 1})
    assert server.proc.stdin is not None
    server.proc.stdin.write(b'{"jsonrpc": "2.0", "id": 5, "meth')  # cut off, no newline
    server.proc.stdin.flush()
    assert server.close() == 0


def test_frame_problem_accepts_what_json_rpc_allows():
    assert frame_problem({"jsonrpc": "2.0", "id": "a", "method": "m"}) is None
    assert frame_problem({"jsonrpc": "2.0", "id": None, "method": "m", "params": {}}) is None
    assert frame_problem({"jsonrpc": "2.0", "method": "m", "params": []}) is None
    assert frame_problem({"jsonrpc": "2.0", "id": 3, "error": {"code": 1, "message": "x"}}) is None


def test_an_over_long_frame_is_answered_and_skipped():
    async def scenario() -> tuple[
        list[dict[str, Any]], dict[str, Any] | None, dict[str, Any] | None
    ]:
        reader = asyncio.StreamReader(limit=64)
        sent: list[dict[str, Any]] = []

        class Writer:
            def write(self, data: bytes) -> None:
                sent.append(json.loads(data))

            async def drain(self) -> None:
                return None

            def close(self) -> None:
                return None

        transport = CheckedTransport(reader, Writer())  # type: ignore[arg-type]
        good = {"jsonrpc": "2.0", "id": 1, "method": "m"}
        reader.feed_data(b'{"jsonrpc": "2.0", "id": 0, "method": "' + b"x" * 500 + b'"}\n')
        reader.feed_data(json.dumps(good).encode() + b"\n")
        reader.feed_eof()
        first = await transport.receive()
        end = await transport.receive()
        return sent, first, end

    sent, first, end = asyncio.run(scenario())
    assert [m["error"]["code"] for m in sent] == [-32600]
    assert first == {"jsonrpc": "2.0", "id": 1, "method": "m"}  # the next frame intact
    assert end is None
