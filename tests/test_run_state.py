"""Per-run state and the agent's construction: nothing of a turn lives on the agent.

An agent serves several sessions; each turn's history, options and recorder belong to
the run. These tests overlap two turns of different sessions on one agent at an
``await`` inside ``prepare_turn`` — where auto-compaction's summarizer call awaits —
and check that neither sees the other's history.
"""

from __future__ import annotations

import asyncio
from typing import Any

from thinkray.runtime.agents.agent import Agent
from thinkray.runtime.agents.context import AgentContext, constructing
from thinkray.runtime.agents.runs import ChatOptions
from thinkray.runtime.agents.think import Think
from thinkray.runtime.models.base import ModelRequest
from thinkray.runtime.models.testing import FunctionModel, ScriptedModel, reply, tool_call
from thinkray.runtime.tools.base import tool


def request_texts(request: ModelRequest) -> list[str]:
    return [c.text for m in request.messages for c in m.content if hasattr(c, "text")]


def texts(messages: list[dict[str, Any]]) -> list[str]:
    return ["".join(p["text"] for p in m["parts"] if p["type"] == "text") for m in messages]


def echo_model() -> FunctionModel:
    def step(request: ModelRequest, index: int) -> str:
        return "re: " + request_texts(request)[-1]

    return FunctionModel(step)


class SlowPrepare(Think):
    """``prepare_turn`` of session A awaits (as a summarizer call would) until released."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hold: dict[str, asyncio.Event] = {}
        self.entered: dict[str, asyncio.Event] = {}

    async def prepare_turn(self, options: ChatOptions) -> bool:
        event = self.hold.get(options.session_id)
        if event is not None:
            self.entered[options.session_id].set()
            await event.wait()
        return False


async def test_overlapping_turns_of_two_sessions_never_see_each_others_history() -> None:
    model = echo_model()
    agent = SlowPrepare(model=model)
    a = agent.create_session("a").id
    b = agent.create_session("b").id
    await agent.chat("a-first", session_id=a)
    await agent.chat("b-first", session_id=b)
    agent.hold[a], agent.entered[a] = asyncio.Event(), asyncio.Event()

    run_a = agent.start_chat("a-second", session_id=a)
    await agent.entered[a].wait()  # A is parked inside prepare_turn
    result_b = await agent.chat("b-second", session_id=b)  # B runs a whole turn meanwhile
    agent.hold[a].set()
    assert run_a.task is not None
    result_a = await run_a.task

    assert result_a.status == result_b.status == "completed"
    assert result_a.text == "re: a-second" and result_b.text == "re: b-second"
    seen = {request_texts(r)[-1]: request_texts(r) for r in model.requests}
    assert seen["a-second"] == ["a-first", "re: a-first", "a-second"]
    assert seen["b-second"] == ["b-first", "re: b-first", "b-second"]
    assert texts(agent.get_history(a)) == [
        "a-first",
        "re: a-first",
        "a-second",
        "re: a-second",
    ]
    assert texts(agent.get_history(b)) == [
        "b-first",
        "re: b-first",
        "b-second",
        "re: b-second",
    ]


async def test_the_hooks_get_the_turns_own_history() -> None:
    seen: list[list[str]] = []

    class Recording(Think):
        async def prepare_turn(self, options: ChatOptions) -> bool:
            seen.append(texts(options.history))
            return False

    agent = Recording(model=echo_model())
    await agent.chat("one")
    await agent.chat("two")
    assert seen == [["one"], ["one", "re: one", "two"]]
    assert not hasattr(agent, "messages")  # no turn state on the agent


def test_on_start_runs_after_the_whole_constructor() -> None:
    class Late(Think):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.greeting = "set after super().__init__"

        def on_start(self) -> None:
            self.started_with = self.greeting

    assert Late().started_with == "set after super().__init__"


def test_identity_is_given_at_construction() -> None:
    seen: list[AgentContext] = []

    class Named(Agent):
        def __init__(self, store: Any = None, *, flavour: str = "plain") -> None:
            super().__init__(store)  # does not forward a context: the host's applies
            self.flavour = flavour

        def on_start(self) -> None:
            seen.append(self.context)

    context = AgentContext(name="alice", namespace="support", storage_root="/data")
    explicit = Think(context=context)
    assert (explicit.agent_name, explicit.namespace, explicit.storage_root) == (
        "alice",
        "support",
        "/data",
    )
    with constructing(context):
        hosted = Named(flavour="spicy")
    assert seen == [context] and hosted.agent_name == "alice" and hosted.flavour == "spicy"
    assert Think().context == AgentContext()  # outside a host: the default identity


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


async def test_a_permission_hook_that_raises_refuses_the_call_and_the_turn_ends() -> None:
    class Broken(Think):
        async def check_tool_permission(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("policy service down")

        def get_tools(self) -> dict[str, Any]:
            return {"lookup": lookup}

    model = ScriptedModel([reply(tool_call("lookup", {"key": "k"}, id="c1")), reply("sorry")])
    agent = Broken(model=model)
    result = await asyncio.wait_for(agent.chat("go"), 10)
    assert result.status == "completed" and result.text == "sorry"
    [part] = [p for p in result.message["parts"] if p.get("type") == "dynamic-tool"]
    assert part["state"] == "output-error"
    assert "policy service down" in part["errorText"]


async def test_agent_capabilities_are_composed_objects() -> None:
    agent = Agent(model=ScriptedModel([reply("hi")]))
    assert agent.compaction.host is agent and agent.permissions.host is agent
    assert agent.prompts.host is agent
    result = await agent.chat("hello")
    assert result.message is not None
    assert result.message["metadata"]["system_prompt_digest"] == agent.last_prompt.digest
