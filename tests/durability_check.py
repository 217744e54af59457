"""Scenarios run by tests/two_node_check.py in a cluster of two raylets on one machine
(``ray.cluster_utils.Cluster``) over an ``s3://`` storage root (a moto server on
loopback); tests/test_durability.py checks what each observed. The crash removes the
worker node, so it runs last.

``crash`` (issue 21 item 9): an agent on the worker node answers N turns (each calls a
tool that logs its execution to a file), then, while turn N + 1 runs, its actor
process is SIGKILLed and the worker node's processes are killed. The agent wakes on
the head node: the N acknowledged turns are all there and their tools ran once.

``fence`` (item 10, 15): owner A answers two turns and is SIGSTOPped; once its lease
lapses (the taker's monotonic clock), owner B on the other node takes over (fence
generation) and answers two turns; A is SIGCONTed: its turn ends as an error (never
``finish``), its hibernation is refused and the fleet index row is not rewritten; B
hibernates; a third owner sees A's and B's acknowledged turns and nothing else.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import ray
from ray.cluster_utils import Cluster

from tests.helpers import free_port

CITIES = ("Lima", "Oslo", "Quito")  # one acknowledged turn each (letters only: the
# script agent's tool call takes the word after "weather in")
SAFETY = 120.0  # seconds any single wait may take before the check gives up


def user_texts(history: list[dict[str, Any]]) -> list[str]:
    return [p.get("text", "") for m in history if m["role"] == "user" for p in m["parts"]]


def status_of(result: Any) -> str:
    return str(getattr(result, "status", None) or result["status"])


class Rig:
    """The two-node cluster (tests/two_node_check.py started it), a moto server with
    the store's bucket, and helpers to place session actors on the nodes."""

    def __init__(self, where: str, cluster: Cluster, worker: Any) -> None:
        import boto3

        from tests.helpers import start_moto

        port = free_port()
        self.server = start_moto(port)
        endpoint = f"http://127.0.0.1:{port}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="thinkray")
        self.root = f"s3://thinkray/fleet?endpoint_override={endpoint}"
        self.where = where
        self.cluster = cluster
        self.worker = worker
        self.head_id = cluster.head_node.node_id
        self.worker_id = worker.node_id

    def actor_on(self, node: str) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        from thinkray.actors.session_actor import RemoteSessionActor

        strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        actor = RemoteSessionActor.options(scheduling_strategy=strategy).remote(warm_up=False)
        return actor, ray.get(actor.ready.remote(), timeout=SAFETY)

    def spec(self, name: str, **agent_kwargs: Any) -> Any:
        from thinkray.actors.session_actor import BindSpec
        from thinkray.storage.layout import ensure_root, session_path

        from tests.agents import CrashAgent

        ensure_root(self.root, "dur")
        path = str(session_path(self.root, "dur", name))
        return BindSpec("dur", name, path, CrashAgent, agent_kwargs=agent_kwargs)

    def bind_when_free(self, actor: Any, spec: Any) -> int:
        """Bind, retrying while the previous owner's lease has not lapsed yet (the
        taker must see it unrenewed for a TTL); returns how often it was refused."""
        refused = 0
        deadline = time.monotonic() + SAFETY
        while True:
            try:
                ray.get(actor.bind.remote(spec), timeout=SAFETY)
                return refused
            except ray.exceptions.RayTaskError as exc:
                if "LeaseHeld" not in str(exc) or time.monotonic() > deadline:
                    raise
                refused += 1
                time.sleep(0.2)

    def call(self, actor: Any, name: str, method: str, *args: Any) -> Any:
        return ray.get(actor.invoke.remote(name, method, args), timeout=SAFETY)

    def close(self) -> None:
        self.server.stop()


