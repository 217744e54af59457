"""Seed 002 "Permission scopes": manifest / session / project rules, most specific wins,
pins, and the ask flow (once / session / always / deny) end to end through Think.chat."""

from __future__ import annotations

import asyncio

import pytest
from thinkray.runtime import tool
from thinkray.runtime.agents.agent import Agent as _Agent
from thinkray.runtime.capabilities.permissions import (
    PROJECT_RULES_KEY,
    ApprovalNotFoundError,
    MemoryProjectRules,
    PermissionRule,
    evaluate,
)
from thinkray.runtime.models.testing import ScriptedModel, reply, tool_call
from thinkray.storage.session_store import DuckDBSessionStore

from tests.conftest import Collector

CALLS: list[str] = []


@tool
def bash(command: str) -> str:
    """Run a shell command."""
    CALLS.append(command)
    return f"ran {command}"


@tool
def read_file(path: str) -> str:
    """Read a file."""
    CALLS.append(f"read {path}")
    return f"contents of {path}"


@pytest.fixture(autouse=True)
def _reset_calls():
    CALLS.clear()


class Agent(_Agent):
    permission_rules = ({"tool": "bash", "action": "ask"},)
    approval_timeout = 5.0

    def get_tools(self):
        return {"bash": bash, "read_file": read_file}


def script(*commands: str) -> ScriptedModel:
    """One tool call per turn, each followed by a final answer."""
    replies = []
    for i, cmd in enumerate(commands):
        replies += [reply(tool_call("bash", {"command": cmd}, id=f"call{i}")), reply("done")]
    return ScriptedModel(replies)


async def wait_pending(agent, n: int = 1, session_id=None):
    for _ in range(400):
        pending = agent.pending_approvals(session_id)
        if len(pending) >= n:
            return pending
        await asyncio.sleep(0.005)
    raise AssertionError("no approval request arrived")


def tool_part(message):
    return next(p for p in message["parts"] if p["type"] == "dynamic-tool")


# -- evaluation (pure) -------------------------------------------------------------------


def test_manifest_deny_overridden_by_session_allow_unless_pinned():
    manifest = [{"tool": "bash", "action": "deny"}]
    session = [{"tool": "bash", "action": "allow"}]
    assert evaluate("bash", {}, manifest=manifest).action == "deny"
    decision = evaluate("bash", {}, manifest=manifest, session=session)
    assert decision.action == "allow" and decision.scope == "session"
    pinned = [{"tool": "bash", "action": "deny", "pin": True}]
    decision = evaluate("bash", {}, manifest=pinned, session=session, project=session)
    assert decision.action == "deny" and decision.scope == "manifest" and decision.rule.pin


def test_project_overrides_manifest_default_but_not_pins():
    manifest = [
        {"tool": "read_file", "action": "ask"},
        {"tool": "bash", "action": "ask", "pin": True},
    ]
    project = [{"tool": "read_file", "action": "allow"}, {"tool": "bash", "action": "allow"}]
    assert evaluate("read_file", {}, manifest=manifest, project=project).action == "allow"
    assert evaluate("bash", {}, manifest=manifest, project=project).action == "ask"
    # Session beats project at equal specificity.
    session = [{"tool": "read_file", "action": "deny"}]
    assert evaluate("read_file", {}, manifest=manifest, project=project, session=session).scope == (
        "session"
    )


