"""``thinkray acp`` driven by the official ACP client, ``@agentclientprotocol/sdk`` from
npm (issue 25, part 1), spawning it as an editor does (``tests/acp_client.mjs``): a new
session, a prompt with a tool call, an approval granted, one denied, one cancelled with
its turn, a turn cancelled mid-stream; then, in new processes on the same agent file,
``session/load`` (the history replayed) and ``session/resume`` (no replay), each
followed by a prompt and ``session/close``.

Needs ``node`` (>= 20) and ``npm``: the SDK (major 2) and ``zod@4`` (its peer) are
installed once into ``tests/.npm-cache/acp`` (:mod:`tests.npm_support`). No Ray: the
agent (``tests.acp_agents:AcpTestAgent``) runs inside the ``thinkray acp`` process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.acp_agents import AcpTestAgent
from tests.npm_support import installed_version, npm_project

pytestmark = [pytest.mark.node, pytest.mark.xdist_group("acp-npm")]

REPO = Path(__file__).resolve().parent.parent
CLIENT = Path(__file__).resolve().parent / "acp_client.mjs"
NODE_TIMEOUT = 180
PRINCIPAL = "alice-editor"


@pytest.fixture(scope="module")
def acp_client() -> Path:
    project = npm_project("acp", {"@agentclientprotocol/sdk": "2.", "zod": "4."})
    shutil.copyfile(CLIENT, project / "client.mjs")  # next to its node_modules
    print(
        "ACP client: @agentclientprotocol/sdk",
        installed_version(project, "@agentclientprotocol/sdk"),
        "zod",
        installed_version(project, "zod"),
    )
    return project


class Agent:
    """Where the tests' agent file lives, and how to run the client against it."""

    def __init__(self, project: Path, root: Path) -> None:
        self.project, self.root = project, root
        self.marks = root / "deploy-marks.txt"

    def command(self) -> list[str]:
        thinkray = Path(sys.executable).with_name("thinkray")
        return [
            str(thinkray),
            "acp",
            "--agent",
            "tests.acp_agents:AcpTestAgent",
            "--storage-root",
            str(self.root),
            "--principal",
            PRINCIPAL,
        ]

    def run(self, scenario: str, session_id: str = "") -> dict[str, Any]:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p
            ),
            "ACP_TEST_MARKS": str(self.marks),
        }
        proc = subprocess.run(
            [
                shutil.which("node") or "node",
                "client.mjs",
                scenario,
                json.dumps(self.command()),
                session_id,
            ],
            cwd=self.project,
            env=env,
            capture_output=True,
            text=True,
            timeout=NODE_TIMEOUT,
        )
        assert proc.returncode == 0, f"the ACP client failed:\n{proc.stderr[-4000:]}"
        out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out["exitCode"] == 0, proc.stderr[-4000:]  # it exits cleanly on end of input
        return out

    def open(self) -> AcpTestAgent:
        """The agent's file opened here (the server process has exited)."""
        return AcpTestAgent(self.root / "acp" / "acp.duckdb")


@pytest.fixture(scope="module")
def agent(acp_client, tmp_path_factory) -> Agent:
    return Agent(acp_client, tmp_path_factory.mktemp("acp-root"))


@pytest.fixture(scope="module")
def first(agent) -> dict[str, Any]:
    return agent.run("first")


def kinds(updates: list[dict[str, Any]]) -> list[str]:
    return [u["update"] for u in updates]


def text_of(updates: list[dict[str, Any]], kind: str = "agent_message_chunk") -> str:
    return "".join(u.get("text", "") for u in updates if u["update"] == kind)


def tool_statuses(updates: list[dict[str, Any]]) -> list[str]:
    return [u["status"] for u in updates if u["update"].startswith("tool_call") and "status" in u]


def test_initialize_advertises_the_session_methods(first):
    caps = first["init"]["agentCapabilities"]
    assert caps["loadSession"] is True
    assert caps["sessionCapabilities"] == {"list": {}, "resume": {}, "close": {}}
    assert first["init"]["agentInfo"]["name"] == "thinkray"


def test_new_session_is_a_thinkray_session(first, agent):
    thinkray = agent.open()
    try:
        info = thinkray.store.get_session(first["sessionId"])  # the same id, both layers
        assert info.metadata["acp"] == {"cwd": "/tmp/acp-project"}
    finally:
        thinkray.close()


def test_prompt_streams_reasoning_a_tool_call_and_text(first):
    turn = first["weather"]
    assert turn["stopReason"] == "end_turn"
    updates = turn["updates"]
    assert kinds(updates) == [
        "agent_thought_chunk",
        "agent_thought_chunk",
        "tool_call",
        "tool_call_update",
        "tool_call_update",
        "agent_message_chunk",
    ]
    assert text_of(updates, "agent_thought_chunk") == "Checking the forecast."
    call = updates[2]
    assert (call["title"], call["kind"], call["status"]) == ("get_weather", "fetch", "pending")
    assert updates[3]["rawInput"] == {"city": "Paris"}
    done = updates[4]
    assert (done["toolCallId"], done["status"]) == (call["toolCallId"], "completed")
    assert done["rawOutput"] == done["content"] == "light rain, 14°C"
    assert text_of(updates) == "It is light rain, 14°C."
    # Every chunk of the assistant message carries its stored id.
    assert len({u["messageId"] for u in updates if "messageId" in u}) == 1


def _deploy_record(thinkray: AcpTestAgent, target: str) -> Any:
    [rec] = [
        r
        for r in thinkray.tool_calls.store.rows()
        if r.tool_name == "deploy" and r.input == {"target": target}
    ]
    return rec


