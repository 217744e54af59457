"""The orchestrator's shared workspace on an object-store root (issue 13, item 1): the
bridge's file follows the sessions' mechanism (lease, node-local cache, generations in
the store). The rounds run in tests/two_node_check.py's process and cluster (its Ray
workers see the moto credentials and a short lease TTL), one per kind in a namespace
of its own; the test checks their reports.

1. A sub-agent writes a file into the shared workspace; the orchestrator hibernates and
   the bridge uploads its file as a generation.
2. The bridge dies without closing (its lease is not released) and the namespace is
   shut down; a fresh namespace object wakes the orchestrator, whose new bridge waits
   out the dead one's lease and downloads the file: a second sub-agent reads it.
3. The bridge closes (upload, lease released); the file is read straight from the store.
4. Nothing named ``s3:``/``file:`` appears in the working directories.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import free_port, round_of

REPO = Path(__file__).resolve().parent.parent


def script(*steps):
    return {"provider": "script", "steps": [list(s) for s in steps], "delay": 0.0}


WRITE_PLAN = script(
    [{"tool": "shared_write_file", "input": {"path": "notes/plan.md", "content": "one\ntwo\n"}}],
    [{"text": "I wrote the plan."}],
)
READ_PLAN = script(
    [{"tool": "shared_read_file", "input": {"path": "notes/plan.md"}}],
    [{"text": "The plan has two steps."}],
)


def _uri_folders(*dirs: Path) -> list[str]:
    return [str(d / n) for d in dirs for n in ("s3:", "file:") if (d / n).exists()]


def one_round(kind: str, where: str, ns_name: str) -> dict:  # pragma: no cover
    import ray

    server = None
    if kind == "s3":
        import boto3  # type: ignore[import-untyped]

        from tests.helpers import start_moto

        port = free_port()
        server = start_moto(port)
        endpoint = f"http://127.0.0.1:{port}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="thinkray")
        root = f"s3://thinkray/fleet?endpoint_override={endpoint}"
    else:
        root = f"file://{where}/store"

    report: dict = {"kind": kind}
    try:
        from thinkray.actors.bridge import bridge_name
        from thinkray.actors.namespace import AgentNamespace
        from thinkray.actors.orchestrator import Orchestrator
        from thinkray.runtime.tools.workspace import LocalWorkspace
        from thinkray.storage.objectstore import RemoteSession
        from thinkray.storage.stores import open_stores

        def store_session(cache: str) -> RemoteSession:
            return RemoteSession(
                root, f"{ns_name}/.shared", "boss", owner="checker", cache_dir=Path(where) / cache
            )

        def namespace() -> AgentNamespace:
            return AgentNamespace(
                ns_name, Orchestrator, storage_root=root, pool_size=1, idle_timeout=None
            )

        def stop(ns: AgentNamespace) -> None:
            AgentNamespace.connect(f"{ns_name}.boss.subs").shutdown()
            ns.shutdown()

        # 1. a sub-agent writes; the orchestrator hibernates: the bridge uploads
        ns = namespace()
        boss = ns.get("boss")
        boss.create_subagent.remote("writer", {"model": WRITE_PLAN}).result()
        done = boss.delegate.remote("writer", "write the plan", wait=True).result()
        report["written"] = done.status
        assert ns.hibernate("boss")
        latest = store_session("cache-check").latest()
        report["generation_after_hibernate"] = latest.generation if latest else None

        # 2. the bridge dies without closing; a fresh namespace object wakes the
        # orchestrator: its new bridge waits out the lease and downloads the file
        bridge = ray.get_actor(bridge_name(ns_name, "boss"), namespace="thinkray")
        ray.kill(bridge)
        stop(ns)
        ns = namespace()
        boss = ns.get("boss")
        boss.create_subagent.remote("reader", {"model": READ_PLAN}, access="read").result()
        read = boss.delegate.remote("reader", "read the plan", wait=True).result()
        subs = AgentNamespace.connect(f"{ns_name}.boss.subs")
        history = subs.get("reader").get_history.remote().result()
        report["read"] = read.status
        report["reader_saw"] = "one\\ntwo" in json.dumps(history)
        client = boss.shared_workspace.remote().result()
        report["after_wake"] = ray.get(client.read_file("notes/plan.md"))

        # 3. the bridge closes: upload, lease released; read the file from the store
        bridge = ray.get_actor(bridge_name(ns_name, "boss"), namespace="thinkray")
        ray.get(bridge.close.remote())
        ray.kill(bridge)
        checker = store_session("cache-final")
        checker.acquire()  # released: free at once
        checker.fetch()
        report["final_generation"] = checker.base.generation if checker.base else None
        with open_stores(checker.local_path) as stores:
            report["in_store"] = LocalWorkspace(stores.workspace()).read_file("notes/plan.md")
        checker.release()
        stop(ns)

        # 4. no folder named after the scheme in the working directories
        report["uri_folders"] = _uri_folders(Path.cwd(), REPO)
    finally:
        if server is not None:
            server.stop()
    return report


@pytest.mark.ray
@pytest.mark.xdist_group("two-nodes")  # one worker: one cluster (tests/two_node_check.py)
@pytest.mark.parametrize("kind", ["file", "s3"])
def test_shared_workspace_survives_hibernation_on_an_object_store_root(kind, two_node_report):
    all_rounds, cwd = two_node_report
    report = round_of(all_rounds, f"bridge-{kind}")
    assert report["written"] == "completed"
    assert report["generation_after_hibernate"] == 1  # uploaded at hibernation
    assert report["read"] == "completed" and report["reader_saw"]
    assert report["after_wake"] == "one\ntwo\n"  # downloaded by the new bridge
    # the new bridge's wake fenced (2), its close uploaded its new grants (3), and the
    # checker's own wake fenced again (4)
    assert report["final_generation"] == 4
    assert report["in_store"] == "one\ntwo\n"
    assert report["uri_folders"] == []
    assert _uri_folders(cwd, REPO) == []
