"""Full-text search over an agent's stored messages: an inverted index in its own file.

DuckDB's ``fts`` extension is not used: it is not bundled with the ``duckdb`` wheel and
is downloaded at run time (no network here; the extension wheels on PyPI stop at
DuckDB 1.5.5, and an extension loads only into the exact version it was built for),
and its index is rebuilt whole (``PRAGMA create_fts_index``), not kept up as rows land.

Layout (``search`` component, version 1), one table so that indexing a write is one
extra ``INSERT`` in the write's own transaction::

    search_index(doc BIGINT, term UINTEGER, tf INTEGER,
                 session_id VARCHAR, message_id VARCHAR, idx INTEGER, digest UBIGINT)

- A *document* is one ``text`` part (not while it streams: ``state = 'streaming'``
  parts are rewritten on every flush, and the finished part is written once more
  with ``state = 'done'``). Its own row has ``term`` NULL, ``tf`` = its length in
  terms, and names its part: ``session_id``, ``message_id``, ``idx`` and ``digest``
  (the first 64 bits of the md5 of the part's stored payload). Every other row is a
  posting: ``(doc, term, tf)``, the other columns NULL (NULL runs cost next to
  nothing on disk).
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
        "session_id VARCHAR, message_id VARCHAR, idx INTEGER, digest UBIGINT)"
    )


MIGRATIONS: list[Migration] = [Migration(1, _v1)]


@dataclass
class _State:
    """What the search keeps in memory about one file (in ``Database.state``)."""

    next_doc: int | None = None  # None: read max(doc) on next use
    backfilled: bool = False
    epoch: int = 0


def _state(db: Database) -> _State:
    db.migrate(COMPONENT, MIGRATIONS)
    state = db.state.get(COMPONENT)
    if state is None:
        state = db.state[COMPONENT] = _State(epoch=db.rollbacks)
    elif state.epoch != db.rollbacks:
        # A rollback may have taken doc ids or the backfill with it: read them again.
        state.next_doc, state.backfilled, state.epoch = None, False, db.rollbacks
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

_INSERT = (
    "INSERT INTO search_index SELECT unnest(?::BIGINT[]), unnest(?::UINTEGER[]), "
    "unnest(?::INTEGER[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), "
    "unnest(?::INTEGER[]), unnest(?::UBIGINT[])"
)


def _text_of(payload: bytes) -> str | None:
    part = unpack(payload)
    text = part.get("text") if isinstance(part, dict) else None
    return text if isinstance(text, str) and text else None


@dataclass
class _Rows:
    cols: list[list[Any]] = field(default_factory=lambda: [[] for _ in range(7)])

    def add(self, doc: int, session_id: str, mid: str, idx: int, payload: bytes, text: str) -> bool:
        counts = Counter(map(_term_id, terms(text)))
        if not counts:
            return False
        doc_col, term_col, tf_col, sid_col, mid_col, idx_col, dig_col = self.cols
        length = sum(counts.values())
        doc_col.append(doc)
        term_col.append(None)
        tf_col.append(length)
        sid_col.append(session_id)
        mid_col.append(mid)
        idx_col.append(idx)
        dig_col.append(_digest(payload))
        n = len(counts)
        doc_col.extend([doc] * n)
        term_col.extend(counts.keys())
        tf_col.extend(counts.values())
        pad = [None] * n
        sid_col.extend(pad)
        mid_col.extend(pad)
        idx_col.extend(pad)
        dig_col.extend(pad)
        return True


def _next_doc(con: duckdb.DuckDBPyConnection, state: _State) -> int:
    if state.next_doc is None:
        row = con.execute("SELECT coalesce(max(doc), 0) + 1 FROM search_index").fetchone()
        state.next_doc = int(row[0]) if row else 1
    return state.next_doc


def index_parts(
    db: Database,
    con: duckdb.DuckDBPyConnection,
    session_id: str,
    part_rows: Sequence[tuple[Any, ...]],
) -> None:
    """Index the finished text parts among ``part_rows`` (the session store's part rows:
    ``(message_id, idx, type, state, tool_call_id, payload)``), just written to
    ``session_id`` inside the open transaction ``con``. At most one statement."""
    wanted = [
        (row[0], row[1], row[5]) for row in part_rows if row[2] == "text" and row[3] != "streaming"
    ]
    if not wanted:
        return
    state = _state(db)
    doc = _next_doc(con, state)
    rows = _Rows()
    for mid, idx, payload in wanted:
        text = _text_of(payload)
        if text is not None and rows.add(doc, session_id, mid, idx, payload, text):
            doc += 1
    if rows.cols[0]:
        con.execute(_INSERT, rows.cols)
        state.next_doc = doc


def _delete_docs(
    db: Database, con: duckdb.DuckDBPyConnection, where: str, params: list[Any]
) -> None:
    _state(db)
    con.execute(
        "DELETE FROM search_index WHERE doc IN "
        f"(SELECT doc FROM search_index WHERE term IS NULL AND {where})",
        params,
    )


def forget_session(db: Database, con: duckdb.DuckDBPyConnection, session_id: str) -> None:
    """Delete the documents of a session (deleted or cleared)."""
    _delete_docs(db, con, "session_id = ?", [session_id])


def forget_messages(db: Database, con: duckdb.DuckDBPyConnection, message_ids: list[str]) -> None:
    """Delete the documents of messages (deleted, or about to be rewritten whole)."""
    if message_ids:
        _delete_docs(db, con, "message_id IN (SELECT unnest(?::VARCHAR[]))", [message_ids])


def copy_session(db: Database, con: duckdb.DuckDBPyConnection, session_id: str, salt: str) -> None:
    """Index a branch's copies: the copy of message ``m`` is ``salt || m`` in
    ``session_id`` with the same parts, so its documents are the source's, renumbered
    (one ``INSERT ... SELECT``, no re-tokenizing)."""
    state = _state(db)
    base = _next_doc(con, state) - 1
    con.execute(
        "INSERT INTO search_index WITH src AS (SELECT doc, $base + row_number() OVER "
        "(ORDER BY doc) AS new FROM search_index WHERE term IS NULL AND message_id IN "
        "(SELECT substr(id, $cut) FROM messages WHERE session_id = $sid)) "
        "SELECT s.new, i.term, i.tf, CASE WHEN i.term IS NULL THEN $sid END, "
        "CASE WHEN i.term IS NULL THEN $salt || i.message_id END, i.idx, i.digest "
        "FROM search_index i JOIN src s USING (doc)",
        {"base": base, "cut": len(salt) + 1, "sid": session_id, "salt": salt},
    )
    state.next_doc = None


# -- backfill ---------------------------------------------------------------------------

_LIVE_DOC = (
    "SELECT 1 FROM parts x WHERE x.message_id = i.message_id AND x.idx = i.idx "
    "AND " + _SQL_DIGEST.format("x.payload") + " = i.digest"
)


def backfill(db: Database) -> int:
    """Index every finished text part that has no live document (messages stored before
    the index existed) and drop stale documents, once per file: the store's writes
    keep the index up to date after that. Returns the number of parts indexed."""
    state = _state(db)
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
            "SELECT x.session_id, x.message_id, x.idx, x.payload FROM parts x "
            "WHERE x.type = 'text' AND (x.state IS NULL OR x.state <> 'streaming') "
            "AND NOT EXISTS (SELECT 1 FROM search_index i WHERE i.term IS NULL "
            "AND i.message_id = x.message_id AND i.idx = x.idx "
            "AND i.digest = " + _SQL_DIGEST.format("x.payload") + ")"
        ).fetchall()
        by_session: dict[str, list[tuple[Any, ...]]] = {}
        for sid, mid, idx, payload in missing:
            by_session.setdefault(sid, []).append((mid, idx, "text", None, None, payload))
        for sid, rows in by_session.items():
            index_parts(db, con, sid, rows)
        con.execute("INSERT INTO config VALUES (?, ?)", [_BACKFILLED_KEY, pack(True)])
    state.backfilled = True
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


_RANK = """
WITH p AS (SELECT doc, term, tf FROM search_index
           WHERE term IN (SELECT unnest($terms::UINTEGER[]))),
