"""Agents that exist only for the tests. Ray workers import them by module name
(``tests.agents``): the repository root is on the workers' path (tests/conftest.py).
The orchestrator classes live in :mod:`tests.orchestrator_agents`: the orchestrator's
modules cost each session actor that imported them with this one ~14 ms of CPU more,
and most of the suite's ~300 session actors host no orchestrator."""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from thinkray.actors.demo import get_weather
from thinkray.runtime.agents.agent import Agent
from thinkray.runtime.agents.persistent import (
    HandleTarget,
    PersistentAgent,
    persistent_agent_tool,
)
from thinkray.runtime.agents.think import Think
from thinkray.runtime.models.base import Model, ModelRequest
from thinkray.runtime.models.testing import FunctionModel, Reply, reply, tool_call
from thinkray.runtime.remote import Batch, idempotent, remote
from thinkray.runtime.tools.base import Tool, ToolContext, tool


class Counter(Think):
    """A stream method that yields single items and one Batch."""

    @remote
    async def count(self, n: int) -> AsyncIterator[int]:
        """0 .. n-1 one by one, then n and n+1 as one Batch."""
        for i in range(n):
            yield i
        yield Batch([n, n + 1])  # type: ignore[misc]  # a Batch of items travels as one


# -- moved from the package: agents that exist only for tests -------------------------


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

    @idempotent
    @remote
    def whoami(self) -> dict[str, Any]:
        """This instance's construction token, process id and whether its turns sync
        the disk off the event loop (agent hosts)."""
        return {
            "incarnation": self.incarnation,
            "pid": os.getpid(),
            "syncs_off_loop": self.syncs_off_loop,
        }

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

    @idempotent
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


_ASK = re.compile(r"^ask (?P<peer>[A-Za-z0-9_-]+):\s*(?P<text>.+)$", re.S)


class ScriptedPersistentAgent(PersistentAgent):
    """A persistent agent with a deterministic model, shipped for tests and demos.

    Each cycle answers ``"<name> got: <texts of the batch> (message <n>)"`` where ``n``
    counts the user messages in its history (its memory). A message ``ask <peer>:
    <text>`` makes it call the ``ask_<peer>`` tool (a blocking persistent-agent tool
    over ``peers[peer]``: a local agent or a Ray ``AgentHandle``) and then answer
    ``"<peer> replied: <reply>"``. ``delay`` slows every model event.
    """

    def __init__(
        self,
        store: Any = None,
        *,
        name: str | None = None,
        delay: float = 0.0,
        peers: Mapping[str, Any] | None = None,
    ) -> None:
        self.delay = delay
        self.peers = dict(peers or {})
        super().__init__(
            store,
            name=name,
            model=FunctionModel(self._step, model_id="scripted-persistent", delay=delay),
            instructions="You are a scripted persistent agent.",
        )

    def get_tools(self) -> dict[str, Tool]:
        tools = super().get_tools()
        for peer, target in self.peers.items():
            if not hasattr(target, "send") or hasattr(target.send, "remote"):
                target = HandleTarget(target)  # an actor handle: its methods go by .remote
            tools[f"ask_{peer}"] = persistent_agent_tool(
                target, name=f"ask_{peer}", description=f"Ask the agent {peer!r} and wait."
            )
        return tools

    def _step(self, request: ModelRequest, step: int) -> Reply:
        last = request.messages[-1] if request.messages else None
        if last is not None and last.role == "tool":
            result = last.content[0]
            peer = result.tool_name.removeprefix("ask_")
            return reply(f"{peer} replied: {result.output}")
        batch: list[str] = []
        for msg in reversed(request.messages):
            if msg.role != "user":
                break
            batch.insert(0, "".join(getattr(c, "text", "") for c in msg.content))
        tools = {t.name for t in request.tools}
        for text in batch:
            match = _ASK.match(text.strip())
            if match and f"ask_{match['peer']}" in tools:
                return reply(tool_call(f"ask_{match['peer']}", {"message": match["text"]}))
        count = sum(1 for m in request.messages if m.role == "user")
        return reply(f"{self.agent_name} got: {' | '.join(batch)} (message {count})")


class CrashAgent(ScriptAgent):
    """A ScriptAgent whose weather tool appends one line per execution to
    ``tool_log`` (a file path), so a test can count executions across processes."""

    def __init__(self, store: Any = None, *, tool_log: str = "", **kwargs: Any) -> None:
        self.tool_log = tool_log
        super().__init__(store, **kwargs)

    def get_tools(self) -> dict[str, Tool]:
        log_path = self.tool_log

        @tool(name="get_weather")
        def logged_weather(city: str, ctx: ToolContext) -> dict[str, Any]:
            """Current weather for a city (each execution is logged)."""
            with open(log_path, "a", encoding="utf-8") as fh:
                fh.write(f"{ctx.tool_call_id} {city}\n")
            return {"city": city, "summary": "fog", "temperature_c": 11}

        return {"get_weather": logged_weather}


