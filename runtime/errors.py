"""Every exception the runtime raises on purpose, in one place."""

from __future__ import annotations

from thinkray.storage.errors import ThinkrayError, UserError

__all__ = ["ThinkrayError", "UserError"]
