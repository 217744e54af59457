"""Agents and a gate for tests/security/test_sec_pool.py (a module of their own: Ray
workers import them by name, which a file under tests/security/ cannot offer).

``Gate`` is a named async Ray actor that holds an agent's step until the test lets it
through, so a test drives "a wake (or hibernation) is in flight" by a signal instead
of by sleeping."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import ray

from tests.agents import ScriptAgent


class Gate:
    """Keys a test holds: :meth:`passage` of a held key waits until :meth:`release`;
    :meth:`arrived` returns once someone waits at the key."""

    def __init__(self) -> None:
        self.held: set[str] = set()
        self.waiting: dict[str, asyncio.Event] = {}
        self.open: dict[str, asyncio.Event] = {}

    def _events(self, key: str) -> tuple[asyncio.Event, asyncio.Event]:
        return (
            self.waiting.setdefault(key, asyncio.Event()),
            self.open.setdefault(key, asyncio.Event()),
        )

    async def hold(self, key: str) -> None:
        self.held.add(key)
        self._events(key)

    async def passage(self, key: str) -> None:
        if key not in self.held:
            return
        waiting, opened = self._events(key)
        waiting.set()
        await opened.wait()

    async def arrived(self, key: str) -> bool:
        await self._events(key)[0].wait()
        return True

    async def release(self, key: str) -> None:
        self.held.discard(key)
        self._events(key)[1].set()


class PoolProbeAgent(ScriptAgent):
    """A ScriptAgent whose wake fails while a flag file names it, and whose wake and
    close on hibernation pass a gate.

    ``flags``: a folder; while ``<flags>/fail-wake-<name>`` exists, ``on_wake`` raises.
    ``gate``: the name of a :class:`Gate` actor (in Ray namespace ``gate_namespace``):
    ``on_wake`` passes key ``wake:<name>`` and ``aclose`` (hibernation, after the actor
    has let go of the agent) key ``close:<name>``."""

    def __init__(
        self,
        store: Any = None,
        *,
        flags: str = "",
        gate: str = "",
        gate_namespace: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.flags = flags
        self.gate = gate
        self.gate_namespace = gate_namespace
        super().__init__(store, **kwargs)

    async def _pass(self, step: str) -> None:
        if self.gate:
            gate = ray.get_actor(self.gate, namespace=self.gate_namespace)
            await gate.passage.remote(f"{step}:{self.agent_name}")

    async def on_wake(self) -> None:
        await self._pass("wake")
        if self.flags and (Path(self.flags) / f"fail-wake-{self.agent_name}").exists():
            raise RuntimeError(f"the wake hook of {self.agent_name} broke")
        await super().on_wake()

    async def aclose(self) -> None:
        await self._pass("close")
        await super().aclose()
