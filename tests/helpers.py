"""Small helpers shared by the Ray tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(predicate: Callable[[], Any], timeout: float = 15.0, interval: float = 0.05) -> Any:
    """Poll until ``predicate()`` is truthy; return its value or fail the test."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


def text_of(message: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for p in message["parts"] if p["type"] == "text")


class Raiser:
    """A bare Ray actor body for error round trips: raises or returns what it is given."""

    def raise_it(self, error: BaseException) -> None:
        raise error

    def echo(self, error: BaseException) -> BaseException:
        return error
