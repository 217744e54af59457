"""The DuckDB store keeps what it committed of recent sessions in memory (rows and
histories) and serves reads from it. These tests drive random sequences of every kind
of write — including writes that fail and transactions that roll back — and check
after each step that what the store answers equals what the file holds (read by a
fresh store on the same file), so a write that forgets to update or drop the cache
fails here."""

from __future__ import annotations

import contextlib
import random
from pathlib import Path
from typing import Any

import pytest
from thinkray.storage.db import Database
from thinkray.storage.session_store import DuckDBSessionStore
from thinkray.storage.types import (
    ChunkPrune,
    ChunkWrite,
    PartWrite,
    StorageError,
    StreamFlush,
)


class _Boom(Exception):
    pass


def _msg(mid: str, role: str, text: str) -> dict[str, Any]:
    return {"id": mid, "role": role, "parts": [{"type": "text", "text": text}]}


def _fresh_view(path: Path, db: Database, sids: list[str]) -> dict[str, Any]:
    """Every session's info and history as a store with nothing in memory reads them."""
    store = DuckDBSessionStore(db)
    state = db.state.pop("sessions")  # a store on this Database would share the cache
    try:
        return _view(store, sids)
    finally:
        db.state["sessions"] = state


def _view(store: DuckDBSessionStore, sids: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for sid in sids:
        info = store.get_session(sid)
        out[sid] = (
            info.head_id,
            info.usage,
            info.context_tokens,
            info.metadata,
            store.get_history(sid),
        )
    return out


class _Driver:
    """Random writes on a few sessions, each of the store's write paths."""

    def __init__(self, store: DuckDBSessionStore, rng: random.Random) -> None:
        self.store = store
        self.rng = rng
        self.sids = [store.create_session(f"s{i}").id for i in range(2)]
        self.n = 0
        self.open_run: dict[str, str] = {}  # session -> assistant message being streamed

    def new_id(self, kind: str) -> str:
        self.n += 1
        return f"{kind}{self.n}"

    def any_message(self, sid: str) -> str | None:
        history = self.store.get_history(sid)
        return self.rng.choice(history)["id"] if history else None

    def step(self) -> None:
        rng = self.rng
        sid = rng.choice(self.sids)
        op = rng.choice(
            [
                "append",
                "append",
                "append_dup",
                "append_under",
                "stream",
                "stream",
                "stream_more",
                "usage",
                "metadata",
                "rewind",
                "unrewind",
                "branch",
                "set_head",
                "upsert",
                "delete",
                "rollback",
                "bad_flush",
                "clear",
            ]
        )
        # Refused writes must leave memory and file agreeing too.
        with contextlib.suppress(StorageError):
            getattr(self, op)(sid)

    def append(self, sid: str) -> None:
        self.store.append_message(sid, _msg(self.new_id("u"), "user", "hi"))

    def append_dup(self, sid: str) -> None:
        target = self.any_message(self.rng.choice(self.sids))
        if target:
            assert not self.store.append_message(sid, _msg(target, "user", "again"))

    def append_under(self, sid: str) -> None:
        parent = self.any_message(sid)
        self.store.append_message(sid, _msg(self.new_id("u"), "user", "fork"), parent_id=parent)

    def stream(self, sid: str) -> None:
        history = self.store.get_history(sid)
        mid = self.new_id("a")
        self.open_run[sid] = mid
        self.store.flush_stream(
            StreamFlush(
                sid,
                message={"id": mid, "role": "assistant", "metadata": {"n": 1}, "parts": []},
                parent_id=history[-1]["id"] if history else None,
                use_head=False,
                parts=[PartWrite(mid, i, {"type": "text", "text": f"p{i}"}) for i in range(2)],
                chunks=[ChunkWrite(mid, i, {"type": "text-delta", "i": i}) for i in range(3)],
                usage=[{"input": 3, "output": 2}],
            )
        )

    def stream_more(self, sid: str) -> None:
        mid = self.open_run.get(sid)
        if mid is None:
            return
        rng = self.rng
        index = rng.choice([0, 1, 2, 3, 5])  # replace, append, or leave a gap
        self.store.flush_stream(
            StreamFlush(
                sid,
                message={"id": mid, "role": "assistant", "metadata": {"n": rng.random()}},
                parts=[PartWrite(mid, index, {"type": "text", "text": "more"})],
                parts_length=rng.choice([None, None, 1]),
                usage=[{"output": 1}],
                prune_chunks=ChunkPrune(keep=2),
            )
        )

    def usage(self, sid: str) -> None:
        self.store.add_usage(sid, {"input": 5, "cache_read": 1})

    def metadata(self, sid: str) -> None:
        self.store.update_session(sid, metadata={"k": self.rng.random()})

    def rewind(self, sid: str) -> None:
        users = [m["id"] for m in self.store.get_history(sid) if m["role"] == "user"]
        if users:
            self.store.rewind_session(sid, self.rng.choice(users))

    def unrewind(self, sid: str) -> None:
        self.store.unrewind_session(sid)

    def branch(self, sid: str) -> None:
        target = self.any_message(sid)
        if target:
            self.sids.append(self.store.branch_session(sid, target).id)

    def set_head(self, sid: str) -> None:
        self.store.set_head(sid, self.any_message(sid))

    def upsert(self, sid: str) -> None:
        target = self.any_message(sid)
        if target:
            self.store.upsert_message(sid, _msg(target, "user", "edited"))

    def delete(self, sid: str) -> None:
        target = self.any_message(sid)
        if target:
            self.store.delete_messages(sid, [target])

    def rollback(self, sid: str) -> None:
        # Cached writes inside a transaction that rolls back must not be remembered.
        with pytest.raises(_Boom), self.store.transaction():
            self.append(sid)
            self.stream(sid)
            self.usage(sid)
            raise _Boom

    def bad_flush(self, sid: str) -> None:
        self.store.flush_stream(
            StreamFlush(sid, parts=[PartWrite("no-such-message", 0, {"type": "text"})])
        )

    def clear(self, sid: str) -> None:
        if self.rng.random() < 0.2:
            self.store.clear_messages(sid)
            self.open_run.pop(sid, None)


@pytest.mark.parametrize("seed", range(6))
def test_memory_and_file_agree_after_every_write(tmp_path: Path, seed: int) -> None:
    path = tmp_path / "agent.duckdb"
    db = Database(path)
    store = DuckDBSessionStore(db)
    driver = _Driver(store, random.Random(seed))
    try:
        for _ in range(60):
            driver.step()
            assert _view(store, driver.sids) == _fresh_view(path, db, driver.sids)
        last = _view(store, driver.sids)
    finally:
        store.close()
        db.close()
    # And the file itself, reopened in a new connection, says the same.
    reopened = DuckDBSessionStore(path)
    try:
        assert _view(reopened, driver.sids) == last
    finally:
        reopened.close()


@pytest.mark.parametrize("journal", [False, True])
def test_a_turn_reads_nothing_and_writes_twice(tmp_path: Path, journal: bool) -> None:
    """The point of the cache: after a first read, appending a user message and
    flushing the reply serve every read from memory (no history query). Straight to
    DuckDB a turn is two transactions; through the journal, none (the journal folds
    them later, in one)."""
    store = DuckDBSessionStore(tmp_path / "a.duckdb", journal=journal)
    sid = store.create_session().id
    store.append_message(sid, _msg("u0", "user", "hi"))
    store.get_history(sid)
    statements: list[str] = []
    transactions: list[int] = []
    db = store.db
    real = db.transaction

    @contextlib.contextmanager
    def counting():  # type: ignore[no-untyped-def]
        transactions[-1] += 1
        with real() as con:

            class Spy:
                def execute(self, sql: str, *args: Any) -> Any:
                    statements.append(sql)
                    return con.execute(sql, *args)

            yield Spy()

    db.transaction = counting  # type: ignore[method-assign]
    try:
        for turn in range(3):
            transactions.append(0)
            store.append_message(sid, _msg(f"u{turn + 1}", "user", "hi"))
            history = store.get_history(sid)
            store.flush_stream(
                StreamFlush(
                    sid,
                    message={"id": f"a{turn}", "role": "assistant", "parts": []},
                    parent_id=history[-1]["id"],
                    use_head=False,
                    parts=[PartWrite(f"a{turn}", 0, {"type": "text", "text": "ok"})],
                    chunks=[ChunkWrite(f"a{turn}", i, {"type": "d"}) for i in range(5)],
                    usage=[{"input": 1}],
                    prune_chunks=ChunkPrune(keep=2),
                )
            )
            store.get_session(sid)
            if turn == 0:
                statements.clear()  # the first turn reads the chunk log's generations once
    finally:
        del db.transaction
    reads = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    assert reads == [], reads
    assert transactions == ([0, 0, 0] if journal else [2, 2, 2])
    assert [h["id"] for h in store.get_history(sid)][-2:] == ["u3", "a2"]
    assert store.get_session(sid).usage["prompt_tokens"] == 3
    assert store.chunk_generations() == ["a1", "a2"]
    store.close()
