"""Run by tests/test_multinode.py in its own process: two raylets on one machine
(ray.cluster_utils.Cluster); an agent hibernates on one node and wakes on the other.
Prints one JSON line with what it observed."""

from __future__ import annotations

import json
import sys

import ray
from ray.cluster_utils import Cluster


def main(root: str) -> int:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        from thinkray.actors.namespace import AgentNamespace

        from tests.agents import ScriptAgent

        nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
        assert len(nodes) == 2, nodes
        ns = AgentNamespace(
            "multinode", ScriptAgent, storage_root=root, pool_size=0, idle_timeout=None
        )
        agent = ns.get("traveller")
        first = ns.wake(agent.name, node_id=nodes[0])
        agent.chat.remote("hello from node one").result()
        agent.chat.remote("weather in Lima").result()
        history_before = agent.get_history.remote().result()
        assert ns.hibernate("traveller")
        second = ns.wake(agent.name, node_id=nodes[1])
        history_after = agent.get_history.remote().result()
        third = ns.where(agent.name)
        ns.shutdown()
        print(
            json.dumps(
                {
                    "nodes": nodes,
                    "first_node": first["node_id"],
                    "second_node": second["node_id"],
                    "serving_node": third["node_id"],
                    "same_history": history_before == history_after,
                    "messages": len(history_after),
                }
            )
        )
        return 0
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