stats AS (SELECT count(*)::DOUBLE AS n, coalesce(avg(tf), 1)::DOUBLE AS avgdl
          FROM search_index WHERE term IS NULL),
df AS (SELECT term, count(*)::DOUBLE AS df FROM p GROUP BY term),
d AS (SELECT doc, tf AS len, message_id, idx, digest FROM search_index
      WHERE term IS NULL {where}),
top AS (
    SELECT d.message_id, d.idx, d.digest, sum(
        ln(1 + (stats.n - df.df + 0.5) / (df.df + 0.5))
        * p.tf * ($k1 + 1) / (p.tf + $k1 * (1 - $b + $b * d.len / stats.avgdl))) AS score
    FROM p JOIN df USING (term) JOIN d USING (doc) CROSS JOIN stats
    GROUP BY d.doc, d.message_id, d.idx, d.digest
    ORDER BY score DESC, d.doc DESC LIMIT $window)
SELECT t.message_id, m.session_id, m.role, m.hidden_at, m.created_at, t.idx, t.score,
       x.payload
FROM top t LEFT JOIN parts x ON x.message_id = t.message_id AND x.idx = t.idx
    AND {digest} = t.digest
LEFT JOIN messages m ON m.id = t.message_id
ORDER BY t.score DESC, m.seq DESC
"""


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
    backfill(db)
    where = "AND session_id = $sid" if query.session_id is not None else ""
    params: dict[str, Any] = {
        "terms": sorted({_term_id(t) for t in query.terms}),
        "k1": K1,
        "b": B,
    }
    if query.session_id is not None:
        params["sid"] = query.session_id
    sql = _RANK.format(where=where, digest=_SQL_DIGEST.format("x.payload"))
    window = max(4 * query.limit, 40)
    with db.transaction() as con:
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
