"""The storage seams. Every implementation must pass ``tests/conformance``.

All methods are synchronous: a store lives inside one actor, is used by one writer,
and its calls take microseconds to a few milliseconds. Callers in an event loop call
them directly (the per-chunk path is batched through :meth:`SessionStore.flush_stream`).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from storage.types import Message, MessageRow, SessionInfo, StreamFlush

HEAD: Any = object()
"""Sentinel for ``parent_id``: attach the new message to the session's current head."""


@runtime_checkable
class SessionStore(Protocol):
    """Sessions, their message trees and parts, the chunk log, and key/value config.

    Contract (checked by the conformance suite):

    - **Not found is an error.** Every method taking a ``session_id`` raises
      :class:`~storage.types.SessionNotFoundError` for an unknown id; nothing is ever
      created implicitly except by :meth:`create_session`.
    - **Validation before writes.** Malformed input raises
      :class:`~storage.types.InvalidInputError` and writes nothing.
    - **Idempotency.** :meth:`append_message` with an id that exists is a no-op that
      returns ``False`` (the first write wins); :meth:`upsert_message` replaces.
    - **Tree and head.** Messages form a tree through ``parent_id``. Each session has
      a *head* (the leaf of its current branch); appending moves the head to the new
      message. :meth:`get_history` walks from a leaf (default: the head, or the most
      recent visible message when the head is unset) to the root and returns
      root-first, skipping hidden messages unless asked.
    - **Ordering.** ``seq`` increases with every inserted message in the store;
      parts keep their ``index`` order; chunks keep their ``index`` order.
    - **Atomic flush.** :meth:`flush_stream` writes the whole batch in one
      transaction or nothing.
    - **Close.** :meth:`close` flushes, checkpoints and releases the file; it is
      idempotent.
    """

    # -- sessions -------------------------------------------------------------------

    def create_session(
        self,
        name: str = "New Chat",
        *,
        session_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        parent_session_id: str | None = None,
        parent_message_id: str | None = None,
        thread_key: str | None = None,
        model: dict[str, Any] | None = None,
    ) -> SessionInfo: ...

    def get_session(self, session_id: str) -> SessionInfo: ...

    def has_session(self, session_id: str) -> bool: ...

    def list_sessions(
        self, *, parent_session_id: str | None = None, include_ephemeral: bool = False
    ) -> list[SessionInfo]:
        """Most recently updated first. With ``parent_session_id``, only its branches."""
        ...

    def rename_session(self, session_id: str, name: str) -> None: ...

    def update_session(
        self,
        session_id: str,
        *,
        metadata: dict[str, Any] | None = None,
        model: dict[str, Any] | None = None,
        permissions: dict[str, Any] | None = None,
        settings: dict[str, Any] | None = None,
    ) -> SessionInfo:
        """``metadata`` is merged (shallow); ``model``/``permissions``/``settings`` replace."""
        ...

    def add_usage(self, session_id: str, usage: dict[str, Any]) -> SessionInfo:
        """Add one step's usage to the rollups.

        ``usage`` keys: ``input``, ``output``, ``reasoning``, ``cache_read``,
        ``cache_write`` (input excludes cache tokens) and optional ``cost_usd``.
        ``total_tokens`` grows by the sum of all five; ``cost_usd`` stays ``None``
        until some writer supplies one.
        """
        ...

    def set_usage(self, session_id: str, rollup: dict[str, Any]) -> SessionInfo:
        """Replace the rollups (used when a branch recomputes them from its copies)."""
        ...

    def delete_session(self, session_id: str) -> None:
        """Delete the session, its messages, parts and compactions."""
        ...

    def clear_messages(self, session_id: str) -> None:
        """Delete every message of the session; keep the session; reset head and usage."""
        ...

    # -- messages -------------------------------------------------------------------

    def append_message(
        self, session_id: str, message: Message, *, parent_id: str | None = HEAD
    ) -> bool:
        """Insert a message and its parts; move the head to it.

        Returns ``False`` (and writes nothing) if a message with this id exists.
        """
        ...

    def upsert_message(
        self, session_id: str, message: Message, *, parent_id: str | None = HEAD
    ) -> None:
        """Insert, or replace the metadata and all parts of an existing message."""
        ...

    def flush_stream(self, flush: StreamFlush) -> None: ...

    def get_message(self, message_id: str) -> Message | None: ...

    def get_message_row(self, message_id: str) -> MessageRow | None: ...

    def get_history(
        self, session_id: str, *, leaf_id: str | None = None, include_hidden: bool = False
    ) -> list[Message]: ...

    def get_path(self, session_id: str, *, leaf_id: str | None = None) -> list[MessageRow]:
        """Root-first rows from the leaf to the root, hidden ones included."""
        ...

    def message_count(self, session_id: str, *, include_hidden: bool = False) -> int: ...

    def children(self, message_id: str) -> list[Message]:
        """Direct children (the branches at this message), oldest first."""
        ...

    def set_head(self, session_id: str, message_id: str | None) -> None: ...

    def delete_messages(self, session_id: str, message_ids: list[str]) -> None: ...

    def set_hidden(self, session_id: str, message_ids: list[str], hidden_at: float | None) -> None:
        """Soft-hide (``hidden_at`` set) or un-hide (``None``) messages. Never deletes."""
        ...

    # -- chunk log ------------------------------------------------------------------

    def get_chunks(self, generation_id: str, start: int = 0) -> list[dict[str, Any]]:
        """The run's chunks from ``start``, in index order."""
        ...

    def delete_chunks(self, generation_ids: list[str]) -> None: ...

    def chunk_generations(self) -> list[str]:
        """Generation ids that have chunks, oldest first."""
        ...

    # -- config ---------------------------------------------------------------------

    def get_config(self, key: str, default: Any = None) -> Any: ...

    def set_config(self, key: str, value: Any) -> None: ...

    def delete_config(self, key: str) -> None: ...

    # -- lifecycle ------------------------------------------------------------------

    def close(self) -> None: ...
