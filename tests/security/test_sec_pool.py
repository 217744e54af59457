"""The warm pool stays sound when a wake fails or a directory shard crashes mid-bind.

- A wake whose ``on_wake`` raises releases everything (database, file, lease) and
  leaves the actor clean: the pool keeps serving the shard's other agents, and the
  agent binds again once its hook stops failing (issue 21, item 12).
- A directory shard SIGKILLed while one of its session actors is binding an agent, or
  hibernating one, is rebuilt by Ray; the rebuilt directory must not offer that actor
  as a spare while its bind or hibernation is in flight, or a second agent is bound
  onto it and the two clobber each other's storage session (issue 21, item 11)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from thinkray.actors.directory import shard_of

from tests.helpers import wait_until

pytestmark = pytest.mark.ray

NAMES = [f"agent-{i}" for i in range(40)]
SHARD = 1  # the shard the tests crash: names are picked from it
GATE_NAMESPACE = "thinkray-tests"


def _names(count: int) -> list[str]:
    return [n for n in NAMES if shard_of(n, 2) == SHARD][:count]


def _root(kind: str, tmp_path: Path) -> str:
    if kind == "file":
        pytest.importorskip("pyarrow")
        return f"file://{tmp_path}/store"
    return str(tmp_path / "store")


def _shard_stats(ns: Any) -> dict[str, Any]:
    import ray

    stats: dict[str, Any] = ray.get(ns._router.handles[SHARD].stats.remote(), timeout=60)
    return stats


def _directory_process(ns: Any) -> int:
    """The shard's pid as the GCS knows it (0 while it is not alive)."""
    from ray._private import state

    info = state.actors(ns._router.handles[SHARD]._actor_id.hex())
    return int(info.get("Pid") or 0) if info.get("State") == "ALIVE" else 0


