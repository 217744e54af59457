"""A message's parts as one msgpack value in its row (``messages.parts``, issue 23).

Every non-empty table of an agent file takes at least one 16 KiB block, and a history
load read the parts of a session in a query of their own (~9 ms of ~55 at 10,000
messages, plus one decode per part). So the parts live in their message's row:

- The blob is a msgpack **array** of the parts in index order, built from the parts'
  own packed bytes (the array header, then the payloads as they are: no re-encoding),
  so a history decode is one msgpack call for all messages' parts.
- Parts are upserted by ``(message, index)`` (:class:`~thinkray.storage.types.PartWrite`)
  and a write may leave a gap. A message whose indexes are not ``0..n-1`` is stored as
  a msgpack **map** ``{index: part}`` instead, so that a later write to the same index
  replaces the same part (what the per-part rows did); readers list its values in
  index order. The first byte tells the two apart (an array is ``0x90-0x9f``,
  ``0xdc`` or ``0xdd``; a map ``0x80-0x8f``, ``0xde`` or ``0xdf``).
- An empty or absent list of parts is the empty array (``0x90``); NULL reads as none.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import msgpack

EMPTY = b"\x90"
COMPACTION_TYPE = "data-compaction"
_COMPACTION_BYTES = COMPACTION_TYPE.encode()


def _header(n: int, small: int, two: int, four: int) -> bytes:
    if n < 16:
        return bytes((small | n,))
    if n < 1 << 16:
        return bytes((two,)) + n.to_bytes(2, "big")
    return bytes((four,)) + n.to_bytes(4, "big")


def pack(payloads: Sequence[bytes]) -> bytes:
    """The blob of parts whose packed bytes are ``payloads`` (indexes ``0..n-1``)."""
    if not payloads:
        return EMPTY
    return b"".join((_header(len(payloads), 0x90, 0xDC, 0xDD), *payloads))


def pack_slots(slots: Mapping[int, bytes]) -> bytes:
    """The blob of parts by index: an array when the indexes are ``0..n-1``, else a
    map (see the module)."""
    if len(slots) == 0:
        return EMPTY
    keys = sorted(slots)
    if keys[-1] == len(keys) - 1:
        return pack([slots[k] for k in keys])
    head = _header(len(keys), 0x80, 0xDE, 0xDF)
    return b"".join((head, *(piece for k in keys for piece in (msgpack.packb(k), slots[k]))))


def slots(blob: bytes | None) -> dict[int, bytes]:
    """``index -> packed part`` of a blob (without decoding the parts)."""
    if not blob:
        return {}
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(blob)
    first = blob[0]
    out: dict[int, bytes] = {}
    if 0x80 <= first <= 0x8F or first in (0xDE, 0xDF):
        count = unpacker.read_map_header()
        for _ in range(count):
            key = unpacker.unpack()
            start = unpacker.tell()
            unpacker.skip()
            out[int(key)] = blob[start : unpacker.tell()]
        return out
    count = unpacker.read_array_header()
    start = unpacker.tell()
    for index in range(count):
        unpacker.skip()
        end = unpacker.tell()
        out[index] = blob[start:end]
        start = end
    return out


def payloads(blob: bytes | None) -> list[bytes]:
    """The packed parts of a blob, in index order."""
    found = slots(blob)
    return [found[k] for k in sorted(found)]


def splice(blob: bytes | None, length: int | None, writes: Mapping[int, bytes]) -> bytes:
    """``blob`` with its parts from index ``length`` on dropped (None: none), then
    ``writes`` (index -> packed part) put in place."""
    current = slots(blob)
    if length is not None:
        current = {k: v for k, v in current.items() if k < length}
    current.update(writes)
    return pack_slots(current)


def as_list(decoded: Any) -> list[Any]:
    """A decoded blob as the message's ``parts`` list."""
    if decoded.__class__ is list:
        return decoded
    if isinstance(decoded, dict):
        return [decoded[k] for k in sorted(decoded)]
    return []


def has_compaction(payloads: Iterable[bytes]) -> bool:
    """Whether one of the packed parts is a compaction (``data-compaction``)."""
    for payload in payloads:
        if _COMPACTION_BYTES in payload:
            part = msgpack.unpackb(payload, raw=False, strict_map_key=False)
            if isinstance(part, dict) and part.get("type") == COMPACTION_TYPE:
                return True
    return False


def blob_has_compaction(blob: bytes | None) -> bool:
    """Whether a blob holds a compaction part (decodes only a blob that may)."""
    if not blob or _COMPACTION_BYTES not in blob:
        return False
    return has_compaction(payloads(blob))


def compaction_parts(
    rows: Iterable[tuple[Any, bytes | None]],
) -> Iterator[tuple[Any, dict[str, Any]]]:
    """``(key, part)`` of every compaction part of ``(key, parts blob)`` rows."""
    for key, blob in rows:
        if not blob:
            continue
        for part in as_list(msgpack.unpackb(blob, raw=False, strict_map_key=False)):
            if isinstance(part, dict) and part.get("type") == COMPACTION_TYPE:
                yield key, part
