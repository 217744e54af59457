"""Agents for the busy-policy tests through Ray (tests/test_midturn_ray.py): their
model waits on a gate file while a message says "hold", and logs every model call's
last user text to a file (so a test counts what the model answered, across crashes)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from thinkray.runtime import Think
from thinkray.runtime.models.base import Model, ModelRequest
from thinkray.runtime.models.testing import FunctionModel, last_user_text, reply


class GateAgent(Think):
    """Answers "re: <text>". A step whose last user message contains "hold" streams
    "partial " and then waits until the ``gate`` file exists."""

    on_busy = "queue"

    def __init__(self, store: Any = None, *, gate: str = "", log: str = "") -> None:
        self.gate = gate
        self.log = log
        super().__init__(store)

    def get_model(self) -> Model:
        return FunctionModel(self._step, model_id="gate")

    async def _step(self, request: ModelRequest, step: int) -> Any:
        text = last_user_text(request)
        if self.log:
            with open(self.log, "a") as f:
                f.write(f"{os.getpid()}\t{step}\t{text}\n")
        if "hold" in text and step == 0:
            return self._held(text)
        return reply(f"re: {text}")

    async def _held(self, text: str) -> Any:
        from thinkray.runtime.models.base import StepFinish, TextDelta, TextEnd, TextStart

        yield TextStart(id="t0")
        yield TextDelta(id="t0", delta="partial ")
        while not os.path.exists(self.gate):
            await asyncio.sleep(0.02)
        yield TextDelta(id="t0", delta=f"re: {text}")
        yield TextEnd(id="t0")
        yield StepFinish(finish_reason="stop")


class LatestAgent(GateAgent):
    on_busy = "latest"


class SteerAgent(GateAgent):
    on_busy = "steer"


class InterruptAgent(GateAgent):
    on_busy = "interrupt"
