"""What the session store journaled and has not yet written to DuckDB, and the fold
that writes it (issue 23: a turn's writes cost a journal append, not a dozen
statements).

A *record* is what one store call wrote, as rows (see :class:`Pending.add` for its
keys). :class:`Pending` merges records in order into the state the file must end up
in: new messages with their last envelope, the last payload of each part slot, how
far stored messages' parts are cut (a cut comes before the slots written after it),
chunk rows, pruned generations,
each session's last ``updated_at``/head/info, and the last state of each tool call
the ledger moved (the ``tool_calls`` rows of :mod:`~thinkray.storage.tool_calls`,
which journals through the session store's :class:`JournalSink`). The live store and
a replay at open run the same merge over the same records, so both fold the same rows.
A *frame* is one record, or a batch (``{"b": [records]}``, what one
:meth:`JournalSink.batch` wrote: durable together); :func:`records_of` flattens them.

:func:`fold` writes that state in one transaction with a constant number of
statements (one per kind of row, whatever the number of turns), and records the last
folded record's ``n`` in ``config`` in the same transaction: a replay after a crash
between the fold's commit and the journal's truncation skips what was folded.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import duckdb
from thinkray.storage import part_blobs
from thinkray.storage import search as _search
from thinkray.storage.codec import pack, unpack
from thinkray.storage.db import Database

# ``config`` row holding the ``n`` of the last folded journal record.
FOLDED_KEY = "sessions.journal_folded"

_UPDATE_ENVELOPES = (
    "UPDATE messages SET role = d.r, envelope = d.e FROM (SELECT unnest(?::VARCHAR[]) AS m, "
    "unnest(?::VARCHAR[]) AS r, unnest(?::BLOB[]) AS e) d WHERE messages.id = d.m"
)
_INSERT_MESSAGES = (
    "INSERT INTO messages SELECT unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), "
    "unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::BIGINT[]), unnest(?::DOUBLE[]), "
    "unnest(?::DOUBLE[]), unnest(?::BLOB[]), unnest(?::BLOB[]), unnest(?::BOOLEAN[])"
)
_UPDATE_PARTS = (
    "UPDATE messages SET parts = d.p, compaction = d.c FROM (SELECT unnest(?::VARCHAR[]) AS m, "
    "unnest(?::BLOB[]) AS p, unnest(?::BOOLEAN[]) AS c) d WHERE messages.id = d.m"
)
_UPDATE_ONE_PART_BLOB = "UPDATE messages SET parts = ?, compaction = ? WHERE id = ?"
_INSERT_SESSIONS = (
    "INSERT INTO sessions SELECT unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), "
    "unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), "
    "unnest(?::DOUBLE[]), unnest(?::DOUBLE[]), unnest(?::BLOB[])"
)
_DELETE_CONFIG = "DELETE FROM config WHERE key IN (SELECT unnest(?::VARCHAR[]))"
_INSERT_CONFIG = "INSERT INTO config SELECT unnest(?::VARCHAR[]), unnest(?::BLOB[])"
_DELETE_GENERATIONS = "DELETE FROM chunks WHERE generation_id IN (SELECT unnest(?::VARCHAR[]))"
_INSERT_CHUNKS = (
    "INSERT INTO chunks SELECT unnest(?::VARCHAR[]), unnest(?::INTEGER[]), "
    "unnest(?::BLOB[]), unnest(?::BOOLEAN[]), unnest(?::BIGINT[]), unnest(?::INTEGER[])"
)
_UPDATE_SESSIONS = (
    "UPDATE sessions SET updated_at = d.u, "
    "head_id = CASE WHEN d.sh THEN d.h ELSE sessions.head_id END, "
    "info = coalesce(d.i, sessions.info) FROM (SELECT unnest(?::VARCHAR[]) AS id, "
    "unnest(?::DOUBLE[]) AS u, unnest(?::VARCHAR[]) AS h, unnest(?::BOOLEAN[]) AS sh, "
    "unnest(?::BLOB[]) AS i) d WHERE sessions.id = d.id"
)


_DELETE_TOOL_CALLS = "DELETE FROM tool_calls WHERE id IN (SELECT unnest(?::VARCHAR[]))"
_INSERT_TOOL_CALLS = (
    "INSERT INTO tool_calls SELECT unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), "
    "unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), "
    "unnest(?::DOUBLE[]), unnest(?::BLOB[]), unnest(?::DOUBLE[])"
)
# Where a Database's state holds its JournalSink (when its session store journals).
SINK_KEY = "journal"


class JournalSink(Protocol):
    """The session store's journal, as the other stores of its file use it (the
    tool-call ledger's rows). Called under the database's lock, from one writer.

    Contract: :meth:`write` is durable when it returns (one append), unless a
    :meth:`batch` is open: then the batch's records become durable together, in one
    append, when it ends, and are dropped if it raises. Either way the record is
    visible to :meth:`tool_call_row` at once. :meth:`settle` folds everything
    journaled into DuckDB (a batch's records so far are appended first, so order is
    kept): call it before reading the file."""

    def writable(self) -> bool:
        """Whether a write may go to the journal now (no DuckDB transaction is open)."""
        ...

    def write(self, record: dict[str, Any]) -> None:
        """Journal ``record`` (keys as :meth:`Pending.add`; ``n`` is set here)."""
        ...

    def batch(self) -> AbstractContextManager[None]:
        """Writes inside become durable together when the block ends (nested: joins)."""
        ...

    def tool_call_row(self, tool_call_id: str) -> list[Any] | None:
        """The call's last journaled row not folded yet (None: the file has the truth)."""
        ...

    def has_tool_calls(self) -> bool:
        """Whether tool-call rows wait to be folded."""
        ...

    def settle(self) -> None:
        """Fold everything journaled into the file."""
        ...

    @property
    def discards(self) -> int:
        """How many batches were dropped (what a store remembered of them is stale)."""
        ...


