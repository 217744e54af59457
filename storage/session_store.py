"""The DuckDB :class:`~thinkray.storage.protocols.SessionStore`: one file per agent actor.

Layout (``sessions`` component, version 3)::

    sessions(id, name, parent_session_id, parent_message_id, thread_key, head_id,
             created_at DOUBLE, updated_at DOUBLE, info BLOB)
    messages(id, session_id, parent_id, role, seq BIGINT, created_at DOUBLE,
             hidden_at DOUBLE, envelope BLOB, parts BLOB,
             compaction BOOLEAN)                         (parts, compaction: version 3)
    chunks(generation_id, idx INTEGER, payload BLOB, is_final BOOLEAN, seq BIGINT,
           n INTEGER)                                    (n: version 2)
    config(key, value BLOB)

(Versions 1 and 2 kept parts in a table of their own, ``parts(session_id, message_id,
idx, type, state, tool_call_id, payload)``; version 3 moves them into their rows.)

Why it looks like this:

- Narrow tables: every non-empty table takes at least one 16 KiB block of the file
  and every column adds segment metadata, so rarely-queried fields live in one msgpack
  column: ``sessions.info`` holds metadata, model, permissions, usage rollups and
  settings; ``messages.envelope`` is the message without its ``parts`` (``id`` and
  ``role`` included, so loading it is one msgpack map with nothing to merge, and
  ``metadata`` or any extra key round-trips exactly, an absent ``metadata`` staying
  absent); ``messages.parts`` is the list of parts as one msgpack value built from
  each part's own bytes (:mod:`~thinkray.storage.part_blobs`: an array, or a map by
  index when a write left a gap). ``role`` and ``compaction`` (TRUE when a part is a
  ``data-compaction``, else NULL) are copies for queries only.
- No PRIMARY KEY/UNIQUE constraints: the ART indexes grow the file, and DuckDB turns
  an update of an indexed row into delete + insert. The store has a single writer
  (the actor that holds the file lock, serialized by :class:`Database`'s lock), so
  uniqueness is checked in code inside the writing transaction.
- Parts live in their message's row (issue 23): a table of their own took a 16 KiB
  block of every file and a query of every history load (~9 ms of ~55 at 10,000
  messages). A part write rewrites its message's blob from the bytes in memory (the
  cache below) or read back; the journal's fold does it once per message per fold.
- Compactions are ``data-compaction`` parts (found through ``messages.compaction``);
  they go away with their message, so no table of their own.
- A history load reads ``(id, parent_id, hidden_at, envelope, parts)`` for the session
  and walks the tree in Python (a recursive CTE costs 64-100 ms at depth 10,000, the
  walk a few ms), then decodes the path's envelopes with one msgpack call and its
  parts with another.
- A stream flush is one transaction with a constant number of statements; rows go in
  through ``INSERT ... SELECT unnest(?)`` with list parameters (``executemany`` and
  multi-row ``VALUES`` are several times slower here).
- A flush's chunks with consecutive indexes are one ``chunks`` row: ``idx`` is the
  first index, ``n`` the count and ``payload`` a msgpack array (a turn's ~200 chunks
  are one row, not 200; rows of version 1, and chunks written out of order, are one
  chunk each with ``n`` NULL). A run's array over ``_COMPRESS_FROM`` bytes is stored
  zlib-compressed (a stream's chunks repeat their keys: ~9 KB a turn become ~1.5 KB,
  so the log takes one block of the file instead of several, and the WAL shipped per
  turn shrinks alike); a zlib stream starts with ``0x78``, which no msgpack map or
  array does, so old rows read as they are.
- The store is the file's only writer, so it keeps what it last read or wrote of
  recently used sessions in memory (``_Cached``: the sessions row and the visible
  history from the head, as the stored bytes) and serves ``get_session`` and
  ``get_history`` from it; a turn's writes (``append_message``, ``flush_stream``,
  ``add_usage``) update it as they commit, so a turn costs no history read (and, through
  the journal below, no statement at all). Every other write forgets it, and so does any rollback
  (``Database.rollbacks``): what is in memory is only ever what was committed.

The journal (issue 23): a DuckDB statement costs 0.25-0.45 ms of CPU here whatever it
writes, so a turn written straight to DuckDB (about a dozen statements, two commits)
cost more than the rest of the turn. A store that opens its own file therefore writes
``append_message`` and ``flush_stream`` through ``<file>.journal``
(:mod:`~thinkray.storage.journal`) whenever memory can check them as the cached path
above does (the session cached with its history, the parent known, the message id new:
the ids of the file are kept in memory too) and no transaction is open (a write inside
one must commit with the other stores' writes). The record is appended and
``fdatasync``'d before the call returns, so it is as durable as a DuckDB commit; the
cache is updated as for a commit. What the journal holds is *folded* into DuckDB in one
transaction (:mod:`~thinkray.storage.write_behind`: one statement per kind of row,
whatever the number of turns) before anything reads the file (every path to it goes
through :attr:`DuckDBSessionStore.db`, which folds first), once it holds
``_FOLD_RECORDS`` durable records (a recorder's timed progress flushes do not count)
or ``_FOLD_BYTES`` bytes, and at close. A crash leaves the journal: the next open
replays it (a torn append is dropped, with what followed it). The fold marks the
last record it wrote in ``config`` in its own transaction, so nothing is replayed twice.
Under an object-store root the actors turn the journal off: there a turn is durable
once DuckDB's WAL is shipped.

The tool-call ledger's rows go through the same journal (``_Sink``, the
:class:`~thinkray.storage.write_behind.JournalSink` its store finds on the
database), and :meth:`DuckDBSessionStore.batch` makes a turn's step (the calls it
decided, claimed, and the stream batch that shows them) one append: a tool call costs
no DuckDB statement either.

Threads, branches and rewind (seeds 001 and 002) need no table of their own:

- A thread is a session with a ``thread_key`` (unique, a safe identifier). The
  default thread (``thread()`` with no key) is the session keyed ``"default"``,
  created on first use; sessions made without a key are not threads, so every
  caller of the session-id API is unaffected.
- Branch and clone copy the visible path into a new session with one
  ``INSERT ... SELECT`` (see ``_COPY_MESSAGES``; the parts come with their rows): new
  ids are ``salt || old id``, computed in SQL; envelopes still name the source id, so
  every load takes ``id`` from the column (the column is the truth). Rollups are
  recomputed from the copied assistant envelopes' ``metadata.usage``.
- Rewind soft-hides with one ``hidden_at`` stamp per rewind (unique: ``_now`` is
  strictly increasing), so un-rewind finds exactly what it hid; the per-session
  rewind log (head before, stamp, what a compaction gave back) is one ``config`` row
  (``sessions.rewinds:<id>``), not part of ``sessions.info``, which every usage bump
  rewrites.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
import sys
import time
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import duckdb
import msgpack
import msgspec
from thinkray.storage import blank as _blank
from thinkray.storage import part_blobs as _part_blobs
from thinkray.storage import search as _search
from thinkray.storage.codec import pack as _pack
from thinkray.storage.codec import unpack as _unpack
from thinkray.storage.db import (
    MEMORY_PATH,
    VERSION_KEY,
    Database,
    DatabaseClosedError,
    Migration,
    StatementCount,
)
from thinkray.storage.journal import Journal, journal_path, read_records
from thinkray.storage.protocols import HEAD, SessionStore, Thread
from thinkray.storage.stores import AGENT_COMPONENTS, WAKE_PROBES, DuckDBStores
from thinkray.storage.types import (
    DEFAULT_SETTINGS_KEY,
    DEFAULT_THREAD_KEY,
    THREAD_KEY_PATTERN,
    USAGE_KEYS,
    ChunkPrune,
    ChunkWrite,
    InvalidInputError,
    Message,
    MessageNotFoundError,
    MessageRow,
    NotOnPathError,
    PartWrite,
    RewindInfo,
    SearchHit,
    SessionInfo,
    SessionNotFoundError,
    StreamFlush,
    ThreadExistsError,
    ThreadNotFoundError,
    UnrewindInfo,
    empty_rollup,
)
from thinkray.storage.write_behind import (
    FOLDED_KEY,
    SINK_KEY,
    JournalSink,
    Pending,
    fold,
    folded_mark,
    records_of,
)
from thinkray.storage.write_behind import as_columns as _as_columns
from thinkray.storage.write_behind import insert_rows as _insert_rows
from thinkray.storage.write_behind import update_part_blobs as _update_part_blobs
from typing_extensions import override

_log = logging.getLogger(__name__)

COMPONENT = "sessions"
ROLES = frozenset({"system", "user", "assistant"})

# add_usage: one step's keys -> the session rollup they add to.
_STEP_TO_ROLLUP = {
    "input": "prompt_tokens",
    "output": "completion_tokens",
    "reasoning": "reasoning_tokens",
    "cache_read": "cache_read",
    "cache_write": "cache_write",
}
_ROLLUP_KEYS = frozenset((*USAGE_KEYS, "cost_usd"))


def _v1(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(
        """
        CREATE TABLE IF NOT EXISTS sessions (
            id VARCHAR, name VARCHAR, parent_session_id VARCHAR, parent_message_id VARCHAR,
            thread_key VARCHAR, head_id VARCHAR, created_at DOUBLE, updated_at DOUBLE,
            info BLOB);
        CREATE TABLE IF NOT EXISTS messages (
            id VARCHAR, session_id VARCHAR, parent_id VARCHAR, role VARCHAR, seq BIGINT,
            created_at DOUBLE, hidden_at DOUBLE, envelope BLOB);
        CREATE TABLE IF NOT EXISTS parts (
            session_id VARCHAR, message_id VARCHAR, idx INTEGER, type VARCHAR, state VARCHAR,
            tool_call_id VARCHAR, payload BLOB);
        CREATE TABLE IF NOT EXISTS chunks (
            generation_id VARCHAR, idx INTEGER, payload BLOB, is_final BOOLEAN, seq BIGINT);
        CREATE TABLE IF NOT EXISTS config (key VARCHAR, value BLOB);
        """
    )


def _v2(con: duckdb.DuckDBPyConnection) -> None:
    # A row holds n consecutive chunks (a msgpack array); NULL: one chunk (version 1).
    con.execute("ALTER TABLE chunks ADD COLUMN IF NOT EXISTS n INTEGER")


def _v3(con: duckdb.DuckDBPyConnection) -> None:
    # Issue 23: a message's parts move into its row (thinkray.storage.part_blobs), so the
    # file has one table (and one 16 KiB block) less and a history load one query less.
    con.execute("ALTER TABLE messages ADD COLUMN IF NOT EXISTS parts BLOB")
    con.execute("ALTER TABLE messages ADD COLUMN IF NOT EXISTS compaction BOOLEAN")
    if not con.execute(
        "SELECT 1 FROM duckdb_tables() WHERE table_name = 'parts' "
        "AND database_name = current_database() AND schema_name = current_schema()"
    ).fetchone():
        return
    by_message: dict[str, dict[int, bytes]] = {}
    for mid, idx, payload in con.execute("SELECT message_id, idx, payload FROM parts").fetchall():
        by_message.setdefault(mid, {})[idx] = payload
    _update_part_blobs(con, {mid: _part_blobs.pack_slots(s) for mid, s in by_message.items()})
    con.execute("UPDATE messages SET parts = ? WHERE parts IS NULL", [_part_blobs.EMPTY])
    con.execute("DROP TABLE parts")


MIGRATIONS: list[Migration] = [Migration(1, _v1), Migration(2, _v2), Migration(3, _v3)]

# A new file is a copy of a blank one with these tables (see thinkray.storage.blank):
# the session store's and those every agent's wake opens.
_NEW_FILE_COMPONENTS = ((COMPONENT, MIGRATIONS), *AGENT_COMPONENTS)

_SESSION_COLS = (
    "id, name, parent_session_id, parent_message_id, thread_key, head_id, "
    "created_at, updated_at, info"
)
_INSERT_CHUNKS = (
    "INSERT INTO chunks SELECT unnest(?::VARCHAR[]), unnest(?::INTEGER[]), "
    "unnest(?::BLOB[]), unnest(?::BOOLEAN[]), unnest(?::BIGINT[]), unnest(?::INTEGER[])"
)


# Insert a message unless its id exists anywhere (ids are store-wide): the count it
# returns is the duplicate check, so a new message costs one statement.
_INSERT_NEW_MESSAGE = (
    "INSERT INTO messages SELECT ?, ?, ?, ?, ?, ?, NULL, ?, ?, ? "
    "WHERE NOT EXISTS (SELECT 1 FROM messages WHERE id = ?)"
)
# How many sessions' rows and histories the store keeps in memory: always the 16 used
# last, and up to 256 while each was used in the last 30 s. The runs streaming at once
# each use theirs every progress batch; with more of them than a fixed 16 (25 chats on
# one agent through the ingress), a plain LRU evicted every entry before its next use,
# each batch then missed the journal and took DuckDB's path (25 sessions: 115
# statements and 16 commits per turn, instead of 0; 100 sessions: 747 and 106).
# The in-use entries beyond the 16 also stop at 50,000 cached messages in all (~25 MB
# of realistic history), so a burst of reads of long sessions stays bounded.
_CACHED_SESSIONS = 16
_CACHED_SESSIONS_IN_USE = 256
_CACHE_IN_USE_S = 30.0
_CACHED_MESSAGES = 50_000
_IDS = "(SELECT unnest(?::VARCHAR[]))"

# Branch and clone copy a path with one INSERT ... SELECT per table. A copy's id is
# computed in SQL as ``$salt || source id`` (a fresh random salt per copy keeps ids
# unique store-wide, and parts need no id lookup to follow their message); parent
# links are remapped to the previous copied message in ``seq`` order, which is path
# order (a parent always exists before its child, so ``seq`` grows along every path)
# and skips hidden messages. Which rows are copied: when the path's visible messages
# up to the fork are all the session's visible messages up to it in ``seq`` (one
# chain, the usual case) a predicate selects them; otherwise their ids go as a list.
_COPY_MESSAGES = (
    "INSERT INTO messages SELECT $salt || m.id, $sid, $salt || lag(m.id) OVER (ORDER BY m.seq), "
    "m.role, $base::BIGINT + row_number() OVER (ORDER BY m.seq), m.created_at, NULL, m.envelope, "
    "m.parts, m.compaction FROM messages m WHERE m.session_id = $src AND {rows}"
)
_COPY_BY_RANGE = "m.hidden_at IS NULL AND m.seq <= $fork"
_COPY_BY_LIST = "m.id IN (SELECT unnest($old::VARCHAR[]))"

# Rewinds are logged per session in ``config`` (not in ``sessions.info``, which every
# usage bump rewrites): a stack of records that unrewind pops.
_REWIND_KEY = "sessions.rewinds:"
_REWIND_LOG_LIMIT = 100
# Keys a compaction's ``covers`` range may use (its first and last summarized message).
_COVERS_FROM = ("from_id", "from", "start_id", "first_id")
_COVERS_TO = ("to_id", "to", "end_id", "last_id")


def _rewind_key(session_id: str) -> str:
    return _REWIND_KEY + session_id


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _rollup_of(envelopes: list[Any]) -> dict[str, Any]:
    """Session rollups from assistant messages' ``metadata.usage`` (seed 002: a branch
    recomputes them from its copies; nothing is copied from the parent's row)."""
    # Fast path (what the recorder writes: non-negative ints): one C-level sum per key
    # instead of a Python loop per message (~1 ms against ~7 for 5,000 messages).
    metas = [e.get("metadata") for e in envelopes if e.__class__ is dict]
    usages = [u for m in metas if m.__class__ is dict and (u := m.get("usage")).__class__ is dict]
    try:
        sums = {k: sum(u.get(k, 0) for u in usages) for k in _STEP_TO_ROLLUP}
        costs = [c for u in usages if (c := u.get("cost_usd")) is not None]
        cost = sum(costs) if costs else None
    except TypeError:
        sums = None
    if (
        sums is not None
        and all(v.__class__ is int and v >= 0 for v in sums.values())
        and (cost is None or cost.__class__ in (int, float))
    ):
        rollup = empty_rollup()
        for step_key, rollup_key in _STEP_TO_ROLLUP.items():
            rollup[rollup_key] = sums[step_key]
        rollup["total_tokens"] = sum(sums.values())
        rollup["cost_usd"] = cost
        return rollup
    return _rollup_checked(envelopes)


