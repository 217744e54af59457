"""Persistent agents hosted by session actors: send through a handle, idle → hibernate,
wake on send (and on a row written into a hibernated agent's file), and use by another
actor-hosted agent as a tool through HandleTarget."""

from __future__ import annotations

import pytest
from thinkray.storage.layout import session_path
from thinkray.storage.stores import open_stores

from tests.agents import ScriptedPersistentAgent
from tests.helpers import wait_until

pytestmark = pytest.mark.ray


def test_send_reply_hibernate_and_wake_on_send(namespace_factory):
    ns = namespace_factory(ScriptedPersistentAgent, idle_timeout=0.3, pool_size=1)
    agent = ns.get("ada")
    mid = agent.send.remote("hello", sender="user").result()
    assert agent.wait_reply.remote(mid, timeout=10).result() == "ada got: hello (message 1)"

    # nothing pending: the idle timer hibernates it
    wait_until(lambda: not ns.stats()["live"])
    assert ns.where(agent.name) is None

    # sending to the hibernated agent wakes it; its memory came back from the file
    mid2 = agent.send.remote("again", sender="user").result()
    assert agent.wait_reply.remote(mid2, timeout=10).result() == "ada got: again (message 2)"
    assert ns.stats()["counters"]["binds"] == 2
    wait_until(lambda: not ns.stats()["live"])

    # a row written straight into the hibernated agent's file (a webhook, say) is
    # drained on the next wake, without any send
    with open_stores(session_path(ns.storage_root, ns.name, "ada")) as stores:
        stores.inbox().insert("from the webhook", sender="webhook", message_id="hook-1")
    ns.wake(agent.name)
    assert agent.wait_reply.remote("hook-1", timeout=10).result() == (
        "ada got: from the webhook (message 3)"
    )
    [row] = [r for r in agent.list_inbox.remote().result() if r["id"] == "hook-1"]
    assert row["sender"] == "webhook" and row["status"] == "done"


def test_agent_uses_persistent_agent_as_tool_through_handle(namespace_factory):
    helpers = namespace_factory(ScriptedPersistentAgent, pool_size=1)
    helper = helpers.get("helper")
    bosses = namespace_factory(
        ScriptedPersistentAgent, pool_size=1, agent_kwargs={"peers": {"helper": helper}}
    )
    boss = bosses.get("boss")
    mid = boss.send.remote("ask helper: summarize the logs").result()
    assert boss.wait_reply.remote(mid, timeout=20).result() == (
        "helper replied: helper got: summarize the logs (message 1)"
    )
    [row] = helper.list_inbox.remote().result()
    assert row["sender"] == "boss" and row["status"] == "done"
    assert row["id"].startswith("tc-")
