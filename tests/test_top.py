"""``thinkray top`` (issue 14, item 3): the live view of a cluster's namespaces. With a
turn held in flight (its tool waits for a gate file) the JSON document shows the
namespace and its pool, the agent busy with a run duration and the tokens of its
finished step; after a failed turn the session reads error and the error is listed;
an agent whose process died shows in the directory's recent errors; the text view
carries the same rows. Plus the progress bar's plain (non-terminal) output. No
timing assertions."""

from __future__ import annotations

import io
import json
import os
from typing import Any

import pytest
from thinkray.actors.cli import main
from thinkray.actors.progress import Progress
from thinkray.actors.top import agent_rows, gather, parse_directory_name, render_text
from thinkray.runtime.agents.think import Think
from thinkray.runtime.models.base import Model, ModelRequest
from thinkray.runtime.models.testing import FunctionModel, Reply, reply, tool_call
from thinkray.runtime.tools.base import Tool, tool

from tests.helpers import kill_agent_process, wait_until

STEP_USAGE = {"input": 100, "output": 20, "cache_read": 3}
STEP_TOKENS = 123


class GateAgent(Think):
    """``hold <path>``: one step that calls ``wait_gate`` (usage ``STEP_USAGE``), whose
    tool waits until the file ``path`` exists, then a closing step. ``fail``: the model
    fails the turn."""

    def get_model(self) -> Model:
        return FunctionModel(self._step, model_id="gate")

    def get_tools(self) -> dict[str, Tool]:
        @tool
        async def wait_gate(path: str) -> str:
            """Wait until the test opens the gate (creates the file)."""
            import asyncio

            while not os.path.exists(path):
                await asyncio.sleep(0.02)
            return "open"

        return {"wait_gate": wait_gate}

    def _step(self, request: ModelRequest, step: int) -> Reply:
        last = request.messages[-1]
        if last.role == "tool":
            return reply("gate opened")
        text = " ".join(getattr(c, "text", "") for c in last.content)
        verb, _, arg = text.partition(" ")
        if verb == "hold":
            return reply(tool_call("wait_gate", {"path": arg}), usage=STEP_USAGE)
        if verb == "fail":
            return reply("never", fail_at=0, error="the model exploded")
        return reply("ok")