def test_most_specific_rule_wins():
    # An exact manifest name beats a session glob, whatever the scope order.
    decision = evaluate(
        "bash",
        {},
        manifest=[{"tool": "bash", "action": "deny"}],
        session=[{"tool": "*", "action": "allow"}],
    )
    assert decision.action == "deny"
    # An input match beats no match (same tool, same scope or lower).
    manifest = [
        {"tool": "bash", "action": "allow"},
        {"tool": "bash", "action": "ask", "match": {"command": "rm *"}},
    ]
    assert evaluate("bash", {"command": "ls"}, manifest=manifest).action == "allow"
    assert evaluate("bash", {"command": "rm -rf /"}, manifest=manifest).action == "ask"
    session = [{"tool": "bash", "action": "allow"}]
    assert evaluate("bash", {"command": "rm x"}, manifest=manifest, session=session).action == "ask"
    # A tighter glob beats a looser one.
    rules = [{"tool": "fs_*", "action": "deny"}, {"tool": "*", "action": "allow"}]
    assert evaluate("fs_write", {}, session=rules).action == "deny"
    assert evaluate("net_get", {}, session=rules).action == "allow"
    # Within one scope the most recent rule wins.
    both = [{"tool": "bash", "action": "deny"}, {"tool": "bash", "action": "allow"}]
    assert evaluate("bash", {}, session=both).action == "allow"
    # Among equally specific pins the most restrictive wins.
    pins = [
        {"tool": "bash", "action": "allow", "pin": True},
        {"tool": "bash", "action": "deny", "pin": True},
    ]
    assert evaluate("bash", {}, manifest=pins).action == "deny"
    # Nothing matches: the documented default.
    assert evaluate("other", {}).action == "allow"
    assert evaluate("other", {}, default="ask").action == "ask"


def test_match_on_nested_and_non_string_fields():
    rule = PermissionRule(
        tool="http", action="deny", match={"req.url": "https://evil.*", "req.n": "3"}
    )
    assert rule.matches("http", {"req": {"url": "https://evil.com", "n": 3}})
    assert not rule.matches("http", {"req": {"url": "https://good.com", "n": 3}})
    assert not rule.matches("http", {"req": {"url": "https://evil.com"}})  # missing field


def test_bad_rules_are_rejected():
    with pytest.raises(ValueError):
        PermissionRule(tool="bash", action="maybe")
    with pytest.raises(ValueError):
        PermissionRule(tool="", action="allow")
    with pytest.raises(ValueError):
        MemoryProjectRules([{"tool": "bash", "action": "allow", "pin": True}])
    with pytest.raises(ValueError):

        class Broken(_Agent):
            permission_rules = ({"tool": "bash"},)


def test_manifest_is_immutable_tuple_of_rules():
    assert isinstance(Agent.permission_rules, tuple)
    assert isinstance(Agent.permission_rules[0], PermissionRule)
    with pytest.raises(Exception):  # noqa: B017 - frozen pydantic model
        Agent.permission_rules[0].action = "allow"  # type: ignore[misc]


# -- scopes on an agent ----------------------------------------------------------------------


async def test_session_rules_live_on_the_session_row(store):
    agent = Agent(store, model=ScriptedModel())
    s1 = agent.create_session("one").id
    s2 = agent.create_session("two").id
    agent.add_session_rule({"tool": "bash", "action": "allow"}, s1)
    assert store.get_session(s1).permissions["rules"] == [{"tool": "bash", "action": "allow"}]
    assert agent.evaluate_permission("bash", {}, s1).action == "allow"
    assert agent.evaluate_permission("bash", {}, s2).action == "ask"
    with pytest.raises(ValueError):
        agent.add_session_rule({"tool": "bash", "action": "allow", "pin": True}, s1)
    assert agent.remove_session_rule({"tool": "bash", "action": "allow"}, s1)
    assert agent.evaluate_permission("bash", {}, s1).action == "ask"


async def test_project_rules_in_config_and_injectable(store):
    agent = Agent(store, model=ScriptedModel())
    sid = agent.create_session().id
    agent.add_project_rule({"tool": "bash", "action": "allow"})
    assert store.get_config(PROJECT_RULES_KEY) == [{"tool": "bash", "action": "allow"}]
    assert agent.evaluate_permission("bash", {}, sid).action == "allow"
    agent.project_rules = MemoryProjectRules([{"tool": "bash", "action": "deny"}])
    assert agent.evaluate_permission("bash", {}, sid).action == "deny"


