"""The Anthropic adapter through the real ``anthropic`` SDK against a local fake API."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fake_anthropic import (
    FakeAnthropicServer,
    SSEResponse,
    http_error,
    invalid_request,
    message,
    mid_stream_error,
    overloaded,
    rate_limited,
    redacted_thinking,
    text,
    thinking,
    tool_use,
)
from thinkray.runtime.models.anthropic import AnthropicModel
from thinkray.runtime.models.base import (
    FileContent,
    Model,
    ModelError,
    ModelMessage,
    ModelRequest,
    ReasoningContent,
    ReasoningDelta,
    ReasoningEnd,
    ReasoningStart,
    StepFinish,
    TextContent,
    TextDelta,
    TextEnd,
    TextStart,
    ToolCall,
    ToolCallContent,
    ToolInputDelta,
    ToolInputStart,
    ToolResultContent,
    ToolSpec,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake():
    with FakeAnthropicServer() as server:
        yield server


@pytest.fixture
async def claude(fake: FakeAnthropicServer):
    m = AnthropicModel(api_key="test-key", base_url=fake.base_url)
    yield m
    await m.aclose()


def hello() -> ModelRequest:
    return ModelRequest(messages=[ModelMessage(role="user", content=[TextContent(text="hi")])])


async def collect(model: AnthropicModel, request: ModelRequest | None = None) -> list[Any]:
    return [e async for e in model.stream(request or hello())]


def types(events: list[Any]) -> list[str]:
    return [e.type for e in events]


# -- the client ----------------------------------------------------------------------------


async def test_adapters_built_per_turn_share_one_client_and_its_connection(fake) -> None:
    """An agent whose get_model() builds an adapter per turn made a client, an SSL
    context and a TLS connection per turn: adapters with the same settings now share
    the loop's client and its kept-alive connection; other settings get their own."""
    first = AnthropicModel(api_key="test-key", base_url=fake.base_url)
    second = AnthropicModel("claude-haiku-4-5", api_key="test-key", base_url=fake.base_url)
    other_key = AnthropicModel(api_key="another-key", base_url=fake.base_url)
    for _ in range(3):
        fake.enqueue(message(text("hi")))
    await collect(first)
    await first.aclose()  # lets go of the client, which the others share: it stays open
    await collect(second)
    await collect(other_key)
    peers = [r.peer for r in fake.requests]
    assert peers[0] == peers[1] and peers[2] != peers[0], peers
    assert second._client is not None and second._client is not other_key._client
    assert AnthropicModel(api_key="test-key", base_url=fake.base_url)._client is None  # lazy
    third = AnthropicModel(api_key="test-key", base_url=fake.base_url)
    fake.enqueue(message(text("again")))
    await collect(third)
    assert third._client is second._client and fake.requests[-1].peer == peers[0]


# -- streaming ------------------------------------------------------------------------------


async def test_is_a_model(claude: AnthropicModel) -> None:
    assert isinstance(claude, Model)
    assert claude.provider_id == "anthropic"
    assert claude.max_output_tokens == 64_000
    assert claude.context_window == 200_000


async def test_text_streams_as_several_deltas_in_order(fake, claude) -> None:
    fake.enqueue(message(text("Hello there, streaming world!", chunks=4), message_id="msg_1"))
    events = await collect(claude)
    assert types(events) == [
        "text-start",
        "text-delta",
        "text-delta",
        "text-delta",
        "text-delta",
        "text-end",
        "step-finish",
    ]
    assert events[0] == TextStart(id="msg_1:0")
    assert all(e.id == "msg_1:0" for e in events[:-1])
    assert "".join(e.delta for e in events if isinstance(e, TextDelta)) == (
        "Hello there, streaming world!"
    )
    assert isinstance(events[-1], StepFinish)
    assert events[-1].finish_reason == "stop"


