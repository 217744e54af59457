"""From stored UIMessages to what a model sees: conversion and pruning.

``to_model_messages`` is the AI SDK's convertToModelMessages for our parts: an
assistant message splits at ``step-start`` into (assistant, tool) pairs, one per step.
``prune_tool_calls`` is pruneMessages(toolCalls="before-last-N-messages").
"""

from __future__ import annotations

import json
from typing import Any

from thinkray.runtime.errors import InvalidArgumentError
from thinkray.runtime.models.base import (
    FileContent,
    ModelMessage,
    ReasoningContent,
    TextContent,
    ToolCallContent,
    ToolResultContent,
)

_CALLED_STATES = {"input-available", "output-available", "output-error", "output-denied"}


def _file_content(part: dict[str, Any]) -> FileContent:
    url = part.get("url", "")
    media = part.get("mediaType") or "application/octet-stream"
    if url.startswith("data:") and "," in url:
        header, data = url.split(",", 1)
        if ";base64" in header:
            return FileContent(media_type=media, data=data, filename=part.get("filename"))
    return FileContent(media_type=media, data=url, url=True, filename=part.get("filename"))


def _summary_text(part: dict[str, Any]) -> str:
    data = part.get("data") or {}
    summary = data.get("summary", "") if isinstance(data, dict) else str(data)
    return f"[Summary of the earlier conversation]\n{summary}"


# What the model is told for a call that ended without an output of its own.
_RESULT_ERRORS = {
    "output-denied": "The user denied this tool call.",
    # input-available with no result: finalized as an error so the prompt never
    # carries an unresolved call.
    "input-available": "tool call did not complete",
}


def _tool_result(part: dict[str, Any], state: str) -> ToolResultContent:
    """The result a called ``dynamic-tool`` part (state in ``_CALLED_STATES``) gives."""
    call_id, name = part["toolCallId"], part["toolName"]
    if state == "output-available":
        return ToolResultContent(tool_call_id=call_id, tool_name=name, output=part.get("output"))
    if state == "output-error":
        output = part.get("errorText") or "tool error"
    else:
        output = _RESULT_ERRORS[state]
    return ToolResultContent(tool_call_id=call_id, tool_name=name, output=output, is_error=True)


def _reasoning_content(part: dict[str, Any]) -> ReasoningContent | None:
    meta = (part.get("providerMetadata") or {}).get("anthropic") or {}
    if not (part.get("text") or meta.get("redactedData")):
        return None
    return ReasoningContent(
        text=part.get("text", ""),
        signature=meta.get("signature"),
        redacted_data=meta.get("redactedData"),
    )


def _assistant_steps(message: dict[str, Any]) -> list[ModelMessage]:
    out: list[ModelMessage] = []
    content: list[Any] = []
    results: list[ToolResultContent] = []

    def close_step() -> None:
        if content:
            out.append(ModelMessage(role="assistant", content=list(content)))
        if results:
            out.append(ModelMessage(role="tool", content=list(results)))
        content.clear()
        results.clear()

    for part in message.get("parts", ()):
        ptype = part.get("type")
        if ptype == "step-start":
            close_step()
        elif ptype == "text":
            if part.get("text"):
                content.append(TextContent(text=part["text"]))
        elif ptype == "reasoning":
            reasoning = _reasoning_content(part)
            if reasoning is not None:
                content.append(reasoning)
        elif ptype == "dynamic-tool":
            state = part.get("state")
            if state not in _CALLED_STATES:
                # An unfinished call (input still streaming) was never executed.
                continue
            content.append(
                ToolCallContent(
                    tool_call_id=part["toolCallId"],
                    tool_name=part["toolName"],
                    input=part.get("input"),
                )
            )
            results.append(_tool_result(part, state))
        elif ptype == "data-compaction":
            content.append(TextContent(text=_summary_text(part)))
        elif ptype == "data-steer":
            # A user message that joined the turn between two steps (the ``steer``
            # busy policy): the model read it there, after that step's tool results.
            close_step()
            steered = (part.get("data") or {}).get("message")
            if isinstance(steered, dict):
                out.extend(user_model_messages(steered))
    close_step()
    return out


def user_model_messages(message: dict[str, Any]) -> list[ModelMessage]:
    """A user (or system) UIMessage as the model reads it: its text and files."""
    content: list[Any] = []
    for part in message.get("parts", ()):
        ptype = part.get("type")
        if ptype == "text" and part.get("text"):
            content.append(TextContent(text=part["text"]))
        elif ptype == "file":
            content.append(_file_content(part))
    if not content:
        return []
    role = "system" if message.get("role") == "system" else "user"
    return [ModelMessage(role=role, content=content)]


def to_model_messages(messages: list[dict[str, Any]]) -> list[ModelMessage]:
    """Stored UIMessages as the provider-neutral messages a model reads: user text and
    files; assistant steps with their tool calls, each followed by its result (an
    unfinished call becomes an error result); a compaction summary as a system message."""
    out: list[ModelMessage] = []
    for message in messages:
        role = message.get("role")
        parts = message.get("parts", ())
        if role == "assistant":
            if any(p.get("type") == "data-compaction" for p in parts):
                # Seed 000: the summarized messages "are replaced with a single system
                # message containing the summary" — context the model reads as given,
                # not a turn the user took (a provider without system messages in the
                # list, Anthropic, joins it to the system prompt).
                summary = "\n\n".join(
                    _summary_text(p) for p in parts if p.get("type") == "data-compaction"
                )
                out.append(ModelMessage(role="system", content=[TextContent(text=summary)]))
                continue
            out.extend(_assistant_steps(message))
            continue
        out.extend(user_model_messages(message))
    return out


def prune_tool_calls(messages: list[ModelMessage], keep_last: int = 2) -> list[ModelMessage]:
    """Drop tool calls and results from every message but the last ``keep_last``;
    messages left empty are dropped."""
    if keep_last < 0:
        raise InvalidArgumentError("keep_last must be >= 0")
    cutoff = max(0, len(messages) - keep_last)
    out: list[ModelMessage] = []
    for i, msg in enumerate(messages):
        if i >= cutoff:
            out.append(msg)
            continue
        kept = [c for c in msg.content if c.type not in ("tool-call", "tool-result")]
        if kept:
            out.append(
                ModelMessage(role=msg.role, content=kept) if len(kept) != len(msg.content) else msg
            )
    return out


def render_output(output: Any) -> str:
    """Tool output as text for providers that take strings."""
    if isinstance(output, str):
        return output
    try:
        return json.dumps(output, default=str)
    except (TypeError, ValueError):
        return str(output)
