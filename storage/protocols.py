"""The storage seams. Every implementation must pass ``tests/conformance``.

All methods are synchronous: a store lives inside one actor, is used by one writer,
and its calls take microseconds to a few milliseconds. Callers in an event loop call
them directly (the per-chunk path is batched through :meth:`SessionStore.flush_stream`).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from thinkray.storage.types import (
    Message,
    MessageRow,
    RewindInfo,
    SessionInfo,
    StreamFlush,
    UnrewindInfo,
)

HEAD: Any = object()
"""Sentinel for ``parent_id``: attach the new message to the session's current head."""


@runtime_checkable
class SessionStore(Protocol):
    """Sessions, their message trees and parts, the chunk log, and key/value config.

    Contract (checked by the conformance suite):

    - **Not found is an error.** Every method taking a ``session_id`` raises
      :class:`~thinkray.storage.types.SessionNotFoundError` for an unknown id; nothing is ever
      created implicitly except by :meth:`create_session`.
    - **Validation before writes.** Malformed input raises
      :class:`~thinkray.storage.types.InvalidInputError` and writes nothing.
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

    # -- threads (seed 001) ---------------------------------------------------------

    def thread(self, key: str | None = None) -> Thread:
        """Create or get the thread keyed ``key`` (a session with that ``thread_key``).

        ``key`` must match :data:`~thinkray.storage.types.THREAD_KEY_PATTERN`, else
        :class:`~thinkray.storage.types.InvalidInputError` before anything is written. ``None``
        is :data:`~thinkray.storage.types.DEFAULT_THREAD_KEY`. Thread keys are unique.
        """
        ...

    def get_thread(self, key: str) -> Thread:
        """The existing thread; :class:`~thinkray.storage.types.ThreadNotFoundError` otherwise."""
        ...

    def list_threads(self) -> list[SessionInfo]:
        """Every keyed session, most recently updated first."""
        ...

    def delete_thread(self, key: str) -> None:
        """Delete the thread's session and its messages; unknown key is not found."""
        ...

    def clone_thread(
        self, src_key: str, dst_key: str, from_message_id: str | None = None
    ) -> Thread:
        """Copy ``src_key``'s visible history, root to ``from_message_id`` (default:
        its head), into a new thread ``dst_key``: what :meth:`branch_session` does,
        keyed. Fails with :class:`~thinkray.storage.types.ThreadExistsError` if ``dst_key``
        exists, and with :class:`~thinkray.storage.types.NotOnPathError` if the message is not
        on the source's visible history; either writes nothing."""
        ...

    def get_effective_settings(self, session_id: str) -> dict[str, Any]:
        """The session's ``settings`` over the store default
        (config :data:`~thinkray.storage.types.DEFAULT_SETTINGS_KEY`), nested dicts merged."""
        ...

    # -- branch and rewind (seed 002) -------------------------------------------------

    def branch_session(
        self,
        parent_session_id: str,
        from_message_id: str,
        *,
        metadata: dict[str, Any] | None = None,
        name: str | None = None,
    ) -> SessionInfo:
        """A new session holding a copy of the parent's visible history up to and
        including ``from_message_id``.

        - ``from_message_id`` must be a visible message on the parent's current path
          (root to head), else :class:`~thinkray.storage.types.NotOnPathError`
          (:class:`~thinkray.storage.types.MessageNotFoundError` if it is not in the session
          at all); nothing is written.
        - Hidden messages are skipped; the copies get new ids and form one chain;
          envelopes (metadata) and parts are copied verbatim. The new head is the
          copy of ``from_message_id``.
        - The row gets ``parent_session_id``/``parent_message_id``, the parent's name,
          model, settings and metadata (``metadata`` merged over it); not its session
          permissions; usage rollups recomputed from the copied assistant messages'
          ``metadata.usage``.
        """
        ...

    def rewind_session(
        self, session_id: str, message_id: str, *, include_target: bool = False
    ) -> RewindInfo:
        """Soft-hide everything after the user message ``message_id`` on the current
        path and move the head to it (``include_target``: hide it too, the head goes
        to its parent, so an edited message can be sent in its place).

        - The target must be a ``user`` message on the current path, else
          :class:`~thinkray.storage.types.NotOnPathError` and nothing is written.
        - A compaction (a message with a ``data-compaction`` part) that the rewind
          hides gives back what it summarized up to the target: those messages are
          un-hidden (unless an earlier compaction, still on the path, covers them).
        - Each rewind is recorded; :meth:`unrewind_session` undoes the latest.
        """
        ...

    def unrewind_session(self, session_id: str) -> UnrewindInfo:
        """Undo the latest rewind: un-hide what it hid, re-hide what it un-hid, move the
        head back. Messages appended since stay, visible, on their own branch. Refused
        (:class:`~thinkray.storage.types.InvalidInputError`, nothing written) when there is no
        rewind to undo or when messages of the restored path were hidden after the
        rewind (a compaction ran since: restoring would lose them without a summary).
        """
        ...

    # -- lifecycle ------------------------------------------------------------------

    def close(self) -> None: ...


class Thread:
    """A handle on one keyed thread (seed 001): a session with a ``thread_key``.

    Cheap and stateless beyond ``(store, key, id)``; every call goes to the store, so
    a deleted thread raises :class:`~thinkray.storage.types.SessionNotFoundError`.
    """

    __slots__ = ("id", "key", "store")

    def __init__(self, store: SessionStore, key: str, session_id: str) -> None:
        self.store = store
        self.key = key
        self.id = session_id

    def append(self, message: Message, *, parent_id: str | None = HEAD) -> bool:
        return self.store.append_message(self.id, message, parent_id=parent_id)

    def get_messages(self, *, include_hidden: bool = False) -> list[Message]:
        return self.store.get_history(self.id, include_hidden=include_hidden)

    def info(self) -> SessionInfo:
        return self.store.get_session(self.id)

    @property
    def settings(self) -> dict[str, Any]:
        """This thread's own settings (compaction and the like); see
        :meth:`get_effective_settings` for what applies."""
        return self.store.get_session(self.id).settings

    @settings.setter
    def settings(self, value: dict[str, Any]) -> None:
        self.store.update_session(self.id, settings=value)

    def get_effective_settings(self) -> dict[str, Any]:
        return self.store.get_effective_settings(self.id)

    def clone(self, dst_key: str, from_message_id: str | None = None) -> Thread:
        return self.store.clone_thread(self.key, dst_key, from_message_id)

    def delete(self) -> None:
        self.store.delete_thread(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Thread) and (other.id, other.key) == (self.id, self.key)

    def __hash__(self) -> int:
        return hash((self.id, self.key))

    def __repr__(self) -> str:
        return f"Thread(key={self.key!r}, id={self.id!r})"
