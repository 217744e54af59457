"""A message's parts in its row (issue 23, ``thinkray.storage.part_blobs``): the blob
codec, upserts by index with gaps (through the journal and straight to DuckDB), the
``compaction`` flag the rewind and the search query, a file of version 2 (parts in a
table of their own) upgraded in place, and a journal an older build left behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest
from thinkray.storage import part_blobs
from thinkray.storage.db import Database
from thinkray.storage.journal import Journal, journal_path
from thinkray.storage.session_store import MIGRATIONS, DuckDBSessionStore
from thinkray.storage.types import PartWrite, StreamFlush


def _packed(part: dict[str, Any]) -> bytes:
    return msgpack.packb(part, use_bin_type=True)


def _text(text: str, **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": text, **extra}


def _decoded(blob: bytes) -> list[Any]:
    return part_blobs.as_list(msgpack.unpackb(blob, raw=False, strict_map_key=False))


# -- the codec --------------------------------------------------------------------------


@pytest.mark.parametrize("count", [0, 1, 15, 16, 70_000])
def test_a_dense_blob_is_a_msgpack_array_of_the_parts(count: int) -> None:
    parts = [{"type": "t", "i": i} for i in range(count)]
    blob = part_blobs.pack([_packed(p) for p in parts])
    assert msgpack.unpackb(blob) == parts  # any msgpack reader sees the list
    assert part_blobs.payloads(blob) == [_packed(p) for p in parts]


def test_a_gap_keeps_each_part_at_its_index() -> None:
    blob = part_blobs.pack_slots({0: _packed(_text("a")), 2: _packed(_text("c"))})
    assert _decoded(blob) == [_text("a"), _text("c")]  # read in index order
    rewritten = part_blobs.splice(blob, None, {2: _packed(_text("C"))})
    assert _decoded(rewritten) == [_text("a"), _text("C")]  # replaced, not appended
    filled = part_blobs.splice(rewritten, None, {1: _packed(_text("b"))})
    assert filled[0] == 0x93  # dense again: a plain array
    assert _decoded(filled) == [_text("a"), _text("b"), _text("C")]


def test_splice_cuts_before_it_writes() -> None:
    blob = part_blobs.pack([_packed(_text(str(i))) for i in range(4)])
    assert _decoded(part_blobs.splice(blob, 2, {})) == [_text("0"), _text("1")]
    assert _decoded(part_blobs.splice(blob, 1, {1: _packed(_text("x"))})) == [
        _text("0"),
        _text("x"),
    ]
    assert part_blobs.splice(None, None, {}) == part_blobs.EMPTY


def test_the_compaction_check_reads_the_type_not_the_text() -> None:
    quoted = _packed(_text("the data-compaction part type"))
    real = _packed({"type": "data-compaction", "data": {}})
    assert not part_blobs.blob_has_compaction(part_blobs.pack([quoted]))
    assert part_blobs.blob_has_compaction(part_blobs.pack([quoted, real]))
    assert not part_blobs.blob_has_compaction(None)


# -- the store ----------------------------------------------------------------------------


@pytest.fixture(params=["journal", "duckdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A file store whose turn writes go to the journal, or straight to DuckDB."""
    made = DuckDBSessionStore(tmp_path / "a.duckdb", journal=request.param == "journal")
    yield made
    made.close()


def _session(store: DuckDBSessionStore) -> str:
    sid = store.create_session(session_id="s1").id
    store.get_history(sid)  # the cache knows the history: writes may be journaled
    store.append_message(sid, {"id": "u", "role": "user", "parts": [_text("q")]})
    store.flush_stream(
        StreamFlush(sid, message={"id": "a", "role": "assistant", "parts": []}, parent_id="u")
    )
    return sid


def _texts(store: DuckDBSessionStore, mid: str) -> list[str]:
    message = store.get_message(mid)
    assert message is not None
    return [p["text"] for p in message["parts"]]


def test_parts_upserted_by_index_with_a_gap_read_back_alike_from_memory_and_file(
    store: DuckDBSessionStore,
) -> None:
    sid = _session(store)
    store.flush_stream(StreamFlush(sid, parts=[PartWrite("a", 0, _text("a")), PartWrite("a", 2, _text("c"))]))  # fmt: skip
    store.flush_stream(StreamFlush(sid, parts=[PartWrite("a", 2, _text("C"))]))
    memory = store.get_history(sid)
    assert [p["text"] for p in memory[-1]["parts"]] == ["a", "C"]
    store.flush_stream(StreamFlush(sid, parts=[PartWrite("a", 1, _text("b"))]))
    assert _texts(store, "a") == ["a", "b", "C"]
    store._forget()  # noqa: SLF001 - read the file, not the cache
    assert _texts(store, "a") == ["a", "b", "C"]
    assert [m["id"] for m in store.get_history(sid)] == ["u", "a"]


