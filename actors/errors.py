"""Every exception the Ray layer raises on purpose, in one place."""

from __future__ import annotations

from thinkray.runtime.errors import RemoteCallError, ThinkrayError, UserError

__all__ = ["RemoteCallError", "SyncInEventLoopError", "ThinkrayError", "UserError"]


class SyncInEventLoopError(UserError, RuntimeError):
    """``response.result()`` was called inside a running event loop (it would block
    the loop): ``await response`` there instead."""