def test_permission_granted_is_the_durable_approval(first, agent):
    turn = first["approved"]
    assert turn["stopReason"] == "end_turn"
    call_id = turn["updates"][0]["toolCallId"]
    asked = first["permissions"][0]
    assert asked["toolCallId"] == call_id and asked["status"] == "pending"
    assert asked["rawInput"] == {"target": "alpha"}
    assert asked["options"] == [
        ["once", "allow_once"],
        ["session", "allow_always"],
        ["always", "allow_always"],
        ["deny", "reject_once"],
    ]
    assert tool_statuses(turn["updates"]) == ["pending", "in_progress", "completed"]
    assert text_of(turn["updates"]) == "done: deployed alpha"
    thinkray = agent.open()
    try:
        rec = _deploy_record(thinkray, "alpha")
        assert rec.status == "completed"
        assert rec.approval["decision"] == "once"
        assert rec.approval["answered_by"] == PRINCIPAL  # who approved it, as HTTP records
        audit = thinkray.tool_calls.store.audit_rows(rec.id)
        assert ("approved", PRINCIPAL) in [(a.decision, a.by) for a in audit]
    finally:
        thinkray.close()
    assert agent.marks.read_text().splitlines().count("alpha") == 1


def test_permission_denied_never_runs_the_tool(first, agent):
    turn = first["denied"]
    assert turn["stopReason"] == "end_turn"
    assert tool_statuses(turn["updates"]) == ["pending", "failed"]
    assert turn["updates"][-2]["content"] == "denied"
    thinkray = agent.open()
    try:
        rec = _deploy_record(thinkray, "beta")
        assert rec.status == "denied"
        assert (rec.approval["decision"], rec.approval["answered_by"]) == ("deny", PRINCIPAL)
        call_id = rec.id.split("~", 1)[0]  # the ledger's row id is the call id ~ run id
        assert call_id == turn["updates"][0]["toolCallId"]
        history = thinkray.get_history(first["sessionId"])
        [part] = [p for m in history for p in m["parts"] if p.get("toolCallId") == call_id]
        assert part["state"] == "output-denied"
    finally:
        thinkray.close()
    assert "beta" not in agent.marks.read_text().splitlines()


def test_cancel_while_asking_aborts_the_turn(first, agent):
    turn = first["cancelledAsk"]
    assert turn["stopReason"] == "cancelled"
    assert tool_statuses(turn["updates"]) == ["pending", "failed"]
    assert turn["updates"][-1]["content"].startswith("aborted")
    assert "gamma" not in agent.marks.read_text().splitlines()


def test_cancel_mid_stream_keeps_the_partial(first, agent):
    turn = first["cancelled"]
    assert turn["stopReason"] == "cancelled"
    streamed = text_of(turn["updates"])
    assert streamed.startswith("w0 w1 w2 ")
    assert len(streamed.split()) < 400  # cut short
    thinkray = agent.open()
    try:
        last = thinkray.get_history(first["sessionId"])[-1]
        assert last["role"] == "assistant"
        assert last["metadata"]["status"] == "aborted"
        stored = "".join(p.get("text", "") for p in last["parts"] if p["type"] == "text")
        assert stored.startswith(streamed)  # everything the editor saw is stored
    finally:
        thinkray.close()


def test_load_after_restart_replays_every_message(first, agent):
    thinkray = agent.open()
    try:
        history = thinkray.get_history(first["sessionId"])
    finally:
        thinkray.close()
    out = agent.run("load", first["sessionId"])  # a new thinkray acp process
    replayed = out["replayed"]
    assert {u["sessionId"] for u in replayed} == {first["sessionId"]}
    # One user chunk per user message, in order, each with the stored message's id.
    users = [u for u in replayed if u["update"] == "user_message_chunk"]
    stored_users = [m for m in history if m["role"] == "user"]
    assert [(u["messageId"], u["text"]) for u in users] == [
        (m["id"], m["parts"][0]["text"]) for m in stored_users
    ]
    assert [u["text"] for u in users][:5] == [
        "weather Paris",
        "deploy alpha",
        "deploy beta",
        "deploy gamma",
        "slow 400",
    ]
    # Tool calls come back with their final status; the assistant's words and thoughts too.
    calls = {
        u["rawInput"].get("city") or u["rawInput"]["target"]: u
        for u in replayed
        if u["update"] == "tool_call"
    }
    assert (
        calls["Paris"]["status"] == "completed"
        and calls["Paris"]["rawOutput"] == "light rain, 14°C"
    )
    assert calls["alpha"]["status"] == "completed"
    assert calls["beta"]["status"] == "failed" and calls["gamma"]["status"] == "failed"
    assert "It is light rain, 14°C." in text_of(replayed)
    assert "Checking the forecast." in text_of(replayed, "agent_thought_chunk")
    assert text_of(first["cancelled"]["updates"]) in text_of(replayed)  # the kept partial
    # The loaded session takes prompts; closed, it does not (ACP's resource not found).
    assert out["after"]["stopReason"] == "end_turn"
    assert text_of(out["after"]["updates"]) == "echo: hello again"
    assert out["promptAfterClose"]["code"] == -32002
    assert out["loadUnknown"]["code"] == -32002


def test_resume_rejoins_without_replay(first, agent):
    out = agent.run("resume", first["sessionId"])
    assert out["replayed"] == []
    assert out["after"]["stopReason"] == "end_turn"
    assert text_of(out["after"]["updates"]) == "echo: after resume"
    thinkray = agent.open()
    try:
        history = thinkray.get_history(first["sessionId"])
        texts = [
            "".join(p.get("text", "") for p in m["parts"] if p["type"] == "text") for m in history
        ]
        assert "after resume" in texts and "echo: after resume" in texts
    finally:
        thinkray.close()
