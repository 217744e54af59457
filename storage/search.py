"""Full-text search over an agent's stored messages: an inverted index in its own file.

DuckDB's ``fts`` extension is not used: it is not bundled with the ``duckdb`` wheel and
is downloaded at run time (no network here; the extension wheels on PyPI stop at
DuckDB 1.5.5, and an extension loads only into the exact version it was built for),
and its index is rebuilt whole (``PRAGMA create_fts_index``), not kept up as rows land.

Layout (``search`` component, version 1), one table so that indexing a write is one
extra ``INSERT`` in the write's own transaction::

    search_index(doc BIGINT, term UINTEGER, tf INTEGER, len INTEGER,
                 message_id VARCHAR, digest UBIGINT)

- A *document* is one ``text`` part (not while it streams: ``state = 'streaming'``
  parts are rewritten on every flush, and the finished part is written once more
  with ``state = 'done'``). Its own row has ``term`` NULL and names its part:
  ``message_id``, ``tf`` = the part's index, ``len`` = its length in terms, ``digest``
  = the first 64 bits of the md5 of the part's stored payload. Every other row is a
  posting: ``(doc, term, tf, len)`` (the document's length again, so scoring reads
  postings only), the other columns NULL (NULL runs cost next to nothing on disk; a
  20-message agent file must stay small, and each column costs blocks). The session
  is the message's, found through ``messages``.
- ``term`` is the CRC-32 of the normalized term, not the term: scanning 600,000
  integers is ~4x faster than as many strings, and a search re-reads the text of what
  it returns anyway (for the snippet), so a hit that matched only by a hash collision
  is dropped there.
- A posting is never updated or deleted on the write path. A document is live while
  its part is stored unchanged: the search joins its best candidates to their
  messages and keeps those whose part (at ``tf`` in the message's ``parts`` blob, see
  :mod:`~thinkray.storage.part_blobs`) still has the digest and whose message still exists and
  is not hidden by a rewind. So a part rewritten in place, a rewound message or a
  deleted one is never found, whatever path changed it. Deleting sessions or messages
  also deletes their documents (deleted text should leave the file), and the one-off
  backfill drops documents gone stale.
- Messages hidden by a compaction stay searchable (finding what the model's context
  no longer holds is what search is for); messages hidden by a rewind do not.
- Ranking is BM25 (k1 = 1.2, b = 0.75) in one SQL query; corpus statistics cover the
  whole agent, a ``session_id`` filter only restricts the candidates.

Terms: Unicode words (``\\w+``), casefolded, with Latin diacritics removed (NFKD, then
the combining marks dropped: "Café" matches "cafe"); CJK ideographs and kana count one
character per term (those scripts put no spaces between words). Terms over 64
characters (hashes, base64) are not indexed.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
from thinkray.storage import part_blobs
from thinkray.storage.codec import pack, unpack
from thinkray.storage.db import Database, Migration
from thinkray.storage.types import InvalidInputError, SearchHit

COMPONENT = "search"
MAX_QUERY_CHARS = 1000
MAX_QUERY_TERMS = 32
MAX_LIMIT = 100
MAX_TERM_CHARS = 64
SNIPPET_CHARS = 160
K1 = 1.2
B = 0.75
_BACKFILLED_KEY = "search.backfilled"

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_TOKEN = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+")
_ASCII_TOKEN = re.compile(r"\w+", re.ASCII)
_MARKS = re.compile("[\u0300-\u036f]")


def _v1(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(
        "CREATE TABLE IF NOT EXISTS search_index (doc BIGINT, term UINTEGER, tf INTEGER, "
        "len INTEGER, message_id VARCHAR, digest UBIGINT)"
    )


MIGRATIONS: list[Migration] = [Migration(1, _v1)]


@dataclass
class _Pending:
    """A finished text part tokenized at write time, waiting for its batch's INSERT."""

    message_id: str
    idx: int
    length: int
    digest: int
    counts: Counter[int]