async def test_tool_use_streams_partial_json_then_a_tool_call(fake, claude) -> None:
    args = {"city": "Paris", "units": "metric", "days": [1, 2, 3]}
    fake.enqueue(
        message(
            text("Let me check."),
            tool_use("toolu_01A", "get_weather", args, chunks=5),
            stop_reason="tool_use",
            message_id="msg_2",
        )
    )
    events = await collect(claude)
    tool_events = [e for e in events if isinstance(e, ToolInputStart | ToolInputDelta | ToolCall)]
    assert tool_events[0] == ToolInputStart(id="toolu_01A", tool_name="get_weather")
    deltas = [e for e in tool_events if isinstance(e, ToolInputDelta)]
    # The API's leading empty partial_json is not surfaced; the rest arrive as pieces.
    assert len(deltas) == 5
    assert all(d.id == "toolu_01A" and d.delta for d in deltas)
    call = tool_events[-1]
    assert isinstance(call, ToolCall)
    assert call.tool_call_id == "toolu_01A"
    assert call.tool_name == "get_weather"
    assert call.input == "".join(d.delta for d in deltas)
    assert json.loads(call.input) == args
    # Text block closed before the tool block opened, in block order.
    assert types(events).index("text-end") < types(events).index("tool-input-start")
    assert events[-1].finish_reason == "tool-calls"
    assert events[-1].raw_finish_reason == "tool_use"


async def test_tool_use_without_input_gives_empty_object(fake, claude) -> None:
    fake.enqueue(message(tool_use("toolu_X", "now", {}), stop_reason="tool_use"))
    events = await collect(claude)
    calls = [e for e in events if isinstance(e, ToolCall)]
    # json.dumps({}) == "{}" streams as pieces; also cover the truly empty case below.
    assert json.loads(calls[0].input) == {}

    empty = message(tool_use("toolu_Y", "now", {}), stop_reason="tool_use")
    events = [ev for ev in empty.events if ev[1].get("delta", {}).get("partial_json") is None]
    fake.enqueue(SSEResponse(events=events))
    events = await collect(claude)
    assert [e for e in events if isinstance(e, ToolCall)][0].input == "{}"
    assert not [e for e in events if isinstance(e, ToolInputDelta)]


async def test_thinking_with_signature_and_redacted_thinking(fake, claude) -> None:
    fake.enqueue(
        message(
            thinking("First, consider the question.", signature="sig-abc", chunks=3),
            redacted_thinking("EmwKAhgBEgy3va3pzix/LafPsn4a"),
            text("Answer.", chunks=1),
            message_id="msg_3",
        )
    )
    events = await collect(claude)
    assert types(events) == [
        "reasoning-start",
        "reasoning-delta",
        "reasoning-delta",
        "reasoning-delta",
        "reasoning-end",
        "reasoning-start",
        "reasoning-end",
        "text-start",
        "text-delta",
        "text-end",
        "step-finish",
    ]
    assert events[0] == ReasoningStart(id="msg_3:0")
    reasoning = "".join(e.delta for e in events if isinstance(e, ReasoningDelta))
    assert reasoning == "First, consider the question."
    assert events[4] == ReasoningEnd(id="msg_3:0", signature="sig-abc")
    assert events[6] == ReasoningEnd(
        id="msg_3:1", signature=None, redacted_data="EmwKAhgBEgy3va3pzix/LafPsn4a"
    )
    assert events[7] == TextStart(id="msg_3:2")
    assert events[9] == TextEnd(id="msg_3:2")


@pytest.mark.parametrize("repeats", [False, True])
async def test_usage_maps_cache_fields_once(fake, claude, repeats: bool) -> None:
    fake.enqueue(
        message(
            text("ok"),
            input_tokens=12,
            output_tokens=345,
            cache_read_input_tokens=1000,
            cache_creation_input_tokens=200,
            delta_repeats_input_usage=repeats,
        )
    )
    finish = (await collect(claude))[-1]
    assert isinstance(finish, StepFinish)
    u = finish.usage
    # input excludes cache tokens (as Anthropic reports it); output is message_delta's
    # final count, not message_start's initial 1; repeated fields are not added.
    assert (u.input, u.output, u.cache_read, u.cache_write, u.reasoning) == (12, 345, 1000, 200, 0)
    assert u.total == 12 + 345 + 1000 + 200


