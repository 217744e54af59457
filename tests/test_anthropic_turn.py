"""A whole Think turn on the real anthropic SDK against the local fake server:
tool loop with partial JSON, thinking sent back with its signature, usage with cache
fields rolled up once, a 529 retried by the loop (status "retrying"), and a mid-stream
error event that keeps the partial output."""

from __future__ import annotations

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
