"""The Think turn hooks: prepare_turn, ChatOptions.emit, check_tool_permission with the
turn's options and ToolDenial, message_metadata, context_view, system_prompt_for,
reserve_session and own_turn — on plain Think subclasses."""

from __future__ import annotations

import asyncio

import pytest
from thinkray.runtime import SessionBusyError, Think, ToolContext, tool
from thinkray.runtime.models.testing import ScriptedModel, reply, text, tool_call
from thinkray.runtime.turn.loop import ToolDenial

from tests.conftest import Collector


@tool
def echo(value: str) -> str:
    """Echo a value."""
    return value


def note(n: int) -> dict:
    return {"type": "data-status", "data": {"n": n}, "transient": True}


async def test_plain_think_hooks_are_no_ops(store):
    agent = Think(store, model=ScriptedModel([reply("hi")]))
    result = await agent.chat("hello")
    assert result.status == "completed" and result.text == "hi"
    assert set(result.message["metadata"]) >= {"usage", "status"}
    history = agent.get_history()
    assert agent.context_view(history) == history


async def test_prepare_turn_emits_after_start_and_sees_the_landed_message(store):
    seen = {}

    class Preparing(Think):
        async def prepare_turn(self, options):
            seen["last"] = options.history[-1]["id"]
            seen["user"] = options.user_message_id
            await options.emit(note(1))
            await options.emit(note(2))
            return False

    agent = Preparing(store, model=ScriptedModel([reply("a1")]))
    collector = Collector()
    result = await agent.chat(
        {"id": "u-1", "role": "user", "parts": [{"type": "text", "text": "x"}]}, collector
    )
    assert seen == {"last": "u-1", "user": "u-1"}
    types = collector.types()
    assert types[:3] == ["start", "data-status", "data-status"]
    assert [c["data"]["n"] for c in collector.events if c["type"] == "data-status"] == [1, 2]
    assert [p["type"] for p in result.message["parts"]] == ["step-start", "text"]
    # The same order in the replayable stream.
    replay = [c["type"] for c in agent.run_stream().chunks]
    assert replay[:3] == ["start", "data-status", "data-status"]


async def test_prepare_turn_may_rewrite_the_history(store):
    class Inserting(Think):
        async def prepare_turn(self, options):
            if options.user_message_id is None:
                return False
            self.store.append_message(
                options.session_id,
                {"id": "extra", "role": "assistant", "parts": [{"type": "text", "text": "E"}]},
            )
            return True

    model = ScriptedModel([reply("a1")])
    agent = Inserting(store, model=model)
    result = await agent.chat("u1")
    history = agent.get_history()
    assert [m["id"] for m in history][-2:] == ["extra", result.message_id]
    assert store.get_path(agent.current_session_id)[-1].parent_id == "extra"
    assert [m.role for m in model.requests[0].messages][-1] == "assistant"


async def test_prepare_turn_abort_ends_the_turn_aborted(store):
    class Slow(Think):
        async def prepare_turn(self, options):
            await options.signal.wait()
            options.signal.throw_if_aborted()
            return False

    model = ScriptedModel([reply("never")])
    agent = Slow(store, model=model)
    run = agent.start_chat("u1")
    await asyncio.sleep(0.01)
    assert agent.abort()
    result = await run.task
    assert result.status == "aborted" and model.requests == []


async def test_tools_and_permission_checks_emit_in_order(store):
    @tool
    async def progress(ctx: ToolContext) -> str:
        """Report progress."""
        await ctx.extras["emit"](note(7))
        return "ok"

    class Checking(Think):
        async def check_tool_permission(self, tool_name, input, call_id, options=None):
            await options.emit(
                {"type": "data-status", "data": {"check": call_id}, "transient": True}
            )
            return None

        def get_tools(self):
            return {"progress": progress}

    model = ScriptedModel([reply(tool_call("progress", {}, id="c1")), reply("done")])
    agent = Checking(store, model=model)
    collector = Collector()
    result = await agent.chat("go", collector)
    assert result.status == "completed"
    types = collector.types()
    i = types.index("tool-input-available")
    assert types[i + 1 : i + 4] == ["data-status", "data-status", "tool-output-available"]
    datas = [c["data"] for c in collector.events if c["type"] == "data-status"]
    assert datas == [{"check": "c1"}, {"n": 7}]


