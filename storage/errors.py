"""The root of every thinkray exception, and the storage layer's own errors.

``ThinkrayError`` lives here, in the bottom layer, so that storage, runtime and actors
errors share one root; ``thinkray.runtime.errors`` and ``thinkray.actors.errors``
re-export it with their own subclasses. ``UserError`` marks a caller's mistake (bad
input, a call that is not allowed): retrying the same call cannot succeed.

Every exception must survive ``pickle`` — Ray carries errors across actors that way —
with its message and fields intact (``tests/test_errors.py`` walks all of them).
"""

from __future__ import annotations

__all__ = ["ThinkrayError", "UserError"]


class ThinkrayError(Exception):
    """Root of every exception thinkray raises on purpose."""


class UserError(ThinkrayError):
    """The caller did something wrong (bad input, an unknown name, a call that is not
    allowed). The message says what, and what to do instead; nothing was changed."""
