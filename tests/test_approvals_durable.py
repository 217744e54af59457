"""Approvals that persist (issue 12, item 2): an ask is its tool call's row,
``awaiting-approval``, visible to any process that opens the agent's file; every
decision is an append-only audit row (who, when, what, why); a hook decides who may
answer; a timeout ends ``cancelled-by-timeout``; a denial reaches the model."""

from __future__ import annotations

from typing import Any

import pytest
from thinkray.runtime.capabilities.permissions import ApprovalNotFoundError
from thinkray.runtime.errors import AccessDeniedError
from thinkray.storage.session_store import DuckDBSessionStore

from tests.conftest import Collector
from tests.test_permissions import CALLS, Agent, script, wait_pending


class Guarded(Agent):
    """Only principals named ``admin-*`` may answer."""

    def may_approve(self, approval: dict[str, Any], answered_by: str | None) -> bool:
        return bool(answered_by and answered_by.startswith("admin-"))


@pytest.fixture(autouse=True)
def _reset():
    CALLS.clear()


async def test_an_ask_is_stored_and_another_reader_of_the_file_sees_it(tmp_path):
    path = tmp_path / "a.duckdb"
    agent = Agent(DuckDBSessionStore(path), model=script("ls"))
    run = agent.start_chat("list")
    [pending] = await wait_pending(agent)
    call = agent.get_tool_call("call0")
    assert call["status"] == "awaiting-approval"
    assert call["approval"]["approval_id"] == pending["approval_id"]
    # What another process would read from the same file (DuckDB allows one writer
    # per file, so here: the same database through its own store object).
    other = agent.store.stores().tool_calls()
    assert [r.status for r in other.rows("awaiting-approval")] == ["awaiting-approval"]
    answered = agent.answer_approval(pending["approval_id"], "once", answered_by="alice")
    assert answered["status"] == "approved" and answered["answered_by"] == "alice"
    assert (await run.task).status == "completed" and CALLS == ["ls"]
    call = agent.get_tool_call("call0")
    assert call["status"] == "completed" and call["approval"]["answered_by"] == "alice"
    [audit] = agent.tool_calls.store.audit_rows("call0")
    assert (audit.decision, audit.by, audit.reason) == ("approved", "alice", "once")
    assert audit.at > 0
    assert agent.pending_approvals() == []
    with pytest.raises(ApprovalNotFoundError):  # already decided
        agent.answer_approval(pending["approval_id"], "deny", answered_by="alice")
    assert len(agent.tool_calls.store.audit_rows("call0")) == 1
    agent.close()


async def test_a_denial_is_audited_and_reported_to_the_model(store):
    agent = Agent(store, model=script("rm -rf /"))
    collector = Collector()
    run = agent.start_chat("clean up", collector)
    [pending] = await wait_pending(agent)
    agent.answer_approval(pending["approval_id"], "deny", answered_by="bob")
    await run.task
    assert CALLS == []
    assert agent.get_tool_call("call0")["status"] == "denied"
    assert [c["type"] for c in collector.events if c["type"].startswith("tool-output")] == [
        "tool-output-denied"
    ]
    [audit] = agent.tool_calls.store.audit_rows("call0")
    assert (audit.decision, audit.by) == ("denied", "bob")


async def test_a_caller_the_hook_refuses_cannot_answer_and_nothing_changes(store):
    agent = Guarded(store, model=script("ls"))
    run = agent.start_chat("list")
    [pending] = await wait_pending(agent)
    with pytest.raises(AccessDeniedError):
        agent.answer_approval(pending["approval_id"], "once", answered_by="mallory")
    with pytest.raises(AccessDeniedError):
        agent.answer_approval(pending["approval_id"], "once")
    assert agent.get_tool_call("call0")["status"] == "awaiting-approval"
    assert agent.tool_calls.store.audit_rows() == []
    agent.answer_approval(pending["approval_id"], "once", answered_by="admin-carol")
    assert (await run.task).status == "completed" and CALLS == ["ls"]


async def test_an_unanswered_ask_ends_cancelled_by_timeout(store):
    class Impatient(Agent):
        approval_timeout = 0.05

    agent = Impatient(store, model=script("ls"))
    collector = Collector()
    result = await agent.chat("list", collector)
    assert result.status == "completed" and CALLS == []
    call = agent.get_tool_call("call0")
    assert call["status"] == "cancelled-by-timeout"
    [audit] = agent.tool_calls.store.audit_rows("call0")
    assert (audit.decision, audit.by) == ("timeout", None)
    denied = [c for c in collector.events if c["type"] == "tool-output-denied"]
    assert len(denied) == 1
    assert agent.get_approval(call["approval"]["approval_id"])["status"] == "timed-out"
