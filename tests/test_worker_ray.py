"""A worker agent used as a tool by an agent hosted in a session actor."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.ray


def test_worker_tool_inside_a_session_actor(namespace_factory):
    from tests.agents import WorkerHostAgent

    ns = namespace_factory(WorkerHostAgent)
    agent = ns.get("host")
    first = agent.chat.remote("alpha beta gamma").result()
    second = agent.chat.remote("delta epsilon").result()
    assert first.text == 'summary: {"title": "Alpha", "word_count": 3}'
    # a fresh context per call: the second summary sees only its own input
    assert second.text == 'summary: {"title": "Delta", "word_count": 2}'
    part = [
        p for p in agent.get_history.remote().result()[-1]["parts"] if p["type"] == "dynamic-tool"
    ][0]
    assert part["toolName"] == "summarize" and part["state"] == "output-available"