# -- through Think.chat ----------------------------------------------------------------------


async def test_rule_deny_becomes_a_tool_error_and_the_tool_never_runs(store):
    class Denying(Agent):
        permission_rules = ({"tool": "bash", "action": "deny"},)

    model = script("rm -rf /")
    agent = Denying(store, model=model)
    result = await agent.chat("go")
    assert result.status == "completed" and CALLS == []
    part = tool_part(result.message)
    assert part["state"] == "output-error" and "denied by the manifest rule" in part["errorText"]
    tool_result = model.requests[1].messages[-1].content[0]
    assert tool_result.is_error and "permission denied" in tool_result.output


async def test_ask_once_runs_the_call_and_asks_again_next_time(store):
    model = script("ls", "pwd")
    agent = Agent(store, model=model)
    collector = Collector()
    run = agent.start_chat("list", collector)
    [pending] = await wait_pending(agent)
    assert pending["tool_name"] == "bash" and pending["input"] == {"command": "ls"}
    assert pending["tool_call_id"] == "call0" and pending["status"] == "pending"
    types = collector.types()
    request = next(c for c in collector.events if c["type"] == "tool-approval-request")
    assert request == {
        "type": "tool-approval-request",
        "approvalId": pending["approval_id"],
        "toolCallId": "call0",
    }
    assert types.index("tool-input-available") < types.index("tool-approval-request")
    # While waiting, the stored part already says approval-requested (durable, visible).
    await asyncio.sleep(0.06)
    row = store.get_message(run.stream.message_id)
    assert tool_part(row)["state"] == "approval-requested"
    assert CALLS == []

    settled = agent.answer_approval(pending["approval_id"], "once", answered_by="alice")
    assert settled["status"] == "approved" and settled["answered_by"] == "alice"
    result = await run.task
    assert result.status == "completed" and CALLS == ["ls"]
    assert tool_part(result.message)["state"] == "output-available"
    assert agent.pending_approvals() == []
    with pytest.raises(ApprovalNotFoundError):
        agent.answer_approval(pending["approval_id"], "once")

    run = agent.start_chat("again")
    await wait_pending(agent)  # "once" left no rule behind
    agent.answer_approval(agent.pending_approvals()[0]["approval_id"], "once")
    await run.task
    assert CALLS == ["ls", "pwd"]
    assert agent.session_rules() == []


async def test_ask_session_adds_a_session_rule_that_does_not_leak(store):
    model = script("ls", "pwd", "whoami")
    agent = Agent(store, model=model)
    first = agent.create_session("first").id
    run = agent.start_chat("list", session_id=first)
    [pending] = await wait_pending(agent)
    agent.answer_approval(pending["approval_id"], "session")
    await run.task
    assert agent.session_rules(first) == [PermissionRule(tool="bash", action="allow")]

    result = await agent.chat("again", session_id=first)  # no ask this time
    assert result.status == "completed" and CALLS == ["ls", "pwd"]

    other = agent.create_session("other").id
    run = agent.start_chat("elsewhere", session_id=other)
    [pending] = await wait_pending(agent, session_id=other)
    assert pending["session_id"] == other
    agent.answer_approval(pending["approval_id"], "deny")
    await run.task
    assert CALLS == ["ls", "pwd"]
    assert agent.session_rules(other) == []


async def test_ask_always_persists_across_a_new_think_on_the_same_file(tmp_path):
    path = tmp_path / "a.duckdb"
    agent = Agent(DuckDBSessionStore(path), model=script("ls"))
    run = agent.start_chat("list")
    [pending] = await wait_pending(agent)
    agent.answer_approval(pending["approval_id"], "always")
    await run.task
    agent.close()

    again = Agent(DuckDBSessionStore(path), model=script("pwd"))
    fresh = again.create_session("new one").id
    assert again.evaluate_permission("bash", {"command": "x"}, fresh).action == "allow"
    result = await again.chat("go", session_id=fresh)
    assert result.status == "completed" and CALLS == ["ls", "pwd"]
    again.close()


