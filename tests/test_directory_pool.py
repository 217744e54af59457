"""The warm pool's policy (issue 10): binds queue FIFO and take the first actor freed
for them (given back, newly started, or taken from an idle agent that hibernates),
starts in flight stay within ``max_starting``, the target grows with misses and spares
above it retire. Behaviour only, never timings.

The policy tests drive a :class:`Directory` in this process with stand-in actors (no
Ray cluster), so every interleaving is the test's choice; the tests at the end check
the same behaviour with real session actors."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import pytest
from thinkray.actors.directory import Directory, Entry, NamespaceConfig, PooledActor
from thinkray.actors.pool_policy import RECLAIM_IDLE
from thinkray.runtime.agents.think import Think

from tests.helpers import wait_until

_ids = itertools.count()


class _Method:
    """``handle.method.remote(...)``: an awaitable, as on a Ray actor handle."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> asyncio.Future[Any]:
        return asyncio.ensure_future(self.fn(*args))


class FakeActor:
    """Stands in for a session actor: the calls the directory makes on one."""

    def __init__(self, idle_for: float = 0.0, busy: bool = False, fresh: bool = False) -> None:
        self.idle_for, self.busy, self.fresh = idle_for, busy, fresh
        self.idle = asyncio.Event()
        if not busy:
            self.idle.set()
        self.hibernated: list[str] = []
        self.activity = _Method(self._activity)
        self.until_idle = _Method(self._until_idle)
        self.hibernate = _Method(self._hibernate)

    def finish(self) -> None:
        """The agent's run ends: it is idle now."""
        self.busy = False
        self.idle.set()

    async def _activity(self, name: str) -> dict[str, Any]:
        return {
            "bound": True,
            "busy": self.busy,
            "idle_for": self.idle_for,
            "fresh": self.fresh,
            "bound_for": 0.0,
        }

    async def _until_idle(self, name: str, timeout: float, grace: float) -> dict[str, Any]:
        await self.idle.wait()
        return await self._activity(name)

    async def _hibernate(self, name: str, force: bool) -> dict[str, Any]:
        if self.busy and not force:
            return {"ok": False}
        self.hibernated.append(name)
        return {"ok": True, "next_due_at": None}


def pooled(handle: Any = None) -> PooledActor:
    n = next(_ids)
    return PooledActor(handle or FakeActor(), f"actor-{n}", "node-1", n)


class PoolUnderTest(Directory):
    """A directory whose actor starts are the test's to finish (``finish_start``)."""

    def __init__(self, config: NamespaceConfig) -> None:
        super().__init__(config)
        self.calm = False  # whether the node has an idle core: the test says
        self._cpu.calm = lambda: self.calm  # type: ignore[method-assign]
        self.tokens: asyncio.Queue[None] = asyncio.Queue()
        self.in_flight = 0
        self.in_flight_peak = 0
        self.created: list[PooledActor] = []

    async def _start_actor(self, node_id: str | None = None) -> PooledActor:
        self.in_flight += 1
        self.in_flight_peak = max(self.in_flight_peak, self.in_flight)
        try:
            await self.tokens.get()
        finally:
            self.in_flight -= 1
        actor = pooled()
        self.created.append(actor)
        return actor

    def finish_start(self) -> None:
        self.tokens.put_nowait(None)

    def add_live(self, name: str, handle: FakeActor) -> PooledActor:
        actor = pooled(handle)
        self.entries[name] = Entry(actor)
        return actor


@pytest.fixture
async def make_pool(tmp_path: Any) -> AsyncIterator[Any]:
    made: list[PoolUnderTest] = []

    async def make(**options: Any) -> PoolUnderTest:
        options.setdefault("pool_size", 0)
        options.setdefault("max_starting", 2)
        config = NamespaceConfig("pool", str(tmp_path), Think, **options)
        pool = PoolUnderTest(config)
        made.append(pool)
        started = asyncio.ensure_future(pool.start())
        while not started.done():  # the pool_size spares start() waits for
            if pool.in_flight > pool.tokens.qsize():
                pool.finish_start()
            await asyncio.sleep(0)
        await started
        return pool

    yield make
    for pool in made:
        pool._closed = True
        pool._kick()
        for task in list(pool._background):
            task.cancel()
        await asyncio.gather(*pool._background, return_exceptions=True)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def waiting_binds(pool: Directory, names: list[str]) -> list[asyncio.Task[PooledActor]]:
    return [asyncio.ensure_future(pool._acquire(name, None, False)) for name in names]


# -- the queue ------------------------------------------------------------------------------


