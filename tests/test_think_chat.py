"""Seed 000 suites: core chat, error handling, abort, richer input, agentic loop."""

from __future__ import annotations

import asyncio
import threading

import pytest
from pydantic import BaseModel
from thinkray.runtime import SessionBusyError, Think, tool, tool_from_model
from thinkray.runtime.abort import AbortController
from thinkray.runtime.messages import InvalidMessageError
from thinkray.runtime.models.base import ModelError
from thinkray.runtime.models.testing import (
    FunctionModel,
    ScriptedModel,
    fail,
    last_user_text,
    pause,
    reasoning,
    reply,
    text,
    tool_call,
)
from thinkray.runtime.usage import Usage
from thinkray.storage.types import SessionNotFoundError

from tests.conftest import Collector


def texts(history):
    return ["".join(p.get("text", "") for p in m["parts"] if p["type"] == "text") for m in history]


# -- core chat -------------------------------------------------------------------------


async def test_send_streams_chunks_and_persists(store, collector):
    agent = Think(store, model=ScriptedModel([reply("Hel", "lo ", "there")]))
    result = await agent.chat("Hi", collector)
    assert result.status == "completed"
    assert result.text == "Hello there"
    assert collector.types()[0] == "start"
    assert collector.types()[-1] == "finish"
    assert [c["delta"] for c in collector.events if c["type"] == "text-delta"] == [
        "Hel",
        "lo ",
        "there",
    ]
    assert collector.done == 1 and collector.errors == []
    history = agent.get_history()
    assert [m["role"] for m in history] == ["user", "assistant"]
    assert texts(history) == ["Hi", "Hello there"]


async def test_multi_turn_context_reaches_model(store):
    model = ScriptedModel([reply("one"), reply("two")])
    agent = Think(store, model=model)
    await agent.chat("first")
    await agent.chat("second")
    roles = [m.role for m in model.requests[1].messages]
    assert roles == ["user", "assistant", "user"]
    assert texts(agent.get_history()) == ["first", "one", "second", "two"]


async def test_history_survives_reopen(tmp_path):
    from thinkray.storage.session_store import DuckDBSessionStore

    path = tmp_path / "a.duckdb"
    agent = Think(DuckDBSessionStore(path), model=ScriptedModel([reply("kept")]))
    await agent.chat("remember me")
    sid = agent.current_session_id
    agent.close()
    again = Think(DuckDBSessionStore(path))
    assert again.current_session_id == sid
    assert texts(again.get_history()) == ["remember me", "kept"]
    again.close()


async def test_user_message_is_idempotent_on_id(store):
    agent = Think(store, model=ScriptedModel([reply("a"), reply("b")]))
    msg = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hello"}]}
    await agent.chat(msg)
    await agent.chat(msg)  # a retry of the same message must not duplicate it
    history = agent.get_history()
    assert [m["id"] for m in history].count("u1") == 1


async def test_custom_on_chat_message(store):
    class Echo(Think):
        async def on_chat_message(self, options):
            yield {"type": "start"}
            yield {"type": "text-start", "id": "x"}
            yield {"type": "text-delta", "id": "x", "delta": "echo: " + texts(options.history)[-1]}
            yield {"type": "text-end", "id": "x"}
            yield {"type": "finish", "finishReason": "stop"}

    agent = Echo(store)
    result = await agent.chat("ping")
    assert result.text == "echo: ping"


async def test_message_parts_are_complete(store):
    agent = Think(
        store,
        model=ScriptedModel([reply(reasoning("think", "ing"), text("an", "swer"))]),
    )
    result = await agent.chat("q")
    parts = agent.get_history()[-1]["parts"]
    kinds = [p["type"] for p in parts]
    assert kinds == ["step-start", "reasoning", "text"]
    assert parts[1]["text"] == "thinking"
    assert parts[1]["providerMetadata"] == {"anthropic": {"signature": "sig-test"}}
    assert parts[2] == {"type": "text", "text": "answer", "state": "done"}
    assert result.message["metadata"]["finishReason"] == "stop"


