"""Test models shipped in the package (pattern: pydantic-ai TestModel/FunctionModel).

- :class:`ScriptedModel` plays one scripted :func:`reply` per step: text, reasoning,
  tool calls, a delay between events, a failure at event N, per-step usage.
- :class:`FunctionModel` computes each step from the request with a function.

Both record every :class:`~thinkray.runtime.models.base.ModelRequest` in ``requests`` so tests can
assert what the loop sent (context assembly, pruning, tools).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from thinkray.runtime.errors import InvalidArgumentError
from thinkray.runtime.models.base import (
    FinishReason,
    ModelError,
    ModelEvent,
    ModelRequest,
    ReasoningDelta,
    ReasoningEnd,
    ReasoningStart,
    StepFinish,
    TextDelta,
    TextEnd,
    TextStart,
    ToolCall,
    ToolInputDelta,
    ToolInputStart,
)
from thinkray.runtime.usage import Usage


@dataclass
class Text:
    """A scripted text block of its own, streamed as ``deltas`` (see :func:`text`)."""

    deltas: tuple[str, ...]


@dataclass
class Reasoning:
    """A scripted reasoning block, streamed as ``deltas``, ending with ``signature``
    (see :func:`reasoning`)."""

    deltas: tuple[str, ...]
    signature: str | None = None


@dataclass
class ToolCallItem:
    """A scripted tool call (see :func:`tool_call`): ``input`` is a dict or raw JSON
    text; a fresh ``call_...`` id is made when ``tool_call_id`` is None."""

    tool_name: str
    input: Any
    tool_call_id: str | None = None
    pieces: int = 3  # the JSON input is streamed in this many deltas


@dataclass
class Failure:
    """Raise ``error`` at this point of the step (see :func:`fail`)."""

    error: BaseException


@dataclass
class Pause:
    """Stall the stream ``seconds`` at this point of the step (see :func:`pause`)."""

    seconds: float


Item = str | Text | Reasoning | ToolCallItem | Failure | Pause


def text(*deltas: str) -> Text:
    """One text block streamed as the given deltas."""
    return Text(tuple(deltas))


def reasoning(*deltas: str, signature: str | None = "sig-test") -> Reasoning:
    """One reasoning block streamed as the given deltas, ending with ``signature``."""
    return Reasoning(tuple(deltas), signature)


def tool_call(
    tool_name: str, input: Any, *, id: str | None = None, pieces: int = 3
) -> ToolCallItem:
    """A tool call; ``input`` may be a dict (JSON-encoded) or raw JSON text."""
    return ToolCallItem(tool_name, input, id, pieces)


def fail(error: BaseException | str = "scripted failure", *, transient: bool = False) -> Failure:
    """A failure at this point of the step: ``error`` is raised as is, or a string
    becomes a :class:`ModelError` (``transient``: status 529, so the loop retries)."""
    if isinstance(error, str):
        error = ModelError(error, transient=transient, status_code=529 if transient else None)
    return Failure(error)


def pause(seconds: float) -> Pause:
    """A stall of ``seconds`` at this point of the step (e.g. to abort mid-stream)."""
    return Pause(seconds)


@dataclass
class Reply:
    """One step: the items in order, then a StepFinish (unless a Failure came first)."""

    items: list[Item]
    usage: Usage | None = None
    finish_reason: FinishReason | None = None
    delay: float | None = None
    fail_at: int | None = None
    error: BaseException | None = None
    events: list[ModelEvent] = field(default_factory=list)


def reply(
    *items: Item,
    usage: Usage | dict[str, int] | None = None,
    finish_reason: FinishReason | None = None,
    delay: float | None = None,
    fail_at: int | None = None,
    error: BaseException | str | None = None,
) -> Reply:
    """A scripted step. Plain strings are consecutive deltas of one text block.

    ``fail_at=N`` raises ``error`` (default: a non-transient ModelError) just before
    event N is yielded; ``delay`` sleeps before every event.
    """
    if isinstance(usage, dict):
        usage = Usage(**usage)
    if isinstance(error, str):
        error = ModelError(error)
    return Reply(list(items), usage, finish_reason, delay, fail_at, error)


def _events_for(step: Reply, step_no: int) -> list[ModelEvent | Pause | Failure]:
    out: list[ModelEvent | Pause | Failure] = []
    block = 0
    open_text: str | None = None  # id of the text block plain strings stream into
    has_tool = False

    def close_text() -> None:
        nonlocal open_text
        if open_text is not None:
            out.append(TextEnd(id=open_text))
            open_text = None

    def next_id(kind: str) -> str:
        nonlocal block
        block += 1
        return f"{kind}{step_no}-{block - 1}"

    for item in step.items:
        if isinstance(item, str):
            if open_text is None:
                open_text = next_id("t")
                out.append(TextStart(id=open_text))
            out.append(TextDelta(id=open_text, delta=item))
        elif isinstance(item, (Pause, Failure)):
            out.append(item)  # inside the current block: a stall or failure mid-text
        elif isinstance(item, Text):
            close_text()
            pid = next_id("t")
            out.append(TextStart(id=pid))
            out.extend(TextDelta(id=pid, delta=d) for d in item.deltas)
            out.append(TextEnd(id=pid))
        elif isinstance(item, Reasoning):
            close_text()
            pid = next_id("r")
            out.append(ReasoningStart(id=pid))
            out.extend(ReasoningDelta(id=pid, delta=d) for d in item.deltas)
            out.append(ReasoningEnd(id=pid, signature=item.signature))
        elif isinstance(item, ToolCallItem):
            close_text()
            has_tool = True
            call_id = item.tool_call_id or f"call_{uuid.uuid4().hex[:12]}"
            raw = item.input if isinstance(item.input, str) else json.dumps(item.input)
            out.append(ToolInputStart(id=call_id, tool_name=item.tool_name))
            n = max(1, item.pieces)
            size = max(1, -(-len(raw) // n))
            for i in range(0, len(raw), size):
                out.append(ToolInputDelta(id=call_id, delta=raw[i : i + size]))
            out.append(ToolCall(tool_call_id=call_id, tool_name=item.tool_name, input=raw))
    close_text()
    finish = step.finish_reason or ("tool-calls" if has_tool else "stop")
    out.append(StepFinish(finish_reason=finish, usage=step.usage or Usage(input=10, output=5)))
    return out


async def _play(step: Reply, step_no: int, default_delay: float) -> AsyncIterator[ModelEvent]:
    delay = step.delay if step.delay is not None else default_delay
    index = 0
    for ev in _events_for(step, step_no):
        if isinstance(ev, Pause):
            await asyncio.sleep(ev.seconds)
            continue
        if isinstance(ev, Failure):
            raise ev.error
        if step.fail_at is not None and index == step.fail_at:
            raise step.error or ModelError(f"scripted failure at event {index}")
        if delay:
            await asyncio.sleep(delay)
        else:
            # Yield to the loop so aborts and relays interleave like a real stream.
            await asyncio.sleep(0)
        yield ev
        index += 1


class ScriptedModel:
    """Plays ``replies`` one per step, in order. Running out is a clear error."""

    provider_id = "test"

    def __init__(
        self,
        replies: Iterable[Reply | str] = (),
        *,
        delay: float = 0.0,
        model_id: str = "scripted",
        context_window: int = 200_000,
        max_output_tokens: int = 8_192,
        loop: bool = False,
    ) -> None:
        self.replies = [reply(r) if isinstance(r, str) else r for r in replies]
        self.delay = delay
        self.model_id = model_id
        self.context_window = context_window
        self.max_output_tokens = max_output_tokens
        self.loop = loop
        self.requests: list[ModelRequest] = []
        self._next = 0

    def add(self, *replies: Reply | str) -> None:
        """Append steps to the script (a string is a one-text reply)."""
        self.replies.extend(reply(r) if isinstance(r, str) else r for r in replies)

    @property
    def remaining(self) -> int:
        """How many scripted steps have not been played yet."""
        return len(self.replies) - self._next

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Record ``request`` and play the next scripted step (from the start again
        with ``loop``).

        Raises:
            ModelError: the script is used up, or the step scripts a failure.
        """
        self.requests.append(request)
        if self._next >= len(self.replies):
            if not (self.loop and self.replies):
                raise ModelError(
                    f"ScriptedModel has no reply left (played {len(self.replies)} of "
                    f"{len(self.replies)})"
                )
            self._next = 0
        step_no = self._next
        step = self.replies[self._next]
        self._next += 1
        async for ev in _play(step, step_no, self.delay):
            yield ev