@dataclass
class _State:
    """What the search keeps in memory about one file (in ``Database.state``)."""

    next_doc: int | None = None  # None: read max(doc) on next use
    # Whether the file's index holds every committed text part once ``pending`` is
    # written (None: read the file's ``search.backfilled`` flag). False after a crash
    # or a rollback lost pending documents: the next search backfills.
    complete: bool | None = None
    stats: tuple[int, int] | None = None  # documents, their total length (None: read)
    enabled: bool | None = None  # whether the file has the index (None: not checked)
    epoch: int = 0
    # Documents of committed writes not yet in ``search_index`` (see index_parts).
    pending: list[_Pending] = field(default_factory=list)
    pending_postings: int = 0


def _state(db: Database) -> _State:
    state = db.state.get(COMPONENT)
    if state is None:
        state = db.state[COMPONENT] = _State(epoch=db.rollbacks)
    elif state.epoch != db.rollbacks:
        # A rollback may have taken doc ids, pending documents, the flag or the table
        # itself with it: read them again (lost pending documents left the flag False
        # in the file, so the next search backfills them).
        db.state[COMPONENT] = state = _State(epoch=db.rollbacks)
    return state


def _enabled(db: Database) -> _State | None:
    """The index's state if this file has an index (its first search made it), else
    None: the writes of an agent that never searched cost nothing."""
    state = _state(db)
    if state.enabled is None:
        state.enabled = db.has_component(COMPONENT)
        if state.enabled:
            db.migrate(COMPONENT, MIGRATIONS)  # a newer version's steps, if any
    return state if state.enabled else None


def enable(db: Database) -> _State:
    """Make the index (if the file has none yet), write the documents waiting in
    memory, and fill it: see :func:`backfill`."""
    state = _state(db)
    if not state.enabled:
        db.migrate(COMPONENT, MIGRATIONS)
        state.enabled = True
    backfill(db, state)
    return state


# -- terms -----------------------------------------------------------------------------


def _normalize(token: str) -> str:
    token = token.casefold()
    if token.isascii():
        return token
    return _MARKS.sub("", unicodedata.normalize("NFKD", token))


def terms(text: str) -> list[str]:
    """The index terms of ``text``, in order (see the module for the rules)."""
    if text.isascii():
        found = _ASCII_TOKEN.findall(text.lower())
    else:
        found = [_normalize(t) for t in _TOKEN.findall(text)]
    return [t for t in found if len(t) <= MAX_TERM_CHARS and t]


def _term_id(term: str) -> int:
    return zlib.crc32(term.encode())


def _digest(payload: bytes) -> int:
    return int.from_bytes(hashlib.md5(payload, usedforsecurity=False).digest()[:8], "big")


# -- indexing (the write path) --------------------------------------------------------


def _finished_text(payload: bytes) -> bool:
    """Whether a packed part is a ``text`` part that is not streaming (a document)."""
    part = unpack(payload)
    return (
        isinstance(part, dict) and part.get("type") == "text" and part.get("state") != "streaming"
    )


def _text_of(payload: bytes) -> str | None:
    part = unpack(payload)
    text = part.get("text") if isinstance(part, dict) else None
    return text if isinstance(text, str) and text else None


# A write's documents wait in memory and go in together: one INSERT costs ~1 ms here
# however few rows it holds, which was 15-17% of a short turn's CPU with one per
# write (the user's message, then the reply). A batch goes in when it is this big,
# when the file is searched, changed by a delete or a branch, or closed (hibernation). A crash
# loses what waits; the ``search.backfilled`` flag, set False by the write that starts
# a batch (one UPDATE per batch) and True by the INSERT that ends it, tells the next
# search to backfill what is missing.
PENDING_DOCS = 64
PENDING_POSTINGS = 4096


def _tokenized(mid: str, idx: int, payload: bytes) -> _Pending | None:
    text = _text_of(payload)
    if text is None:
        return None
    counts = Counter(map(zlib.crc32, map(str.encode, terms(text))))  # _term_id, inlined
    if not counts:
        return None
    return _Pending(mid, idx, sum(counts.values()), _digest(payload), counts)