async def test_switching_sessions_keeps_histories_apart(store):
    agent = Think(store, model=ScriptedModel([reply("in a"), reply("in b")]))
    a = agent.create_session("a").id
    await agent.chat("to a")
    b = agent.create_session("b").id
    await agent.chat("to b")
    assert texts(agent.get_history(a)) == ["to a", "in a"]
    assert texts(agent.switch_session(b)) == ["to b", "in b"]


# -- errors ----------------------------------------------------------------------------


async def test_model_error_persists_partial_and_reports(store, collector):
    agent = Think(
        store,
        model=ScriptedModel([reply("partial ", "out", "put", fail_at=3, error="boom")]),
    )
    result = await agent.chat("go", collector)
    assert result.status == "error"
    assert "boom" in result.error
    assert collector.errors and "boom" in collector.errors[0]
    assert collector.types()[-1] == "error"
    last = agent.get_history()[-1]
    assert last["role"] == "assistant"
    assert texts([last]) == ["partial out"]  # what streamed before the failure is kept
    assert agent.get_status().state == "error"


async def test_on_chat_error_hook_transforms(store):
    class Hooked(Think):
        seen: list = []

        async def on_chat_error(self, error):
            self.seen.append(error)
            return RuntimeError("friendly message")

    agent = Hooked(store, model=ScriptedModel([reply("x", fail_at=0, error="raw")]))
    result = await agent.chat("go")
    assert result.error == "friendly message"
    assert isinstance(Hooked.seen[0], ModelError)


async def test_recovers_after_error(store):
    agent = Think(store, model=ScriptedModel([reply("x", fail_at=0, error="down"), reply("up")]))
    assert (await agent.chat("one")).status == "error"
    result = await agent.chat("two")
    assert result.status == "completed" and result.text == "up"
    assert agent.get_status().state == "idle"


async def test_transient_error_retries_with_status(store):
    seen = []
    agent = Think(
        store,
        model=ScriptedModel([reply(fail("overloaded", transient=True)), reply("fine")]),
    )
    agent.retry_policy = type(agent.retry_policy)(max_retries=2, base_delay=0.01)
    agent.status.subscribe(lambda sid, st: seen.append((st.state, st.attempt)))
    result = await agent.chat("go")
    assert result.text == "fine"
    assert ("retrying", 1) in seen
    assert seen[-1] == ("idle", None)


# -- abort ------------------------------------------------------------------------------


async def test_abort_stops_stream_and_persists_partial(store, collector):
    agent = Think(store, model=ScriptedModel([reply(*["tok "] * 200, delay=0.005)]))
    run = agent.start_chat("long", collector)
    while sum(1 for c in collector.events if c["type"] == "text-delta") < 5:
        await asyncio.sleep(0.005)
    assert agent.abort()
    result = await run.task
    assert result.status == "aborted"
    assert collector.types()[-1] == "abort"
    n = sum(1 for c in collector.events if c["type"] == "text-delta")
    assert 5 <= n < 200
    stored = texts(agent.get_history())[-1]
    assert stored == "tok " * n  # truthful on reload: exactly what was streamed
    assert agent.abort() is False  # nothing in flight any more


async def test_external_signal_aborts(store):
    controller = AbortController()
    agent = Think(store, model=ScriptedModel([reply("a", pause(5), "b")]))
    task = asyncio.ensure_future(agent.chat("x", signal=controller.signal))
    await asyncio.sleep(0.05)
    controller.abort("parent went away")
    result = await asyncio.wait_for(task, 2)
    assert result.status == "aborted"


async def test_recovers_after_abort(store):
    agent = Think(store, model=ScriptedModel([reply("a", pause(5)), reply("next")]))
    run = agent.start_chat("x")
    await asyncio.sleep(0.05)
    agent.abort()
    await run.task
    result = await agent.chat("y")
    assert result.text == "next"


async def test_abort_during_tool_finalizes_call(store):
    started = asyncio.Event()

    @tool
    async def slow(seconds: float) -> str:
        """Sleep."""
        started.set()
        await asyncio.sleep(seconds)
        return "done"

    agent = Think(store, model=ScriptedModel([reply(tool_call("slow", {"seconds": 10}))]))
    agent.get_tools = lambda: {"slow": slow}
    run = agent.start_chat("go")
    await started.wait()
    agent.abort()
    result = await asyncio.wait_for(run.task, 2)
    assert result.status == "aborted"
    part = [p for p in agent.get_history()[-1]["parts"] if p["type"] == "dynamic-tool"][0]
    assert part["state"] == "output-error"
    assert "aborted" in part["errorText"]


