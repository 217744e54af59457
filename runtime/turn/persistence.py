"""What happens to a message on its way to storage (seed 000 §7).

1. Sanitize: strip provider ephemera (OpenAI ``itemId``, ``reasoningEncryptedContent``)
   and drop empty reasoning parts that carry no provider metadata.
2. Row size: a part over :data:`ROW_MAX_BYTES` is compacted with a ``[truncated]``
   marker (tool outputs become a preview; long text is cut) — never dropped.
3. Persist cache: :class:`PersistCache` remembers the last bytes written per part, so
   an unchanged part is not written again.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import msgpack
from thinkray.runtime.errors import MessageTooLargeError

ROW_MAX_BYTES = 1_800_000
TRUNCATED_MARKER = "[truncated]"
_PREVIEW_CHARS = 2_000


def encode(part: dict[str, Any]) -> bytes:
    """The msgpack bytes of a part (what a row's size is measured on); values msgpack
    cannot encode go through JSON, or become their ``str``."""
    return msgpack.packb(part, use_bin_type=True, default=_default)


def _default(value: Any) -> Any:
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError):
        return str(value)


def _strip_provider_metadata(meta: Any) -> Any:
    if not isinstance(meta, dict):
        return meta
    meta = dict(meta)
    openai = meta.get("openai")
    if isinstance(openai, dict):
        openai = {
            k: v for k, v in openai.items() if k not in ("itemId", "reasoningEncryptedContent")
        }
        if openai:
            meta["openai"] = openai
        else:
            meta.pop("openai")
    return meta


def sanitize_message(message: dict[str, Any]) -> dict[str, Any]:
    """A sanitized copy (the input is not modified)."""
    parts = []
    for part in message.get("parts", ()):
        part = dict(part)
        for key in ("providerMetadata", "callProviderMetadata"):
            if key in part:
                cleaned = _strip_provider_metadata(part[key])
                if cleaned:
                    part[key] = cleaned
                else:
                    part.pop(key)
        if (
            part.get("type") == "reasoning"
            and not (part.get("text") or "").strip()
            and not part.get("providerMetadata")
        ):
            continue
        parts.append(part)
    out = dict(message)
    out["parts"] = parts
    return out


def enforce_row_size(part: dict[str, Any], limit: int = ROW_MAX_BYTES) -> dict[str, Any]:
    """Return ``part`` or, if its encoding exceeds ``limit``, a compacted copy."""
    size = len(encode(part))
    if size <= limit:
        return part
    part = copy.copy(part)
    if part.get("type") == "dynamic-tool" and "output" in part:
        rendered = (
            part["output"]
            if isinstance(part["output"], str)
            else json.dumps(part["output"], default=str)
        )
        part["output"] = (
            f"{TRUNCATED_MARKER} This tool output was too large to persist ({size} bytes). "
            f"If it is needed again, re-run the tool. Preview: {rendered[:_PREVIEW_CHARS]}"
        )
        size = len(encode(part))
    if "text" in part and size > limit:
        text = part["text"]
        overhead = size - len(text.encode())
        budget = max(0, limit - overhead - 64)
        cut = text.encode()[:budget].decode("utf-8", errors="ignore")
        part["text"] = f"{cut}\n\n{TRUNCATED_MARKER}"
        size = len(encode(part))
    if "input" in part and size > limit:
        part["input"] = f"{TRUNCATED_MARKER} tool input too large to persist ({size} bytes)"
    if "data" in part and len(encode(part)) > limit:
        part["data"] = {"truncated": True, "note": f"{TRUNCATED_MARKER} data too large to persist"}
    return part


def prepare_message(message: dict[str, Any], limit: int = ROW_MAX_BYTES) -> dict[str, Any]:
    """Sanitize and enforce the row size on every part."""
    message = sanitize_message(message)
    message["parts"] = [enforce_row_size(p, limit) for p in message["parts"]]
    return message


def stored_size(message: dict[str, Any]) -> int:
    """Bytes a message takes in storage: its sanitized parts and its metadata, each
    encoded as stored. No part of a message within :data:`ROW_MAX_BYTES` is truncated."""
    parts = sanitize_message(message)["parts"]
    size = sum(len(encode(p)) for p in parts)
    metadata = message.get("metadata")
    return size + (len(encode(metadata)) if metadata else 0)


def check_message_size(message: dict[str, Any], limit: int) -> None:
    """Refuse an incoming message larger than ``limit`` bytes (:func:`stored_size`) or
    with a part over the row cap: it would be stored cut short (a ``[truncated]``
    part) and the model would never see what was sent.

    Raises:
        MessageTooLargeError: what is too big, by how much, and what to do instead.
    """
    size = stored_size(message)
    biggest = max((len(encode(p)) for p in message.get("parts", ())), default=0)
    if size <= limit and biggest <= ROW_MAX_BYTES:
        return
    allowed = min(limit, ROW_MAX_BYTES) if biggest > ROW_MAX_BYTES else limit
    raise MessageTooLargeError(
        f"the message is {size:,} bytes; this agent accepts at most {allowed:,} bytes "
        "per message (and a stored part at most "
        f"{ROW_MAX_BYTES:,}). Nothing was stored: send large content as a file in the "
        "workspace and refer to it, or split it over several messages.",
        size=size,
        limit=allowed,
    )


class PersistCache:
    """Last bytes written per ``(message_id, index)``; lets callers skip unchanged writes."""

    def __init__(self) -> None:
        self._parts: dict[tuple[str, int], bytes] = {}
        self._lengths: dict[str, int] = {}
        self.skipped = 0

    def changed(self, message_id: str, index: int, part: dict[str, Any]) -> bool:
        """Whether ``part`` differs from what was last recorded at its slot; records it
        when it does (a caller that gets True is expected to write it)."""
        blob = encode(part)
        key = (message_id, index)
        if self._parts.get(key) == blob:
            self.skipped += 1
            return False
        self._parts[key] = blob
        return True

    def forget(self, message_id: str | None = None) -> None:
        """Drop what is remembered of one message (``None``: of every message), so its
        parts are written again."""
        if message_id is None:
            self._parts.clear()
            self._lengths.clear()
            return
        for key in [k for k in self._parts if k[0] == message_id]:
            del self._parts[key]
        self._lengths.pop(message_id, None)

    def length(self, message_id: str) -> int | None:
        """The part count last stored for the message, or ``None`` if not recorded."""
        return self._lengths.get(message_id)

    def set_length(self, message_id: str, length: int) -> None:
        """Record the part count stored for the message."""
        self._lengths[message_id] = length
