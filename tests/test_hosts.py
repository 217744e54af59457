"""Placement ``hosts`` (issue 22): many agents per agent host actor.

The whole actor-level suite runs under hosts with ``THINKRAY_TEST_PLACEMENT=hosts``
(tests/conftest.py); these tests run under hosts in every run: agents share a
process yet keep their own file, turns, streams, aborts and hibernation; control
calls answer while the agents' loop is busy; a host's loop lag is measured.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

from tests.helpers import wait_until

pytestmark = pytest.mark.ray


def hosts_ns(namespace_factory, agent_cls=None, **kwargs):
    kwargs.setdefault("placement", "hosts")
    kwargs.setdefault("host_capacity", 8)
    # One host holds every agent these tests start (siblings share its loop): with
    # the live cap under a host's capacity no second host runs ahead (spread_target).
    kwargs.setdefault("max_live", 7)
    kwargs.setdefault("idle_timeout", None)
    return namespace_factory(agent_cls, **kwargs)


def test_placement_is_checked_before_anything_starts(tmp_path):
    from thinkray.actors.namespace import AgentNamespace

    with pytest.raises(ValueError, match="placement"):
        AgentNamespace("bad-placement", storage_root=str(tmp_path), placement="shared")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="host_capacity"):
        AgentNamespace(
            "bad-capacity", storage_root=str(tmp_path), placement="hosts", host_capacity=0
        )


def test_agents_share_a_host_process_with_their_own_files(namespace_factory):
    from tests.helpers import text_of

    ns = hosts_ns(namespace_factory)
    names = [f"a{i}" for i in range(4)]
    for name in names:
        result = ns.get(name).chat.remote(f"hello {name}").result()
        assert result.status == "completed"
    where = {name: ns.where(name) for name in names}
    assert {w["placement"] for w in where.values()} == {"hosts"}
    assert len({w["pid"] for w in where.values()}) == 1  # one process for the four
    assert os.getpid() not in {w["pid"] for w in where.values()}
    assert sorted(ns.names()) == names  # a file each
    for name in names:
        history = ns.get(name).get_history.remote().result()
        users = [text_of(m) for m in history if m["role"] == "user"]
        assert users == [f"hello {name}"]
    stats = ns.stats()
    assert stats["placement"] == "hosts"
    (host,) = stats["hosts"].values()
    assert host["live"] == 4 and host["capacity"] == 8
    # Siblings on one loop: each agent's turns wait for the disk off that loop.
    assert ns.get("a0").whoami.remote().result()["syncs_off_loop"] is True


def test_agents_spread_over_a_host_per_core_started_ahead(namespace_factory):
    """With room for more agents than one host holds, a second host is started with
    the namespace, before any agent needs it (this Ray has two CPUs: two hosts, no
    third), and new agents go to the least loaded host, so a burst of new sessions
    runs on both cores."""
    ns = hosts_ns(namespace_factory, max_live=16)
    wait_until(lambda: len(ns.stats()["hosts"]) == 2, timeout=60)
    names = [f"s{i}" for i in range(4)]
    for name in names:
        assert ns.get(name).chat.remote(f"hello {name}").result().status == "completed"
    pids = [ns.where(name)["pid"] for name in names]
    assert len(set(pids)) == 2 and pids.count(pids[0]) == 2  # two on each host
    hosts = ns.stats()["hosts"]
    assert len(hosts) == 2 and sorted(h["live"] for h in hosts.values()) == [2, 2]


def test_hibernating_one_agent_leaves_its_siblings_running(namespace_factory):
    ns = hosts_ns(namespace_factory, agent_kwargs={"chunks": 40, "delay": 0.02})
    quiet, busy = ns.get("quiet"), ns.get("busy")
    quiet.chat.remote("hi").result()
    first = quiet.whoami.remote().result()
    stream = busy.stream_chat.remote("a long answer")
    chunks = iter(stream)
    next(chunks)
    assert ns.hibernate("quiet")
    assert ns.where("quiet") is None
    rest = list(chunks)
    assert rest[-1]["type"] == "finish"  # the sibling's turn went on to its end
    again = quiet.whoami.remote().result()  # woken: a new instance, same host process
    assert again["incarnation"] != first["incarnation"]
    assert again["pid"] == first["pid"]
    assert not ns.hibernate("busy") or ns.where("busy") is None


def test_abort_reaches_one_agent_among_busy_siblings(namespace_factory):
    ns = hosts_ns(namespace_factory, agent_kwargs={"chunks": 200, "delay": 0.02})
    streams = {n: ns.get(n).stream_chat.remote("go on") for n in ("s0", "s1", "s2")}
    firsts = {n: next(iter(s)) for n, s in streams.items()}
    assert all(c["type"] == "start" for c in firsts.values())
    assert streams["s1"].receiver.abort("stop that one")
    ends = {n: list(s)[-1]["type"] for n, s in streams.items()}
    assert ends == {"s0": "finish", "s1": "abort", "s2": "finish"}


def test_control_calls_answer_while_the_agents_loop_is_blocked(namespace_factory):
    """snapshot and host_status run in the control group's own loop: they answer while
    an agent blocks the agents' loop (a sync tool that sleeps), and the loop lag the
    host reports shows the block afterwards."""
    import ray

    from tests.agents import BlockingAgent

    ns = hosts_ns(namespace_factory, BlockingAgent)
    blocker = ns.get("blocker")
    blocker.chat.remote("warm").result()
    host = _host_handle(ns, "blocker")
    outcome: dict[str, object] = {}

    def block() -> None:
        outcome["result"] = blocker.block.remote(3.0).result()

    thread = threading.Thread(target=block)
    thread.start()
    wait_until(lambda: ray.get(host.host_status.remote())["busy"] == 1, timeout=30)
    status = ray.get(host.host_status.remote(), timeout=30)
    assert outcome.get("result") is None, "answered only after the block ended"
    assert status["hosted"] == 1
    thread.join(60)
    assert outcome["result"] == "blocked"
    lag = wait_until(lambda: ray.get(host.host_status.remote())["loop_lag_s"] > 1.0, timeout=30)
    assert lag


def test_a_blocking_tool_leaves_its_siblings_running(namespace_factory, tmp_path):
    """A plain ``def`` tool that blocks (here until a file exists) runs off the host's
    event loop: a sibling agent on the same host chats to the end meanwhile (on the
    loop, the sibling's turn could only start once the tool returned)."""
    from tests.agents import GateToolAgent

    gate, started = tmp_path / "gate", tmp_path / "started"
    ns = hosts_ns(namespace_factory, GateToolAgent, agent_kwargs={"gate": str(gate), "started": str(started)})  # fmt: skip
    waiter, sibling = ns.get("waiter"), ns.get("sibling")
    sibling.chat.remote("warm").result()
    waiter.chat.remote("warm").result()
    assert ns.where("waiter")["pid"] == ns.where("sibling")["pid"]
    outcome: dict[str, object] = {}

    def wait() -> None:
        outcome["result"] = waiter.chat.remote("through the gate").result(timeout_s=120)

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(started.exists, timeout=60)
    assert sibling.chat.remote("meanwhile").result(timeout_s=120).status == "completed"
    assert "result" not in outcome  # the tool still blocks
    gate.touch()
    thread.join(120)
    result = outcome["result"]
    assert result.status == "completed"  # type: ignore[attr-defined]
    history = waiter.get_history.remote().result()
    [call] = [p for p in history[-1]["parts"] if p["type"] == "dynamic-tool"]
    assert call["output"] == "opened"


def test_a_host_kill_takes_its_agents_and_each_wakes_on_its_next_call(namespace_factory):
    from tests.helpers import kill_agent_process

    ns = hosts_ns(namespace_factory)
    names = ["k0", "k1", "k2"]
    before = {n: ns.get(n).whoami.remote().result() for n in names}
    assert len({b["pid"] for b in before.values()}) == 1
    pid = kill_agent_process(ns, "k0")
    wait_until(lambda: all(ns.where(n) is None for n in names), timeout=30)
    after = {n: ns.get(n).whoami.remote().result() for n in names}
    assert {a["pid"] for a in after.values()} != {pid}
    assert all(after[n]["incarnation"] != before[n]["incarnation"] for n in names)


def test_the_directory_watches_each_host_once_not_each_agent(namespace_factory):
    """A bind on a host costs the directory and the host no Ray call of its own for
    crash detection: the host's one ``watch_host`` call covers its agents (the kill
    test above shows it still does). An agent's own actor is watched as before."""
    from tests.agents import DedicatedScriptAgent

    ns = hosts_ns(namespace_factory)
    for name in ("w0", "w1", "w2"):
        ns.get(name).whoami.remote().result()
    counters = ns.stats()["counters"]
    assert counters["binds"] >= 3
    assert counters.get("watches", 0) == 0
    assert 1 <= counters["host_watches"] <= counters["hosts_started"]
    own = hosts_ns(namespace_factory, DedicatedScriptAgent)
    own.get("alone").whoami.remote().result()
    assert own.stats()["counters"]["watches"] == 1


def test_a_host_resolves_its_directory_when_started_not_in_its_first_bind(namespace_factory):
    """Binds name the directory (by name: handles.NamedHandle). Its lookup in a fresh
    process (a GCS call, and the import of the directory's module with Ray's wrapping
    of its methods) ran inside the first bind and held up every bind of a burst on
    that host; the directory now sends its name with the host's start (``ready``)."""
    import ray

    ns = hosts_ns(namespace_factory)
    wait_until(lambda: len(ns.stats()["hosts"]) >= 1, timeout=60)
    host_id = next(iter(ns.stats()["hosts"]))
    directory_id = ns._router.handles[0]._actor_id.hex()

    def resolved(_host: Any) -> tuple[bool, bool]:
        import sys

        from thinkray.actors import handles

        return directory_id in handles._resolved, "thinkray.actors.directory" in sys.modules

    for item in ray.util.list_named_actors(all_namespaces=True):
        if item["namespace"] == "thinkray" and "/host-" in item["name"]:
            handle = ray.get_actor(item["name"], namespace="thinkray")
            if handle._actor_id.hex() == host_id:
                assert ray.get(handle.__ray_call__.remote(resolved), timeout=60) == (True, True)
                assert ns.stats()["counters"].get("binds", 0) == 0  # before any bind
                return
    raise AssertionError("the host was not found")


def _host_handle(ns, name):
    import ray

    actor_id = ns.where(name)["actor_id"]
    for item in ray.util.list_named_actors(all_namespaces=True):
        if item["namespace"] != "thinkray" or "/host-" not in item["name"]:
            continue
        handle = ray.get_actor(item["name"], namespace="thinkray")
        if handle._actor_id.hex() == actor_id:
            return handle
    raise AssertionError(f"no host for {name}")


def test_an_agent_class_may_require_a_dedicated_actor(namespace_factory):
    from tests.agents import DedicatedScriptAgent

    ns = hosts_ns(namespace_factory, DedicatedScriptAgent)
    assert ns.stats()["placement"] == "dedicated"
    ns.get("alone").chat.remote("hi").result()
    assert ns.where("alone")["placement"] == "dedicated"
    # Alone on its loop, it syncs in place (a thread hop would cost more than it saves).
    assert ns.get("alone").whoami.remote().result()["syncs_off_loop"] is None


def test_an_agent_class_may_sync_in_place_in_a_host(namespace_factory):
    from tests.agents import InPlaceSyncScriptAgent

    ns = hosts_ns(namespace_factory, InPlaceSyncScriptAgent)
    assert ns.get("own").chat.remote("hi").result().status == "completed"
    assert ns.where("own")["placement"] == "hosts"
    assert ns.get("own").whoami.remote().result()["syncs_off_loop"] is False


def test_a_host_answers_every_call_a_dedicated_actor_answers():
    """Callers (handles, the ingress) call an agent's actor by method name, whichever
    placement it has: each public method of a session actor is one of the host's."""
    import inspect

    from thinkray.actors.host import AgentHost
    from thinkray.actors.session_actor import SessionActor

    def public(cls):
        return {n for n, _ in inspect.getmembers(cls, inspect.isfunction) if n[0] != "_"}

    # busy: read by the host itself, never through a handle; watch: the directory's
    # on an agent's own actor (a host is watched whole: watch_host)
    internal = {"busy", "watch"}
    assert public(SessionActor) - internal <= public(AgentHost)


def _own_actors(ns) -> list[str]:
    """The agents' own actors (moved out of the hosts) of ``ns`` Ray still lists."""
    import ray

    return [
        item["name"]
        for item in ray.util.list_named_actors(all_namespaces=True)
        if item["namespace"] == "thinkray" and ns.name in item["name"] and "own-" in item["name"]
    ]


def test_a_hot_agent_moves_to_its_own_actor_and_back(namespace_factory):
    from tests.helpers import text_of

    ns = hosts_ns(namespace_factory)
    hot, sibling = ns.get("hot"), ns.get("sibling")
    hot.chat.remote("before the move").result()
    sibling.chat.remote("hi").result()
    host_pid = ns.where("hot")["pid"]

    where = ns.place("hot", "dedicated")
    assert where is not None and where["placement"] == "dedicated"
    assert where["pid"] != host_pid  # a process of its own
    assert ns.where("sibling")["placement"] == "hosts"  # the sibling stayed
    assert ns.where("sibling")["pid"] == host_pid
    hot.chat.remote("after the move").result()  # the handle follows the agent
    users = [text_of(m) for m in hot.get_history.remote().result() if m["role"] == "user"]
    assert users == ["before the move", "after the move"]  # its file went with it

    assert ns.hibernate("hot")  # its own actor is stopped, not pooled as a host slot
    wait_until(lambda: not _own_actors(ns), timeout=20)
    assert ns.get("hot").whoami.remote().result()["pid"] != host_pid  # still its own
    assert ns.where("hot")["placement"] == "dedicated"

    back = ns.place("hot", "hosts")
    assert back is not None and back["placement"] == "hosts"
    wait_until(lambda: not _own_actors(ns), timeout=20)
    assert hot.whoami.remote().result()["pid"] == ns.where("sibling")["pid"]
    stats = ns.stats()["counters"]
    assert stats["own_actors_started"] == stats["own_actors_stopped"] == 2


def test_a_move_waits_for_the_running_turn(namespace_factory):
    ns = hosts_ns(namespace_factory, agent_kwargs={"chunks": 30, "delay": 0.03})
    agent = ns.get("busy")
    agent.chat.remote("wake").result()
    stream = agent.stream_chat.remote("a long answer")
    chunks = iter(stream)
    next(chunks)  # the turn runs
    moved: list = []
    mover = threading.Thread(target=lambda: moved.append(ns.place("busy", "dedicated")))
    mover.start()
    rest = list(chunks)
    mover.join(timeout=60)
    assert rest[-1]["type"] == "finish"  # the turn ran to its end, not aborted
    assert moved and moved[0]["placement"] == "dedicated"
    history = agent.get_history.remote().result()
    assert [m["role"] for m in history[-2:]] == ["user", "assistant"]


def test_a_move_refused_leaves_the_agent_where_it_was(namespace_factory, tmp_path):
    from thinkray.actors.errors import ActorBusyError, InvalidStateError
    from thinkray.storage.errors import InvalidInputError
    from thinkray.storage.types import SessionNotFoundError

    ns = hosts_ns(namespace_factory, agent_kwargs={"chunks": 60, "delay": 0.05})
    agent = ns.get("a")
    agent.chat.remote("wake").result()
    with pytest.raises(InvalidInputError, match="placement"):
        ns.place("a", "shared")  # type: ignore[arg-type]
    with pytest.raises(SessionNotFoundError):
        ns.place("nobody", "dedicated")
    assert "nobody" not in ns.names()  # nothing was created
    chunks = iter(agent.stream_chat.remote("a long answer"))
    next(chunks)
    with pytest.raises(ActorBusyError, match="busy"):
        ns.place("a", "dedicated", timeout=0.2)
    assert list(chunks)[-1]["type"] == "finish"
    assert ns.where("a")["placement"] == "hosts"
    ns.hibernate("a")
    assert agent.whoami.remote().result() and ns.where("a")["placement"] == "hosts"

    dedicated = namespace_factory(None, idle_timeout=None, placement="dedicated")
    dedicated.get("b").chat.remote("hi").result()
    with pytest.raises(InvalidStateError, match="actor of its own"):
        dedicated.place("b", "dedicated")


def test_a_moved_agent_stays_on_its_own_actor_after_the_directory_restarts(
    namespace_factory,
):
    import signal

    import ray

    ns = hosts_ns(namespace_factory)
    ns.get("hot").chat.remote("hi").result()
    ns.get("sibling").chat.remote("hi").result()
    moved = ns.place("hot", "dedicated")
    pid = ray.get(ns._router.handles[0].stats.remote())["pid"]
    os.kill(pid, signal.SIGKILL)

    # the replacement adopts the agent on its own actor, and keeps it out of the hosts
    def restarted() -> bool:
        try:
            return ray.get(ns._router.handles[0].stats.remote())["pid"] != pid
        except ray.exceptions.RayActorError:  # restarting
            return False

    wait_until(restarted, timeout=30)
    assert ns.where("hot") == moved
    assert ns.hibernate("hot")
    wait_until(lambda: not _own_actors(ns), timeout=20)  # stopped, not a host slot
    assert ns.get("hot").whoami.remote().result()["pid"] != ns.where("sibling")["pid"]
    assert ns.where("hot")["placement"] == "dedicated"


def test_a_bind_reply_says_which_host_not_every_agent_on_it(namespace_factory, tmp_path):
    """The directory reads a bind's reply on its one loop for every bind: it carries
    the host's identity and load, not a list of the host's agents (that grew the
    reply, and its decoding, with every agent the host held)."""
    import ray
    from thinkray.actors.session_actor import BindSpec

    from tests.agents import ScriptAgent

    ns = hosts_ns(namespace_factory, ScriptAgent)
    for name in ("one", "two"):
        ns.get(name).chat.remote("hi").result()
    host = _host_handle(ns, "one")
    spec = BindSpec(
        namespace="side", name="side", path=str(tmp_path / "side.duckdb"), agent_cls=ScriptAgent
    )
    info = ray.get(host.bind.remote(spec), timeout=60)
    try:
        assert info["bound"] == "side" and info["host"] is True
        assert info["actor_id"] == ns.where("one")["actor_id"]
        assert info["hosted"] == 3 and info["capacity"] == 8
        assert "agents" not in info
        assert set(ray.get(host.ready.remote(), timeout=60)["agents"]) == {"one", "two", "side"}
    finally:
        ray.get(host.hibernate.remote("side", True), timeout=60)


def test_a_burst_of_binds_shares_calls_to_its_host_and_each_fails_alone(
    namespace_factory, ray_local, tmp_path
):
    """Binds that meet the host's calls in flight go to it together in one
    ``bind_many`` call (thinkray.actors.host_binds), and each keeps its own outcome: a
    wake whose hook raises fails its own caller only."""
    import uuid
    from concurrent.futures import ThreadPoolExecutor

    from thinkray.actors.errors import WakeError

    from tests.sec_pool_agents import Gate, PoolProbeAgent

    gate_name = f"gate-{uuid.uuid4().hex[:8]}"
    gate = (
        ray_local.remote(Gate)
        .options(name=gate_name, namespace="thinkray-tests", max_concurrency=100)
        .remote()
    )
    flags = tmp_path / "flags"
    flags.mkdir()
    (flags / "fail-wake-bad").touch()
    ns = hosts_ns(
        namespace_factory,
        PoolProbeAgent,
        agent_kwargs={"flags": str(flags), "gate": gate_name, "gate_namespace": "thinkray-tests"},
    )

    def chat(name: str) -> str:
        return str(ns.get(name).chat.remote(f"hello {name}").result().status)

    def queued() -> int:
        return sum(h["binds_queued"] for h in ns.stats()["hosts"].values())

    def release() -> None:
        ray_local.get([gate.release.remote("wake:g1"), gate.release.remote("wake:g2")])

    try:
        ray_local.get([gate.hold.remote("wake:g1"), gate.hold.remote("wake:g2")])
        with ThreadPoolExecutor(6) as pool:
            held = [pool.submit(chat, n) for n in ("g1", "g2")]  # a call each, held
            try:
                ray_local.get([gate.arrived.remote("wake:g1"), gate.arrived.remote("wake:g2")])
                later = {n: pool.submit(chat, n) for n in ("a1", "a2", "bad", "a3")}
                wait_until(lambda: queued() == 4, timeout=60)
            finally:  # the held calls end either way (the pool waits for them)
                release()
            assert [f.result(timeout=60) for f in held] == ["completed", "completed"]
            for name in ("a1", "a2", "a3"):
                assert later[name].result(timeout=60) == "completed"
            with pytest.raises(WakeError) as failed:
                later["bad"].result(timeout=60)
        assert failed.value.name == "bad"
        counters = ns.stats()["counters"]
        # g1's call, g2's call, then one for the four that waited behind them
        assert counters["host_bind_calls"] == 3 and counters["host_binds_coalesced"] == 3
        assert sorted(ns.stats()["live"]) == ["a1", "a2", "a3", "g1", "g2"]
    finally:
        ray_local.kill(gate)


def test_a_hibernation_whose_file_close_fails_still_stops_the_agent(namespace_factory, tmp_path):
    """The store's close raised in its thread: the agent is closed all the same (its
    timers and tasks stopped, the file closed on the second try), and it wakes again
    with its history."""
    import contextlib

    from tests.agents import CloseFailsOnceAgent

    flags = tmp_path / "flags"
    flags.mkdir()
    ns = hosts_ns(namespace_factory, CloseFailsOnceAgent, agent_kwargs={"flags": str(flags)})
    assert ns.get("fragile").chat.remote("hello").result().status == "completed"
    with contextlib.suppress(Exception):  # the close's error may reach the caller
        ns.hibernate("fragile")
    assert (flags / "closed-fragile").exists()
    assert ns.get("fragile").message_count.remote().result() == 2


def test_binds_waiting_for_a_starting_host_hibernate_no_agent_below_the_cap(namespace_factory):
    """More binds than one host holds arrive while the live cap has room: they wait
    for the hosts that start for them instead of hibernating agents just woken (a
    host start brings its capacity in slots, not one)."""
    import asyncio

    from thinkray.actors.pool_policy import RECLAIM_IDLE

    ns = hosts_ns(namespace_factory, host_capacity=4, max_live=40, max_starting=2)

    async def wake(names: list[str]) -> None:
        await asyncio.gather(*(ns.get(n).get_sessions.remote() for n in names))

    first = [f"w{i}" for i in range(4)]
    asyncio.run(wake(first))
    second = [f"v{i}" for i in range(8)]
    began = time.monotonic()
    asyncio.run(wake(second))  # more than the free slots: some wait for a host start
    waited = time.monotonic() - began
    stats = ns.stats()
    if waited >= RECLAIM_IDLE:  # a machine so loaded that the first agents idled long
        return  # enough to be taken by design: nothing to conclude
    assert stats["counters"].get("lru_hibernations", 0) == 0
    assert sum(h["live"] for h in stats["hosts"].values()) == len(first) + len(second)
