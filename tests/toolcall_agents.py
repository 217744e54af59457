"""Agents of the tool-call lease and approval-expiry tests (issue 21, items 13 and 14).
Ray workers import them by module name, so they live in a module of their own."""

from __future__ import annotations

from thinkray.runtime.agents.think import Think
from thinkray.runtime.models.base import Model, ModelRequest
from thinkray.runtime.models.testing import FunctionModel, Reply, reply, tool_call
from thinkray.runtime.tools.base import Tool, ToolPolicy, tool

from tests.agents import ResumingAgent

RENDER_LEASE = 1.0  # seconds an external claim holds without a heartbeat


class LeasedRenderAgent(Think):
    """``render <scene>`` calls the external tool ``render`` (a short lease), which a
    worker outside the agent executes; after its result the model answers
    ``done: <result>``."""

    def get_model(self) -> Model:
        return FunctionModel(self._step, model_id="leased-render")

    def get_tools(self) -> dict[str, Tool]:
        @tool(policy=ToolPolicy(executor="external", lease=RENDER_LEASE))
        async def render(scene: str) -> str:
            """Executed by an external worker."""
            raise AssertionError("external tools never run in the agent")

        return {"render": render}

    def _step(self, request: ModelRequest, step: int) -> Reply:
        last = request.messages[-1]
        if last.role == "tool":
            return reply(f"done: {getattr(last.content[-1], 'output', '')}")
        text = " ".join(getattr(c, "text", "") for c in last.content)
        verb, _, arg = text.partition(" ")
        if verb == "render":
            return reply(tool_call("render", {"scene": arg}, id="render-call"))
        return reply("nothing to do")


class ExpiringApprovalAgent(ResumingAgent):
    """As :class:`~tests.agents.ResumingAgent` (``deploy <path>`` asks, then marks
    ``path``), with asks that expire after 3 s (the issue's example)."""

    approval_timeout = 3.0
