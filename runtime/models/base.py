"""The model seam: what the agentic loop asks of a language model.

A model turns one :class:`ModelRequest` (system prompt, provider-neutral messages,
tool specs) into an async stream of :data:`ModelEvent` for ONE step. The loop owns
steps, tools, retries and UI chunks; a model adapter owns only the wire of its
provider. Adapters: :mod:`thinkray.runtime.models.anthropic` and the test models in
:mod:`thinkray.runtime.models.testing`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

from pydantic import ConfigDict, Field
from thinkray.runtime.errors import (  # re-exported: the errors live in thinkray.runtime.errors
    ModelError as ModelError,
)
from thinkray.runtime.typed_model import TypedModel
from thinkray.runtime.usage import Usage

FinishReason = Literal["stop", "length", "content-filter", "tool-calls", "error", "other"]
"""The AI SDK's finish reasons, used on the wire in ``finish`` chunks."""


# -- provider-neutral conversation ------------------------------------------------------


class TextContent(TypedModel):
    """Plain text in a message."""

    type: Literal["text"] = "text"
    text: str


class ReasoningContent(TypedModel):
    """Thinking. ``signature`` must go back to Anthropic unchanged within a tool loop."""

    type: Literal["reasoning"] = "reasoning"
    text: str
    signature: str | None = None
    redacted_data: str | None = None


class FileContent(TypedModel):
    """An image or document: ``data`` is base64 or a URL (``url`` True)."""

    type: Literal["file"] = "file"
    media_type: str
    data: str
    url: bool = False
    filename: str | None = None


class ToolCallContent(TypedModel):
    """A tool call sent back to the model. ``input`` is what the model produced: its
    parsed JSON (or the raw text when that was not JSON), never a validated object."""

    type: Literal["tool-call"] = "tool-call"
    tool_call_id: str
    tool_name: str
    input: Any


class ToolResultContent(TypedModel):
    """The result of tool call ``tool_call_id`` sent back to the model (in a ``tool``
    message); ``is_error`` marks a failed, refused or aborted call."""

    type: Literal["tool-result"] = "tool-result"
    tool_call_id: str
    tool_name: str
    output: Any
    is_error: bool = False


Content = Annotated[
    TextContent | ReasoningContent | FileContent | ToolCallContent | ToolResultContent,
    Field(discriminator="type"),
]


class ModelMessage(TypedModel):
    """One provider-neutral message. ``tool`` messages carry tool results only."""

    role: Literal["system", "user", "assistant", "tool"]
    content: list[Content]


class ToolSpec(TypedModel):
    """A tool as the model is told about it: name, description, JSON schema of its input."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class ModelRequest(TypedModel):
    """Everything one step sends the model: the system prompt, the conversation, the
    tools it may call and generation limits (``None``: the adapter's default)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    system: str = ""
    messages: list[ModelMessage] = Field(default_factory=list)
    tools: list[ToolSpec] = Field(default_factory=list)
    max_output_tokens: int | None = None
    temperature: float | None = None
    # Extra provider options (e.g. {"thinking": {...}} for Anthropic).
    provider_options: dict[str, Any] = Field(default_factory=dict)


# -- one step's stream ---------------------------------------------------------------------


class TextStart(TypedModel):
    """A text block ``id`` begins."""

    type: Literal["text-start"] = "text-start"
    id: str


class TextDelta(TypedModel):
    """More text for block ``id``."""

    type: Literal["text-delta"] = "text-delta"
    id: str
    delta: str


class TextEnd(TypedModel):
    """Text block ``id`` is complete."""

    type: Literal["text-end"] = "text-end"
    id: str


class ReasoningStart(TypedModel):
    """A reasoning (thinking) block ``id`` begins."""

    type: Literal["reasoning-start"] = "reasoning-start"
    id: str


class ReasoningDelta(TypedModel):
    """More reasoning text for block ``id``."""

    type: Literal["reasoning-delta"] = "reasoning-delta"
    id: str
    delta: str


class ReasoningEnd(TypedModel):
    """Reasoning block ``id`` is complete; ``signature`` (or ``redacted_data``) is
    what the provider needs back to accept the block in a later request."""

    type: Literal["reasoning-end"] = "reasoning-end"
    id: str
    signature: str | None = None
    redacted_data: str | None = None


class ToolInputStart(TypedModel):
    """The model starts tool call ``id`` of ``tool_name``; its input streams next."""

    type: Literal["tool-input-start"] = "tool-input-start"
    id: str
    tool_name: str


class ToolInputDelta(TypedModel):
    """A piece of tool call ``id``'s raw JSON input."""

    type: Literal["tool-input-delta"] = "tool-input-delta"
    id: str
    delta: str


class ToolCall(TypedModel):
    """A complete tool call. ``input`` is the raw JSON text the model produced."""

    type: Literal["tool-call"] = "tool-call"
    tool_call_id: str
    tool_name: str
    input: str


class StepFinish(TypedModel):
    """Last event of every successful step. ``usage`` is this step's only."""

    type: Literal["step-finish"] = "step-finish"
    finish_reason: FinishReason
    usage: Usage = Field(default_factory=Usage)
    raw_finish_reason: str | None = None
    provider_metadata: dict[str, Any] = Field(default_factory=dict)


ModelEvent = Annotated[
    TextStart
    | TextDelta
    | TextEnd
    | ReasoningStart
    | ReasoningDelta
    | ReasoningEnd
    | ToolInputStart
    | ToolInputDelta
    | ToolCall
    | StepFinish,
    Field(discriminator="type"),
]


# -- errors ------------------------------------------------------------------------------


# -- the protocol --------------------------------------------------------------------------


@runtime_checkable
class Model(Protocol):
    """A language model that streams one step.

    Contract:
    - ``stream`` yields events of one step in order, ending with exactly one
      :class:`StepFinish` when the step succeeds; text/reasoning deltas come between
      their start and end; every :class:`ToolCall` follows its ``ToolInput*`` events.
    - Failure raises :class:`ModelError` (``transient=True`` for overload, rate limit,
      5xx and connection errors) — before or after events were yielded.
    - Cancel: the loop cancels the consuming task (``asyncio.CancelledError``) on
      abort; the adapter must release its connection and not swallow the cancel.
    - ``context_window`` / ``max_output_tokens`` describe the model's limits for
      compaction decisions.
    """

    provider_id: str
    model_id: str
    context_window: int
    max_output_tokens: int

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Run one step for ``request`` and yield its events (see the contract above).

        Raises:
            ModelError: the provider failed (``transient`` when a retry may succeed).
        """
        ...
