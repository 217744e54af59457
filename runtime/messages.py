"""UIMessage and its parts, as typed models (AI SDK v5/v6 shape, camelCase on the wire).

The runtime validates every message that enters from outside through
:func:`parse_message` and hands storage the wire dict (``model_dump``). Inside a turn
the hot path works on wire dicts; these models are the boundary and the documentation.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
)
from pydantic.alias_generators import to_camel
from thinkray.runtime.errors import (  # re-exported: the errors live in thinkray.runtime.errors
    InvalidMessageError as InvalidMessageError,
)
from thinkray.runtime.typed_model import TypedModel

Role = Literal["system", "user", "assistant"]
ToolState = Literal[
    "input-streaming",
    "input-available",
    "approval-requested",
    "approval-responded",
    "output-available",
    "output-error",
    "output-denied",
]
"""A tool part moves input-streaming → input-available → output-available | output-error
on one row (with approval-requested / output-denied when a tool needs approval)."""


class WireModel(TypedModel):
    """Base of the message models: snake_case in Python, camelCase on the wire (either
    accepted on input); unknown fields are kept."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="allow", frozen=False
    )

    def wire(self) -> dict[str, Any]:
        """The wire dict: camelCase keys, ``None`` fields left out, JSON-ready values."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class TextPart(WireModel):
    """Text the user wrote or the assistant answered (``state`` while streaming)."""

    type: Literal["text"] = "text"
    text: str
    state: Literal["streaming", "done"] | None = None
    provider_metadata: dict[str, Any] | None = None


class ReasoningPart(WireModel):
    """The assistant's reasoning (thinking); ``provider_metadata`` keeps what the
    provider needs back, e.g. Anthropic's signature."""

    type: Literal["reasoning"] = "reasoning"
    text: str
    state: Literal["streaming", "done"] | None = None
    provider_metadata: dict[str, Any] | None = None


class FilePart(WireModel):
    """An attached file: ``url`` is a URL or a data URL of type ``media_type``."""

    type: Literal["file"] = "file"
    media_type: str
    url: str
    filename: str | None = None


class SourceUrlPart(WireModel):
    """A source the answer cites."""

    type: Literal["source-url"] = "source-url"
    source_id: str
    url: str
    title: str | None = None


class StepStartPart(WireModel):
    """Marks where a model step begins within an assistant message."""

    type: Literal["step-start"] = "step-start"


class ToolPart(WireModel):
    """A tool call (AI SDK ``dynamic-tool``: the tool name is a field, not the type)."""

    type: Literal["dynamic-tool"] = "dynamic-tool"
    tool_name: str
    tool_call_id: str
    state: ToolState
    input: Any = None
    output: Any = None
    error_text: str | None = None
    approval: dict[str, Any] | None = None
    call_provider_metadata: dict[str, Any] | None = None


class DataPart(WireModel):
    """``data-<name>`` parts, e.g. ``data-compaction``."""

    type: str = Field(pattern=r"^data-[A-Za-z0-9_.-]+$")
    id: str | None = None
    data: Any = None


def _part_tag(value: Any) -> str:
    t = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if isinstance(t, str) and t.startswith("data-"):
        return "data"
    return t if isinstance(t, str) else "invalid"


Part = Annotated[
    Annotated[TextPart, Tag("text")]
    | Annotated[ReasoningPart, Tag("reasoning")]
    | Annotated[FilePart, Tag("file")]
    | Annotated[SourceUrlPart, Tag("source-url")]
    | Annotated[StepStartPart, Tag("step-start")]
    | Annotated[ToolPart, Tag("dynamic-tool")]
    | Annotated[DataPart, Tag("data")],
    Discriminator(_part_tag),
]


class UIMessage(WireModel):
    """One message of a conversation, as the AI SDK's ``useChat`` sends and shows it."""

    id: str = Field(min_length=1, max_length=256)
    role: Role
    metadata: dict[str, Any] | None = None
    parts: list[Part] = Field(default_factory=list)


def new_id(prefix: str = "msg") -> str:
    """A fresh random id, ``<prefix>_<20 hex digits>``."""
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def parse_message(message: str | dict[str, Any] | UIMessage, *, role: Role = "user") -> dict:
    """Validate a user-supplied message and return its wire dict.

    A plain string becomes a one-part text message with a fresh id. Dicts and models
    are validated fully (unknown part types, missing fields, empty ids are errors).
    """
    if isinstance(message, str):
        return {"id": new_id(), "role": role, "parts": [{"type": "text", "text": message}]}
    try:
        model = message if isinstance(message, UIMessage) else UIMessage.model_validate(message)
    except ValidationError as exc:
        raise InvalidMessageError(f"invalid message: {exc}") from exc
    if not model.parts:
        raise InvalidMessageError("invalid message: a message needs at least one part")
    # Exactly the keys the client sent: the AI SDK's UIMessage has no ``metadata``
    # key unless it set one, and the stored message must equal the client's.
    return model.wire()


def message_text(message: dict[str, Any]) -> str:
    """The concatenated text parts of a wire message."""
    return "".join(p.get("text", "") for p in message.get("parts", ()) if p.get("type") == "text")
