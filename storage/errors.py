"""The root of every thinkray exception, and the storage layer's own errors.

``ThinkrayError`` lives here, in the bottom layer, so that storage, runtime and actors
errors share one root; ``thinkray.runtime.errors`` and ``thinkray.actors.errors``
re-export it with their own subclasses. ``UserError`` marks a caller's mistake (bad
input, a call that is not allowed): retrying the same call cannot succeed.

Every exception must survive ``pickle`` — Ray carries errors across actors that way —
with its message and fields intact (``tests/test_errors.py`` walks all of them).
"""

from __future__ import annotations

from typing import Any


def _rebuild(cls: type[ThinkrayError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    """Unpickle a ThinkrayError: the instance with its args and fields, no __init__."""
    # OSError (and so TimeoutError) has its own constructor that a class mixing it with
    # another built-in (RuntimeError) must be created through.
    new = OSError.__new__ if issubclass(cls, OSError) else cls.__new__
    error = new(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


__all__ = [
    "InvalidTypeError",
    "CorruptDatabaseError",
    "DatabaseClosedError",
    "DatabaseFileError",
    "DatabaseLockedError",
    "FiberNotFoundError",
    "InboxMessageNotFoundError",
    "InvalidInputError",
    "MessageNotFoundError",
    "NotFoundError",
    "NotOnPathError",
    "ScheduleNotFoundError",
    "SessionNotFoundError",
    "StorageError",
    "StorageRootError",
    "SubAgentNotFoundError",
    "ThinkrayError",
    "ThreadExistsError",
    "ThreadNotFoundError",
    "UserError",
    "WorkspaceError",
    "WorkspaceExistsError",
    "WorkspaceIsADirectoryError",
    "WorkspaceLimitError",
    "WorkspaceNotADirectoryError",
    "WorkspaceNotEmptyError",
    "WorkspaceNotFoundError",
    "WorkspacePathError",
]


class ThinkrayError(Exception):
    """Root of every exception thinkray raises on purpose.

    Pickles by value: unpickling rebuilds the exception from its ``args`` and fields
    without calling ``__init__`` again, so a subclass whose constructor formats its
    message (or takes other arguments than ``args``) crosses Ray intact."""

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (type(self), self.args, dict(self.__dict__))


class UserError(ThinkrayError):
    """The caller did something wrong (bad input, an unknown name, a call that is not
    allowed). The message says what, and what to do instead; nothing was changed."""


class StorageError(ThinkrayError):
    """Base class for storage errors (re-exported by :mod:`thinkray.storage.db`)."""


class NotFoundError(StorageError, UserError, KeyError):
    """A session, message or thread that does not exist. Never silently created."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else "not found"


class SessionNotFoundError(NotFoundError):
    """No session with this id in the store."""


class MessageNotFoundError(NotFoundError):
    """No message with this id in the session."""


class InvalidInputError(StorageError, UserError, ValueError):
    """Input rejected before anything was written."""


class ThreadNotFoundError(NotFoundError):
    """No thread with this key in the store."""


class ThreadExistsError(InvalidInputError):
    """A thread with this key exists (clone never overwrites)."""


class NotOnPathError(InvalidInputError):
    """The message exists but is not where the operation needs it: not on the
    session's current path, hidden, or of the wrong role."""


class DatabaseLockedError(StorageError):
    """Another process holds the file (DuckDB allows one writer per file)."""


class DatabaseFileError(StorageError):
    """An agent's DuckDB file cannot be opened, read or written (DuckDB's I/O error).

    ``path`` is the file, ``agent`` and ``namespace`` the agent it belongs to (from
    ``root/<namespace>/<agent>.duckdb``; None for a file outside that layout), ``reason``
    DuckDB's own message. Nothing was written by the call that raised it."""

    def __init__(
        self,
        message: str,
        path: str = "",
        agent: str | None = None,
        namespace: str | None = None,
        reason: str = "",
    ) -> None:
        super().__init__(message)
        self.path = path
        self.agent = agent
        self.namespace = namespace
        self.reason = reason


class CorruptDatabaseError(DatabaseFileError):
    """The agent's file is not a readable DuckDB database: overwritten, truncated or
    damaged. thinkray never repairs or replaces it; restore it from a backup or move it
    aside (the agent then starts empty)."""


class DatabaseClosedError(StorageError):
    """The database was closed (the actor hibernated or is shutting down)."""


class FiberNotFoundError(NotFoundError):
    """No fiber with this id."""


class ScheduleNotFoundError(NotFoundError):
    """No schedule with this id."""


class InboxMessageNotFoundError(NotFoundError):
    """No inbox message with this id."""


class SubAgentNotFoundError(NotFoundError):
    """No sub-agent with this name in the orchestrator's registry."""


class StorageRootError(InvalidInputError):
    """The storage root cannot be used (missing permissions, not a directory)."""


class WorkspaceError(StorageError):
    """Base class of workspace errors. ``str(exc)`` is a message fit for a model."""


class WorkspacePathError(WorkspaceError, ValueError):
    """A path that is not in canonical form (normalize it with ``thinkray.runtime.tools.paths``)."""


class WorkspaceNotFoundError(WorkspaceError, FileNotFoundError):
    """No file or directory at this workspace path."""


class WorkspaceExistsError(WorkspaceError, FileExistsError):
    """Something already exists at this workspace path."""


class WorkspaceIsADirectoryError(WorkspaceError, IsADirectoryError):
    """A file operation on a workspace directory."""


class WorkspaceNotADirectoryError(WorkspaceError, NotADirectoryError):
    """A directory operation on a workspace file (or through one)."""


class WorkspaceNotEmptyError(WorkspaceError, OSError):
    """Deleting a non-empty workspace directory without ``recursive``."""


class WorkspaceLimitError(WorkspaceError):
    """A write would exceed the file size, total size or entry count limit."""


class InvalidTypeError(UserError, TypeError):
    """An argument of the wrong type (the message names what was expected)."""
