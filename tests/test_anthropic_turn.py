"""A whole Think turn on the real anthropic SDK against the local fake server:
tool loop with partial JSON, thinking sent back with its signature, usage with cache
fields rolled up once, a 529 retried by the loop (status "retrying"), and a mid-stream
error event that keeps the partial output."""

from __future__ import annotations

import json

import pytest
from fake_anthropic import (
    FakeAnthropicServer,
    message,
    mid_stream_error,
    overloaded,
    text,
    thinking,
    tool_use,
)
from thinkray.runtime import Think, tool
from thinkray.runtime.models.anthropic import AnthropicModel
from thinkray.runtime.turn.loop import RetryPolicy


@tool
def get_weather(city: str) -> dict:
    """Weather for a city."""
    return {"city": city, "temp_c": 14}


@pytest.fixture
def fake():
    with FakeAnthropicServer() as server:
        yield server


def agent_for(fake: FakeAnthropicServer, store) -> Think:
    class Claude(Think):
        retry_policy = RetryPolicy(max_retries=2, base_delay=0.01)

        def get_tools(self):
            return {"get_weather": get_weather}

    return Claude(store, model=AnthropicModel(api_key="test-key", base_url=fake.base_url))


async def test_tool_loop_with_thinking_and_cache_usage(fake, store, collector):
    fake.enqueue(
        message(
            thinking("I should call the tool.", signature="sig-1"),
            text("Checking."),
            tool_use("toolu_1", "get_weather", {"city": "Paris"}, chunks=4),
            stop_reason="tool_use",
            input_tokens=20,
            output_tokens=12,
            cache_read_input_tokens=100,
            cache_creation_input_tokens=30,
        ),
        message(text("It is 14 degrees in Paris."), input_tokens=40, output_tokens=8),
    )
    agent = agent_for(fake, store)
    result = await agent.chat("Weather in Paris?", collector)
    assert result.status == "completed" and result.steps == 2
    assert result.text == "Checking.It is 14 degrees in Paris."
    deltas = [c for c in collector.events if c["type"] == "tool-input-delta"]
    assert len(deltas) >= 2  # partial JSON arrived in pieces
    part = [p for p in agent.get_history()[-1]["parts"] if p["type"] == "dynamic-tool"][0]
    assert part["input"] == {"city": "Paris"} and part["output"]["temp_c"] == 14
    # the second request carried the thinking block with its signature and the result
    second = fake.bodies[1]
    assistant = [m for m in second["messages"] if m["role"] == "assistant"][0]
    assert assistant["content"][0] == {
        "type": "thinking",
        "thinking": "I should call the tool.",
        "signature": "sig-1",
    }
    results = [
        b
        for m in second["messages"]
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]
    assert results[0]["tool_use_id"] == "toolu_1"
    usage = agent.get_session().usage
    assert usage["prompt_tokens"] == 60  # input excludes cache, summed over steps
    assert usage["cache_read"] == 100 and usage["cache_write"] == 30
    assert usage["completion_tokens"] == 20
    assert agent.get_history()[-1]["metadata"]["usage"]["cache_read"] == 100


async def test_529_is_retried_by_the_loop_with_status(fake, store):
    fake.enqueue(overloaded(retry_after_ms=10), message(text("Recovered.")))
    agent = agent_for(fake, store)
    states = []
    agent.status.subscribe(lambda sid, st: states.append((st.state, st.attempt)))
    result = await agent.chat("hi")
    assert result.text == "Recovered."
    assert ("retrying", 1) in states and states[-1][0] == "idle"
    assert len(fake.requests) == 2


async def test_mid_stream_error_keeps_partial_output(fake, store, collector):
    full = message(text("Partial answer that will be cut", chunks=6))
    fake.enqueue(mid_stream_error(full, after=5))
    agent = agent_for(fake, store)
    result = await agent.chat("hi", collector)
    assert result.status == "error" and "Overloaded" in result.error
    streamed = "".join(c["delta"] for c in collector.events if c["type"] == "text-delta")
    assert streamed  # something streamed before the error event
    stored = agent.get_history()[-1]
    assert stored["role"] == "assistant"
    assert "".join(p.get("text", "") for p in stored["parts"] if p["type"] == "text") == streamed


# -- issue 9, items 6-9: what a user of the real SDK hits ------------------------------------


@tool
def forecast(city: str, unit: str = "C", days: int = 1) -> dict:
    """Forecast for a city."""
    return {"city": city, "unit": unit, "days": days, "temp": 14}


