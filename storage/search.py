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
  its part is stored unchanged: the search joins its best candidates to ``parts`` and
  keeps those whose payload still has the digest and whose message still exists and
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
class _State:
    """What the search keeps in memory about one file (in ``Database.state``)."""

    next_doc: int | None = None  # None: read max(doc) on next use
    backfilled: bool = False
    stats: tuple[int, int] | None = None  # documents, their total length (None: read)
    enabled: bool | None = None  # whether the file has the index (None: not checked)
    epoch: int = 0


def _state(db: Database) -> _State:
    state = db.state.get(COMPONENT)
    if state is None:
        state = db.state[COMPONENT] = _State(epoch=db.rollbacks)
    elif state.epoch != db.rollbacks:
        # A rollback may have taken doc ids, the backfill or the table itself with it:
        # read them again.
        db.state[COMPONENT] = state = _State(epoch=db.rollbacks)
    return state


def _enabled(db: Database) -> _State | None:
    """The index's state if this file has an index (its first search made it), else
    None: the writes of an agent that never searched cost nothing."""
    state = _state(db)
    if state.enabled is None:
        row = db.fetchone("SELECT 1 FROM schema_version WHERE component = ?", [COMPONENT])
        state.enabled = row is not None
        if state.enabled:
            db.migrate(COMPONENT, MIGRATIONS)  # a newer version's steps, if any
    return state if state.enabled else None


def enable(db: Database) -> _State:
    """Make the index (if the file has none yet) and fill it: see :func:`backfill`."""
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


# The first 64 bits of the payload's md5, in SQL (from the standard hex form, whose
# meaning no DuckDB version can change) and in Python.
_SQL_DIGEST = "('0x' || left(md5({}), 16))::UBIGINT"


def _digest(payload: bytes) -> int:
    return int(hashlib.md5(payload, usedforsecurity=False).hexdigest()[:16], 16)


# -- indexing (the write path) --------------------------------------------------------


def _text_of(payload: bytes) -> str | None:
    part = unpack(payload)
    text = part.get("text") if isinstance(part, dict) else None
    return text if isinstance(text, str) and text else None


# Postings go in as comma-separated text split in SQL: binding a Python list costs per
# item (~1 ms for a reply's 60 terms here), one string costs about nothing. A write
# indexes one part almost always: its doc id and length are then plain parameters.
_POSTINGS_ONE = (
    "SELECT ?::BIGINT, unnest(string_split(?, ','))::UINTEGER, "
    "unnest(string_split(?, ','))::INTEGER, ?::INTEGER, NULL, NULL"
)
_POSTINGS_MANY = (
    "SELECT unnest(string_split(?, ','))::BIGINT, unnest(string_split(?, ','))::UINTEGER, "
    "unnest(string_split(?, ','))::INTEGER, unnest(string_split(?, ','))::INTEGER, "
    "NULL, NULL"
)
_DOC_ROW = "(?::BIGINT, NULL, ?::INTEGER, ?::INTEGER, ?, ?::UBIGINT)"


@dataclass
class _Batch:
    """The rows of one index write: per document its own row and its postings."""

    docs: list[tuple[int, int, int, str, int]] = field(default_factory=list)
    postings: list[tuple[int, int, Counter[int]]] = field(default_factory=list)

    def add(self, doc: int, mid: str, idx: int, payload: bytes, text: str) -> bool:
        counts = Counter(map(_term_id, terms(text)))
        if not counts:
            return False
        length = sum(counts.values())
        self.docs.append((doc, idx, length, mid, _digest(payload)))
        self.postings.append((doc, length, counts))
        return True

    def statement(self) -> tuple[str, list[Any]]:
        """One ``INSERT`` for the whole batch, and its parameters."""
        if len(self.postings) == 1:
            doc, length, counts = self.postings[0]
            head = _POSTINGS_ONE
            params: list[Any] = [doc, _csv(counts.keys()), _csv(counts.values()), length]
        else:
            head = _POSTINGS_MANY
            docs: list[int] = []
            term_ids: list[int] = []
            tfs: list[int] = []
            lengths: list[int] = []
            for doc, length, counts in self.postings:
                docs += [doc] * len(counts)
                lengths += [length] * len(counts)
                term_ids += counts.keys()
                tfs += counts.values()
            params = [_csv(docs), _csv(term_ids), _csv(tfs), _csv(lengths)]
        values = ", ".join([_DOC_ROW] * len(self.docs))
        for row in self.docs:
            params.extend(row)
        return f"INSERT INTO search_index {head} UNION ALL VALUES {values}", params


def _csv(numbers: Any) -> str:
    return ",".join(map(str, numbers))


