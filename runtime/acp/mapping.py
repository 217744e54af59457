"""Between thinkray's wire (AI SDK UI chunks, stored UIMessages) and ACP's.

Pure functions and one small per-turn translator, no I/O, so every mapping is tested
without a process:

- :class:`TurnTranslator`: a live turn's chunks -> ``session/update`` payloads (text,
  reasoning, tool calls with their status moving ``pending`` -> ``in_progress`` (after
  an approval) -> ``completed`` | ``failed``);
- :func:`history_updates`: a stored history -> the updates ``session/load`` replays;
- :func:`user_message`: a ``session/prompt``'s content blocks -> the user message;
- :func:`stop_reason`: how the stream ended -> ACP's ``stopReason``;
- :data:`PERMISSION_OPTIONS` / :func:`decision_of`: an approval's choices both ways.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from acp.schema import (
    AgentMessageChunk,
    AgentThoughtChunk,
    ContentToolCallContent,
    EmbeddedResourceContentBlock,
    PermissionOption,
    ResourceContentBlock,
    TextContentBlock,
    TextResourceContents,
    ToolCallProgress,
    ToolCallStart,
    ToolCallStatus,
    ToolCallUpdate,
    ToolKind,
    UserMessageChunk,
)
from thinkray.runtime.messages import new_id

__all__ = [
    "DECISIONS",
    "PERMISSION_OPTIONS",
    "PromptContentError",
    "SessionUpdate",
    "TurnTranslator",
    "decision_of",
    "history_updates",
    "stop_reason",
    "tool_content",
    "user_message",
]

SessionUpdate = (
    UserMessageChunk | AgentMessageChunk | AgentThoughtChunk | ToolCallStart | ToolCallProgress
)
"""The ``session/update`` payloads this server sends."""

StopReason = Literal["end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"]

OUTPUT_TEXT_LIMIT = 20_000
"""Characters of a tool's output shown as the call's content (``rawOutput`` has it
whole): an editor renders the content, and a megabyte of JSON there helps nobody."""

# An ask's answers, as ``Agent.answer_approval`` takes them: the option id IS the
# decision, so the editor's choice is recorded verbatim.
PERMISSION_OPTIONS = [
    PermissionOption(option_id="once", name="Allow once", kind="allow_once"),
    PermissionOption(option_id="session", name="Allow for this session", kind="allow_always"),
    PermissionOption(option_id="always", name="Always allow", kind="allow_always"),
    PermissionOption(option_id="deny", name="Deny", kind="reject_once"),
]
DECISIONS = frozenset(o.option_id for o in PERMISSION_OPTIONS)


def decision_of(option_id: str | None) -> str:
    """The approval decision for the option the editor selected; an id we never offered
    is a refusal (the safe reading of an answer we do not understand)."""
    return option_id if option_id in DECISIONS else "deny"


class PromptContentError(ValueError):
    """A ``session/prompt`` carries content this agent does not take (an image or audio
    block, a binary resource: the capabilities it advertised say so)."""


# -- live turns --------------------------------------------------------------------------


def _text(delta: str, message_id: str | None, kind: str) -> SessionUpdate:
    block = TextContentBlock(type="text", text=delta)
    if kind == "thought":
        return AgentThoughtChunk(
            session_update="agent_thought_chunk", content=block, message_id=message_id
        )
    return AgentMessageChunk(
        session_update="agent_message_chunk", content=block, message_id=message_id
    )


def tool_content(text: str) -> list[ContentToolCallContent]:
    """A tool call's ``content``: ``text`` as one text block (cut at
    :data:`OUTPUT_TEXT_LIMIT` characters, saying how many more there were)."""
    if len(text) > OUTPUT_TEXT_LIMIT:
        text = text[:OUTPUT_TEXT_LIMIT] + f"\n[... {len(text) - OUTPUT_TEXT_LIMIT} more characters]"
    return [
        ContentToolCallContent(type="content", content=TextContentBlock(type="text", text=text))
    ]


def _shown(output: Any) -> str:
    if isinstance(output, str):
        return output
    try:
        return json.dumps(output, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(output)


class TurnTranslator:
    """One turn's chunks -> ``session/update`` payloads. Remembers the assistant
    message id (every chunk of the message carries it as ``messageId``) and the tool
    calls seen, so a result finds its call's name and a call whose input did not
    stream still gets its ``tool_call`` first. ``kinds`` maps tool names to ACP's
    ``ToolKind`` (default ``other``)."""

    def __init__(self, kinds: dict[str, ToolKind] | None = None) -> None:
        self.message_id: str | None = None
        self.kinds = kinds or {}
        self.calls: dict[str, dict[str, Any]] = {}  # id -> {"name", "input"}

    def _start(self, call_id: str, name: str, **fields: Any) -> ToolCallStart:
        self.calls[call_id] = {"name": name, "input": fields.get("raw_input")}
        return ToolCallStart(
            session_update="tool_call",
            tool_call_id=call_id,
            title=name,
            kind=self.kinds.get(name, "other"),
            status=fields.pop("status", "pending"),
            **fields,
        )

    def _finish(self, chunk: dict[str, Any], status: ToolCallStatus, **fields: Any) -> Any:
        call_id = chunk["toolCallId"]
        if call_id not in self.calls:  # a result for a call we never showed
            return self._start(call_id, chunk.get("toolName", "tool"), status=status, **fields)
        return ToolCallProgress(
            session_update="tool_call_update", tool_call_id=call_id, status=status, **fields
        )

    def updates(self, chunk: dict[str, Any]) -> list[SessionUpdate]:
        """The updates for one chunk (often none: step boundaries, data, metadata)."""
        kind = chunk.get("type")
        if kind == "text-delta":
            return [_text(chunk["delta"], self.message_id, "message")]
        if kind == "reasoning-delta":
            return [_text(chunk["delta"], self.message_id, "thought")]
        if kind == "start":
            self.message_id = chunk.get("messageId") or self.message_id
            return []
        if kind == "tool-input-start":
            return [self._start(chunk["toolCallId"], chunk["toolName"])]
        if kind == "tool-input-available":
            call_id, value = chunk["toolCallId"], chunk.get("input")
            if call_id not in self.calls:
                return [self._start(call_id, chunk["toolName"], raw_input=value)]
            self.calls[call_id]["input"] = value
            return [
                ToolCallProgress(
                    session_update="tool_call_update", tool_call_id=call_id, raw_input=value
                )
            ]
        if kind == "tool-output-available":
            output = chunk.get("output")
            return [
                self._finish(
                    chunk, "completed", raw_output=output, content=tool_content(_shown(output))
                )
            ]
        if kind in ("tool-output-error", "tool-input-error"):
            return [self._finish(chunk, "failed", content=tool_content(chunk.get("errorText", "")))]
        if kind == "tool-output-denied":
            return [self._finish(chunk, "failed", content=tool_content("denied"))]
        return []

    def permission_call(self, call_id: str) -> ToolCallUpdate:
        """The call a ``session/request_permission`` is about (waiting: ``pending``)."""
        call = self.calls.get(call_id, {})
        return ToolCallUpdate(
            tool_call_id=call_id,
            title=call.get("name"),
            kind=self.kinds.get(call.get("name", ""), "other"),
            status="pending",
            raw_input=call.get("input"),
        )


def stop_reason(last: dict[str, Any] | None) -> StopReason:
    """ACP's ``stopReason`` for a turn whose stream ended with ``last`` (``abort``:
    cancelled; a ``finish``'s ``finishReason``: stop -> end_turn, length ->
    max_tokens, content-filter -> refusal, tool-calls (the step budget ran out with
    calls pending) -> max_turn_requests)."""
    if last is None:
        return "end_turn"
    if last.get("type") == "abort":
        return "cancelled"
    reason = last.get("finishReason")
    return {
        "length": "max_tokens",
        "content-filter": "refusal",
        "tool-calls": "max_turn_requests",
    }.get(str(reason), "end_turn")  # type: ignore[return-value]


# -- stored history (session/load) --------------------------------------------------------

_STATUS_OF_STATE: dict[str, ToolCallStatus] = {
    "output-available": "completed",
    "output-error": "failed",
    "output-denied": "failed",
}


def _stored_tool(part: dict[str, Any], kinds: dict[str, ToolKind]) -> ToolCallStart:
    state = part.get("state", "")
    status: ToolCallStatus = _STATUS_OF_STATE.get(state, "pending")
    content = None
    if state == "output-available":
        content = tool_content(_shown(part.get("output")))
    elif state == "output-error":
        content = tool_content(str(part.get("errorText", "")))
    elif state == "output-denied":
        content = tool_content("denied")
    name = str(part.get("toolName", "tool"))
    return ToolCallStart(
        session_update="tool_call",
        tool_call_id=str(part.get("toolCallId")),
        title=name,
        kind=kinds.get(name, "other"),
        status=status,
        raw_input=part.get("input"),
        raw_output=part.get("output") if state == "output-available" else None,
        content=content,
    )


def _stored_part(
    role: str, part: dict[str, Any], message_id: str | None, kinds: dict[str, ToolKind]
) -> SessionUpdate | None:
    kind = part.get("type")
    if kind == "text" and part.get("text"):
        block = TextContentBlock(type="text", text=str(part["text"]))
        if role == "user":
            return UserMessageChunk(
                session_update="user_message_chunk", content=block, message_id=message_id
            )
        return _text(block.text, message_id, "message")
    if kind == "reasoning" and part.get("text") and role == "assistant":
        return _text(str(part["text"]), message_id, "thought")
    if kind == "dynamic-tool" and part.get("toolCallId"):
        return _stored_tool(part, kinds)
    if kind == "data-compaction" and isinstance(part.get("data"), dict):
        summary = part["data"].get("summary")
        if summary:  # what the model reads in place of the turns it summarized
            return _text(f"[summary of earlier turns]\n{summary}", message_id, "message")
    return None


def history_updates(
    messages: Iterable[dict[str, Any]], kinds: dict[str, ToolKind] | None = None
) -> list[SessionUpdate]:
    """Every update that replays ``messages`` (a session's visible history, oldest
    first): user text, the assistant's text, reasoning and tool calls with their final
    status, in the order of their parts. System messages and parts ACP has no place for
    (files, sources, other data) are left out."""
    out: list[SessionUpdate] = []
    for message in messages:
        role = message.get("role")
        if role not in ("user", "assistant"):
            continue
        for part in message.get("parts") or ():
            if isinstance(part, dict):
                update = _stored_part(role, part, message.get("id"), kinds or {})
                if update is not None:
                    out.append(update)
    return out


# -- prompts ---------------------------------------------------------------------------------


def _block_text(block: Any) -> str:
    if isinstance(block, TextContentBlock):
        return block.text
    if isinstance(block, ResourceContentBlock):
        return f"[@{block.name}]({block.uri})"
    if isinstance(block, EmbeddedResourceContentBlock):
        resource = block.resource
        if not isinstance(resource, TextResourceContents):
            raise PromptContentError(
                f"resource {resource.uri!r} is binary: this agent takes text resources only"
            )
        return f'<context uri="{resource.uri}">\n{resource.text}\n</context>'
    raise PromptContentError(
        f"{getattr(block, 'type', type(block).__name__)} content is not supported by this "
        "agent (its promptCapabilities say so): send text, resource links or text resources"
    )


def user_message(blocks: Sequence[Any]) -> dict[str, Any]:
    """The user message (UIMessage shape) for a prompt's content blocks: one text part
    per block (a resource link as a Markdown link, an embedded text resource with its
    URI). Raises :class:`PromptContentError` for content the agent does not take or an
    empty prompt."""
    parts = [{"type": "text", "text": _block_text(b)} for b in blocks]
    if not parts:
        raise PromptContentError("the prompt is empty")
    return {"id": new_id(), "role": "user", "parts": parts}
