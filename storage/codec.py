"""msgpack encoding of the blob columns every store uses."""

from __future__ import annotations

from typing import Any

import msgpack
from thinkray.storage.types import InvalidInputError


def pack(value: Any, what: str = "value") -> bytes:
    """msgpack-encode ``value``; an unencodable value is an :class:`InvalidInputError`
    raised before anything is written."""
    try:
        return msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidInputError(
            f"{what} must be msgpack-serializable (dicts, lists, str, bytes, numbers, "
            f"bool, None): {exc}"
        ) from exc


def unpack(blob: bytes | bytearray | None) -> Any:
    """Decode what :func:`pack` wrote (``None`` for a NULL column). Tuples come back
    as lists; maps may have non-string keys."""
    if blob is None:
        return None
    return msgpack.unpackb(blob, raw=False, strict_map_key=False)