def _insert(con: duckdb.DuckDBPyConnection, first_doc: int, docs: Sequence[_Pending]) -> None:
    """One ``INSERT`` of ``docs`` (numbered from ``first_doc``): their postings, then
    their own rows. The rows go in as an Arrow table: bound as SQL parameters (lists,
    or numbers joined into a string and split in SQL) they cost ~2.5 us each to
    convert, 8 ms for a batch of 32 replies against 1.7 ms."""
    import pyarrow as pa  # type: ignore[import-untyped]  # only agents that search load it

    numbers: list[int] = []
    term_ids: list[int | None] = []
    tfs: list[int] = []
    lengths: list[int] = []
    for doc, pending in enumerate(docs, first_doc):
        numbers += [doc] * len(pending.counts)
        lengths += [pending.length] * len(pending.counts)
        term_ids += pending.counts.keys()
        tfs += pending.counts.values()
    postings = len(numbers)
    numbers += range(first_doc, first_doc + len(docs))
    term_ids += [None] * len(docs)
    tfs += [d.idx for d in docs]
    lengths += [d.length for d in docs]
    rows = pa.table(
        {
            "doc": pa.array(numbers, pa.int64()),
            "term": pa.array(term_ids, pa.uint32()),
            "tf": pa.array(tfs, pa.int32()),
            "len": pa.array(lengths, pa.int32()),
            "message_id": pa.array([None] * postings + [d.message_id for d in docs], pa.string()),
            "digest": pa.array([None] * postings + [d.digest for d in docs], pa.uint64()),
        }
    )
    # A result a caller left unfetched (a fetchone of several rows) blocks
    # register (DuckDB 2): finish it first.
    finish = getattr(con, "complete", None)
    if finish is not None:
        finish()
    con.register("_search_rows", rows)
    try:
        con.execute("INSERT INTO search_index SELECT * FROM _search_rows")
    finally:
        con.unregister("_search_rows")


def _next_doc(con: duckdb.DuckDBPyConnection, state: _State) -> int:
    if state.next_doc is None:
        row = con.execute("SELECT coalesce(max(doc), 0) + 1 FROM search_index").fetchone()
        state.next_doc = int(row[0]) if row else 1
    return state.next_doc


def _complete(con: duckdb.DuckDBPyConnection, state: _State) -> bool:
    if state.complete is None:
        row = con.execute("SELECT value FROM config WHERE key = ?", [_BACKFILLED_KEY]).fetchone()
        state.complete = row is not None and unpack(row[0]) is True
    return state.complete


def _set_complete(con: duckdb.DuckDBPyConnection, value: bool) -> None:
    con.execute("DELETE FROM config WHERE key = ?", [_BACKFILLED_KEY])
    con.execute("INSERT INTO config VALUES (?, ?)", [_BACKFILLED_KEY, pack(value)])


def _mark(con: duckdb.DuckDBPyConnection, value: bool) -> None:
    """Set the flag (it exists once the index is complete: one statement)."""
    con.execute("UPDATE config SET value = ? WHERE key = ?", [pack(value), _BACKFILLED_KEY])


def _flush(con: duckdb.DuckDBPyConnection, state: _State) -> None:
    """Write the pending documents inside the open transaction ``con``."""
    if not state.pending:
        return
    docs, state.pending, state.pending_postings = state.pending, [], 0
    first = _next_doc(con, state)
    _insert(con, first, docs)
    state.next_doc = first + len(docs)
    if state.complete:
        _mark(con, True)
    if state.stats is not None:
        state.stats = (
            state.stats[0] + len(docs),
            state.stats[1] + sum(d.length for d in docs),
        )


def flush_pending(db: Database) -> None:
    """Write the documents waiting in memory, in a transaction of their own (at close;
    see ``PENDING_DOCS``)."""
    state = db.state.get(COMPONENT)
    if isinstance(state, _State) and state.epoch == db.rollbacks and state.pending:
        with db.transaction() as con:
            _flush(con, state)


