"""The storage seams. Every implementation must pass ``thinkray.storage.testing``.

All methods are synchronous: a store lives inside one actor, is used by one writer,
and its calls take microseconds to a few milliseconds. Callers in an event loop call
them directly (the per-chunk path is batched through :meth:`SessionStore.flush_stream`).

One database holds all of an agent's state: a :class:`SessionStore` and the
:class:`Stores` it hands out (:meth:`SessionStore.stores`: fibers and schedules, jobs,
inbox, sub-agent registry, key/value, workspace) share it, and so share one
transaction scope. Code outside ``thinkray.storage`` reaches the database only through
these protocols; the records they take and return live in
:mod:`thinkray.storage.records` (re-exported here).

**Transactions** (the same rule for every ``transaction()`` in this module): the block
commits everything written through any store of the database when it exits normally,
and nothing when it raises (the exception propagates). A ``transaction()`` entered
inside another one joins it: nothing commits before the outermost block exits, and an
exception leaving the outermost block undoes the inner blocks too (an exception caught
inside the outer block undoes nothing: what the inner block wrote commits with the
outer one). Each method call is atomic on its own. Other callers do not see the
block's writes before it commits; the block holds the database (calls from other
threads wait), so keep it short and never ``await`` inside it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from thinkray.storage.records import (
    DEFAULT_MAX_ENTRIES,
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_TOTAL_BYTES,
    AgentStateRecord,
    EntryInfo,
    FiberRecord,
    FiberStatus,
    InboxRow,
    JobRecord,
    QueuedTurn,
    ScheduleKind,
    ScheduleRecord,
    SubAgentRecord,
    ToolCallAudit,
    ToolCallRecord,
    WorkspaceLimits,
)
from thinkray.storage.types import (
    Message,
    MessageRow,
    RewindInfo,
    SearchHit,
    SessionInfo,
    StreamFlush,
    UnrewindInfo,
)

__all__ = [
    "HEAD",
    "AgentStateRecord",
    "AgentStateStore",
    "EntryInfo",
    "FiberRecord",
    "FiberStore",
    "InboxRow",
    "InboxStore",
    "JobRecord",
    "QueuedTurn",
    "ToolCallAudit",
    "ToolCallRecord",
    "ToolCallStore",
    "JobStore",
    "KeyValueStore",
    "RegistryStore",
    "ScheduleRecord",
    "SessionStore",
    "Stores",
    "SubAgentRecord",
    "Thread",
    "TurnQueueStore",
    "WorkspaceLimits",
    "WorkspaceStore",
]

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
    - **Transactions.** :meth:`transaction` groups calls (of this store and of its
      :meth:`stores`) into one commit, by the module's rule: everything or nothing,
      nested blocks join the outer one.
    - **Close.** :meth:`close` flushes, checkpoints and releases the file; it is
      idempotent. Afterwards every call, :meth:`stores` included, raises
      :class:`~thinkray.storage.errors.DatabaseClosedError`, and so do the stores it
      handed out when this store opened the file.
    """

    # -- transactions and the stores beside it ----------------------------------------

    def transaction(self) -> AbstractContextManager[None]:
        """A block whose writes, through this store and its :meth:`stores`, commit
        together or not at all; nested blocks join the outer one (see the module)."""
        ...

    def batch(self) -> AbstractContextManager[None]:
        """A block of writes (through this store and its :meth:`stores`' tool calls)
        that become durable together when it ends, in order, and are dropped if it
        raises; reads inside see them. Cheaper than :meth:`transaction` where the
        store journals (one append, no commit), and a write inside that needs the file
        first makes the earlier ones durable, so the order always holds; elsewhere it
        is :meth:`transaction`. Nested blocks join an open batch or transaction."""
        ...

    def defer_syncs(self) -> AbstractContextManager[None]:
        """A block whose writes are not yet durable when their calls return: they are
        written (reads see them, a crash of the process keeps them, their order holds)
        and become durable at the next :meth:`sync_deferred` call, or with any durable
        write after them. The caller owes that call before it relies on them (before
        a model call, a tool's effect, a client's ``finish``). Blocks nest. Where the
        store does not journal its writes, every write is durable as it returns and
        the block changes nothing. Never ``await`` inside it."""
        ...

    def sync_deferred(self) -> None:
        """Make durable every write a :meth:`defer_syncs` block left pending before
        this call; a no-op when there is none. The one method callable from another
        thread while the owner goes on using the store: an agent host runs it off its
        event loop, so one agent's wait for the disk never stalls its siblings. Raises
        the disk's error (``OSError``) when the sync fails."""
        ...

    def stores(self) -> Stores:
        """The other stores of this store's database (fibers, jobs, inbox, registry,
        key/value, workspace). They share its transaction scope and its lifetime: they
        are closed when it is. The same object on every call.

        Raises:
            DatabaseClosedError: the store is closed.
        """
        ...

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
    ) -> SessionInfo:
        """Create an empty session (no messages, no head, zero usage).

        Args:
            name: the display name.
            session_id: the id to use; a fresh one when ``None``.
            metadata: free-form metadata stored on the session.
            parent_session_id: the session this one branched from, if any.
            parent_message_id: the parent's message it branched at, if any.
            thread_key: makes the session a thread (see :meth:`thread`).
            model: the session's model configuration.

        Returns:
            The new session's info.

        Raises:
            InvalidInputError: a malformed argument, an id that exists; nothing written.
            ThreadExistsError: a thread with ``thread_key`` exists.
        """
        ...

    def get_session(self, session_id: str) -> SessionInfo:
        """The session's info (name, head, usage rollups, settings, ...).

        Raises:
            SessionNotFoundError: no such session.
        """
        ...

    def has_session(self, session_id: str) -> bool:
        """Whether the session exists (never raises for an unknown id)."""
        ...

    def list_sessions(
        self, *, parent_session_id: str | None = None, include_ephemeral: bool = False
    ) -> list[SessionInfo]:
        """Most recently updated first. With ``parent_session_id``, only its branches."""
        ...

    def rename_session(self, session_id: str, name: str) -> None:
        """Set the session's display name.

        Raises:
            SessionNotFoundError: no such session.
            InvalidInputError: ``name`` is not a string.
        """
        ...

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
        until some writer supplies one. When the five sum to more than 0 that sum
        becomes ``context_tokens`` (replaced, not added: each step re-reads the
        conversation), which ``context_window_used`` reports; it survives a reopen, and
        a branch of the whole visible path copies it.
        """
        ...

    def set_usage(self, session_id: str, rollup: dict[str, Any]) -> SessionInfo:
        """Replace the rollups (used when a branch recomputes them from its copies, or a
        compaction resets them); ``context_tokens`` is cleared, so ``context_window_used``
        is the new rollups' sum until the next ``add_usage``."""
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

    def insert_before(self, session_id: str, message: Message, child_id: str) -> bool:
        """Insert a message and its parts into the tree right above ``child_id``: it
        takes ``child_id``'s parent and ``child_id`` (with all below it) becomes its
        child, so every path through ``child_id`` reads it just before (a
        compaction's summary before the tail it keeps). The head does not move.

        Returns ``False`` (and writes nothing) if a message with this id exists.

        Raises:
            MessageNotFoundError: ``child_id`` is not a message of the session.
            SessionNotFoundError: no such session. Each writes nothing.
        """
        ...

    def upsert_message(
        self, session_id: str, message: Message, *, parent_id: str | None = HEAD
    ) -> None:
        """Insert, or replace the metadata and all parts of an existing message."""
        ...

    def flush_stream(self, flush: StreamFlush) -> None:
        """Write what a recorder accumulated, in one transaction: the in-flight
        message's envelope (inserted on first flush, updated after), its parts by
        position (the last write of a slot wins) and the run's chunks.

        Raises:
            InvalidInputError: a malformed batch, or a message of another session.
            MessageNotFoundError: a part names a message not in the session.
            SessionNotFoundError: no such session. Each writes nothing.
        """
        ...

    def get_message(self, message_id: str) -> Message | None:
        """The message with its parts, or ``None`` if there is no such id."""
        ...

    def message_session(self, message_id: str) -> str | None:
        """The id of the session holding message ``message_id`` (hidden or not), or
        ``None`` if there is no such id. A read on every turn's path (a message id is
        an idempotency key across the store): it must not drop what is cached."""
        ...

    def get_message_row(self, message_id: str) -> MessageRow | None:
        """The message with its tree position (session, parent, ``seq``, hidden
        stamp), or ``None`` if there is no such id."""
        ...

    def get_history(
        self, session_id: str, *, leaf_id: str | None = None, include_hidden: bool = False
    ) -> list[Message]:
        """The messages from ``leaf_id`` (default: the head, or the latest visible
        message when there is none) to the root, root-first, with their parts;
        hidden ones only with ``include_hidden``.

        Raises:
            SessionNotFoundError: no such session.
            MessageNotFoundError: ``leaf_id`` is not in the session.
        """
        ...

    def get_path(self, session_id: str, *, leaf_id: str | None = None) -> list[MessageRow]:
        """Root-first rows from the leaf to the root, hidden ones included."""
        ...

    def message_count(self, session_id: str, *, include_hidden: bool = False) -> int:
        """How many messages the session holds, on every branch (hidden ones only
        with ``include_hidden``).

        Raises:
            SessionNotFoundError: no such session.
        """
        ...

    def children(self, message_id: str) -> list[Message]:
        """Direct children (the branches at this message), oldest first."""
        ...

    def set_head(self, session_id: str, message_id: str | None) -> None:
        """Move the head to ``message_id`` (``None`` unsets it): the next append
        attaches there and :meth:`get_history` walks from there.

        Raises:
            SessionNotFoundError: no such session.
            MessageNotFoundError: the message is not in the session.
        """
        ...

    def delete_messages(self, session_id: str, message_ids: list[str]) -> None:
        """Delete messages and their parts; unknown ids are ignored (deleting twice
        is a no-op). Children of a deleted message move up to its nearest surviving
        ancestor, and so does a deleted head.

        Raises:
            SessionNotFoundError: no such session.
        """
        ...

    def set_hidden(self, session_id: str, message_ids: list[str], hidden_at: float | None) -> None:
        """Soft-hide (``hidden_at`` set) or un-hide (``None``) messages. Never deletes."""
        ...

    # -- chunk log ------------------------------------------------------------------

    def get_chunks(self, generation_id: str, start: int = 0) -> list[dict[str, Any]]:
        """The run's chunks from ``start``, in index order."""
        ...

    def delete_chunks(self, generation_ids: list[str]) -> None:
        """Delete every chunk of these runs; unknown ids are ignored."""
        ...

    def chunk_generations(self) -> list[str]:
        """Generation ids that have chunks, oldest first."""
        ...

    def open_generations(self) -> list[str]:
        """Generation ids whose log has no final chunk (``is_final``), oldest first: the
        runs that were cut off (their process died) before they ended."""
        ...

    # -- search ---------------------------------------------------------------------

    def search_messages(
        self, query: str, *, limit: int = 10, session_id: str | None = None
    ) -> list[SearchHit]:
        """The stored messages that best match ``query`` (ranked, best first, at most
        ``limit``, one hit per message), across every session or within
        ``session_id``. Indexing happens as messages are written, not here (past a
        one-off backfill of messages stored before the index existed). Messages
        rewound away or deleted are never found; a message's text that changed is
        found by its new text only.

        Raises:
            InvalidInputError: an empty query, one over 1,000 characters or 32
                distinct words, or with no word in it; ``limit`` outside 1-100.
            SessionNotFoundError: ``session_id`` names no session.
        """
        ...

    # -- config ---------------------------------------------------------------------

    def get_config(self, key: str, default: Any = None) -> Any:
        """The store-wide config value of ``key``, or ``default`` when it is not set."""
        ...

    def set_config(self, key: str, value: Any) -> None:
        """Set (or replace) a store-wide config value.

        Raises:
            InvalidInputError: ``value`` is not msgpack-serializable; nothing written.
        """
        ...

    def delete_config(self, key: str) -> None:
        """Remove ``key`` (nothing happens when it is not set)."""
        ...

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

    def close(self) -> None:
        """Flush, checkpoint and release the file (when this store opened it).
        Idempotent; afterwards every other call raises ``DatabaseClosedError``."""
        ...


