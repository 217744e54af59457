"""The DuckDB :class:`~thinkray.storage.protocols.Stores`: every store of one database.

A session store hands out the stores of its own file
(:meth:`~thinkray.storage.session_store.DuckDBSessionStore.stores`); an actor that keeps
no sessions (a workspace bridge) opens a file of its own with :func:`open_stores`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from thinkray.storage.agent_state import DuckDBAgentStateStore
from thinkray.storage.db import Database
from thinkray.storage.fibers import DuckDBFiberStore
from thinkray.storage.inbox import DuckDBInboxStore
from thinkray.storage.jobs import DuckDBJobStore
from thinkray.storage.kv import DuckDBKeyValueStore
from thinkray.storage.protocols import Stores
from thinkray.storage.records import (
    DEFAULT_MAX_ENTRIES,
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_TOTAL_BYTES,
    WorkspaceLimits,
)
from thinkray.storage.registry import DuckDBRegistryStore
from thinkray.storage.tool_calls import DuckDBToolCallStore
from thinkray.storage.turn_queue import DuckDBTurnQueueStore, has_turn_queue
from thinkray.storage.types import InvalidInputError
from thinkray.storage.workspace import DuckDBWorkspaceStore
from typing_extensions import override

__all__ = ["AGENT_COMPONENTS", "WAKE_PROBES", "DuckDBStores", "open_stores"]

AGENT_COMPONENTS = tuple(
    (store.component, store.migrations)
    for store in (DuckDBFiberStore, DuckDBToolCallStore, DuckDBJobStore)
)
"""The components whose tables every agent's wake opens (its durable services: fibers
and schedules, the tool-call ledger, jobs): a new agent file is made with them."""

WAKE_PROBES = (("fibers", "fibers"), ("tool_calls", "tool_calls"), ("jobs", "jobs"))
"""``(component, table)`` pairs whose rows an agent's wake reads to recover
(interrupted fibers, open tool calls, running jobs). The session store's first
statement counts them, so that a wake with nothing to recover reads none of them
(:meth:`~thinkray.storage.db.Database.known_empty`)."""


class DuckDBStores(Stores):
    """:class:`~thinkray.storage.protocols.Stores` on one :class:`Database` (the
    contract is the protocol's).

    Each store is made on first use (which creates its tables) and kept, so an
    agent has one of each: the inbox in particular must be one object per database,
    as it keeps the inbox's order. ``owns``: :meth:`close` closes the database (the
    stores of a session store do not own it; the session store does).
    """

    def __init__(self, db: Database, *, owns: bool = False) -> None:
        self._db = db
        self._owns = owns
        self._fibers: DuckDBFiberStore | None = None
        self._jobs: DuckDBJobStore | None = None
        self._tool_calls: DuckDBToolCallStore | None = None
        self._inbox: DuckDBInboxStore | None = None
        self._turn_queue: DuckDBTurnQueueStore | None = None
        self._registry: DuckDBRegistryStore | None = None
        self._kv: DuckDBKeyValueStore | None = None
        self._agent_state: DuckDBAgentStateStore | None = None
        self._workspaces: dict[tuple[str, WorkspaceLimits], DuckDBWorkspaceStore] = {}

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One transaction on the database; joins one that is open."""
        with self._db.transaction():
            yield

    @override
    def fibers(self) -> DuckDBFiberStore:
        if self._fibers is None:
            self._fibers = DuckDBFiberStore(self._db)
        return self._fibers

    @override
    def jobs(self) -> DuckDBJobStore:
        if self._jobs is None:
            self._jobs = DuckDBJobStore(self._db)
        return self._jobs

    @override
    def tool_calls(self) -> DuckDBToolCallStore:
        if self._tool_calls is None:
            self._tool_calls = DuckDBToolCallStore(self._db)
        return self._tool_calls

    @override
    def inbox(self) -> DuckDBInboxStore:
        if self._inbox is None:
            self._inbox = DuckDBInboxStore(self._db)
        return self._inbox

    @override
    def turn_queue(self, create: bool = True) -> DuckDBTurnQueueStore | None:
        if self._turn_queue is None:
            if not create and not has_turn_queue(self._db):
                return None  # reading must not add a table to every agent's file
            self._turn_queue = DuckDBTurnQueueStore(self._db)
        return self._turn_queue

    @override
    def registry(self) -> DuckDBRegistryStore:
        if self._registry is None:
            self._registry = DuckDBRegistryStore(self._db)
        return self._registry

    @override
    def kv(self) -> DuckDBKeyValueStore:
        if self._kv is None:
            self._kv = DuckDBKeyValueStore(self._db)
        return self._kv

    @override
    def agent_state(self) -> DuckDBAgentStateStore:
        if self._agent_state is None:
            self._agent_state = DuckDBAgentStateStore(self._db)
        return self._agent_state

    @override
    def workspace(
        self,
        namespace: str = "default",
        *,
        limits: WorkspaceLimits | None = None,
        max_file_bytes: int | None = DEFAULT_MAX_FILE_BYTES,
        max_total_bytes: int | None = DEFAULT_MAX_TOTAL_BYTES,
        max_entries: int | None = DEFAULT_MAX_ENTRIES,
    ) -> DuckDBWorkspaceStore:
        if not isinstance(namespace, str) or not namespace:
            raise InvalidInputError("namespace must be a non-empty string")
        limits = limits or WorkspaceLimits(max_file_bytes, max_total_bytes, max_entries)
        key = (namespace, limits)
        store = self._workspaces.get(key)
        if store is None:
            store = DuckDBWorkspaceStore(self._db, namespace, limits=limits)
            self._workspaces[key] = store
        return store

    @property
    def closed(self) -> bool:
        """Whether the database is closed (by these stores or by its owner)."""
        return self._db.closed

    def close(self) -> None:
        """Checkpoint and close the database if these stores own it. Idempotent."""
        if self._owns:
            self._db.close()

    def __enter__(self) -> DuckDBStores:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_stores(path: str | os.PathLike[str], *, lock_retry_seconds: float = 2.0) -> DuckDBStores:
    """Open (creating it and its folder if needed) the DuckDB file at ``path``, or an
    in-memory database for ``":memory:"``, for an actor that keeps stores but no
    sessions. The result owns the file: :meth:`DuckDBStores.close` checkpoints and
    releases it.

    Raises:
        DatabaseLockedError: another process holds the file past the retry window.
    """
    return DuckDBStores(Database(path, lock_retry_seconds=lock_retry_seconds), owns=True)