def records_of(frames: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The records of journal frames, in order (a batch frame holds several)."""
    for frame in frames:
        batch = frame.get("b")
        if batch is None:
            yield frame
        else:
            yield from batch


# Up to this many rows go in as ``VALUES`` (binding list parameters costs ~0.3 ms more
# than a few scalars); more as ``unnest`` of lists (one bind whatever the count).
VALUES_ROWS = 3


def as_columns(rows: Sequence[Sequence[Any]], width: int) -> list[list[Any]]:
    """``rows`` as one list per column (``width`` empty lists when there are none)."""
    if not rows:
        return [[] for _ in range(width)]
    return [list(column) for column in zip(*rows, strict=True)]


def insert_rows(
    con: duckdb.DuckDBPyConnection, table: str, unnest_sql: str, rows: Sequence[Sequence[Any]]
) -> None:
    """Insert ``rows`` (full rows of ``table``) the cheaper way for their count."""
    if not rows:
        return
    width = len(rows[0])
    if len(rows) <= VALUES_ROWS:
        one = "(" + ", ".join("?" * width) + ")"
        con.execute(
            f"INSERT INTO {table} VALUES " + ", ".join([one] * len(rows)),
            [value for row in rows for value in row],
        )
    else:
        con.execute(unnest_sql, as_columns(rows, width))


@dataclass
class Pending:
    """The merged, not yet folded records (see the module).

    ``folding``: the rows were written inside a transaction that has not ended yet; a
    read in that transaction already sees them, so they must not be written twice.
    """

    messages: dict[str, list[Any]] = field(default_factory=dict)
    updates: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    parts: dict[tuple[str, int], list[Any]] = field(default_factory=dict)
    tails: dict[str, int] = field(default_factory=dict)
    chunks: list[list[Any]] = field(default_factory=list)
    doomed: set[str] = field(default_factory=set)
    sessions: dict[str, list[Any]] = field(default_factory=dict)
    new_sessions: dict[str, list[Any]] = field(default_factory=dict)
    config: dict[str, bytes] = field(default_factory=dict)
    tool_calls: dict[str, list[Any]] = field(default_factory=dict)
    replaced: set[str] = field(default_factory=set)
    records: int = 0
    progress: int = 0  # of ``records``, the progress flushes (see Journal.append's sync)
    last_n: int = 0
    folding: bool = False

    def add(self, record: dict[str, Any]) -> None:
        """Merge one record. Its keys (each optional), applied in this order:

        - ``m``: new messages ``[id, session, parent, role, seq, created_at, envelope]``;
        - ``u``: ``[id, role, envelope]`` of messages written before;
        - ``d``: part slots ``[message, index]`` deleted before their rewrite (written by
          builds that kept parts in a table of their own; the rewrite now replaces the
          slot in the message's blob, so a replay ignores them);
        - ``t``: ``[message, length]``: the message keeps its first ``length`` parts;
        - ``p``: part rows ``[session, message, index, type, state, tool_call_id, payload]``;
        - ``c``: chunk rows ``[generation, index, payload, is_final, seq, n]``;
        - ``x``: chunk generations to delete;
        - ``S``: new ``sessions`` rows (its column order; a new agent's first session);
        - ``s``: ``[session, updated_at, head, sets_head, info or None]``;
        - ``g``: ``config`` rows ``[key, value]`` (the last value of a key wins);
        - ``k``: ``tool_calls`` rows (its column order) and whether the file holds the
          call's row already (then it is deleted before the new one goes in).
        """
        self._add_messages(record)
        for row in record.get("p", ()):
            self.parts[(row[1], row[2])] = list(row)
        self.chunks.extend(list(row) for row in record.get("c", ()))
        doomed = record.get("x")
        if doomed:
            gone = set(doomed)
            self.chunks = [row for row in self.chunks if row[0] not in gone]
            self.doomed |= gone
        for row in record.get("S", ()):
            self.new_sessions[row[0]] = list(row)
        self._add_sessions(record.get("s", ()))
        for key, value in record.get("g", ()):
            self.config[key] = value
        for *row, in_file in record.get("k", ()):
            self.tool_calls[row[0]] = row
            if in_file:
                self.replaced.add(row[0])
        self.records += 1
        self.last_n = record["n"]

    def _add_messages(self, record: dict[str, Any]) -> None:
        """The ``m``, ``u``, ``d`` and ``t`` keys of a record (see :meth:`add`)."""
        for row in record.get("m", ()):
            self.messages[row[0]] = list(row)
        for mid, role, envelope in record.get("u", ()):
            new = self.messages.get(mid)
            if new is not None:
                new[3], new[6] = role, envelope
            else:
                self.updates[mid] = (role, envelope)
        for mid, length in record.get("t", ()):
            for slot in [s for s in self.parts if s[0] == mid and s[1] >= length]:
                del self.parts[slot]
            if mid not in self.messages:
                self.tails[mid] = min(self.tails.get(mid, length), length)

    def _add_sessions(self, rows: Iterable[Sequence[Any]]) -> None:
        for sid, updated_at, head, sets_head, info in rows:
            now = self.sessions.get(sid)
            if now is None:
                self.sessions[sid] = [updated_at, head, sets_head, info]
                continue
            now[0] = updated_at
            if sets_head:
                now[1], now[2] = head, True
            if info is not None:
                now[3] = info

    def __bool__(self) -> bool:
        return self.records > 0

    def session_of(self, message_id: str) -> str | None:
        """The session of a message this buffer holds as new (None if it holds none)."""
        row = self.messages.get(message_id)
        return None if row is None else row[1]


def fold(db: Database, con: duckdb.DuckDBPyConnection, pending: Pending, marked: bool) -> None:
    """Write ``pending`` inside the open transaction ``con`` (a new message's row with its
    parts blob; a stored message's blob read, cut and rewritten once), and mark its
    last record folded (``marked``: the ``config`` row exists already)."""
    if len(pending.updates) == 1:
        [(mid, (role, envelope))] = pending.updates.items()
        con.execute(
            "UPDATE messages SET role = ?, envelope = ? WHERE id = ?", [role, envelope, mid]
        )
    elif pending.updates:
        rows = [(mid, role, envelope) for mid, (role, envelope) in pending.updates.items()]
        con.execute(_UPDATE_ENVELOPES, as_columns(rows, 3))
    writes: dict[str, dict[int, bytes]] = {}
    for _, mid, idx, *_, payload in pending.parts.values():
        writes.setdefault(mid, {})[idx] = payload
    messages = []
    for row in pending.messages.values():
        blob = part_blobs.pack_slots(writes.pop(row[0], {}))
        compaction = True if part_blobs.blob_has_compaction(blob) else None
        messages.append((*row[:6], None, row[6], blob, compaction))
    insert_rows(con, "messages", _INSERT_MESSAGES, messages)
    _splice_stored(con, writes, pending.tails)
    if pending.parts:
        _search.index_parts(db, con, [tuple(row[1:]) for row in pending.parts.values()])
    if pending.doomed:
        con.execute(_DELETE_GENERATIONS, [sorted(pending.doomed)])
    insert_rows(con, "chunks", _INSERT_CHUNKS, pending.chunks)
    insert_rows(con, "sessions", _INSERT_SESSIONS, list(pending.new_sessions.values()))
    _update_sessions(con, pending.sessions)  # the new ones' too: inserted just before
    if pending.config:
        keys = sorted(pending.config)
        con.execute(_DELETE_CONFIG, [keys])
        con.execute(_INSERT_CONFIG, [keys, [pending.config[k] for k in keys]])
    if pending.replaced:
        con.execute(_DELETE_TOOL_CALLS, [sorted(pending.replaced)])
    insert_rows(con, "tool_calls", _INSERT_TOOL_CALLS, list(pending.tool_calls.values()))
    mark = pack(pending.last_n, "journal mark")
    if marked:
        con.execute("UPDATE config SET value = ? WHERE key = ?", [mark, FOLDED_KEY])
    else:
        con.execute("INSERT INTO config VALUES (?, ?)", [FOLDED_KEY, mark])


def _splice_stored(
    con: duckdb.DuckDBPyConnection, writes: dict[str, dict[int, bytes]], tails: dict[str, int]
) -> None:
    """Rewrite the parts blobs of stored messages the records cut (``tails``) or wrote
    parts of (``writes``): one read of those blobs, one update."""
    mids = list(dict.fromkeys([*writes, *tails]))
    if not mids:
        return
    stored = dict(
        con.execute(
            "SELECT id, parts FROM messages WHERE id IN (SELECT unnest(?::VARCHAR[]))", [mids]
        ).fetchall()
    )
    update_part_blobs(
        con,
        {
            mid: part_blobs.splice(stored[mid], tails.get(mid), writes.get(mid, {}))
            for mid in mids
            if mid in stored  # else deleted since (the store checked it when it wrote)
        },
    )


def update_part_blobs(con: duckdb.DuckDBPyConnection, blobs: dict[str, bytes]) -> None:
    """Store messages' new ``parts`` blobs (message id -> blob) with their
    ``compaction`` flags, in one statement."""
    rows = [
        (mid, blob, True if part_blobs.blob_has_compaction(blob) else None)
        for mid, blob in blobs.items()
    ]
    if len(rows) == 1:
        mid, blob, compaction = rows[0]
        con.execute(_UPDATE_ONE_PART_BLOB, [blob, compaction, mid])
    elif rows:
        con.execute(_UPDATE_PARTS, as_columns(rows, 3))


def _update_sessions(con: duckdb.DuckDBPyConnection, sessions: dict[str, list[Any]]) -> None:
    if len(sessions) != 1:
        if sessions:
            rows = [[sid, *state] for sid, state in sessions.items()]
            con.execute(_UPDATE_SESSIONS, as_columns(rows, 5))
        return
    [(sid, (updated_at, head, sets_head, info))] = sessions.items()
    if sets_head:
        con.execute(
            "UPDATE sessions SET updated_at = ?, head_id = ?, info = coalesce(?, info) "
            "WHERE id = ?",
            [updated_at, head, info, sid],
        )
    else:
        con.execute(
            "UPDATE sessions SET updated_at = ?, info = coalesce(?, info) WHERE id = ?",
            [updated_at, info, sid],
        )


def folded_mark(con: duckdb.DuckDBPyConnection) -> int | None:
    """The ``n`` of the last folded record (None: nothing was ever folded)."""
    row = con.execute("SELECT value FROM config WHERE key = ?", [FOLDED_KEY]).fetchone()
    return None if row is None else int(unpack(row[0]))