# -- the stores beside the session store ------------------------------------------------


@runtime_checkable
class FiberStore(Protocol):
    """Durable fibers (long-running method calls that survive eviction) and schedules
    (method calls due once, every N seconds, or on a cron expression) of one database.

    Contract (checked by ``thinkray.storage.testing.fiber_store_suite``):

    - **Validation before writes.** A bad method name, status, kind, retry count,
      interval or cron expression, or a payload, checkpoint or result msgpack cannot
      encode, raises :class:`~thinkray.storage.errors.InvalidInputError` (a
      ``ValueError``) and writes nothing.
    - **Inserts are not idempotent.** An id that exists is refused
      (:class:`~thinkray.storage.errors.InvalidInputError`, nothing written); without
      an id the store makes a fresh one (``fbr_...``, ``sch_...``).
    - **Not found.** ``get_*`` return ``None`` for an unknown id and ``delete_*``
      return ``False``. Updating a fiber that does not exist raises
      :class:`~thinkray.storage.errors.FiberNotFoundError`; :meth:`mark_ran` returns
      ``None`` instead (a schedule cancelled while it ran is not an error).
    - **Guarded updates.** :meth:`update_fiber` with ``expect_status`` writes only if
      the fiber has that status, so a fiber cancelled meanwhile is never overwritten
      as completed.
    - **Ordering.** Fibers are listed oldest first (``created_at``, then ``id``);
      schedules by ``next_run_at`` (then ``id``), disabled ones last.
    - **Times** are epoch seconds; every method taking ``now`` uses the clock when it
      is ``None``. Cron expressions are evaluated in UTC.
    - **Transactions** follow the module's rule; each method is atomic.
    """

    def transaction(self) -> AbstractContextManager[None]:
        """Writes inside commit together or not at all; nested blocks join."""
        ...

    # -- fibers ------------------------------------------------------------------------

    def insert_fiber(
        self,
        method: str,
        payload: Any = None,
        *,
        fiber_id: str | None = None,
        max_retries: int = 3,
        status: FiberStatus = "running",
        now: float | None = None,
    ) -> FiberRecord:
        """Record a new fiber (``attempts`` 1, created and updated at ``now``).

        Args:
            method: the host method the fiber runs (a non-empty string).
            payload: its argument; msgpack-serializable.
            fiber_id: the id to use; a fresh one when ``None``.
            max_retries: restarts allowed after the first attempt (an int >= 0).
            status: the initial status.
            now: the creation time.

        Returns:
            The stored record.

        Raises:
            InvalidInputError: bad input, or ``fiber_id`` exists; nothing written.
        """
        ...

    def get_fiber(self, fiber_id: str) -> FiberRecord | None:
        """The fiber, or ``None`` if there is no such id."""
        ...

    def list_fibers(self, status: str | Iterable[str] | None = None) -> list[FiberRecord]:
        """Fibers oldest first, optionally only those with this status (or one of
        these). An empty collection of statuses gives ``[]``.

        Raises:
            InvalidInputError: an unknown status.
        """
        ...

    def update_fiber(
        self,
        fiber_id: str,
        *,
        status: FiberStatus | None = None,
        attempts: int | None = None,
        error: str | None = ...,
        result: Any = ...,
        recovery_handled: bool | None = None,
        expect_status: str | Collection[str] | None = None,
        now: float | None = None,
    ) -> FiberRecord | None:
        """Change the given fields (``error``/``result`` only when passed, ``None``
        included) and stamp ``updated_at``, in one transaction.

        Returns:
            The updated record, or ``None`` (nothing written) when ``expect_status``
            is given and the fiber's current status is not it / not among them.

        Raises:
            FiberNotFoundError: no such fiber.
            InvalidInputError: an unknown status or an unencodable result.
        """
        ...

    def set_status(self, fiber_id: str, status: FiberStatus, **kwargs: Any) -> FiberRecord | None:
        """:meth:`update_fiber` with ``status`` (same keywords, same errors)."""
        ...

    def set_checkpoint(self, fiber_id: str, data: Any, *, now: float | None = None) -> None:
        """Replace the fiber's checkpoint (what a restart resumes from).

        Raises:
            FiberNotFoundError: no such fiber.
            InvalidInputError: ``data`` is not msgpack-serializable; nothing written.
        """
        ...

    def mark_interrupted(self, fiber_ids: Collection[str], *, now: float | None = None) -> int:
        """Move those of these fibers that are ``running`` to ``interrupted`` (the wake
        path: they belonged to a dead incarnation). Other and unknown ids are left
        alone. Returns how many moved."""
        ...

    def delete_fiber(self, fiber_id: str) -> bool:
        """Delete the fiber; ``False`` if there was none."""
        ...

    def delete_finished(self, older_than: float, *, now: float | None = None) -> int:
        """Delete completed, failed and cancelled fibers (and interrupted ones whose
        ``recovery_handled`` is set) last updated more than ``older_than`` seconds
        before ``now``. Running fibers are never deleted. Returns the count."""
        ...

    # -- schedules ---------------------------------------------------------------------

    def insert_schedule(
        self,
        method: str,
        payload: Any = None,
        *,
        kind: ScheduleKind,
        next_run_at: float | None = None,
        interval_seconds: float | None = None,
        cron: str | None = None,
        schedule_id: str | None = None,
        now: float | None = None,
    ) -> ScheduleRecord:
        """Record a schedule.

        ``once`` needs ``next_run_at``; ``interval`` needs ``interval_seconds`` (a
        positive finite number; first run at ``next_run_at`` or ``now + interval``);
        ``cron`` needs a 5-field ``cron`` expression (first run at its next fire time
        after ``now`` unless ``next_run_at`` is given).

        Raises:
            InvalidInputError: bad input, or ``schedule_id`` exists; nothing written.
        """
        ...

    def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        """The schedule, or ``None`` if there is no such id."""
        ...

    def list_schedules(self, *, include_disabled: bool = False) -> list[ScheduleRecord]:
        """Enabled schedules by next run time; with ``include_disabled``, the
        disabled ones (once-schedules that ran) after them."""
        ...

    def delete_schedule(self, schedule_id: str) -> bool:
        """Delete the schedule; ``False`` if there was none."""
        ...

    def due_schedules(
        self, now: float | None = None, *, exclude: Collection[str] = ()
    ) -> list[ScheduleRecord]:
        """Enabled schedules with ``next_run_at <= now`` and an id not in
        ``exclude``, earliest first."""
        ...

    def next_due_at(self, *, exclude: Collection[str] = ()) -> float | None:
        """The earliest ``next_run_at`` of an enabled schedule not in ``exclude``
        (what a waker sleeps until), or ``None`` when there is none."""
        ...

    def mark_ran(
        self,
        schedule_id: str,
        *,
        ran_at: float | None = None,
        error: str | None = None,
        now: float | None = None,
    ) -> ScheduleRecord | None:
        """Record a run (a failure when ``error`` is given) and compute the next one:
        ``once`` is disabled; ``interval`` advances by whole intervals past ``now``
        (missed runs coalesce into one, the phase is kept); ``cron`` goes to its next
        fire time after ``now``. ``ran_at`` defaults to ``now``.

        Returns:
            The updated record, or ``None`` if the schedule no longer exists.
        """
        ...

    def delete_disabled_schedules(self, older_than: float, *, now: float | None = None) -> int:
        """Delete disabled schedules whose last run is more than ``older_than`` seconds
        before ``now``. Returns the count."""
        ...