async def test_stop_reason_mapping(fake, claude) -> None:
    cases = {
        "end_turn": "stop",
        "stop_sequence": "stop",
        "tool_use": "tool-calls",
        "max_tokens": "length",
        "model_context_window_exceeded": "length",
        "refusal": "content-filter",
        "pause_turn": "other",
        "some_future_reason": "other",
    }
    for raw in cases:
        fake.enqueue(
            message(
                text("x"), stop_reason=raw, stop_sequence="END" if raw == "stop_sequence" else None
            )
        )
    for raw, expected in cases.items():
        finish = (await collect(claude))[-1]
        assert (finish.raw_finish_reason, finish.finish_reason) == (raw, expected)
        if raw == "stop_sequence":
            assert finish.provider_metadata["anthropic"]["stop_sequence"] == "END"


async def test_ping_only_and_empty_message(fake, claude) -> None:
    fake.enqueue(message())  # no content blocks at all
    events = await collect(claude)
    assert types(events) == ["step-finish"]


# -- request mapping ----------------------------------------------------------------------


async def test_request_mapping(fake) -> None:
    model = AnthropicModel(
        "claude-sonnet-4-5",
        api_key="test-key",
        base_url=fake.base_url,
        max_output_tokens=1000,
        prompt_caching=False,  # the breakpoints have their own tests below
    )
    fake.enqueue(message(text("done")))
    request = ModelRequest(
        system="You are terse.",
        messages=[
            ModelMessage(role="system", content=[TextContent(text="Today is Tuesday.")]),
            ModelMessage(role="user", content=[TextContent(text="Weather?")]),
            ModelMessage(
                role="user",
                content=[
                    FileContent(media_type="image/png", data="iVBORw0KGgo="),
                    FileContent(media_type="image/jpeg", data="https://x.test/a.jpg", url=True),
                    FileContent(media_type="application/pdf", data="JVBERi0=", filename="r.pdf"),
                ],
            ),
            ModelMessage(
                role="assistant",
                content=[
                    ReasoningContent(text="Need the tool.", signature="sig-1"),
                    ReasoningContent(text="", redacted_data="REDACTED=="),
                    ReasoningContent(text="unsigned, from elsewhere"),
                    TextContent(text="Checking."),
                    ToolCallContent(
                        tool_call_id="toolu_1", tool_name="weather", input='{"city": "Paris"}'
                    ),
                    ToolCallContent(tool_call_id="toolu_2", tool_name="clock", input={}),
                ],
            ),
            ModelMessage(
                role="tool",
                content=[
                    ToolResultContent(
                        tool_call_id="toolu_1", tool_name="weather", output={"temp": 21}
                    )
                ],
            ),
            ModelMessage(
                role="tool",
                content=[
                    ToolResultContent(
                        tool_call_id="toolu_2", tool_name="clock", output="boom", is_error=True
                    )
                ],
            ),
            ModelMessage(role="user", content=[TextContent(text="And tomorrow?")]),
        ],
        tools=[
            ToolSpec(
                name="weather",
                description="Get the weather",
                input_schema={"type": "object", "properties": {"city": {"type": "string"}}},
            )
        ],
        temperature=0.3,
        # top_k is a create() argument; future_flag is unknown to the SDK (-> extra_body).
        provider_options={"top_k": 5, "metadata": {"user_id": "u1"}, "future_flag": True},
    )
    events = await collect(model, request)
    assert events[-1].type == "step-finish"
    await model.aclose()

    (recorded,) = fake.requests
    assert recorded.path == "/v1/messages"
    body = recorded.body
    assert body["model"] == "claude-sonnet-4-5"
    assert body["stream"] is True
    assert body["max_tokens"] == 1000
    assert body["temperature"] == 0.3
    assert body["top_k"] == 5
    assert body["metadata"] == {"user_id": "u1"}
    assert body["future_flag"] is True
    assert "thinking" not in body
    assert body["system"] == "You are terse.\n\nToday is Tuesday."
    assert body["tools"] == [
        {
            "name": "weather",
            "description": "Get the weather",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    first, assistant, last = body["messages"]
    assert first["content"] == [
        {"type": "text", "text": "Weather?"},
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
        },
        {"type": "image", "source": {"type": "url", "url": "https://x.test/a.jpg"}},
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="},
            "title": "r.pdf",
        },
    ]
    assert assistant["content"] == [
        {"type": "thinking", "thinking": "Need the tool.", "signature": "sig-1"},
        {"type": "redacted_thinking", "data": "REDACTED=="},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "toolu_2", "name": "clock", "input": {}},
    ]
    # Two tool messages and the next user message merge into one user turn, results first.
    assert last["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": '{"temp": 21}'},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": True},
        {"type": "text", "text": "And tomorrow?"},
    ]
    assert recorded.headers["anthropic-version"]
    assert recorded.headers["x-stainless-retry-count"] == "0"


