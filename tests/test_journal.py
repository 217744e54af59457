"""The session store's write-behind journal (issue 23): a turn's writes are appended to
``<file>.journal`` and folded into DuckDB in batches. What must hold: an acknowledged
write survives a SIGKILL of its process (replayed at the next open), a torn last
append is dropped and damage elsewhere refused, nothing is replayed twice, a fold that
rolls back loses nothing, and every read sees what the journal holds."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from thinkray.storage.errors import CorruptDatabaseError
from thinkray.storage.journal import journal_path, read_records
from thinkray.storage.session_store import DuckDBSessionStore
from thinkray.storage.types import ChunkPrune, ChunkWrite, PartWrite, StreamFlush

from tests.helpers import sigkilled_child


def _msg(mid: str, role: str = "user", text: str = "hi") -> dict[str, Any]:
    return {"id": mid, "role": role, "parts": [{"type": "text", "text": text}]}


def _reply(sid: str, turn: int, parent: str, *, prune: bool = False) -> StreamFlush:
    return StreamFlush(
        sid,
        message={"id": f"a{turn}", "role": "assistant", "parts": []},
        parent_id=parent,
        use_head=False,
        parts=[PartWrite(f"a{turn}", 0, {"type": "text", "text": f"answer {turn}"})],
        chunks=[ChunkWrite(f"run{turn}", i, {"type": "d", "i": i}) for i in range(5)],
        usage=[{"input": 2, "output": 3}],
        prune_chunks=ChunkPrune(keep=2) if prune else None,
    )


def _turns(store: DuckDBSessionStore, sid: str, turns: range, prune: bool = False) -> None:
    for turn in turns:
        store.append_message(sid, _msg(f"u{turn}"))
        store.flush_stream(_reply(sid, turn, f"u{turn}", prune=prune))


def _started(path: Path) -> tuple[DuckDBSessionStore, str]:
    store = DuckDBSessionStore(path)
    with store.transaction():  # in DuckDB (a new file's first session would be journaled)
        sid = store.create_session(session_id="s1").id
    store.get_history(sid)  # the cache knows the history: writes go to the journal
    return store, sid


def _ids(store: DuckDBSessionStore, sid: str) -> list[str]:
    return [m["id"] for m in store.get_history(sid)]


def test_turns_go_to_the_journal_and_reads_fold_them(tmp_path: Path) -> None:
    store, sid = _started(tmp_path / "a.duckdb")
    try:
        with store.counting() as count:  # not db.counting(): .db folds first
            _turns(store, sid, range(3))
        # three turns, no statement at all (a new file: no ids or chunk log to read)
        assert count.statements == 0, count.log
        assert len(read_records(journal_path(tmp_path / "a.duckdb"))) == 6
        assert _ids(store, sid) == ["u0", "a0", "u1", "a1", "u2", "a2"]  # from memory
        assert store.get_session(sid).usage["prompt_tokens"] == 6
        # a read the cache cannot answer folds first, in one transaction
        with store.db.counting() as count:
            pass
        assert count.statements == 0  # .db folded before counting began
        assert read_records(journal_path(tmp_path / "a.duckdb")) == []
        rows = store.db.fetchall("SELECT id FROM messages ORDER BY seq")
        assert [r[0] for r in rows] == ["u0", "a0", "u1", "a1", "u2", "a2"]
        assert store.get_chunks("run1") == [{"type": "d", "i": i} for i in range(5)]
    finally:
        store.close()
    assert not journal_path(tmp_path / "a.duckdb").exists()  # a clean close leaves none


def test_many_turns_fold_in_one_transaction(tmp_path: Path) -> None:
    store, sid = _started(tmp_path / "a.duckdb")
    try:
        _turns(store, sid, range(10), prune=True)
        with store.counting() as count:
            store.db  # noqa: B018 - the fold
        assert count.commits == 1, count.log
        assert count.statements <= 10, count.log  # one per kind of row, not per turn
        assert store.chunk_generations() == ["run8", "run9"]  # pruned in memory
        assert store.get_chunks("run0") == []
    finally:
        store.close()


def test_a_reopened_file_reads_its_ids_and_chunk_log_once(tmp_path: Path) -> None:
    path = tmp_path / "a.duckdb"
    store, sid = _started(path)
    _turns(store, sid, range(2))
    store.close()
    store = DuckDBSessionStore(path)
    try:
        store.get_history(sid)
        with store.counting() as count:
            _turns(store, sid, range(2, 5))
        assert count.writes == 0 and count.transactions == 0, count.log
        assert len(count.log) == 2, count.log  # the ids and the generations, once each
        assert store.append_message(sid, _msg("u0")) is False  # a stored id: refused
    finally:
        store.close()


def test_a_resend_is_refused_from_memory_and_after_a_fold(tmp_path: Path) -> None:
    store, sid = _started(tmp_path / "a.duckdb")
    try:
        assert store.append_message(sid, _msg("u0")) is True
        assert store.message_session("u0") == sid  # pending: answered from memory
        assert store.message_session("nope") is None
        assert store.append_message(sid, _msg("u0", text="again")) is False
        store.db  # noqa: B018 - fold
        assert store.append_message(sid, _msg("u0", text="again")) is False
        other = store.create_session().id
        store.get_history(other)
        assert store.append_message(other, _msg("u0")) is False  # ids are store-wide
        assert [m["parts"][0]["text"] for m in store.get_history(sid)] == ["hi"]
    finally:
        store.close()


_CHILD = """
import os, signal, sys
sys.path.insert(0, {repo!r})
from tests.test_journal import _started, _turns
store, sid = _started({path!r})
_turns(store, sid, range(3))
store.append_message(sid, {{"id": "u3", "role": "user", "parts": [{{"type": "text", "text": "last"}}]}})
print("acknowledged", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _crashed(path: Path) -> None:
    """Three turns and a user message through the journal in a child process, then a
    SIGKILL of that process (nothing folded, nothing closed)."""
    sigkilled_child(_CHILD, path=str(path))
    assert len(read_records(journal_path(path))) == 7  # nothing was folded


def test_acknowledged_writes_survive_a_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "a.duckdb"
    _crashed(path)
    store = DuckDBSessionStore(path)
    try:
        assert _ids(store, "s1") == ["u0", "a0", "u1", "a1", "u2", "a2", "u3"]
        assert store.get_session("s1").usage["completion_tokens"] == 9
        assert store.get_chunks("run2") == [{"type": "d", "i": i} for i in range(5)]
        assert read_records(journal_path(path)) == []  # replayed into the file
        # new writes after a replay get fresh numbers and sequence
        store.append_message("s1", _msg("u4"))
        assert _ids(store, "s1")[-2:] == ["u3", "u4"]
    finally:
        store.close()


def test_a_torn_last_append_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "a.duckdb"
    _crashed(path)
    whole = journal_path(path).read_bytes()
    # a SIGKILL mid-append: whole records, then part of one (header and some payload)
    journal_path(path).write_bytes(whole + whole[:30])
    store = DuckDBSessionStore(path)
    try:
        assert _ids(store, "s1") == ["u0", "a0", "u1", "a1", "u2", "a2", "u3"]
    finally:
        store.close()


def test_a_torn_first_append_is_dropped_and_later_writes_follow_cleanly(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a.duckdb"
    store, sid = _started(path)
    store.close()
    journal_path(path).write_bytes(b"\x20\x00\x00\x00\x01\x02")  # a torn header+body
    store = DuckDBSessionStore(path)
    try:
        store.get_history(sid)
        _turns(store, sid, range(1))
    finally:
        _left_as_a_crash_would(store)
    assert len(read_records(journal_path(path))) == 2
    reopened = DuckDBSessionStore(path)
    try:
        assert _ids(reopened, sid) == ["u0", "a0"]
    finally:
        reopened.close()


def test_damage_before_the_last_record_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.duckdb"
    _crashed(path)
    data = bytearray(journal_path(path).read_bytes())
    data[12] ^= 0xFF  # inside the first record's payload
    journal_path(path).write_bytes(bytes(data))
    with pytest.raises(CorruptDatabaseError, match="journal"):
        DuckDBSessionStore(path)
    assert journal_path(path).read_bytes() == bytes(data)  # kept for whoever repairs it


def test_records_folded_before_a_crash_are_not_replayed_twice(tmp_path: Path) -> None:
    path = tmp_path / "a.duckdb"
    store, sid = _started(path)
    _turns(store, sid, range(2))
    saved = journal_path(path).read_bytes()
    store.db  # noqa: B018 - the fold commits and marks record 4 folded
    _turns(store, sid, range(2, 3))
    later = journal_path(path).read_bytes()
    store.close()
    # a crash between a fold's commit and the journal's truncation: both still there
    journal_path(path).write_bytes(saved + later)
    reopened = DuckDBSessionStore(path)
    try:
        assert _ids(reopened, sid) == ["u0", "a0", "u1", "a1", "u2", "a2"]
        assert reopened.db.fetchone("SELECT count(*) FROM messages") == (6,)
        assert reopened.db.fetchone("SELECT count(*) FROM chunks") == (3,)  # a row a run
    finally:
        reopened.close()


def test_a_fold_inside_a_transaction_that_rolls_back_loses_nothing(tmp_path: Path) -> None:
    store, sid = _started(tmp_path / "a.duckdb")
    try:
        _turns(store, sid, range(2))

        class Boom(Exception):
            pass

        with pytest.raises(Boom), store.transaction():
            store.get_message_row("u0")  # a read in the transaction folds into it
            raise Boom
        assert store._state.pending  # noqa: SLF001 - still pending: it did not commit
        assert _ids(store, sid) == ["u0", "a0", "u1", "a1"]
        assert store.db.fetchone("SELECT count(*) FROM messages") == (4,)
        assert store.get_message_row("a1") is not None
    finally:
        store.close()


def test_a_write_inside_a_transaction_goes_to_duckdb_with_it(tmp_path: Path) -> None:
    """A write joined to other stores' writes (the tool-call ledger's) must commit with
    them: it is not journaled."""
    store, sid = _started(tmp_path / "a.duckdb")
    try:
        with store.transaction():
            store.append_message(sid, _msg("u0"))
            store.set_config("with-it", 1)
        assert not store._state.pending  # noqa: SLF001
        assert read_records(journal_path(tmp_path / "a.duckdb")) == []
        assert _ids(store, sid) == ["u0"]
    finally:
        store.close()


def test_parts_rewritten_and_shrunk_across_records_fold_to_the_last_state(
    tmp_path: Path,
) -> None:
    store, sid = _started(tmp_path / "a.duckdb")
    try:
        store.append_message(sid, _msg("u0"))
        store.flush_stream(_reply(sid, 0, "u0"))
        store.db  # noqa: B018 - a0 is in the file now
        text = {"type": "text", "text": "x"}
        writes = [PartWrite("a0", i, {**text, "text": f"p{i}"}) for i in range(4)]
        store.flush_stream(StreamFlush(sid, parts=writes))
        store.flush_stream(StreamFlush(sid, parts=[PartWrite("a0", 1, {**text, "text": "new"})]))
        store.flush_stream(
            StreamFlush(
                sid,
                message={"id": "a0", "role": "assistant", "parts": [], "metadata": {"k": 1}},
                parts_length=3,
            )
        )
        memory = store.get_history(sid)[-1]
        store.db  # noqa: B018 - fold
        store._forget()  # noqa: SLF001 - read the file, not the cache
        stored = store.get_history(sid)[-1]
        assert stored == memory
        assert [p["text"] for p in stored["parts"]] == ["p0", "new", "p2"]
        assert stored["metadata"] == {"k": 1}
    finally:
        store.close()


def test_the_journal_is_off_for_memory_and_shared_databases(tmp_path: Path) -> None:
    memory = DuckDBSessionStore(":memory:")
    assert memory._state.pending is None  # noqa: SLF001
    memory.close()
    direct = DuckDBSessionStore(tmp_path / "b.duckdb", journal=False)
    sid = direct.create_session().id
    direct.append_message(sid, _msg("u0"))
    assert not journal_path(tmp_path / "b.duckdb").exists()
    direct.close()


def test_a_failing_append_acknowledges_nothing(tmp_path: Path, monkeypatch) -> None:
    store, sid = _started(tmp_path / "a.duckdb")
    try:

        def full(*_: Any) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "fdatasync", full)
        with pytest.raises(OSError, match="No space"):
            store.append_message(sid, _msg("u0"))
        monkeypatch.undo()
        assert _ids(store, sid) == []
        assert store.message_session("u0") is None
    finally:
        store.close()
    reopened = DuckDBSessionStore(tmp_path / "a.duckdb")
    try:
        assert _ids(reopened, sid) == []  # the frame written before the failure is gone
    finally:
        reopened.close()


def test_past_the_id_limit_the_file_answers_and_is_asked_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from thinkray.storage import session_store

    monkeypatch.setattr(session_store, "_MAX_IDS", 3)
    store, sid = _started(tmp_path / "a.duckdb")
    try:
        _turns(store, sid, range(3))  # 6 messages: past the limit once folded
        store.db  # noqa: B018 - fold
        store._forget()  # noqa: SLF001 - as after any other write: ids read again
        store.get_history(sid)
        with store.counting() as count:
            _turns(store, sid, range(3, 6))
        reads = [s for s in count.log if s.startswith("SELECT id FROM messages")]
        assert len(reads) == 1, count.log  # tried once, then the file answers
        assert store.append_message(sid, _msg("u1")) is False  # still refused
        assert _ids(store, sid)[-2:] == ["u5", "a5"]
    finally:
        store.close()


def test_writes_after_a_clean_reopen_are_numbered_past_the_folded_mark(tmp_path: Path) -> None:
    """A reopen without a journal learns where numbering goes on from the fold's mark
    (read with the sequence maxima, one statement): a write journaled then and lost in
    a crash must be replayed, not skipped as already folded."""
    path = tmp_path / "a.duckdb"
    store, sid = _started(path)
    _turns(store, sid, range(3))
    store.close()  # folded: the mark says 6, no journal left
    assert not journal_path(path).exists()
    store = DuckDBSessionStore(path)
    store.get_history(sid)
    store.append_message(sid, _msg("u3"))
    assert [r["n"] for r in read_records(journal_path(path))] == [7]
    store._state.journal.close()  # noqa: SLF001 - a crash: nothing folded or closed
    store._state.pending = None  # noqa: SLF001
    store._database.close()  # noqa: SLF001
    reopened = DuckDBSessionStore(path)
    try:
        assert _ids(reopened, sid)[-2:] == ["a2", "u3"]
    finally:
        reopened.close()


# -- progress flushes: written through, synced by the next durable write ------------------


def _progress(sid: str, turn: int, parent: str, step: int) -> StreamFlush:
    """A timer's flush in the middle of answer ``turn``: its text so far and a chunk."""
    return StreamFlush(
        sid,
        message={"id": f"a{turn}", "role": "assistant", "parts": []},
        parent_id=parent,
        use_head=False,
        parts=[PartWrite(f"a{turn}", 0, {"type": "text", "text": f"answer {turn}.{step}"})],
        chunks=[ChunkWrite(f"run{turn}", step, {"type": "d", "i": step})],
        durable=False,
    )


def _frames(path: Path) -> list[tuple[int, int]]:
    """``(offset, length)`` of each frame of a journal."""
    import struct

    data, at, out = path.read_bytes(), 0, []
    while at + 8 <= len(data):
        (length,) = struct.unpack_from("<I", data, at)
        out.append((at, 8 + length))
        at += 8 + length
    return out


def test_progress_flushes_are_not_synced_until_the_next_durable_write(tmp_path: Path) -> None:
    store, sid = _started(tmp_path / "a.duckdb")
    try:
        store.append_message(sid, _msg("u0"))
        journal = store._state.journal  # noqa: SLF001
        synced = journal.syncs
        for step in range(3):
            store.flush_stream(_progress(sid, 0, "u0", step))
        assert journal.syncs == synced  # written through to the OS, not synced
        assert journal.synced < journal.size
        assert len(read_records(journal.path)) == 4  # but in the file, in order
        store.flush_stream(_reply(sid, 0, "u0"))  # the end of the turn: durable
        assert journal.syncs == synced + 1
        assert journal.synced == journal.size  # everything before it went with it
        assert _ids(store, sid) == ["u0", "a0"]
    finally:
        store.close()


_PROGRESS_CHILD = """
import os, signal, sys
sys.path.insert(0, {repo!r})
from tests.test_journal import _msg, _progress, _started
store, sid = _started({path!r})
store.append_message(sid, _msg("u0"))
for step in range(3):
    store.flush_stream(_progress(sid, 0, "u0", step))
print("acknowledged", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_progress_flushes_survive_a_sigkill_of_their_process(tmp_path: Path) -> None:
    path = tmp_path / "a.duckdb"
    sigkilled_child(_PROGRESS_CHILD, path=str(path))
    store = DuckDBSessionStore(path)
    try:
        assert _ids(store, "s1") == ["u0", "a0"]
        assert store.get_message("a0")["parts"][0]["text"] == "answer 0.2"
        assert store.get_chunks("run0") == [{"type": "d", "i": i} for i in range(3)]
    finally:
        store.close()


def _left_as_a_crash_would(store: DuckDBSessionStore) -> None:
    """Close the file and the journal without folding it, as a crash leaves them."""
    store._state.journal.close()  # noqa: SLF001
    store._state.pending = None  # noqa: SLF001
    store._database.close()  # noqa: SLF001


def test_a_progress_flush_torn_by_a_power_loss_is_dropped_with_what_follows(
    tmp_path: Path,
) -> None:
    # A power loss can tear an unsynced frame while a later one reached the disk.
    # Neither was acknowledged as durable: both go, the durable ones before stay.
    path = tmp_path / "a.duckdb"
    store, sid = _started(path)
    store.append_message(sid, _msg("u0"))  # durable
    store.flush_stream(_progress(sid, 0, "u0", 0))
    store.flush_stream(_progress(sid, 0, "u0", 1))
    _left_as_a_crash_would(store)
    data = bytearray(journal_path(path).read_bytes())
    (_, _), (torn, _), (_, _) = _frames(journal_path(path))
    data[torn + 12] ^= 0xFF  # inside the first progress flush's payload
    journal_path(path).write_bytes(bytes(data))
    reopened = DuckDBSessionStore(path)
    try:
        assert _ids(reopened, sid) == ["u0"]
        assert reopened.get_chunks("run0") == []
    finally:
        reopened.close()


def test_damage_to_a_record_a_later_one_says_was_synced_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.duckdb"
    store, sid = _started(path)
    store.append_message(sid, _msg("u0"))
    store.flush_stream(_progress(sid, 0, "u0", 0))
    store.flush_stream(_reply(sid, 0, "u0"))  # durable: syncs the progress flush too
    store.append_message(sid, _msg("u1"))  # says the bytes before it were synced
    _left_as_a_crash_would(store)
    data = bytearray(journal_path(path).read_bytes())
    damaged = _frames(journal_path(path))[1][0]
    data[damaged + 12] ^= 0xFF
    journal_path(path).write_bytes(bytes(data))
    with pytest.raises(CorruptDatabaseError, match="journal"):
        DuckDBSessionStore(path)


def test_a_journal_of_bare_records_is_still_read(tmp_path: Path) -> None:
    import zlib

    import msgpack

    # frames as the journal wrote them before they said how far the file was synced
    records = [{"n": 1, "x": "one"}, {"n": 2, "x": "two"}]
    data = b""
    for record in records:
        payload = msgpack.packb(record, use_bin_type=True)
        data += len(payload).to_bytes(4, "little") + zlib.crc32(payload).to_bytes(4, "little")
        data += payload
    (tmp_path / "old.journal").write_bytes(data)
    assert read_records(tmp_path / "old.journal") == records
    damaged = bytearray(data)
    damaged[10] ^= 0xFF  # a bare record before another: damage, as before
    (tmp_path / "old.journal").write_bytes(bytes(damaged))
    with pytest.raises(CorruptDatabaseError):
        read_records(tmp_path / "old.journal")


def test_progress_flushes_do_not_bring_a_fold_forward(tmp_path: Path) -> None:
    # A streaming turn writes a progress flush every 30 ms; counted like durable
    # writes they folded the journal into DuckDB every 64 of them, on the agents' loop.
    store, sid = _started(tmp_path / "a.duckdb")
    try:
        store.append_message(sid, _msg("u0"))
        with store._database.counting() as count:  # noqa: SLF001
            for step in range(200):
                store.flush_stream(_progress(sid, 0, "u0", step))
        assert count.statements == 0, count.log  # no fold
        assert store.get_chunks("run0")[-1] == {"type": "d", "i": 199}  # a read folds
    finally:
        store.close()


def test_a_wakes_open_generations_read_leaves_the_run_id_check_nothing_to_read(
    tmp_path: Path,
) -> None:
    """A wake asks for the generations a crash cut off; the same scan gives every
    generation, so the first turn's run-id check (``chunk_generations``) reads nothing."""
    path = tmp_path / "a.duckdb"
    store, sid = _started(path)
    _turns(store, sid, range(2))
    store.flush_stream(StreamFlush(sid, chunks=[ChunkWrite("run0", 5, {"type": "f"}, True)]))
    store.flush_stream(StreamFlush(sid, chunks=[ChunkWrite("cut", 0, {"type": "d"})]))
    store.close()
    again = DuckDBSessionStore(path)
    try:
        assert again.open_generations() == ["run1", "cut"]  # oldest first, finished gone
        with again.counting() as count:
            assert again.chunk_generations() == ["run0", "run1", "cut"]
        assert count.statements == 0
    finally:
        again.close()


# -- deferred syncs (agent hosts sync off their event loop) ------------------------------


def test_a_deferred_write_is_read_back_at_once_and_synced_by_sync_deferred(
    tmp_path: Path,
) -> None:
    store, sid = _started(tmp_path / "a.duckdb")
    try:
        journal = store._state.journal  # noqa: SLF001
        store.sync_deferred()  # nothing owed: no sync
        synced = journal.syncs
        with store.defer_syncs(), store.defer_syncs():  # blocks nest
            store.append_message(sid, _msg("u0"))
        assert journal.syncs == synced  # written to the OS, not synced
        assert journal.synced < journal.size
        assert len(read_records(journal.path)) == 1
        assert _ids(store, sid) == ["u0"]  # reads see it at once
        store.append_message(sid, _msg("u1"))  # outside the block: durable as before
        assert journal.syncs == synced + 1 and journal.synced == journal.size
        store.sync_deferred()  # the durable write took the deferred one along: no sync
        assert journal.syncs == synced + 1
        with store.defer_syncs():
            store.flush_stream(_reply(sid, 1, "u1"))
        store.sync_deferred()
        assert journal.syncs == synced + 2 and journal.synced == journal.size
        store.sync_deferred()  # owed nothing any more
        assert journal.syncs == synced + 2
    finally:
        store.close()


_DEFERRED_CHILD = """
import os, signal, sys
sys.path.insert(0, {repo!r})
from tests.test_journal import _msg, _started
store, sid = _started({path!r})
with store.defer_syncs():
    store.append_message(sid, _msg("u0"))
print("acknowledged", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_deferred_write_survives_a_sigkill_of_its_process(tmp_path: Path) -> None:
    path = tmp_path / "a.duckdb"
    sigkilled_child(_DEFERRED_CHILD, path=str(path))
    store = DuckDBSessionStore(path)
    try:
        assert _ids(store, "s1") == ["u0"]  # in the OS's hands: a process crash keeps it
    finally:
        store.close()


def test_a_failed_deferred_sync_raises_and_stays_owed(tmp_path: Path, monkeypatch) -> None:
    store, sid = _started(tmp_path / "a.duckdb")
    try:
        journal = store._state.journal  # noqa: SLF001
        with store.defer_syncs():
            store.append_message(sid, _msg("u0"))
        real = os.fdatasync

        def failing(fd: int) -> None:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(os, "fdatasync", failing)
        with pytest.raises(OSError, match="Input/output"):
            store.sync_deferred()
        assert journal.synced < journal.size
        monkeypatch.setattr(os, "fdatasync", real)
        store.sync_deferred()  # still owed: the next call syncs it
        assert journal.synced == journal.size
    finally:
        store.close()


def test_a_sync_that_outlives_its_journal_changes_nothing(tmp_path: Path, monkeypatch) -> None:
    """sync() may run in a worker thread while the owner folds and clears the journal:
    the sync finishes on its own descriptor and leaves the new file's marks alone."""
    import threading

    store, sid = _started(tmp_path / "a.duckdb")
    try:
        journal = store._state.journal  # noqa: SLF001
        with store.defer_syncs():
            store.append_message(sid, _msg("u0"))
        entered, release = threading.Event(), threading.Event()
        real = os.fdatasync

        def held(fd: int) -> None:
            entered.set()
            assert release.wait(10)
            real(fd)

        monkeypatch.setattr(os, "fdatasync", held)
        worker = threading.Thread(target=store.sync_deferred)
        worker.start()
        assert entered.wait(10)
        monkeypatch.setattr(os, "fdatasync", real)
        store.close()  # folds and clears the journal under the sync in flight
        release.set()
        worker.join(10)
        assert not worker.is_alive()
        assert journal.size == 0 and journal.synced == 0  # not raised past the file
    finally:
        release.set()
        store.close()


def _count_folder_syncs(monkeypatch) -> list[str]:
    """Every fsync of a folder from now on (by the blank's copy or the journal)."""
    import stat

    seen: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            seen.append("folder")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def test_a_new_file_and_its_journal_are_named_under_one_folder_sync(
    tmp_path: Path, monkeypatch
) -> None:
    folder_syncs = _count_folder_syncs(monkeypatch)
    path = tmp_path / "new.duckdb"
    store = DuckDBSessionStore(path)
    try:
        assert folder_syncs == ["folder"]  # the file and its journal's name, together
        assert journal_path(path).exists()
        sid = store.create_session().id  # a new agent's first turn writes the journal
        store.append_message(sid, _msg("u0"))
        assert folder_syncs == ["folder"]  # and syncs no folder again
        assert len(read_records(journal_path(path))) == 2
    finally:
        store.close()
    again = DuckDBSessionStore(path)
    try:
        assert _ids(again, sid) == ["u0"]
    finally:
        again.close()


def test_an_empty_journal_beside_a_file_is_not_replayed(tmp_path: Path) -> None:
    store, sid = _started(tmp_path / "a.duckdb")
    _turns(store, sid, range(2))
    store.close()
    journal_path(tmp_path / "a.duckdb").touch()  # a crash between its creation and a write
    again = DuckDBSessionStore(tmp_path / "a.duckdb")
    try:
        assert _ids(again, sid) == ["u0", "a0", "u1", "a1"]
        _turns(again, sid, range(2, 3))
        assert _ids(again, sid)[-2:] == ["u2", "a2"]
    finally:
        again.close()


def test_the_typical_sync_follows_how_long_syncs_take(tmp_path: Path, monkeypatch) -> None:
    import time

    from thinkray.storage import journal as journal_module

    monkeypatch.setattr(journal_module, "_typical_sync", [0.0])
    real = os.fdatasync

    def slow(fd: int) -> None:
        time.sleep(0.005)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", slow)
    store, sid = _started(tmp_path / "a.duckdb")
    try:
        for turn in range(10):
            store.append_message(sid, _msg(f"u{turn}"))  # a synced append each
        assert journal_module.typical_sync_seconds() >= 0.001  # a sleep never ends early
    finally:
        store.close()
