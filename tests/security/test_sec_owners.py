"""Attacks on agent-name ownership (issue 21, items 5 and 6).

Item 5: principal A's agent ``x`` has sub-agents (one of them with a sub-agent of its
own), a shared workspace with files, a schedule and its alarm file. ``thinkray
sessions rm x`` must remove all of it before the owner is released, so principal B,
who claims ``x`` next, inherits nothing; a removal killed midway (SIGKILL) keeps the
owner held, and running it again finishes the job.

Item 6: listing a principal's agents reads its own index, not every owner file of the
namespace (counted through the owner store's seam), and the ingress's owner reads and
claims never run storage I/O on its event loop (a store whose reads wait for the loop
to run a coroutine: one called on the loop never returns).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from thinkray.actors.cli import main
from thinkray.storage import fleet_index as fi
from thinkray.storage.alarms import read_alarms, write_alarm
from thinkray.storage.layout import SHARED_FOLDER, list_names, session_path
from thinkray.storage.objectstore import RemoteSession, is_uri, list_objects
from thinkray.storage.owners import LocalKeyStore, OwnerRegistry, UriKeyStore, principal_key
from thinkray.storage.session_store import DuckDBSessionStore
from thinkray.storage.stores import open_stores

NS = "app"
TREE = [(f"{NS}.x.subs", "helper"), (f"{NS}.x.subs.helper.subs", "deep"), (NS, "x")]


def _everything(root: str) -> set[str]:
    if is_uri(root):
        return {rel for rel, _size in list_objects(root, "", recursive=True)}
    base = Path(root)
    return {str(p.relative_to(base)) for p in base.rglob("*") if p.is_file()}


class _Agent:
    """An agent's database file where its session actor would keep it (a fenced
    generation under an object-store root, committed through the node's cache)."""

    def __init__(self, root: str, namespace: str, name: str, cache: Path) -> None:
        self.remote = (
            RemoteSession(root, namespace, name, cache_dir=cache) if is_uri(root) else None
        )
        self.path = self.remote.local_path if self.remote else session_path(root, namespace, name)

    def __enter__(self) -> Path:
        if self.remote is not None:
            self.remote.acquire()
            self.remote.fetch()
        return Path(self.path)

    def __exit__(self, *exc: object) -> None:
        if self.remote is not None:
            self.remote.commit()
            self.remote.release()


def _chat(root: str, namespace: str, name: str, cache: Path, text: str) -> None:
    with _Agent(root, namespace, name, cache) as path:
        store = DuckDBSessionStore(path)
        try:
            sid = store.create_session("chat").id
            parts = [{"type": "text", "text": text}]
            store.append_message(sid, {"id": "m1", "role": "user", "metadata": {}, "parts": parts})
            fibers = store.stores().fibers()
            fibers.insert_schedule("remind", {"t": text}, kind="once", next_run_at=9e9)
        finally:
            store.close()
    fi.FleetIndex(root, namespace).put({"name": name, "sessions": 1, "owner": "alice"})
    write_alarm(root, namespace, name, 9e9)


def _shared(root: str, namespace: str, name: str, cache: Path, text: str) -> None:
    """The orchestrator's shared workspace, where its bridge actor keeps it."""
    if is_uri(root):
        remote = RemoteSession(root, f"{namespace}/.shared", name, cache_dir=cache)
        remote.acquire()
        remote.fetch()
        path: Path = remote.local_path
    else:
        remote = None
        path = Path(root) / namespace / SHARED_FOLDER / f"{name}.duckdb"
    stores = open_stores(path)
    try:
        stores.workspace().write("notes/secret.md", text)
    finally:
        stores.close()
    if remote is not None:
        remote.commit()
        remote.release()


def _alice_tree(root: str, cache: Path) -> None:
    """Alice's ``x`` (orchestrator) -> ``helper`` (orchestrator) -> ``deep``, each with a
    chat, a schedule and an alarm; ``x`` and ``helper`` with a shared workspace."""
    assert OwnerRegistry(root).claim(NS, "x", "alice")
    for namespace, name in TREE:
        _chat(root, namespace, name, cache, f"alice's secret in {name}")
    _shared(root, NS, "x", cache, "alice's shared secret")
    _shared(root, f"{NS}.x.subs", "helper", cache, "helper's shared secret")