async def test_a_blocking_tool_runs_off_the_event_loop(store):
    """A plain ``def`` tool may block; the loop must keep serving meanwhile (control
    calls, an agent host's other agents). The tool waits for an event only a task on
    the loop sets: on the loop itself it could never see it."""
    loop_ran = threading.Event()
    seen: dict[str, bool] = {}

    @tool
    def blocking() -> str:
        """Wait for the loop."""
        seen["started"] = True
        seen["loop ran meanwhile"] = loop_ran.wait(timeout=30)
        return "done"

    async def on_the_loop() -> None:
        while "started" not in seen:
            await asyncio.sleep(0.01)
        loop_ran.set()

    agent = Think(store, model=ScriptedModel([reply(tool_call("blocking", {})), reply("ok")]))
    agent.get_tools = lambda: {"blocking": blocking}
    helper = asyncio.ensure_future(on_the_loop())
    result = await agent.chat("go")
    await helper
    assert result.status == "completed"
    assert seen["loop ran meanwhile"] is True


async def test_an_abort_stops_waiting_for_a_blocking_tool(store):
    release = threading.Event()
    started = threading.Event()

    @tool
    def stuck() -> str:
        """Block until released."""
        started.set()
        release.wait(timeout=30)
        return "late"

    agent = Think(store, model=ScriptedModel([reply(tool_call("stuck", {}))]))
    agent.get_tools = lambda: {"stuck": stuck}
    run = agent.start_chat("go")
    await asyncio.to_thread(started.wait, 30)
    agent.abort()  # the loop is free to take it while the tool still blocks
    result = await asyncio.wait_for(run.task, 30)
    release.set()
    assert result.status == "aborted"
    part = [p for p in agent.get_history()[-1]["parts"] if p["type"] == "dynamic-tool"][0]
    assert part["state"] == "output-error"


# -- busy -------------------------------------------------------------------------------


async def test_second_run_is_rejected_while_busy(store):
    agent = Think(store, model=ScriptedModel([reply("a", pause(0.2), "b"), reply("c")]))
    run = agent.start_chat("first")
    with pytest.raises(SessionBusyError):
        await agent.chat("second")
    assert agent.get_status().state == "busy"
    await run.task
    assert [m["role"] for m in agent.get_history()] == ["user", "assistant"]
    assert (await agent.chat("second")).text == "c"


# -- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        {"role": "user", "parts": [{"type": "text", "text": "no id"}]},
        {"id": "", "role": "user", "parts": [{"type": "text", "text": "x"}]},
        {"id": "m", "role": "robot", "parts": [{"type": "text", "text": "x"}]},
        {"id": "m", "role": "user", "parts": [{"type": "nonsense"}]},
        {"id": "m", "role": "user", "parts": [{"type": "text"}]},
        {"id": "m", "role": "user", "parts": []},
        {"id": "m", "role": "user", "parts": "text"},
    ],
)
async def test_malformed_message_rejected_before_write(store, bad):
    agent = Think(store, model=ScriptedModel([reply("x")]))
    sid = agent.create_session().id
    with pytest.raises(InvalidMessageError):
        await agent.chat(bad)
    assert agent.message_count(sid) == 0
    assert agent.get_status(sid).state == "idle"


async def test_unknown_session_is_an_error_not_a_create(store):
    agent = Think(store, model=ScriptedModel([reply("x")]))
    with pytest.raises(SessionNotFoundError):
        await agent.chat("hi", session_id="nope")
    with pytest.raises(SessionNotFoundError):
        agent.switch_session("nope")
    assert agent.get_sessions() == []


# -- richer input -----------------------------------------------------------------------