def _top(capsys: Any, ns_name: str) -> dict[str, Any]:
    """``thinkray top --json --namespace ns_name``, in process: the namespace's entry."""
    capsys.readouterr()
    assert main(["top", "--json", "--namespace", ns_name]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [n["namespace"] for n in doc["namespaces"]] == [ns_name]
    return doc


def _agent(doc: dict[str, Any], name: str) -> dict[str, Any] | None:
    for agent in doc["namespaces"][0]["agents"]:
        if agent["agent"] == name:
            return agent
    return None


@pytest.mark.ray
def test_top_shows_a_turn_in_flight_errors_and_the_pool(namespace_factory, tmp_path, capsys):
    # by its package path, so the actor's worker process imports the same module
    from tests.test_top import GateAgent as Gate

    ns = namespace_factory(Gate, pool_size=1, idle_timeout=None)
    gate = tmp_path / "gate"
    holder = ns.get("holder")
    pending = holder.chat.remote(f"hold {gate}")

    def busy_with_tokens() -> dict[str, Any] | None:
        doc = _top(capsys, ns.name)
        agent = _agent(doc, "holder")
        if agent is None or not agent["sessions"]:
            return None
        row = agent["sessions"][0]
        return doc if row["state"] == "busy" and row["tokens"] else None

    try:
        doc = wait_until(busy_with_tokens, timeout=60)
        entry = doc["namespaces"][0]
        assert entry["shards"] == entry["shards_total"] == 1
        assert entry["live"] >= 1
        assert entry["pool"]["max_live"] == 64
        assert {"free", "starting", "waiting", "target"} <= set(entry["pool"])
        assert entry["pool"]["target"] >= 1  # pool_size
        agent = _agent(doc, "holder")
        assert agent is not None and agent["unreachable"] is False
        (row,) = agent["sessions"]
        assert row["state"] == "busy" and row["run_id"]
        assert row["duration_s"] > 0
        assert row["tokens"] == STEP_TOKENS  # the finished step's; the turn is not over
        assert row["usage"]["input"] == 100 and row["usage"]["output"] == 20

        capsys.readouterr()
        assert main(["top", "--once", "--namespace", ns.name]) == 0
        text = capsys.readouterr().out
        line = next(x for x in text.splitlines() if " holder " in f" {x} ")
        assert ns.name in line and "busy" in line and str(STEP_TOKENS) in line
        assert "LIVE/MAX" in text and "POOL" in text
    finally:
        gate.write_text("open")
    assert pending.result().status == "completed"

    # A failed turn: the session reads error, and the error is among the recent ones.
    result = holder.chat.remote("fail now").result()
    assert result.status == "error"
    doc = _top(capsys, ns.name)
    agent = _agent(doc, "holder")
    assert agent is not None
    (row,) = agent["sessions"]
    assert row["state"] == "error" and "the model exploded" in row["message"]
    assert row["run_id"] is None and row["tokens"] is None
    errors = doc["namespaces"][0]["recent_errors"]
    assert any(
        e["kind"] == "session" and e["agent"] == "holder" and "the model exploded" in e["message"]
        for e in errors
    )
    text = render_text(doc)
    assert "recent errors" in text and "the model exploded" in text
    assert any(r[1] == "holder" and r[3] == "error" for r in agent_rows(doc))

    # An agent whose process dies: the directory's own recent errors say so.
    victim = ns.get("victim")
    assert victim.chat.remote("hello").result().status == "completed"
    kill_agent_process(ns, "victim")

    def died() -> list[dict[str, Any]]:
        errors = gather(ns.name)["namespaces"][0]["recent_errors"]
        return [e for e in errors if e["kind"] == "actor_died" and e["agent"] == "victim"]

    (error,) = wait_until(died, timeout=60)
    assert error["at"] is not None and error["shard"] == 0
    assert _agent(gather(ns.name), "victim") is None  # no longer live
    assert "victim" in render_text(gather(ns.name))


def test_render_text_without_ray() -> None:
    doc = {
        "at": 0.0,
        "namespaces": [
            {
                "namespace": "chat",
                "shards": 1,
                "shards_total": 2,
                "pool": {"free": 2, "starting": 1, "waiting": 0, "target": 3, "max_live": 64},
                "live": 2,
                "agents": [
                    {"agent": "a", "unreachable": True, "reason": "timeout", "sessions": []},
                    {
                        "agent": "b",
                        "unreachable": False,
                        "sessions": [
                            {
                                "session_id": "s1",
                                "state": "retrying",
                                "attempt": 2,
                                "message": "overloaded",
                                "duration_s": 75.0,
                                "tokens": 1500,
                            }
                        ],
                    },
                ],
                "recent_errors": [
                    {"at": 0.0, "kind": "bind", "agent": "c", "message": "locked"},
                ],
                "unreachable_shards": [{"shard": 1, "reason": "timeout"}],
            }
        ],
    }
    text = render_text(doc)
    assert "1 namespaces, 2 live agents" in text
    assert "unreachable" in text and "timeout" in text
    b_line = next(x for x in text.splitlines() if x.startswith("chat") and " b " in x)
    assert "retrying" in b_line and "1m15s" in b_line and "1,500" in b_line
    assert "attempt 2: overloaded" in b_line
    assert "shard 1: directory unreachable" in text and "bind: locked" in text
    assert "no namespace directory" in render_text({"at": 0.0, "namespaces": []})


def test_parse_directory_name() -> None:
    assert parse_directory_name("thinkray-directory-chat") == ("chat", 0)
    assert parse_directory_name("thinkray-directory-a.b-c/3") == ("a.b-c", 3)
    assert parse_directory_name("thinkray-session/chat/0/abc") is None
    assert parse_directory_name("thinkray-directory-chat/x") is None


def test_progress_plain_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    with Progress(4, "scanning", out, line_every=0.0) as bar:
        for _ in range(3):
            bar.step()
        bar.step(failed=True)
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()  # no redraws in a log
    assert lines[0].startswith("scanning [") and "1/4" in lines[0]
    assert lines[-1].startswith("scanning [" + "#" * 30 + "] 4/4 100%")
    assert "(1 failed)" in lines[-1]


def test_progress_redraws_on_a_terminal_and_is_silent_when_disabled() -> None:
    out = io.StringIO()
    bar = Progress(2, "waking", out, tty=True)
    bar.step()
    bar.step()
    bar.close()
    bar.close()  # idempotent
    text = out.getvalue()
    assert text.startswith("\rwaking [") and text.endswith("\n") and text.count("\n") == 1
    quiet = io.StringIO()
    with Progress(2, "waking", quiet, enabled=False) as silent:
        silent.step(2)
    assert quiet.getvalue() == "" and silent.done == 2