def _crash_shard(ns: Any) -> None:
    """SIGKILL the shard's process (a real crash) and wait until Ray restarted it."""
    pid = _shard_stats(ns)["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: _directory_process(ns) not in (0, pid), timeout=90, interval=0.1)


def _chat(ns: Any, name: str, text: str) -> str:
    return str(ns.get(name).chat.remote(text).result().status)


@pytest.fixture
def gate(ray_local):
    from tests.sec_pool_agents import Gate

    name = f"gate-{uuid.uuid4().hex[:8]}"
    handle = (
        ray_local.remote(Gate).options(name=name, namespace=GATE_NAMESPACE, max_concurrency=100)
    ).remote()
    yield name, handle
    with contextlib.suppress(Exception):
        ray_local.kill(handle)


# -- item 12: a failing on_wake ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["local", "file"])
def test_a_wake_whose_hook_raises_leaves_the_pool_healthy(namespace_factory, tmp_path, kind):
    from thinkray.actors.errors import WakeError

    from tests.sec_pool_agents import PoolProbeAgent

    flags = tmp_path / "flags"
    flags.mkdir()
    ns = namespace_factory(
        PoolProbeAgent,
        storage_root=_root(kind, tmp_path),
        directories=2,
        pool_size=2,
        idle_timeout=None,
        agent_kwargs={"flags": str(flags)},
        placement="dedicated",  # the pool of actors (one agent per actor, below)
    )
    broken, *others = _names(5)
    flag = flags / f"fail-wake-{broken}"
    flag.touch()

    for _attempt in range(2):  # failing again is the same clean failure
        with pytest.raises(WakeError) as failed:
            ns.get(broken).whoami.remote().result()
        assert failed.value.name == broken
        assert "the wake hook of" in str(failed.value) and broken in str(failed.value)
        assert failed.value.reason == f"RuntimeError: the wake hook of {broken} broke"
        assert ns.where(broken) is None

    # The actor that failed went back to the pool clean: every later wake in the
    # shard succeeds (before, the next one took it and found it "already hosts").
    for name in others:
        assert _chat(ns, name, "hello") == "completed"
    pids = {ns.get(n).whoami.remote().result()["pid"] for n in others}
    assert len(pids) == len(others)  # one agent per actor

    # Its hook fixed, the agent binds: nothing holds its file or lease.
    flag.unlink()
    assert _chat(ns, broken, "hello") == "completed"
    assert ns.get(broken).message_count.remote().result() == 2
    assert ns.hibernate(broken)
    assert ns.get(broken).message_count.remote().result() == 2
    assert ns.get(broken).whoami.remote().result()["pid"] not in pids
    stats = _shard_stats(ns)
    assert sorted(stats["live"]) == sorted([broken, *others])
    assert stats["counters"].get("actors_retired_unclean", 0) == 0


# -- item 11: a shard rebuilt while a bind or hibernation is in flight --------------------


def _wake_every_spare(ns: Any, names: list[str]) -> list[str]:
    """Wake as many agents as the rebuilt shard offers spares (each takes one), so an
    actor wrongly offered as a spare is bound for certain. Returns the names woken."""
    spares = _shard_stats(ns)["free"]
    assert spares < len(names)
    woken = names[:spares]
    for name in woken:
        assert _chat(ns, name, "hi") == "completed"
    return woken


def _assert_each_agent_kept_its_own_storage(ns: Any, counts: dict[str, int]) -> None:
    """Every agent is live on an actor of its own, and what each wrote survives its
    hibernation (upload under an object-store root) and its next wake."""
    pids = {name: ns.get(name).whoami.remote().result()["pid"] for name in counts}
    assert len(set(pids.values())) == len(pids), pids
    assert ns.hibernate_all() == len(counts)
    for name, count in counts.items():
        assert ns.get(name).message_count.remote().result() == count, name


def test_a_shard_rebuilt_during_a_hibernation_does_not_bind_that_actor_twice(
    namespace_factory, tmp_path, gate
):
    import ray

    from tests.sec_pool_agents import PoolProbeAgent

    gate_name, gate_actor = gate
    ns = namespace_factory(
        PoolProbeAgent,
        storage_root=_root("file", tmp_path),
        directories=2,
        pool_size=2,
        idle_timeout=None,
        agent_kwargs={"gate": gate_name, "gate_namespace": GATE_NAMESPACE},
    )
    leaving, *others = _names(6)
    assert _chat(ns, leaving, "before") == "completed"
    wait_until(lambda: _shard_stats(ns)["starting"] == 0, timeout=60)

    # The hibernation stops after the actor let go of the agent, before its upload.
    ray.get(gate_actor.hold.remote(f"close:{leaving}"))
    in_flight = ns._router.handles[SHARD].hibernate.remote(leaving, False)
    assert ray.get(gate_actor.arrived.remote(f"close:{leaving}"), timeout=60)
    _crash_shard(ns)
    with contextlib.suppress(ray.exceptions.RayActorError):
        # The call dies with its shard: wait for Ray to say so (it may take a moment).
        ray.get(in_flight, timeout=60)
    woken = _wake_every_spare(ns, others)
    ray.get(gate_actor.release.remote(f"close:{leaving}"))

    for name in woken:
        assert _chat(ns, name, "again") == "completed"
    _assert_each_agent_kept_its_own_storage(ns, {leaving: 2, **dict.fromkeys(woken, 4)})


def _cached_copy(ns: Any, name: str) -> Path:
    """Where this node's session actors keep ``name``'s file under the object-store
    root (its last generation, reused by the next wake if it is intact)."""
    import ray
    from thinkray.storage.objectstore import RemoteSession, default_cache_dir

    node = ray.get_runtime_context().get_node_id()
    session = RemoteSession(
        ns.storage_root, ns.name, name, cache_dir=default_cache_dir() / node[:16]
    )
    return session.local_path


def test_a_shard_rebuilt_during_a_bind_does_not_bind_that_actor_twice(namespace_factory, tmp_path):
    """The bind is held in its storage step: the agent's cached copy is a FIFO, so the
    wake's integrity check of it blocks (the actor holds the agent's lease by then)
    until the test writes the file's bytes into it, as a slow disk would."""
    import ray

    from tests.sec_pool_agents import PoolProbeAgent

    ns = namespace_factory(
        PoolProbeAgent,
        storage_root=_root("file", tmp_path),
        directories=2,
        pool_size=2,
        idle_timeout=None,
    )
    waking, *others = _names(6)
    assert _chat(ns, waking, "before") == "completed"
    assert ns.hibernate(waking)
    cached = _cached_copy(ns, waking)
    content = cached.read_bytes()
    fifo = cached.with_name(f".fifo-{uuid.uuid4().hex[:8]}")
    os.mkfifo(fifo)
    os.replace(fifo, cached)
    wait_until(lambda: _shard_stats(ns)["starting"] == 0, timeout=60)

    outcome: list[Any] = []

    def wake() -> None:
        try:
            outcome.append(_chat(ns, waking, "again"))
        except Exception as exc:  # shown by the assertion below
            outcome.append(exc)

    caller = threading.Thread(target=wake, daemon=True)
    caller.start()

    def reader_waits() -> int | None:
        try:
            return os.open(cached, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: nobody reads it yet
            return None

    writer = wait_until(reader_waits, timeout=60)
    try:
        _crash_shard(ns)
        woken = _wake_every_spare(ns, others)
        # The bind goes on: the path is the real file again, then its bytes arrive.
        copy = cached.with_name(f".copy-{uuid.uuid4().hex[:8]}")
        copy.write_bytes(content)
        os.replace(copy, cached)
        os.set_blocking(writer, True)
        with os.fdopen(writer, "wb") as pipe:
            writer = -1
            pipe.write(content)
    finally:
        if writer >= 0:
            os.close(writer)
    caller.join(timeout=120)
    assert outcome == ["completed"]

    for name in woken:
        assert _chat(ns, name, "again") == "completed"
    _assert_each_agent_kept_its_own_storage(ns, {waking: 4, **dict.fromkeys(woken, 4)})
    assert ray.get(ns._router.handles[SHARD].stats.remote())["counters"].get("adopted") == 1


def test_an_actor_reports_a_bind_or_hibernation_in_flight_and_refuses_a_second_bind(
    ray_local, tmp_path, gate
):
    """Asked directly (as a rebuilding directory asks it): while a bind (its ``on_wake``
    included) or a hibernation (its close and upload included) is in flight, the actor
    says so and names the agent; a bind meanwhile is refused and changes nothing."""
    import ray
    from thinkray.actors.errors import ActorBusyError
    from thinkray.actors.session_actor import BindSpec, RemoteSessionActor

    from tests.sec_pool_agents import PoolProbeAgent

    gate_name, gate_actor = gate
    kwargs = {"gate": gate_name, "gate_namespace": GATE_NAMESPACE}
    actor = RemoteSessionActor.options(max_concurrency=100).remote((), False)

    def spec(name: str) -> BindSpec:
        return BindSpec("ns", name, str(tmp_path / f"{name}.duckdb"), PoolProbeAgent, kwargs)

    def refused(name: str, state: str, session: str) -> None:
        with pytest.raises(ActorBusyError) as busy:
            ray.get(actor.bind.remote(spec(name)), timeout=60)
        assert (busy.value.state, busy.value.session) == (state, session)

    try:
        assert ray.get(actor.ready.remote())["state"] == "idle"
        ray.get(gate_actor.hold.remote("wake:first"))
        binding = actor.bind.remote(spec("first"))
        assert ray.get(gate_actor.arrived.remote("wake:first"), timeout=60)
        info = ray.get(actor.rehome.remote(None), timeout=60)
        assert (info["state"], info["session"], info["bound"]) == ("binding", "first", None)
        assert info["bound_namespace"] == "ns"
        refused("second", "binding", "first")
        ray.get(gate_actor.release.remote("wake:first"))
        assert ray.get(binding, timeout=60)["state"] == "bound"
        refused("second", "bound", "first")

        ray.get(gate_actor.hold.remote("close:first"))
        leaving = actor.hibernate.remote("first")
        assert ray.get(gate_actor.arrived.remote("close:first"), timeout=60)
        info = ray.get(actor.settled.remote(0.0), timeout=60)
        assert (info["state"], info["session"], info["bound"]) == ("hibernating", "first", None)
        refused("second", "hibernating", "first")
        ray.get(gate_actor.release.remote("close:first"))
        assert ray.get(leaving, timeout=60)["ok"]
        assert ray.get(actor.settled.remote(), timeout=60)["state"] == "idle"
        assert ray.get(actor.bind.remote(spec("second")), timeout=60)["bound"] == "second"
    finally:
        ray.kill(actor)