def forecaster(fake: FakeAnthropicServer, store, **model_options) -> Think:
    class Forecaster(Think):
        retry_policy = RetryPolicy(max_retries=2, base_delay=0.01)

        def get_tools(self):
            return {"forecast": forecast}

    model = AnthropicModel(api_key="test-key", base_url=fake.base_url, **model_options)
    return Forecaster(store, model=model)


def tool_uses(body: dict) -> list[dict]:
    return [
        b
        for m in body["messages"]
        if m["role"] == "assistant"
        for b in m["content"]
        if b["type"] == "tool_use"
    ]


def markers(body: dict) -> list[str]:
    """Where a request put cache_control breakpoints."""
    found = [f"tools.{i}" for i, t in enumerate(body.get("tools") or []) if "cache_control" in t]
    system = body.get("system")
    if isinstance(system, list):
        found += [f"system.{i}" for i, b in enumerate(system) if "cache_control" in b]
    for m, msg in enumerate(body["messages"]):
        content = msg["content"] if isinstance(msg["content"], list) else []
        found += [f"messages.{m}.{i}" for i, b in enumerate(content) if "cache_control" in b]
    return found


async def test_typed_tool_call_goes_back_exactly_as_the_model_streamed_it(fake, store):
    """Item 6: the second request of a tool loop showed the model
    ``{"_raw_input": {...}}`` for a typed ``@tool`` (the validated object, wrapped)."""
    streamed = {"city": "Paris", "days": 3}  # ``unit`` left to its default
    fake.enqueue(
        message(
            text("Let me look."),
            tool_use("toolu_typed", "forecast", streamed, chunks=5),
            stop_reason="tool_use",
        ),
        message(text("14 degrees for three days.")),
        message(text("You are welcome.")),
    )
    agent = forecaster(fake, store)
    agent.prune_keep_last = 10  # the next turn carries the call too (default prunes it)
    result = await agent.chat("Forecast for Paris?")
    assert result.status == "completed" and result.steps == 2
    # The tool ran with the validated input (default filled in) ...
    part = [p for p in result.message["parts"] if p["type"] == "dynamic-tool"][0]
    assert part["output"] == {"city": "Paris", "unit": "C", "days": 3, "temp": 14}
    # ... but the model is shown exactly the arguments it produced, in this turn's
    # second request and in the next turn's (read back from the store).
    await agent.chat("Thanks!")
    assert len(fake.bodies) == 3
    for body in fake.bodies[1:]:
        [call] = tool_uses(body)
        assert call == {
            "type": "tool_use",
            "id": "toolu_typed",
            "name": "forecast",
            "input": streamed,
            **({"cache_control": call["cache_control"]} if "cache_control" in call else {}),
        }


