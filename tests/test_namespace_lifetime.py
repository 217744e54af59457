"""A namespace is a long-lived service (issue 9, item 5): its directory is detached,
reachable by name from any driver, and stopped only by an explicit shutdown."""

from __future__ import annotations

import gc

import pytest

from tests.helpers import start_driver

pytestmark = pytest.mark.ray


def test_a_namespace_outlives_the_driver_that_created_it(ray_local, tmp_path):
    import ray
    from thinkray.actors import AgentNamespace

    driver = start_driver(
        ray,
        f"""
        from thinkray.actors import AgentNamespace
        from tests.agents import ScriptAgent

        ns = AgentNamespace("lifetime-a", ScriptAgent, storage_root={str(tmp_path)!r},
                            pool_size=1, idle_timeout=None)
        print(ns.get("alice").chat.remote("hello").result().status)
        """,
    )
    out, err = driver.communicate(timeout=120)
    assert driver.returncode == 0, err[-3000:]
    # (Ray may copy raylet warnings into the driver's stdout, before or after it.)
    assert "completed" in out.split()
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


@pytest.mark.ray
def test_handles_are_reused_and_remember_their_actor(namespace_factory):
    import pickle

    ns = namespace_factory()
    first = ns.get("reuse")
    assert first.chat.remote("one").result().status == "completed"
    again = ns.get("reuse")
    # The same handle: it knows its actor, so the next call skips the directory.
    assert again is first and again._cached_actor() is not None
    assert ns.existing("reuse") is not first  # refuses unknown names: its own handle
    ns.hibernate("reuse")
    assert ns.get("reuse").chat.remote("two").result().status == "completed"  # re-resolves
    assert ns.where("reuse") is not None
    copy = pickle.loads(pickle.dumps(ns))  # a namespace still travels to tasks and actors
    assert len(copy.get("reuse").get_history.remote().result()) == 4