def index_parts(
    db: Database, con: duckdb.DuckDBPyConnection, part_rows: Sequence[tuple[Any, ...]]
) -> None:
    """Index the finished text parts among ``part_rows`` (the session store's part rows:
    ``(message_id, idx, type, state, tool_call_id, payload)``), just written inside the
    open transaction ``con``: tokenized now, written with their batch (see
    ``PENDING_DOCS``). Nothing until the file has an index (its first search makes it).
    A rollback of ``con`` drops what it added (see :func:`_state`)."""
    wanted = [
        (row[0], row[1], row[5]) for row in part_rows if row[2] == "text" and row[3] != "streaming"
    ]
    if not wanted:
        return
    state = _enabled(db)
    if state is None:
        return
    docs = [d for d in (_tokenized(*w) for w in wanted) if d is not None]
    if not docs:
        return
    if not state.pending:
        if _complete(con, state):
            _mark(con, False)  # a crash before the batch is written: backfill it
        db.before_close(COMPONENT, lambda: flush_pending(db))
    state.pending += docs
    state.pending_postings += sum(len(d.counts) for d in docs)
    if len(state.pending) >= PENDING_DOCS or state.pending_postings >= PENDING_POSTINGS:
        _flush(con, state)


def _delete_docs(
    db: Database, con: duckdb.DuckDBPyConnection, where: str, params: list[Any]
) -> None:
    state = _enabled(db)
    if state is None:
        return
    _flush(con, state)  # the documents to delete may still be waiting
    state.stats = None
    con.execute(
        "DELETE FROM search_index WHERE doc IN "
        f"(SELECT doc FROM search_index WHERE term IS NULL AND {where})",
        params,
    )


def forget_session(db: Database, con: duckdb.DuckDBPyConnection, session_id: str) -> None:
    """Delete the documents of a session (deleted or cleared: call it before its
    messages go)."""
    _delete_docs(
        db, con, "message_id IN (SELECT id FROM messages WHERE session_id = ?)", [session_id]
    )


def forget_messages(db: Database, con: duckdb.DuckDBPyConnection, message_ids: list[str]) -> None:
    """Delete the documents of messages (deleted, or about to be rewritten whole)."""
    if message_ids:
        _delete_docs(db, con, "message_id IN (SELECT unnest(?::VARCHAR[]))", [message_ids])


def copy_session(db: Database, con: duckdb.DuckDBPyConnection, session_id: str, salt: str) -> None:
    """Index a branch's copies: the copy of message ``m`` is ``salt || m`` in
    ``session_id`` with the same parts, so its documents are the source's, renumbered
    (one ``INSERT ... SELECT``, no re-tokenizing)."""
    state = _enabled(db)
    if state is None:
        return
    _flush(con, state)  # the source's newest documents may still be waiting
    base = _next_doc(con, state) - 1
    con.execute(
        "INSERT INTO search_index WITH src AS (SELECT doc, $base + row_number() OVER "
        "(ORDER BY doc) AS new FROM search_index WHERE term IS NULL AND message_id IN "
        "(SELECT substr(id, $cut) FROM messages WHERE session_id = $sid)) "
        "SELECT s.new, i.term, i.tf, i.len, "
        "CASE WHEN i.term IS NULL THEN $salt || i.message_id END, i.digest "
        "FROM search_index i JOIN src s USING (doc)",
        {"base": base, "cut": len(salt) + 1, "sid": session_id, "salt": salt},
    )
    state.next_doc = state.stats = None


# -- backfill ---------------------------------------------------------------------------


def backfill(db: Database, state: _State) -> int:
    """Index every finished text part that has no live document (messages stored before
    the index existed, or whose batch a crash lost) and drop stale documents, when the
    file's flag says the index may be incomplete: the store's writes keep the index up
    to date after that. Returns the number of parts indexed."""
    with db.transaction() as con:
        _flush(con, state)
        if _complete(con, state):
            return 0
        # Parts are msgpack inside their message's row (part_blobs): which are live,
        # and which finished text parts have no document, is worked out here.
        stored = {
            (mid, idx): payload
            for mid, blob in con.execute("SELECT id, parts FROM messages").fetchall()
            for idx, payload in part_blobs.slots(blob).items()
        }
        docs = con.execute(
            "SELECT doc, message_id, tf, digest FROM search_index WHERE term IS NULL"
        ).fetchall()
        live: set[tuple[str, int]] = set()
        stale: list[int] = []
        for doc, mid, idx, digest in docs:
            payload = stored.get((mid, idx))
            if payload is not None and _digest(payload) == digest:
                live.add((mid, idx))
            else:
                stale.append(doc)
        if stale:
            con.execute(
                "DELETE FROM search_index WHERE doc IN (SELECT unnest(?::BIGINT[]))", [stale]
            )
        missing = [
            (mid, idx, payload)
            for (mid, idx), payload in stored.items()
            if (mid, idx) not in live and _finished_text(payload)
        ]
        state.pending = [d for d in (_tokenized(*row) for row in missing) if d is not None]
        _flush(con, state)  # incomplete yet: writes the rows, not the flag
        _set_complete(con, True)
    state.complete = True
    state.stats = None
    return len(missing)


