"""A namespace is a long-lived service (issue 9, item 5): its directory is detached,
reachable by name from any driver, and stopped only by an explicit shutdown."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parent.parent


def test_a_namespace_outlives_the_driver_that_created_it(ray_local, tmp_path):
    import ray
    from thinkray.actors import AgentNamespace

    address = ray.get_runtime_context().gcs_address
    script = textwrap.dedent(
        f"""
        import ray
        from thinkray.actors import AgentNamespace
        from tests.agents import ScriptAgent

        ray.init(address={address!r}, log_to_driver=False,
                 runtime_env={{"env_vars": {{"PYTHONPATH": {str(REPO)!r}}}}})
        ns = AgentNamespace("lifetime-a", ScriptAgent, storage_root={str(tmp_path)!r},
                            pool_size=1, idle_timeout=None)
        print(ns.get("alice").chat.remote("hello").result().status)
        """
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().endswith("completed")
    # The creating driver is gone; another driver reaches the namespace by name.
    ns = AgentNamespace.connect("lifetime-a")
    try:
        assert ns.storage_root == str(tmp_path)
        alice = ns.get("alice")
        assert [m["role"] for m in alice.get_history.remote().result()] == ["user", "assistant"]
        assert alice.chat.remote("still here").result().status == "completed"
    finally:
        ns.shutdown()
    with pytest.raises(ValueError):  # an explicit shutdown is the end of it
        AgentNamespace.connect("lifetime-a")


def test_dropping_the_namespace_object_keeps_the_namespace(ray_local, tmp_path):
    from thinkray.actors import AgentNamespace

    from tests.agents import ScriptAgent

    ns = AgentNamespace("lifetime-b", ScriptAgent, storage_root=str(tmp_path), pool_size=1)
    ns.get("bob").chat.remote("hi").result()
    del ns  # the only reference to the namespace object, and to its directory's handle
    gc.collect()
    again = AgentNamespace.connect("lifetime-b")
    try:
        assert again.get("bob").message_count.remote().result() == 2
    finally:
        again.shutdown()
