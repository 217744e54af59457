"""Session actors on Ray (issue 3): names, relay, abort receivers, hibernate/wake
through the warm pool, resume, fibers and alarms — with real actors on one shared
local Ray."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import text_of, wait_until

pytestmark = pytest.mark.ray


@pytest.fixture
def collector_cls(ray_local):
    @ray_local.remote(num_cpus=0)
    class Collector:
        def __init__(self, delay: float = 0.0):
            self.chunks = []
            self.calls = 0
            self.done = 0
            self.errors = []
            self.delay = delay

        def on_chunks(self, batch):
            self.calls += 1
            self.chunks.extend(batch)
            if self.delay:
                time.sleep(self.delay)

        def on_done(self):
            self.done += 1

        def on_error(self, error):
            self.errors.append(error)

        def state(self):
            return {
                "chunks": self.chunks,
                "calls": self.calls,
                "done": self.done,
                "errors": self.errors,
            }

    return Collector


# One slow answer (3 s) for the tests that act while a run streams: they share a
# namespace of such agents, each with an agent of its own name.
SLOW = {"chunks": 300, "delay": 0.01}


@pytest.fixture(scope="module")
def _slow_namespace(module_namespace_factory):
    return module_namespace_factory(agent_kwargs=SLOW)


@pytest.fixture
def slow_namespace(_slow_namespace):
    """The module's namespace of slow agents (``SLOW``); hibernated after each test."""
    from tests.helpers import hibernated_after

    yield from hibernated_after(_slow_namespace)


@pytest.fixture(scope="module")
def names_ns(module_namespace_factory):
    """A namespace no agent ever binds in, for the name checks."""
    return module_namespace_factory()


# -- addressing ------------------------------------------------------------------------


def test_get_creates_and_chat_persists(shared_namespace):
    ns = shared_namespace
    agent = ns.get("alice")
    result = agent.chat.remote("hello").result()
    assert result.status == "completed"
    assert result.text == "chunk0 chunk1 chunk2 chunk3 chunk4 "
    history = agent.get_history.remote().result()
    assert [m["role"] for m in history] == ["user", "assistant"]
    assert "alice" in ns.names()


def test_concurrent_get_or_create_yields_one_actor(namespace_factory, ray_local):
    ns = namespace_factory(pool_size=2)

    @ray_local.remote(num_cpus=0)
    def resolve_from_another_process(namespace_name, agent_name):
        from thinkray.actors.namespace import AgentNamespace

        handle = AgentNamespace.connect(namespace_name).get(agent_name)
        return handle.whoami.remote().result()

    refs = [resolve_from_another_process.remote(ns.name, "shared") for _ in range(4)]
    local = ns.get("shared").whoami.remote().result()
    seen = ray_local.get(refs) + [local]
    assert len({s["incarnation"] for s in seen}) == 1  # one live instance
    assert len({s["pid"] for s in seen}) == 1  # one process, so one writer
    assert ns.stats()["counters"]["binds"] == 1


def test_a_woken_agents_handle_calls_it_without_asking_the_directory(shared_namespace):
    """``ns.wake(name)`` tells the name's handle where the agent lives: its first call
    goes there at once (it asked the directory first: a round trip, ~3.6 ms here)."""
    ns = shared_namespace
    where = ns.wake("woken")
    before = ns.stats()["counters"]["resolves"]
    agent = ns.get("woken")
    assert agent.whoami.remote().result()["pid"] == where["pid"]
    assert list(agent.stream_chat.remote("hi"))[-1]["type"] == "finish"
    assert ns.stats()["counters"]["resolves"] == before
    ns.hibernate("woken")
    assert agent.chat.remote("again").result().status == "completed"  # asks again
    assert ns.stats()["counters"]["resolves"] == before + 1


def test_the_directory_never_imports_the_agent_class(namespace_factory, ray_local):
    """The directory routes binds to the class but never runs it: it carries the class
    as a reference, so its process imports neither the agent's module nor the runtime
    and DuckDB that the module pulls in (that import was ~0.12 s of CPU at every
    directory's start)."""
    from tests.lazy_agent import LazyAgent

    ns = namespace_factory(LazyAgent)
    agent = ns.get("lazy")
    assert agent.chat.remote("hi").result().status == "completed"
    heavy = ("tests.lazy_agent", "thinkray.runtime.agents.think", "duckdb")

    def imported(_actor: Any) -> list[str]:
        import sys

        return [module for module in heavy if module in sys.modules]

    directory = ns._router.handles[0]
    assert ray_local.get(directory.__ray_call__.remote(imported)) == []
    # the agent's own process did import it: the check can tell
    assert "tests.lazy_agent" in ray_local.get(agent._actor_sync().__ray_call__.remote(imported))