async def test_waiting_binds_take_actors_in_arrival_order(make_pool):
    pool = await make_pool(start_patience=3600.0)
    pool.add_live("holder", FakeActor(busy=True))  # something to wait for: no start
    binds = waiting_binds(pool, [f"b{i}" for i in range(5)])
    await settle()
    assert pool.counters["pool_misses"] == 5 and not any(b.done() for b in binds)
    given = []
    for _ in range(5):
        actor = pooled()
        given.append(actor)
        pool._offer(actor)  # as if another bind gave it back
        await settle()
        assert sum(b.done() for b in binds) == len(given)
    assert [b.result() for b in binds] == given
    assert pool.binding == 5 and not pool.waiters


async def test_a_burst_starts_at_most_max_starting_actors_at_once_and_all_complete(make_pool):
    pool = await make_pool(max_starting=2)
    binds = waiting_binds(pool, [f"b{i}" for i in range(9)])
    while not all(b.done() for b in binds):
        await settle()
        assert pool.starting <= 2 and pool.in_flight <= 2
        pool.finish_start()
    await settle()
    assert pool.starting_peak == 2 and pool.in_flight_peak == 2
    assert len({id(b.result()) for b in binds}) == 9  # one actor each
    assert len(pool.created) == 9


async def test_a_retried_bind_goes_back_to_the_head_of_the_queue(make_pool):
    pool = await make_pool(start_patience=3600.0)
    pool.add_live("holder", FakeActor(busy=True))
    first = waiting_binds(pool, ["b0", "b1"])
    await settle()
    retried = asyncio.ensure_future(pool._acquire("again", None, True))
    await settle()
    actor = pooled()
    pool._offer(actor)
    await settle()
    assert retried.done() and retried.result() is actor
    assert not any(b.done() for b in first)


# -- hibernating idle agents for waiting binds ----------------------------------------------


async def test_a_waiting_bind_takes_the_actor_of_the_least_recently_used_idle_agent(make_pool):
    pool = await make_pool(start_patience=3600.0)
    recent, old, busy = FakeActor(idle_for=1.0), FakeActor(idle_for=50.0), FakeActor(busy=True)
    pool.add_live("recent", recent)
    old_actor = pool.add_live("old", old)
    pool.add_live("busy", busy)
    (bind,) = waiting_binds(pool, ["new"])
    actor = await asyncio.wait_for(bind, 5)
    assert actor is old_actor and old.hibernated == ["old"]
    assert set(pool.entries) == {"recent", "busy"} and not recent.hibernated
    assert pool.counters["lru_hibernations"] == 1


async def test_with_every_agent_busy_the_first_to_finish_gives_its_actor(make_pool):
    # A burst: more binds wait than max_starting starts could serve soon.
    pool = await make_pool(start_patience=3600.0, max_starting=2)
    agents = {f"a{i}": FakeActor(busy=True) for i in range(3)}
    actors = {name: pool.add_live(name, handle) for name, handle in agents.items()}
    first, *_ = waiting_binds(pool, ["new", "new2", "new3"])
    await settle()
    assert not first.done() and pool.counters.get("lru_hibernations", 0) == 0
    agents["a1"].finish()
    assert await asyncio.wait_for(first, 5) is actors["a1"]
    assert agents["a1"].hibernated == ["a1"] and set(pool.entries) == {"a0", "a2"}


async def test_below_the_cap_a_few_binds_leave_agents_in_a_conversation_live(make_pool):
    # Round-robin sessions: taking the least recently used agent for a bind would cost
    # its next call a rebind, which would take the next agent's actor, and so on.
    pool = await make_pool(start_patience=0.0, max_starting=2)
    agents = {f"a{i}": FakeActor(idle_for=1.0 + i) for i in range(3)}
    for name, handle in agents.items():
        pool.add_live(name, handle)
    (bind,) = waiting_binds(pool, ["new"])
    await settle()
    assert pool.starting == 1  # no agent to take: one actor starts for it
    await asyncio.sleep(0.05)  # the reclaim loop has polled the agents meanwhile
    assert not bind.done() and set(pool.entries) == set(agents)
    pool.finish_start()
    assert await asyncio.wait_for(bind, 5) is pool.created[0]
    assert not any(a.hibernated for a in agents.values())
    assert pool.counters.get("lru_hibernations", 0) == 0


async def test_below_the_cap_an_agent_idle_for_long_is_taken_at_once(make_pool):
    pool = await make_pool(start_patience=3600.0, max_starting=2)
    recent, done = FakeActor(idle_for=1.0), FakeActor(idle_for=RECLAIM_IDLE + 1)
    pool.add_live("recent", recent)
    done_actor = pool.add_live("done", done)
    (bind,) = waiting_binds(pool, ["new"])
    assert await asyncio.wait_for(bind, 5) is done_actor
    assert done.hibernated == ["done"] and not recent.hibernated