async def test_thinking_budget(fake) -> None:
    model = AnthropicModel(
        api_key="test-key", base_url=fake.base_url, thinking_budget=2048, max_output_tokens=1024
    )
    fake.enqueue(message(text("a")), message(text("b")))
    await collect(model, hello().model_copy(update={"temperature": 0.2}))
    body = fake.requests[-1].body
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    # max_tokens must exceed the budget; temperature is not allowed while thinking.
    assert body["max_tokens"] == 1024 + 2048
    assert "temperature" not in body

    # provider_options win over the adapter's default.
    await collect(
        model, hello().model_copy(update={"provider_options": {"thinking": {"type": "disabled"}}})
    )
    body = fake.requests[-1].body
    assert body["thinking"] == {"type": "disabled"}
    assert body["max_tokens"] == 1024
    await model.aclose()


# -- prompt caching ---------------------------------------------------------------------------

EPHEMERAL = {"type": "ephemeral"}


def tool_loop_request(**update: Any) -> ModelRequest:
    request = ModelRequest(
        system="You are terse.",
        messages=[
            ModelMessage(role="user", content=[TextContent(text="Weather?")]),
            ModelMessage(
                role="assistant",
                content=[
                    TextContent(text="Checking."),
                    ToolCallContent(tool_call_id="t1", tool_name="weather", input={"c": "P"}),
                ],
            ),
            ModelMessage(
                role="tool",
                content=[ToolResultContent(tool_call_id="t1", tool_name="weather", output="21")],
            ),
        ],
        tools=[
            ToolSpec(name=n, description=n, input_schema={"type": "object"}) for n in ("a", "b")
        ],
    )
    return request.model_copy(update=update)


def test_cache_breakpoints_by_default() -> None:
    params = AnthropicModel(api_key="k").build_params(tool_loop_request())
    assert params["system"] == [
        {"type": "text", "text": "You are terse.", "cache_control": EPHEMERAL}
    ]
    assert "cache_control" not in params["tools"][0]
    assert params["tools"][1]["cache_control"] == EPHEMERAL
    user, assistant, results = params["messages"]
    assert "cache_control" not in user["content"][0]
    # The tail, and the message before it as a fallback: four in all, the API's limit.
    assert results["content"][-1]["cache_control"] == EPHEMERAL
    assert assistant["content"][-1]["cache_control"] == EPHEMERAL
    assert "cache_control" not in assistant["content"][0]


def test_cache_breakpoints_skip_thinking_and_respect_the_limit() -> None:
    thinking_only = ModelMessage(
        role="assistant", content=[ReasoningContent(text="hmm", signature="sig")]
    )
    request = tool_loop_request(
        messages=[
            ModelMessage(role="user", content=[TextContent(text="q")]),
            thinking_only,
            ModelMessage(role="user", content=[TextContent(text="go on")]),
        ],
        # Caller-set markers count against the four.
        provider_options={
            "system": [
                {"type": "text", "text": "a", "cache_control": EPHEMERAL},
                {"type": "text", "text": "b", "cache_control": EPHEMERAL},
            ]
        },
    )
    params = AnthropicModel(api_key="k", cache_ttl="1h").build_params(request)
    marks = {"type": "ephemeral", "ttl": "1h"}
    assert params["messages"][-1]["content"][-1]["cache_control"] == marks
    assert params["tools"][-1]["cache_control"] == marks
    # The thinking block cannot carry one; the budget (4 - 2 - 2) is spent anyway.
    assert params["messages"][1]["content"] == [
        {"type": "thinking", "thinking": "hmm", "signature": "sig"}
    ]
    assert "cache_control" not in params["messages"][0]["content"][0]
    assert request.provider_options["system"][1] == {
        "type": "text",
        "text": "b",
        "cache_control": EPHEMERAL,
    }  # the caller's objects are not changed