async def test_uimessage_with_file_part(store):
    model = ScriptedModel([reply("seen")])
    agent = Think(store, model=model)
    msg = {
        "id": "u-img",
        "role": "user",
        "metadata": {"client": "web"},
        "parts": [
            {"type": "text", "text": "what is this?"},
            {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,iVBORw0KGgo="},
        ],
    }
    await agent.chat(msg)
    content = model.requests[0].messages[0].content
    assert [c.type for c in content] == ["text", "file"]
    assert content[1].data == "iVBORw0KGgo=" and content[1].media_type == "image/png"
    stored = agent.get_history()[0]
    assert stored["metadata"] == {"client": "web"} and len(stored["parts"]) == 2


async def test_multi_part_text(store):
    model = ScriptedModel([reply("ok")])
    agent = Think(store, model=model)
    await agent.chat(
        {
            "id": "u2",
            "role": "user",
            "parts": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        }
    )
    assert [c.text for c in model.requests[0].messages[0].content] == ["a", "b"]


# -- agentic loop -----------------------------------------------------------------------


@tool
def get_weather(city: str, unit: str = "c") -> dict:
    """Current weather for a city."""
    return {"city": city, "temp": 21 if unit == "c" else 70}


async def test_tool_loop_runs_until_no_tool_calls(store, collector):
    model = ScriptedModel(
        [
            reply("Checking.", tool_call("get_weather", {"city": "Paris"}, id="c1")),
            reply("It is 21 degrees."),
        ]
    )
    agent = Think(store, model=model)
    agent.get_tools = lambda: {"get_weather": get_weather}
    result = await agent.chat("weather?", collector)
    assert result.steps == 2 and result.text == "Checking.It is 21 degrees."
    tool_part = [p for p in agent.get_history()[-1]["parts"] if p["type"] == "dynamic-tool"][0]
    assert tool_part["state"] == "output-available"
    assert tool_part["input"] == {"city": "Paris"}
    assert tool_part["output"] == {"city": "Paris", "temp": 21}
    # the second request carries the call and its result
    second = model.requests[1].messages
    assert [m.role for m in second] == ["user", "assistant", "tool"]
    assert second[2].content[0].output == {"city": "Paris", "temp": 21}
    types = collector.types()
    assert types.index("tool-input-start") < types.index("tool-input-delta")
    assert types.index("tool-input-available") < types.index("tool-output-available")
    assert types.count("start-step") == 2 and types.count("finish-step") == 2


async def test_tool_spec_from_typed_function(store):
    model = ScriptedModel([reply("x")])
    agent = Think(store, model=model)
    agent.get_tools = lambda: {"get_weather": get_weather}
    await agent.chat("q")
    spec = model.requests[0].tools[0]
    assert spec.name == "get_weather" and spec.description == "Current weather for a city."
    assert spec.input_schema["required"] == ["city"]
    assert spec.input_schema["properties"]["city"]["type"] == "string"


def test_tools_rebuilt_at_every_wake_reuse_their_input_model():
    """get_tools() builds its tools at each wake, often as closures: one model per
    signature, not per call, and a different signature gets its own."""

    def make(unit: str):
        @tool
        def temperature(city: str, days: int = 1) -> str:
            """Forecast."""
            return f"{city} {days} {unit}"

        return temperature

    def other(city: int) -> str:
        return str(city)

    first, second = make("C"), make("F")
    assert first.input_model is second.input_model
    assert first.input_schema is second.input_schema
    assert first.validate({"city": "Oslo"}).days == 1  # type: ignore[attr-defined]
    renamed = tool(other, name="temperature")
    assert renamed.input_model is not first.input_model
    assert renamed.input_schema["properties"]["city"]["type"] == "integer"

    def unhashable(tags: list = [1]) -> str:  # noqa: B006 - an unhashable default
        return str(tags)

    assert tool(unhashable).validate({}).tags == [1]  # built, just not cached


async def test_invalid_tool_arguments_never_run_the_tool(store):
    calls = []

    class Args(BaseModel):
        count: int

    t = tool_from_model("count_it", Args, lambda a: calls.append(a.count) or a.count)
    model = ScriptedModel(
        [reply(tool_call("count_it", {"count": "many"}, id="bad")), reply("sorry")]
    )
    agent = Think(store, model=model)
    agent.get_tools = lambda: {"count_it": t}
    result = await agent.chat("go")
    assert calls == []
    assert result.status == "completed"
    part = [p for p in agent.get_history()[-1]["parts"] if p["type"] == "dynamic-tool"][0]
    assert part["state"] == "output-error" and "count" in part["errorText"]
    result_msg = model.requests[1].messages[-1]
    assert result_msg.role == "tool" and result_msg.content[0].is_error


async def test_unknown_tool_and_raising_tool_become_tool_errors(store):
    @tool
    def explode() -> str:
        """Always fails."""
        raise RuntimeError("kaboom")

    model = ScriptedModel(
        [
            reply(tool_call("nope", {}, id="a"), tool_call("explode", {}, id="b")),
            reply("recovered"),
        ]
    )
    agent = Think(store, model=model)
    agent.get_tools = lambda: {"explode": explode}
    result = await agent.chat("go")
    assert result.text == "recovered"
    errors = {c.tool_call_id: c.output for c in model.requests[1].messages[-1].content}
    assert "unknown tool" in errors["a"] and "kaboom" in errors["b"]


async def test_step_limit(store):
    model = ScriptedModel([reply(tool_call("get_weather", {"city": "X"}))], loop=True)

    class Limited(Think):
        def get_max_steps(self):
            return 3

        def get_tools(self):
            return {"get_weather": get_weather}

    agent = Limited(store, model=model)
    result = await agent.chat("loop forever")
    assert result.steps == 3 and len(model.requests) == 3


async def test_assemble_context_prunes_older_tool_calls(store):
    model = ScriptedModel(
        [
            reply(tool_call("get_weather", {"city": "A"})),
            reply("A done"),
            reply("plain"),
        ]
    )
    agent = Think(store, model=model)
    agent.get_tools = lambda: {"get_weather": get_weather}
    await agent.chat("one")
    await agent.chat("two")
    last = model.requests[-1].messages
    kinds = [c.type for m in last for c in m.content]
    assert "tool-call" not in kinds and "tool-result" not in kinds
    assert [m.role for m in last] == ["user", "assistant", "user"]


async def test_context_assembly_override(store):
    model = ScriptedModel([reply("ok")])

    class WithMemory(Think):
        async def assemble_context(self, options):
            from thinkray.runtime.models.base import ModelMessage, TextContent

            base = await super().assemble_context(options)
            return [ModelMessage(role="user", content=[TextContent(text="MEMORY")]), *base]

    agent = WithMemory(store, model=model)
    await agent.chat("hi")
    assert model.requests[0].messages[0].content[0].text == "MEMORY"


async def test_function_model_and_usage_rollup(store):
    def respond(request, step):
        return reply(
            f"you said {last_user_text(request)}",
            usage={"input": 7, "output": 3, "cache_read": 100},
        )

    agent = Think(store, model=FunctionModel(respond))
    result = await agent.chat("hey")
    assert result.text == "you said hey"
    meta = agent.get_history()[-1]["metadata"]
    assert meta["usage"] == {
        "input": 7,
        "output": 3,
        "reasoning": 0,
        "cache_read": 100,
        "cache_write": 0,
    }
    session = agent.get_session()
    assert session.usage["prompt_tokens"] == 7
    assert session.usage["cache_read"] == 100
    assert session.usage["cost_usd"] is None
    assert session.context_window_used == 110


def test_usage_mapping_excludes_cache_once():
    ai = Usage.from_ai_sdk(
        {
            "inputTokens": 150,
            "outputTokens": 20,
            "inputTokenDetails": {"cacheReadTokens": 100, "cacheWriteTokens": 30},
        }
    )
    assert (ai.input, ai.cache_read, ai.cache_write) == (20, 100, 30)
    an = Usage.from_anthropic(
        {
            "input_tokens": 20,
            "output_tokens": 5,
            "cache_read_input_tokens": 100,
            "cache_creation_input_tokens": 30,
        }
    )
    assert (an.input, an.cache_read, an.cache_write, an.total) == (20, 100, 30, 155)


async def test_callback_that_fails_is_detached_not_fatal(store):
    class Flaky(Collector):
        def on_event(self, chunk):
            super().on_event(chunk)
            if len(self.events) == 3:
                raise ConnectionError("client went away")

    cb = Flaky()
    agent = Think(store, model=ScriptedModel([reply("a", "b", "c", "d")]))
    result = await agent.chat("x", cb)
    assert result.status == "completed" and result.text == "abcd"
    assert len(cb.events) == 3