async def test_an_agent_bound_for_a_call_still_on_its_way_is_not_taken(make_pool):
    pool = await make_pool(start_patience=3600.0)
    pool.add_live("just-woken", FakeActor(fresh=True))
    (bind,) = waiting_binds(pool, ["new"])
    await asyncio.sleep(0.05)
    assert not bind.done() and "just-woken" in pool.entries


async def test_a_waiting_bind_takes_a_started_actor_if_it_comes_first(make_pool):
    pool = await make_pool(start_patience=0.0)
    busy = FakeActor(busy=True)
    pool.add_live("busy", busy)
    (bind,) = waiting_binds(pool, ["new"])
    await settle()
    assert pool.starting == 1  # no actor came at once: one is started
    pool.finish_start()
    actor = await asyncio.wait_for(bind, 5)
    assert actor is pool.created[0] and "busy" in pool.entries and not busy.hibernated


async def test_no_actor_is_started_while_idle_agents_can_serve_the_queue(make_pool):
    pool = await make_pool(start_patience=3600.0)
    handles = [FakeActor(idle_for=float(i)) for i in range(4)]
    for i, handle in enumerate(handles):
        pool.add_live(f"a{i}", handle)
    binds = waiting_binds(pool, [f"b{i}" for i in range(4)])
    await asyncio.wait_for(asyncio.gather(*binds), 5)
    assert pool.counters["lru_hibernations"] == 4 and pool.starting_peak == 0


async def test_at_the_live_cap_a_spare_waits_for_a_hibernation(make_pool):
    pool = await make_pool(max_live=2, start_patience=3600.0, cap_wait=3600.0)
    busy = FakeActor(busy=True)
    x = pool.add_live("x", busy)
    pool.add_live("y", FakeActor(busy=True))
    spare = pooled()
    pool._offer(spare)
    (bind,) = waiting_binds(pool, ["z"])
    await settle()
    assert not bind.done() and pool.free == [spare]  # a spare, but no room
    busy.finish()
    assert await asyncio.wait_for(bind, 5) is x  # its agent hibernated: room and an actor
    assert set(pool.entries) == {"y"} and pool.binding == 1 and pool.free == [spare]


async def test_after_cap_wait_a_bind_exceeds_the_cap(make_pool):
    pool = await make_pool(max_live=1, start_patience=3600.0, cap_wait=0.05)
    pool.add_live("x", FakeActor(busy=True))
    spare = pooled()
    pool._offer(spare)
    (bind,) = waiting_binds(pool, ["z"])
    assert await asyncio.wait_for(bind, 5) is spare
    assert pool.counters["cap_exceeded"] == 1


# -- the pool's size ------------------------------------------------------------------------


async def test_misses_raise_the_target(make_pool):
    pool = await make_pool(pool_size=1, start_patience=3600.0)
    pool.add_live("holder", FakeActor(busy=True))
    assert pool.target() == 1
    waiting_binds(pool, [f"b{i}" for i in range(6)])
    await settle()
    assert pool.counters["pool_hits"] == 1  # the one spare
    assert pool.counters["pool_misses"] == 5
    assert pool.target() >= 5


async def test_the_target_never_exceeds_max_pool(make_pool):
    pool = await make_pool(pool_size=1, max_pool=3, start_patience=3600.0)
    pool.add_live("holder", FakeActor(busy=True))
    waiting_binds(pool, [f"b{i}" for i in range(6)])
    await settle()
    assert pool.target() == 3


async def test_spares_are_started_ahead_of_demand_only_while_the_node_has_an_idle_core(
    make_pool,
):
    pool = await make_pool(pool_size=0, max_starting=2, start_patience=3600.0)
    pool.add_live("holder", FakeActor(busy=True))
    binds = waiting_binds(pool, [f"b{i}" for i in range(4)])
    await settle()
    for _ in binds:
        pool._offer(pooled())
    await asyncio.gather(*binds)
    assert pool.target() >= 4 and not pool.free
    pool._kick()
    assert pool.starting == 0  # the node is busy: the spares wait
    pool.calm = True
    pool._kick()
    assert pool.starting == 2  # idle: started, within max_starting


async def test_below_pool_size_spares_are_replenished_one_at_a_time_on_a_busy_node(make_pool):
    pool = await make_pool(pool_size=3, max_starting=2)
    assert len(pool.free) == 3
    taken = [await pool._acquire(f"a{i}", None, False) for i in range(3)]
    await settle()
    assert len(taken) == 3 and pool.starting == 1
    pool.finish_start()
    await settle()
    assert len(pool.free) == 1 and pool.starting == 1


async def test_spares_above_the_target_retire_when_unused(make_pool):
    pool = await make_pool(pool_size=1, pool_ttl=0.2)
    for _ in range(4):
        pool._offer(pooled())  # hibernated agents gave their actors back
    assert len(pool.free) == 5
    for _ in range(200):
        if len(pool.free) == 1:
            break
        await asyncio.sleep(0.05)
    assert len(pool.free) == 1 and pool.counters["spares_retired"] == 4


