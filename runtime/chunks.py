"""UI message stream chunks (the AI SDK wire vocabulary): the one definition.

A chunk is a plain JSON-ready dict (camelCase keys, as on the wire): it is emitted
thousands of times a second, and a dict is what the recorder stores, what Ray relays
and what SSE sends. Each kind is a :class:`~typing.TypedDict` with a ``Literal``
``type`` discriminator, so building one costs nothing at run time while mypy checks
every field; ``if chunk["type"] == "text-delta":`` narrows a :data:`UIChunk` to
:class:`TextDeltaChunk`.

``data-<name>`` chunks (:class:`DataChunk`) are the one open-ended kind: their ``type``
is any string starting ``data-``, which no ``Literal`` can spell, so a consumer of
:data:`UIChunk` first sets them apart. They are also the one kind with a ``data`` field:
``if "data" in chunk`` costs no call and narrows them away for mypy (the other branch);
:func:`is_data_chunk` narrows both ways. The agentic loop never emits them: it yields
the closed union :data:`LoopChunk`.

Nothing here validates: chunks are built by this runtime (checked by the type checker)
or read back from its own chunk log. :func:`to_sse` is the one HTTP serializer.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict, cast

from thinkray.runtime.models.base import FinishReason

if TYPE_CHECKING:
    from typing_extensions import TypeIs  # typing.TypeIs from Python 3.13

__all__ = [
    "SSE_DONE",
    "SSE_HEADERS",
    "AbortChunk",
    "DataChunk",
    "ErrorChunk",
    "FileChunk",
    "FinishChunk",
    "FinishStepChunk",
    "LoopChunk",
    "MessageMetadataChunk",
    "ReasoningDeltaChunk",
    "ReasoningEndChunk",
    "ReasoningStartChunk",
    "SourceUrlChunk",
    "StartChunk",
    "StartStepChunk",
    "TextDeltaChunk",
    "TextEndChunk",
    "TextStartChunk",
    "ToolApprovalRequestChunk",
    "ToolInputAvailableChunk",
    "ToolInputDeltaChunk",
    "ToolInputErrorChunk",
    "ToolInputStartChunk",
    "ToolOutputAvailableChunk",
    "ToolOutputDeniedChunk",
    "ToolOutputErrorChunk",
    "UIChunk",
    "from_chunk_log",
    "is_data_chunk",
    "to_sse",
    "tool_output_available",
    "tool_output_error",
]

# -- message and step boundaries ---------------------------------------------------------


class StartChunk(TypedDict):
    """First chunk of a turn's assistant message."""

    type: Literal["start"]
    messageId: NotRequired[str]
    messageMetadata: NotRequired[dict[str, Any]]


class StartStepChunk(TypedDict):
    """A model step begins (the message gets a ``step-start`` part)."""

    type: Literal["start-step"]


class FinishStepChunk(TypedDict):
    """A model step ended (after its tool results)."""

    type: Literal["finish-step"]


class FinishChunk(TypedDict):
    """Last chunk of a turn that was not aborted and did not fail."""

    type: Literal["finish"]
    finishReason: NotRequired[FinishReason]
    messageMetadata: NotRequired[dict[str, Any]]


class AbortChunk(TypedDict):
    """The turn was aborted; partial output stays."""

    type: Literal["abort"]
    reason: NotRequired[str]


class ErrorChunk(TypedDict):
    """The turn failed with ``errorText``."""

    type: Literal["error"]
    errorText: str


class MessageMetadataChunk(TypedDict):
    """Metadata merged into the assistant message."""

    type: Literal["message-metadata"]
    messageMetadata: dict[str, Any]


# -- text and reasoning blocks (every delta follows its start) ---------------------------


class TextStartChunk(TypedDict):
    """A text block ``id`` begins (it becomes a ``text`` part)."""

    type: Literal["text-start"]
    id: str
    providerMetadata: NotRequired[dict[str, Any]]


class TextDeltaChunk(TypedDict):
    """More text for block ``id``."""

    type: Literal["text-delta"]
    id: str
    delta: str


class TextEndChunk(TypedDict):
    """Text block ``id`` is complete."""

    type: Literal["text-end"]
    id: str
    providerMetadata: NotRequired[dict[str, Any]]


class ReasoningStartChunk(TypedDict):
    """A reasoning block ``id`` begins (it becomes a ``reasoning`` part)."""

    type: Literal["reasoning-start"]
    id: str
    providerMetadata: NotRequired[dict[str, Any]]


class ReasoningDeltaChunk(TypedDict):
    """More reasoning text for block ``id``."""

    type: Literal["reasoning-delta"]
    id: str
    delta: str


class ReasoningEndChunk(TypedDict):
    """``providerMetadata`` carries e.g. ``{"anthropic": {"signature": ...}}``."""

    type: Literal["reasoning-end"]
    id: str
    providerMetadata: NotRequired[dict[str, Any]]


# -- tool calls ----------------------------------------------------------------------------


class ToolInputStartChunk(TypedDict):
    """The model starts a call of ``toolName``; its input streams next."""

    type: Literal["tool-input-start"]
    toolCallId: str
    toolName: str
    dynamic: NotRequired[bool]


class ToolInputDeltaChunk(TypedDict):
    """A piece of the call's raw JSON input, as the model streams it."""

    type: Literal["tool-input-delta"]
    toolCallId: str
    inputTextDelta: str


