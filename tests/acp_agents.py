"""The agent ``thinkray acp`` serves in the ACP tests (``--agent
tests.acp_agents:AcpTestAgent``; the subprocess runs from the repository root).

What the user writes decides the turn:

- ``weather <City>``: a reasoning block, a ``get_weather`` call (no approval; it
  prints to stdout, which must not reach the protocol), then ``It is <forecast>.``;
- ``deploy <target>``: a ``deploy`` call that asks for approval (a manifest ``ask``
  rule), then ``done: <result>``; ``deploy`` appends one line per execution to the
  file ``$ACP_TEST_MARKS`` so a test sees whether it ran;
- ``slow <n>``: ``n`` words, 50 ms apart (time to cancel mid-stream);
- ``fail``: two words, then the model fails (a non-transient model error);
- anything else: ``echo: <text>``.
"""

from __future__ import annotations

import os
from typing import Any

from thinkray.runtime.agents.agent import Agent
from thinkray.runtime.models.base import Model, ModelRequest
from thinkray.runtime.models.testing import FunctionModel, Reply, reasoning, reply, tool_call
from thinkray.runtime.tools.base import Tool, tool

FORECAST = {"Paris": "light rain, 14°C", "Lima": "fog, 17°C"}


class AcpTestAgent(Agent):
    permission_rules = ({"tool": "deploy", "action": "ask"},)
    acp_tool_kinds = {"get_weather": "fetch", "deploy": "execute"}

    def get_model(self) -> Model:
        return FunctionModel(self._step, model_id="acp-test")

    def get_tools(self) -> dict[str, Tool]:
        @tool
        def get_weather(city: str) -> str:
            """The forecast for a city."""
            print(f"looking up {city}")  # a stray write to stdout the protocol must survive
            return FORECAST.get(city, "sunny, 20°C")

        @tool
        def deploy(target: str) -> str:
            """Deploy (needs approval); records each execution."""
            marks = os.environ.get("ACP_TEST_MARKS")
            if marks:
                with open(marks, "a", encoding="utf-8") as f:
                    f.write(f"{target}\n")
            return f"deployed {target}"

        return {"get_weather": get_weather, "deploy": deploy}

    def _step(self, request: ModelRequest, step: int) -> Reply:
        last = request.messages[-1]
        if last.role == "tool":
            outcome: Any = last.content[-1]
            output = getattr(outcome, "output", None)
            if isinstance(output, str) and output.startswith(("light", "fog", "sunny")):
                return reply(f"It is {output}.")
            return reply(f"done: {output}")
        text = " ".join(getattr(c, "text", "") for c in last.content)
        verb, _, arg = text.partition(" ")
        if verb == "weather":
            return reply(
                reasoning("Checking ", "the forecast."), tool_call("get_weather", {"city": arg})
            )
        if verb == "deploy":
            return reply(tool_call("deploy", {"target": arg}))
        if verb == "fail":
            return reply("half ", "an ", "answer", fail_at=3, error="the model fell over")
        if verb == "slow":
            return reply(*[f"w{i} " for i in range(int(arg or 40))], delay=0.05)
        return reply(f"echo: {text}")
