"""The warm pool's policy as pure functions (:mod:`thinkray.actors.pool_policy`): each
decision from plain values, no Ray and no actor."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from thinkray.actors.pool_policy import (
    RATE_WINDOW,
    RECLAIM_IDLE,
    RECLAIMS_PER_START,
    PoolConfig,
    PoolContext,
    Waiting,
    boost_after_miss,
    credit_after_reclaim,
    decayed_boost,
    fill_for_start,
    keep_released,
    node_calm,
    plan_reclaim,
    plan_starts,
    reclaim_min_idle,
    retire_recheck,
    spares_to_retire,
    start_backoff,
    takeable,
    target,
)

CFG = PoolConfig(
    pool_size=2, max_live=10, max_pool=None, pool_ttl=60.0, max_starting=4, start_patience=0.5
)


def ctx(**changes: Any) -> PoolContext:
    """A quiet pool: nobody waiting, ``pool_size`` spares, a busy node, no credit."""
    base = PoolContext(
        config=CFG,
        now=100.0,
        live=3,
        agents=3,
        free=2,
        starting=0,
        waiting=(),
        target=2,
        fill=0,
        calm=False,
        credit=0.0,
        served_at=100.0,
    )
    return replace(base, **changes)


def report(idle_for: float = 0.0, busy: bool = False, fresh: bool = False) -> dict[str, Any]:
    return {"bound": True, "busy": busy, "idle_for": idle_for, "fresh": fresh, "bound_for": 0.0}


# -- the target ------------------------------------------------------------------------


def test_the_target_is_pool_size_without_demand():
    assert target(CFG, recent_binds=0, start_secs=1.0, boost=0.0) == 2


def test_misses_raise_the_target_and_their_boost_halves_every_pool_ttl():
    boost = boost_after_miss(0.0, 0.0, 0.0, 60.0)
    for _ in range(4):
        boost = boost_after_miss(boost, 0.0, 0.0, 60.0)
    assert boost == 5
    assert target(CFG, 0, 1.0, boost) == 5
    assert decayed_boost(boost, 0.0, 60.0, 60.0) == 2.5
    assert target(CFG, 0, 1.0, decayed_boost(boost, 0.0, 60.0, 60.0)) == 3


def test_the_bind_rate_raises_the_target_by_the_spares_one_start_consumes():
    # 40 binds in the window at 1.5 s a start: 6 binds arrive while one actor starts.
    assert target(CFG, recent_binds=int(4 * RATE_WINDOW), start_secs=1.5, boost=0.0) == 6


def test_the_target_never_exceeds_max_pool_nor_the_live_cap():
    assert target(replace(CFG, max_pool=3), 1000, 1.0, 50.0) == 3
    assert target(CFG, 1000, 1.0, 50.0) == CFG.max_live
    assert replace(CFG, max_pool=1).most_spares() == CFG.pool_size  # pool_size wins


def test_a_pool_that_does_not_grow_keeps_pool_size_whatever_the_demand():
    fixed = replace(CFG, grow=False)
    assert target(fixed, recent_binds=1000, start_secs=1.5, boost=50.0) == 2
    assert target(replace(fixed, pool_size=0), 1, 1.0, boost_after_miss(0.0, 0.0, 0.0, 60.0)) == 0
    # the same demand grows a pool that does
    assert target(replace(CFG, pool_size=0), 1, 1.0, 0.0) == 1
    assert target(replace(CFG, pool_size=0), 0, 1.0, boost_after_miss(0.0, 0.0, 0.0, 60.0)) == 1


def test_start_fills_to_pool_size_within_the_live_cap():
    assert fill_for_start(CFG, live=0) == 2
    assert fill_for_start(CFG, live=10) == 1
    assert fill_for_start(CFG, live=12) == 0


# -- starts ----------------------------------------------------------------------------


def test_nothing_starts_and_the_credit_is_kept_when_the_pool_lacks_nothing():
    plan = plan_starts(ctx(credit=3.0, calm=True))
    assert (plan.start, plan.credit, plan.deficit) == (0, 3.0, False)


def test_a_calm_node_starts_every_actor_the_pool_lacks_within_max_starting():
    plan = plan_starts(ctx(free=0, target=8, calm=True))
    assert plan.start == CFG.max_starting and plan.deficit
    assert plan_starts(ctx(free=0, target=3, calm=True)).start == 3


def test_a_busy_node_starts_no_spare_above_pool_size():
    plan = plan_starts(ctx(free=2, target=6))
    assert plan.start == 0 and plan.deficit


def test_below_pool_size_a_busy_node_replenishes_one_start_at_a_time():
    assert plan_starts(ctx(free=0)).start == 1
    assert plan_starts(ctx(free=0, starting=1)).start == 0


def test_start_fill_starts_its_spares_even_on_a_busy_node():
    assert plan_starts(ctx(free=0, target=3, fill=3)).start == 3


def test_waiting_binds_start_no_actor_while_agents_may_free_one():
    waiting = (Waiting(since=99.9),)
    plan = plan_starts(ctx(free=0, waiting=waiting, served_at=99.9))
    assert plan.start == 0 and plan.deficit


def test_stalled_waiting_binds_start_actors_for_themselves_only():
    waiting = (Waiting(since=90.0), Waiting(since=95.0))
    plan = plan_starts(ctx(free=0, waiting=waiting, served_at=90.0, target=5))
    assert plan.start == 2 and plan.deficit  # the spares wait for an idle core


def test_waiting_binds_start_at_once_when_no_agent_is_live():
    waiting = (Waiting(since=100.0),)
    plan = plan_starts(ctx(free=0, agents=0, live=0, waiting=waiting))
    assert plan.start == 1


def test_at_the_live_cap_only_binds_that_may_exceed_it_need_an_actor():
    waiting = (Waiting(since=90.0), Waiting(since=90.0, may_exceed=True))
    full = ctx(free=0, live=10, agents=10, waiting=waiting, served_at=0.0, target=0)
    assert plan_starts(full).start == 1


def test_the_reclaim_credit_pays_for_starts_and_is_spent():
    waiting = (Waiting(since=100.0),)
    poor = ctx(free=0, waiting=waiting, target=0)
    assert plan_starts(poor).start == 0
    plan = plan_starts(replace(poor, credit=1.25))
    assert (plan.start, plan.credit, plan.deficit) == (1, 0.25, False)


def test_the_credit_is_not_spent_when_other_reasons_start_the_actors():
    waiting = (Waiting(since=100.0),)
    plan = plan_starts(ctx(free=0, waiting=waiting, target=0, credit=2.0, calm=True))
    assert plan.start == 1 and plan.credit == 2.0


def test_hibernations_earn_one_start_per_reclaims_per_start():
    credit = 0.0
    for _ in range(RECLAIMS_PER_START):
        credit = credit_after_reclaim(credit)
    assert credit == pytest.approx(1.0)


def test_failed_starts_back_off_exponentially_up_to_five_seconds():
    assert start_backoff(1) == 0.1
    assert start_backoff(2) == 0.2
    assert start_backoff(30) == 5.0


# -- spares retiring ---------------------------------------------------------------------


def test_spares_above_the_target_retire_oldest_first_once_unused_for_pool_ttl():
    free_since = [50.0, 10.0, 30.0, 90.0]
    assert spares_to_retire(free_since, target=2, waiting=False, now=80.0, pool_ttl=60.0) == [1]
    assert spares_to_retire(free_since, 2, False, 200.0, 60.0) == [1, 2]
    assert spares_to_retire(free_since, 4, False, 200.0, 60.0) == []


def test_no_spare_retires_while_binds_wait():
    assert spares_to_retire([0.0, 0.0, 0.0], 1, True, 200.0, 60.0) == []


def test_the_pool_looks_again_when_the_oldest_spare_could_retire():
    assert retire_recheck([10.0, 50.0, 90.0], 2, 40.0, 60.0) == 30.0
    assert retire_recheck([10.0, 50.0, 90.0], 2, 69.0, 60.0) == 15.0  # at least ttl/4
    assert retire_recheck([10.0, 50.0], 2, 40.0, 60.0) is None


def test_a_released_actor_is_kept_below_the_most_spares_or_while_binds_wait():
    assert keep_released(1, 2, waiting=False)
    assert not keep_released(2, 2, waiting=False)
    assert keep_released(2, 2, waiting=True)


# -- reclaim -----------------------------------------------------------------------------


def test_below_the_cap_a_few_binds_take_only_agents_idle_for_long():
    assert reclaim_min_idle(CFG, live=5, waiting=CFG.max_starting) == RECLAIM_IDLE
    assert reclaim_min_idle(CFG, live=10, waiting=1) == 0.0  # at the cap: any idle agent
    assert reclaim_min_idle(CFG, live=5, waiting=CFG.max_starting + 1) == 0.0  # a burst


def test_binds_waiting_for_starting_hosts_take_only_agents_idle_for_long():
    """Under placement hosts a start brings a host's slots: binds that those starts
    serve soon hibernate no agent the live cap leaves room for (a ramp of 1,000 wakes
    into hosts of 250 hibernated ~70 agents it had just woken, with room for 1,250)."""
    roomy = replace(CFG, max_live=1250)
    slots_soon = roomy.max_starting * 250
    assert reclaim_min_idle(roomy, live=500, waiting=32, per_start=250) == RECLAIM_IDLE
    assert reclaim_min_idle(roomy, live=500, waiting=slots_soon, per_start=250) == RECLAIM_IDLE
    # more than the starting hosts hold, or at the cap: any idle agent
    assert reclaim_min_idle(roomy, live=500, waiting=slots_soon + 1, per_start=250) == 0.0
    assert reclaim_min_idle(roomy, live=1250, waiting=1, per_start=250) == 0.0


def test_busy_just_bound_and_short_idle_agents_are_not_takeable():
    assert takeable(report(idle_for=1.0), 0.0)
    assert not takeable(report(idle_for=1.0), RECLAIM_IDLE)
    assert not takeable(report(idle_for=99.0, busy=True), 0.0)
    assert not takeable(report(idle_for=99.0, fresh=True), 0.0)
    assert not takeable(None, 0.0)


def test_reclaim_takes_the_longest_idle_agents_up_to_the_need_and_watches_busy_ones():
    reports = [
        ("a", report(idle_for=5.0)),
        ("b", report(idle_for=50.0)),
        ("c", report(busy=True)),
        ("d", report(idle_for=20.0)),
        ("e", report(fresh=True)),
        ("f", report(idle_for=1.0)),
    ]
    plan = plan_reclaim(reports, min_idle=2.0, need=2)
    assert plan.victims == ("b", "d")
    assert plan.probe == ("c", "e")  # "f" is idle, only not for long enough
    assert plan_reclaim(reports, 2.0, need=0).victims == ()


# -- the CPU meter ---------------------------------------------------------------------


def test_a_recent_reading_of_about_a_core_idle_is_calm():
    assert node_calm(1.0, age=0.5, ncpu=8)
    assert not node_calm(0.5, age=0.5, ncpu=8)
    assert node_calm(0.5, age=0.5, ncpu=1)  # half of a one-core node
    assert not node_calm(4.0, age=1.5, ncpu=8)  # too old to say anything about now
    assert not node_calm(None, age=0.0, ncpu=8)
