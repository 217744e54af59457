"""Turns that sync the disk off the event loop (``Think.syncs_off_loop``, set by agent
hosts, issue 22): agents sharing a loop never wait on each other's ``fdatasync``, and
each turn's durable points still hold — its user message is on disk before its model
is called, its reply before the run ends."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from thinkray.runtime.agents.think import Think
from thinkray.runtime.models.base import Model, ModelRequest
from thinkray.runtime.models.testing import FunctionModel, Reply, reply
from thinkray.storage import journal as journal_module
from thinkray.storage.journal import Journal
from thinkray.storage.session_store import DuckDBSessionStore


class Probe(Think):
    """Answers "ok"; at each model call notes the state of its journal (the bytes
    written, the bytes synced, the syncs so far) in ``seen``."""

    syncs_off_loop = True

    def __init__(self, store: Any) -> None:
        self.seen: list[tuple[int, int, int]] = []
        super().__init__(store)

    def get_model(self) -> Model:
        def step(request: ModelRequest, index: int) -> Reply:
            journal = self.journal()
            self.seen.append((journal.size, journal.synced, journal.syncs))
            return reply("ok")

        return FunctionModel(step)

    def journal(self) -> Journal:
        journal = self.store._state.journal  # noqa: SLF001 - what the disk holds
        assert journal is not None
        return journal


class InlineProbe(Probe):
    syncs_off_loop = False


def _store(tmp_path: Path, name: str) -> DuckDBSessionStore:
    return DuckDBSessionStore(tmp_path / f"{name}.duckdb")


def test_the_user_message_is_durable_before_the_model_is_called(tmp_path: Path) -> None:
    async def run() -> None:
        agent = Probe(_store(tmp_path, "a"))
        try:
            for turn in range(3):
                result = await agent.chat(f"turn {turn}")
                assert result.status == "completed"
                size, synced, _ = agent.seen[-1]
                assert synced == size  # the user message, and all before it, on disk
                journal = agent.journal()
                assert journal.synced == journal.size  # the reply too, once chat returned
        finally:
            await agent.aclose()

    asyncio.run(run())


def test_a_new_sessions_row_and_first_message_share_one_sync(tmp_path: Path) -> None:
    """The session a first turn makes is synced with its user message: one sync before
    the model is called (two before), whether the agent syncs off its loop or not."""

    async def first_turn(cls: type[Probe], name: str) -> int:
        agent = cls(_store(tmp_path, name))
        try:
            await agent.chat("hello")
            (size, synced, syncs), *_ = agent.seen
            assert synced == size
            return syncs
        finally:
            await agent.aclose()

    assert asyncio.run(first_turn(Probe, "off")) == 1
    assert asyncio.run(first_turn(InlineProbe, "inline")) == 1


class Waiter(Probe):
    """A Probe whose model waits for ``go`` before it answers: a turn kept running."""

    def __init__(self, store: Any) -> None:
        self.go = asyncio.Event()
        super().__init__(store)

    def get_model(self) -> Model:
        async def step(request: ModelRequest, index: int) -> Reply:
            journal = self.journal()
            self.seen.append((journal.size, journal.synced, journal.syncs))
            await self.go.wait()
            return reply("ok")

        return FunctionModel(step)


def _disk_syncs_lately(monkeypatch, seconds: float) -> None:
    """Have this process's recent syncs taken ``seconds`` (the weighted mean the turn
    reads to choose where to sync)."""
    monkeypatch.setattr(journal_module, "_typical_sync", [seconds])


def _sync_threads(monkeypatch) -> list[tuple[int, str]]:
    """The thread (id, name) of every fdatasync from now on."""
    real = os.fdatasync
    threads: list[tuple[int, str]] = []

    def fdatasync(fd: int) -> None:
        threads.append((threading.get_ident(), threading.current_thread().name))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    return threads


@pytest.mark.parametrize("disk", ["slow", "fast"])
def test_a_turn_syncs_off_the_loop_only_beside_another_on_a_slow_disk(
    tmp_path: Path, monkeypatch, disk: str
) -> None:
    """A lone turn syncs in place; one beside another turn in the process syncs in a
    worker thread when the disk's syncs take a millisecond or more, in place when they
    are faster than the thread hop."""

    async def run() -> tuple[list[tuple[int, str]], list[tuple[int, str]], int]:
        loop_thread = threading.get_ident()
        agent, other = Probe(_store(tmp_path, "a")), Waiter(_store(tmp_path, "b"))
        try:
            await agent.chat("warm")
            threads = _sync_threads(monkeypatch)
            _disk_syncs_lately(monkeypatch, 0.01 if disk == "slow" else 0.0001)
            await agent.chat("alone")  # nothing else runs: no thread hop
            alone = list(threads)
            running = asyncio.ensure_future(other.chat("kept running"))  # a lone turn too
            while not other.seen:
                await asyncio.sleep(0.01)  # its turn is in its model
            threads.clear()
            _disk_syncs_lately(monkeypatch, 0.01 if disk == "slow" else 0.0001)
            await agent.chat("beside it")
            beside = list(threads)
            other.go.set()
            assert (await running).status == "completed"
            return alone, beside, loop_thread
        finally:
            other.go.set()
            await agent.aclose()
            await other.aclose()

    alone, beside, loop_thread = asyncio.run(run())
    assert alone and {ident for ident, _ in alone} == {loop_thread}
    assert beside
    if disk == "slow":  # on the syncs' own pool, not queued behind binds and tools
        assert all(name.startswith("thinkray-sync") for _, name in beside)
    else:
        assert {ident for ident, _ in beside} == {loop_thread}


def test_a_sibling_turn_runs_while_an_agents_sync_waits_for_the_disk(
    tmp_path: Path, monkeypatch
) -> None:
    """Agent ``slow``'s disk holds its user message's sync until ``quick``, whose turn
    runs on the same loop, has finished it: with the sync on the loop, ``quick`` could
    not go on until the hold gave up (its wait times out and the order below fails)."""
    real = os.fdatasync
    held, release = threading.Event(), threading.Event()
    slow_inode: list[int] = []

    def fdatasync(fd: int) -> None:
        if slow_inode and os.fstat(fd).st_ino == slow_inode[0]:
            held.set()
            release.wait(5)
        real(fd)

    order: list[str] = []

    async def run() -> None:
        slow, quick = Probe(_store(tmp_path, "slow")), Waiter(_store(tmp_path, "quick"))
        try:
            await slow.chat("warm")  # its journal exists now: hold its syncs from here
            slow_inode.append(os.stat(slow.journal().path).st_ino)
            quick_turn = asyncio.ensure_future(quick.chat("meanwhile"))
            while not quick.seen:
                await asyncio.sleep(0.01)  # quick's turn is in its model
            monkeypatch.setattr(os, "fdatasync", fdatasync)
            _disk_syncs_lately(monkeypatch, 0.01)  # a disk slow enough to sync off the loop
            slow_turn = asyncio.ensure_future(slow.chat("held"))
            while not held.is_set():
                await asyncio.sleep(0.01)
            assert len(slow.seen) == 1  # its model waits for the sync
            quick.go.set()
            result = await quick_turn
            order.append(f"quick {result.status}")
            release.set()
            result = await slow_turn
            order.append(f"slow {result.status}")
            assert len(slow.seen) == 2
            size, synced, _ = slow.seen[-1]
            assert synced == size  # its model was called once its message was on disk
        finally:
            release.set()
            quick.go.set()
            await slow.aclose()
            await quick.aclose()

    asyncio.run(run())
    assert order == ["quick completed", "slow completed"]