def test_a_cut_and_a_rewrite_in_one_flush_survive_a_reopen(
    store: DuckDBSessionStore, tmp_path: Path
) -> None:
    sid = _session(store)
    store.flush_stream(StreamFlush(sid, parts=[PartWrite("a", i, _text(str(i))) for i in range(4)]))  # fmt: skip
    store.flush_stream(StreamFlush(sid, parts=[PartWrite("a", 1, _text("one"))], parts_length=2))
    assert _texts(store, "a") == ["0", "one"]
    store.close()
    again = DuckDBSessionStore(tmp_path / "a.duckdb")
    try:
        assert _texts(again, "a") == ["0", "one"]
    finally:
        again.close()


def test_the_compaction_flag_follows_the_parts(store: DuckDBSessionStore) -> None:
    sid = _session(store)
    compaction = {"type": "data-compaction", "data": {"summary": "s"}}
    store.flush_stream(StreamFlush(sid, parts=[PartWrite("a", 0, compaction)]))
    flags = "SELECT id FROM messages WHERE compaction"
    assert store.db.fetchall(flags) == [("a",)]
    store.flush_stream(StreamFlush(sid, parts=[PartWrite("a", 0, _text("plain"))]))
    assert store.db.fetchall(flags) == []
    store.upsert_message(sid, {"id": "u", "role": "user", "parts": [_text("q"), compaction]})
    assert store.db.fetchall(flags) == [("u",)]


# -- older files --------------------------------------------------------------------------


def _version_2_file(path: Path) -> None:
    """A file as builds before issue 23's parts change wrote it: parts in a table."""
    db = Database(path)
    db.migrate("sessions", MIGRATIONS[:2])
    packed = {
        ("m1", 0): _text("hello"),
        ("m2", 0): _text("a"),
        ("m2", 3): _text("d"),  # a gap
        ("m3", 0): {"type": "data-compaction", "data": {"hidden_at": 1.0}},
    }
    with db.transaction() as con:
        con.execute("INSERT INTO sessions (id, name, head_id) VALUES ('s1', 'old', 'm4')")
        for seq, (mid, parent) in enumerate([("m1", None), ("m2", "m1"), ("m3", "m2"), ("m4", "m3")]):  # fmt: skip
            envelope = msgpack.packb({"id": mid, "role": "user"})
            con.execute(
                "INSERT INTO messages VALUES (?, 's1', ?, 'user', ?, 0, NULL, ?)",
                [mid, parent, seq, envelope],
            )
        for (mid, idx), part in packed.items():
            con.execute(
                "INSERT INTO parts VALUES ('s1', ?, ?, ?, NULL, NULL, ?)",
                [mid, idx, part["type"], _packed(part)],
            )
    db.close()


def test_a_version_2_file_moves_its_parts_into_their_messages(tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    _version_2_file(path)
    store = DuckDBSessionStore(path)
    try:
        history = store.get_history("s1")
        assert [m["parts"] for m in history] == [
            [_text("hello")],
            [_text("a"), _text("d")],
            [{"type": "data-compaction", "data": {"hidden_at": 1.0}}],
            [],  # no part rows: the empty list
        ]
        tables = {t for (t,) in store.db.fetchall("SELECT table_name FROM duckdb_tables()")}
        assert "parts" not in tables
        assert store.db.fetchall("SELECT id FROM messages WHERE compaction") == [("m3",)]
        # the gap is kept: a write to index 3 replaces "d"
        store.flush_stream(StreamFlush("s1", parts=[PartWrite("m2", 3, _text("D"))]))
        store._forget()  # noqa: SLF001
        assert [p["text"] for p in store.get_history("s1")[1]["parts"]] == ["a", "D"]
    finally:
        store.close()


def test_a_journal_an_older_build_left_is_replayed(tmp_path: Path) -> None:
    """Its records delete a stored slot (``d``) before rewriting it: the rewrite alone
    now replaces the slot in the message's blob."""
    path = tmp_path / "a.duckdb"
    store = DuckDBSessionStore(path)
    sid = _session(store)
    store.flush_stream(StreamFlush(sid, parts=[PartWrite("a", 0, _text("x")), PartWrite("a", 1, _text("y"))]))  # fmt: skip
    store.close()  # folded: the journal is gone
    part = _text("rewritten")
    record = {
        "n": 10_000,
        "d": [["a", 0]],
        "p": [[sid, "a", 0, "text", None, None, _packed(part)]],
        "s": [[sid, 2e9, None, False, None]],
    }
    journal = Journal(journal_path(path))
    journal.append(record)
    journal.close()
    again = DuckDBSessionStore(path)
    try:
        assert _texts(again, "a") == ["rewritten", "y"]
    finally:
        again.close()


def test_config_callers_cannot_touch_the_files_schema_versions(tmp_path: Path) -> None:
    from thinkray.storage.types import InvalidInputError

    store = DuckDBSessionStore(tmp_path / "a.duckdb")
    try:
        before = store.db.schema_versions()
        with pytest.raises(InvalidInputError, match="schema_version"):
            store.set_config("schema_version.sessions", 1)
        with pytest.raises(InvalidInputError, match="schema_version"):
            store.delete_config("schema_version.sessions")
        store.set_config("schema_versions_seen", 1)  # only the prefix is the file's
        assert store.db.schema_versions() == before
    finally:
        store.close()