@runtime_checkable
class JobStore(Protocol):
    """Background jobs (the work an async tool started and returned from at once).

    Contract (checked by ``thinkray.storage.testing.job_store_suite``):

    - **Statuses.** ``running`` → ``completed`` | ``failed`` | ``cancelled``; a job
      found ``running`` by a new incarnation becomes ``interrupted``
      (:meth:`interrupt_running`). An unknown status raises
      :class:`~thinkray.storage.errors.InvalidInputError`.
    - **Progress and late results** live beside the status: :meth:`set_progress`
      writes only while the job runs; :meth:`store_late` only on a cancelled job;
      :meth:`update` keeps both.
    - **Inserts are not idempotent.** :meth:`insert` refuses an id that exists
      (:class:`~thinkray.storage.errors.InvalidInputError`, nothing written);
      idempotent starts are the job registry's business, above the store.
    - **Not found.** :meth:`get` and :meth:`update` return ``None`` for an unknown
      id, :meth:`delete` returns ``False``.
    - **Values** (input, result, parent) must be msgpack-serializable, else
      :class:`~thinkray.storage.errors.InvalidInputError` and nothing written.
    - **Ordering.** :meth:`rows` lists oldest first (``created_at``, then ``id``).
    - **Transactions** follow the module's rule; each method is atomic except
      :meth:`interrupt_running`, which updates job by job.
    """

    def transaction(self) -> AbstractContextManager[None]:
        """Writes inside commit together or not at all; nested blocks join."""
        ...

    def insert(self, rec: JobRecord) -> JobRecord:
        """Store a new job. Sets ``created_at`` (when 0) and ``updated_at`` on ``rec``
        and returns it.

        Raises:
            InvalidInputError: the id exists, an unknown status, or an unencodable
                value; nothing written.
        """
        ...

    def update(
        self, job_id: str, status: str, *, result: Any = None, error: str | None = None
    ) -> JobRecord | None:
        """Set the job's status, result and error (all three replaced: an omitted
        ``result`` or ``error`` becomes ``None``) and stamp ``updated_at``.

        Returns:
            The updated record, or ``None`` if there is no such job.

        Raises:
            InvalidInputError: an unknown status or an unencodable result.
        """
        ...

    def set_progress(
        self, job_id: str, progress: Any = None, message: str | None = None
    ) -> JobRecord | None:
        """Record a running job's progress report (``progress`` and ``message`` both
        replaced) and stamp ``updated_at``; the status is unchanged. A finished job is
        returned as stored, nothing written (its last report is final).

        Returns:
            The record, or ``None`` if there is no such job.

        Raises:
            InvalidInputError: an unencodable ``progress``; nothing written.
        """
        ...

    def store_late(
        self, job_id: str, *, result: Any = None, error: str | None = None
    ) -> JobRecord | None:
        """Keep a result (or error) that arrived after the job was ``cancelled`` beside
        it, in ``late`` (``{"result", "error", "at"}``); status, result and error are
        unchanged. A second late result replaces the first.

        Returns:
            The record, or ``None`` if there is no such job.

        Raises:
            InvalidInputError: the job is not ``cancelled``, or an unencodable result;
                nothing written.
        """
        ...

    def get(self, job_id: str) -> JobRecord | None:
        """The job, or ``None``."""
        ...

    def rows(self, status: str | Iterable[str] | None = None) -> list[JobRecord]:
        """Jobs oldest first, optionally only those with this status (or one of
        these).

        Raises:
            InvalidInputError: an unknown status.
        """
        ...

    def interrupt_running(self, reason: str) -> int:
        """Mark every ``running`` job ``interrupted`` with ``reason`` as its error (the
        wake path: those jobs belonged to a dead incarnation). Returns how many."""
        ...

    def delete(self, job_id: str) -> bool:
        """Delete the job; ``False`` if there was none."""
        ...


