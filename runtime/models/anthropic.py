"""The Anthropic adapter: one step of the streaming Messages API as :data:`ModelEvent`.

``anthropic`` is imported lazily, on the first call, because importing it costs about
a second and an actor that never talks to a model (a pooled one, a bridge) should not
pay it. The SDK's own retries are off by default (``max_retries=0``): the loop retries
transient :class:`ModelError`s itself, so status can say "retrying" and no step is
retried after it emitted output.

Usage is mapped once, at the end of the step, through :meth:`Usage.from_anthropic`; a
step cut by an error carries the usage reported so far on its :class:`ModelError`.

Prompt caching is on by default (``prompt_caching=False`` turns it off): every request
marks ``cache_control`` breakpoints, at most the API's four, on the conversation tail
(the last block of the last message), the last system block, the last tool, and the last
block of the message before the tail (a fallback when the tail's prefix is evicted). The
API caches ``tools`` → ``system`` → ``messages`` up to each breakpoint and, on the next
request, reads the longest cached prefix, so a turn re-reads the previous turn's prompt
at the cache price. A request whose ``provider_options`` set the top-level
``cache_control`` (automatic caching) gets no breakpoints of ours.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import importlib
import inspect
import json
import os
import sys
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from thinkray.runtime.models.base import (
    FileContent,
    FinishReason,
    ModelError,
    ModelEvent,
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
)
from thinkray.runtime.usage import Usage

if TYPE_CHECKING:
    from anthropic import AsyncAnthropic

# Output ceilings per model family (longest prefix wins); used when a request sets none.
_MAX_OUTPUT_TOKENS: dict[str, int] = {
    "claude-opus-4-1": 32_000,
    "claude-opus-4-0": 32_000,
    "claude-opus-4-2": 32_000,
    "claude-opus-4": 32_000,
    "claude-opus-4-5": 64_000,
    "claude-sonnet-4": 64_000,
    "claude-haiku-4": 64_000,
    "claude-3-7-sonnet": 64_000,
    "claude-3-5-sonnet": 8_192,
    "claude-3-5-haiku": 8_192,
    "claude-3-haiku": 4_096,
    "claude-3-opus": 4_096,
}
_DEFAULT_MAX_OUTPUT_TOKENS = 8_192

_FINISH_REASONS: dict[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool-calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content-filter",
    "pause_turn": "other",
}

# Error types the API sends in an SSE ``error`` frame that mean "try again later".
_TRANSIENT_ERROR_TYPES = frozenset({"overloaded_error", "api_error", "rate_limit_error"})
# The HTTP status an error type stands for, so a mid-stream error (whose HTTP status
# was 200) still reports a meaningful ``status_code``.
_ERROR_TYPE_STATUS: dict[str, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}

# The API accepts at most this many cache_control breakpoints per request.
MAX_CACHE_BREAKPOINTS = 4
# Blocks that cannot carry cache_control (they are cached as part of a later prefix).
_UNMARKABLE_BLOCKS = frozenset({"thinking", "redacted_thinking"})

_USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "output_tokens_details",
)


def default_max_output_tokens(model_id: str) -> int:
    """The output-token cap of ``model_id`` (by its longest known prefix; 8192 for a
    model this table does not know)."""
    best = ""
    for prefix in _MAX_OUTPUT_TOKENS:
        if model_id.startswith(prefix) and len(prefix) > len(best):
            best = prefix
    return _MAX_OUTPUT_TOKENS[best] if best else _DEFAULT_MAX_OUTPUT_TOKENS


def finish_reason(stop_reason: str | None) -> FinishReason:
    """Anthropic's ``stop_reason`` as the AI SDK finish reason (``"other"`` when
    unknown or missing)."""
    return _FINISH_REASONS.get(stop_reason or "", "other")


# Each event loop's clients, by the settings they were made with. An agent whose
# get_model() builds a new adapter for every turn (a common way to write it) would
# otherwise make a new HTTP client per turn: an SSL context (~20 ms of CPU) and a new
# TLS connection to the API each time. Adapters with the same settings share one client
# and its pooled connections instead; per loop, because a client's connections belong
# to the loop that opened them.
_SHARED_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[Any, ...], Any]]
_SHARED_CLIENTS = weakref.WeakKeyDictionary()


def _shared_client(anthropic: Any, kwargs: dict[str, Any]) -> Any:
    """The running loop's client for ``kwargs`` (made on first use, again if closed).
    The key includes the environment the SDK reads for what ``kwargs`` leaves out."""
    env = tuple(os.environ.get(k) for k in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"))
    key = (tuple(sorted(kwargs.items())), env)
    clients = _SHARED_CLIENTS.setdefault(asyncio.get_running_loop(), {})
    client = clients.get(key)
    if client is None or client.is_closed():
        client = clients[key] = anthropic.AsyncAnthropic(**kwargs)
    return client


class AnthropicModel:
    """:class:`thinkray.runtime.models.base.Model` over Anthropic's streaming Messages API.

    ``client`` may be a ready ``anthropic.AsyncAnthropic`` (then ``api_key``,
    ``base_url``, ``max_retries`` and ``timeout`` are ignored); without one, adapters
    with the same settings on one event loop share a client (and its connections), so
    building an adapter per turn costs no new client or TLS connection.
    ``thinking_budget`` turns on extended thinking for every request; a
    request's ``provider_options`` (merged last into the create call) can override it.
    ``prompt_caching`` marks cache breakpoints on every request (see the module
    docstring); ``cache_ttl`` picks the cache lifetime (the API's default is ``"5m"``).
    """

    provider_id = "anthropic"

    def __init__(
        self,
        model_id: str = "claude-sonnet-4-6",
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_output_tokens: int | None = None,
        context_window: int = 200_000,
        thinking_budget: int | None = None,
        max_retries: int = 0,
        timeout: float = 600.0,
        client: AsyncAnthropic | None = None,
        prompt_caching: bool = True,
        cache_ttl: Literal["5m", "1h"] | None = None,
    ) -> None:
        self.model_id = model_id
        self.prompt_caching = prompt_caching
        self.cache_ttl = cache_ttl
        self.context_window = context_window
        self.max_output_tokens = max_output_tokens or default_max_output_tokens(model_id)
        self.thinking_budget = thinking_budget
        self.max_retries = max_retries
        self.timeout = timeout
        self._api_key = api_key
        self._base_url = base_url
        self._client: Any = client
        self._anthropic: Any = None
        self._create_params: frozenset[str] | None = None

    def __repr__(self) -> str:
        return f"AnthropicModel({self.model_id!r})"

    # -- client ---------------------------------------------------------------------

    async def _ensure_client(self) -> Any:
        if self._anthropic is None:
            if "anthropic" in sys.modules:
                self._anthropic = sys.modules["anthropic"]
            else:
                # A second of imports would stall every other coroutine of the actor.
                self._anthropic = await asyncio.to_thread(importlib.import_module, "anthropic")
        if self._client is None:
            kwargs: dict[str, Any] = {"max_retries": self.max_retries, "timeout": self.timeout}
            if self._api_key is not None:
                kwargs["api_key"] = self._api_key
            if self._base_url is not None:
                kwargs["base_url"] = self._base_url
            self._client = _shared_client(self._anthropic, kwargs)
        if self._create_params is None:
            params = inspect.signature(self._client.messages.create).parameters.values()
            if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
                self._create_params = frozenset()  # takes anything: nothing to split
            else:
                self._create_params = frozenset(p.name for p in params)
        return self._client

    async def aclose(self) -> None:
        """Let go of the HTTP client. A client given to the adapter stays open, and so
        does the loop's shared one (other adapters with the same settings use it; its
        connections close with the loop)."""
        self._client = None

    # -- request --------------------------------------------------------------------

    def build_params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of ``client.messages.create`` for ``request``."""
        extra_system, messages = to_anthropic_messages(request.messages)
        system = "\n\n".join(s for s in [request.system, *extra_system] if s)
        params: dict[str, Any] = {
            "model": self.model_id,
            "max_tokens": request.max_output_tokens or self.max_output_tokens,
            "messages": messages,
        }
        if system:
            params["system"] = system
        if request.tools:
            params["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.input_schema}
                for t in request.tools
            ]
        if request.temperature is not None:
            params["temperature"] = request.temperature
        if self.thinking_budget:
            params["thinking"] = {"type": "enabled", "budget_tokens": self.thinking_budget}
        params.update(request.provider_options)

        thinking = params.get("thinking")
        if isinstance(thinking, Mapping) and thinking.get("type") == "enabled":
            budget = int(thinking.get("budget_tokens") or 0)
            # The API requires max_tokens > budget_tokens; the budget comes on top of
            # the visible output the caller asked for (as the AI SDK does).
            if params["max_tokens"] <= budget:
                params["max_tokens"] += budget
            # The API rejects any temperature but 1 while thinking.
            if "temperature" not in request.provider_options:
                params.pop("temperature", None)
        if self.prompt_caching and params.get("cache_control") is None:
            cache_control: dict[str, Any] = {"type": "ephemeral"}
            if self.cache_ttl:
                cache_control["ttl"] = self.cache_ttl
            add_cache_breakpoints(params, cache_control)
        return params

    def _split_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """Move options the installed SDK does not know into ``extra_body``."""
        params = {k: v for k, v in params.items() if k != "stream"}  # always streamed
        known = self._create_params or frozenset()
        if not known:
            return params
        out: dict[str, Any] = {}
        extra: dict[str, Any] = dict(params.get("extra_body") or {})
        for key, value in params.items():
            if key == "extra_body":
                continue
            if key in known:
                out[key] = value
            else:
                extra[key] = value
        if extra:
            out["extra_body"] = extra
        return out

    # -- the step -------------------------------------------------------------------

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """One streamed Messages API call for ``request`` (:meth:`build_params`), as
        model events ending with :class:`StepFinish`.

        Raises:
            ModelError: an API, connection or stream error (``transient`` where the
                loop should retry), or no API key configured. Its ``usage`` is what
                the stream reported before it broke, if anything.
        """
        params = self.build_params(request)
        client = await self._ensure_client()
        anthropic = self._anthropic
        transport_errors = _transport_error_types()
        kwargs = self._split_params(params)
        try:
            stream = await client.messages.create(**kwargs, stream=True)
        except anthropic.APIError as exc:
            raise to_model_error(exc) from exc
        except transport_errors as exc:
            raise ModelError(f"connection error: {exc!r}", transient=True) from exc
        except TypeError as exc:
            missing = _no_credentials_error(exc)
            if missing is None:
                raise
            raise missing from exc

        state = _StepState()
        try:
            async for event in stream:
                for out in state.handle(event):
                    yield out
            if not state.stopped:
                raise state.partial(ModelError("stream ended before message_stop", transient=True))
        except anthropic.APIError as exc:
            raise state.partial(to_model_error(exc)) from exc
        except transport_errors as exc:
            # Reading the body failed (the SDK does not wrap these).
            error = ModelError(f"stream interrupted: {exc!r}", transient=True)
            raise state.partial(error) from exc
        finally:
            # Also on cancel and on aclose(): release the connection now, not at GC.
            await stream.close()
        yield state.finish()