def test_automatic_caching_or_off_means_no_breakpoints_of_ours() -> None:
    auto = tool_loop_request(provider_options={"cache_control": EPHEMERAL})
    params = AnthropicModel(api_key="k").build_params(auto)
    assert params["cache_control"] == EPHEMERAL
    assert "cache_control" not in json.dumps(
        {k: v for k, v in params.items() if k != "cache_control"}
    )
    off = AnthropicModel(api_key="k", prompt_caching=False).build_params(tool_loop_request())
    assert "cache_control" not in json.dumps(off) and off["system"] == "You are terse."


async def test_fake_server_rejects_a_fifth_breakpoint(fake, claude) -> None:
    # The API's limit, enforced by the fake so the adapter's count is tested for real
    # (here the caller set five; the adapter adds none once four are set).
    system = [{"type": "text", "text": str(i), "cache_control": EPHEMERAL} for i in range(5)]
    with pytest.raises(ModelError) as info:
        await collect(claude, hello().model_copy(update={"provider_options": {"system": system}}))
    assert info.value.status_code == 400
    assert "A maximum of 4 blocks with cache_control may be provided. Found 5." in str(info.value)
    assert fake.pending == 0 and len(fake.requests) == 1


# -- errors -----------------------------------------------------------------------------------


async def test_overloaded_is_transient_and_next_call_succeeds(fake, claude) -> None:
    fake.enqueue(overloaded(retry_after=2), message(text("fine now")))
    with pytest.raises(ModelError) as info:
        await collect(claude)
    err = info.value
    assert (err.transient, err.status_code, err.retry_after) == (True, 529, 2.0)
    assert str(err) == "Overloaded"
    assert len(fake.requests) == 1  # max_retries=0: the SDK did not retry on its own

    events = await collect(claude)
    assert events[-1].finish_reason == "stop"
    assert len(fake.requests) == 2


async def test_sdk_retry_when_enabled(fake) -> None:
    model = AnthropicModel(api_key="test-key", base_url=fake.base_url, max_retries=1)
    fake.enqueue(overloaded(retry_after_ms=10), message(text("after retry")))
    events = await collect(model)
    await model.aclose()
    assert "".join(e.delta for e in events if isinstance(e, TextDelta)) == "after retry"
    assert [r.headers["x-stainless-retry-count"] for r in fake.requests] == ["0", "1"]


async def test_rate_limit_and_server_errors_are_transient(fake, claude) -> None:
    fake.enqueue(
        rate_limited(retry_after=7),
        http_error(500, "api_error", "Internal server error"),
        http_error(503, "api_error", "Service unavailable", retry_after_ms=1500),
    )
    expected = [(429, 7.0), (500, None), (503, 1.5)]
    for status, retry_after in expected:
        with pytest.raises(ModelError) as info:
            await collect(claude)
        assert info.value.transient
        assert (info.value.status_code, info.value.retry_after) == (status, retry_after)


async def test_server_can_say_do_not_retry(fake, claude) -> None:
    fake.enqueue(http_error(500, "api_error", "no", headers={"x-should-retry": "false"}))
    with pytest.raises(ModelError) as info:
        await collect(claude)
    assert (info.value.transient, info.value.status_code) == (False, 500)


async def test_bad_request_is_not_transient(fake, claude) -> None:
    fake.enqueue(
        invalid_request("messages.0.content: text content blocks must be non-empty"),
        http_error(401, "authentication_error", "invalid x-api-key"),
    )
    with pytest.raises(ModelError) as info:
        await collect(claude)
    assert not info.value.transient
    assert info.value.status_code == 400
    assert str(info.value) == "messages.0.content: text content blocks must be non-empty"

    with pytest.raises(ModelError) as info:
        await collect(claude)
    assert (info.value.transient, info.value.status_code) == (False, 401)
    assert "invalid x-api-key" in str(info.value)


