"""Defects of issue 26 at the actor layer, each as the scenario a user hits."""

from __future__ import annotations

import asyncio

import pytest
from thinkray.actors.session_actor import _bounded


async def test_a_hibernation_hook_that_never_returns_is_cut_off():
    # A hook that swallows its cancel (the schedule timer did, on Python 3.11): the
    # bound still returns, and says the hook did not finish.
    release = asyncio.Event()

    async def stuck() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue

    assert await asyncio.wait_for(_bounded(stuck, 0.05), 30) is False
    release.set()
    assert await _bounded(lambda: None, 30) is True
    with pytest.raises(ValueError):
        await _bounded(lambda: (_ for _ in ()).throw(ValueError("hook failed")), 30)
