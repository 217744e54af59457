"""Agents that exist only for the tests. Ray workers import them by module name
(``tests.agents``): the repository root is on the workers' path (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from thinkray.runtime.agents.think import Think
from thinkray.runtime.remote import Batch, remote


class Counter(Think):
    """A stream method that yields single items and one Batch."""

    @remote
    async def count(self, n: int) -> AsyncIterator[int]:
        """0 .. n-1 one by one, then n and n+1 as one Batch."""
        for i in range(n):
            yield i
        yield Batch([n, n + 1])  # type: ignore[misc]  # a Batch of items travels as one