# -- relay ----------------------------------------------------------------------------


def test_callback_actor_receives_every_chunk_in_order(namespace_factory, collector_cls):
    from tests.agents import ScriptAgent  # noqa: F401

    ns = namespace_factory(agent_kwargs={"chunks": 300})
    collector = collector_cls.remote(delay=0.01)  # a lagging consumer
    agent = ns.get("relay")
    result = agent.chat.remote("go", callback=collector).result()
    state = ray_local_get(collector.state.remote())
    deltas = [c["delta"] for c in state["chunks"] if c["type"] == "text-delta"]
    assert deltas == [f"chunk{i} " for i in range(300)]
    assert state["chunks"][0]["type"] == "start" and state["chunks"][-1]["type"] == "finish"
    assert state["done"] == 1
    # coalesced: far fewer Ray calls than chunks
    assert state["calls"] < len(state["chunks"]) / 5
    assert result.text.startswith("chunk0 ")


def ray_local_get(ref):
    import ray

    return ray.get(ref)


def test_streaming_generator_matches_chunk_log(namespace_factory):
    ns = namespace_factory(agent_kwargs={"chunks": 500})
    agent = ns.get("streamer")
    stream = agent.stream_chat.remote("go")
    chunks = list(stream)
    assert stream.run_id and stream.batches < len(chunks)
    assert [c["type"] for c in chunks][-1] == "finish"
    stored = agent.get_history.remote().result()[-1]
    assert text_of(stored) == "".join(c["delta"] for c in chunks if c["type"] == "text-delta")


def test_a_local_callback_object_is_refused_with_the_alternative(shared_namespace):
    from thinkray.actors.errors import RemoteCallError

    class Local:
        def on_event(self, chunk):
            raise AssertionError("never called in another process")

    ns = shared_namespace
    agent = ns.get("local-cb")
    with pytest.raises(RemoteCallError, match="stream_chat"):
        agent.chat.remote("hi", callback=Local())
    assert agent.get_sessions.remote().result() == []  # nothing ran
    chunks = list(agent.stream_chat.remote("hi"))  # the local way to follow a turn
    assert chunks[-1]["type"] == "finish"


def test_configure_and_status(slow_namespace):
    ns = slow_namespace
    agent = ns.get("cfg")
    agent.configure.remote({"modelTier": "capable"}).result()
    run = agent.stream_chat.remote("slow")
    assert agent.get_status.remote().result().state == "busy"
    agent.wait_run.remote(run.run_id).result()
    assert agent.get_status.remote().result().state == "idle"
    assert ns.hibernate("cfg")
    assert agent.get_config.remote().result() == {"modelTier": "capable"}  # survived hibernation


# -- abort ------------------------------------------------------------------------------


def test_abort_receiver_works_from_another_process(slow_namespace, ray_local):
    ns = slow_namespace
    agent = ns.get("abortme")
    run = agent.stream_chat.remote("long")
    receiver = run.receiver

    @ray_local.remote(num_cpus=0)
    def abort_elsewhere(r):
        return r.abort("stop from elsewhere")

    time.sleep(0.3)
    assert ray_local.get(abort_elsewhere.remote(receiver)) is True
    result = agent.wait_run.remote(run.run_id).result()
    assert result is None or result.status == "aborted"
    wait_until(lambda: agent.get_status.remote().result().state == "idle")
    assert receiver.abort() is False  # finished: nothing to abort
    last = agent.get_history.remote().result()[-1]
    n = len(text_of(last).split())
    assert 0 < n < SLOW["chunks"]
    assert last["metadata"]["status"] == "aborted"
    # truthful after a wake too
    assert ns.hibernate("abortme")
    assert text_of(agent.get_history.remote().result()[-1]) == text_of(last)


def test_abort_unknown_run_returns_false(shared_namespace):
    ns = shared_namespace
    agent = ns.get("nobody")
    run = agent.stream_chat.remote("x")
    agent.wait_run.remote(run.run_id).result()
    from thinkray.actors.relay import AbortReceiver

    fake = AbortReceiver(run.receiver.actor, "nobody", "run_does_not_exist")
    assert fake.abort() is False
    assert run.receiver.abort() is False


def test_detach_does_not_cancel(slow_namespace):
    ns = slow_namespace
    agent = ns.get("detach")
    stream = agent.stream_chat.remote("go")
    first = [next(stream) for _ in range(5)]
    assert first[0]["type"] == "start"
    del stream  # the consumer goes away mid-stream
    wait_until(lambda: agent.get_status.remote().result().state == "idle")
    last = agent.get_history.remote().result()[-1]
    assert text_of(last).split()[-1] == f"chunk{SLOW['chunks'] - 1}"
    assert last["metadata"]["status"] == "completed"


# -- resume -----------------------------------------------------------------------------