@runtime_checkable
class InboxStore(Protocol):
    """The inbox of a persistent agent: messages sent to it, answered by its loop.

    Contract (checked by ``thinkray.storage.testing.inbox_store_suite``):

    - **Statuses.** ``pending`` → ``processing`` (claimed by a generation cycle) →
      ``done`` (reply on the row) | ``failed`` (error on the row).
    - **Idempotent insert.** :meth:`insert` with an id that exists returns the stored
      row unchanged with ``created=False`` and writes nothing (the first write wins).
      It returns only after the row is committed, so an id handed back is an
      acknowledgement.
    - **Claim once.** :meth:`claim` moves rows ``pending`` → ``processing`` in one
      transaction and returns only the rows it moved, so a row claimed twice is
      processed once. :meth:`complete` and :meth:`fail` leave finished rows alone
      (a second call returns ``[]``). Unknown ids are ignored by all three.
    - **Crash path.** :meth:`requeue_processing` returns rows a dead incarnation left
      ``processing`` to ``pending``, or fails them once they used up their attempts
      (a message that kills the agent cannot crash-loop it).
    - **Ordering.** Rows are listed oldest first: in insertion order, also across a
      reopen of the same database.
    - **Not found.** :meth:`get` returns ``None``; :meth:`require` raises
      :class:`~thinkray.storage.errors.InboxMessageNotFoundError`.
    - **Validation.** Unencodable content, an unknown status, a bad id (empty, not a
      string, over 256 characters) or a bad limit raise
      :class:`~thinkray.storage.errors.InvalidInputError` and write nothing.
    - **Transactions** follow the module's rule; each method is atomic.
    """

    def transaction(self) -> AbstractContextManager[None]:
        """Writes inside commit together or not at all; nested blocks join."""
        ...

    def insert(
        self,
        content: Any,
        *,
        sender: str | None = None,
        message_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> tuple[InboxRow, bool]:
        """Insert a ``pending`` row (a fresh ``inb_...`` id when ``message_id`` is
        ``None``).

        Returns:
            ``(row, created)``; ``created`` is ``False`` when the id existed (the
            stored row is returned unchanged).

        Raises:
            InvalidInputError: a bad id, sender, metadata or unencodable content.
        """
        ...

    def claim(self, ids: Iterable[str]) -> list[InboxRow]:
        """Mark those of these rows that are still ``pending`` as ``processing``,
        incrementing ``attempts``. Returns the rows claimed, oldest first."""
        ...

    def complete(
        self, ids: Iterable[str], reply: str | None, *, extra: dict[str, Any] | None = None
    ) -> list[InboxRow]:
        """Mark unfinished rows ``done`` with ``reply`` (``extra`` merged into the
        row's extra fields). Returns the rows changed."""
        ...

    def fail(self, ids: Iterable[str], error: str) -> list[InboxRow]:
        """Mark unfinished rows ``failed`` with ``error``. Returns the rows changed."""
        ...

    def requeue_processing(self, *, max_attempts: int | None = None) -> tuple[int, int]:
        """Rows left ``processing`` go back to ``pending``; with ``max_attempts``,
        rows already claimed that many times are failed instead.

        Returns:
            ``(requeued, failed)``.
        """
        ...

    def delete(self, ids: Iterable[str]) -> int:
        """Delete these rows, whatever their status. Returns how many existed."""
        ...

    def purge(self, *, older_than: float | None = None) -> int:
        """Delete finished rows (only those last updated before ``older_than``, epoch
        seconds, when given). Pending and processing rows are never purged. Returns
        the count."""
        ...

    def get(self, message_id: str) -> InboxRow | None:
        """The row, or ``None``."""
        ...

    def require(self, message_id: str) -> InboxRow:
        """The row.

        Raises:
            InboxMessageNotFoundError: no such row.
        """
        ...

    def pending(self, limit: int | None = None) -> list[InboxRow]:
        """Pending rows, oldest first, at most ``limit`` (a positive int)."""
        ...

    def rows(self, status: str | Iterable[str] | None = None) -> list[InboxRow]:
        """Rows oldest first, optionally only those with this status (or one of
        these)."""
        ...

    def count(self, status: str | None = None) -> int:
        """How many rows (of this status)."""
        ...

    def has_pending(self) -> bool:
        """Whether any row is ``pending``."""
        ...


class TurnQueueStore(Protocol):
    """User messages sent while their session had a turn in flight, waiting for their
    own turn (or answered since): see :mod:`thinkray.storage.turn_queue`.

    Contract: :meth:`add` is idempotent on the message id (the first write wins, and
    it returns only after the commit: an acknowledgement); :meth:`move` changes a row
    only from the statuses it names, in one transaction, and returns the rows it
    moved, so a row is claimed (``queued`` -> ``running``) once; rows are listed in
    queue order (``seq``), also across a reopen; :meth:`requeue_running` puts back
    what a dead incarnation left ``running`` (or fails it after ``max_attempts``)."""

    def transaction(self) -> AbstractContextManager[None]:
        """Writes inside commit together or not at all; nested blocks join."""
        ...

    def add(self, row: QueuedTurn, *, first: bool = False) -> tuple[QueuedTurn, bool]:
        """Store ``row`` at the end of its session's queue (``first``: at its head);
        ``(stored, False)`` when the id exists."""
        ...

    def get(self, message_id: str) -> QueuedTurn | None:
        """One row (None: unknown)."""
        ...

    def waiting(self, session_id: str | None = None) -> list[QueuedTurn]:
        """``queued`` rows in queue order."""
        ...

    def rows(self, session_id: str | None = None) -> list[QueuedTurn]:
        """Every row in queue order."""
        ...

    def move(
        self,
        ids: Iterable[str],
        status: str,
        *,
        only_from: Iterable[str] = ("queued",),
        **fields: Any,
    ) -> list[QueuedTurn]:
        """Move the rows in one of ``only_from`` to ``status``; returns those moved."""
        ...

    def requeue_running(self, *, max_attempts: int) -> tuple[list[QueuedTurn], list[QueuedTurn]]:
        """``running`` rows back to ``queued`` (or ``failed`` past ``max_attempts``)."""
        ...

    def count(self, status: str | None = None) -> int:
        """How many rows (of this status)."""
        ...


@runtime_checkable
class RegistryStore(Protocol):
    """An orchestrator's registry of sub-agents, keyed by name.

    Contract (checked by ``thinkray.storage.testing.registry_store_suite``):

    - **Add refuses duplicates.** :meth:`add` with a name that exists raises
      :class:`~thinkray.storage.errors.InvalidInputError` and writes nothing.
    - **Not found is an error.** :meth:`get`, :meth:`update` and :meth:`remove` raise
      :class:`~thinkray.storage.errors.SubAgentNotFoundError` for an unknown name;
      :meth:`has` answers without raising.
    - **Validation.** :meth:`update` with a field the record does not have, or a
      value msgpack cannot encode, raises
      :class:`~thinkray.storage.errors.InvalidInputError` and writes nothing.
    - **Ordering.** :meth:`list` returns records by name.
    - **Transactions** follow the module's rule; each method is atomic.
    """

    def transaction(self) -> AbstractContextManager[None]:
        """Writes inside commit together or not at all; nested blocks join."""
        ...

    def add(self, record: SubAgentRecord) -> SubAgentRecord:
        """Store a new sub-agent; returns ``record``.

        Raises:
            InvalidInputError: the name exists or a value is unencodable.
        """
        ...

    def get(self, name: str) -> SubAgentRecord:
        """The record.

        Raises:
            SubAgentNotFoundError: no such sub-agent.
        """
        ...

    def has(self, name: str) -> bool:
        """Whether a sub-agent of this name exists."""
        ...

    def update(self, name: str, **fields: Any) -> SubAgentRecord:
        """Replace the given fields; returns the updated record.

        Raises:
            SubAgentNotFoundError: no such sub-agent.
            InvalidInputError: an unknown field or an unencodable value.
        """
        ...

    def list(self) -> list[SubAgentRecord]:
        """Every record, by name."""
        ...

    def remove(self, name: str) -> None:
        """Delete the sub-agent.

        Raises:
            SubAgentNotFoundError: no such sub-agent.
        """
        ...


@runtime_checkable
class KeyValueStore(Protocol):
    """String keys to msgpack-serializable values (e.g. a bridge's grants).

    Contract (checked by ``thinkray.storage.testing.kv_store_suite``):

    - :meth:`set` replaces (last write wins); :meth:`delete` of a missing key is a
      no-op; :meth:`get` of a missing key returns ``default`` (no error).
    - A value msgpack cannot encode raises
      :class:`~thinkray.storage.errors.InvalidInputError` and writes nothing. Values
      come back as msgpack returns them (tuples as lists).
    - :meth:`items` is ordered by key.
    - **Transactions** follow the module's rule; each method is atomic.
    """

    def transaction(self) -> AbstractContextManager[None]:
        """Writes inside commit together or not at all; nested blocks join."""
        ...

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key``, or ``default`` when it is not set."""
        ...

    def set(self, key: str, value: Any) -> None:
        """Set (or replace) ``key``.

        Raises:
            InvalidInputError: ``value`` is not msgpack-serializable; nothing written.
        """
        ...

    def delete(self, key: str) -> None:
        """Remove ``key`` (nothing happens when it is not set)."""
        ...

    def items(self, prefix: str = "") -> dict[str, Any]:
        """Every key starting with ``prefix`` and its value, ordered by key."""
        ...


@runtime_checkable
class AgentStateStore(Protocol):
    """An agent's synced state: one JSON document, replaced whole on each write.

    Contract (checked by ``thinkray.storage.testing.agent_state_store_suite``):

    - :meth:`get` is None until the first :meth:`put`; then the last value put, as
      JSON gives it back (tuples as lists), with its version.
    - Each :meth:`put` bumps the version by one (the first is 1), so a reader that
      saw version ``v`` knows any ``v' > v`` is newer.
    - A value that is not JSON raises
      :class:`~thinkray.storage.errors.InvalidInputError` and writes nothing.
    - **Transactions** follow the module's rule; each method is atomic.
    """

    def transaction(self) -> AbstractContextManager[None]:
        """Writes inside commit together or not at all; nested blocks join."""
        ...

    def get(self) -> AgentStateRecord | None:
        """The stored state and its version, None if none was ever put."""
        ...

    def put(self, value: Any, *, now: float | None = None) -> AgentStateRecord:
        """Replace the state with ``value`` (a JSON value); returns what was stored.

        Raises:
            InvalidInputError: ``value`` is not JSON; nothing written.
        """
        ...


@runtime_checkable
class WorkspaceStore(Protocol):
    """Files and directories of one namespace: a small durable filesystem.

    Contract (checked by ``thinkray.storage.testing.workspace_store_suite``):

    - **Canonical paths.** Paths are relative, ``/``-separated, without ``.``/``..``
      or empty segments, a leading or trailing ``/``, or NUL; anything else raises
      :class:`~thinkray.storage.errors.WorkspacePathError` (normalize hostile input
      with ``thinkray.runtime.tools.paths`` first). ``""`` is the root: it always
      exists, is a directory and cannot be written or deleted.
    - **Writes** create missing parent directories and replace an existing file
      (keeping its creation time). Every check happens before anything changes: a
      refused write (a directory in the way, a file where a parent should be, a
      limit) leaves the store as it was.
    - **Errors** are the ``Workspace*Error`` classes of
      :mod:`thinkray.storage.errors`, which are also the matching built-in ``OSError``
      subclasses: not found (``FileNotFoundError``), exists, is a directory, not a
      directory, not empty, limit. Content that is neither ``str`` nor bytes raises
      :class:`~thinkray.storage.errors.InvalidTypeError`.
    - **Limits** (:attr:`limits`: file size, total bytes, entry count) are per
      namespace and checked on every write and mkdir.
    - **Namespaces** sharing a database are isolated from each other.
    - **Ordering.** :meth:`list` and :meth:`walk` return entries sorted by path (a
      directory before its contents).
    - **Transactions** follow the module's rule; each method is atomic.
    """

    @property
    def namespace(self) -> str:
        """Which filesystem of the database this is."""
        ...

    @property
    def limits(self) -> WorkspaceLimits:
        """The limits checked on writes."""
        ...

    def transaction(self) -> AbstractContextManager[None]:
        """Writes inside commit together or not at all; nested blocks join (a
        read-modify-write inside one sees no other writer)."""
        ...

    # -- reads -------------------------------------------------------------------------

    def exists(self, path: str) -> bool:
        """Whether ``path`` is a file or directory (the root always is)."""
        ...

    def stat(self, path: str) -> EntryInfo:
        """Metadata of ``path``.

        Raises:
            WorkspaceNotFoundError: nothing at ``path``.
        """
        ...

    def try_stat(self, path: str) -> EntryInfo | None:
        """Metadata of ``path``, or ``None`` if nothing is there."""
        ...

    def read(self, path: str) -> bytes:
        """The bytes of a file.

        Raises:
            WorkspaceNotFoundError: nothing at ``path``.
            WorkspaceIsADirectoryError: ``path`` is a directory.
        """
        ...

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """:meth:`read`, decoded."""
        ...

    def list(self, path: str = "") -> list[EntryInfo]:
        """Direct children of a directory, sorted by path.

        Raises:
            WorkspaceNotFoundError: no such directory.
            WorkspaceNotADirectoryError: ``path`` is a file.
        """
        ...

    def walk(self, path: str = "", *, include_dirs: bool = False) -> Iterator[EntryInfo]:
        """Every file (and directory, with ``include_dirs``) below ``path``, not
        ``path`` itself, sorted by path. Metadata only; the same errors as
        :meth:`list`."""
        ...

    def iter_contents(self, paths: Sequence[str]) -> Iterator[tuple[EntryInfo, bytes]]:
        """``(info, content)`` of the given files in the given order; paths that are
        missing or directories are skipped."""
        ...

    def usage(self) -> dict[str, int]:
        """``{"entries": n, "bytes": total}`` of this namespace."""
        ...

    # -- writes ------------------------------------------------------------------------

    def write(self, path: str, content: str | bytes, *, mime_type: str | None = None) -> EntryInfo:
        """Create or replace a file (``str`` is stored as UTF-8; the MIME type is
        guessed when not given). Returns its metadata.

        Raises:
            WorkspaceIsADirectoryError: ``path`` is a directory.
            WorkspaceNotADirectoryError: a parent of ``path`` is a file.
            WorkspaceLimitError: the write would break a limit.
        """
        ...

    def mkdir(self, path: str, *, exist_ok: bool = True) -> EntryInfo:
        """Create a directory and its missing parents.

        Raises:
            WorkspaceExistsError: ``path`` is a file, or a directory and not
                ``exist_ok``.
            WorkspaceLimitError: the entries would break the limit.
        """
        ...

    def delete(self, path: str, *, recursive: bool = False) -> int:
        """Delete a file, or a directory (a non-empty one needs ``recursive``).
        Returns how many entries were removed.

        Raises:
            WorkspaceNotFoundError: nothing at ``path``.
            WorkspaceNotEmptyError: a non-empty directory without ``recursive``.
        """
        ...

    def clear(self) -> int:
        """Delete everything in this namespace. Returns how many entries were removed."""
        ...


@runtime_checkable
class ToolCallStore(Protocol):
    """Durable tool calls (seed 003 §1.1-1.7): every tool call of a generation is a row,
    written ``pending`` before it runs, moved by atomic compare-and-set transitions.

    Contract (checked by ``thinkray.storage.testing.tool_call_store_suite``):

    - **Statuses and moves** are :data:`~thinkray.storage.records.TOOL_CALL_STATUSES`
      and :data:`~thinkray.storage.records.TOOL_CALL_TRANSITIONS`. A move the table does
      not allow, or an unknown status, raises
      :class:`~thinkray.storage.errors.InvalidInputError` and writes nothing.
    - **Compare-and-set.** :meth:`transition` moves a call only if its status is one of
      ``expect`` (and, with ``executor``, only if that executor holds it); otherwise it
      returns ``None`` and writes nothing. Of two racing moves from the same status
      exactly one wins, so a call is claimed (``pending → executing``) once: a tool
      call id never executes twice.
    - **Inserts are not idempotent.** :meth:`insert` refuses an existing id
      (InvalidInputError, nothing written); callers that may repeat a call (recovery
      re-running a generation) read it first with :meth:`get`.
    - **Final is final.** A call in a final status never changes status again; an
      executor's result for a cancelled call is only ever kept beside it
      (:meth:`store_late`), never as its result.
    - **Audit is append-only.** :meth:`audit` adds a decision row; rows are never
      changed or removed; :meth:`audit_rows` lists them in insertion order.
    - **Not found.** :meth:`get` returns ``None``, :meth:`transition` ``None``.
    - **Values** (input, result, late result) must be msgpack-serializable, else
      InvalidInputError and nothing written.
    - **Leases** (the visibility timeout of a claim, as SQS has it). A claim may carry
      ``lease_until``; only a claim sets one, :meth:`renew` moves it (for the holder
      only), and any other move ends it. :meth:`lapse` puts every ``executing`` call
      whose lease is past back to ``pending`` with no holder, so another executor can
      claim it; the old holder then holds nothing (its moves with ``executor`` return
      ``None``). A call without a lease never lapses.
    - **Deadlines.** ``deadline_at`` is set by :meth:`insert` or :meth:`set_deadline`;
      :meth:`expire` moves every open call past it to ``cancelled-by-timeout`` (an ask
      gets ``approval["decision"] = "timeout"``). :meth:`next_deadline` is the earliest
      lease or deadline still ahead of an open call: when to sweep next. Times are
      epoch seconds, finite; anything else is InvalidInputError.
    - **Lookups by id** do not scan the table (an index or a key on ``id``).
    - **Ordering.** :meth:`rows` lists oldest first (``created_at``, then ``id``).
    - **Transactions** follow the module's rule; every method is atomic.
    """

    def transaction(self) -> AbstractContextManager[None]:
        """Writes inside commit together or not at all; nested blocks join."""
        ...

    def batch(self) -> AbstractContextManager[None]:
        """Writes inside become durable together when the block ends, in order, and
        are dropped if it raises; reads inside see them (the session store's
        :meth:`SessionStore.batch`, which this joins: it is :meth:`transaction` where
        there is no journal)."""
        ...

    def insert(self, rec: ToolCallRecord) -> ToolCallRecord:
        """Store a new call (any status, usually ``pending``). Sets ``created_at``
        (when 0) and ``updated_at`` and returns it.

        Raises:
            InvalidInputError: the id exists, an unknown status or an unencodable
                value; nothing written.
        """
        ...

    def get(self, tool_call_id: str) -> ToolCallRecord | None:
        """The call, or ``None``."""
        ...

    def transition(
        self,
        tool_call_id: str,
        expect: Collection[str],
        status: str,
        *,
        executor: str | None = None,
        claim: bool = False,
        result: Any = None,
        error: str | None = None,
        approval: dict[str, Any] | None = None,
        lease_until: float | None = None,
    ) -> ToolCallRecord | None:
        """Move the call to ``status`` if its status is in ``expect`` (compare-and-set).

        ``claim``: this move hands the call to ``executor`` (stored; ``attempts`` + 1),
        with the lease ``lease_until`` (None: none; a lease without a claim is refused).
        Every move ends the lease it had.
        Otherwise, with ``executor``, the move happens only if that executor holds the
        call. ``result``/``error`` are stored when given; ``approval`` replaces the last
        decision. Stamps ``updated_at``.

        Returns:
            The updated call, or ``None`` (unknown id, another status, another holder).

        Raises:
            InvalidInputError: an unknown status, a move from a status in ``expect``
                to ``status`` that :data:`TOOL_CALL_TRANSITIONS` forbids, or an
                unencodable result; nothing written.
        """
        ...

    def renew(self, tool_call_id: str, executor: str, lease_until: float) -> ToolCallRecord | None:
        """Move the lease of a call ``executing`` and held by ``executor`` to
        ``lease_until`` (the holder's heartbeat). ``None`` when the call is unknown, not
        executing, or held by another (its lease lapsed and it was put back or claimed
        again): the executor has lost it. A lease past but not yet lapsed is renewed.
        """
        ...

    def set_deadline(
        self,
        tool_call_id: str,
        deadline_at: float | None,
        *,
        expect: Collection[str] | None = None,
    ) -> ToolCallRecord | None:
        """Set (None: clear) the deadline of an open call whose status is in ``expect``
        (default: any open status); the status stays. ``None`` when the call is
        unknown, final or in another status."""
        ...

    def expire(self, now: float) -> list[ToolCallRecord]:
        """Cancel (``cancelled-by-timeout``, with an error saying so) every open call
        whose deadline is at or before ``now``; returns them, oldest first."""
        ...

    def lapse(self, now: float) -> list[ToolCallRecord]:
        """Put every ``executing`` call whose lease is at or before ``now`` back to
        ``pending`` with no holder; returns them, oldest first."""
        ...

    def next_deadline(self) -> float | None:
        """The earliest deadline of an open call or lease of an executing one (may be
        past), or ``None``."""
        ...

    def store_late(
        self, tool_call_id: str, *, result: Any = None, error: str | None = None
    ) -> ToolCallRecord | None:
        """Keep a result that arrived after the call was cancelled beside it
        (``late_result``/``late_error``/``late_at``); the status stays. ``None`` for an
        unknown call.

        Raises:
            InvalidInputError: the call is not cancelled, or an unencodable value.
        """
        ...

    def rows(
        self,
        status: str | Iterable[str] | None = None,
        *,
        run_id: str | None = None,
        tool_names: Iterable[str] | None = None,
    ) -> list[ToolCallRecord]:
        """Calls, oldest first, filtered by status, run and tool name."""
        ...

    def audit(
        self, tool_call_id: str, decision: str, *, by: str | None, reason: str | None = None
    ) -> ToolCallAudit:
        """Append one decision to the audit table and return it."""
        ...

    def audit_rows(self, tool_call_id: str | None = None) -> list[ToolCallAudit]:
        """Audit rows (of one call, or all), in insertion order."""
        ...


@runtime_checkable
class Stores(Protocol):
    """The stores that share one database (and so one transaction scope) with a
    session store: what :meth:`SessionStore.stores` returns, or what
    :func:`thinkray.storage.stores.open_stores` opens on a file of its own.

    Contract (checked by ``thinkray.storage.testing.stores_suite``):

    - **One object per kind.** :meth:`fibers`, :meth:`jobs`, :meth:`inbox`,
      :meth:`registry` and :meth:`kv` return the same store on every call;
      :meth:`workspace` the same store for the same namespace and limits. Tables are
      created on first use.
    - **One transaction scope.** :meth:`transaction`, the ``transaction()`` of every
      store handed out here and that of the session store (if any) are one scope:
      writes to several stores in one block commit together or not at all.
    - **Lifetime.** :meth:`close` releases the database when these stores opened it
      (:func:`~thinkray.storage.stores.open_stores`): afterwards every store handed
      out here raises :class:`~thinkray.storage.errors.DatabaseClosedError`, and what
      was committed is there when the file is opened again. The stores of a session
      store belong to it: their :meth:`close` does nothing, closing the session
      store closes them. Idempotent.
    """

    def transaction(self) -> AbstractContextManager[None]:
        """Writes inside, through any of these stores (and the session store's),
        commit together or not at all; nested blocks join."""
        ...

    def fibers(self) -> FiberStore:
        """Fibers and schedules."""
        ...

    def jobs(self) -> JobStore:
        """Background jobs."""
        ...

    def tool_calls(self) -> ToolCallStore:
        """Durable tool calls and the approvals' audit."""
        ...

    def inbox(self) -> InboxStore:
        """A persistent agent's inbox."""
        ...

    def turn_queue(self, create: bool = True) -> TurnQueueStore | None:
        """Messages sent while a turn ran (None when ``create`` is False and the
        database has no queue yet)."""
        ...

    def registry(self) -> RegistryStore:
        """An orchestrator's sub-agent registry."""
        ...

    def kv(self) -> KeyValueStore:
        """Key/value pairs (for actors that keep no sessions; a session store has its
        own config)."""
        ...

    def agent_state(self) -> AgentStateStore:
        """The agent's synced state (one versioned JSON document)."""
        ...

    def workspace(
        self,
        namespace: str = "default",
        *,
        limits: WorkspaceLimits | None = None,
        max_file_bytes: int | None = DEFAULT_MAX_FILE_BYTES,
        max_total_bytes: int | None = DEFAULT_MAX_TOTAL_BYTES,
        max_entries: int | None = DEFAULT_MAX_ENTRIES,
    ) -> WorkspaceStore:
        """The workspace ``namespace`` with these limits (``limits`` wins over the
        three numbers; ``None`` disables a limit).

        Raises:
            InvalidInputError: an empty namespace.
        """
        ...

    def close(self) -> None:
        """Release the database if these stores opened it, else nothing. Idempotent."""
        ...


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
        """:meth:`SessionStore.append_message` on this thread's session: ``False``
        (nothing written) if the message id exists."""
        return self.store.append_message(self.id, message, parent_id=parent_id)

    def get_messages(self, *, include_hidden: bool = False) -> list[Message]:
        """The thread's history from its head, root-first
        (:meth:`SessionStore.get_history`)."""
        return self.store.get_history(self.id, include_hidden=include_hidden)

    def info(self) -> SessionInfo:
        """The thread's session info, read fresh from the store."""
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
        """This thread's settings over the store default
        (:meth:`SessionStore.get_effective_settings`)."""
        return self.store.get_effective_settings(self.id)

    def clone(self, dst_key: str, from_message_id: str | None = None) -> Thread:
        """Copy this thread's visible history (up to ``from_message_id``, default its
        head) into a new thread ``dst_key`` (:meth:`SessionStore.clone_thread`, same
        errors) and return it."""
        return self.store.clone_thread(self.key, dst_key, from_message_id)

    def delete(self) -> None:
        """Delete the thread's session and messages.

        Raises:
            ThreadNotFoundError: the thread is already gone.
        """
        self.store.delete_thread(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Thread) and (other.id, other.key) == (self.id, self.key)

    def __hash__(self) -> int:
        return hash((self.id, self.key))

    def __repr__(self) -> str:
        return f"Thread(key={self.key!r}, id={self.id!r})"