# -- event mapping -------------------------------------------------------------------------


@dataclass
class _Block:
    kind: str  # text | reasoning | redacted | tool | other
    id: str
    tool_name: str = ""
    json_parts: list[str] = field(default_factory=list)
    signature: str | None = None
    redacted_data: str | None = None


class _StepState:
    """Folds raw stream events of one message into :data:`ModelEvent`s."""

    def __init__(self) -> None:
        self.message_id = f"msg-{uuid.uuid4().hex[:12]}"
        self.model: str | None = None
        self.blocks: dict[int, _Block] = {}
        self.usage: dict[str, Any] = {}
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None
        self.stopped = False

    def _merge_usage(self, usage: Any) -> None:
        # message_delta usage is cumulative and may repeat message_start's input and
        # cache counts: the latest non-null value of each field wins, never a sum.
        if usage is None:
            return
        for name in _USAGE_FIELDS:
            value = getattr(usage, name, None)
            if value is not None:
                if hasattr(value, "model_dump"):
                    value = value.model_dump()
                self.usage[name] = value

    def handle(self, event: Any) -> list[ModelEvent]:
        kind = getattr(event, "type", None)
        if kind == "message_start":
            message = event.message
            self.message_id = message.id or self.message_id
            self.model = getattr(message, "model", None)
            self._merge_usage(getattr(message, "usage", None))
            return []
        if kind == "content_block_start":
            return self._start(event.index, event.content_block)
        if kind == "content_block_delta":
            return self._delta(event.index, event.delta)
        if kind == "content_block_stop":
            return self._stop(event.index)
        if kind == "message_delta":
            delta = event.delta
            if getattr(delta, "stop_reason", None) is not None:
                self.stop_reason = delta.stop_reason
            if getattr(delta, "stop_sequence", None) is not None:
                self.stop_sequence = delta.stop_sequence
            self._merge_usage(getattr(event, "usage", None))
            return []
        if kind == "message_stop":
            self.stopped = True
        return []

    def _start(self, index: int, block: Any) -> list[ModelEvent]:
        part_id = f"{self.message_id}:{index}"
        btype = getattr(block, "type", None)
        if btype == "text":
            self.blocks[index] = _Block("text", part_id)
            out: list[ModelEvent] = [TextStart(id=part_id)]
            if block.text:
                out.append(TextDelta(id=part_id, delta=block.text))
            return out
        if btype == "thinking":
            self.blocks[index] = _Block("reasoning", part_id, signature=block.signature or None)
            out = [ReasoningStart(id=part_id)]
            if block.thinking:
                out.append(ReasoningDelta(id=part_id, delta=block.thinking))
            return out
        if btype == "redacted_thinking":
            self.blocks[index] = _Block("redacted", part_id, redacted_data=block.data)
            return [ReasoningStart(id=part_id)]
        if btype == "tool_use":
            b = _Block("tool", block.id, tool_name=block.name)
            if block.input:
                b.json_parts.append(json.dumps(block.input))
            self.blocks[index] = b
            return [ToolInputStart(id=block.id, tool_name=block.name)]
        # Server tools and their results run on Anthropic's side; not ours to surface.
        self.blocks[index] = _Block("other", part_id)
        return []

    def _delta(self, index: int, delta: Any) -> list[ModelEvent]:
        b = self.blocks.get(index)
        if b is None:
            return []
        dtype = getattr(delta, "type", None)
        if dtype == "text_delta" and b.kind == "text":
            return [TextDelta(id=b.id, delta=delta.text)] if delta.text else []
        if dtype == "thinking_delta" and b.kind == "reasoning":
            return [ReasoningDelta(id=b.id, delta=delta.thinking)] if delta.thinking else []
        if dtype == "signature_delta" and b.kind == "reasoning":
            b.signature = (b.signature or "") + delta.signature
            return []
        if dtype == "input_json_delta" and b.kind == "tool":
            if not delta.partial_json:
                return []
            b.json_parts.append(delta.partial_json)
            return [ToolInputDelta(id=b.id, delta=delta.partial_json)]
        return []

    def _stop(self, index: int) -> list[ModelEvent]:
        b = self.blocks.pop(index, None)
        if b is None:
            return []
        if b.kind == "text":
            return [TextEnd(id=b.id)]
        if b.kind == "reasoning":
            return [ReasoningEnd(id=b.id, signature=b.signature)]
        if b.kind == "redacted":
            return [ReasoningEnd(id=b.id, redacted_data=b.redacted_data)]
        if b.kind == "tool":
            raw = "".join(b.json_parts) or "{}"
            return [ToolCall(tool_call_id=b.id, tool_name=b.tool_name, input=raw)]
        return []

    def partial(self, error: ModelError) -> ModelError:
        """``error`` with the usage reported before it (the input of a started message
        was billed even if the stream broke), for the loop to record."""
        if self.usage and error.usage is None:
            error.usage = Usage.from_anthropic(self.usage)
        return error

    def finish(self) -> StepFinish:
        metadata: dict[str, Any] = {"message_id": self.message_id, "usage": dict(self.usage)}
        if self.model:
            metadata["model"] = self.model
        if self.stop_sequence is not None:
            metadata["stop_sequence"] = self.stop_sequence
        return StepFinish(
            finish_reason=finish_reason(self.stop_reason),
            usage=Usage.from_anthropic(self.usage),
            raw_finish_reason=self.stop_reason,
            provider_metadata={"anthropic": metadata},
        )