class SessionCallsAgent(ScriptAgent):
    """A ScriptAgent that counts the session lookups and creations callers ask of it
    (``session_calls()``): what a chat turn costs the actor besides the turn."""

    def __init__(self, store: Any = None, **kwargs: Any) -> None:
        self.session_calls_seen = {"get_session": 0, "create_session": 0}
        super().__init__(store, **kwargs)

    def get_session(self, session_id: str | None = None) -> Any:
        self.session_calls_seen["get_session"] += 1
        return super().get_session(session_id)

    def create_session(self, name: str = "New Chat", **kwargs: Any) -> Any:
        self.session_calls_seen["create_session"] += 1
        return super().create_session(name, **kwargs)

    @idempotent
    @remote
    def session_calls(self) -> dict[str, int]:
        return dict(self.session_calls_seen)


class AlarmAgent(ScriptAgent):
    """Records when each alarm fired (epoch seconds), in its own database."""

    def note_alarm(self, payload: Any) -> None:
        """An alarm handler: appends ``[payload, now]`` to the ``alarms_fired`` config."""
        import time

        fired = self.store.get_config("alarms_fired", [])
        self.store.set_config("alarms_fired", [*fired, [payload, time.time()]])


class SlowWakeAlarmAgent(AlarmAgent):
    """An :class:`AlarmAgent` whose wake takes half a second after its scheduler
    started: the scheduler's report of its next alarm reaches the directory before the
    bind's reply does."""

    async def on_wake(self) -> None:
        import asyncio

        await super().on_wake()
        await asyncio.sleep(0.5)


class DurableToolAgent(Think):
    """Durable tool calls under crashes (issue 12): a message ``slow <path>`` calls the
    inline tool ``mark_and_wait``, which appends a line to ``path`` (one per execution)
    and then waits; ``render <scene>`` calls the external tool ``render``, which a
    worker outside the agent executes (claim_tool_calls / submit_tool_result)."""

    def get_model(self) -> Model:
        return FunctionModel(self._step, model_id="durable-tools")

    def get_tools(self) -> dict[str, Tool]:
        from thinkray.runtime.tools.base import ToolPolicy

        @tool
        async def mark_and_wait(path: str) -> str:
            """Record one execution, then take long."""
            import asyncio

            with open(path, "a", encoding="utf-8") as marks:
                marks.write("ran\n")
            await asyncio.sleep(60)
            return "finished"

        @tool(policy=ToolPolicy(executor="external"))
        async def render(scene: str) -> str:
            """Executed by an external worker."""
            raise AssertionError("external tools never run in the agent")

        return {"mark_and_wait": mark_and_wait, "render": render}

    def _step(self, request: ModelRequest, step: int) -> Reply:
        last = request.messages[-1]
        if last.role == "tool":
            return reply("done")
        text = " ".join(getattr(c, "text", "") for c in last.content)
        verb, _, arg = text.partition(" ")
        if verb == "slow":
            return reply(tool_call("mark_and_wait", {"path": arg}, id=f"slow-{step}"))
        if verb == "render":
            return reply(tool_call("render", {"scene": arg}, id="render-1"))
        return reply("nothing to do")


class ResumingAgent(Agent):
    """Generation recovery (issue 12, item 4): ``recover_generations = "resume"``.
    ``deploy <path>`` asks for approval, then appends a line to ``path`` (one per
    execution); ``render <scene>`` goes to an external executor; ``slow <path>`` runs
    an inline tool that marks ``path`` and then takes long. After a tool result the
    model answers ``done: <result>``."""

    recover_generations = "resume"
    permission_rules = ({"tool": "deploy", "action": "ask"},)
    approval_timeout = 300.0

    def get_model(self) -> Model:
        return FunctionModel(self._step, model_id="resuming")

    def get_tools(self) -> dict[str, Tool]:
        from thinkray.runtime.tools.base import ToolPolicy

        @tool
        def deploy(path: str) -> str:
            """Deploy (needs approval); records each execution."""
            with open(path, "a", encoding="utf-8") as marks:
                marks.write("deployed\n")
            return "deployed"

        @tool(policy=ToolPolicy(executor="external"))
        async def render(scene: str) -> str:
            """Executed by an external worker."""
            raise AssertionError("external tools never run in the agent")

        @tool
        async def mark_and_wait(path: str) -> str:
            """Record one execution, then take long."""
            import asyncio

            with open(path, "a", encoding="utf-8") as marks:
                marks.write("ran\n")
            await asyncio.sleep(60)
            return "finished"

        return {"deploy": deploy, "render": render, "mark_and_wait": mark_and_wait}

    def _step(self, request: ModelRequest, step: int) -> Reply:
        last = request.messages[-1]
        if last.role == "tool":
            outcome = last.content[-1]
            return reply(f"done: {getattr(outcome, 'output', '')}")
        text = " ".join(getattr(c, "text", "") for c in last.content)
        verb, _, arg = text.partition(" ")
        tools = {"deploy": "deploy", "render": "render", "slow": "mark_and_wait"}
        if verb in tools:
            key = "scene" if verb == "render" else "path"
            return reply(tool_call(tools[verb], {key: arg}, id=f"{verb}-call"))
        return reply("nothing to do")