async def test_prompt_cache_is_read_on_the_next_turn(store):
    """Item 7: breakpoints on the last tool, the system prompt and the conversation tail;
    the second turn reads the first turn's prompt from the cache."""
    with FakeAnthropicServer(simulate_usage=True) as fake:
        fake.enqueue(message(text("Hello there.")), message(text("Hello again.")))
        agent = forecaster(fake, store)
        await agent.chat("first question")
        await agent.chat("second question")
    first, second = fake.requests
    for recorded in (first, second):
        body = recorded.body
        assert len(markers(body)) <= 4
        assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
        assert body["system"][-1]["cache_control"] == {"type": "ephemeral"}
        assert body["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert first.usage["cache_read_input_tokens"] == 0
    assert first.usage["cache_creation_input_tokens"] > 0
    # All of the first prompt (tools, system, first question) is read back.
    assert second.usage["cache_read_input_tokens"] == first.usage["cache_creation_input_tokens"]
    assert agent.get_history()[-1]["metadata"]["usage"]["cache_read"] > 0
    assert agent.get_session().usage["cache_read"] == second.usage["cache_read_input_tokens"]


async def test_prompt_caching_can_be_turned_off(store):
    with FakeAnthropicServer(simulate_usage=True) as fake:
        fake.enqueue(message(text("a")), message(text("b")))
        agent = forecaster(fake, store, prompt_caching=False)
        await agent.chat("one")
        await agent.chat("two")
    assert all(markers(r.body) == [] for r in fake.requests)
    assert all("cache_control" not in json.dumps(r.body) for r in fake.requests)
    assert [r.usage["cache_read_input_tokens"] for r in fake.requests] == [0, 0]
    assert agent.get_session().usage["cache_read"] == 0


async def test_context_window_used_is_what_the_next_request_carries(store):
    """Item 8: after a two-step turn the rollup added both steps' cache reads; the
    context is the last call's input + cache read + cache write, plus its output."""
    with FakeAnthropicServer(simulate_usage=True) as fake:
        fake.enqueue(
            message(
                tool_use("toolu_ctx", "forecast", {"city": "Oslo"}),
                stop_reason="tool_use",
                output_tokens=30,
            ),
            message(text("Cold in Oslo."), output_tokens=12),
        )
        agent = forecaster(fake, store)
        result = await agent.chat("Forecast for Oslo?")
    assert result.steps == 2
    first, second = (r.usage for r in fake.requests)
    assert second["cache_read_input_tokens"] > 0  # the second step re-read the first's prompt

    def carried(u: dict) -> int:
        return (
            u["input_tokens"]
            + u["cache_read_input_tokens"]
            + u["cache_creation_input_tokens"]
            + u["output_tokens"]
        )

    session = agent.get_session()
    assert session.context_window_used == carried(second)
    # What was billed still adds up every step.
    assert session.usage["total_tokens"] == carried(first) + carried(second)
    assert session.usage["cache_read"] == (
        first["cache_read_input_tokens"] + second["cache_read_input_tokens"]
    )


async def test_wrong_api_key_names_the_status_and_the_fix(store):
    """Item 9: the API's 401 said only "invalid x-api-key"."""
    with FakeAnthropicServer(api_key="the-right-key") as fake:
        fake.enqueue(message(text("never sent")))
        agent = Think(store, model=AnthropicModel(api_key="a-wrong-key", base_url=fake.base_url))
        result = await agent.chat("hi")
        assert fake.pending == 1  # refused before any model work
    assert result.status == "error"
    assert "401" in result.error and "invalid x-api-key" in result.error
    assert "ANTHROPIC_API_KEY" in result.error


async def test_missing_api_key_names_the_fix(fake, store, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    agent = Think(store, model=AnthropicModel(base_url=fake.base_url))
    result = await agent.chat("hi")
    assert result.status == "error" and "ANTHROPIC_API_KEY" in result.error
    assert fake.requests == []


async def test_usage_of_a_step_cut_by_a_stream_error_is_recorded(fake, store):
    """Item 9: the input (and cache) of a step that ended in an SSE ``error`` frame was
    billed; it is recorded on the message and the session, not zeroed."""
    full = message(
        text("A long answer that overloads", chunks=6),
        input_tokens=200,
        cache_read_input_tokens=1_000,
        cache_creation_input_tokens=40,
    )
    fake.enqueue(mid_stream_error(full, after=6))
    agent = agent_for(fake, store)
    result = await agent.chat("hi")
    assert result.status == "error" and "Overloaded" in result.error
    expected = {"input": 200, "output": 1, "reasoning": 0, "cache_read": 1_000, "cache_write": 40}
    assert result.usage == expected
    assert agent.get_history()[-1]["metadata"]["usage"] == expected
    session = agent.get_session()
    assert session.usage["prompt_tokens"] == 200 and session.usage["cache_read"] == 1_000
    assert session.context_window_used == 1_241


async def test_chat_spans_carry_the_real_sdks_response(fake, store):
    """Through the real anthropic SDK: the chat span names the provider, the model asked
    for and the one that answered, the response id, the usage with cache tokens."""
    from tests.otel_support import in_memory_spans

    fake.enqueue(
        message(
            text("Hi."),
            input_tokens=20,
            output_tokens=3,
            cache_read_input_tokens=100,
            cache_creation_input_tokens=30,
        )
    )
    agent = agent_for(fake, store)
    with in_memory_spans() as (_, spans):
        assert (await agent.chat("hello")).status == "completed"
    (chat,) = [s for s in spans.get_finished_spans() if s.name.startswith("chat ")]
    a = chat.attributes
    assert a["gen_ai.provider.name"] == "anthropic"
    assert chat.name == f"chat {a['gen_ai.request.model']}"
    assert a["gen_ai.response.id"].startswith("msg_")
    assert a["gen_ai.response.model"]
    assert a["gen_ai.usage.input_tokens"] == 150
    assert a["gen_ai.usage.cache_read.input_tokens"] == 100
    assert a["gen_ai.usage.cache_creation.input_tokens"] == 30
    assert a["gen_ai.response.finish_reasons"] == ("stop",)