def _rollup_checked(envelopes: Iterable[Any]) -> dict[str, Any]:
    """The same, skipping values that are not non-negative numbers."""
    rollup = empty_rollup()
    cost: float | None = None
    for envelope in envelopes:
        meta = envelope.get("metadata") if isinstance(envelope, dict) else None
        usage = meta.get("usage") if isinstance(meta, dict) else None
        if not isinstance(usage, dict):
            continue
        for step_key, rollup_key in _STEP_TO_ROLLUP.items():
            value = usage.get(step_key)
            if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
                rollup[rollup_key] += int(value)
        value = usage.get("cost_usd")
        if isinstance(value, int | float) and not isinstance(value, bool):
            cost = (cost or 0.0) + value
    rollup["total_tokens"] = sum(rollup[k] for k in _STEP_TO_ROLLUP.values())
    rollup["cost_usd"] = cost
    return rollup


# -- msgpack -----------------------------------------------------------------------


# msgspec's decoder gives the values msgpack's gives for what codec.pack writes (str and
# bin apart, maps with any scalar keys, lists), ~1.4x as fast: a 10k-message history's
# decode took ~14 ms of its ~29 ms first read with msgpack, ~10 ms with msgspec.
_BULK_DECODER = msgspec.msgpack.Decoder()


def _unpack_many(payloads: Sequence[bytes | bytearray]) -> list[Any]:
    """Decode many msgpack values with one C call: frame them as one array.

    One ``join`` with the array header in front: every extra copy of a multi-MB buffer
    is a fresh mmap and its page faults (~1 ms per copy of 3 MB here).
    """
    if not payloads:
        return []
    framed = b"".join((b"\xdd" + len(payloads).to_bytes(4, "big"), *payloads))
    return cast(list[Any], _BULK_DECODER.decode(framed))


PROMOTE_FROM = 10_000
"""Containers a :func:`_no_gc` block must have left in the young generation (~2,500
messages' worth) for it to move them to the oldest one."""


@contextmanager
def _no_gc() -> Iterator[None]:
    """Pause the cyclic GC while building a large history.

    Tens of thousands of fresh dicts and lists trigger repeated collections whose cost
    grows with the heap: without this a 10,000-message history takes ~1.7x longer.
    Nothing built here is cyclic, so the pause defers no real work.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if gc.get_count()[0] >= PROMOTE_FROM and not gc.get_freeze_count():
            # Into the oldest generation with two list splices, so that no young
            # collection walks what was built (~5 ms for a 10,000-message history):
            # it is acyclic, freed by reference counts. Only after a large build: the
            # splice takes the process's other young objects along, and a cycle among
            # them then waits for a full collection. What an application froze would
            # be unfrozen too, so then the young collections run as before.
            gc.freeze()
            gc.unfreeze()
        gc.enable()


# -- result sets -------------------------------------------------------------------


def _columns(cursor: duckdb.DuckDBPyConnection, width: int) -> list[list[Any]]:
    """The result as one Python list per column.

    ``fetchnumpy`` converts a 10,000-row result about twice as fast as ``fetchall``
    (no tuple per row). numpy is not a dependency of storage, but Ray imports it in
    every worker; use it only when it is already loaded so a cold import never lands
    on a wake.
    """
    if "numpy" in sys.modules:
        return [column.tolist() for column in cursor.fetchnumpy().values()]
    rows = cursor.fetchall()
    if not rows:
        return [[] for _ in range(width)]
    return [list(column) for column in zip(*rows, strict=True)]


# -- validation --------------------------------------------------------------------


def _check_str(value: Any, what: str, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{what} must be a non-empty string, got {value!r}")


MAX_SESSION_ID = 256


def _check_session_id(value: Any) -> None:
    """A new session's id: 1-256 printable characters, the rule every entry point
    (handle, HTTP path, WebSocket) applies to the ids it is given, so an id the store
    accepts can always be named again to rename or delete it."""
    if value is None:
        return
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= MAX_SESSION_ID
        or not value.isprintable()
    ):
        raise InvalidInputError(
            f"session_id must be 1-{MAX_SESSION_ID} printable characters, got {str(value)[:80]!r}"
        )


def _check_config_key(key: Any) -> None:
    """A key :meth:`DuckDBSessionStore.set_config` may write: ``config`` also holds the
    file's schema versions (``schema_version.*``, :class:`Database`'s), which no caller
    may overwrite or delete."""
    _check_str(key, "config key")
    if key.startswith(VERSION_KEY):
        raise InvalidInputError(f"config keys starting {VERSION_KEY!r} are the file's own")


def _check_dict(value: Any, what: str, *, optional: bool = True) -> None:
    if value is None and optional:
        return
    if not isinstance(value, dict):
        raise InvalidInputError(f"{what} must be a dict, got {type(value).__name__}")


def _check_index(value: Any, what: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidInputError(f"{what} must be a non-negative int, got {value!r}")


_THREAD_KEY = re.compile(THREAD_KEY_PATTERN)


def _check_thread_key(key: Any, what: str = "thread key") -> None:
    if not isinstance(key, str) or not _THREAD_KEY.fullmatch(key):
        raise InvalidInputError(
            f"{what} must match {THREAD_KEY_PATTERN} (letters, digits, '_', '.', '-'; "
            f"at most 128; starting with a letter or digit), got {key!r}"
        )


def _check_ids(ids: Any, what: str) -> list[str]:
    if isinstance(ids, str) or not isinstance(ids, Iterable):
        raise InvalidInputError(f"{what} must be a list of ids")
    out = list(ids)
    for mid in out:
        _check_str(mid, f"{what} item")
    return out


def _check_usage(usage: Any) -> None:
    """Validate one step's usage (what ``add_usage`` takes)."""
    _check_dict(usage, "usage", optional=False)
    unknown = set(usage) - set(_STEP_TO_ROLLUP) - {"cost_usd"}
    if unknown:
        raise InvalidInputError(f"unknown usage keys {sorted(unknown)}")
    for key in _STEP_TO_ROLLUP:
        if key in usage:
            _check_index(usage[key], f"usage[{key!r}]")
    cost = usage.get("cost_usd")
    if cost is not None and (isinstance(cost, bool) or not isinstance(cost, int | float)):
        raise InvalidInputError(f"usage['cost_usd'] must be a number, got {cost!r}")


def _add_usage(info: SessionInfo, usage: dict[str, Any]) -> None:
    """Add one step's (checked) usage to the session's rollup."""
    rollup = info.usage
    for step_key, rollup_key in _STEP_TO_ROLLUP.items():
        amount = usage.get(step_key, 0)
        rollup[rollup_key] = rollup.get(rollup_key, 0) + amount
        rollup["total_tokens"] = rollup.get("total_tokens", 0) + amount
    cost = usage.get("cost_usd")
    if cost is not None:
        rollup["cost_usd"] = (rollup.get("cost_usd") or 0) + cost
    step_tokens = sum(usage.get(k, 0) for k in _STEP_TO_ROLLUP)
    if step_tokens:
        # The context is what this call read and wrote, not a sum over calls (each
        # re-read the conversation); a step that reported nothing leaves it as it was.
        info.context_tokens = step_tokens


def _check_parent(parent_id: Any) -> None:
    if parent_id is not HEAD and parent_id is not None:
        _check_str(parent_id, "parent_id")


def _envelope(message: Any) -> tuple[str, str, bytes]:
    """Validate a message's envelope. Returns ``(id, role, packed envelope)``."""
    if not isinstance(message, dict):
        raise InvalidInputError(f"message must be a dict, got {type(message).__name__}")
    mid = message.get("id")
    _check_str(mid, "message id")
    role = message.get("role")
    if role not in ROLES:
        raise InvalidInputError(f"message role must be one of {sorted(ROLES)}, got {role!r}")
    _check_dict(message.get("metadata"), "message metadata")
    # The whole message but its parts: loading it back is one dict from msgpack,
    # with nothing to merge (an absent ``metadata`` stays absent).
    envelope = {k: v for k, v in message.items() if k != "parts"}
    return cast(str, mid), cast(str, role), _pack(envelope, f"message {mid!r}")


def _part_row(message_id: str, index: int, part: Any) -> tuple[Any, ...]:
    if not isinstance(part, dict):
        raise InvalidInputError(f"part {index} of {message_id!r} must be a dict")
    ptype = part.get("type")
    if not isinstance(ptype, str) or not ptype:
        raise InvalidInputError(f"part {index} of {message_id!r} needs a string 'type'")
    state = part.get("state")
    call_id = part.get("toolCallId")
    return (
        message_id,
        index,
        ptype,
        state if isinstance(state, str) else None,
        call_id if isinstance(call_id, str) else None,
        _pack(part, f"part {index} of {message_id!r}"),
    )


def _message(message: Any) -> tuple[str, str, bytes, list[tuple[Any, ...]]]:
    """Validate a whole message. Returns ``(id, role, envelope, part rows)``."""
    mid, role, envelope = _envelope(message)
    parts = message.get("parts")
    if not isinstance(parts, list):
        raise InvalidInputError(f"message {mid!r} parts must be a list")
    return mid, role, envelope, [_part_row(mid, i, p) for i, p in enumerate(parts)]


def _parts_of(part_rows: Sequence[tuple[Any, ...]]) -> tuple[bytes, bool | None]:
    """A whole message's ``messages.parts`` blob and ``compaction`` flag (True or NULL)
    from its part rows (``_part_row``'s, indexes ``0..n-1``)."""
    blob = _part_blobs.pack([row[5] for row in part_rows])
    compaction = any(row[2] == _part_blobs.COMPACTION_TYPE for row in part_rows)
    return blob, True if compaction else None


def _session_info(row: Sequence[Any]) -> SessionInfo:
    info = _unpack(row[8]) if row[8] is not None else {}
    usage = empty_rollup()
    usage.update(info.get("usage") or {})
    return SessionInfo(
        id=row[0],
        name=row[1],
        created_at=row[6],
        updated_at=row[7],
        parent_session_id=row[2],
        parent_message_id=row[3],
        thread_key=row[4],
        head_id=row[5],
        metadata=info.get("metadata") or {},
        model=info.get("model"),
        permissions=info.get("permissions") or {},
        usage=usage,
        settings=info.get("settings") or {},
        context_tokens=info.get("context_tokens"),
    )


def _info_blob(info: SessionInfo) -> bytes:
    return _pack(
        {
            "metadata": info.metadata,
            "model": info.model,
            "permissions": info.permissions,
            "usage": info.usage,
            "settings": info.settings,
            "context_tokens": info.context_tokens,
        },
        "session info",
    )


class _Tree:
    """The messages of one session, as column lists (in no particular order)."""

    __slots__ = (
        "ids",
        "parents",
        "hidden",
        "envelopes",
        "roles",
        "seqs",
        "created",
        "pos",
        "parts",
    )

    def __init__(self, cols: list[list[Any]], parts: list[bytes | None] | None = None) -> None:
        self.ids, self.parents, self.hidden, self.envelopes = cols[:4]
        self.parts = parts if parts is not None else []  # parts blobs, when loaded
        # Only get_path (MessageRow) needs these; the lifecycle operations only roles.
        rest = cols[4:] + [[] for _ in range(7 - len(cols))]
        self.roles, self.seqs, self.created = rest
        self.pos = dict(zip(self.ids, range(len(self.ids)), strict=True))

    def path(self, leaf: int | None) -> list[int]:
        """Positions from the root to ``leaf``. Stops at a parent outside the session."""
        if self.is_chain_to(leaf):
            return list(range(len(self.ids)))
        out: list[int] = []
        pos, parents = self.pos, self.parents
        limit = len(self.ids)
        i = leaf
        while i is not None:
            out.append(i)
            if len(out) > limit:  # a cycle can only come from hand-edited rows
                break
            parent = parents[i]
            i = pos.get(parent) if parent is not None else None
        out.reverse()
        return out

    def is_chain_to(self, leaf: int | None) -> bool:
        """Whether the rows, as read, are the path from the root to ``leaf``: each the
        parent of the next (the usual session, read in insertion order). Two list
        comparisons in C instead of a Python step per message (~4 ms at 10,000)."""
        ids, parents = self.ids, self.parents
        return bool(ids) and leaf == len(ids) - 1 and parents[0] is None and parents[1:] == ids[:-1]


def _build_messages(
    ids: Sequence[str], envelopes: Sequence[bytes], part_blobs: Sequence[bytes | None]
) -> list[Message]:
    """Messages from stored bytes: each envelope with its id (the id column is the
    truth: a branch or clone copies envelopes verbatim and gives the copies new ids)
    and its parts (``messages.parts``), decoded with two msgpack calls in all."""
    messages = _unpack_many(envelopes)
    parts = _unpack_many([blob or _part_blobs.EMPTY for blob in part_blobs])
    for message, mid, listed in zip(messages, ids, parts, strict=True):
        message["id"] = mid
        # A map: a message whose part indexes have a gap (see part_blobs).
        message["parts"] = listed if listed.__class__ is list else _part_blobs.as_list(listed)
    return messages