# -- prompt caching ------------------------------------------------------------------------


def _last_markable(blocks: list[Any]) -> int | None:
    """Index of the last block that can carry a breakpoint (not thinking, not empty
    text), or None."""
    for i in range(len(blocks) - 1, -1, -1):
        b = blocks[i]
        if isinstance(b, Mapping) and b.get("type") not in _UNMARKABLE_BLOCKS:
            if b.get("type") == "text" and not b.get("text"):
                continue  # empty text cannot be cached
            return i
    return None


def _mark_last(blocks: list[Any], cache_control: dict[str, Any]) -> bool:
    """Mark the last markable block of ``blocks`` (a copy of it, in place in the list);
    False when there is none or it is marked already."""
    i = _last_markable(blocks)
    if i is None or "cache_control" in blocks[i]:
        return False
    blocks[i] = {**blocks[i], "cache_control": cache_control}
    return True


def _mark_message(messages: list[Any], index: int, cache_control: dict[str, Any]) -> bool:
    """Mark the last markable block of ``messages[index]`` (replacing the message with a
    copy); False when out of range, empty or marked already."""
    if not 0 <= index < len(messages):
        return False
    content = messages[index].get("content")
    if isinstance(content, str):
        if not content:
            return False
        content = [{"type": "text", "text": content}]
    content = list(content or [])
    if not _mark_last(content, cache_control):
        return False
    messages[index] = {**messages[index], "content": content}
    return True