def test_resume_replays_from_zero_then_tails(slow_namespace):
    ns = slow_namespace
    agent = ns.get("resumer")
    first = agent.stream_chat.remote("go")
    seen = [next(first) for _ in range(20)]
    del first  # disconnect
    resumed = agent.resume.remote()
    replay = list(resumed)
    assert resumed.run_id and replay[0]["type"] == "start"
    assert replay[: len(seen)] == seen  # replay starts at index 0
    deltas = [c["delta"] for c in replay if c["type"] == "text-delta"]
    assert deltas == [f"chunk{i} " for i in range(SLOW["chunks"])]  # exactly once, contiguous
    assert replay[-1]["type"] == "finish"
    # after a wake the last run is replayed from the chunk log in the database
    assert ns.hibernate("resumer")
    again = list(agent.resume.remote())
    assert again == replay


# -- hibernate and wake -----------------------------------------------------------------


def test_hibernate_closes_file_and_wake_is_a_fresh_instance(namespace_factory, tmp_path):
    ns = namespace_factory(pool_size=2)
    agent = ns.get("sleeper")
    agent.chat.remote("remember").result()
    before = agent.whoami.remote().result()
    assert ns.hibernate("sleeper")
    path = Path(ns.storage_root) / ns.name / "sleeper.duckdb"
    assert path.exists() and not Path(str(path) + ".wal").exists()
    assert ns.where(agent.name) is None
    created = ns.stats()["counters"]["actors_created"]
    after = agent.whoami.remote().result()
    assert after["incarnation"] != before["incarnation"]
    assert [m["role"] for m in agent.get_history.remote().result()] == ["user", "assistant"]
    stats = ns.stats()
    assert stats["counters"]["pool_hits"] >= 2
    assert stats["counters"].get("pool_misses", 0) == 0
    assert stats["counters"]["actors_created"] <= created + 1  # only the pool top-up


def test_idle_timeout_hibernates(namespace_factory):
    ns = namespace_factory(idle_timeout=0.3)
    agent = ns.get("idler")
    agent.chat.remote("x").result()
    wait_until(lambda: not ns.stats()["live"], timeout=10)
    assert ns.stats()["counters"]["hibernations"] >= 1
    assert len(agent.get_history.remote().result()) == 2  # wakes on the next call


def test_live_cap_hibernates_least_recently_used(namespace_factory):
    ns = namespace_factory(max_live=2, pool_size=2)
    a, b, c = ns.get("a1"), ns.get("b1"), ns.get("c1")
    a.chat.remote("x").result()
    time.sleep(0.2)
    b.chat.remote("y").result()
    time.sleep(0.05)
    c.chat.remote("z").result()
    live = set(ns.stats()["live"])
    assert live == {"b1", "c1"}
    assert ns.stats()["counters"]["lru_hibernations"] == 1
    assert len(a.get_history.remote().result()) == 2


def test_hibernate_refused_while_running(slow_namespace):
    ns = slow_namespace
    agent = ns.get("busy")
    run = agent.stream_chat.remote("go")
    assert ns.hibernate("busy") is False
    agent.wait_run.remote(run.run_id).result()
    assert ns.hibernate("busy") is True


def test_crashed_actor_is_replaced(shared_namespace, ray_local):
    ns = shared_namespace
    agent = ns.get("crashy")
    agent.chat.remote("before crash").result()
    pid = ns.where(agent.name)["pid"]
    actor = agent._actor
    ray_local.kill(actor, no_restart=True)
    # ray.kill returns before the process is gone: a call sent meanwhile reaches the
    # live actor and is interrupted by the kill (RunInterruptedError, as it should).
    # This test is about the call after the crash.
    wait_until(lambda: _dead(ray_local, actor), timeout=30)
    result = agent.chat.remote(
        "after crash"
    ).result()  # rebinds on the next call (file lock retried)
    assert result.status == "completed"
    assert ns.where(agent.name)["pid"] != pid
    assert len(agent.get_history.remote().result()) == 4


def _dead(ray: Any, actor: Any) -> bool:
    try:
        ray.get(actor.__ray_ready__.remote(), timeout=5)
    except ray.exceptions.RayActorError:
        return True
    except ray.exceptions.GetTimeoutError:
        return False
    return False


def test_recycle_after_n_bindings(namespace_factory):
    # A dedicated actor recycles; a host keeps its process for its other agents.
    ns = namespace_factory(recycle_after=1, pool_size=1, placement="dedicated")
    agent = ns.get("recycled")
    agent.chat.remote("x").result()
    assert ns.hibernate("recycled")
    assert ns.stats()["counters"]["actors_recycled"] == 1


