"""Every exception the Ray layer raises on purpose, in one place."""

from __future__ import annotations

from thinkray.runtime.errors import *  # noqa: F403  # the runtime errors an actor caller meets
from thinkray.runtime.errors import ThinkrayError, UserError
from thinkray.runtime.errors import __all__ as _runtime_errors

__all__ = [
    *_runtime_errors,
    "BridgeAccessError",
    "ConsumerGone",
    "NotBoundError",
    "SyncInEventLoopError",
]


class SyncInEventLoopError(UserError, RuntimeError):
    """``response.result()`` was called inside a running event loop (it would block
    the loop): ``await response`` there instead."""


class ConsumerGone(ThinkrayError, RuntimeError):
    """The relay's consumer failed; the run detaches it and goes on."""


class NotBoundError(ThinkrayError, RuntimeError):
    """This actor does not host that agent (any more): resolve the name again."""

    def __init__(self, name: str = "", bound: str | None = None) -> None:
        super().__init__(
            f"actor does not host {name!r}" + (f" (it hosts {bound!r})" if bound else "")
        )
        self.name = name
        self.bound = bound


class BridgeAccessError(UserError, PermissionError):
    """The caller's grant does not allow this operation."""