def _bystander(root: str, cache: Path) -> None:
    """Alice's other agent ``y`` (with a sub-agent): ``rm x`` must leave it alone."""
    assert OwnerRegistry(root).claim(NS, "y", "alice")
    _chat(root, NS, "y", cache, "y's chat")
    _chat(root, f"{NS}.y.subs", "helper", cache, "y's helper")
    _shared(root, NS, "y", cache, "y's workspace")


def _bob_sees_nothing(root: str, cache: Path) -> None:
    owners = OwnerRegistry(root)
    assert owners.claim(NS, "x", "bob")
    assert owners.names(NS, "bob") == ["x"] and owners.names(NS, "alice") == ["y"]
    for namespace, name in TREE:
        if is_uri(root):
            # the node's cache still had alice's copy: a fresh session drops it
            remote = RemoteSession(root, namespace, name, cache_dir=cache)
            assert remote.fetch() is False and not remote.local_path.exists()
        else:
            assert not session_path(root, namespace, name).exists()
        assert name not in read_alarms(root, namespace)
        assert fi.FleetIndex(root, namespace).get(name) is None
    assert list_names(root, f"{NS}.x.subs") == []
    assert list_names(root, f"{NS}.x.subs.helper.subs") == []
    if is_uri(root):
        assert RemoteSession(root, f"{NS}/.shared", "x", cache_dir=cache).latest() is None
    else:
        assert not (Path(root) / NS / SHARED_FOLDER / "x.duckdb").exists()


def _bobs_x_is_empty(root: str, cache: Path) -> None:
    with _Agent(root, NS, "x", cache) as path:  # bob's x, as its actor opens it
        store = DuckDBSessionStore(path)
        try:
            assert store.list_sessions(include_ephemeral=True) == []
            assert store.stores().fibers().list_schedules(include_disabled=True) == []
        finally:
            store.close()


def _left_of_x(root: str, before: set[str]) -> list[str]:
    """What is under ``root`` now that was not there before alice's ``x`` was made,
    apart from the namespace's index (a tombstone row) and bob's owner entries."""
    bob = principal_key("bob")
    return sorted(
        p
        for p in _everything(root) - before
        if not p.startswith(f"{NS}/.index/")
        and p not in (f"{NS}/.owners/x", f"{NS}/.owned/{bob}/x", f"{NS}/.owned/.indexed-v1")
    )


def test_rm_leaves_nothing_for_the_next_claimant(any_root, tmp_path, capsys):
    cache = tmp_path / "cache"
    _bystander(any_root, cache)
    before = _everything(any_root)
    _alice_tree(any_root, cache)
    assert not OwnerRegistry(any_root).claim(NS, "x", "bob")
    assert main(["sessions", "rm", "x", "--root", any_root, "--namespace", NS]) == 0, (
        capsys.readouterr().err
    )
    _bob_sees_nothing(any_root, cache)
    assert _left_of_x(any_root, before) == []
    _bobs_x_is_empty(any_root, cache)
    assert list_names(any_root, f"{NS}.y.subs") == ["helper"]  # the bystander is whole
    assert fi.FleetIndex(any_root, NS).get("y") is not None
    assert "y" in read_alarms(any_root, NS)


