"""The MCP client (runtime/tools/mcp.py) without Ray, against a real MCP server from
the ``mcp`` package (tests/mcp_server.py) over stdio and streamable HTTP on loopback."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from thinkray.runtime.abort import AbortSignal  # noqa: E402
from thinkray.runtime.errors import ToolInputError  # noqa: E402
from thinkray.runtime.tools.base import ToolContext  # noqa: E402
from thinkray.runtime.tools.mcp import (  # noqa: E402
    McpClient,
    McpConfigError,
    McpConnectionError,
    McpProtocolError,
    McpServerConfig,
    McpServerConnection,
    McpTimeoutError,
    McpToolError,
    McpUnavailableError,
    call_envelope,
    client_call,
    mcp_tools,
    raise_for_envelope,
    tool_name,
)

from tests.helpers import free_port  # noqa: E402

SERVER = str(Path(__file__).with_name("mcp_server.py"))


def stdio_config(name="t", **extra):
    return McpServerConfig.parse(name, {"command": sys.executable, "args": [SERVER], **extra})


def start_http_server(port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, SERVER, "--http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the MCP HTTP server did not start")


@pytest.fixture
def http_server():
    port = free_port()
    proc = start_http_server(port)
    yield port, proc
    proc.kill()
    proc.wait()


def ctx():
    return ToolContext(tool_call_id="call_1", tool_name="x", signal=AbortSignal())


def test_config_validation_and_tool_names():
    with pytest.raises(McpConfigError, match="needs a 'command'"):
        McpServerConfig.parse("a", {"transport": "stdio"})
    with pytest.raises(McpConfigError, match="http:// or https://"):
        McpServerConfig.parse("a", {"transport": "http", "url": "ftp://x"})
    with pytest.raises(McpConfigError, match="1-32 letters"):
        McpServerConfig.parse("a b", {"command": "x"})
    with pytest.raises(McpConfigError, match="bogus: Extra inputs"):
        McpServerConfig.parse("a", {"command": "x", "bogus": 1})
    assert tool_name("srv", "get.weather") == "mcp__srv__get_weather"
    long = tool_name("srv", "x" * 100)
    assert len(long) == 64 and long != tool_name("srv", "x" * 99)


def test_envelopes_round_trip():
    async def ok():
        return {"a": 1}

    async def fails():
        raise McpTimeoutError("slow")

    good = asyncio.run(call_envelope(ok()))
    assert raise_for_envelope(good) == {"a": 1}
    bad = asyncio.run(call_envelope(fails()))
    assert bad == {"ok": False, "kind": "timeout", "error": "slow"}
    with pytest.raises(McpTimeoutError, match="slow"):
        raise_for_envelope(bad)
    with pytest.raises(McpProtocolError):
        raise_for_envelope("garbage")


async def test_stdio_list_call_errors_and_timeouts():
    conn = McpServerConnection(stdio_config(timeout=1.0))
    try:
        tools = {t.tool: t for t in await conn.list_tools()}
        assert {"add", "echo", "fail", "hang", "pid", "garbage"} <= set(tools)
        assert tools["add"].name == "mcp__t__add"
        assert tools["add"].input_schema["required"] == ["a", "b"]
        assert await conn.call_tool("add", {"a": 2, "b": 40}) == "42"
        with pytest.raises(McpToolError, match="nope"):  # an isError result
            await conn.call_tool("fail", {"reason": "nope"})
        # "hang" never answers: only the call's own 1 s timeout can end it
        with pytest.raises(McpTimeoutError, match="timed out after 1s"):
            await conn.call_tool("hang", {})
        with pytest.raises(McpProtocolError, match="not MCP.*this is not JSON-RPC"):
            await conn.call_tool("garbage", {})
        with pytest.raises(McpToolError, match="Unknown tool"):
            await conn.call_tool("no_such_tool", {})
        # none of that broke the connection
        assert await conn.call_tool("echo", {"text": "still here"}) == "still here"
        assert conn.status()["connects"] == 1
    finally:
        await conn.close()


async def test_killed_server_is_reconnected_on_next_call():
    conn = McpServerConnection(stdio_config())
    try:
        pid = int(await conn.call_tool("pid"))
        os.kill(pid, signal.SIGKILL)
        # noticed when its stream closed (no call needed): waited for, not slept on
        for _ in range(400):
            if not conn.connected:
                break
            await asyncio.sleep(0.05)
        assert not conn.connected
        new_pid = int(await conn.call_tool("pid"))
        assert new_pid != pid and conn.status()["connects"] == 2
    finally:
        await conn.close()


async def test_unreachable_server_backs_off_and_garbage_at_connect_is_clear():
    missing = McpServerConnection(
        McpServerConfig.parse("gone", {"command": "/nonexistent/server", "backoff_initial": 5})
    )
    with pytest.raises(McpUnavailableError, match="connection failed"):
        await missing.call_tool("x")
    with pytest.raises(McpUnavailableError, match="next reconnect attempt in"):
        await missing.call_tool("x")
    assert missing._failures == 1  # backing off: no second spawn was tried
    assert missing.status()["retry_in"] > 0
    script = "import sys,time; print('hello', flush=True); print('oops', file=sys.stderr); time.sleep(30)"
    not_mcp = McpServerConnection(
        McpServerConfig.parse("junk", {"command": sys.executable, "args": ["-c", script]})
    )
    with pytest.raises(McpProtocolError, match="'hello'.*stderr ends: oops"):
        await not_mcp.connect()
    await not_mcp.close()


async def test_hanging_connect_is_bounded():
    script = "import time; time.sleep(30)"
    silent = McpServerConnection(
        McpServerConfig.parse(
            "mute", {"command": sys.executable, "args": ["-c", script], "connect_timeout": 1}
        )
    )
    # the server sleeps 30 s without a word: only the 1 s connect timeout ends this
    with pytest.raises(McpUnavailableError, match="did not connect within 1s"):
        await silent.connect()
    await silent.close()


async def test_http_transport(http_server):
    port, proc = http_server
    config = McpServerConfig.parse(
        "web", {"transport": "http", "url": f"http://127.0.0.1:{port}/mcp", "timeout": 1.0}
    )
    client = McpClient()
    try:
        status = await client.add(config)
        assert status["connected"] and "add" in status["tools"]
        assert await client.call("web", "add", {"a": 1, "b": 2}) == "3"
        with pytest.raises(McpToolError, match="boom"):
            await client.call("web", "fail", {"reason": "boom"})
        with pytest.raises(McpTimeoutError):
            await client.call("web", "hang", {})
        assert await client.call("web", "echo", {"text": "ok"}) == "ok"
        # the server goes away and comes back on the same port: the client reconnects
        proc.kill()
        proc.wait()
        with pytest.raises((McpConnectionError, McpUnavailableError, McpTimeoutError)):
            await client.call("web", "echo", {"text": "x"})
        restarted = start_http_server(port)
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    assert await client.call("web", "echo", {"text": "back"}) == "back"
                    break
                except (McpConnectionError, McpUnavailableError, McpTimeoutError):
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.3)
        finally:
            restarted.kill()
            restarted.wait()
    finally:
        await client.close()


async def test_mcp_tools_validate_and_call_through_a_client():
    client = McpClient()
    await client.add(stdio_config("calc"))
    try:
        tools = mcp_tools(await client.list_tools("calc"), client_call(client))
        add = tools["mcp__calc__add"]
        assert add.input_schema["type"] == "object" and "[MCP server calc]" in add.description
        with pytest.raises(ToolInputError, match="'b' is a required property"):
            add.validate({"a": 1})
        with pytest.raises(ToolInputError, match="must be a JSON object"):
            add.validate("[1, 2]")
        assert await add.execute(add.validate('{"a": 5, "b": 6}'), ctx()) == "11"
        with pytest.raises(McpToolError):
            await tools["mcp__calc__fail"].execute({}, ctx())
        with pytest.raises(McpConfigError, match="unknown MCP server"):
            await client.call("nope", "add", {})
    finally:
        await client.close()