def crash(rig: Rig) -> dict[str, Any]:
    name = "crash-talker"
    tool_log = os.path.join(rig.where, "crash-tools.log")
    spec = rig.spec(name, tool_log=tool_log, delay=0.01)
    owner, info = rig.actor_on(rig.worker_id)
    ray.get(owner.bind.remote(spec), timeout=SAFETY)
    statuses = [status_of(rig.call(owner, name, "chat", f"weather in {city}")) for city in CITIES]
    # Turn N + 1 is under way (its tool ran) when the node dies.
    late = owner.invoke.remote(name, "chat", ("weather in Lateville",))
    deadline = time.monotonic() + SAFETY
    while "Lateville" not in Path(tool_log).read_text(encoding="utf-8"):
        if time.monotonic() > deadline:
            raise TimeoutError("turn N + 1 never ran its tool")
        time.sleep(0.01)
    os.kill(info["pid"], signal.SIGKILL)
    rig.cluster.remove_node(rig.worker, allow_graceful=False)  # the node's processes
    del late
    taker, taker_info = rig.actor_on(rig.head_id)
    refused = rig.bind_when_free(taker, spec)
    history = rig.call(taker, name, "get_history")
    with open(tool_log, encoding="utf-8") as fh:
        runs = [line.split()[1] for line in fh if line.strip()]
    ray.get(taker.hibernate.remote(name), timeout=SAFETY)
    return {
        "statuses": statuses,
        "owner_node": info["node_id"],
        "taker_node": taker_info["node_id"],
        "refused_while_lease_live": refused,
        "users": user_texts(history),
        "assistant_after_each": [
            history[i + 1]["role"] == "assistant"
            for i, m in enumerate(history)
            if m["role"] == "user" and i + 1 < len(history)
        ],
        "tool_runs": {city: runs.count(city) for city in sorted(set(runs))},
    }


def _chunk_types(rig: Rig, actor: Any, name: str, text: str) -> list[str]:
    types = []
    for ref in actor.invoke_stream.remote(name, "stream_chat", (text,)):
        item = ray.get(ref, timeout=SAFETY)
        for chunk in item if isinstance(item, list) else []:
            types.append(chunk["type"])
    return types


def fence(rig: Rig) -> dict[str, Any]:
    name = "fence-talker"
    from thinkray.storage.fleet_index import FleetIndex

    spec = rig.spec(name, tool_log=os.path.join(rig.where, "fence-tools.log"))
    a, a_info = rig.actor_on(rig.worker_id)
    ray.get(a.bind.remote(spec), timeout=SAFETY)
    a_statuses = [status_of(rig.call(a, name, "chat", f"a says {i}")) for i in range(2)]
    os.kill(a_info["pid"], signal.SIGSTOP)  # paused: no renewals, no writes
    try:
        b, b_info = rig.actor_on(rig.head_id)
        refused = rig.bind_when_free(b, spec)
        b_statuses = [status_of(rig.call(b, name, "chat", f"b says {i}")) for i in range(2)]
    finally:
        os.kill(a_info["pid"], signal.SIGCONT)
    zombie_chunks = _chunk_types(rig, a, name, "a zombie says")
    try:
        ray.get(a.hibernate.remote(name, True), timeout=SAFETY)
        zombie_hibernate = "ok"
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None) or exc
        zombie_hibernate = f"{type(cause).__name__}: {str(cause)[:200]}"
    row = FleetIndex(rig.root, "dur").get(name)
    row_after_refusal = None if row is None else row.get("messages")
    ray.get(b.hibernate.remote(name), timeout=SAFETY)
    row = FleetIndex(rig.root, "dur").get(name)
    c, _ = rig.actor_on(rig.worker_id)
    ray.get(c.bind.remote(spec), timeout=SAFETY)
    history = rig.call(c, name, "get_history")
    ray.get(c.hibernate.remote(name), timeout=SAFETY)
    return {
        "a_statuses": a_statuses,
        "b_statuses": b_statuses,
        "nodes": [a_info["node_id"], b_info["node_id"]],
        "refused_while_lease_live": refused,
        "zombie_chunks": zombie_chunks,
        "zombie_hibernate": zombie_hibernate,
        "row_after_refusal": row_after_refusal,
        "row_after_b": None if row is None else row.get("messages"),
        "users": user_texts(history),
        "messages": len(history),
    }
