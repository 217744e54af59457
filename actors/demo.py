"""Agents that ship with the package: the demo agent and a configurable test agent.

They live in the package (not in tests) so Ray workers can import them by name.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from pydantic import BaseModel
from thinkray.runtime.agents.agent import Agent
from thinkray.runtime.agents.think import Think
from thinkray.runtime.models.base import Model, ModelRequest
from thinkray.runtime.models.testing import FunctionModel, Reply, reply, tool_call
from thinkray.runtime.remote import remote
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
        result = last.content[0].output
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


def _timestamped_deltas(n: int, delay: float) -> Any:
    import asyncio
    import time

    from thinkray.runtime.models.base import StepFinish, TextDelta, TextEnd, TextStart

    async def events(request: ModelRequest, step: int) -> Any:
        yield TextStart(id="ts")
        for _ in range(n):
            if delay:
                await asyncio.sleep(delay)
            yield TextDelta(id="ts", delta=f"{time.time():.6f} ")
        yield TextEnd(id="ts")
        yield StepFinish(finish_reason="stop")

    return events


class DemoAgent(Agent):
    """Claude when ANTHROPIC_API_KEY is set, else the offline scripted model. The full
    session model (compaction, permission scopes, assembled system prompt)."""

    manifest_prompt = "You are a concise assistant. Use get_weather for weather questions."

    def get_model(self) -> Model:
        if os.environ.get("ANTHROPIC_API_KEY"):
            from thinkray.runtime.models.anthropic import AnthropicModel

            return AnthropicModel(os.environ.get("THINKRAY_MODEL", "claude-sonnet-4-6"))
        return FunctionModel(_offline_step, model_id="offline-demo", delay=0.01)

    def get_tools(self) -> dict[str, Tool]:
        return {"get_weather": get_weather}


class ScriptAgent(Think):
    """A test agent whose replies are shaped by its constructor arguments.

    Every turn answers ``reply_text`` split into ``chunks`` deltas, sleeping ``delay``
    between them; a user message containing ``weather in <City>`` calls the weather
    tool first.
    """

    def __init__(
        self,
        store: Any = None,
        *,
        chunks: int = 5,
        delay: float = 0.0,
        reply_text: str | None = None,
        timestamps: bool = False,
    ) -> None:
        self.timestamps = timestamps
        self.chunks = chunks
        self.delay = delay
        self.reply_text = reply_text
        super().__init__(store)

    def get_model(self) -> Model:
        return FunctionModel(self._step, model_id="script", delay=self.delay)

    def get_tools(self) -> dict[str, Tool]:
        return {"get_weather": get_weather}

    def _step(self, request: ModelRequest, step: int) -> Reply:
        last = request.messages[-1] if request.messages else None
        if last is not None and last.role == "user":
            text = " ".join(getattr(c, "text", "") for c in last.content)
            match = re.search(r"weather in ([A-Za-z]+)", text)
            if match:
                return reply(tool_call("get_weather", {"city": match.group(1)}))
        if self.timestamps:
            # Each delta is its own emit time: lets a benchmark measure emit→receive.
            return _timestamped_deltas(self.chunks, self.delay)(request, step)
        body = self.reply_text or "chunk"
        return reply(*[f"{body}{i} " for i in range(self.chunks)])

    # -- durable work used by the actor tests -------------------------------------------

    def on_start(self) -> None:
        import uuid

        # A fresh token per construction: proves a wake builds a new instance.
        self.incarnation = uuid.uuid4().hex

    @remote
    def whoami(self) -> dict[str, Any]:
        """This instance's construction token and process id."""
        return {"incarnation": self.incarnation, "pid": os.getpid()}

    async def count_to(self, payload: dict[str, Any], ctx: Any) -> int:
        """A fiber: counts to ``payload['n']`` stashing progress; resumes from a stash."""
        import asyncio

        start = (ctx.checkpoint or {}).get("i", 0)
        for i in range(start, payload["n"]):
            ctx.stash({"i": i + 1, "recovered": ctx.recovered})
            await asyncio.sleep(payload.get("sleep", 0.05))
        return payload["n"]

    def note_alarm(self, payload: Any) -> None:
        fired = self.store.get_config("alarms_fired", [])
        self.store.set_config("alarms_fired", [*fired, payload])

    @remote
    def alarms_fired(self) -> list[Any]:
        """The payloads of the alarms that fired, in order."""
        return self.store.get_config("alarms_fired", [])


def _session_step(request: ModelRequest, step: int) -> Reply:
    """Answers summarizer calls with a summary, weather questions with the tool, and
    everything else by echoing; every step reports 400 input tokens."""
    usage = {"input": 400, "output": 20}
    if not request.tools and "summar" in request.system.lower():
        return reply("Goal: chat. Progress: several turns. Next Steps: continue.", usage=usage)
    last = request.messages[-1] if request.messages else None
    if last is not None and last.role == "user":
        text = " ".join(getattr(c, "text", "") for c in last.content)
        match = re.search(r"weather in ([A-Za-z]+)", text)
        if match:
            return reply(tool_call("get_weather", {"city": match.group(1)}), usage=usage)
        return reply(f"echo: {text}", usage=usage)
    return reply("done", usage=usage)


class SessionAgent(Agent):
    """A deterministic ``Agent`` for tests of the session model through actors."""

    manifest_prompt = "You are a test agent."

    def __init__(self, store: Any = None, *, context_window: int = 200_000) -> None:
        self.context_window = context_window
        super().__init__(store)

    def get_model(self) -> Model:
        return FunctionModel(
            _session_step,
            model_id="session-script",
            context_window=self.context_window,
            max_output_tokens=256,
        )

    def get_tools(self) -> dict[str, Tool]:
        return {"get_weather": get_weather}


class Summary(BaseModel):
    """Typed output of the demo summarizer worker."""

    title: str
    word_count: int


def _summarizer_step(request: ModelRequest, step: int) -> Reply:
    words = next(
        (
            " ".join(getattr(c, "text", "") for c in m.content)
            for m in reversed(request.messages)
            if m.role == "user"
        ),
        "",
    ).split()
    first = words[0].title() if words else "Empty"
    return reply(tool_call("final_result", {"title": first, "word_count": len(words)}))


def summarizer() -> Any:
    """A worker agent: fresh context per call, typed ``Summary`` output."""
    from thinkray.runtime.agents.worker import WorkerAgent

    return WorkerAgent(
        "summarize",
        instructions="Summarize the text: a title and its word count.",
        model=lambda: FunctionModel(_summarizer_step, model_id="summarizer"),
        output_type=Summary,
    )


def _host_step(request: ModelRequest, step: int) -> Reply:
    last = request.messages[-1] if request.messages else None
    if last is not None and last.role == "tool":
        return reply(f"summary: {json.dumps(last.content[0].output, sort_keys=True)}")
    text = " ".join(getattr(c, "text", "") for c in last.content) if last is not None else ""
    return reply(tool_call("summarize", {"input": text}))


class WorkerHostAgent(Think):
    """Uses the summarizer worker as a blocking tool (actor tests)."""

    def get_model(self) -> Model:
        return FunctionModel(_host_step, model_id="worker-host")

    def get_tools(self) -> dict[str, Tool]:
        return {"summarize": summarizer().as_tool("blocking")}