@dataclass
class _FlushBatch:
    """A :class:`StreamFlush`, checked and serialized (see :meth:`check`)."""

    sid: str
    envelope: tuple[str, str, bytes] | None
    parent_id: str | None
    use_head: bool
    part_rows: list[tuple[Any, ...]]
    target: str | None  # the message ``parts_length`` shrinks
    parts_length: int | None
    named: set[str]  # messages the batch writes parts of (or shrinks), but its own
    chunk_rows: list[tuple[Any, ...]]
    usage: list[dict[str, Any]]
    prune: ChunkPrune | None
    durable: bool = True  # False: a progress flush (see StreamFlush.durable)

    @property
    def touches(self) -> bool:
        """Whether the batch changes a message (so the session's ``updated_at`` moves)."""
        return self.envelope is not None or bool(self.part_rows) or self.target is not None

    @classmethod
    def check(cls, flush: Any) -> _FlushBatch:
        """Validate and serialize everything, so that a bad batch writes nothing.

        Raises:
            InvalidInputError: what is malformed.
        """
        if not isinstance(flush, StreamFlush):
            raise InvalidInputError("flush must be a StreamFlush")
        sid = flush.session_id
        _check_str(sid, "session_id")
        envelope = _envelope(flush.message) if flush.message is not None else None
        _check_str(flush.parent_id, "parent_id", optional=True)
        latest: dict[tuple[str, int], PartWrite] = {}
        for pw in flush.parts:
            if not isinstance(pw, PartWrite):
                raise InvalidInputError("flush.parts must hold PartWrite items")
            _check_str(pw.message_id, "part message_id")
            _check_index(pw.index, "part index")
            latest[(pw.message_id, pw.index)] = pw  # the last write of a slot wins
        target: str | None = None
        length = flush.parts_length
        if length is not None:
            _check_index(length, "parts_length")
            if envelope is not None:
                target = envelope[0]
            else:
                mids = {mid for mid, _ in latest}
                if len(mids) != 1:
                    raise InvalidInputError(
                        "parts_length needs flush.message or parts of exactly one message"
                    )
                target = mids.pop()
        part_rows = [
            _part_row(mid, idx, pw.part)
            for (mid, idx), pw in latest.items()
            if not (mid == target and length is not None and idx >= length)
        ]
        named = {mid for mid, _ in latest} | ({target} if target else set())
        if envelope is not None:
            named.discard(envelope[0])
        for usage in flush.usage:
            _check_usage(usage)
        prune = flush.prune_chunks
        if prune is not None:
            if not isinstance(prune, ChunkPrune):
                raise InvalidInputError("flush.prune_chunks must be a ChunkPrune")
            _check_index(prune.keep, "prune_chunks.keep")
            _check_index(prune.slack, "prune_chunks.slack")
            _check_ids(prune.active, "prune_chunks.active")
        return cls(
            sid,
            envelope,
            flush.parent_id,
            flush.use_head,
            part_rows,
            target,
            length,
            named,
            _chunk_rows(flush.chunks),
            list(flush.usage),
            prune,
            bool(flush.durable),
        )


# A chunk run's msgpack array at least this long is stored zlib-compressed (level 1:
# ~30 us for a turn's 9 KB); its first byte is then 0x78, never a msgpack map's or
# array's, so readers tell the two apart by it.
_COMPRESS_FROM = 1024
_ZLIB_HEAD = 0x78


def _inflate(payload: bytes) -> bytes:
    """A chunk row's payload as msgpack (decompressed if it was stored compressed)."""
    return zlib.decompress(payload) if payload and payload[0] == _ZLIB_HEAD else payload


def _chunk_rows(chunks: Sequence[Any]) -> list[tuple[Any, ...]]:
    """``chunks`` rows ``(generation_id, idx, payload, is_final, n)``: each run of
    consecutive indexes of one generation is one row holding a msgpack array; a chunk
    out of order is a row of its own (``n`` None)."""
    for cw in chunks:
        if not isinstance(cw, ChunkWrite):
            raise InvalidInputError("flush.chunks must hold ChunkWrite items")
        _check_str(cw.generation_id, "generation_id")
        _check_index(cw.index, "chunk index")
        _check_dict(cw.chunk, "chunk", optional=False)
    runs: list[list[ChunkWrite]] = []
    for cw in chunks:
        last = runs[-1][-1] if runs else None
        if (
            last is not None
            and cw.generation_id == last.generation_id
            and cw.index == last.index + 1
        ):
            runs[-1].append(cw)
        else:
            runs.append([cw])
    rows: list[tuple[Any, ...]] = []
    for run in runs:
        first = run[0]
        if len(run) == 1:
            payload = _pack(first.chunk, f"chunk {first.index} of {first.generation_id!r}")
            rows.append((first.generation_id, first.index, payload, bool(first.is_final), None))
            continue
        try:
            payload = msgpack.packb([cw.chunk for cw in run], use_bin_type=True)
        except (TypeError, ValueError, OverflowError):
            for cw in run:  # name the chunk that cannot be stored
                _pack(cw.chunk, f"chunk {cw.index} of {cw.generation_id!r}")
            raise
        if len(payload) >= _COMPRESS_FROM:
            payload = zlib.compress(payload, 1)
        is_final = any(cw.is_final for cw in run)
        rows.append((first.generation_id, first.index, payload, is_final, len(run)))
    return rows


def _part_edits(batch: _FlushBatch) -> dict[str, dict[int, bytes]]:
    """``message id -> {index: packed part}`` of a flush's part writes, with the message
    it cuts (``parts_length``) among them: every message whose parts blob it changes."""
    out: dict[str, dict[int, bytes]] = {}
    for mid, idx, *_, payload in batch.part_rows:
        out.setdefault(mid, {})[idx] = payload
    if batch.target is not None:
        out.setdefault(batch.target, {})
    return out


def _cached_target(entry: _Cached, batch: _FlushBatch) -> tuple[str | None, str | None] | None:
    """``(new message id, its parent)`` of a flush when the cached history can check it:
    every message it names on that history, a new message's parent known (the head;
    or none, when the history is known to be empty). None when it cannot."""
    pos = entry.pos
    new: str | None = None
    parent: str | None = None
    if batch.envelope is not None and batch.envelope[0] not in pos:
        new = batch.envelope[0]
        if batch.parent_id is not None:
            if batch.parent_id not in pos:
                return None
            parent = batch.parent_id
        elif batch.use_head:
            parent = entry.row[5]
            if parent is None and entry.path != []:
                return None  # the latest visible message: the file knows it
    for mid in batch.named:
        if mid != new and mid not in pos:
            return None
    return new, parent


# The chunk log's rows as _generations groups them.
_GENERATION_ROWS = "SELECT generation_id, is_final, seq FROM chunks"


def _generations(rows: Iterable[tuple[Any, ...]]) -> tuple[list[str], list[str]]:
    """The chunk log's generations oldest first, and those without a final chunk, from
    ``_GENERATION_ROWS``. A plain scan (tens of rows: the log is pruned) grouped here:
    the same as a ``GROUP BY`` costs ~2 ms as a wake's first query of the table, ~0.4
    ms this way."""
    first: dict[str, int] = {}
    finished: set[str] = set()
    for generation, is_final, seq in rows:
        if generation not in first or seq < first[generation]:  # every writer numbers rows
            first[generation] = seq
        if is_final:
            finished.add(generation)
    every = sorted(first, key=first.__getitem__)
    return every, [g for g in every if g not in finished]


def _doomed_generations(generations: list[str], prune: ChunkPrune) -> list[str]:
    """The generations (oldest first) a prune deletes: all but the newest ``keep``
    that are not active, once there are more than ``keep + slack``."""
    if len(generations) <= prune.keep + prune.slack:
        return []
    keep = len(generations) - prune.keep
    active = set(prune.active)
    return [g for g in generations[: max(keep, 0)] if g not in active]


# The journal (see the module's notes) is folded into DuckDB once it holds this many
# durable records or bytes, and before anything reads the file.
_FOLD_RECORDS = 64
_FOLD_BYTES = 4 << 20
_JOURNAL = "sessions.journal"  # its before_close hook
# Past this many messages in a file, the ids are not kept in memory (a new message's
# duplicate check then asks the file: the journal is skipped for it).
_MAX_IDS = 200_000


def _opening_row(db: Database) -> tuple[Any, ...]:
    """What an open reads, in one statement: the largest message and chunk ``seq``, the
    latest ``updated_at`` and the journal's folded mark; with the tables a wake's
    recovery reads counted (``WAKE_PROBES``), the empty ones noted
    (:meth:`Database.known_empty`).

    One row per figure, ``UNION ALL``-ed: DuckDB plans a row of scalar subqueries as a
    chain of joins, which cost a wake ~3 ms of CPU more than the union (7 figures)."""
    probed = [table for component, table in WAKE_PROBES if db.has_component(component)]
    counts = "".join(
        f" UNION ALL SELECT {4 + i}, count(*), NULL, NULL FROM {table}"
        for i, table in enumerate(probed)
    )
    rows = db.fetchall(
        "SELECT 0, max(seq), NULL::DOUBLE, NULL::BLOB FROM messages"
        " UNION ALL SELECT 1, max(seq), NULL, NULL FROM chunks"
        " UNION ALL SELECT 2, NULL, max(updated_at), NULL FROM sessions"
        " UNION ALL SELECT 3, NULL, NULL, value FROM config WHERE key = ?" + counts,
        [FOLDED_KEY],
    )
    figure = {key: (number, real, blob) for key, number, real, blob in rows}
    none = (None, None, None)
    db.note_empty(table for i, table in enumerate(probed) if not figure[4 + i][0])
    return figure[0][0], figure[1][0], figure[2][1], figure.get(3, none)[2]


def _holds_bytes(path: os.PathLike[str]) -> bool:
    try:
        return os.stat(path).st_size > 0
    except FileNotFoundError:
        return False


def _replay_journal(db: Database) -> tuple[Journal, int, bool]:
    """Fold what a previous owner journaled and did not fold (a crash, or a close whose
    fold failed) into the file, then empty the journal. Returns the journal, the next
    record's number and whether the folded mark exists."""
    path = journal_path(db.path)
    records = list(records_of(read_records(path)))
    mark = folded_mark(db.con)
    pending = Pending()
    for record in records:
        if record["n"] > (mark or 0):
            pending.add(record)
    next_n = max([mark or 0, *(record["n"] for record in records)]) + 1
    journal = Journal(path)
    if pending:
        with db.transaction() as con:
            fold(db, con, pending, mark is not None)
        mark = pending.last_n
    if records or path.exists():
        journal.clear()  # a torn tail too: the next append must not follow it
    return journal, next_n, mark is not None


def _fold_pending(db: Database, state: _StoreState) -> None:
    """Write what the journal holds into DuckDB (one transaction, or the open one: then
    it counts as written once that one commits)."""
    with db.lock:
        pending = state.pending
        if not pending or pending.folding:
            return
        with db.transaction() as con:
            pending.folding = True
            db.after_transaction(lambda committed: _folded(state, pending, committed))
            fold(db, con, pending, state.marked)


def _folded(state: _StoreState, pending: Pending, committed: bool) -> None:
    pending.folding = False
    if not committed:
        return  # still in the journal and in memory: the next fold writes it
    state.marked = True
    if state.pending is pending:
        state.pending = Pending()
    if state.journal is not None:
        # Folded and marked: if the truncation fails, a replay skips these records.
        with contextlib.suppress(OSError):
            state.journal.clear()


def _close_journal(db: Database, state: _StoreState) -> None:
    """Fold and close the journal (the database's close runs this first): a clean
    close leaves no journal file."""
    try:
        _fold_pending(db, state)
    finally:
        state.pending = None
        db.state.pop(SINK_KEY, None)
        if state.journal is not None:
            state.journal.close()


def _forget_state(state: _StoreState) -> None:
    """Forget what memory knows of the file (it may hold a write that never landed)."""
    state.cache.clear()
    state.generations = None
    state.ids = None
    state.too_many_ids = False


def _append_batch(state: _StoreState, *, ending: bool) -> None:
    """Append the open batch's records as one frame and merge them (``ending``: the
    batch is over; else it goes on with what is written next). A failed append drops
    them, and what memory knew of them."""
    records = state.batch or []
    state.batch = None if ending else []
    if not records:
        return
    assert state.journal is not None and state.pending is not None
    try:
        _append(state, records[0] if len(records) == 1 else {"b": records}, sync=True)
    except BaseException:
        _discard_batch(state)
        raise
    for record in records:
        state.pending.add(record)


def _discard_batch(state: _StoreState) -> None:
    state.discards += 1
    _forget_state(state)


class _Sink(JournalSink):
    """The journal as the other stores of the file use it (see the module's notes)."""

    def __init__(self, db: Database, state: _StoreState) -> None:
        self._db = db
        self._state = state

    def writable(self) -> bool:
        return self._state.pending is not None and not self._db.in_transaction

    def write(self, record: dict[str, Any]) -> None:
        _journal_write(self._db, self._state, record)

    @contextmanager
    def batch(self) -> Iterator[None]:
        state = self._state
        with self._db.lock:
            if state.batch is not None:
                yield  # joins the open batch
                return
            if not self.writable():
                with self._db.transaction():  # or joins the open one
                    yield
                return
            state.batch = []
            try:
                yield
            except BaseException:
                if state.batch is not None:
                    state.batch = None
                    _discard_batch(state)
                raise
            _append_batch(state, ending=True)

    def tool_call_row(self, tool_call_id: str) -> list[Any] | None:
        state = self._state
        for record in reversed(state.batch or ()):
            for row in reversed(record.get("k", ())):
                if row[0] == tool_call_id:
                    return list(row[:-1])
        pending = state.pending
        if pending is None or pending.folding:
            return None  # folding: the open transaction has the rows (and may move them)
        return pending.tool_calls.get(tool_call_id)

    def has_tool_calls(self) -> bool:
        state = self._state
        if any("k" in record for record in state.batch or ()):
            return True
        pending = state.pending
        return pending is not None and not pending.folding and bool(pending.tool_calls)

    def settle(self) -> None:
        with self._db.lock:
            if self._state.batch:
                _append_batch(self._state, ending=False)
            _fold_pending(self._db, self._state)

    @property
    def discards(self) -> int:
        return self._state.discards


def _journal_write(
    db: Database, state: _StoreState, record: dict[str, Any], *, sync: bool = True
) -> None:
    """Append ``record`` to the journal (durable when this returns, unless ``sync`` is
    False: then with the next durable write) and merge it into what is pending; inside
    a batch, keep it for the batch's append (always durable). Call under the lock."""
    assert state.journal is not None and state.pending is not None
    db.wrote()  # the file's rows now include the journal's: no reader may assume empty
    record["n"] = state.next_n
    state.next_n += 1
    if state.batch is not None:
        state.batch.append(record)
        return
    _append(state, record, sync=sync)
    state.pending.add(record)
    if not sync:
        state.pending.progress += 1


def _append(state: _StoreState, record: dict[str, Any], *, sync: bool) -> None:
    """The journal append of a record or batch frame; a durable one written unsynced
    and owed (see :meth:`DuckDBSessionStore.defer_syncs`) while syncs are deferred."""
    assert state.journal is not None
    if sync and state.deferring:
        state.journal.append(record, sync=False)
        state.owed = True
    else:
        state.journal.append(record, sync=sync)