@pytest.mark.parametrize("by_user", [False, True])
async def test_tool_denial_shapes_the_stream_and_the_model_result(store, by_user):
    class Denying(Think):
        async def check_tool_permission(self, tool_name, input, call_id, options=None):
            assert options.session_id == self.current_session_id
            return ToolDenial(f"no {tool_name}", by_user=by_user)

        def get_tools(self):
            return {"echo": echo}

    model = ScriptedModel([reply(tool_call("echo", {"value": "v"}, id="c1")), reply("ok")])
    agent = Denying(store, model=model)
    collector = Collector()
    result = await agent.chat("go", collector)
    part = next(p for p in result.message["parts"] if p["type"] == "dynamic-tool")
    if by_user:
        assert {"type": "tool-output-denied", "toolCallId": "c1"} in collector.events
        assert part["state"] == "output-denied"
    else:
        assert part["state"] == "output-error" and part["errorText"] == "no echo"
    tool_result = model.requests[1].messages[-1].content[0]
    assert tool_result.is_error and tool_result.output == "no echo"


async def test_message_metadata_context_view_and_system_prompt_for(store):
    class Hooked(Think):
        async def system_prompt_for(self, options, tools):
            options.state["prompt"] = f"tools: {','.join(sorted(tools))}"
            return options.state["prompt"]

        def message_metadata(self, options):
            return {"prompt": options.state["prompt"], "status": "overridden?"}

        def context_view(self, messages):
            return messages[-1:]  # only the new user message

    model = ScriptedModel([reply("a1"), reply("a2")])
    agent = Hooked(store, model=model)
    await agent.chat("u1")
    result = await agent.chat("u2", tools={"echo": echo})
    assert model.requests[1].system == "tools: echo"
    assert [m.role for m in model.requests[1].messages] == ["user"]
    meta = result.message["metadata"]
    assert meta["prompt"] == "tools: echo" and meta["status"] == "completed"
    assert agent.get_history()[-1]["metadata"]["prompt"] == "tools: echo"


async def test_reserve_session_blocks_turns_and_restores_the_status(store):
    agent = Think(store, model=ScriptedModel([reply("a1"), reply(text("slow"), delay=0.05)]))
    sid = agent.create_session().id
    with agent.reserve_session(sid, "maintenance"):
        assert agent.get_status(sid).state == "busy"
        assert agent.get_status(sid).message == "maintenance"
        with pytest.raises(SessionBusyError):
            agent.start_chat("u1")
        with pytest.raises(SessionBusyError), agent.reserve_session(sid):
            pass
        with pytest.raises(SessionBusyError):
            agent.branch(sid, "nope")
    assert agent.get_status(sid).state == "idle"
    assert (await agent.chat("u1")).status == "completed"
    run = agent.start_chat("u2")
    await asyncio.sleep(0.01)
    with pytest.raises(SessionBusyError), agent.reserve_session(sid):
        pass
    await run.task


async def test_own_turn_is_the_turn_before_its_stream(store):
    seen = []

    class Probing(Think):
        async def on_user_message(self, session_id, message):
            seen.append(("user", self.own_turn(session_id) is not None))
            return message

        async def prepare_turn(self, options):
            seen.append(("prepare", self.own_turn(options.session_id) is not None))
            return False

        async def on_chat_message(self, options):
            seen.append(("stream", self.own_turn(options.session_id) is not None))
            async for chunk in super().on_chat_message(options):
                yield chunk

    agent = Probing(store, model=ScriptedModel([reply("a1")]))
    run = agent.start_chat("u1")
    assert agent.own_turn(run.session_id) is None  # not from outside the turn
    await run.task
    assert seen == [("user", True), ("prepare", True), ("stream", False)]
