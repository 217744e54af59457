"""Sharded directories (issue 13, item 4): a namespace's names spread over K directory
actors by a stable hash; each name resolves to its shard from any process; a crashed
shard is replaced and adopts the agents still live on their actors (never binding
them a second time); the namespace's stats add the shards up."""

from __future__ import annotations

import pytest
from thinkray.actors.directory import shard_of
from thinkray.storage.errors import InvalidInputError

from tests.helpers import json_report, start_driver, wait_until

pytestmark = pytest.mark.ray

NAMES = [f"agent-{i}" for i in range(12)]


def test_shard_of_is_stable_and_spreads_names():
    # sha1, not Python's salted hash: the same in every process
    assert [shard_of(n, 4) for n in NAMES] == [shard_of(n, 4) for n in NAMES]
    assert shard_of("agent-0", 1) == 0
    spread = {shard_of(f"n{i}", 4) for i in range(200)}
    assert spread == {0, 1, 2, 3}
    counts = [sum(1 for i in range(1000) if shard_of(f"n{i}", 4) == s) for s in range(4)]
    assert min(counts) > 200


def test_names_resolve_to_their_shard_from_any_process(namespace_factory):
    import ray

    ns = namespace_factory(directories=4, pool_size=4, idle_timeout=None)
    assert ns.shards == 4
    names = [n for n in NAMES if True][:8]
    assert {shard_of(n, 4) for n in names} == {0, 1, 2, 3}
    for name in names:
        assert ns.get(name).chat.remote(f"hi {name}").result().status == "completed"
    stats = ns.stats()
    assert stats["shards"] == 4 and sorted(stats["live"]) == sorted(names)
    by_shard = {s["shard"]: s for s in stats["by_shard"]}
    for shard in range(4):
        assert by_shard[shard]["live"] == sum(1 for n in names if shard_of(n, 4) == shard)
    assert stats["counters"]["binds"] == len(names)
    assert stats["max_live"] == 4 * 16  # ceil(64 / 4) per shard
    # a directory refuses a name of another shard
    wrong = ns._router.handles[(shard_of(names[0], 4) + 1) % 4]
    with pytest.raises(InvalidInputError):
        ray.get(wrong.resolve.remote(names[0]))

    where = {n: ns.where(n)["actor_id"] for n in names}
    shard_ids = {n: ns.directory_for(n)._actor_id.hex() for n in names}
    driver = start_driver(
        ray,
        f"""
        import json
        from thinkray.actors import AgentNamespace

        ns = AgentNamespace.connect({ns.name!r})
        names = {names!r}
        out = {{
            "shards": ns.shards,
            "dirs": {{n: ns.directory_for(n)._actor_id.hex() for n in names}},
            "where": {{n: ns.where(n)["actor_id"] for n in names}},
            "count": {{n: ns.get(n).message_count.remote().result() for n in names}},
        }}
        print(json.dumps(out))
        """,
    )
    out, err = driver.communicate(timeout=120)
    assert driver.returncode == 0, err[-3000:]

    seen = json_report(out)
    assert seen["shards"] == 4
    assert seen["dirs"] == shard_ids
    assert seen["where"] == where  # the same live actors: nothing bound twice
    assert all(c == 2 for c in seen["count"].values())
    assert ns.stats()["counters"]["binds"] == len(names)


def _shard_stats(ns, shard):
    import ray

    return ray.get(ns._router.handles[shard].stats.remote())


def _restarted_pid(ns, shard, old_pid):
    """The shard's new process id once Ray restarted it (None while the old one answers
    or the restart is under way)."""
    import ray

    try:
        pid = ray.get(ns._router.handles[shard].stats.remote(), timeout=10)["pid"]
    except Exception:  # dying, or restarting
        return None
    return pid if pid != old_pid else None


def test_a_crashed_shard_is_rebuilt_and_adopts_its_live_agents(namespace_factory):
    import ray

    ns = namespace_factory(directories=2, pool_size=2, idle_timeout=None)
    names = [n for n in NAMES if shard_of(n, 2) == 1][:2] + [
        n for n in NAMES if shard_of(n, 2) == 0
    ][:1]
    for name in names:
        assert ns.get(name).chat.remote("before").result().status == "completed"
    before = {n: ns.where(n) for n in names}
    victims = [n for n in names if shard_of(n, 2) == 1]

    # 1. the shard's process dies: Ray restarts it (same name and actor id)
    old_pid = _shard_stats(ns, 1)["pid"]
    ray.kill(ns._router.handles[1], no_restart=False)
    # ray.kill is asynchronous: a call sent at once may still reach the old process
    wait_until(lambda: _restarted_pid(ns, 1, old_pid), timeout=60)
    after = {n: ns.where(n) for n in names}  # the rebuilt directory's map
    assert after == before  # same actors, same processes
    stats = _shard_stats(ns, 1)
    assert stats["counters"].get("adopted") == len(victims)
    assert stats["counters"].get("binds", 0) == 0  # adopted, not bound a second time
    for name in victims:
        handle = ns.existing(name)  # a fresh handle: resolves through the new directory
        assert handle.chat.remote("after").result().status == "completed"
        assert handle.message_count.remote().result() == 4
    assert _shard_stats(ns, 1)["counters"].get("binds", 0) == 0

    # 2. the shard is stopped for good: the namespace object recreates it by name
    dead = ns._router.handles[1]
    ray.kill(dead, no_restart=True)
    wait_until(lambda: _gone(dead), timeout=30)
    assert ns.wake(victims[0])["pid"] == before[victims[0]]["pid"]
    fresh = ns._router.handles[1]
    assert fresh._actor_id != dead._actor_id
    stats = ray.get(fresh.stats.remote())
    assert stats["counters"].get("adopted") == len(victims)
    assert stats["counters"].get("binds", 0) == 0
    # the adopted agent reports to the new directory: hibernate and wake again work
    assert ns.hibernate(victims[1])
    assert ns.where(victims[1]) is None
    assert ns.get(victims[1]).message_count.remote().result() == 4
    total = ns.stats()
    assert sorted(total["live"]) == sorted(names)
    assert total["counters"]["adopted"] == len(victims)


def _gone(handle) -> bool:
    import ray

    try:
        ray.get(handle.stats.remote(), timeout=5)
    except ray.exceptions.RayActorError:
        return True
    return False
