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

from thinkray.runtime.agents.think import Think
from thinkray.runtime.models.base import Model, ModelRequest
from thinkray.runtime.models.testing import FunctionModel, Reply, reply
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


def test_a_new_agents_session_and_first_message_share_one_sync(tmp_path: Path) -> None:
    """The session a first turn makes is synced with its user message: one sync before
    the model is called, where syncing in place costs two."""

    async def first_turn(cls: type[Probe], name: str) -> int:
        agent = cls(_store(tmp_path, name))
        try:
            await agent.chat("hello")
            (_, _, syncs), *_ = agent.seen
            return syncs
        finally:
            await agent.aclose()

    assert asyncio.run(first_turn(Probe, "off")) == 1
    assert asyncio.run(first_turn(InlineProbe, "inline")) == 2


def test_a_sibling_turn_runs_while_an_agents_sync_waits_for_the_disk(
    tmp_path: Path, monkeypatch
) -> None:
    """Agent ``slow``'s disk holds its user message's sync until ``quick``, on the same
    loop, has run a whole turn: with the sync on the loop, ``quick`` could not start
    until the hold gave up (its wait times out and the order below fails)."""
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
        slow, quick = Probe(_store(tmp_path, "slow")), Probe(_store(tmp_path, "quick"))
        try:
            await slow.chat("warm")  # its journal exists now: hold its syncs from here
            slow_inode.append(os.stat(slow.journal().path).st_ino)
            monkeypatch.setattr(os, "fdatasync", fdatasync)
            slow_turn = asyncio.ensure_future(slow.chat("held"))
            while not held.is_set():
                await asyncio.sleep(0.01)
            assert len(slow.seen) == 1  # its model waits for the sync
            result = await quick.chat("meanwhile")
            order.append(f"quick {result.status}")
            release.set()
            result = await slow_turn
            order.append(f"slow {result.status}")
            assert len(slow.seen) == 2
            size, synced, _ = slow.seen[-1]
            assert synced == size  # its model was called once its message was on disk
        finally:
            release.set()
            await slow.aclose()
            await quick.aclose()

    asyncio.run(run())
    assert order == ["quick completed", "slow completed"]