async def test_401_names_the_status_and_the_environment_variable() -> None:
    with FakeAnthropicServer(api_key="right") as server:
        model = AnthropicModel(api_key="wrong", base_url=server.base_url)
        with pytest.raises(ModelError) as info:
            await collect(model)
        await model.aclose()
    assert (info.value.transient, info.value.status_code) == (False, 401)
    message = str(info.value)
    assert message.startswith("Anthropic API 401 authentication_error: invalid x-api-key.")
    assert "ANTHROPIC_API_KEY" in message and "api_key=" in message


async def test_mid_stream_error_carries_the_usage_so_far(fake, claude) -> None:
    full = message(text("abcdefgh", chunks=4), input_tokens=70, cache_read_input_tokens=900)
    fake.enqueue(mid_stream_error(full, after=5))
    with pytest.raises(ModelError) as info:
        await collect(claude)
    usage = info.value.usage
    assert usage is not None
    assert (usage.input, usage.cache_read, usage.output) == (70, 900, 1)


@pytest.mark.parametrize(
    ("error_type", "transient", "status"),
    [("overloaded_error", True, 529), ("invalid_request_error", False, 400)],
)
async def test_mid_stream_error_after_events(fake, claude, error_type, transient, status) -> None:
    # message_start, content_block_start, ping, two deltas, then the error frame.
    full = message(text("abcdefgh", chunks=4), message_id="msg_mid")
    fake.enqueue(mid_stream_error(full, after=5, error_type=error_type, message="went wrong"))
    seen: list[Any] = []
    with pytest.raises(ModelError) as info:
        async for event in claude.stream(hello()):
            seen.append(event)
    assert types(seen) == ["text-start", "text-delta", "text-delta"]
    assert "".join(e.delta for e in seen[1:]) == "abcd"
    assert (info.value.transient, info.value.status_code) == (transient, status)
    assert str(info.value) == "went wrong"


async def test_stream_cut_before_message_stop_is_transient(fake, claude) -> None:
    full = message(text("partial"))
    fake.enqueue(SSEResponse(events=full.events[:-2]))  # no message_delta / message_stop
    seen: list[Any] = []
    with pytest.raises(ModelError) as info:
        async for event in claude.stream(hello()):
            seen.append(event)
    assert info.value.transient
    assert "step-finish" not in types(seen)
    assert types(seen)[-1] == "text-end"


async def test_connection_refused_is_transient() -> None:
    server = FakeAnthropicServer()
    base_url = server.base_url
    server.stop()  # bound, never served, now closed: nothing listens on the port
    model = AnthropicModel(api_key="test-key", base_url=base_url)
    with pytest.raises(ModelError) as info:
        await collect(model)
    await model.aclose()
    assert info.value.transient
    assert info.value.status_code is None


# -- cancellation and imports -----------------------------------------------------------------


async def test_cancel_mid_stream_closes_the_connection(fake, claude) -> None:
    fake.enqueue(message(text("x" * 40, chunks=40), delay=0.01, hang=True))
    first_delta = asyncio.Event()
    seen: list[Any] = []

    async def consume() -> None:
        async for event in claude.stream(hello()):
            seen.append(event)
            if isinstance(event, TextDelta):
                first_delta.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first_delta.wait(), 5)
    task.cancel()
    # the server hangs after its chunks (hang=True): only the cancel can end the stream
    with pytest.raises(asyncio.CancelledError):
        await task
    assert "step-finish" not in types(seen)
    # The server notices: its next write on the closed connection fails.
    assert await asyncio.to_thread(fake.client_disconnected.wait, 5)


def test_importing_the_adapter_does_not_import_anthropic() -> None:
    code = (
        "import sys, thinkray.runtime.models.anthropic as m; "
        "m.AnthropicModel(); "
        "assert 'anthropic' not in sys.modules, 'anthropic imported eagerly'"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