def test_rm_refuses_while_a_sub_agent_is_live(tmp_path, capsys):
    root = str(tmp_path / "root")
    _alice_tree(root, tmp_path / "cache")
    deep = session_path(root, f"{NS}.x.subs.helper.subs", "deep")
    code = (
        f"import sys, duckdb; c = duckdb.connect({str(deep)!r}); "
        "print('ready', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        before = _everything(root)
        assert main(["sessions", "rm", "x", "--root", root, "--namespace", NS]) == 1
        assert "live" in capsys.readouterr().err
        assert _everything(root) == before  # refused whole: nothing removed
    finally:
        holder.communicate("")


# A removal that stops (and is SIGKILLed) at a chosen step: after x's own files went
# (its index row and owner remain), or just before the owner is released.
_PAUSING_RM = textwrap.dedent(
    """
    import sys
    from thinkray.storage import removal
    from thinkray.storage.owners import OwnerRegistry

    step = sys.argv[1]

    def pause():
        print("paused", flush=True)
        sys.stdin.read()  # until SIGKILL

    if step == "after-files":
        remove_local = removal._remove_local

        def paused_local(root, namespace, name, removed):
            remove_local(root, namespace, name, removed)
            if name == "x":
                pause()

        removal._remove_local = paused_local
    else:
        def paused_release(self, namespace, name, principal):
            pause()

        OwnerRegistry.release = paused_release
    from thinkray.actors.cli import main

    sys.exit(main(["sessions", "rm", "x", "--root", sys.argv[2], "--namespace", "app"]))
    """
)


@pytest.mark.parametrize("step", ["after-files", "before-release"])
def test_a_removal_killed_midway_keeps_the_owner_and_a_rerun_finishes(step, tmp_path, capsys):
    root = str(tmp_path / "root")
    cache = tmp_path / "cache"
    _bystander(root, cache)
    before = _everything(root)
    _alice_tree(root, cache)
    proc = subprocess.Popen(
        [sys.executable, "-c", _PAUSING_RM, step, root],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "paused"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    owners = OwnerRegistry(root)
    assert owners.owner(NS, "x") == "alice"  # held: nobody inherits a half-removed agent
    assert not owners.claim(NS, "x", "bob")
    assert not session_path(root, NS, "x").exists()
    assert list_names(root, f"{NS}.x.subs") == []
    assert main(["sessions", "rm", "x", "--root", root, "--namespace", NS]) == 0, (
        capsys.readouterr().err
    )
    _bob_sees_nothing(root, cache)
    assert _left_of_x(root, before) == []
    _bobs_x_is_empty(root, cache)


# -- item 6: listing by index, owner calls off the loop ------------------------------------


class CountingStore:
    """The owner store's seam, counting the calls that reach the real store."""

    def __init__(self, inner: LocalKeyStore | UriKeyStore) -> None:
        self.inner = inner
        self.reads: list[str] = []
        self.lists: list[str] = []

    def read(self, key: str) -> bytes | None:
        self.reads.append(key)
        return self.inner.read(key)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self.inner.put_if_absent(key, data)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def list(self, prefix: str) -> list[str]:
        self.lists.append(prefix)
        return self.inner.list(prefix)


def _store_of(root: str) -> LocalKeyStore | UriKeyStore:
    return UriKeyStore(root) if is_uri(root) else LocalKeyStore(root)


def test_listing_reads_only_the_principals_own_agents(any_root):
    store = CountingStore(_store_of(any_root))
    owners = OwnerRegistry(any_root, store=store)
    others = 60 if "s3://" in any_root else 300
    for i in range(others):
        assert owners.claim(NS, f"other-{i}", f"tenant-{i % 7}")
    for name in ("a1", "a2", "a3"):
        assert owners.claim(NS, name, "alice")
    owners.names(NS, "alice")  # a first listing may index a namespace (none here to do)
    store.reads.clear()
    store.lists.clear()
    assert owners.names(NS, "alice") == ["a1", "a2", "a3"]
    assert len(store.reads) <= 3 + 1, store.reads  # own owner files (+ the index mark)
    assert len(store.lists) == 1 and all("/.owners" not in k for k in store.lists)
    assert owners.names(NS, "nobody") == []


def test_a_stale_index_entry_never_lists_someone_elses_agent(any_root):
    owners = OwnerRegistry(any_root)
    assert owners.claim(NS, "x", "bob")
    # an entry claiming x for alice (left by a crash, or planted): the owner file rules
    _store_of(any_root).put_if_absent(f"{NS}/.owned/{principal_key('alice')}/x", b"alice")
    assert owners.names(NS, "alice") == [] and owners.names(NS, "bob") == ["x"]


def test_owner_files_from_before_the_index_are_listed(any_root):
    store = _store_of(any_root)
    for i in range(5):  # written as the previous version did: owner files only
        store.put_if_absent(f"{NS}/.owners/n{i}", b"alice" if i % 2 else b"bob")
    owners = OwnerRegistry(any_root)
    assert owners.names(NS, "alice") == ["n1", "n3"]
    assert owners.names(NS, "bob") == ["n0", "n2", "n4"]


class LoopGatedStore(CountingStore):
    """A slow store: a read returns only once a coroutine has run on the event loop
    meanwhile. A read made on the loop itself can never see that (it holds the loop),
    and fails after the deadline instead of hanging the test."""

    def __init__(self, inner: LocalKeyStore) -> None:
        super().__init__(inner)
        self.loop_ran = threading.Event()

    def read(self, key: str) -> bytes | None:
        if not self.loop_ran.wait(timeout=20):
            raise AssertionError(f"the event loop was blocked while {key} was read")
        self.loop_ran.clear()
        return super().read(key)


def _agents(root: str, store: LoopGatedStore):  # noqa: ANN202
    from thinkray.actors.ingress.agents import Agents
    from thinkray.actors.ingress.config import AgentRoute, IngressConfig

    config = IngressConfig(
        storage_root=root,
        agents={"chat": AgentRoute(agent_cls="tests.agents:EchoAgent", namespace=NS)},
    )
    agents = Agents(config)
    agents.owners = OwnerRegistry(root, store=store)
    return agents


async def _ticking(store: LoopGatedStore, done: asyncio.Event) -> int:
    """Tick on the loop until ``done``, letting each store read through."""
    ticks = 0
    while not done.is_set():
        store.loop_ran.set()
        ticks += 1
        await asyncio.sleep(0.001)
    return ticks


async def _off_loop(store: LoopGatedStore, call):  # noqa: ANN001, ANN202
    done = asyncio.Event()
    store.loop_ran.clear()  # only a tick during this call lets its reads through
    ticker = asyncio.ensure_future(_ticking(store, done))
    try:
        return await call
    finally:
        done.set()
        await ticker


async def test_owner_claims_and_listings_do_not_block_the_event_loop(tmp_path):
    from thinkray.actors.ingress.agents import NotVisibleError
    from thinkray.actors.ingress.auth import Principal

    store = LoopGatedStore(LocalKeyStore(tmp_path / "root"))
    agents = _agents(str(tmp_path / "root"), store)
    alice, bob = Principal("alice"), Principal("bob")
    await _off_loop(store, agents.check_owner("chat", "x", alice, claim=True))
    assert store.reads  # the gated store was really read
    assert await _off_loop(store, agents.owner_of("chat", "x")) == "alice"
    assert await _off_loop(store, agents.owned("chat", alice)) == ["x"]
    with pytest.raises(NotVisibleError):  # another principal's: 404, claim or not
        await _off_loop(store, agents.check_owner("chat", "x", bob, claim=True))
    with pytest.raises(NotVisibleError):
        await _off_loop(store, agents.check_owner("chat", "x", bob, claim=False))
    with pytest.raises(NotVisibleError):  # unclaimed without claim: not found, nothing written
        await _off_loop(store, agents.check_owner("chat", "free", bob, claim=False))
    assert await _off_loop(store, agents.owned("chat", bob)) == []


# -- the same attack on real actors: an orchestrator, its sub-agent and its bridge ------


@pytest.mark.ray
def test_rm_of_a_real_orchestrator_leaves_nothing_to_the_next_claimant(
    namespace_factory, ray_local, capsys
):
    from thinkray.actors.bridge import bridge_name
    from thinkray.actors.namespace import AgentNamespace

    from tests.helpers import wait_until
    from tests.orchestrator_agents import LeanOrchestrator

    writes = {
        "provider": "script",
        "steps": [
            [{"tool": "shared_write_file", "input": {"path": "plan.md", "content": "secret"}}],
            [{"text": "written"}],
        ],
    }
    ns = namespace_factory(LeanOrchestrator, idle_timeout=None)
    root, owners = ns.storage_root, OwnerRegistry(ns.storage_root)
    subs = f"{ns.name}.x.subs"
    assert owners.claim(ns.name, "x", "alice")
    boss = ns.get("x")
    try:
        boss.create_subagent.remote("writer", {"model": writes}).result()
        assert boss.delegate.remote("writer", "write", wait=True).result().status == "completed"
        assert list_names(root, subs) == ["writer"]
        # everything at rest: the agents hibernated, the bridge (it holds the shared
        # workspace open, and its name is x's) stopped
        assert ns.hibernate("x")
        AgentNamespace.connect(subs).shutdown()
        ray_local.kill(ray_local.get_actor(bridge_name(ns.name, "x"), namespace="thinkray"))
        rm = ["sessions", "rm", "x", "--root", root, "--namespace", ns.name]
        wait_until(lambda: main(rm) == 0, timeout=30)  # a killed bridge's lock lingers briefly
        capsys.readouterr()
        assert owners.claim(ns.name, "x", "bob")
        bobs = ns.get("x")
        assert bobs.list_subagents.remote().result() == []
        assert bobs.get_sessions.remote().result() == []
        shared = bobs.shared_workspace.remote().result()
        assert ray_local.get(shared.list_directory("")) == []
        assert list_names(root, subs) == []
    finally:
        with contextlib.suppress(Exception):
            ray_local.kill(ray_local.get_actor(bridge_name(ns.name, "x"), namespace="thinkray"))
        with contextlib.suppress(Exception):
            AgentNamespace.connect(subs).shutdown()