StepFunction = Callable[[ModelRequest, int], Any]


class FunctionModel:
    """Each step is ``fn(request, step_index)`` → a :class:`Reply`, a string, a list of
    items, or an async iterator of :data:`ModelEvent` (full control)."""

    provider_id = "test"

    def __init__(
        self,
        fn: StepFunction,
        *,
        model_id: str = "function",
        context_window: int = 200_000,
        max_output_tokens: int = 8_192,
        delay: float = 0.0,
    ) -> None:
        self.fn = fn
        self.model_id = model_id
        self.context_window = context_window
        self.max_output_tokens = max_output_tokens
        self.delay = delay
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Record ``request``, call ``fn`` (awaited if async) and play what it returns.
        Whatever ``fn`` or a scripted failure raises propagates."""
        self.requests.append(request)
        step_no = len(self.requests) - 1
        result = self.fn(request, step_no)
        if inspect.isawaitable(result):
            result = await result
        if hasattr(result, "__aiter__"):
            async for ev in result:
                yield ev
            return
        if isinstance(result, str):
            result = reply(result)
        elif isinstance(result, list):
            result = reply(*result)
        async for ev in _play(result, step_no, self.delay):
            yield ev


def last_user_text(request: ModelRequest) -> str:
    """The text of the last user message of a request (handy in FunctionModel fns)."""
    for msg in reversed(request.messages):
        if msg.role == "user":
            return "".join(getattr(c, "text", "") for c in msg.content)
    return ""


def model_from_spec(spec: dict[str, Any]) -> ScriptedModel:
    """A ScriptedModel from plain data (so it can travel in an agent's config).

    ``{"steps": [[item, ...], ...], "delay": 0.01}`` where an item is
    ``{"text": "words to stream"}`` (one delta per word), ``{"tool": name, "input": {...}}``
    or ``{"pause": seconds}``. Each turn plays the steps from the first.
    """
    replies = []
    for step in spec.get("steps", []):
        items: list[Item] = []
        for item in step:
            if "text" in item:
                words = str(item["text"]).split(" ")
                items.append(text(*[w + " " for w in words[:-1]], words[-1]))
            elif "tool" in item:
                items.append(tool_call(item["tool"], item.get("input", {}), id=item.get("id")))
            elif "pause" in item:
                items.append(pause(float(item["pause"])))
            else:
                raise InvalidArgumentError(f"unknown script item {item!r}")
        replies.append(reply(*items))
    return ScriptedModel(
        replies, delay=float(spec.get("delay", 0.0)), model_id=spec.get("model_id", "scripted")
    )