class ToolInputAvailableChunk(TypedDict):
    """The call's complete, valid input (parsed JSON)."""

    type: Literal["tool-input-available"]
    toolCallId: str
    toolName: str
    input: Any
    dynamic: NotRequired[bool]


class ToolInputErrorChunk(TypedDict):
    """The call's input is invalid (or the tool unknown); the tool does not run."""

    type: Literal["tool-input-error"]
    toolCallId: str
    toolName: str
    input: Any
    errorText: str
    dynamic: NotRequired[bool]


class ToolOutputAvailableChunk(TypedDict):
    """The call's result. ``dynamic`` must repeat the ``tool-input-*`` chunk's: ai@5
    clients look a result's part up by it (without it, "tool-output-error must be
    preceded by a tool-input-available" for a ``dynamic-tool`` part)."""

    type: Literal["tool-output-available"]
    toolCallId: str
    output: Any
    dynamic: NotRequired[bool]


class ToolOutputErrorChunk(TypedDict):
    """The call failed (or was refused, or aborted) with ``errorText``; ``dynamic`` as
    for :class:`ToolOutputAvailableChunk`."""

    type: Literal["tool-output-error"]
    toolCallId: str
    errorText: str
    dynamic: NotRequired[bool]


class ToolApprovalRequestChunk(TypedDict):
    """The call waits for a human's approval (``approvalId`` answers it)."""

    type: Literal["tool-approval-request"]
    approvalId: str
    toolCallId: str


class ToolOutputDeniedChunk(TypedDict):
    """A human refused the call (or nobody answered its approval request)."""

    type: Literal["tool-output-denied"]
    toolCallId: str


# -- files, sources and data ---------------------------------------------------------------


class FileChunk(TypedDict):
    """A file (``url``, often a data URL, of type ``mediaType``) the message carries."""

    type: Literal["file"]
    url: str
    mediaType: str


class SourceUrlChunk(TypedDict):
    """A source the answer cites (a ``source-url`` part)."""

    type: Literal["source-url"]
    sourceId: str
    url: str
    title: NotRequired[str]


class DataChunk(TypedDict):
    """A ``data-<name>`` chunk (``type`` starts with ``data-``). It becomes a part of the
    message (replacing the part of the same type and ``id``) unless ``transient``."""

    type: str
    data: Any
    id: NotRequired[str]
    transient: NotRequired[bool]


LoopChunk = (
    StartChunk
    | StartStepChunk
    | TextStartChunk
    | TextDeltaChunk
    | TextEndChunk
    | ReasoningStartChunk
    | ReasoningDeltaChunk
    | ReasoningEndChunk
    | ToolInputStartChunk
    | ToolInputDeltaChunk
    | ToolInputAvailableChunk
    | ToolInputErrorChunk
    | ToolOutputAvailableChunk
    | ToolOutputErrorChunk
    | ToolOutputDeniedChunk
    | FinishStepChunk
    | FinishChunk
)
"""What the agentic loop yields (no ``data-*`` chunks, so ``chunk["type"] == ...``
narrows it directly)."""

UIChunk = (
    LoopChunk
    | AbortChunk
    | ErrorChunk
    | MessageMetadataChunk
    | ToolApprovalRequestChunk
    | FileChunk
    | SourceUrlChunk
    | DataChunk
)
"""Any chunk of a run's stream: the loop's, the runner's (``abort``, ``error``) and
what hooks and tools emit (``data-*``, approval requests)."""


def is_data_chunk(chunk: UIChunk) -> TypeIs[DataChunk]:
    """True for a ``data-<name>`` chunk (the one kind with a ``data`` field). Call it
    before narrowing on ``chunk["type"]``: with data chunks excluded, ``==`` on the
    type narrows the rest."""
    return "data" in chunk


def tool_output_error(tool_call_id: str, error_text: str) -> ToolOutputErrorChunk:
    """The ``tool-output-error`` chunk ending call ``tool_call_id`` with ``error_text``
    (``dynamic``: every tool part of this runtime is a ``dynamic-tool`` part)."""
    return {
        "type": "tool-output-error",
        "toolCallId": tool_call_id,
        "errorText": error_text,
        "dynamic": True,
    }


def tool_output_available(tool_call_id: str, output: Any) -> ToolOutputAvailableChunk:
    """The ``tool-output-available`` chunk carrying call ``tool_call_id``'s ``output``."""
    return {
        "type": "tool-output-available",
        "toolCallId": tool_call_id,
        "output": output,
        "dynamic": True,
    }


def from_chunk_log(chunks: list[dict[str, Any]]) -> list[UIChunk]:
    """Chunks read back from a run's chunk log (``SessionStore.get_chunks``), typed.

    They were :data:`UIChunk` when this runtime recorded them; storage knows no runtime
    types and returns plain dicts. They are not revalidated: a replay must give back
    exactly the bytes that went out live, and it is on the reconnect path."""
    return cast("list[UIChunk]", chunks)


# -- HTTP ------------------------------------------------------------------------------------

SSE_HEADERS = {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    "x-vercel-ai-ui-message-stream": "v1",
}
SSE_DONE = "data: [DONE]\n\n"


def to_sse(chunk: UIChunk) -> str:
    """One chunk as an SSE frame. End a stream with :data:`SSE_DONE`."""
    return f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"