def add_cache_breakpoints(params: dict[str, Any], cache_control: dict[str, Any]) -> None:
    """Mark ``cache_control`` breakpoints on ``params`` (create() keyword arguments).

    In order, while fewer than :data:`MAX_CACHE_BREAKPOINTS` are set (counting any the
    caller put in ``system`` or ``tools``): the last block of the last message (the
    whole prompt is cached for the next step or turn), the last system block, the last
    tool, the last block of the message before the last. Thinking blocks cannot carry a
    breakpoint: the last other block of a message is marked instead. Only copies are
    changed; the caller's own ``system``/``tools`` objects are left as they are.
    """
    tools = list(params.get("tools") or [])
    system = params.get("system")
    if isinstance(system, str):
        system = [{"type": "text", "text": system}] if system else []
    system = list(system or [])
    messages = list(params.get("messages") or [])
    budget = MAX_CACHE_BREAKPOINTS - sum(
        1 for b in (*tools, *system) if isinstance(b, Mapping) and "cache_control" in b
    )
    steps = (
        lambda: _mark_message(messages, len(messages) - 1, cache_control),
        lambda: _mark_last(system, cache_control),
        lambda: _mark_last(tools, cache_control),
        lambda: _mark_message(messages, len(messages) - 2, cache_control),
    )
    for step in steps:
        if budget <= 0:
            break
        if step():
            budget -= 1
    for key, value in (("system", system), ("tools", tools), ("messages", messages)):
        if value:
            params[key] = value


