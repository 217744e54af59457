"""The agent of ``thinkray demo``: Claude when ``ANTHROPIC_API_KEY`` is set, else an
offline scripted stand-in, with one (offline) weather tool.

It lives in the package so the demo's Ray workers can import it by name; it is never
used as a fallback for an agent that has no model configured."""

from __future__ import annotations

import os
import re

from thinkray.runtime.agents.agent import Agent
from thinkray.runtime.models.base import Model, ModelRequest
from thinkray.runtime.models.testing import FunctionModel, Reply, reply, tool_call
from thinkray.runtime.tools.base import Tool, tool

_FORECASTS = {"paris": ("light rain", 14), "tokyo": ("clear skies", 22), "lima": ("fog", 17)}


@tool
def get_weather(city: str) -> dict:
    """Current weather for a city (an offline table: demo data, not a real forecast)."""
    summary, temp = _FORECASTS.get(city.strip().lower(), ("mild and cloudy", 18))
    return {"city": city, "summary": summary, "temperature_c": temp}


def _offline_step(request: ModelRequest, step: int) -> Reply:
    """A deterministic stand-in for Claude: asks for the weather tool when the user
    names a city, then answers from the tool result."""
    last = request.messages[-1] if request.messages else None
    if last is not None and last.role == "tool":
        content = last.content[0]
        result = content.output if content.type == "tool-result" else None
        if isinstance(result, dict):
            words = (
                f"In {result['city']} it is {result['summary']} and "
                f"{result['temperature_c']}°C right now."
            ).split(" ")
            return reply(*[w + " " for w in words[:-1]], words[-1])
    text = ""
    for msg in reversed(request.messages):
        if msg.role == "user":
            text = " ".join(getattr(c, "text", "") for c in msg.content)
            break
    match = re.search(r"\bin ([A-Z][a-zA-Z]+)", text)
    if match:
        return reply("Let me check. ", tool_call("get_weather", {"city": match.group(1)}))
    turns = sum(1 for m in request.messages if m.role == "user")
    words = f"Hello! This is turn {turns} of our chat; I remember everything so far.".split()
    return reply(*[w + " " for w in words[:-1]], words[-1])


class DemoAgent(Agent):
    """Claude when ANTHROPIC_API_KEY is set, else the offline scripted model. The full
    session model (compaction, permission scopes, assembled system prompt)."""

    manifest_prompt = "You are a concise assistant. Use get_weather for weather questions."

    def get_model(self) -> Model:
        """Claude (``$THINKRAY_MODEL``, default claude-sonnet-4-6) when
        ``ANTHROPIC_API_KEY`` is set, else the offline scripted weather bot."""
        if os.environ.get("ANTHROPIC_API_KEY"):
            from thinkray.runtime.models.anthropic import AnthropicModel

            # One adapter per agent, not per call (every turn asks): each adapter makes
            # its own HTTP client, with an SSL context (~20 ms of CPU) and a new TLS
            # connection to the API for its first request.
            model_id = os.environ.get("THINKRAY_MODEL", "claude-sonnet-4-6")
            claude = getattr(self, "_claude", None)
            if claude is None or claude.model_id != model_id:
                claude = self._claude = AnthropicModel(model_id)
            return claude
        return FunctionModel(_offline_step, model_id="offline-demo", delay=0.01)

    def get_tools(self) -> dict[str, Tool]:
        """The demo's one tool, ``get_weather``."""
        return {"get_weather": get_weather}
