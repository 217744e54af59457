"""The session model of issue 5 is reachable on a session actor: branch, rewind,
threads, compaction and permission approvals through an AgentHandle."""

from __future__ import annotations

import time

import pytest

from tests.helpers import text_of

pytestmark = pytest.mark.ray


@pytest.fixture
def agent(namespace_factory):
    from tests.agents import SessionAgent

    ns = namespace_factory(SessionAgent, agent_kwargs={"context_window": 2_000})
    return ns, ns.get("lifecycle")


def test_branch_rewind_and_threads_over_the_actor(agent):
    ns, handle = agent
    for i in range(3):
        handle.chat.remote(f"turn {i}").result()
    sid = handle.get_current_session_id.remote().result()
    history = handle.get_history.remote().result()
    branch = handle.branch.remote(sid, history[1]["id"], {"ephemeral": True}).result()
    assert branch.parent_session_id == sid
    assert [text_of(m) for m in handle.get_history.remote(branch.id).result()] == [
        "turn 0",
        "echo: turn 0",
    ]
    assert handle.get_sessions.remote().result() and all(
        s.id != branch.id for s in handle.get_sessions.remote().result()
    )  # ephemeral branches are hidden from listings
    rewound = handle.rewind.remote(sid, history[2]["id"]).result()
    assert len(rewound.hidden_ids) == 3
    handle.chat.remote().result()  # answer the rewound history again
    assert [text_of(m) for m in handle.get_history.remote().result()][-2:] == [
        "turn 1",
        "echo: turn 1",
    ]
    assert ns.hibernate("lifecycle")  # all of it is in the file
    assert len(handle.get_history.remote().result()) == 4
    thread = handle.thread.remote("side-topic").result()
    assert thread.thread_key == "side-topic"
    assert [t.thread_key for t in handle.list_threads.remote().result()] == ["side-topic"]


def test_compaction_and_approvals_over_the_actor(agent):
    _, handle = agent
    for i in range(4):  # 400 input tokens a step against a 2,000-token window
        handle.chat.remote(f"fill {i}").result()
    sid = handle.get_current_session_id.remote().result()
    result = handle.compact.remote(sid).result()
    assert result is not None
    parts = [
        p
        for m in handle.get_history.remote().result()
        for p in m["parts"]
        if p["type"] == "data-compaction"
    ]
    assert parts and parts[0]["data"]["summary"].startswith("Goal:")
    handle.add_session_rule.remote({"tool": "get_weather", "action": "ask"}, sid).result()
    run = handle.stream_chat.remote("weather in Lima")
    deadline = time.monotonic() + 10
    pending = []
    while not pending and time.monotonic() < deadline:
        pending = handle.pending_approvals.remote(sid).result()
        time.sleep(0.05)
    assert pending and pending[0]["tool_name"] == "get_weather"
    handle.answer_approval.remote(pending[0]["approval_id"], "once").result()
    done = handle.wait_run.remote(run.run_id).result()
    assert done is None or done.status == "completed"
    tool = [
        p for p in handle.get_history.remote().result()[-1]["parts"] if p["type"] == "dynamic-tool"
    ][0]
    assert tool["state"] == "output-available" and tool["output"]["city"] == "Lima"


def test_an_edited_branch_stays_readable_through_the_handle(agent):
    """Issue 9 item 11 over the actor: after an edit, the old branch's leaf is read
    back whole through the handle (``get_history`` is remote-callable)."""
    _, handle = agent
    handle.chat.remote("turn 0").result()
    handle.chat.remote("turn 1").result()
    sid = handle.get_current_session_id.remote().result()
    history = handle.get_history.remote().result()
    old_leaf, edited = history[-1]["id"], history[2]["id"]
    handle.resend.remote(sid, edited, "turn 1, edited").result()
    current = [text_of(m) for m in handle.get_history.remote().result()]
    assert current == ["turn 0", "echo: turn 0", "turn 1, edited", "echo: turn 1, edited"]
    old = handle.get_history.remote(sid, leaf_id=old_leaf).result()
    assert [text_of(m) for m in old] == ["turn 0", "echo: turn 0", "turn 1", "echo: turn 1"]