@dataclass
class _StoreState:
    """What the session stores of one :class:`Database` keep in memory.

    ``seq`` orders messages (and ``chunk_seq`` chunks) store-wide, and ``last_ts``
    keeps timestamps strictly increasing: the file has one writer, so counters
    initialised from it are enough. ``cache`` is what was committed of recently used
    sessions (most recent last) and ``generations`` the chunk log's generations
    oldest first (None: not read yet); both are valid while ``Database.rollbacks``
    equals ``epoch`` (see the module)."""

    seq: int
    chunk_seq: int
    last_ts: float
    cache: OrderedDict[str, _Cached] = field(default_factory=OrderedDict)
    generations: list[str] | None = None
    epoch: int = 0
    # The write-behind journal (None: every write goes straight to DuckDB). See
    # "The journal" in the module's notes.
    journal: Journal | None = None
    pending: Pending | None = None
    next_n: int = 1  # the next journal record's number
    marked: bool = False  # whether config holds the folded mark already
    # The records of the open batch (None: no batch is open); how many were dropped.
    batch: list[dict[str, Any]] | None = None
    discards: int = 0
    # Every message id in the file and the journal (None: not read yet), so that a new
    # message's duplicate check needs no statement.
    ids: set[str] | None = None
    too_many_ids: bool = False  # more than _MAX_IDS: the file answers instead
    # The sessions table was empty at open and no session was made since (a clone
    # needs a parent, so only create_session ends it).
    no_sessions: bool = False
    # Open defer_syncs() blocks, and whether a durable write since awaits sync_deferred().
    deferring: int = 0
    owed: bool = False


@dataclass
class _Cached:
    """What the store knows of one session without reading the file: its
    ``sessions`` row (``_SESSION_COLS`` order) and, once a history was read or
    written, the visible messages from the head as stored (envelope and part bytes;
    ``path`` None when unknown). See the module's notes."""

    row: list[Any]
    path: list[str] | None = None
    envelopes: list[bytes] = field(default_factory=list)
    parts: list[bytes | None] = field(default_factory=list)  # each message's parts blob
    pos: dict[str, int] = field(default_factory=dict)
    used_at: float = 0.0  # time.monotonic() of the entry's last use

    def set_path(
        self,
        ids: list[str],
        envelopes: list[bytes],
        parts: list[bytes | None],
        pos: dict[str, int] | None = None,
    ) -> None:
        """Remember a history (``pos``: its ids' positions, when the caller has them;
        the entry owns the lists and the dict from now on)."""
        self.path, self.envelopes, self.parts = ids, envelopes, parts
        self.pos = pos if pos is not None else {mid: i for i, mid in enumerate(ids)}

    def forget_path(self) -> None:
        self.path = None
        self.envelopes, self.parts, self.pos = [], [], {}

    def extend(self, parent: str | None, mid: str, envelope: bytes, parts: bytes) -> None:
        """A message was added under ``parent`` and became the head."""
        if self.path is None:
            return
        if parent is None:
            keep = 0
        elif parent in self.pos:
            keep = self.pos[parent] + 1
        else:
            self.forget_path()
            return
        if keep < len(self.path):
            self.set_path(self.path[:keep], self.envelopes[:keep], self.parts[:keep])
        self.pos[mid] = len(self.path)
        self.path.append(mid)
        self.envelopes.append(envelope)
        self.parts.append(parts)

    def write_parts(self, mid: str, length: int | None, writes: dict[int, bytes]) -> None:
        """A flush cut the message's parts to ``length`` (None: did not) and wrote
        ``writes`` (index -> packed part), as :func:`part_blobs.splice` does."""
        at = self.pos[mid]
        self.parts[at] = _part_blobs.splice(self.parts[at], length, writes)


