"""UI message stream chunks (the AI SDK wire vocabulary), as typed models.

Inside a turn chunks travel as wire dicts (camelCase, JSON-ready): they are emitted
thousands of times a second, and a dict is what the recorder stores, what Ray relays
and what SSE sends. :data:`UIChunk` and :func:`parse_chunk` validate chunks that come
from outside (a replay, a test); :func:`to_sse` is the one HTTP serializer.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, TypeAdapter
from thinkray.runtime.messages import WireModel
from thinkray.runtime.models.base import FinishReason


class StartChunk(WireModel):
    type: Literal["start"] = "start"
    message_id: str | None = None
    message_metadata: dict[str, Any] | None = None


class StartStepChunk(WireModel):
    type: Literal["start-step"] = "start-step"


class FinishStepChunk(WireModel):
    type: Literal["finish-step"] = "finish-step"


class TextStartChunk(WireModel):
    type: Literal["text-start"] = "text-start"
    id: str


class TextDeltaChunk(WireModel):
    type: Literal["text-delta"] = "text-delta"
    id: str
    delta: str


class TextEndChunk(WireModel):
    type: Literal["text-end"] = "text-end"
    id: str


class ReasoningStartChunk(WireModel):
    type: Literal["reasoning-start"] = "reasoning-start"
    id: str


class ReasoningDeltaChunk(WireModel):
    type: Literal["reasoning-delta"] = "reasoning-delta"
    id: str
    delta: str


class ReasoningEndChunk(WireModel):
    type: Literal["reasoning-end"] = "reasoning-end"
    id: str
    provider_metadata: dict[str, Any] | None = None


class ToolInputStartChunk(WireModel):
    type: Literal["tool-input-start"] = "tool-input-start"
    tool_call_id: str
    tool_name: str
    dynamic: bool | None = True


class ToolInputDeltaChunk(WireModel):
    type: Literal["tool-input-delta"] = "tool-input-delta"
    tool_call_id: str
    input_text_delta: str


class ToolInputAvailableChunk(WireModel):
    type: Literal["tool-input-available"] = "tool-input-available"
    tool_call_id: str
    tool_name: str
    input: Any = None
    dynamic: bool | None = True


class ToolInputErrorChunk(WireModel):
    type: Literal["tool-input-error"] = "tool-input-error"
    tool_call_id: str
    tool_name: str
    input: Any = None
    error_text: str
    dynamic: bool | None = True


class ToolOutputAvailableChunk(WireModel):
    type: Literal["tool-output-available"] = "tool-output-available"
    tool_call_id: str
    output: Any = None


class ToolOutputErrorChunk(WireModel):
    type: Literal["tool-output-error"] = "tool-output-error"
    tool_call_id: str
    error_text: str


class ToolApprovalRequestChunk(WireModel):
    type: Literal["tool-approval-request"] = "tool-approval-request"
    approval_id: str
    tool_call_id: str


class ToolOutputDeniedChunk(WireModel):
    type: Literal["tool-output-denied"] = "tool-output-denied"
    tool_call_id: str


class DataChunk(WireModel):
    type: str = Field(pattern=r"^data-[A-Za-z0-9_.-]+$")
    id: str | None = None
    data: Any = None
    transient: bool | None = None


class FinishChunk(WireModel):
    type: Literal["finish"] = "finish"
    finish_reason: FinishReason | None = None
    message_metadata: dict[str, Any] | None = None


class AbortChunk(WireModel):
    type: Literal["abort"] = "abort"
    reason: str | None = None


class ErrorChunk(WireModel):
    type: Literal["error"] = "error"
    error_text: str


class MessageMetadataChunk(WireModel):
    type: Literal["message-metadata"] = "message-metadata"
    message_metadata: dict[str, Any]


_CHUNK_TYPES: dict[str, type[WireModel]] = {
    "start": StartChunk,
    "start-step": StartStepChunk,
    "finish-step": FinishStepChunk,
    "text-start": TextStartChunk,
    "text-delta": TextDeltaChunk,
    "text-end": TextEndChunk,
    "reasoning-start": ReasoningStartChunk,
    "reasoning-delta": ReasoningDeltaChunk,
    "reasoning-end": ReasoningEndChunk,
    "tool-input-start": ToolInputStartChunk,
    "tool-input-delta": ToolInputDeltaChunk,
    "tool-input-available": ToolInputAvailableChunk,
    "tool-input-error": ToolInputErrorChunk,
    "tool-output-available": ToolOutputAvailableChunk,
    "tool-output-error": ToolOutputErrorChunk,
    "tool-approval-request": ToolApprovalRequestChunk,
    "tool-output-denied": ToolOutputDeniedChunk,
    "finish": FinishChunk,
    "abort": AbortChunk,
    "error": ErrorChunk,
    "message-metadata": MessageMetadataChunk,
}


def _chunk_tag(value: Any) -> str:
    t = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if isinstance(t, str) and t.startswith("data-"):
        return "data"
    return t if isinstance(t, str) else "invalid"


UIChunk = Annotated[
    Annotated[StartChunk, Tag("start")]
    | Annotated[StartStepChunk, Tag("start-step")]
    | Annotated[FinishStepChunk, Tag("finish-step")]
    | Annotated[TextStartChunk, Tag("text-start")]
    | Annotated[TextDeltaChunk, Tag("text-delta")]
    | Annotated[TextEndChunk, Tag("text-end")]
    | Annotated[ReasoningStartChunk, Tag("reasoning-start")]
    | Annotated[ReasoningDeltaChunk, Tag("reasoning-delta")]
    | Annotated[ReasoningEndChunk, Tag("reasoning-end")]
    | Annotated[ToolInputStartChunk, Tag("tool-input-start")]
    | Annotated[ToolInputDeltaChunk, Tag("tool-input-delta")]
    | Annotated[ToolInputAvailableChunk, Tag("tool-input-available")]
    | Annotated[ToolInputErrorChunk, Tag("tool-input-error")]
    | Annotated[ToolOutputAvailableChunk, Tag("tool-output-available")]
    | Annotated[ToolOutputErrorChunk, Tag("tool-output-error")]
    | Annotated[ToolApprovalRequestChunk, Tag("tool-approval-request")]
    | Annotated[ToolOutputDeniedChunk, Tag("tool-output-denied")]
    | Annotated[DataChunk, Tag("data")]
    | Annotated[FinishChunk, Tag("finish")]
    | Annotated[AbortChunk, Tag("abort")]
    | Annotated[ErrorChunk, Tag("error")]
    | Annotated[MessageMetadataChunk, Tag("message-metadata")],
    Discriminator(_chunk_tag),
]

_ADAPTER: TypeAdapter[Any] = TypeAdapter(UIChunk)


def parse_chunk(chunk: dict[str, Any]) -> WireModel:
    """Validate a wire chunk into its typed model (raises ``pydantic.ValidationError``)."""
    return _ADAPTER.validate_python(chunk)


def chunk_type(name: str) -> type[WireModel]:
    return _CHUNK_TYPES[name]


SSE_HEADERS = {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    "x-vercel-ai-ui-message-stream": "v1",
}
SSE_DONE = "data: [DONE]\n\n"


def to_sse(chunk: dict[str, Any]) -> str:
    """One chunk as an SSE frame. End a stream with :data:`SSE_DONE`."""
    return f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"