# -- search ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    """A checked search request."""

    text: str
    terms: tuple[str, ...]
    limit: int
    session_id: str | None

    @classmethod
    def check(cls, query: Any, limit: Any, session_id: Any) -> Query:
        """Raises:
        InvalidInputError: an empty or oversized query, a limit outside 1-100, a
            session id that is not a non-empty string."""
        if not isinstance(query, str):
            raise InvalidInputError(f"query must be a string, got {type(query).__name__}")
        if len(query) > MAX_QUERY_CHARS:
            raise InvalidInputError(
                f"query is {len(query)} characters long; at most {MAX_QUERY_CHARS} are allowed"
            )
        if not query.strip():
            raise InvalidInputError("query is empty")
        found = tuple(dict.fromkeys(terms(query)))
        if not found:
            raise InvalidInputError(f"query {query!r} has no searchable words")
        if len(found) > MAX_QUERY_TERMS:
            raise InvalidInputError(
                f"query has {len(found)} distinct words; at most {MAX_QUERY_TERMS} are allowed"
            )
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            raise InvalidInputError(
                f"limit must be an integer from 1 to {MAX_LIMIT}, got {limit!r}"
            )
        if session_id is not None and (not isinstance(session_id, str) or not session_id):
            raise InvalidInputError(f"session_id must be a non-empty string, got {session_id!r}")
        return cls(query, found, limit, session_id)


# BM25 in one query. Postings carry their document's length, so scoring reads the
# matching postings only; the window of best documents then gets its own rows (what
# part it is) and its part and message (stale: no part, or a part whose digest
# differs). The digest is compared here, not in the join: as a join key DuckDB
# hashes every part's payload, which was 40% of a search over 10k messages.
# Document frequencies count every session, as do the corpus figures ($n, $avgdl).
# The term ids are written into the SQL (they are ints this module computed): a
# constant IN list is pushed into the scan, ~30% faster than a joined parameter list.
_RANK = """
WITH hits AS (SELECT doc, term, tf, len FROM search_index WHERE term IN ({terms})),
df AS (SELECT term, count(*)::DOUBLE AS df FROM hits GROUP BY term),
top AS (
    SELECT h.doc, sum(
        ln(1 + ($n - df.df + 0.5) / (df.df + 0.5))
        * h.tf * ($k1 + 1) / (h.tf + $k1 * (1 - $b + $b * h.len / $avgdl))) AS score
    FROM hits h JOIN df USING (term) {where}
    GROUP BY h.doc ORDER BY score DESC, h.doc DESC LIMIT $window),
d AS (SELECT doc, message_id, tf AS idx, digest FROM search_index
      WHERE term IS NULL AND doc IN (SELECT doc FROM top))
SELECT d.message_id, m.session_id, m.role, m.hidden_at, m.created_at, d.idx, t.score,
       m.parts, d.digest
FROM top t JOIN d USING (doc)
LEFT JOIN messages m ON m.id = d.message_id
ORDER BY t.score DESC, t.doc DESC
"""
_IN_SESSION = (
    "WHERE h.doc IN (SELECT i.doc FROM search_index i JOIN messages m ON m.id = i.message_id "
    "WHERE i.term IS NULL AND m.session_id = $sid)"
)


def _stats(con: duckdb.DuckDBPyConnection, state: _State) -> tuple[int, int]:
    if state.stats is None:
        row = con.execute(
            "SELECT count(*), coalesce(sum(len), 0) FROM search_index WHERE term IS NULL"
        ).fetchone()
        state.stats = (int(row[0]), int(row[1])) if row else (0, 0)
    return state.stats


