"""Agents for the stream-lane tests (tests/test_lane_ray.py): stream methods whose
items msgpack would change, and that fail with thinkray's errors or a plain bug."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from thinkray.runtime.errors import SessionBusyError
from thinkray.runtime.remote import remote

from tests.agents import ScriptAgent


class LaneAgent(ScriptAgent):
    """:class:`ScriptAgent` with two more stream methods."""

    @remote
    async def typed(self, n: int) -> AsyncIterator[Any]:
        """``n`` items of types a plain-data encoding would lose: a tuple, a set,
        bytes, a big int."""
        for i in range(n):
            yield {"i": i, "pair": (i, "x"), "set": {i}, "raw": b"\x00\xff", "big": 2**70}

    @remote
    async def failing(self, kind: str) -> AsyncIterator[int]:
        """One item, then ``kind``'s error: ``busy`` (thinkray's), else a ValueError."""
        yield 1
        if kind == "busy":
            raise SessionBusyError("the session is busy")
        raise ValueError(f"a plain bug: {kind}")