def _next_doc(con: duckdb.DuckDBPyConnection, state: _State) -> int:
    if state.next_doc is None:
        row = con.execute("SELECT coalesce(max(doc), 0) + 1 FROM search_index").fetchone()
        state.next_doc = int(row[0]) if row else 1
    return state.next_doc


def index_parts(
    db: Database, con: duckdb.DuckDBPyConnection, part_rows: Sequence[tuple[Any, ...]]
) -> None:
    """Index the finished text parts among ``part_rows`` (the session store's part rows:
    ``(message_id, idx, type, state, tool_call_id, payload)``), just written inside the
    open transaction ``con``. At most one statement; none until the file has an index
    (its first search makes it)."""
    wanted = [
        (row[0], row[1], row[5]) for row in part_rows if row[2] == "text" and row[3] != "streaming"
    ]
    if not wanted:
        return
    state = _enabled(db)
    if state is None:
        return
    doc = _next_doc(con, state)
    batch = _Batch()
    for mid, idx, payload in wanted:
        text = _text_of(payload)
        if text is not None and batch.add(doc, mid, idx, payload, text):
            doc += 1
    if batch.docs:
        con.execute(*batch.statement())
        state.next_doc = doc
        if state.stats is not None:
            state.stats = (
                state.stats[0] + len(batch.docs),
                state.stats[1] + sum(d[2] for d in batch.docs),
            )


def _delete_docs(
    db: Database, con: duckdb.DuckDBPyConnection, where: str, params: list[Any]
) -> None:
    state = _enabled(db)
    if state is None:
        return
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

_LIVE_DOC = (
    "SELECT 1 FROM parts x WHERE x.message_id = i.message_id AND x.idx = i.tf "
    "AND " + _SQL_DIGEST.format("x.payload") + " = i.digest"
)


def backfill(db: Database, state: _State) -> int:
    """Index every finished text part that has no live document (messages stored before
    the index existed) and drop stale documents, once per file: the store's writes
    keep the index up to date after that. Returns the number of parts indexed."""
    if state.backfilled:
        return 0
    with db.transaction() as con:
        done = con.execute("SELECT 1 FROM config WHERE key = ?", [_BACKFILLED_KEY]).fetchone()
        if done:
            state.backfilled = True
            return 0
        con.execute(
            "DELETE FROM search_index WHERE doc IN (SELECT i.doc FROM search_index i "
            f"WHERE i.term IS NULL AND NOT EXISTS ({_LIVE_DOC}))"
        )
        missing = con.execute(
            "SELECT x.message_id, x.idx, x.payload FROM parts x "
            "WHERE x.type = 'text' AND (x.state IS NULL OR x.state <> 'streaming') "
            "AND NOT EXISTS (SELECT 1 FROM search_index i WHERE i.term IS NULL "
            "AND i.message_id = x.message_id AND i.tf = x.idx "
            "AND i.digest = " + _SQL_DIGEST.format("x.payload") + ")"
        ).fetchall()
        rows = [(mid, idx, "text", None, None, payload) for mid, idx, payload in missing]
        index_parts(db, con, rows)
        con.execute("INSERT INTO config VALUES (?, ?)", [_BACKFILLED_KEY, pack(True)])
    state.backfilled = True
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
# part it is) and is checked against ``parts`` and ``messages`` (stale: no payload).
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
       x.payload
FROM top t JOIN d USING (doc)
LEFT JOIN parts x ON x.message_id = d.message_id AND x.idx = d.idx AND {digest} = d.digest
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
        "SELECT x.session_id, x.payload FROM parts x JOIN messages m ON m.id = x.message_id "
        "WHERE x.type = 'data-compaction' AND m.hidden_at IS NULL"
    ).fetchall()
    stamps = set()
    for sid, payload in rows:
        part = unpack(payload)
        data = part.get("data") if isinstance(part, dict) else None
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
    for mid, sid, role, hidden_at, created_at, idx, score, payload in rows:
        if payload is None or sid is None or mid in seen or len(out) >= query.limit:
            continue  # stale: its part was rewritten or deleted
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
    state = enable(db)
    where = _IN_SESSION if query.session_id is not None else ""
    term_ids = ", ".join(str(int(_term_id(t))) for t in sorted(set(query.terms)))
    params: dict[str, Any] = {
        "k1": K1,
        "b": B,
    }
    if query.session_id is not None:
        params["sid"] = query.session_id
    sql = _RANK.format(terms=term_ids, where=where, digest=_SQL_DIGEST.format("x.payload"))
    window = max(4 * query.limit, 40)
    with db.transaction() as con:
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
