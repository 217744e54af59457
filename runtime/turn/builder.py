"""applyChunkToParts: fold UI stream chunks into a UIMessage's parts.

``apply`` returns the index of the part a chunk changed (or None), so the recorder
rewrites only that row. Text and reasoning accumulate in lists and are joined when
a part is materialized — ``str +=`` per delta would make long answers quadratic.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from thinkray.runtime.chunks import LoopChunk, UIChunk, tool_output_error
from thinkray.runtime.errors import InvalidArgumentError


class MessageBuilder:
    """Builds one UIMessage (``message``) from the chunks of a run, part by part;
    ``metadata_dirty`` says the metadata changed since the owner last cleared it."""

    def __init__(self, message_id: str, role: str = "assistant") -> None:
        self.message: dict[str, Any] = {
            "id": message_id,
            "role": role,
            "metadata": None,
            "parts": [],
        }
        self._text: dict[int, list[str]] = {}
        self._by_block: dict[str, int] = {}
        self._by_call: dict[str, int] = {}
        self._tool_input_text: dict[int, list[str]] = {}
        self.metadata_dirty = False

    @property
    def parts(self) -> list[dict[str, Any]]:
        """The message's parts, live; a streaming part's ``text`` may lag behind its
        deltas (:meth:`part` joins them)."""
        return self.message["parts"]

    def _append(self, part: dict[str, Any]) -> int:
        self.parts.append(part)
        return len(self.parts) - 1

    def _merge_metadata(self, meta: dict[str, Any] | None) -> None:
        if meta:
            current = self.message["metadata"] or {}
            current.update(meta)
            self.message["metadata"] = current
            self.metadata_dirty = True

    def part(self, index: int) -> dict[str, Any]:
        """The part at ``index`` with its accumulated text materialized."""
        part = self.parts[index]
        buf = self._text.get(index)
        if buf is not None and len(buf) > 1:
            joined = "".join(buf)
            buf[:] = [joined]
            part["text"] = joined
        elif buf:
            part["text"] = buf[0]
        return part

    def apply(self, chunk: UIChunk) -> int | None:
        """Fold ``chunk`` into the message; the index of the part it changed, or None.

        Raises :class:`InvalidArgumentError` for a delta whose start is missing."""
        if "data" in chunk:  # data-* chunks, the one kind with a data field
            return self._apply_data(chunk)
        if chunk["type"] == "text-delta" or chunk["type"] == "reasoning-delta":
            return self._apply_block_delta(chunk)
        if chunk["type"] == "text-start" or chunk["type"] == "reasoning-start":
            return self._apply_block_start(chunk)
        if chunk["type"] == "text-end" or chunk["type"] == "reasoning-end":
            return self._apply_block_end(chunk)
        if chunk["type"] == "start-step":
            return self._append({"type": "step-start"})
        if chunk["type"] == "tool-input-start" or chunk["type"] == "tool-input-delta":
            return self._apply_tool_input_stream(chunk)
        if chunk["type"] == "tool-input-available" or chunk["type"] == "tool-input-error":
            return self._apply_tool_input(chunk)
        if (
            chunk["type"] == "tool-output-available"
            or chunk["type"] == "tool-output-error"
            or chunk["type"] == "tool-output-denied"
        ):
            return self._apply_tool_output(chunk)
        if chunk["type"] == "tool-approval-request":
            idx = self._by_call.get(chunk["toolCallId"])
            if idx is None:
                return None
            self.parts[idx]["state"] = "approval-requested"
            self.parts[idx]["approval"] = {"id": chunk["approvalId"]}
            return idx
        if (
            chunk["type"] == "start"
            or chunk["type"] == "finish"
            or chunk["type"] == "message-metadata"
        ):
            self._merge_metadata(chunk.get("messageMetadata"))
            return None
        if chunk["type"] == "file" or chunk["type"] == "source-url":
            return self._append(_file_or_source_part(chunk))
        return None  # finish-step, error, abort: no part changes

    def _apply_block_delta(self, chunk: Mapping[str, Any]) -> int:
        idx = self._by_block.get(chunk["id"])
        if idx is None:
            raise InvalidArgumentError(
                f"{chunk['type']} for unknown block {chunk['id']!r}: its start is missing"
            )
        self._text[idx].append(chunk["delta"])
        return idx

    def _apply_block_start(self, chunk: Mapping[str, Any]) -> int:
        if chunk["type"] == "text-start":
            idx = self._append({"type": "text", "text": "", "state": "streaming"})
        else:
            # The AI SDK keeps a reasoning block's id on its part (text parts have none).
            idx = self._append(
                {"type": "reasoning", "id": chunk["id"], "text": "", "state": "streaming"}
            )
        self._by_block[chunk["id"]] = idx
        self._text[idx] = []
        if chunk.get("providerMetadata"):
            self.parts[idx]["providerMetadata"] = chunk["providerMetadata"]
        return idx

    def _apply_block_end(self, chunk: Mapping[str, Any]) -> int | None:
        idx = self._by_block.get(chunk["id"])
        if idx is None:
            return None
        self.parts[idx]["state"] = "done"
        if chunk.get("providerMetadata"):
            self.parts[idx]["providerMetadata"] = chunk["providerMetadata"]
        return idx

    def _apply_tool_input_stream(self, chunk: Mapping[str, Any]) -> int | None:
        """``tool-input-start`` and ``tool-input-delta``."""
        if chunk["type"] == "tool-input-start":
            idx = self._append(
                {
                    "type": "dynamic-tool",
                    "toolName": chunk["toolName"],
                    "toolCallId": chunk["toolCallId"],
                    "state": "input-streaming",
                    "input": None,
                }
            )
            self._by_call[chunk["toolCallId"]] = idx
            self._tool_input_text[idx] = []
            return idx
        started = self._by_call.get(chunk["toolCallId"])
        if started is None:
            raise InvalidArgumentError("tool-input-delta before its tool-input-start")
        self._tool_input_text[started].append(chunk["inputTextDelta"])
        return None  # partial JSON is not worth a row write; input lands when available

    def _apply_tool_input(self, chunk: Mapping[str, Any]) -> int:
        """``tool-input-available`` and ``tool-input-error``."""
        found = self._by_call.get(chunk["toolCallId"])
        if found is not None:
            idx = found
        else:
            idx = self._append(
                {
                    "type": "dynamic-tool",
                    "toolName": chunk["toolName"],
                    "toolCallId": chunk["toolCallId"],
                }
            )
            self._by_call[chunk["toolCallId"]] = idx
        part = self.parts[idx]
        part["input"] = chunk.get("input")
        if chunk["type"] == "tool-input-available":
            part["state"] = "input-available"
        else:
            part["state"] = "output-error"
            part["errorText"] = chunk.get("errorText")
        self._tool_input_text.pop(idx, None)
        return idx

    def _apply_tool_output(self, chunk: Mapping[str, Any]) -> int | None:
        """``tool-output-available``, ``tool-output-error`` and ``tool-output-denied``."""
        idx = self._by_call.get(chunk["toolCallId"])
        if idx is None:
            return None
        part = self.parts[idx]
        if chunk["type"] == "tool-output-available":
            part["state"] = "output-available"
            part["output"] = chunk.get("output")
        elif chunk["type"] == "tool-output-error":
            part["state"] = "output-error"
            part["errorText"] = chunk.get("errorText")
        else:
            part["state"] = "output-denied"
        return idx

    def _apply_data(self, chunk: Mapping[str, Any]) -> int | None:
        if chunk.get("transient"):
            return None
        t = chunk["type"]
        part = {"type": t, "data": chunk["data"]}
        if chunk.get("id") is not None:
            part["id"] = chunk["id"]
            for i, existing in enumerate(self.parts):
                if existing.get("type") == t and existing.get("id") == chunk["id"]:
                    self.parts[i] = part
                    return i
        return self._append(part)

    def finalize_streaming(self) -> list[int]:
        """On abort or error: text stops where it stopped (state ``done``), partial tool
        input is kept as text. Returns the indexes that changed."""
        changed = []
        for idx, part in enumerate(self.parts):
            if part.get("state") == "streaming":
                part["state"] = "done"
                changed.append(idx)
            if part.get("type") == "dynamic-tool" and part.get("state") == "input-streaming":
                raw = "".join(self._tool_input_text.get(idx, ()))
                if raw:
                    try:
                        part["input"] = json.loads(raw)
                    except json.JSONDecodeError:
                        part["input"] = raw
                    changed.append(idx)
        return changed

    def closing_chunks(self, error_text: str) -> list[LoopChunk]:
        """The chunks that end what is still open, for a run ending in abort or error:
        ``text-end``/``reasoning-end`` for each streaming block, ``tool-input-error``
        (with the input streamed so far) for a call whose input was still streaming,
        ``tool-output-error`` for a call that was waiting for its output or approval;
        ``error_text`` is the calls' error. Sent before the ``abort``/``error`` chunk,
        they make a client's final message the stored one: ``useChat`` stops reading
        at an ``error`` chunk, and nothing after it would reach the client."""
        block_ids = {idx: block_id for block_id, idx in self._by_block.items()}
        out: list[LoopChunk] = []
        for idx, part in enumerate(self.parts):
            kind, state = part.get("type"), part.get("state")
            if state == "streaming" and idx in block_ids:
                if kind == "text":
                    out.append({"type": "text-end", "id": block_ids[idx]})
                elif kind == "reasoning":
                    out.append({"type": "reasoning-end", "id": block_ids[idx]})
            elif kind == "dynamic-tool" and state == "input-streaming":
                raw = "".join(self._tool_input_text.get(idx, ()))
                partial: Any = None
                if raw:
                    try:
                        partial = json.loads(raw)
                    except json.JSONDecodeError:
                        partial = raw
                out.append(
                    {
                        "type": "tool-input-error",
                        "toolCallId": part["toolCallId"],
                        "toolName": part["toolName"],
                        "input": partial,
                        "errorText": error_text,
                        "dynamic": True,
                    }
                )
            elif kind == "dynamic-tool" and state in ("input-available", "approval-requested"):
                out.append(tool_output_error(part["toolCallId"], error_text))
        return out

    def unfinished_tool_calls(self) -> list[str]:
        """Tool call ids whose part has no output yet (input streaming or available)."""
        return [
            p["toolCallId"]
            for p in self.parts
            if p.get("type") == "dynamic-tool"
            and p.get("state") in ("input-streaming", "input-available", "approval-requested")
        ]

    def snapshot(self) -> dict[str, Any]:
        """The message with every part materialized (shares part dicts)."""
        for idx in self._text:
            self.part(idx)
        return self.message


def _file_or_source_part(chunk: Mapping[str, Any]) -> dict[str, Any]:
    if chunk["type"] == "file":
        return {"type": "file", "mediaType": chunk.get("mediaType"), "url": chunk.get("url")}
    return {
        "type": "source-url",
        "sourceId": chunk.get("sourceId"),
        "url": chunk.get("url"),
        "title": chunk.get("title"),
    }
