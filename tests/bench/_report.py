"""Shared by the benchmark scripts: percentiles, printing, and generated conversations."""

from __future__ import annotations

import random
from typing import Any

RNG = random.Random(7)
WORDS = [
    "".join(RNG.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(RNG.randint(2, 9)))
    for _ in range(2000)
]


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def kib(n: int) -> str:
    return f"{n / 1024:.0f} KiB"


def line(name: str, figure: str, target: str = "", ok: bool | None = None) -> None:
    verdict = "" if ok is None else ("ok" if ok else "OVER TARGET")
    shown = f"target {target}" if target else ""
    print(f"  {name:<52} {figure:<30} {shown:<26} {verdict}".rstrip())


def words(n: int) -> str:
    return " ".join(RNG.choice(WORDS) for _ in range(n))


def conversation(n: int, prefix: str = "m") -> list[dict[str, Any]]:
    """Realistic messages: 20-word user turns; 60-word replies, every fifth with a tool
    call (about 3 MB for 10,000 messages)."""
    out: list[dict[str, Any]] = []
    for i in range(n):
        if i % 2 == 0:
            out.append(
                {
                    "id": f"{prefix}{i}",
                    "role": "user",
                    "metadata": {"createdAt": 1_700_000_000 + i},
                    "parts": [{"type": "text", "text": words(20)}],
                }
            )
            continue
        parts: list[dict[str, Any]] = [{"type": "step-start"}]
        if i % 10 == 1:
            parts.append(
                {
                    "type": "dynamic-tool",
                    "toolName": "search",
                    "toolCallId": f"call-{prefix}{i}",
                    "state": "output-available",
                    "input": {"query": words(4)},
                    "output": {"hits": [words(6), words(6)]},
                }
            )
            parts.append({"type": "step-start"})
        parts.append({"type": "text", "text": words(60), "state": "done"})
        out.append(
            {
                "id": f"{prefix}{i}",
                "role": "assistant",
                "metadata": {"usage": {"input": 1200 + i, "output": 80, "cache_read": 900}},
                "parts": parts,
            }
        )
    return out


def light(n: int, prefix: str = "l") -> list[dict[str, Any]]:
    """The shape DESIGN.md's walk figure was measured with: one short text per message."""
    return [
        {
            "id": f"{prefix}{i}",
            "role": "user" if i % 2 == 0 else "assistant",
            "metadata": None,
            "parts": [{"type": "text", "text": f"message {i}"}],
        }
        for i in range(n)
    ]
