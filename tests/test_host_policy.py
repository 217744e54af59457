"""Placement ``hosts`` in the pool's policy (:mod:`thinkray.actors.pool_policy`): which
host a bind goes to, how many hosts to start for free agent slots, which empty hosts
retire. Plain values, no Ray."""

from __future__ import annotations

from dataclasses import replace

from thinkray.actors.pool_policy import (
    HostLoad,
    PoolConfig,
    PoolContext,
    Waiting,
    hosts_to_retire,
    pick_host,
    plan_starts,
)

CFG = PoolConfig(
    pool_size=16, max_live=1000, max_pool=None, pool_ttl=60.0, max_starting=2, start_patience=0.5
)


def slots(**changes: object) -> PoolContext:
    base = PoolContext(
        config=CFG,
        now=100.0,
        live=0,
        agents=0,
        free=0,
        starting=0,
        waiting=(),
        target=16,
        fill=0,
        calm=False,
        credit=0.0,
        served_at=100.0,
        per_start=64,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_a_bind_goes_to_the_least_loaded_host_with_room():
    hosts = [HostLoad("a", free=2, capacity=8), HostLoad("b", free=5, capacity=8)]
    assert pick_host(hosts) == "b"
    assert pick_host([HostLoad("a", 0, 8), HostLoad("b", 0, 8)]) is None


def test_a_draining_host_takes_no_bind():
    hosts = [HostLoad("a", free=8, capacity=8, draining=True), HostLoad("b", free=1, capacity=8)]
    assert pick_host(hosts) == "b"
    assert pick_host(hosts[:1]) is None


def test_ties_go_to_the_same_host_every_time():
    hosts = [HostLoad("b", 4, 8), HostLoad("a", 4, 8)]
    assert pick_host(hosts) == pick_host(list(reversed(hosts))) == "a"


def test_one_host_start_covers_many_waiting_binds():
    waiting = tuple(Waiting(99.0) for _ in range(50))
    plan = plan_starts(slots(waiting=waiting, calm=True))
    assert plan.start == 2  # 50 binds + 16 spare slots = 66 slots: two hosts of 64
    one = plan_starts(slots(waiting=waiting[:10], calm=True))
    assert one.start == 1


def test_a_host_starting_counts_for_all_its_slots():
    waiting = tuple(Waiting(99.0) for _ in range(30))
    plan = plan_starts(slots(waiting=waiting, starting=1, calm=True))
    assert plan.start == 0 and not plan.deficit


def test_hosts_start_ahead_of_demand_when_free_slots_fall_below_the_target():
    plan = plan_starts(slots(free=10, live=54, agents=54, calm=True))
    assert plan.start == 1
    assert plan_starts(slots(free=20, live=44, agents=44, calm=True)).start == 0


def test_dedicated_starts_are_unchanged_by_the_slot_arithmetic():
    ctx = slots(per_start=1, target=2, free=0, waiting=(Waiting(99.0),), calm=True)
    assert plan_starts(ctx).start == 2  # the waiting bind and a spare, one actor each
    assert plan_starts(replace(ctx, free=2, waiting=())).start == 0


def test_empty_hosts_retire_after_the_ttl_while_enough_slots_stay_free():
    hosts = [
        HostLoad("a", free=8, capacity=8, empty_since=10.0),
        HostLoad("b", free=8, capacity=8, empty_since=50.0),
        HostLoad("c", free=3, capacity=8),
    ]
    assert hosts_to_retire(hosts, target=4, waiting=False, now=100.0, pool_ttl=60.0) == ["a"]
    # 19 free slots: retiring both leaves 3
    assert hosts_to_retire(hosts, target=3, waiting=False, now=200.0, pool_ttl=60.0) == ["a", "b"]
    assert hosts_to_retire(hosts, target=4, waiting=False, now=200.0, pool_ttl=60.0) == ["a"]
    assert hosts_to_retire(hosts, target=12, waiting=False, now=200.0, pool_ttl=60.0) == []
    assert hosts_to_retire(hosts, target=4, waiting=True, now=200.0, pool_ttl=60.0) == []


def test_a_drained_host_stops_once_empty():
    hosts = [HostLoad("a", free=8, capacity=8, draining=True), HostLoad("b", 2, 8, draining=True)]
    assert hosts_to_retire(hosts, target=0, waiting=False, now=0.0, pool_ttl=60.0) == ["a"]


def test_a_host_per_core_before_agents_pack():
    from thinkray.actors.pool_policy import spread_target

    # an empty host always runs ahead: the 2nd starts before the 1st takes an agent
    assert spread_target(64, hosts=1, cores=2) == 65
    assert spread_target(64, hosts=2, cores=2) == 0
    assert spread_target(1, hosts=0, cores=2) == 2
    assert spread_target(64, hosts=3, cores=8) == 65  # and one more each time one fills