# -- message mapping -------------------------------------------------------------------


def to_anthropic_messages(messages: list[ModelMessage]) -> tuple[list[str], list[dict[str, Any]]]:
    """Provider-neutral messages → (extra system texts, Anthropic ``messages``).

    Tool results become ``user`` messages; consecutive same-role messages merge because
    the API requires user/assistant alternation; ``system`` messages in the list join
    the system prompt. The API also wants the conversation to open with a user turn: a
    list that opens with an answer (the tail a compaction kept can, its summary being
    system-level) gets a short user turn saying so in front.
    """
    extra_system: list[str] = []
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            text = "\n".join(c.text for c in message.content if isinstance(c, TextContent))
            if text:
                extra_system.append(text)
            continue
        role = "assistant" if message.role == "assistant" else "user"
        blocks = [
            b
            for c in message.content
            if (b := _assistant_block(c) if role == "assistant" else _user_block(c)) is not None
        ]
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    for m in out:
        if m["role"] == "user":
            # tool_result blocks must open a user message (before any text).
            m["content"].sort(key=lambda b: b["type"] != "tool_result")
    if out and out[0]["role"] == "assistant":
        out.insert(0, {"role": "user", "content": [{"type": "text", "text": CONTINUED}]})
    return extra_system, out


CONTINUED = "(The conversation so far continues below.)"
"""The user turn put in front of a conversation that opens with an answer."""


def _user_block(c: Any) -> dict[str, Any] | None:
    if isinstance(c, TextContent):
        return {"type": "text", "text": c.text} if c.text else None
    if isinstance(c, FileContent):
        return _file_block(c)
    if isinstance(c, ToolResultContent):
        return _tool_result_block(c)
    return None


def _assistant_block(c: Any) -> dict[str, Any] | None:
    if isinstance(c, TextContent):
        return {"type": "text", "text": c.text} if c.text else None
    if isinstance(c, ReasoningContent):
        if c.redacted_data:
            return {"type": "redacted_thinking", "data": c.redacted_data}
        if c.signature:
            return {"type": "thinking", "thinking": c.text, "signature": c.signature}
        # Unsigned thinking (another provider's, or cut off) is rejected by the API.
        return None
    if isinstance(c, ToolCallContent):
        return {
            "type": "tool_use",
            "id": c.tool_call_id,
            "name": c.tool_name,
            "input": _tool_input(c.input),
        }
    return None