def test_orphaned_tool_call_finalized_after_restart(shared_namespace):
    from thinkray.storage.session_store import DuckDBSessionStore

    ns = shared_namespace
    path = Path(ns.storage_root) / ns.name / "orphan.duckdb"
    store = DuckDBSessionStore(path)
    sid = store.create_session("s").id
    store.set_config("think.current_session", sid)
    store.append_message(sid, {"id": "u", "role": "user", "parts": [{"type": "text", "text": "q"}]})
    store.append_message(
        sid,
        {
            "id": "a",
            "role": "assistant",
            "parts": [
                {
                    "type": "dynamic-tool",
                    "toolName": "get_weather",
                    "toolCallId": "c",
                    "state": "input-available",
                    "input": {"city": "Lima"},
                }
            ],
        },
    )
    store.close()
    agent = ns.existing("orphan")
    agent.chat.remote("next").result()
    part = agent.get_history.remote().result()[1]["parts"][0]
    assert part["state"] == "output-error" and "restart" in part["errorText"]


# -- fibers and alarms -------------------------------------------------------------------


def test_fiber_recovers_after_crash(shared_namespace, ray_local):
    ns = shared_namespace
    agent = ns.get("fiber")
    fid = agent.spawn_fiber.remote("count_to", {"n": 40, "sleep": 0.05}).result()
    wait_until(lambda: (agent.get_fiber.remote(fid).result().checkpoint or {}).get("i", 0) >= 5)
    assert ns.hibernate("fiber") is False  # a running fiber keeps it awake
    ray_local.kill(agent._actor, no_restart=True)  # eviction
    record = wait_until(
        lambda: (r := agent.get_fiber.remote(fid).result()).status == "completed" and r, timeout=20
    )
    assert record.result == 40
    assert record.checkpoint["recovered"] is True  # resumed from its checkpoint
    assert record.attempts == 2


def test_alarm_wakes_hibernated_agent(shared_namespace):
    ns = shared_namespace
    agent = ns.get("alarmed")
    # due after the hibernation below (3 s: room for a loaded machine's slow calls)
    agent.schedule.remote(3.0, "note_alarm", "ding").result()
    assert ns.hibernate("alarmed")
    # the directory holds the alarm of the hibernated agent (or, the 3 s already over,
    # has woken it for it: that is what the counter records)
    stats = ns.stats()
    assert "alarmed" in stats["alarms"] or stats["counters"].get("alarm_wakes", 0) >= 1
    # the directory wakes it when due, before anyone calls it
    wait_until(lambda: ns.stats()["counters"].get("alarm_wakes", 0) >= 1, timeout=30)
    assert wait_until(lambda: agent.alarms_fired.remote().result(), timeout=30) == ["ding"]
    assert agent.list_schedules.remote().result() == []


# -- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["../escape", "a/b", "", ".hidden", "x" * 200, "a\x00b", "sp ace"])
def test_unsafe_names_rejected_before_filesystem(names_ns, bad):
    from thinkray.storage.types import InvalidInputError

    ns = names_ns
    before = set(os.listdir(Path(ns.storage_root) / ns.name))
    with pytest.raises(InvalidInputError):
        ns.get(bad)
    assert set(os.listdir(Path(ns.storage_root) / ns.name)) == before


def test_never_created_name_is_not_found(shared_namespace):
    from thinkray.storage.types import SessionNotFoundError

    ns = shared_namespace
    with pytest.raises(SessionNotFoundError):
        ns.existing("ghost").get_history.remote().result()
    assert "ghost" not in ns.names()


def test_unwritable_storage_root_fails_at_start(ray_local, tmp_path):
    from thinkray.actors.namespace import AgentNamespace
    from thinkray.storage.layout import StorageRootError

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(StorageRootError, match="not usable"):
        AgentNamespace("badroot", storage_root=str(blocker / "root"))


def test_session_operations_over_the_actor(shared_namespace):
    from thinkray.storage.types import SessionNotFoundError

    ns = shared_namespace
    agent = ns.get("multi")
    first = agent.create_session.remote("research").result()
    agent.chat.remote("about research").result()
    second = agent.create_session.remote("planning").result()
    agent.chat.remote("about planning").result()
    names = {s.name for s in agent.get_sessions.remote().result()}
    assert names == {"research", "planning"}
    agent.rename_session.remote(second.id, "plans").result()
    history = agent.switch_session.remote(first.id).result()
    assert [text_of(m) for m in history][0] == "about research"
    assert agent.message_count.remote(second.id).result() == 2
    assert ns.hibernate("multi")  # the current session survives hibernation
    assert agent.get_current_session_id.remote().result() == first.id
    agent.delete_session.remote(second.id).result()
    with pytest.raises(SessionNotFoundError):
        agent.get_history.remote(second.id).result()
    assert [s.name for s in agent.get_sessions.remote().result()] == ["research"]
