"""``thinkray acp`` given bad frames (issue 25, part 1): every one gets its JSON-RPC
error (-32700 parse error, -32600 invalid request, -32601 unknown method, -32602 bad
params, -32002 unknown session) and the process stays up and keeps serving; only the
end of its input ends it (exit 0). Raw bytes on the real process's stdin, as a broken
or hostile editor would send them; no Ray, no npm."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from thinkray.runtime.acp.stdio import CheckedTransport, frame_problem

REPO = Path(__file__).resolve().parent.parent
HANG_GUARD = 120  # seconds: only against a hang, never a measured time


class Server:
    """A ``thinkray acp`` process and its stdout, line by line."""

    def __init__(self, root: Path) -> None:
        thinkray = Path(sys.executable).with_name("thinkray")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [str(thinkray), "acp", "--agent", "tests.acp_agents:AcpTestAgent", "--storage-root", str(root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO,
            env=env,
        )
        self.lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.next_id = 1000

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(b"")

    def send(self, raw: bytes | str | dict[str, Any]) -> None:
        if isinstance(raw, dict):
            raw = json.dumps(raw)
        if isinstance(raw, str):
            raw = raw.encode()
        assert self.proc.stdin is not None
        self.proc.stdin.write(raw + b"\n")
        self.proc.stdin.flush()

    def read(self) -> dict[str, Any]:
        line = self.lines.get(timeout=HANG_GUARD)
        assert line, f"the server closed its output (exit {self.proc.poll()})"
        message: dict[str, Any] = json.loads(line)  # every stdout line is a protocol message
        return message

    def request(self, method: str, params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while True:
            message = self.read()
            if message.get("id") == self.next_id:
                return message

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        code = self.proc.wait(timeout=HANG_GUARD)
        assert self.proc.stderr is not None
        self.stderr = self.proc.stderr.read().decode(errors="replace")
        return code


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path / "root")
    yield s
    if s.proc.poll() is None:
        s.proc.kill()
        s.proc.wait()


def error_of(message: dict[str, Any]) -> tuple[Any, int]:
    assert "error" in message and "result" not in message, message
    return message["id"], message["error"]["code"]


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
    (b'{"jsonrpc": "2.0", "id": 12, "method": "session/prompt", "params": {"sessionId": "x"}}', (12, -32602)),
    (b'{"jsonrpc": "2.0", "id": "s", "method": "session/load", "params": {"sessionId": [5]}}', ("s", -32602)),
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
    async def scenario() -> tuple[list[dict[str, Any]], dict[str, Any] | None, dict[str, Any] | None]:
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
