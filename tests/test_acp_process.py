"""The ``thinkray acp`` process's life (issue 25, part 1): a turn the model fails is a
JSON-RPC error with its partial stored; a second process on the same agent file is
refused at start with the reason; after a SIGKILL mid-turn a new process loads the
session (the cut-off answer's stored beginning, closed as interrupted) and goes on.
Raw JSON-RPC lines on the real processes; no Ray, no npm."""

from __future__ import annotations

from typing import Any

from tests.acp_agents import AcpTestAgent
from tests.acp_support import HANG_GUARD, Server, error_of

WORDS = "".join(f"w{i} " for i in range(400))  # the "slow 400" answer, whole


def text(notes: list[dict[str, Any]], kind: str = "agent_message_chunk") -> str:
    return "".join(
        n["params"]["update"]["content"]["text"]
        for n in notes
        if n["params"]["update"]["sessionUpdate"] == kind
    )


def open_agent(root) -> AcpTestAgent:
    return AcpTestAgent(root / "acp" / "acp.duckdb")


def started(server: Server) -> str:
    assert server.request("initialize", {"protocolVersion": 1})["result"]
    created = server.request("session/new", {"cwd": "/tmp/p", "mcpServers": []})
    return str(created["result"]["sessionId"])


def prompt(server: Server, sid: str, words: str) -> dict[str, Any]:
    return server.request(
        "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": words}]}
    )


def test_a_failed_turn_is_an_error_and_its_partial_is_stored(tmp_path):
    server = Server(tmp_path)
    try:
        sid = started(server)
        failed = prompt(server, sid, "fail")
        assert error_of(failed)[1] == -32603
        assert "the model fell over" in failed["error"]["data"]["details"]
        assert text(server.notes) == "half an "  # streamed before the failure
        assert prompt(server, sid, "again")["result"] == {"stopReason": "end_turn"}
        assert server.close() == 0
    finally:
        server.kill()
    agent = open_agent(tmp_path)
    try:
        history = agent.get_history(sid)
        failed_answer = history[1]
        assert failed_answer["metadata"]["status"] == "error"
        assert "".join(p.get("text", "") for p in failed_answer["parts"]) == "half an "
    finally:
        agent.close()


def test_a_second_process_on_the_same_agent_is_refused(tmp_path):
    first = Server(tmp_path)
    try:
        started(first)  # it holds the agent's file from its start
        second = Server(tmp_path)
        try:
            assert second.proc.wait(timeout=HANG_GUARD) == 2
            assert second.close() == 2
            assert "held by another process" in second.stderr
            assert "--name" in second.stderr  # what to do about it
        finally:
            second.kill()
        assert first.proc.poll() is None  # the first one goes on serving
        assert first.close() == 0
    finally:
        first.kill()


def test_sigkill_mid_turn_then_load_in_a_new_process(tmp_path):
    first = Server(tmp_path)
    try:
        sid = started(first)
        first.send(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "session/prompt",
                "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "slow 400"}]},
            }
        )
        seen: list[dict[str, Any]] = []
        while len(seen) < 3:
            message = first.read()
            if message.get("method") == "session/update":
                seen.append(message)
    finally:
        first.kill()  # SIGKILL by pid, mid-turn
    assert text(seen) == WORDS[: len(text(seen))]

    second = Server(tmp_path)
    try:
        assert second.request("initialize", {"protocolVersion": 1})["result"]
        loaded = second.request(
            "session/load", {"sessionId": sid, "cwd": "/tmp/p", "mcpServers": []}
        )
        assert loaded["result"] == {}
        assert text(second.notes, "user_message_chunk") == "slow 400"
        # The stored partial is the answer's beginning: the recorder writes in batches
        # (every 30 ms), so a crash may cut it a batch behind or ahead of what went out.
        replayed = text(second.notes)
        assert replayed == WORDS[: len(replayed)]
        assert prompt(second, sid, "after the crash")["result"] == {"stopReason": "end_turn"}
        assert second.close() == 0
    finally:
        second.kill()
    agent = open_agent(tmp_path)
    try:
        history = agent.get_history(sid)
        assert history[1]["metadata"]["status"] == "interrupted"  # closed at the wake
        assert history[-1]["parts"][-1]["text"] == "echo: after the crash"
    finally:
        agent.close()
