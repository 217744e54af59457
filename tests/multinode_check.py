"""A check run by tests/two_node_check.py in a cluster of two raylets on one machine
(``ray.cluster_utils.Cluster``): an agent hibernates on one node and wakes on the other
with its history."""

from __future__ import annotations

from typing import Any

import ray


def one_round(root: str) -> dict[str, Any]:
    from thinkray.actors.namespace import AgentNamespace

    from tests.agents import ScriptAgent

    nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
    assert len(nodes) == 2, nodes
    ns = AgentNamespace("multinode", ScriptAgent, storage_root=root, pool_size=0, idle_timeout=None)
    try:
        agent = ns.get("traveller")
        first = ns.wake(agent.name, node_id=nodes[0])
        agent.chat.remote("hello from node one").result()
        agent.chat.remote("weather in Lima").result()
        history_before = agent.get_history.remote().result()
        assert ns.hibernate("traveller")
        second = ns.wake(agent.name, node_id=nodes[1])
        history_after = agent.get_history.remote().result()
        third = ns.where(agent.name)
    finally:
        ns.shutdown()
    return {
        "nodes": nodes,
        "first_node": first["node_id"],
        "second_node": second["node_id"],
        "serving_node": third["node_id"],
        "same_history": history_before == history_after,
        "messages": len(history_after),
    }
