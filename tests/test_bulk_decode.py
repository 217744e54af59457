"""A history read decodes its rows in bulk with msgspec (``session_store._unpack_many``):
it must give exactly the values msgpack's decoder gives for what ``codec.pack`` wrote,
types included (str against bytes, int against float, list, dict keys of any scalar)."""

from __future__ import annotations

import random
from typing import Any

from thinkray.storage.codec import pack, unpack
from thinkray.storage.session_store import _unpack_many

SCALARS: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    2**31,
    2**63 - 1,
    -(2**63),
    2**64 - 1,
    0.5,
    -0.0,
    float("inf"),
    1e300,
    "",
    "text",
    "ü€😀\u2028",
    "\x00",
    b"",
    b"\x00\xff bytes",
]


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.random()
    if depth > 3 or kind < 0.5:
        return rng.choice(SCALARS + [rng.randint(-(2**40), 2**40), rng.random(), "x" * 300])
    if kind < 0.75:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    keys: list[Any] = ["a", "type", "", 1, -7, 2.5, b"k", True, None]
    return {rng.choice(keys): _value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (1 == 1.0 == True in Python)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(
            type(k1) is type(k2) and _same(a[k1], b[k2]) for k1, k2 in zip(a, b, strict=True)
        )
    if isinstance(a, float) and a != a:
        return b != b
    return bool(a == b)


def test_the_bulk_decode_gives_what_msgpack_gives_for_random_values():
    rng = random.Random(23)
    for _ in range(200):
        values = [_value(rng) for _ in range(rng.randint(1, 20))]
        blobs = [pack(v) for v in values]
        bulk = _unpack_many(blobs)
        one_by_one = [unpack(b) for b in blobs]
        assert len(bulk) == len(values)
        for got, want in zip(bulk, one_by_one, strict=True):
            assert _same(got, want), (got, want)


def test_nothing_decodes_to_nothing_and_one_value_alone():
    assert _unpack_many([]) == []
    assert _unpack_many([pack({"id": "m1", "parts": [b"\x01"]})]) == [
        {"id": "m1", "parts": [b"\x01"]}
    ]