async def test_ask_deny_ends_as_output_denied_for_the_model(store):
    model = script("rm -rf /")
    agent = Agent(store, model=model)
    collector = Collector()
    run = agent.start_chat("clean up", collector)
    [pending] = await wait_pending(agent)
    agent.answer_approval(pending["approval_id"], "deny")
    result = await run.task
    assert result.status == "completed" and CALLS == []
    assert {"type": "tool-output-denied", "toolCallId": "call0"} in collector.events
    assert "tool-output-error" not in collector.types()
    assert tool_part(result.message)["state"] == "output-denied"
    tool_result = model.requests[1].messages[-1].content[0]
    assert tool_result.is_error and "denied" in tool_result.output
    assert agent.get_approval(pending["approval_id"])["status"] == "denied"


async def test_ask_times_out_as_denied(store):
    class Impatient(Agent):
        approval_timeout = 0.05

    agent = Impatient(store, model=script("ls"))
    result = await agent.chat("list")
    assert result.status == "completed" and CALLS == []
    assert tool_part(result.message)["state"] == "output-denied"
    approval_id = tool_part(result.message)["approval"]["id"]
    assert agent.get_approval(approval_id)["status"] == "timed-out"
    assert agent.pending_approvals() == []


async def test_abort_while_pending_finalizes_the_call(store):
    agent = Agent(store, model=script("ls"))
    run = agent.start_chat("list")
    [pending] = await wait_pending(agent)
    assert agent.abort(reason="user left")
    result = await run.task
    assert result.status == "aborted" and CALLS == []
    assert agent.pending_approvals() == []
    assert agent.get_approval(pending["approval_id"])["status"] == "aborted"
    part = tool_part(agent.get_history()[-1])
    assert part["state"] == "output-error" and "aborted" in part["errorText"]
    with pytest.raises(ApprovalNotFoundError):
        agent.answer_approval(pending["approval_id"], "once")


async def test_pinned_ask_cannot_be_overridden_by_session_or_project(store):
    class Pinned(Agent):
        permission_rules = ({"tool": "bash", "action": "ask", "pin": True},)

    agent = Pinned(store, model=script("ls", "pwd"))
    run = agent.start_chat("list")
    [pending] = await wait_pending(agent)
    agent.answer_approval(pending["approval_id"], "always")
    await run.task
    assert agent.project_rules.rules() == [PermissionRule(tool="bash", action="allow")]
    run = agent.start_chat("again")
    await wait_pending(agent)  # the pin still asks
    agent.answer_approval(agent.pending_approvals()[0]["approval_id"], "once")
    await run.task
    assert CALLS == ["ls", "pwd"]


async def test_session_answer_releases_other_pending_calls_of_the_tool(store):
    model = ScriptedModel(
        [
            reply(
                tool_call("bash", {"command": "a"}, id="c1"),
                tool_call("bash", {"command": "b"}, id="c2"),
            ),
            reply("done"),
        ]
    )
    agent = Agent(store, model=model)
    run = agent.start_chat("two at once")
    first, _second = await wait_pending(agent, 2)
    agent.answer_approval(first["approval_id"], "session")
    result = await run.task
    assert sorted(CALLS) == ["a", "b"] and result.status == "completed"


async def test_invalid_decision_is_rejected_and_leaves_the_ask_pending(store):
    agent = Agent(store, model=script("ls"))
    run = agent.start_chat("list")
    [pending] = await wait_pending(agent)
    with pytest.raises(ValueError):
        agent.answer_approval(pending["approval_id"], "sure")  # type: ignore[arg-type]
    assert agent.pending_approvals()[0]["status"] == "pending"
    agent.answer_approval(pending["approval_id"], "once")
    await run.task