class GuardedApprovalAgent(ResumingAgent):
    """The ingress's approval routes (issue 12, item 2; issue 11, item 6): as
    :class:`ResumingAgent` (``deploy <path>`` asks), but an answer must name its
    answerer (an anonymous one is refused), and nobody may approve a deploy to a path
    containing ``locked``."""

    def may_approve(self, approval: dict[str, Any], answered_by: str | None) -> bool:
        path = str((approval.get("input") or {}).get("path", ""))
        return answered_by is not None and "locked" not in path


# -- synced state (issue 25, part 3) ----------------------------------------------------


class Board(BaseModel):
    """The synced state of :class:`StateAgent`."""

    count: int = 0
    title: str = ""
    items: list[str] = []


class StateAgent(ScriptAgent):
    """An agent with synced state that clients may set; its hook refuses a negative
    count, and ``bump`` changes the state from inside the agent."""

    state_model = Board
    initial_state = Board(title="new board")
    client_can_set_state = True

    def validate_state_change(self, state: Any, source: Any) -> None:
        from thinkray.runtime.errors import StateChangeRefusedError

        if state.count < 0:
            raise StateChangeRefusedError("the count cannot go below zero")

    @remote
    def bump(self, by: int = 1) -> int:
        """Add ``by`` to the count, as the agent (a server-side change)."""
        board = self.state
        board.count += by
        return int(self.set_state(board).count)


class ServerStateAgent(StateAgent):
    """Synced state only the agent (and Python code through its handle) may set."""

    client_can_set_state = False


class BlockingAgent(ScriptAgent):
    """A remote method that blocks the event loop (a sync sleep): what a misbehaving
    agent does to its siblings in an agent host (tests/test_hosts.py). A message
    containing "slow io" calls ``slow_io``, a plain ``def`` tool that sleeps 2 s (a
    blocking tool, which runs in a thread: tests/bench/bench_hosts.py)."""

    def get_tools(self) -> dict[str, Tool]:
        @tool
        def slow_io(seconds: float) -> str:
            """Blocking I/O, simulated."""
            import time

            time.sleep(seconds)
            return "done"

        return {**super().get_tools(), "slow_io": slow_io}

    def _step(self, request: ModelRequest, step: int) -> Reply:
        last = request.messages[-1] if request.messages else None
        if last is not None and last.role == "user":
            text = " ".join(getattr(c, "text", "") for c in last.content)
            if "slow io" in text:
                return reply(tool_call("slow_io", {"seconds": 2.0}))
        return super()._step(request, step)

    @remote
    def block(self, seconds: float) -> str:
        """Sleep on the event loop's thread."""
        import time

        time.sleep(seconds)
        return "blocked"


class GateToolAgent(ScriptAgent):
    """A message containing "gate" calls a plain (``def``) tool that blocks in
    ``time.sleep`` until the file ``gate`` exists, after creating ``started``: a tool
    doing blocking I/O, beside sibling agents in an agent host (tests/test_hosts.py)."""

    def __init__(self, store: Any = None, *, gate: str = "", started: str = "") -> None:
        self.gate, self.started = gate, started
        super().__init__(store)

    def get_tools(self) -> dict[str, Tool]:
        gate, started = self.gate, self.started

        @tool
        def wait_for_gate() -> str:
            """Block until the gate file exists."""
            import time

            Path(started).touch()
            deadline = time.monotonic() + 60
            while not os.path.exists(gate) and time.monotonic() < deadline:
                time.sleep(0.02)
            return "opened" if os.path.exists(gate) else "timed out"

        return {"wait_for_gate": wait_for_gate}

    def _step(self, request: ModelRequest, step: int) -> Reply:
        last = request.messages[-1] if request.messages else None
        if last is not None and last.role == "user":
            text = " ".join(getattr(c, "text", "") for c in last.content)
            if "gate" in text:
                return reply(tool_call("wait_for_gate", {}))
        return super()._step(request, step)


class InPlaceSyncScriptAgent(ScriptAgent):
    """A ScriptAgent that syncs the disk on its event loop even in an agent host."""

    syncs_off_loop = False


class DedicatedScriptAgent(ScriptAgent):
    """A ScriptAgent that asks for a Ray actor of its own even under placement hosts."""

    dedicated_actor = True


class CloseFailsOnceAgent(ScriptAgent):
    """A ScriptAgent whose store's first close raises (a checkpoint DuckDB refused for
    good, a disk gone), and whose own ``close`` leaves ``<flags>/closed-<name>``: a
    test sees whether a hibernation that failed to close the file still stopped the
    agent (its timers and tasks)."""

    def __init__(self, store: Any = None, *, flags: str = "", **kwargs: Any) -> None:
        super().__init__(store, **kwargs)
        self.flags = flags
        real_close = self.store.close
        failed: list[bool] = []

        def close_failing_once() -> None:
            if not failed:
                failed.append(True)
                raise RuntimeError("the disk went away")
            real_close()

        self.store.close = close_failing_once  # type: ignore[method-assign]

    def close(self) -> None:
        Path(self.flags, f"closed-{self.agent_name}").touch()
        super().close()