def _compaction_stamps(con: duckdb.DuckDBPyConnection) -> set[tuple[str, float]]:
    """``(session, hidden_at)`` of every visible compaction: the messages hidden with
    that stamp were summarized, not rewound."""
    rows = con.execute(
        "SELECT session_id, parts FROM messages WHERE compaction AND hidden_at IS NULL"
    ).fetchall()
    stamps = set()
    for sid, part in part_blobs.compaction_parts(rows):
        data = part.get("data")
        stamp = data.get("hidden_at") if isinstance(data, dict) else None
        if isinstance(stamp, int | float) and not isinstance(stamp, bool):
            stamps.add((sid, float(stamp)))
    return stamps


def snippet(text: str, wanted: set[str], width: int = SNIPPET_CHARS) -> tuple[str, list[list[int]]]:
    """About ``width`` characters of ``text`` around its first term in ``wanted``, and
    the ``[start, end)`` offsets of every wanted term inside the snippet (empty: none
    of them occurs, the hit matched only by a hash collision)."""
    pattern = _ASCII_TOKEN if text.isascii() else _TOKEN
    spans = [m.span() for m in pattern.finditer(text) if _normalize(m.group()) in wanted]
    if not spans:
        return "", []
    first = spans[0][0]
    start = max(0, first - width // 4)
    end = min(len(text), start + width)
    start = max(0, min(start, end - width))
    # Cut at whitespace so that no word is halved, when there is some near the edges.
    if start > 0:
        space = text.find(" ", start, first)
        start = space + 1 if space != -1 else start
    if end < len(text):
        space = text.rfind(" ", max(first, start), end)
        end = space if space > first else end
    body = " ".join(text[start:end].split("\n"))
    prefix = "…" if start > 0 else ""
    suffix = "…" if end < len(text) else ""
    shift = len(prefix) - start
    marks = [[a + shift, b + shift] for a, b in spans if a >= start and b <= end]
    return prefix + body + suffix, marks


def _hits(
    rows: list[tuple[Any, ...]], query: Query, stamps: Any, seen: set[str], out: list[SearchHit]
) -> None:
    wanted = set(query.terms)
    for mid, sid, role, hidden_at, created_at, idx, score, blob, digest in rows:
        payload = part_blobs.slots(blob).get(idx) if blob is not None else None
        if payload is None or sid is None or mid in seen or len(out) >= query.limit:
            continue  # stale: its part or message was deleted
        if _digest(payload) != digest:
            continue  # stale: its part was rewritten
        if hidden_at is not None and (sid, float(hidden_at)) not in stamps():
            continue  # rewound away (or hidden by hand)
        text = _text_of(payload) or ""
        shown, marks = snippet(text, wanted)
        if not marks:
            continue
        seen.add(mid)
        out.append(SearchHit(sid, mid, role, float(score), shown, marks, idx, float(created_at)))


def search(db: Database, query: Query) -> list[SearchHit]:
    """The best hits for ``query``, best first, one per message (see the module)."""
    where = _IN_SESSION if query.session_id is not None else ""
    term_ids = ", ".join(str(int(_term_id(t))) for t in sorted(set(query.terms)))
    params: dict[str, Any] = {
        "k1": K1,
        "b": B,
    }
    if query.session_id is not None:
        params["sid"] = query.session_id
    sql = _RANK.format(terms=term_ids, where=where)
    window = max(4 * query.limit, 40)
    with db.transaction() as con:
        state = enable(db)  # joins this transaction: writes what waits, backfills
        n, total = _stats(con, state)
        params["n"], params["avgdl"] = float(n), max(total / max(n, 1), 1.0)
        cached: list[set[tuple[str, float]]] = []

        def stamps() -> set[tuple[str, float]]:
            if not cached:
                cached.append(_compaction_stamps(con))
            return cached[0]

        while True:
            rows = con.execute(sql, {**params, "window": window}).fetchall()
            out: list[SearchHit] = []
            _hits(rows, query, stamps, set(), out)
            # Stale, hidden or duplicate candidates took places in the window: widen it.
            if len(out) >= query.limit or len(rows) < window:
                return out
            window *= 4