class DuckDBSessionStore(SessionStore):
    """:class:`~thinkray.storage.protocols.SessionStore` on one DuckDB file (or ``:memory:``).

    Given a path, the store owns its :class:`Database` and closes it in :meth:`close`;
    given a :class:`Database`, it shares it (other stores use the same connection so a
    flush touching several tables commits once) and leaves closing it to the owner.
    :meth:`stores` hands out the other stores of that database.
    """

    def __init__(
        self,
        db: Database | str | os.PathLike[str],
        *,
        lock_retry_seconds: float = 2.0,
        journal: bool = True,
    ) -> None:
        """``journal``: for a store that opens its own file, write a turn's messages,
        parts and chunks to the journal beside it and fold them into DuckDB in batches
        (see the module). Off for a :class:`Database` given by the caller and for
        ``:memory:``; the actors turn it off for object-store roots, whose per-turn
        durability ships DuckDB's own WAL."""
        if isinstance(db, Database):
            self._database = db
            self._owns = False
        else:
            # A new agent's tables are copied from the blank: its wake reads nothing.
            # Its journal's name is created with it, under one folder sync.
            new = str(db) != MEMORY_PATH and _blank.create(
                db, _NEW_FILE_COMPONENTS, (journal_path(db),) if journal else ()
            )
            self._database = Database(
                db,
                lock_retry_seconds=lock_retry_seconds,
                fresh=new,
                versions=_blank.versions(_NEW_FILE_COMPONENTS) if new else None,
            )
            self._owns = True
        self._closed = False
        self._stores: DuckDBStores | None = None
        try:
            db_ = self._database
            db_.migrate(COMPONENT, MIGRATIONS)
            state = db_.state.get(COMPONENT)
            if state is None:
                use_journal = journal and self._owns and db_.path != MEMORY_PATH
                # A journal left behind (a crash) is replayed before anything is read
                # (an empty one holds nothing: a new file's own, made with it).
                left = use_journal and _holds_bytes(journal_path(db_.path))
                replayed = _replay_journal(db_) if left else None
                row = (None, None, None, None) if db_.fresh else _opening_row(db_)
                if use_journal and replayed is None:  # no journal: the mark says where to go on
                    mark = None if row[3] is None else int(_unpack(row[3]))
                    replayed = Journal(journal_path(db_.path)), (mark or 0) + 1, mark is not None
                state = db_.state[COMPONENT] = _StoreState(
                    row[0] or 0, row[1] or 0, row[2] or 0.0, epoch=db_.rollbacks
                )
                # An empty table is known without a query (a new agent's first turn).
                if row[0] is None:
                    state.ids = set()
                if row[1] is None:
                    state.generations = []
                state.no_sessions = row[2] is None
                if replayed is not None:
                    state.journal, state.next_n, state.marked = replayed
                    if db_.fresh:  # a new agent: its journal was made with its file
                        state.journal.open()
                    state.pending = Pending()
                    db_.before_close(_JOURNAL, lambda: _close_journal(db_, state))
                    db_.state[SINK_KEY] = _Sink(db_, state)
        except BaseException:
            if self._owns:
                self._database.close()
            raise
        # Stores on one Database share this: they are one writer of one file.
        self._state: _StoreState = state

    # -- plumbing -------------------------------------------------------------------

    @property
    def db(self) -> Database:
        """The database this store writes to (storage-internal: code outside
        ``thinkray.storage`` goes through the protocols).

        Raises:
            DatabaseClosedError: the store is closed.
        """
        db = self._open()
        state = self._state
        if state.batch or state.pending:
            with db.lock:  # whoever reads the file sees all it holds, in order
                if state.batch:
                    _append_batch(state, ending=False)
                _fold_pending(db, state)
        return db

    @contextmanager
    def counting(self) -> Iterator[StatementCount]:
        """:meth:`Database.counting` without folding the journal first (``db.counting()``
        would fold before counting begins): folds made while the block runs count."""
        with self._open().counting() as count:
            yield count

    def _open(self) -> Database:
        """The database, without folding the journal (for what memory answers).

        Raises:
            DatabaseClosedError: the store is closed.
        """
        if self._closed:
            raise DatabaseClosedError("session store is closed")
        return self._database

    @override
    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One transaction on the database, covering the :meth:`stores` too; joins
        one that is open. (The journal is folded into it only if a write in it needs
        the file: see :meth:`db`.)"""
        with self._open().transaction():
            yield

    @override
    def batch(self) -> AbstractContextManager[None]:
        """Writes inside become durable together when the block ends: one journal
        append when the journal takes them, else one transaction. Joins an open batch
        or transaction. A write inside that needs the file appends what the batch
        wrote before it first (the order holds; the block is then two appends)."""
        sink = self._open().state.get(SINK_KEY)
        if isinstance(sink, _Sink):
            return sink.batch()
        return self.transaction()

    @override
    @contextmanager
    def defer_syncs(self) -> Iterator[None]:
        """Journal appends inside are written but not synced: call
        :meth:`sync_deferred` (from any thread) before relying on them. Nests; a no-op
        where the store does not journal (its writes commit, durable, as they go)."""
        state = self._state
        state.deferring += 1
        try:
            yield
        finally:
            state.deferring -= 1

    @override
    def sync_deferred(self) -> None:
        """Make durable every write a :meth:`defer_syncs` block left unsynced before
        this call (one ``fdatasync``; none when nothing is owed). Thread-safe: an agent
        host calls it in a worker thread while its event loop goes on."""
        state = self._state
        journal = state.journal
        if journal is None or not state.owed:
            return
        state.owed = False  # a write after this point is owed again: the next call syncs it
        try:
            journal.sync()
        except BaseException:
            state.owed = True
            raise

    @override
    def stores(self) -> DuckDBStores:
        """The other stores of this database (one object, made on first use)."""
        db = self._open()  # they never read this store's tables
        if self._stores is None:
            self._stores = DuckDBStores(db)
        return self._stores

    @contextmanager
    def _tx(self, *, keep_cache: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """A transaction (joins one that is open). Unless ``keep_cache`` (reads, and
        the writes that update the cache themselves), what is cached is forgotten."""
        db = self.db
        if not keep_cache:
            self._forget()
        with db.transaction() as con:
            yield con

    # -- the cache ------------------------------------------------------------------

    def _forget(self) -> None:
        _forget_state(self._state)

    def _check_epoch(self) -> None:
        """Forget everything after a rollback: a write the cache recorded may not have
        landed."""
        if self._state.epoch != self._database.rollbacks:
            self._forget()
            self._state.epoch = self._database.rollbacks

    def _cached(self, session_id: str) -> _Cached | None:
        """The session's cache entry, if any (see :meth:`_check_epoch`)."""
        self._check_epoch()
        entry = self._state.cache.get(session_id)
        if entry is not None:
            self._state.cache.move_to_end(session_id)
            entry.used_at = time.monotonic()
        return entry

    def _remember(self, row: Sequence[Any]) -> _Cached:
        """Cache a ``sessions`` row just read (keeping a known history only if the head
        is the same)."""
        self._check_epoch()
        entry = self._state.cache.get(row[0])
        if entry is None or entry.row[5] != row[5]:
            entry = _Cached(list(row))
        else:
            entry.row = list(row)
        cache = self._state.cache
        cache[row[0]] = entry
        cache.move_to_end(row[0])
        entry.used_at = now = time.monotonic()
        while len(cache) > _CACHED_SESSIONS:
            oldest = next(iter(cache.values()))
            if (
                len(cache) <= _CACHED_SESSIONS_IN_USE
                and now - oldest.used_at < _CACHE_IN_USE_S
                and sum(len(e.path) for e in cache.values() if e.path) <= _CACHED_MESSAGES
            ):
                break  # every entry left is in use (the oldest was used last the longest ago)
            cache.popitem(last=False)
        return entry

    def _session_row(self, con: duckdb.DuckDBPyConnection, session_id: str) -> _Cached:
        """The session's cache entry, reading its row if needed; raises if the session
        does not exist."""
        entry = self._cached(session_id)
        if entry is not None:
            return entry
        row = con.execute(
            f"SELECT {_SESSION_COLS} FROM sessions WHERE id = ?", [session_id]
        ).fetchone()
        if row is None:
            raise SessionNotFoundError(f"session {session_id!r} not found")
        return self._remember(row)

    # -- the journal ----------------------------------------------------------------

    def _can_journal(self) -> bool:
        """Whether a write may go to the journal: it is on, and no transaction is open
        (a write inside one must commit with the rest of it, in DuckDB)."""
        return (
            self._state.pending is not None
            and not self._closed
            and not self._database.in_transaction
        )

    def _message_exists(self, message_id: str) -> bool | None:
        """Whether a message with this id exists anywhere in the file or the journal,
        from memory (None: too many ids to keep; ask the file). Call under the lock."""
        state = self._state
        if state.pending is not None and message_id in state.pending.messages:
            return True
        ids = state.ids
        if ids is None:
            if state.too_many_ids:
                return None
            rows = self._database.con.execute(
                f"SELECT id FROM messages LIMIT {_MAX_IDS + 1}"
            ).fetchall()
            if len(rows) > _MAX_IDS:
                state.too_many_ids = True  # not read again until something forgets
                return None
            ids = state.ids = {mid for (mid,) in rows}
            if state.pending is not None:
                ids.update(state.pending.messages)
        return message_id in ids

    def _journal_write(self, record: dict[str, Any], *, sync: bool = True) -> None:
        _journal_write(self._database, self._state, record, sync=sync)

    def _fold_if_big(self) -> None:
        state = self._state
        pending, journal = state.pending, state.journal
        if pending is None or journal is None or state.batch is not None:
            return
        # Progress flushes do not count: a streaming turn writes one every 30 ms, and
        # they mostly rewrite the same rows (the journal's size still bounds them).
        if pending.records - pending.progress < _FOLD_RECORDS and journal.size < _FOLD_BYTES:
            return
        try:
            _fold_pending(self._database, state)
        except Exception:  # noqa: BLE001 - durable in the journal; the next read folds
            _log.warning("folding the journal of %s failed", self._database.path, exc_info=True)

    def _journal_message(
        self,
        session_id: str,
        mid: str,
        role: str,
        envelope: bytes,
        part_rows: list[tuple[Any, ...]],
        parent_id: Any,
    ) -> bool | None:
        """:meth:`append_message` through the journal when memory can tell its parent
        and that its id is new (None: it cannot; take the file's path)."""
        with self._database.lock:
            entry = self._cached(session_id)
            if entry is None:
                return None
            if entry.path is None and not self._state.pending:
                # The history is not known (a turn's first append after a wake): read
                # it now, so the turn's next read (its model's context) is answered
                # from memory instead of folding this append into DuckDB first. (With
                # records pending, that read folds anyway: nothing to save.)
                self._walk(session_id, None, False, rows=False, build=False)
                entry = self._cached(session_id)
                if entry is None:
                    return None
            parent: str | None = None
            if parent_id is HEAD:
                parent = entry.row[5]
                if parent is None and entry.path != []:
                    return None  # the latest visible message: the file knows it
            elif parent_id is not None:
                if parent_id not in entry.pos:
                    return None
                parent = parent_id
            exists = self._message_exists(mid)
            if exists is None:
                return None
            if exists:
                return False  # the first write wins, wherever it landed
            now = self._now()
            record: dict[str, Any] = {
                "m": [[mid, session_id, parent, role, self._next_seq(), now, envelope]],
                "s": [[session_id, now, mid, True, None]],
            }
            if part_rows:
                record["p"] = [[session_id, *row] for row in part_rows]
            self._journal_write(record)
            entry.extend(parent, mid, envelope, _parts_of(part_rows)[0])
            entry.row[5], entry.row[7] = mid, now
            assert self._state.ids is not None
            self._state.ids.add(mid)
        self._fold_if_big()
        return True

    def _journal_flush(self, batch: _FlushBatch) -> bool:
        """:meth:`flush_stream` through the journal when memory can check the batch
        (as ``_flush_known`` does); False: it cannot, nothing was written."""
        state = self._state
        with self._database.lock:
            entry = self._cached(batch.sid)
            if entry is None or entry.path is None:
                return False
            checked = self._journal_check(entry, batch)
            if checked is None:
                return False
            new, parent = checked
            generations = state.generations
            if generations is None and (batch.chunk_rows or batch.prune is not None):
                assert state.pending is not None
                if state.pending.chunks or state.pending.doomed:
                    return False  # forgotten after a rollback: the file must answer
                generations = self._known_generations(self._database.con)
            now = self._now()
            record, generations = self._flush_record(batch, entry, new, parent, now, generations)
            self._journal_write(record, sync=batch.durable)
            envelope = batch.envelope
            if new is not None:
                assert envelope is not None and state.ids is not None
                entry.extend(parent, new, envelope[2], _part_blobs.EMPTY)
                state.ids.add(new)
            elif envelope is not None:
                entry.envelopes[entry.pos[envelope[0]]] = envelope[2]
            if generations is not None:
                state.generations = generations
            session = record.get("s")
            self._flushed(batch, new, now, batch.touches, session[0][4] if session else None)
        self._fold_if_big()
        return True

    def _journal_check(
        self, entry: _Cached, batch: _FlushBatch
    ) -> tuple[str | None, str | None] | None:
        """``(new message id, its parent)`` when the cache can check the batch (every
        message it names on the cached history, a new one's parent known and its id
        new); None when it cannot."""
        known = _cached_target(entry, batch)
        if known is None:
            return None
        new, parent = known
        if new is not None and self._message_exists(new) is not False:
            return None  # it exists elsewhere: the file's check says where
        return new, parent

    def _flush_record(
        self,
        batch: _FlushBatch,
        entry: _Cached,
        new: str | None,
        parent: str | None,
        now: float,
        generations: list[str] | None,
    ) -> tuple[dict[str, Any], list[str] | None]:
        """The journal record of a checked flush, and the chunk log's generations after
        it (a copy; None: unchanged)."""
        state = self._state
        sid, envelope = batch.sid, batch.envelope
        record: dict[str, Any] = {}
        if new is not None:
            assert envelope is not None
            record["m"] = [[new, sid, parent, envelope[1], self._next_seq(), now, envelope[2]]]
        elif envelope is not None:
            record["u"] = [list(envelope)]
        if batch.target is not None and batch.target != new:
            record["t"] = [[batch.target, batch.parts_length]]
        if batch.part_rows:
            record["p"] = [[sid, *row] for row in batch.part_rows]
        if batch.chunk_rows:
            first = state.chunk_seq + 1
            state.chunk_seq += len(batch.chunk_rows)
            rows = batch.chunk_rows
            record["c"] = [[*row[:4], seq, row[4]] for seq, row in enumerate(rows, first)]
            assert generations is not None
            generations = list(generations)
            seen = set(generations)
            generations += [g for g in dict.fromkeys(row[0] for row in rows) if g not in seen]
        if batch.prune is not None:
            assert generations is not None
            doomed = _doomed_generations(generations, batch.prune)
            if doomed:
                record["x"] = doomed
                gone = set(doomed)
                generations = [g for g in generations if g not in gone]
        info_blob: bytes | None = None
        if batch.usage:
            info = _session_info(entry.row)
            for usage in batch.usage:
                _add_usage(info, usage)
            info_blob = _info_blob(info)
        if batch.touches or info_blob is not None:
            record["s"] = [[sid, now, new, new is not None, info_blob]]
        return record, generations

    def _now(self) -> float:
        # Strictly increasing, so "most recently updated first" is a total order even
        # when two writes land within the clock's resolution.
        now = time.time()
        if now <= self._state.last_ts:
            now = self._state.last_ts + 1e-6
        self._state.last_ts = now
        return now

    def _next_seq(self) -> int:
        self._state.seq += 1
        return self._state.seq

    @staticmethod
    def _head(con: duckdb.DuckDBPyConnection, session_id: str) -> str | None:
        """The session's head; raises if the session does not exist."""
        row = con.execute("SELECT head_id FROM sessions WHERE id = ?", [session_id]).fetchone()
        if row is None:
            raise SessionNotFoundError(f"session {session_id!r} not found")
        return row[0]

    @classmethod
    def _lookup(
        cls, con: duckdb.DuckDBPyConnection, session_id: str, ids: Iterable[Any]
    ) -> tuple[str | None, dict[str, str]]:
        """The session's head and ``message id -> session id`` for those of ``ids``
        that exist, in one statement; raises if the session does not exist."""
        wanted = [i for i in dict.fromkeys(ids) if isinstance(i, str)]
        if not wanted:
            return cls._head(con, session_id), {}
        rows = con.execute(
            "SELECT s.head_id, m.id, m.session_id FROM sessions s LEFT JOIN "
            f"(SELECT id, session_id FROM messages WHERE id IN {_IDS}) m ON true "
            "WHERE s.id = ?",
            [wanted, session_id],
        ).fetchall()
        if not rows:
            raise SessionNotFoundError(f"session {session_id!r} not found")
        return rows[0][0], {mid: owner for _, mid, owner in rows if mid is not None}

    @staticmethod
    def _latest(
        con: duckdb.DuckDBPyConnection, session_id: str, include_hidden: bool = False
    ) -> str | None:
        """The most recent message of the session (visible only, unless asked)."""
        visible = "" if include_hidden else " AND hidden_at IS NULL"
        row = con.execute(
            f"SELECT id FROM messages WHERE session_id = ?{visible} ORDER BY seq DESC LIMIT 1",
            [session_id],
        ).fetchone()
        return row[0] if row else None

    def _resolve_parent(
        self,
        con: duckdb.DuckDBPyConnection,
        session_id: str,
        parent_id: Any,
        head_id: str | None,
        owners: dict[str, str],
    ) -> str | None:
        if parent_id is HEAD:
            # HEAD means "the leaf history walks from": the head, else the latest
            # visible message, else nothing (a new root).
            return head_id if head_id is not None else self._latest(con, session_id)
        if parent_id is None:
            return None
        if owners.get(parent_id) != session_id:
            raise MessageNotFoundError(
                f"parent message {parent_id!r} not found in session {session_id!r}"
            )
        return parent_id

    def _insert_message(
        self,
        con: duckdb.DuckDBPyConnection,
        session_id: str,
        mid: str,
        role: str,
        envelope: bytes,
        parent: str | None,
        part_rows: list[tuple[Any, ...]],
        now: float,
    ) -> None:
        blob, compaction = _parts_of(part_rows)
        con.execute(
            "INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?, ?)",
            [mid, session_id, parent, role, self._next_seq(), now, envelope, blob, compaction],
        )
        if self._state.ids is not None:
            self._state.ids.add(mid)

    def _insert_new(
        self,
        con: duckdb.DuckDBPyConnection,
        session_id: str,
        mid: str,
        role: str,
        envelope: bytes,
        parent: str | None,
        now: float,
        part_rows: Sequence[tuple[Any, ...]] = (),
    ) -> bool:
        """Insert a message row unless ``mid`` exists (in any session); False if it
        did, and then nothing was written."""
        blob, compaction = _parts_of(part_rows)
        row = con.execute(
            _INSERT_NEW_MESSAGE,
            [
                mid,
                session_id,
                parent,
                role,
                self._state.seq + 1,
                now,
                envelope,
                blob,
                compaction,
                mid,
            ],
        ).fetchone()
        if not row or not row[0]:
            return False
        self._next_seq()
        if self._state.ids is not None:
            self._state.ids.add(mid)
        return True

    @staticmethod
    def _touch(
        con: duckdb.DuckDBPyConnection, session_id: str, now: float, head: Any = HEAD
    ) -> None:
        if head is HEAD:
            con.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", [now, session_id])
        else:
            con.execute(
                "UPDATE sessions SET updated_at = ?, head_id = ? WHERE id = ?",
                [now, head, session_id],
            )

    @staticmethod
    def _load_tree(
        con: duckdb.DuckDBPyConnection, session_id: str, rows: bool, *, parts: bool = False
    ) -> _Tree:
        extra = ", role, seq, created_at" if rows else ""
        blobs = ", parts" if parts else ""
        cur = con.execute(
            f"SELECT id, parent_id, hidden_at, envelope{extra}{blobs} FROM messages "
            "WHERE session_id = ?",
            [session_id],
        )
        cols = _columns(cur, (7 if rows else 4) + (1 if parts else 0))
        return _Tree(cols, cols.pop() if parts else None)

    # -- sessions -------------------------------------------------------------------

    @override
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
        if not isinstance(name, str):
            raise InvalidInputError("session name must be a string")
        _check_session_id(session_id)
        _check_dict(metadata, "metadata")
        _check_dict(model, "model")
        _check_str(parent_session_id, "parent_session_id", optional=True)
        _check_str(parent_message_id, "parent_message_id", optional=True)
        if thread_key is not None:
            _check_thread_key(thread_key)
        sid = session_id or uuid.uuid4().hex

        def new_row() -> tuple[SessionInfo, list[Any]]:
            now = self._now()
            info = SessionInfo(
                id=sid,
                name=name,
                created_at=now,
                updated_at=now,
                parent_session_id=parent_session_id,
                parent_message_id=parent_message_id,
                thread_key=thread_key,
                metadata=dict(metadata or {}),
                model=model,
            )
            row = [sid, name, parent_session_id, parent_message_id, thread_key, None, now, now]
            return info, [*row, _info_blob(info)]

        with self._open().lock:
            if self._state.no_sessions and self._can_journal():
                # A new agent's first session: nothing to clash with, and through the
                # journal its first turn commits nothing to DuckDB.
                self._state.no_sessions = False
                info, row = new_row()
                self._journal_write({"S": [row]})
                self._remember(row).set_path([], [], [])
                return info
        # A new row changes no other session, message or chunk: the cache stays.
        with self._tx(keep_cache=True) as con:
            # The first session of a file written straight to DuckDB: nothing to read.
            known_empty, self._state.no_sessions = self._state.no_sessions, False
            info, row = new_row()
            if (
                not known_empty
                and con.execute("SELECT 1 FROM sessions WHERE id = ?", [sid]).fetchone()
            ):
                raise InvalidInputError(f"session {sid!r} already exists")
            if (
                not known_empty
                and thread_key is not None
                and self._thread_id(con, thread_key) is not None
            ):
                raise ThreadExistsError(f"thread {thread_key!r} already exists")
            con.execute(
                f"INSERT INTO sessions ({_SESSION_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                row,
            )
            # A new session's history is known (empty): its first turn reads nothing.
            self._remember(row).set_path([], [], [])
        return info

    @override
    def get_session(self, session_id: str) -> SessionInfo:
        self._open()  # closed: DatabaseClosedError
        entry = self._cached(session_id)
        if entry is None:
            row = self.db.fetchone(
                f"SELECT {_SESSION_COLS} FROM sessions WHERE id = ?", [session_id]
            )
            if row is None:
                raise SessionNotFoundError(f"session {session_id!r} not found")
            entry = self._remember(row)
        return _session_info(entry.row)

    @override
    def has_session(self, session_id: str) -> bool:
        self._open()
        if self._cached(session_id) is not None:
            return True
        return self.db.fetchone("SELECT 1 FROM sessions WHERE id = ?", [session_id]) is not None

    @override
    def list_sessions(
        self, *, parent_session_id: str | None = None, include_ephemeral: bool = False
    ) -> list[SessionInfo]:
        sql = f"SELECT {_SESSION_COLS} FROM sessions"
        params: list[Any] = []
        if parent_session_id is not None:
            sql += " WHERE parent_session_id = ?"
            params.append(parent_session_id)
        sql += " ORDER BY updated_at DESC, created_at DESC, id"
        infos = [_session_info(row) for row in self.db.fetchall(sql, params)]
        if include_ephemeral:
            return infos
        return [info for info in infos if not info.ephemeral]

    @override
    def rename_session(self, session_id: str, name: str) -> None:
        if not isinstance(name, str):
            raise InvalidInputError("session name must be a string")
        with self._tx() as con:
            self._head(con, session_id)
            con.execute(
                "UPDATE sessions SET name = ?, updated_at = ? WHERE id = ?",
                [name, self._now(), session_id],
            )

    def _rewrite_info(self, session_id: str, change: Any) -> SessionInfo:
        """Read-modify-write of ``sessions.info`` in one transaction (the read is the
        cached row when there is one)."""
        with self._tx(keep_cache=True) as con:
            entry = self._session_row(con, session_id)
            info = _session_info(entry.row)
            change(info)
            blob = _info_blob(info)
            info.updated_at = self._now()
            con.execute(
                "UPDATE sessions SET info = ?, updated_at = ? WHERE id = ?",
                [blob, info.updated_at, session_id],
            )
            entry.row[7], entry.row[8] = info.updated_at, blob
        return info

    @override
    def update_session(
        self,
        session_id: str,
        *,
        metadata: dict[str, Any] | None = None,
        model: dict[str, Any] | None = None,
        permissions: dict[str, Any] | None = None,
        settings: dict[str, Any] | None = None,
    ) -> SessionInfo:
        _check_dict(metadata, "metadata")
        _check_dict(model, "model")
        _check_dict(permissions, "permissions")
        _check_dict(settings, "settings")

        def change(info: SessionInfo) -> None:
            if metadata is not None:
                info.metadata = {**info.metadata, **metadata}
            if model is not None:
                info.model = model
            if permissions is not None:
                info.permissions = permissions
            if settings is not None:
                info.settings = settings

        return self._rewrite_info(session_id, change)

    @override
    def add_usage(self, session_id: str, usage: dict[str, Any]) -> SessionInfo:
        _check_usage(usage)
        return self._rewrite_info(session_id, lambda info: _add_usage(info, usage))

    @override
    def set_usage(self, session_id: str, rollup: dict[str, Any]) -> SessionInfo:
        _check_dict(rollup, "rollup", optional=False)
        unknown = set(rollup) - _ROLLUP_KEYS
        if unknown:
            raise InvalidInputError(f"unknown rollup keys {sorted(unknown)}")
        for key in USAGE_KEYS:
            if key in rollup:
                _check_index(rollup[key], f"rollup[{key!r}]")
        cost = rollup.get("cost_usd")
        if cost is not None and (isinstance(cost, bool) or not isinstance(cost, int | float)):
            raise InvalidInputError(f"rollup['cost_usd'] must be a number, got {cost!r}")
        new = empty_rollup()
        new.update(rollup)
        if "total_tokens" not in rollup:
            new["total_tokens"] = sum(new[k] for k in _STEP_TO_ROLLUP.values())

        def change(info: SessionInfo) -> None:
            info.usage = new
            info.context_tokens = None  # no last call: the rollups' sum is the context

        return self._rewrite_info(session_id, change)

    @override
    def delete_session(self, session_id: str) -> None:
        with self._tx() as con:
            self._head(con, session_id)
            _search.forget_session(self.db, con, session_id)
            con.execute("DELETE FROM messages WHERE session_id = ?", [session_id])
            con.execute("DELETE FROM sessions WHERE id = ?", [session_id])
            con.execute("DELETE FROM config WHERE key = ?", [_rewind_key(session_id)])

    @override
    def clear_messages(self, session_id: str) -> None:
        with self._tx() as con:
            row = con.execute(
                f"SELECT {_SESSION_COLS} FROM sessions WHERE id = ?", [session_id]
            ).fetchone()
            if row is None:
                raise SessionNotFoundError(f"session {session_id!r} not found")
            info = _session_info(row)
            info.usage = empty_rollup()
            info.context_tokens = None
            _search.forget_session(self.db, con, session_id)
            con.execute("DELETE FROM messages WHERE session_id = ?", [session_id])
            con.execute("DELETE FROM config WHERE key = ?", [_rewind_key(session_id)])
            con.execute(
                "UPDATE sessions SET head_id = NULL, info = ?, updated_at = ? WHERE id = ?",
                [_info_blob(info), self._now(), session_id],
            )

    # -- messages -------------------------------------------------------------------

    @override
    def append_message(
        self, session_id: str, message: Message, *, parent_id: str | None = HEAD
    ) -> bool:
        mid, role, envelope, part_rows = _message(message)
        _check_parent(parent_id)
        if self._can_journal():
            done = self._journal_message(session_id, mid, role, envelope, part_rows, parent_id)
            if done is not None:
                return done
        with self._tx(keep_cache=True) as con:
            entry = self._cached(session_id)
            parent: str | None
            if entry is not None and (
                (parent_id is HEAD and entry.row[5] is not None)
                or parent_id is None
                or parent_id in entry.pos
            ):
                # The parent is known: the insert is the duplicate check too.
                parent = entry.row[5] if parent_id is HEAD else parent_id
                now = self._now()
                if not self._insert_new(
                    con, session_id, mid, role, envelope, parent, now, part_rows
                ):
                    return False  # the first write wins, wherever it landed
            else:
                head, owners = self._lookup(con, session_id, [mid, parent_id])
                if mid in owners:
                    return False  # the first write wins, wherever it landed
                parent = self._resolve_parent(con, session_id, parent_id, head, owners)
                now = self._now()
                self._insert_message(con, session_id, mid, role, envelope, parent, part_rows, now)
            _search.index_parts(self.db, con, part_rows)
            self._touch(con, session_id, now, head=mid)
            entry = self._cached(session_id)
            if entry is not None:
                entry.extend(parent, mid, envelope, _parts_of(part_rows)[0])
                entry.row[5], entry.row[7] = mid, now
        return True

    @override
    def insert_before(self, session_id: str, message: Message, child_id: str) -> bool:
        mid, role, envelope, part_rows = _message(message)
        _check_str(child_id, "child_id")
        with _no_gc(), self._tx() as con:
            _, owners = self._lookup(con, session_id, [mid, child_id])
            if mid in owners:
                return False  # the first write wins, wherever it landed
            if owners.get(child_id) != session_id:
                raise MessageNotFoundError(
                    f"message {child_id!r} not found in session {session_id!r}"
                )
            rows = con.execute(
                "SELECT id, parent_id, seq FROM messages WHERE session_id = ?", [session_id]
            ).fetchall()
            parent_of = {r[0]: r[1] for r in rows}
            below: dict[str | None, list[str]] = {}
            for rid, parent in parent_of.items():
                below.setdefault(parent, []).append(rid)
            # ``seq`` grows along every path (branch copies and unrewind rely on it):
            # the child and everything under it are renumbered after the new message.
            subtree, todo = [], [child_id]
            while todo:
                node = todo.pop()
                subtree.append(node)
                todo.extend(below.get(node, ()))
            seq_of = {r[0]: r[2] for r in rows}
            subtree.sort(key=seq_of.__getitem__)
            now = self._now()
            parent = parent_of[child_id]
            self._insert_message(con, session_id, mid, role, envelope, parent, part_rows, now)
            _search.index_parts(self.db, con, part_rows)
            first = self._state.seq + 1
            self._state.seq += len(subtree)
            con.execute(
                "UPDATE messages SET parent_id = ? WHERE session_id = ? AND id = ?",
                [mid, session_id, child_id],
            )
            con.execute(
                "UPDATE messages SET seq = d.seq FROM (SELECT unnest(?::VARCHAR[]) AS id, "
                "unnest(?::BIGINT[]) AS seq) d WHERE messages.session_id = ? "
                "AND messages.id = d.id",
                [subtree, list(range(first, first + len(subtree))), session_id],
            )
            self._touch(con, session_id, now)  # the head stays where it was
        return True

    def append_messages(
        self, session_id: str, messages: Sequence[Message], *, parent_id: str | None = HEAD
    ) -> int:
        """Bulk import (not part of the protocol): append ``messages`` as a chain, each
        the child of the previous, the first attached at ``parent_id``; the head moves
        to the last. All or nothing: if any id already exists, raises
        :class:`InvalidInputError` and writes nothing. Returns the number appended.
        A constant number of statements, whatever the count (a branch copied into a
        new actor, an imported transcript)."""
        checked = [_message(m) for m in messages]
        _check_parent(parent_id)
        ids = [c[0] for c in checked]
        if len(set(ids)) != len(ids):
            raise InvalidInputError("duplicate message ids in the batch")
        if not checked:
            self.get_session(session_id)
            return 0
        with self._tx() as con:
            head, owners = self._lookup(con, session_id, [*ids, parent_id])
            clash = [mid for mid in ids if mid in owners]
            if clash:
                raise InvalidInputError(f"messages already exist: {clash[:5]!r}")
            parent = self._resolve_parent(con, session_id, parent_id, head, owners)
            now = self._now()
            rows = []
            part_rows: list[tuple[Any, ...]] = []
            for mid, role, envelope, parts in checked:
                blob, compaction = _parts_of(parts)
                seq = self._next_seq()
                rows.append((mid, session_id, parent, role, seq, now, envelope, blob, compaction))
                part_rows.extend(parts)
                parent = mid
            con.execute(
                "INSERT INTO messages SELECT unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), "
                "unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::BIGINT[]), "
                "unnest(?::DOUBLE[]), NULL, unnest(?::BLOB[]), unnest(?::BLOB[]), "
                "unnest(?::BOOLEAN[])",
                _as_columns(rows, 9),
            )
            if part_rows:
                _search.index_parts(self.db, con, part_rows)
            self._touch(con, session_id, now, head=ids[-1])
        return len(ids)

    @override
    def upsert_message(
        self, session_id: str, message: Message, *, parent_id: str | None = HEAD
    ) -> None:
        mid, role, envelope, part_rows = _message(message)
        _check_parent(parent_id)
        with self._tx() as con:
            head, owners = self._lookup(con, session_id, [mid, parent_id])
            now = self._now()
            if mid in owners:
                if owners[mid] != session_id:
                    raise InvalidInputError(
                        f"message {mid!r} belongs to session {owners[mid]!r}, not {session_id!r}"
                    )
                # Replacing keeps the message where it is in the tree and the head alone.
                blob, compaction = _parts_of(part_rows)
                con.execute(
                    "UPDATE messages SET role = ?, envelope = ?, parts = ?, compaction = ? "
                    "WHERE id = ?",
                    [role, envelope, blob, compaction, mid],
                )
                _search.forget_messages(self.db, con, [mid])
                _search.index_parts(self.db, con, part_rows)
                self._touch(con, session_id, now)
                return
            parent = self._resolve_parent(con, session_id, parent_id, head, owners)
            self._insert_message(con, session_id, mid, role, envelope, parent, part_rows, now)
            _search.index_parts(self.db, con, part_rows)
            self._touch(con, session_id, now, head=mid)

    @override
    def flush_stream(self, flush: StreamFlush) -> None:
        batch = _FlushBatch.check(flush)  # a bad batch raises before anything is written
        if self._can_journal() and self._journal_flush(batch):
            return
        sid = batch.sid
        with self._tx(keep_cache=True) as con:
            now = self._now()
            known, inserted = self._flush_known(con, batch, now)
            if not known:
                inserted = self._flush_lookup(con, batch, now)
            self._write_flush_parts(con, batch, inserted)
            if batch.part_rows:
                _search.index_parts(self.db, con, batch.part_rows)
            if batch.chunk_rows:
                self._write_chunks(con, batch.chunk_rows)
            info_blob: bytes | None = None
            if batch.usage:
                entry = self._session_row(con, sid)
                info = _session_info(entry.row)
                for usage in batch.usage:
                    _add_usage(info, usage)
                info_blob = _info_blob(info)
            touched = batch.touches
            if touched or info_blob is not None:
                head: Any = inserted if inserted else HEAD
                if info_blob is None:
                    self._touch(con, sid, now, head=head)
                elif head is HEAD:
                    con.execute(
                        "UPDATE sessions SET updated_at = ?, info = ? WHERE id = ?",
                        [now, info_blob, sid],
                    )
                else:
                    con.execute(
                        "UPDATE sessions SET updated_at = ?, head_id = ?, info = ? WHERE id = ?",
                        [now, head, info_blob, sid],
                    )
            if batch.prune is not None:
                self._prune_chunks(con, batch.prune)
            self._flushed(batch, inserted, now, touched, info_blob)

    def _flush_known(
        self, con: duckdb.DuckDBPyConnection, batch: _FlushBatch, now: float
    ) -> tuple[bool, str | None]:
        """Check and insert the batch's message from the cache alone: every message it
        names on the cached history, the new one's parent known. Returns whether the
        cache could tell (if not, nothing was written) and the inserted message id
        (None: nothing inserted)."""
        entry = self._cached(batch.sid)
        if entry is None or entry.path is None:
            return False, None
        known = _cached_target(entry, batch)
        if known is None:
            return False, None
        new, parent = known
        pos = entry.pos
        if new is not None:
            _, role, blob = batch.envelope  # type: ignore[misc]
            if not self._insert_new(con, batch.sid, new, role, blob, parent, now):
                return False, None  # it exists elsewhere: the full check says where
            entry.extend(parent, new, blob, _part_blobs.EMPTY)
        elif batch.envelope is not None:
            mid, role, blob = batch.envelope
            con.execute(
                "UPDATE messages SET role = ?, envelope = ? WHERE id = ?", [role, blob, mid]
            )
            entry.envelopes[pos[mid]] = blob
        return True, new

    def _flush_lookup(
        self, con: duckdb.DuckDBPyConnection, batch: _FlushBatch, now: float
    ) -> str | None:
        """Check the batch's messages against the file and insert or update its
        message; returns the inserted id (None if none). The session's cached history
        is forgotten."""
        sid, envelope, target = batch.sid, batch.envelope, batch.target
        wanted: list[str | None] = list(batch.named)
        wanted += [envelope[0] if envelope else None, batch.parent_id]
        head, owners = self._lookup(con, sid, wanted)
        entry = self._cached(sid)
        if entry is not None:
            entry.forget_path()
        # Check every message the batch names before writing anything.
        inserted: str | None = None
        if envelope is not None:
            owner = owners.get(envelope[0])
            if owner is None:
                inserted = envelope[0]
            elif owner != sid:
                raise InvalidInputError(f"message {envelope[0]!r} belongs to session {owner!r}")
        for mid in batch.named | ({target} if target else set()):
            if mid != inserted and owners.get(mid) != sid:
                raise MessageNotFoundError(f"message {mid!r} not found in session {sid!r}")
        if envelope is not None:
            mid, role, blob = envelope
            if inserted is not None:
                if batch.parent_id is not None:
                    parent = self._resolve_parent(con, sid, batch.parent_id, head, owners)
                elif batch.use_head:
                    parent = self._resolve_parent(con, sid, HEAD, head, owners)
                else:
                    parent = None
                self._insert_message(con, sid, mid, role, blob, parent, [], now)
            else:
                con.execute(
                    "UPDATE messages SET role = ?, envelope = ? WHERE id = ?", [role, blob, mid]
                )
        return inserted

    def _write_flush_parts(
        self, con: duckdb.DuckDBPyConnection, batch: _FlushBatch, inserted: str | None
    ) -> None:
        """Write the parts blobs of the messages a flush cuts or writes parts of: the
        cached blob (or the file's) spliced as :meth:`_Cached.write_parts` does."""
        writes = _part_edits(batch)
        if not writes:
            return
        entry = self._cached(batch.sid)
        known: dict[str, bytes | None] = {}
        for mid in writes:
            if mid == inserted:
                known[mid] = _part_blobs.EMPTY
            elif entry is not None and entry.path is not None and mid in entry.pos:
                known[mid] = entry.parts[entry.pos[mid]]
        missing = [mid for mid in writes if mid not in known]
        if missing:
            known.update(
                con.execute(
                    f"SELECT id, parts FROM messages WHERE id IN {_IDS}", [missing]
                ).fetchall()
            )
        _update_part_blobs(
            con,
            {
                mid: _part_blobs.splice(
                    known.get(mid), batch.parts_length if mid == batch.target else None, edits
                )
                for mid, edits in writes.items()
            },
        )

    def _flushed(
        self,
        batch: _FlushBatch,
        inserted: str | None,
        now: float,
        touched: Any,
        info_blob: bytes | None,
    ) -> None:
        """Record a flush's writes in the session's cache entry."""
        entry = self._cached(batch.sid)
        if entry is None:
            return
        if entry.path is not None:
            for mid, slot_writes in _part_edits(batch).items():
                length = batch.parts_length if mid == batch.target else None
                entry.write_parts(mid, length, slot_writes)
        if inserted:
            entry.row[5] = inserted
        if touched or info_blob is not None:
            entry.row[7] = now
        if info_blob is not None:
            entry.row[8] = info_blob

    @override
    def get_message(self, message_id: str) -> Message | None:
        row = self.get_message_row(message_id)
        return row.message if row is not None else None

    @override
    def message_session(self, message_id: str) -> str | None:
        _check_str(message_id, "message id")
        state = self._state
        if state.pending is not None and not self._closed:
            # Every turn asks this of its user message (is it a resend?): the journal
            # and the ids in memory answer it without a statement.
            with self._database.lock:
                if state.pending is not None:
                    sid = state.pending.session_of(message_id)
                    if sid is not None:
                        return sid
                    if self._message_exists(message_id) is False:
                        return None
        # One statement, no transaction around it (BEGIN/COMMIT would double its cost).
        row = self.db.fetchone("SELECT session_id FROM messages WHERE id = ?", [message_id])
        return None if row is None else str(row[0])

    @override
    def get_message_row(self, message_id: str) -> MessageRow | None:
        with self._tx() as con:
            row = con.execute(
                "SELECT id, session_id, parent_id, role, seq, created_at, hidden_at, envelope, "
                "parts FROM messages WHERE id = ?",
                [message_id],
            ).fetchone()
            if row is None:
                return None
        # The id column is the truth: a copy's envelope still names its source.
        [message] = _build_messages([row[0]], [row[7]], [row[8]])
        return MessageRow(
            id=row[0],
            session_id=row[1],
            parent_id=row[2],
            role=row[3],
            seq=row[4],
            created_at=row[5],
            hidden_at=row[6],
            message=message,
        )

    def _walk(
        self,
        session_id: str,
        leaf_id: str | None,
        include_hidden: bool,
        rows: bool,
        *,
        build: bool = True,
    ) -> tuple[_Tree, list[int], list[Message]]:
        """Load the session, walk from the leaf, and build the messages on the path
        (``build`` False: only remember the history, and return no messages)."""
        if leaf_id is not None:
            _check_str(leaf_id, "leaf_id")
        with _no_gc(), self._tx(keep_cache=True) as con:
            entry = self._session_row(con, session_id)
            head = entry.row[5]
            tree = self._load_tree(con, session_id, rows, parts=True)
            if leaf_id is not None:
                leaf = tree.pos.get(leaf_id)
                if leaf is None:
                    raise MessageNotFoundError(
                        f"message {leaf_id!r} not found in session {session_id!r}"
                    )
            else:
                leaf = tree.pos.get(head) if head is not None else None
                if leaf is None:  # no head (or a dangling one): the latest shown message
                    latest = self._latest(con, session_id, include_hidden)
                    leaf = tree.pos.get(latest) if latest is not None else None
            path = tree.path(leaf)
            hidden = tree.hidden
            if not include_hidden and hidden.count(None) != len(hidden):
                path = [i for i in path if hidden[i] is None]
            if not path:
                if leaf_id is None and not include_hidden and head is None and not tree.ids:
                    entry.set_path([], [], [])  # known empty: the first turn needs no read
                return tree, path, []
            pos: dict[str, int] | None = None
            if len(path) == len(tree.ids) and tree.is_chain_to(leaf):  # all of it, as read
                ids, envelopes, part_blobs, pos = tree.ids, tree.envelopes, tree.parts, tree.pos
            else:
                ids = [tree.ids[i] for i in path]
                envelopes = [tree.envelopes[i] for i in path]
                part_blobs = [tree.parts[i] for i in path]
            messages = _build_messages(ids, envelopes, part_blobs) if build else []
            if leaf_id is None and not include_hidden and head is not None and head in tree.pos:
                entry.set_path(ids, envelopes, part_blobs, pos)
        return tree, path, messages

    @override
    def get_history(
        self, session_id: str, *, leaf_id: str | None = None, include_hidden: bool = False
    ) -> list[Message]:
        if leaf_id is None and not include_hidden:
            if self._closed:
                raise DatabaseClosedError("session store is closed")
            entry = self._cached(session_id)
            if entry is not None and entry.path is not None:
                with _no_gc():
                    return _build_messages(entry.path, entry.envelopes, entry.parts)
        return self._walk(session_id, leaf_id, include_hidden, rows=False)[2]

    @override
    def get_path(self, session_id: str, *, leaf_id: str | None = None) -> list[MessageRow]:
        tree, path, messages = self._walk(session_id, leaf_id, True, rows=True)
        return [
            MessageRow(
                id=tree.ids[i],
                session_id=session_id,
                parent_id=tree.parents[i],
                role=tree.roles[i],
                seq=tree.seqs[i],
                created_at=tree.created[i],
                hidden_at=tree.hidden[i],
                message=message,
            )
            for i, message in zip(path, messages, strict=True)
        ]

    @override
    def message_count(self, session_id: str, *, include_hidden: bool = False) -> int:
        hidden = "" if include_hidden else " AND hidden_at IS NULL"
        row = self.db.fetchone(
            "SELECT (SELECT count(*) FROM sessions WHERE id = ?), "
            f"(SELECT count(*) FROM messages WHERE session_id = ?{hidden})",
            [session_id, session_id],
        )
        assert row is not None
        if not row[0]:
            raise SessionNotFoundError(f"session {session_id!r} not found")
        return int(row[1])

    @override
    def children(self, message_id: str) -> list[Message]:
        with self._tx(keep_cache=True) as con:
            if not con.execute("SELECT 1 FROM messages WHERE id = ?", [message_id]).fetchone():
                raise MessageNotFoundError(f"message {message_id!r} not found")
            rows = con.execute(
                "SELECT id, envelope, parts FROM messages WHERE parent_id = ? ORDER BY seq",
                [message_id],
            ).fetchall()
        return _build_messages([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])

    @override
    def set_head(self, session_id: str, message_id: str | None) -> None:
        _check_str(message_id, "message_id", optional=True)
        with self._tx() as con:
            _, owners = self._lookup(con, session_id, [message_id])
            if message_id is not None and owners.get(message_id) != session_id:
                raise MessageNotFoundError(
                    f"message {message_id!r} not found in session {session_id!r}"
                )
            self._touch(con, session_id, self._now(), head=message_id)

    @override
    def delete_messages(self, session_id: str, message_ids: list[str]) -> None:
        """Delete messages and their parts. Unknown ids are ignored (deleting twice is a
        no-op). The children of a deleted message move up to its nearest surviving
        ancestor, so deleting from the middle of a branch keeps the rest reachable; a
        deleted head moves the same way."""
        ids = _check_ids(message_ids, "message_ids")
        with self._tx() as con:
            head = self._head(con, session_id)
            rows = con.execute(
                "SELECT id, parent_id FROM messages WHERE session_id = ?", [session_id]
            ).fetchall()
            parent_of = dict(rows)
            doomed = {mid for mid in ids if mid in parent_of}
            if not doomed:
                return

            def survivor(mid: str | None) -> str | None:
                while mid is not None and mid in doomed:
                    mid = parent_of.get(mid)
                return mid

            moves = [(mid, survivor(parent_of[mid])) for mid in doomed]
            doomed_list = list(doomed)
            con.execute(
                "UPDATE messages SET parent_id = d.np FROM (SELECT unnest(?::VARCHAR[]) AS old, "
                "unnest(?::VARCHAR[]) AS np) d WHERE messages.parent_id = d.old "
                "AND messages.session_id = ?",
                [*_as_columns(moves, 2), session_id],
            )
            _search.forget_messages(self.db, con, doomed_list)
            con.execute(
                f"DELETE FROM messages WHERE session_id = ? AND id IN {_IDS}",
                [session_id, doomed_list],
            )
            new_head = survivor(head) if head in doomed else HEAD
            self._touch(con, session_id, self._now(), head=new_head)

    @override
    def set_hidden(self, session_id: str, message_ids: list[str], hidden_at: float | None) -> None:
        ids = list(dict.fromkeys(_check_ids(message_ids, "message_ids")))
        if hidden_at is not None and (
            isinstance(hidden_at, bool) or not isinstance(hidden_at, int | float)
        ):
            raise InvalidInputError(f"hidden_at must be a timestamp or None, got {hidden_at!r}")
        with self._tx() as con:
            _, owners = self._lookup(con, session_id, ids)
            if not ids:
                return
            missing = [mid for mid in ids if owners.get(mid) != session_id]
            if missing:
                raise MessageNotFoundError(
                    f"messages {missing!r} not found in session {session_id!r}"
                )
            con.execute(
                f"UPDATE messages SET hidden_at = ? WHERE session_id = ? AND id IN {_IDS}",
                [None if hidden_at is None else float(hidden_at), session_id, ids],
            )
            self._touch(con, session_id, self._now())

    # -- threads (seed 001) ---------------------------------------------------------

    @staticmethod
    def _thread_id(con: duckdb.DuckDBPyConnection, key: str) -> str | None:
        row = con.execute(
            "SELECT id FROM sessions WHERE thread_key = ? ORDER BY created_at LIMIT 1", [key]
        ).fetchone()
        return row[0] if row else None

    @override
    def thread(self, key: str | None = None) -> Thread:
        key = DEFAULT_THREAD_KEY if key is None else key
        _check_thread_key(key)
        with self._tx() as con:
            sid = self._thread_id(con, key)
            if sid is None:
                sid = self.create_session(key, thread_key=key).id
        return Thread(self, key, sid)

    @override
    def get_thread(self, key: str) -> Thread:
        _check_thread_key(key)
        with self._tx() as con:
            sid = self._thread_id(con, key)
        if sid is None:
            raise ThreadNotFoundError(f"thread {key!r} not found")
        return Thread(self, key, sid)

    @override
    def list_threads(self) -> list[SessionInfo]:
        rows = self.db.fetchall(
            f"SELECT {_SESSION_COLS} FROM sessions WHERE thread_key IS NOT NULL "
            "ORDER BY updated_at DESC, created_at DESC, id"
        )
        return [_session_info(row) for row in rows]

    @override
    def delete_thread(self, key: str) -> None:
        _check_thread_key(key)
        with self._tx() as con:
            sid = self._thread_id(con, key)
            if sid is None:
                raise ThreadNotFoundError(f"thread {key!r} not found")
            self.delete_session(sid)

    @override
    def clone_thread(
        self, src_key: str, dst_key: str, from_message_id: str | None = None
    ) -> Thread:
        _check_thread_key(src_key, "source thread key")
        _check_thread_key(dst_key, "destination thread key")
        _check_str(from_message_id, "from_message_id", optional=True)
        with _no_gc(), self._tx() as con:
            src = self._thread_id(con, src_key)
            if src is None:
                raise ThreadNotFoundError(f"thread {src_key!r} not found")
            if self._thread_id(con, dst_key) is not None:
                raise ThreadExistsError(
                    f"thread {dst_key!r} already exists; clone never overwrites"
                )
            info = self._fork(con, src, from_message_id, name=dst_key, thread_key=dst_key)
        return Thread(self, dst_key, info.id)

    @override
    def get_effective_settings(self, session_id: str) -> dict[str, Any]:
        own = self.get_session(session_id).settings
        default = self.get_config(DEFAULT_SETTINGS_KEY) or {}
        if not isinstance(default, dict):
            default = {}
        return _deep_merge(default, own)

    # -- branch and rewind (seed 002) -------------------------------------------------

    @override
    def branch_session(
        self,
        parent_session_id: str,
        from_message_id: str,
        *,
        metadata: dict[str, Any] | None = None,
        name: str | None = None,
    ) -> SessionInfo:
        _check_str(parent_session_id, "parent_session_id")
        _check_str(from_message_id, "from_message_id")
        _check_dict(metadata, "metadata")
        if name is not None and not isinstance(name, str):
            raise InvalidInputError("session name must be a string")
        if metadata:
            _pack(metadata, "metadata")
        with _no_gc(), self._tx() as con:
            return self._fork(con, parent_session_id, from_message_id, name=name, metadata=metadata)

    def _current_path(
        self, con: duckdb.DuckDBPyConnection, session_id: str, *, for_copy: bool = False
    ) -> tuple[str | None, _Tree, list[int]]:
        """The head, the session's tree and the positions root -> head, hidden ones
        included. Raises if the session does not exist. The tree has roles, or, for a
        copy, seqs and the envelopes of assistant messages (what a rollup reads)."""
        head = self._head(con, session_id)
        if for_copy:
            cur = con.execute(
                "SELECT id, parent_id, hidden_at, "
                "CASE WHEN role = 'assistant' THEN envelope END, seq "
                "FROM messages WHERE session_id = ?",
                [session_id],
            )
            ids_, parents, hidden, envelopes, seqs = _columns(cur, 5)
            tree = _Tree([ids_, parents, hidden, envelopes, [], seqs])
        else:
            cur = con.execute(
                "SELECT id, parent_id, hidden_at, NULL::BLOB, role FROM messages "
                "WHERE session_id = ?",
                [session_id],
            )
            tree = _Tree(_columns(cur, 5))
        leaf = tree.pos.get(head) if head is not None else None
        if leaf is None:  # as get_history: no head means the latest visible message
            latest = self._latest(con, session_id)
            leaf = tree.pos.get(latest) if latest is not None else None
        return head, tree, tree.path(leaf)

    @staticmethod
    def _on_path(tree: _Tree, path: list[int], session_id: str, message_id: str) -> int:
        """The index on ``path`` of ``message_id``; a clear error if it is not there."""
        pos = tree.pos.get(message_id)
        if pos is None:
            raise MessageNotFoundError(
                f"message {message_id!r} not found in session {session_id!r}"
            )
        try:
            return path.index(pos)
        except ValueError:
            raise NotOnPathError(
                f"message {message_id!r} is not on the current path of session "
                f"{session_id!r} (it is on another branch of the conversation)"
            ) from None

    def _fork(
        self,
        con: duckdb.DuckDBPyConnection,
        src: str,
        from_message_id: str | None,
        *,
        name: str | None,
        metadata: dict[str, Any] | None = None,
        thread_key: str | None = None,
    ) -> SessionInfo:
        """Copy ``src``'s visible path up to ``from_message_id`` (default: the head)
        into a new session. Everything is checked before the first write."""
        row = con.execute(f"SELECT {_SESSION_COLS} FROM sessions WHERE id = ?", [src]).fetchone()
        if row is None:
            raise SessionNotFoundError(f"session {src!r} not found")
        parent = _session_info(row)
        _, tree, path = self._current_path(con, src, for_copy=True)
        hidden = tree.hidden
        if from_message_id is None:
            chosen = [i for i in path if hidden[i] is None]
        else:
            k = self._on_path(tree, path, src, from_message_id)
            if hidden[path[k]] is not None:
                raise NotOnPathError(
                    f"message {from_message_id!r} is hidden (rewound or summarized by a "
                    "compaction): only a visible message can be a fork point"
                )
            chosen = [i for i in path[: k + 1] if hidden[i] is None]
        ids, envelopes = tree.ids, tree.envelopes
        # Only assistant envelopes were loaded; only those naming a usage are decoded.
        with_usage = [e for i in chosen if (e := envelopes[i]) is not None and b"usage" in e]
        usage = _rollup_of(_unpack_many(with_usage))
        now = self._now()
        sid = uuid.uuid4().hex
        salt = f"c{uuid.uuid4().hex[:12]}_"
        count = len(chosen)
        info = SessionInfo(
            id=sid,
            name=parent.name if name is None else name,
            created_at=now,
            updated_at=now,
            parent_session_id=src,
            parent_message_id=ids[chosen[-1]] if chosen else None,
            thread_key=thread_key,
            head_id=salt + ids[chosen[-1]] if count else None,
            metadata={**parent.metadata, **(metadata or {})},
            model=parent.model,
            usage=usage,
            settings=parent.settings,
            # A copy of the whole visible path carries what the parent's next request
            # would; a copy cut earlier has no last call of its own (the sum stands in).
            context_tokens=parent.context_tokens if count and chosen[-1] == path[-1] else None,
        )
        con.execute(
            f"INSERT INTO sessions ({_SESSION_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                sid,
                info.name,
                src,
                info.parent_message_id,
                thread_key,
                info.head_id,
                now,
                now,
                _info_blob(info),
            ],
        )
        if count:
            seqs, hidden = tree.seqs, tree.hidden
            fork_seq = seqs[chosen[-1]]
            in_range = sum(
                1 for h, q in zip(hidden, seqs, strict=True) if h is None and q <= fork_seq
            )
            params: dict[str, Any] = {"salt": salt, "sid": sid, "src": src}
            if in_range == count:
                rows, extra = _COPY_BY_RANGE, {"fork": fork_seq}
            else:
                rows, extra = _COPY_BY_LIST, {"old": [ids[i] for i in chosen]}
            base = self._state.seq
            self._state.seq += count
            con.execute(_COPY_MESSAGES.format(rows=rows), {**params, **extra, "base": base})
            _search.copy_session(self.db, con, sid, salt)
        return info

    def _compaction_covers(
        self, con: duckdb.DuckDBPyConnection, session_id: str, tree: _Tree, path: list[int]
    ) -> dict[int, set[int]]:
        """``position of a compaction message on the path -> positions it summarized``.

        A compaction is a message with a ``data-compaction`` part. What it covers, in
        order of preference: ``data.covers`` as a list of message ids, or as a range
        ``{first_id, last_id}`` on the path (``from_id``/``to_id`` also read), narrowed
        to the messages hidden at ``data.hidden_at`` when the compaction records it;
        else the hidden messages on the path before ``data.tail_start_id``; else the
        hidden messages on the path before the compaction message.
        """
        rows = con.execute(
            "SELECT id, parts FROM messages WHERE session_id = ? AND compaction", [session_id]
        ).fetchall()
        if not rows:
            return {}
        index = {pos: n for n, pos in enumerate(path)}
        hidden, pos_of = tree.hidden, tree.pos
        out: dict[int, set[int]] = {}
        for mid, part in _part_blobs.compaction_parts(rows):
            cpos = pos_of.get(mid)
            if cpos is None or cpos not in index:
                continue
            data = part.get("data")
            data = data if isinstance(data, dict) else {}
            covers = data.get("covers")
            covered: set[int] = set()
            if isinstance(covers, list | tuple):
                covered = {pos_of[c] for c in covers if isinstance(c, str) and c in pos_of}
            elif isinstance(covers, dict):
                first = next((covers[k] for k in _COVERS_FROM if k in covers), None)
                last = next((covers[k] for k in _COVERS_TO if k in covers), None)
                a = index.get(pos_of.get(first)) if isinstance(first, str) else None  # type: ignore[arg-type]
                b = index.get(pos_of.get(last)) if isinstance(last, str) else None  # type: ignore[arg-type]
                if a is not None and b is not None:
                    covered = set(path[min(a, b) : max(a, b) + 1])
            stamp = data.get("hidden_at")
            if covered and isinstance(stamp, int | float) and not isinstance(stamp, bool):
                # The compaction says when it hid them: a message of its range hidden at
                # another time (by an earlier compaction) is not its to give back.
                covered = {i for i in covered if hidden[i] is None or hidden[i] == stamp}
            if not covered:
                tail = data.get("tail_start_id")
                end = index.get(pos_of.get(tail)) if isinstance(tail, str) else None  # type: ignore[arg-type]
                if end is None or end > index[cpos]:
                    end = index[cpos]
                covered = {i for i in path[:end] if hidden[i] is not None}
            out.setdefault(cpos, set()).update(covered)
        return out

    def _rewind_log(self, con: duckdb.DuckDBPyConnection, session_id: str) -> list[dict[str, Any]]:
        row = con.execute(
            "SELECT value FROM config WHERE key = ?", [_rewind_key(session_id)]
        ).fetchone()
        return list(_unpack(row[0])) if row else []

    @staticmethod
    def _save_rewind_log(
        con: duckdb.DuckDBPyConnection, session_id: str, log: list[dict[str, Any]]
    ) -> None:
        key = _rewind_key(session_id)
        con.execute("DELETE FROM config WHERE key = ?", [key])
        if log:
            blob = _pack(log[-_REWIND_LOG_LIMIT:], "rewind log")
            con.execute("INSERT INTO config VALUES (?, ?)", [key, blob])

    @override
    def rewind_session(
        self, session_id: str, message_id: str, *, include_target: bool = False
    ) -> RewindInfo:
        _check_str(session_id, "session_id")
        _check_str(message_id, "message_id")
        with _no_gc(), self._tx() as con:
            head, tree, path = self._current_path(con, session_id)
            t = self._on_path(tree, path, session_id, message_id)
            pos = path[t]
            if tree.roles[pos] != "user":
                raise NotOnPathError(
                    f"rewind needs a user message; {message_id!r} is a {tree.roles[pos]} "
                    "message (the user message is the only deterministic checkpoint)"
                )
            cut = t if include_target else t + 1
            before, after = path[:cut], set(path[cut:])
            restorable: set[int] = set()
            kept: set[int] = set()
            for cpos, covered in self._compaction_covers(con, session_id, tree, path).items():
                (restorable if cpos in after else kept).update(covered)
            restorable -= kept
            hidden, ids = tree.hidden, tree.ids
            if hidden[pos] is not None and pos not in restorable:
                raise NotOnPathError(
                    f"message {message_id!r} is hidden and no compaction after it "
                    "summarized it; rewind to a visible user message"
                )
            unhide = [i for i in before if hidden[i] is not None and i in restorable]
            hide = [ids[i] for i in path[cut:] if hidden[i] is None]
            now = self._now()
            new_head = ids[before[-1]] if before else None
            groups: dict[float, list[str]] = {}
            for i in unhide:
                groups.setdefault(hidden[i], []).append(ids[i])
            if hide:
                con.execute(
                    f"UPDATE messages SET hidden_at = ? WHERE session_id = ? AND id IN {_IDS}",
                    [now, session_id, hide],
                )
            if unhide:
                con.execute(
                    f"UPDATE messages SET hidden_at = NULL WHERE session_id = ? AND id IN {_IDS}",
                    [session_id, [ids[i] for i in unhide]],
                )
            log = self._rewind_log(con, session_id)
            log.append(
                {
                    "target": message_id,
                    "include_target": bool(include_target),
                    "head": head,
                    "hidden_at": now,
                    "seq": self._state.seq,
                    "unhidden": [[ts, mids] for ts, mids in groups.items()],
                }
            )
            self._save_rewind_log(con, session_id, log)
            self._touch(con, session_id, now, head=new_head)
            target = self.get_message_row(message_id)
        assert target is not None
        return RewindInfo(
            session_id=session_id,
            target=target,
            hidden_ids=hide,
            unhidden_ids=[ids[i] for i in unhide],
            head_before=head,
            head_id=new_head,
            hidden_at=now,
            include_target=bool(include_target),
        )

    @override
    def unrewind_session(self, session_id: str) -> UnrewindInfo:
        _check_str(session_id, "session_id")
        with _no_gc(), self._tx() as con:
            self._head(con, session_id)
            log = self._rewind_log(con, session_id)
            if not log:
                raise InvalidInputError(f"session {session_id!r} has no rewind to undo")
            record = log[-1]
            stamp, old_head = record["hidden_at"], record["head"]
            tree = self._load_tree(con, session_id, rows=False)
            hidden, ids = tree.hidden, tree.ids
            if old_head is not None and old_head not in tree.pos:
                raise InvalidInputError(
                    f"cannot unrewind session {session_id!r}: the message it was at "
                    f"({old_head!r}) was deleted since"
                )
            restored = tree.path(tree.pos.get(old_head)) if old_head is not None else []
            late = [ids[i] for i in restored if hidden[i] is not None and hidden[i] > stamp]
            if late:
                raise InvalidInputError(
                    f"cannot unrewind session {session_id!r}: {len(late)} message(s) of the "
                    "restored conversation were hidden after the rewind (compacted since); "
                    "branch from the rewound point instead"
                )
            unhidden = [
                mid
                for (mid,) in con.execute(
                    "SELECT id FROM messages WHERE session_id = ? AND hidden_at = ? ORDER BY seq",
                    [session_id, stamp],
                ).fetchall()
            ]
            detached = [
                mid
                for (mid,) in con.execute(
                    "SELECT id FROM messages WHERE session_id = ? AND seq > ? ORDER BY seq",
                    [session_id, record["seq"]],
                ).fetchall()
            ]
            con.execute(
                "UPDATE messages SET hidden_at = NULL WHERE session_id = ? AND hidden_at = ?",
                [session_id, stamp],
            )
            rehidden: list[str] = []
            for ts, mids in record.get("unhidden") or []:
                present = [m for m in mids if m in tree.pos and hidden[tree.pos[m]] is None]
                if present:
                    con.execute(
                        f"UPDATE messages SET hidden_at = ? WHERE session_id = ? AND id IN {_IDS}",
                        [ts, session_id, present],
                    )
                    rehidden.extend(present)
            self._save_rewind_log(con, session_id, log[:-1])
            self._touch(con, session_id, self._now(), head=old_head)
        return UnrewindInfo(
            session_id=session_id,
            head_id=old_head,
            unhidden_ids=unhidden,
            rehidden_ids=rehidden,
            detached_ids=detached,
        )

    # -- chunk log ------------------------------------------------------------------

    def _write_chunks(self, con: duckdb.DuckDBPyConnection, rows: list[tuple[Any, ...]]) -> None:
        generations = self._known_generations(con)
        first = self._state.chunk_seq + 1
        self._state.chunk_seq += len(rows)
        rows = [(*row[:4], seq, row[4]) for seq, row in enumerate(rows, first)]
        _insert_rows(con, "chunks", _INSERT_CHUNKS, rows)
        seen = set(generations)
        for generation in dict.fromkeys(row[0] for row in rows):
            if generation not in seen:
                generations.append(generation)

    def _known_generations(self, con: duckdb.DuckDBPyConnection) -> list[str]:
        """The chunk log's generations, oldest first (read once, then kept)."""
        self._check_epoch()
        if self._state.generations is None:
            self._state.generations = _generations(con.execute(_GENERATION_ROWS).fetchall())[0]
        return self._state.generations

    def _prune_chunks(self, con: duckdb.DuckDBPyConnection, prune: ChunkPrune) -> None:
        doomed = _doomed_generations(self._known_generations(con), prune)
        if doomed:
            self._delete_generations(con, doomed)

    def _delete_generations(self, con: duckdb.DuckDBPyConnection, ids: list[str]) -> None:
        con.execute(f"DELETE FROM chunks WHERE generation_id IN {_IDS}", [ids])
        if self._state.generations is not None:
            gone = set(ids)
            self._state.generations = [g for g in self._state.generations if g not in gone]

    @override
    def get_chunks(self, generation_id: str, start: int = 0) -> list[dict[str, Any]]:
        _check_index(start, "start")
        rows = self.db.fetchall(
            "SELECT idx, n, payload FROM chunks WHERE generation_id = ? "
            "AND idx + coalesce(n, 1) > ? ORDER BY idx, seq",
            [generation_id, start],
        )
        out: list[dict[str, Any]] = []
        values = _unpack_many([_inflate(p) for *_, p in rows])
        for (first, n, _), value in zip(rows, values, strict=True):
            if n is None:
                if first >= start:
                    out.append(value)
            else:
                out.extend(value[max(start - first, 0) :])
        return out

    @override
    def delete_chunks(self, generation_ids: list[str]) -> None:
        ids = _check_ids(generation_ids, "generation_ids")
        if ids:
            with self._tx(keep_cache=True) as con:
                self._delete_generations(con, ids)

    @override
    def chunk_generations(self) -> list[str]:
        # Answered from memory once known (the journal's flushes keep it current), so
        # checking a caller's run id does not fold the journal into DuckDB every turn.
        if self._closed:
            raise DatabaseClosedError("session store is closed")
        self._check_epoch()
        known = self._state.generations
        if known is not None:
            return list(known)
        with self._tx(keep_cache=True) as con:
            return list(self._known_generations(con))

    @override
    def open_generations(self) -> list[str]:
        if self._open().fresh:
            return []
        db = self.db  # folds what the journal holds first
        with db.lock:
            self._check_epoch()
            every, unfinished = _generations(db.fetchall(_GENERATION_ROWS))
            if not db.in_transaction:  # what a transaction read may still roll back
                self._state.generations = every  # the run-id check needs no read now
        return unfinished

    # -- search ---------------------------------------------------------------------

    @override
    def search_messages(
        self, query: str, *, limit: int = 10, session_id: str | None = None
    ) -> list[SearchHit]:
        checked = _search.Query.check(query, limit, session_id)
        if session_id is not None:
            self.get_session(session_id)  # unknown: SessionNotFoundError
        return _search.search(self.db, checked)

    # -- config ---------------------------------------------------------------------

    @override
    def get_config(self, key: str, default: Any = None) -> Any:
        if self._open().fresh:
            return default
        row = self.db.fetchone("SELECT value FROM config WHERE key = ?", [key])
        return default if row is None else _unpack(row[0])

    @override
    def set_config(self, key: str, value: Any) -> None:
        _check_config_key(key)
        blob = _pack(value, f"config {key!r}")
        with self._open().lock:
            if self._can_journal():  # folded before any read of the file (see db)
                self._journal_write({"g": [[key, blob]]})
                return
        with self._tx(keep_cache=True) as con:  # config is not cached
            con.execute("DELETE FROM config WHERE key = ?", [key])
            con.execute("INSERT INTO config VALUES (?, ?)", [key, blob])

    @override
    def delete_config(self, key: str) -> None:
        _check_config_key(key)
        self.db.execute("DELETE FROM config WHERE key = ?", [key])

    # -- lifecycle ------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    def checkpoint(self) -> None:
        """Fold the write-ahead log into the database file (DuckDB's ``CHECKPOINT``):
        the file alone then holds every commit (what shipping the whole file needs)."""
        self.db.execute("CHECKPOINT")

    @override
    def close(self) -> None:
        """Idempotent. Closes (checkpointing) the database only if this store opened it."""
        if self._closed:
            return
        self._closed = True
        if self._owns:
            self._database.close()

    def __enter__(self) -> DuckDBSessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