def _tool_input(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            value = json.loads(value)
        except ValueError:
            # Invalid JSON the model produced: keep it visible rather than drop it.
            return {"_raw_input": value}
    if isinstance(value, dict):
        return value
    return {"_raw_input": value}


def _tool_result_block(c: ToolResultContent) -> dict[str, Any]:
    output = c.output
    content = output if isinstance(output, str) else json.dumps(output, default=str)
    block: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": c.tool_call_id,
        "content": content,
    }
    if c.is_error:
        block["is_error"] = True
    return block


def _file_block(c: FileContent) -> dict[str, Any]:
    if c.url:
        source: dict[str, Any] = {"type": "url", "url": c.data}
    else:
        source = {"type": "base64", "media_type": c.media_type, "data": c.data}
    if c.media_type.startswith("image/"):
        return {"type": "image", "source": source}
    if c.media_type == "application/pdf":
        block: dict[str, Any] = {"type": "document", "source": source}
    elif c.media_type.startswith("text/") and not c.url:
        text = base64.b64decode(c.data).decode("utf-8", "replace")
        block = {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": text},
        }
    else:
        raise ModelError(f"Anthropic does not accept files of type {c.media_type!r}")
    if c.filename:
        block["title"] = c.filename
    return block


# -- errors --------------------------------------------------------------------------------


def _transport_error_types() -> tuple[type[BaseException], ...]:
    # The SDK's HTTP library: httpx2 in new SDKs, httpx in older ones.
    found: list[type[BaseException]] = []
    for name in ("httpx2", "httpx"):
        mod = sys.modules.get(name)
        err = getattr(mod, "TransportError", None) if mod is not None else None
        if isinstance(err, type) and issubclass(err, BaseException):
            found.append(err)
    return tuple(found)


def _retry_after(headers: Any) -> float | None:
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_tz(value)
        if parsed is None:
            return None
        return max(0.0, email.utils.mktime_tz(parsed) - time.time())


def _error_fields(body: Any) -> tuple[str | None, str | None]:
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping):
            etype, message = error.get("type"), error.get("message")
            return (
                etype if isinstance(etype, str) else None,
                message if isinstance(message, str) else None,
            )
    return None, None


_KEY_HINT = (
    "Set ANTHROPIC_API_KEY in the environment of the process that calls the model "
    "(the actor's, under Ray), or pass AnthropicModel(api_key=...)."
)
# Statuses whose message alone does not say what to do.
_ERROR_HINTS: dict[int, str] = {
    401: f"The API key was not accepted. {_KEY_HINT}",
    403: "The API key is valid but may not use this model or feature; check its workspace.",
}


def _no_credentials_error(exc: TypeError) -> ModelError | None:
    """The SDK's TypeError when no key was found anywhere, as a :class:`ModelError`."""
    if "authentication method" not in str(exc):
        return None
    return ModelError(f"Anthropic API key missing: {exc}. {_KEY_HINT}", status_code=None)


def to_model_error(exc: BaseException) -> ModelError:
    """Map an ``anthropic`` SDK exception to :class:`ModelError`.

    Transient (the loop retries): 408, 409, 429, 5xx, 529 and connection errors — the
    SDK's own retry policy — and SSE ``error`` frames of overload/api/rate-limit type.
    """
    anthropic = sys.modules["anthropic"]
    if isinstance(exc, anthropic.APIStatusError):
        error_type, api_message = _error_fields(exc.body)
        message = api_message or str(exc)
        status = exc.status_code
        if status < 400:
            # An SSE ``error`` frame: the HTTP status was 200, the error type says it all.
            return ModelError(
                message,
                transient=error_type in _TRANSIENT_ERROR_TYPES,
                status_code=_ERROR_TYPE_STATUS.get(error_type or ""),
            )
        should_retry = exc.response.headers.get("x-should-retry")
        if should_retry in ("true", "false"):
            transient = should_retry == "true"
        else:
            transient = status in (408, 409, 429) or status >= 500
        hint = _ERROR_HINTS.get(status)
        if hint:
            message = f"Anthropic API {status} {error_type or 'error'}: {message}. {hint}"
        return ModelError(
            message,
            transient=transient,
            status_code=status,
            retry_after=_retry_after(exc.response.headers) if transient else None,
        )
    if isinstance(exc, anthropic.APIConnectionError):  # includes APITimeoutError
        return ModelError(str(exc), transient=True)
    return ModelError(str(exc))
