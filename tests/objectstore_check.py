"""Rounds run by tests/two_node_check.py in a cluster of two raylets on one machine
(``ray.cluster_utils.Cluster``) over object-store storage roots (``s3``: a moto server
the round starts on loopback; ``file``: a ``file://`` URI), each kind in a namespace of
its own; tests/test_objectstore.py checks their reports.

1. An agent hibernates on one node and wakes on the other with its history.
2. (s3) The store goes down: hibernate fails after retries, the agent stays live; the
   store comes back: hibernate succeeds and nothing is lost.
3. Two session actors on the two nodes race to bind one session: one wins. The winner
   is killed without hibernating after one more turn; its lease lapses and the other
   node binds the session with the committed history plus that acknowledged turn
   (shipped in the turn log before the turn's result was returned).
"""

from __future__ import annotations

import time

import ray

from tests.helpers import free_port, start_moto
from tests.two_node_check import LEASE_TTL


def one_round(kind: str, where: str) -> dict:
    server = None
    if kind == "s3":
        import boto3

        port = free_port()
        server = start_moto(port)
        endpoint = f"http://127.0.0.1:{port}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="thinkray")
        root = f"s3://thinkray/fleet?endpoint_override={endpoint}"
    else:
        root = f"file://{where}/store"
    report: dict = {"kind": kind}
    try:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        from thinkray.actors.namespace import AgentNamespace
        from thinkray.actors.session_actor import BindSpec, RemoteSessionActor
        from thinkray.storage.layout import session_path

        from tests.agents import ScriptAgent

        nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
        ns = AgentNamespace(
            f"objs-{kind}", ScriptAgent, storage_root=root, pool_size=0, idle_timeout=None
        )
        agent = ns.get("traveller")
        first = ns.wake(agent.name, node_id=nodes[0])
        agent.chat.remote("hello from node one").result()
        agent.chat.remote("weather in Lima").result()
        before = agent.get_history.remote().result()
        assert ns.hibernate("traveller")
        second = ns.wake(agent.name, node_id=nodes[1])
        after = agent.get_history.remote().result()
        report.update(
            nodes=nodes,
            first_node=first["node_id"],
            second_node=second["node_id"],
            same_history=before == after,
            messages=len(after),
            names=ns.names(),
        )

        if server is not None:
            agent.chat.remote("said while the store is down").result()
            server.stop()
            try:
                ns.hibernate("traveller")
                report["hibernate_while_down"] = "ok"
            except Exception as exc:
                report["hibernate_while_down"] = type(exc).__name__ + ": " + str(exc)[:300]
            report["live_while_down"] = len(agent.get_history.remote().result())
            server = start_moto(port)
            assert ns.hibernate("traveller")
            ns.wake(agent.name, node_id=nodes[0])
            report["after_recovery"] = len(agent.get_history.remote().result())
            assert ns.hibernate("traveller")
        committed = agent.get_history.remote().result()
        assert ns.hibernate("traveller")

        # -- two nodes race to bind one session ------------------------------------
        def actor_on(node: str):  # type: ignore[no-untyped-def]
            strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
            return RemoteSessionActor.options(scheduling_strategy=strategy).remote(warm_up=False)

        racers = [actor_on(node) for node in nodes]
        ray.get([a.ready.remote() for a in racers])
        path = str(session_path(root, f"objs-{kind}", "traveller"))
        spec = BindSpec(f"objs-{kind}", "traveller", path, ScriptAgent, create=False)
        refs = [a.bind.remote(spec) for a in racers]
        outcomes = []
        for ref in refs:
            try:
                ray.get(ref)
                outcomes.append("bound")
            except Exception as exc:
                outcomes.append(type(exc).__name__ + ": " + str(exc)[:200])
        report["race"] = outcomes
        winner = racers[outcomes.index("bound")]
        loser = racers[1 - outcomes.index("bound")]
        ray.get(winner.invoke.remote("traveller", "chat", ("acknowledged, never hibernated",)))
        ray.kill(winner, no_restart=True)
        killed_at = time.monotonic()
        refused = 0
        while True:
            try:
                ray.get(loser.bind.remote(spec))
                break
            except Exception as exc:
                if "LeaseHeld" not in type(exc).__name__ + str(exc):
                    raise
                refused += 1
                if time.monotonic() - killed_at > LEASE_TTL * 4:
                    raise
                time.sleep(0.3)
        report["refused_while_lease_live"] = refused
        report["takeover_after_s"] = round(time.monotonic() - killed_at, 2)
        history = ray.get(loser.invoke.remote("traveller", "get_history"))
        report["takeover_history_same"] = history[: len(committed)] == committed
        report["takeover_extra_turn"] = [
            p.get("text")
            for m in history[len(committed) :]
            for p in m["parts"]
            if m["role"] == "user"
        ]
        report["takeover_messages"] = len(history)
        ray.get(loser.hibernate.remote("traveller"))
        ns.shutdown()
        return report
    finally:
        if server is not None:
            server.stop()