async def test_start_fills_the_pool_to_pool_size(make_pool, tmp_path):
    config = NamespaceConfig("fill", str(tmp_path), Think, pool_size=3, max_starting=1)
    pool = PoolUnderTest(config)
    started = asyncio.ensure_future(pool.start())
    for _ in range(3):
        await settle()
        assert pool.in_flight <= 1
        pool.finish_start()
    stats = await asyncio.wait_for(started, 5)
    assert stats["free"] == 3 and pool.in_flight_peak == 1
    pool._closed = True
    for task in list(pool._background):
        task.cancel()


# -- with real session actors ---------------------------------------------------------------


@pytest.mark.ray
def test_a_burst_of_new_agents_binds_each_once_within_the_start_bound(namespace_factory):
    import asyncio as aio

    # The pool of dedicated actors (hosts have their own policy: tests/test_host_policy.py).
    ns = namespace_factory(pool_size=1, max_starting=1, placement="dedicated")
    names = [f"burst-{i}" for i in range(8)]

    async def burst() -> list[Any]:
        return await aio.gather(*(ns.get(n).chat.remote(f"hi {n}") for n in names))

    results = aio.run(burst())
    assert all(r.status == "completed" for r in results)
    stats = ns.stats()
    assert stats["counters"]["binds"] == len(names) + stats["counters"].get("stale_rebinds", 0)
    assert stats["pool"]["starting_peak"] <= 1
    assert stats["counters"]["pool_misses"] >= 1
    assert stats["pool"]["target"] > 1  # the misses raised it
    # a starting directory never takes its own warming spare for a mute actor to kill
    assert stats["counters"].get("adopt_killed", 0) == 0
    for name in names:  # each one's history is its own, written once
        assert [m["role"] for m in ns.get(name).get_history.remote().result()] == [
            "user",
            "assistant",
        ]


@pytest.mark.ray
def test_at_the_live_cap_a_bind_takes_an_idle_agents_actor(namespace_factory):
    ns = namespace_factory(pool_size=0, max_pool=0, max_live=1, start_patience=3600.0)
    first = ns.get("first")
    first.chat.remote("hello").result()  # no spare and nothing live: an actor starts
    where = ns.where("first")
    second = ns.get("second")
    second.chat.remote("hello").result()
    assert ns.stats()["counters"]["lru_hibernations"] == 1
    assert ns.where("first") is None
    assert ns.where("second")["pid"] == where["pid"]
    assert len(first.get_history.remote().result()) == 2  # wakes again on its next call


@pytest.mark.ray
def test_busy_agents_keep_their_actors_then_the_extra_actors_retire(namespace_factory):
    import asyncio as aio

    ns = namespace_factory(
        pool_size=1,
        max_starting=1,
        start_patience=0.0,
        pool_ttl=0.5,
        placement="dedicated",  # actors of their own, retired one by one
        agent_kwargs={"chunks": 40, "delay": 0.02},
    )

    async def turn(name: str) -> list[Any]:
        return [chunk async for chunk in ns.get(name).stream_chat.remote("go")]

    async def together() -> list[list[Any]]:
        return await aio.gather(*(turn(f"long-{i}") for i in range(3)))

    for chunks in aio.run(together()):
        assert chunks[-1]["type"] == "finish"
    stats = ns.stats()
    assert stats["pool"]["starting_peak"] <= 1
    assert stats["counters"]["binds"] == 3  # none was taken mid-turn and rebound
    assert stats["counters"]["actors_created"] >= 2  # busy agents: actors were started
    ns.hibernate_all()
    assert ns.stats()["free"] >= 2
    wait_until(lambda: ns.stats()["free"] == 1, timeout=60)  # back to pool_size
    assert ns.stats()["counters"]["spares_retired"] >= 1


@pytest.mark.ray
def test_a_late_stale_report_does_not_kill_the_agents_new_binding(namespace_factory):
    ns = namespace_factory(pool_size=1)
    handle = ns.get("reused")
    handle.chat.remote("one").result()
    first = ns.where("reused")
    ns.hibernate("reused")
    ns.wake("reused")  # the most recently freed actor comes back: the same one
    again = ns.where("reused")
    if again["actor_id"] != first["actor_id"]:
        pytest.skip("the pool bound another actor; the race needs the same one")
    # A caller whose call failed on the old binding reports that actor stale only now.
    ray = pytest.importorskip("ray")
    actor, actor_id = ray.get(ns.directory.resolve.remote("reused", True, first["actor_id"]))
    assert actor_id == first["actor_id"]
    assert ns.where("reused")["pid"] == again["pid"]  # not killed, not rebound
    assert ns.stats()["counters"].get("stale_rebinds", 0) == 0
    assert len(handle.get_history.remote().result()) == 2
