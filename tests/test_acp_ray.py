"""``thinkray acp --ray`` (issue 25, part 1): the ACP server in front of an agent of a
namespace running in the test session's Ray. The test process owns the namespace; two
``thinkray acp --ray`` processes join the cluster in turn (``RAY_ADDRESS``): the first
creates a session and runs a turn whose tool call is approved over ACP, the second
loads the session (replayed from the agent's actor). Through the namespace's own
handle the test then reads the same session and the approval, answered by the ACP
principal."""

from __future__ import annotations

from typing import Any

import pytest

from tests.acp_support import Server, error_of

pytestmark = pytest.mark.ray

PRINCIPAL = "carol-editor"


def updates(server: Server) -> list[dict[str, Any]]:
    return [n["params"]["update"] for n in server.notes]


def run_deploy(server: Server, sid: str) -> dict[str, Any]:
    """A ``deploy alpha`` turn whose permission request is answered ``once``."""
    server.send(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "session/prompt",
            "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "deploy alpha"}]},
        }
    )
    while True:
        message = server.read()
        if message.get("method") == "session/request_permission":
            server.send(
                {
                    "jsonrpc": "2.0",
                    "id": message["id"],
                    "result": {"outcome": {"outcome": "selected", "optionId": "once"}},
                }
            )
        elif message.get("method") == "session/update":
            server.notes.append(message)
        elif message.get("id") == 1:
            return message


def test_acp_drives_an_agent_of_a_running_namespace(namespace_factory, ray_local, tmp_path):
    from tests.acp_agents import AcpTestAgent

    ns = namespace_factory(AcpTestAgent)
    env = {"RAY_ADDRESS": ray_local.get_runtime_context().gcs_address}
    args = ("--ray", "--namespace", ns.name, "--name", "editor-1", "--principal", PRINCIPAL)
    first = Server(None, *args, env=env)
    try:
        assert first.request("initialize", {"protocolVersion": 1})["result"]
        created = first.request("session/new", {"cwd": "/tmp/p", "mcpServers": []})
        sid = created["result"]["sessionId"]
        done = run_deploy(first, sid)
        assert done["result"] == {"stopReason": "end_turn"}, done
        statuses = [u.get("status") for u in updates(first) if "toolCallId" in u]
        assert [s for s in statuses if s] == ["pending", "in_progress", "completed"]
        assert updates(first)[-1]["content"]["text"] == "done: deployed alpha"
        assert first.close() == 0, first.stderr
    finally:
        first.kill()

    handle = ns.get("editor-1")
    [call] = [c for c in handle.list_tool_calls.remote().result() if c["tool_name"] == "deploy"]
    assert call["status"] == "completed"
    assert (call["approval"]["decision"], call["approval"]["answered_by"]) == ("once", PRINCIPAL)

    second = Server(None, *args, env=env)
    try:
        assert second.request("initialize", {"protocolVersion": 1})["result"]
        loaded = second.request(
            "session/load", {"sessionId": sid, "cwd": "/tmp/p", "mcpServers": []}
        )
        assert loaded["result"] == {}
        replayed = updates(second)
        assert [u["sessionUpdate"] for u in replayed] == [
            "user_message_chunk",
            "tool_call",
            "agent_message_chunk",
        ]
        assert replayed[1]["status"] == "completed"
        unknown = second.request("session/resume", {"sessionId": "nope", "cwd": "/tmp/p"})
        assert error_of(unknown)[1] == -32002
        assert second.close() == 0, second.stderr
    finally:
        second.kill()
    history = handle.get_history.remote(sid).result()  # the same session, both layers
    assert [m["role"] for m in history] == ["user", "assistant"]
