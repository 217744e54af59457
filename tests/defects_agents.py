"""Agents of the issue-26 actor tests (importable by the actors' processes)."""

from __future__ import annotations

import asyncio
from typing import Any

from thinkray.runtime import Think, tool
from thinkray.runtime.models.base import Model
from thinkray.runtime.models.testing import FunctionModel, pause, reply, tool_call
from thinkray.runtime.tools.base import Tool

from tests.agents import ScriptAgent


@tool
async def lookup(q: str) -> str:
    """An inline tool."""
    return f"found {q}"


class CallThenStall(Think):
    """``call``: the model produces a tool call, then keeps streaming for an hour (the
    turn has not run the call yet). Anything else: a short answer."""

    def get_model(self) -> Model:
        def step(request: Any, n: int) -> Any:
            text = "".join(getattr(c, "text", "") for c in request.messages[-1].content)
            if text == "call":
                return reply(tool_call("lookup", {"q": "x"}, id="call-1"), pause(3600))
            return reply("ok")

        return FunctionModel(step, model_id="stall")

    def get_tools(self) -> dict[str, Tool]:
        return {"lookup": lookup}


class SlowTalker(Think):
    """Streams a long answer slowly (a word every 50 ms)."""

    def get_model(self) -> Model:
        return FunctionModel(lambda request, n: reply(*["word "] * 400, delay=0.05))


class SlowToHibernate(ScriptAgent):
    """Its ``on_hibernate`` waits for a gate (class attributes, set by the test, which
    hosts it in the test's own process): a hibernation that takes its time."""

    entered: asyncio.Event | None = None
    gate: asyncio.Event | None = None

    async def on_hibernate(self) -> None:
        assert self.entered is not None and self.gate is not None
        self.entered.set()
        await self.gate.wait()


class SlowToWake(ScriptAgent):
    """Its ``on_wake`` waits for a gate (class attributes, set by the test, which hosts
    it in the test's own process): a wake that takes its time."""

    entered: asyncio.Event | None = None
    gate: asyncio.Event | None = None

    async def on_wake(self) -> None:
        await super().on_wake()
        assert self.entered is not None and self.gate is not None
        self.entered.set()
        await self.gate.wait()
