"""MCP servers of an orchestrator, bridged into sub-agents' tool sets with per-agent
grants (seed 000), with real actors and a real MCP server (tests/mcp_server.py) over
stdio and streamable HTTP on loopback."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from tests.helpers import wait_until

pytest.importorskip("mcp")

from tests.test_mcp import SERVER, free_port, start_http_server  # noqa: E402
from tests.test_orchestrator import (  # noqa: E402, F401  (fixtures)
    orchestrator,
    orchestrators,
    tool_parts,
)

pytestmark = pytest.mark.ray

STDIO = {"command": sys.executable, "args": [SERVER], "timeout": 2.0}


def script(*steps):
    return {"provider": "script", "steps": [list(s) for s in steps]}


def call(tool, **input):
    return [{"tool": tool, "input": input}]


@pytest.fixture
def mcp_orchestrator(orchestrator):  # noqa: F811  (the imported fixture)
    """The orchestrator of tests/test_orchestrator.py (whose teardown closes its bridge,
    holding the MCP connections, so the stdio servers stop), under a name the tests'
    parameters can take without shadowing the imported fixture."""
    return orchestrator


def test_granted_sub_agent_calls_mcp_tools_over_stdio_and_http(mcp_orchestrator):
    _, boss = mcp_orchestrator
    port = free_port()
    web = start_http_server(port)
    try:
        status = boss.add_mcp_server.remote("calc", STDIO).result()
        assert status["connected"] and "add" in status["tools"]
        http = {"transport": "http", "url": f"http://127.0.0.1:{port}/mcp"}
        assert boss.add_mcp_server.remote("web", http).result()["connected"]
        uses = script(
            call("mcp__calc__add", a=2, b=40),
            call("mcp__web__echo", text="over http"),
            [{"text": "done"}],
        )
        boss.create_subagent.remote("user", {"model": uses}, mcp=["calc", "web"]).result()
        done = boss.delegate.remote("user", "add", wait=True).result()
        first, second = tool_parts(done.message)
        assert first["state"] == "output-available" and first["output"] == "42"
        assert second["state"] == "output-available" and second["output"] == "over http"
        assert done.status == "completed"
        # no grant, no tool: the model's call is an unknown tool
        boss.create_subagent.remote(
            "outsider", {"model": script(call("mcp__calc__add", a=1, b=1), [{"text": "x"}])}
        ).result()
        denied = boss.delegate.remote("outsider", "add", wait=True).result()
        (part,) = tool_parts(denied.message)
        assert part["state"] == "output-error" and "unknown tool" in part["errorText"]
        # a grant limited to some tools, then revoked
        record = boss.grant_mcp.remote("outsider", "calc", ["echo"]).result()
        assert record.config["mcp_grants"] == {"calc": ["echo"]}
        assert [t["tool"] for t in record.config["mcp"]] == ["echo"]
        boss.revoke_mcp.remote("outsider").result()
        servers = boss.list_mcp_servers.remote().result()
        assert [s["name"] for s in servers] == ["calc", "web"]
        assert servers[0]["status"]["connected"] is True
    finally:
        web.kill()
        web.wait()


def test_server_config_survives_hibernation_and_a_killed_server_is_reconnected(mcp_orchestrator):
    ns, boss = mcp_orchestrator
    boss.add_mcp_server.remote("calc", STDIO).result()
    asks_pid = script(call("mcp__calc__pid"), [{"text": "ok"}])
    boss.create_subagent.remote("pidder", {"model": asks_pid}, mcp=["calc"]).result()
    first = tool_parts(boss.delegate.remote("pidder", "pid", wait=True).result().message)[0]
    pid = int(first["output"])
    assert ns.hibernate(boss.name)  # the configs live in the orchestrator's database
    servers = boss.list_mcp_servers.remote().result()
    assert [s["name"] for s in servers] == ["calc"]
    assert servers[0]["config"]["args"] == [SERVER]
    assert boss.list_subagents.remote().result()[0].config["mcp_grants"] == {"calc": None}
    os.kill(pid, signal.SIGKILL)
    # The client notices the death when the server's stream closes (a call sent in the
    # instant before that fails: it may have reached the server); then the next call
    # reconnects.
    wait_until(
        lambda: not boss.list_mcp_servers.remote().result()[0]["status"]["connected"],
        timeout=30,
    )
    # The next call reconnects. Under load the call that finds the dead link can
    # itself fail (it may have been written to the dead server's pipe, so it is not
    # retried, by design); the one after it must succeed on a new server process.
    for _ in range(2):
        again = tool_parts(boss.delegate.remote("pidder", "pid", wait=True).result().message)[0]
        if again["state"] == "output-available":
            break
    assert again["state"] == "output-available", again.get("errorText", again)
    assert int(again["output"]) != pid
    status = boss.list_mcp_servers.remote().result()[0]["status"]
    assert status["connects"] >= 2 and status["connected"]


def test_mcp_failures_are_output_errors_and_the_turn_goes_on(mcp_orchestrator):
    _, boss = mcp_orchestrator
    boss.add_mcp_server.remote("calc", {**STDIO, "timeout": 1.0}).result()
    broken = script(
        call("mcp__calc__fail", reason="server says no"),
        call("mcp__calc__hang"),
        call("mcp__calc__garbage"),
        call("mcp__calc__add", a="not a number", b=1),
        call("mcp__calc__add", a=1, b=1),
        [{"text": "survived"}],
    )
    boss.create_subagent.remote("tester", {"model": broken}, mcp={"calc": None}).result()
    # "hang" never answers: the turn goes on only through the call's 1 s timeout
    done = boss.delegate.remote("tester", "try", wait=True).result()
    failed, hung, junk, invalid, ok = tool_parts(done.message)
    assert failed["state"] == "output-error" and "server says no" in failed["errorText"]
    assert hung["state"] == "output-error" and "timed out after 1s" in hung["errorText"]
    assert junk["state"] == "output-error" and "not MCP" in junk["errorText"]
    assert invalid["state"] == "output-error" and "a" in invalid["errorText"]
    assert ok["state"] == "output-available" and ok["output"] == "2"
    assert done.status == "completed" and done.text == "survived"


def test_bad_configs_and_grants_are_refused(mcp_orchestrator):
    from thinkray.runtime.tools.mcp import McpConfigError

    _, boss = mcp_orchestrator
    with pytest.raises(McpConfigError, match="needs a 'command'"):
        boss.add_mcp_server.remote("x", {"transport": "stdio"}).result()
    with pytest.raises(McpConfigError, match="unknown MCP server"):
        boss.create_subagent.remote("s", {"model": script([{"text": "x"}])}, mcp=["nope"]).result()
    down = boss.add_mcp_server.remote("down", {"command": "/nonexistent/mcp"}).result()
    assert not down["connected"] and "connection failed" in down["last_error"]
    with pytest.raises(McpConfigError):
        boss.remove_mcp_server.remote("never-added").result()
    boss.remove_mcp_server.remote("down").result()
    assert boss.list_mcp_servers.remote().result() == []
