"""The turn's write path (issue 23): how many DuckDB statements and commits a turn
costs, counted through :meth:`Database.counting` (no timing). A turn without tools
commits at most three times (the user message, the batches, the end of the turn); an
inline tool call adds nothing beyond its step's one write (the step's calls decided),
however many calls the step makes, and through the journal (a store on its own file)
neither costs a commit or, once the file's ids are known, a statement at all. The recorder's timer is pushed out of the way
(``flush_interval``) so that only the structural writes are counted, whatever the
machine's load."""

from __future__ import annotations

from typing import Any

import pytest
from thinkray.runtime import Think, tool
from thinkray.runtime.errors import DuplicateRunError
from thinkray.runtime.models.testing import ScriptedModel, reply, tool_call
from thinkray.storage.db import StatementCount
from thinkray.storage.session_store import DuckDBSessionStore

from tests.conftest import Collector

TEXT = [f"w{i} " for i in range(200)]
ran: list[str] = []


@tool
def lookup(query: str) -> dict:
    """Echoes the query."""
    ran.append(query)
    return {"query": query, "hits": 3}


def _agent(path: Any, replies: list[Any], *, journal: bool = True) -> Think:
    agent = Think(DuckDBSessionStore(path, journal=journal), model=ScriptedModel(replies))
    agent.get_tools = lambda: {"lookup": lookup}  # type: ignore[method-assign]
    agent.flush_interval = 3600.0  # only the structural writes: no timer batches
    agent.tool_input_gate = 3600.0  # nor the gate's timer (a loaded machine could fire it)
    return agent


async def _counted(
    agent: Think, text: str, run_id: str | None = None
) -> tuple[StatementCount, Any]:
    db = agent.store.db  # type: ignore[attr-defined]
    collector = Collector()
    with db.counting() as count:
        result = await agent.chat(text, collector, run_id=run_id)
    assert result.status == "completed", result.error
    return count, result


def _calls(n: int, turn: int) -> list[Any]:
    return [tool_call("lookup", {"query": f"t{turn} c{i}"}, id=f"c{turn}-{i}") for i in range(n)]


async def test_a_turn_without_tools_commits_at_most_three_times(tmp_path):
    agent = _agent(tmp_path / "a.duckdb", [reply(*TEXT) for _ in range(3)])
    try:
        await agent.chat("warm up")  # the session and the tables are made once
        for turn in range(2):
            count, _ = await _counted(agent, f"turn {turn}")
            assert count.commits <= 3, count.log
            # the user message, the turn's end, and what each needs to read first
            assert count.statements <= 12, count.log
    finally:
        agent.close()


async def test_a_turn_with_a_caller_chosen_run_id_runs_no_statement(tmp_path):
    # Every turn through an actor carries the caller's run id (exactly-once): checking
    # that it is new reads the chunk log's generations, which memory keeps; it once
    # folded the whole journal into DuckDB each turn (half an actor turn's CPU).
    agent = _agent(tmp_path / "a.duckdb", [reply(*TEXT) for _ in range(4)])
    try:
        await agent.chat("warm up", run_id="r0")  # the session, tables, generations
        for turn in range(1, 3):
            count, result = await _counted(agent, f"turn {turn}", run_id=f"r{turn}")
            assert result.run_id == f"r{turn}"
            assert count.statements == 0, count.log
        with pytest.raises(DuplicateRunError):  # still refused: the log knows r1
            await agent.chat("again", run_id="r1")
    finally:
        agent.close()
    again = _agent(tmp_path / "a.duckdb", [reply(*TEXT)])
    try:  # after a reopen, the file's generations are read once and still refuse it
        with pytest.raises(DuplicateRunError):
            await again.chat("again", run_id="r2")
    finally:
        again.close()


@pytest.mark.parametrize("journal", [True, False])
@pytest.mark.parametrize("calls", [1, 3])
async def test_an_inline_tool_call_adds_no_commit_beyond_its_step(tmp_path, calls, journal):
    ran.clear()
    replies = [reply(*TEXT)]
    for turn in range(2):
        replies += [reply(*_calls(calls, turn), *TEXT), reply(*TEXT[:50])]
    agent = _agent(tmp_path / "a.duckdb", replies, journal=journal)
    try:
        plain, _ = await _counted(agent, "no tools")
        for turn in range(2):
            count, result = await _counted(agent, f"turn {turn}")
            if journal:
                # the step's batch (its calls' rows, claimed, with their parts and
                # chunks) and the results are journal appends: no commit, and after the
                # first tool turn read the ledger's ids, no statement
                assert count.commits == 0, count.log
                assert count.statements <= (1 if turn == 0 else 0), count.log
            else:
                # one more durable write than a turn without tools: the step's calls
                # decided (their rows, claimed, with their parts and chunks); their
                # results land with the turn's end
                assert count.commits <= plain.commits + 1, count.log
            rows = agent.list_tool_calls(run_id=result.run_id)
            assert [r["status"] for r in rows] == ["completed"] * calls
            assert all(r["attempts"] == 1 for r in rows)
        assert len(ran) == 2 * calls  # each call ran once
    finally:
        agent.close()


async def test_the_counting_seam_sees_every_commit(tmp_path):
    store = DuckDBSessionStore(tmp_path / "a.duckdb", journal=False)  # each write commits
    try:
        sid = store.create_session().id
        with store.db.counting() as count:
            store.append_message(sid, {"id": "m1", "role": "user", "parts": []})
            store.set_config("k", 1)
            store.delete_config("k")  # one autocommit statement
        assert count.commits == 3
        assert count.writes >= 3
    finally:
        store.close()


def test_a_long_chunk_run_is_stored_compressed_and_old_rows_still_read(tmp_path):
    import msgpack
    from thinkray.storage.types import ChunkWrite, StreamFlush

    store = DuckDBSessionStore(tmp_path / "a.duckdb")
    try:
        sid = store.create_session().id
        chunks = [{"type": "text-delta", "id": "t", "delta": f"w{i} "} for i in range(200)]
        writes = [ChunkWrite("run-1", i, c) for i, c in enumerate(chunks)]
        store.flush_stream(StreamFlush(session_id=sid, chunks=writes))
        [(payload,)] = store.db.fetchall("SELECT payload FROM chunks WHERE generation_id = 'run-1'")
        raw = msgpack.packb(chunks, use_bin_type=True)
        assert payload[0] == 0x78 and len(payload) < len(raw) / 3  # zlib, much smaller
        assert store.get_chunks("run-1") == chunks
        assert store.get_chunks("run-1", 150) == chunks[150:]
        # a run written before compression (a plain msgpack array) reads as it did
        store.db.execute("INSERT INTO chunks VALUES ('run-0', 0, ?, true, 0, 200)", [raw])
        assert store.get_chunks("run-0") == chunks
    finally:
        store.close()


async def test_a_wake_with_nothing_open_reads_a_handful_of_statements(tmp_path):
    """A wake (the store opened, the agent constructed) of an agent with no open tool
    call, fiber or run: its recovery asks the file only about what it holds (it was 22
    statements and a DuckDB instance of its own; the in-process wake went from ~36 to
    ~10 ms of CPU). The open counts the fibers and jobs, found empty: not read again."""
    ran.clear()
    path = tmp_path / "a.duckdb"
    agent = _agent(path, [reply(*_calls(1, 0), *TEXT), reply(*TEXT[:50])])
    await agent.chat("one turn with a tool call")
    agent.close()
    store = DuckDBSessionStore(path)
    try:
        with store.counting() as count:
            woken = Think(store, model=ScriptedModel([]))
        assert woken.recovered_tool_calls == {"retried": 0, "failed": 0, "expired": 0, "lapsed": 0}
        assert count.commits == 0, count.log
        assert count.statements <= 4, count.log
        assert not any("fibers" in s or "jobs" in s for s in count.log), count.log
    finally:
        store.close()


async def test_the_first_turn_after_a_wake_commits_nothing(tmp_path):
    """Its user message is journaled once the history is in memory: the turn's own read
    of the history then folds nothing into DuckDB (it committed a fold of that message
    first: 12 statements, one commit), and the wake's open-generations scan leaves the
    run-id check nothing to read."""
    path = tmp_path / "a.duckdb"
    agent = _agent(path, [reply(*TEXT)])
    await agent.chat("before the hibernation", run_id="r0")
    agent.close()
    woken = _agent(path, [reply(*TEXT)])
    try:
        count, _ = await _counted(woken, "after the wake", run_id="r1")
        assert count.commits == 0, count.log
        assert not any(s.lstrip().upper().startswith("INSERT") for s in count.log), count.log
        assert [m["role"] for m in woken.store.get_history(woken.current_session_id)] == [
            "user",
            "assistant",
            "user",
            "assistant",
        ]
    finally:
        woken.close()


async def test_a_turns_timed_batches_are_progress_and_its_durable_points_are_synced(
    tmp_path, monkeypatch
):
    # The recorder's timer flushes (every flush_interval mid-stream) skip the disk's
    # sync; the user message and the end of the turn are synced (an agent host streams
    # hundreds of agents from one loop: an fdatasync per timed batch stalled it).
    from thinkray.storage.journal import Journal

    appends: list[bool] = []
    real_append = Journal.append

    def noting(self, record, *, sync=True):
        appends.append(sync)
        return real_append(self, record, sync=sync)

    monkeypatch.setattr(Journal, "append", noting)
    agent = _agent(tmp_path / "a.duckdb", [reply(*TEXT[:40], delay=0.002) for _ in range(2)])
    agent.flush_interval = 0.005  # several timed batches in a turn
    try:
        await agent.chat("warm up")
        appends.clear()
        await agent.chat("a streamed answer")
        assert appends.count(False) >= 2, appends  # timed batches: not synced
        assert appends[0] is True and appends[-1] is True, appends  # message, end
    finally:
        agent.close()


async def test_many_chats_streaming_on_one_agent_still_write_through_the_journal(tmp_path):
    """More sessions streaming at once than the 16 a plain LRU kept: each run's batches
    used to find its session's entry evicted by the others' and took DuckDB's path
    (24 chats: ~115 statements and ~16 commits per turn). Entries in use stay."""
    import asyncio

    from thinkray.runtime.models.testing import pause

    chats = 24
    replies = [reply("a", pause(0.01), "b", pause(0.01), "c") for _ in range(2 * chats)]
    agent = _agent(tmp_path / "a.duckdb", replies)
    agent.flush_interval = 0.001  # batches in the pauses: every run uses its entry often
    try:
        sessions = [agent.create_session().id for _ in range(chats)]

        async def turns(tag: str) -> None:
            runs = [agent.start_chat(f"{tag} {i}", session_id=s) for i, s in enumerate(sessions)]
            results = await asyncio.gather(*(run.task for run in runs))
            assert {r.status for r in results} == {"completed"}

        await turns("warm up")  # each session's history is read once, into memory
        db = agent.store.db  # type: ignore[attr-defined]
        with db.counting() as count:
            await turns("turn")
        assert count.commits == 0, count.log
        assert count.statements == 0, count.log
        history = agent.get_history(session_id=sessions[-1])
        assert [m["role"] for m in history] == ["user", "assistant"] * 2
    finally:
        agent.close()


def test_sessions_out_of_use_leave_the_memory_cache(tmp_path, monkeypatch):
    """The bound on memory: beyond 16, an entry stays only while used in the last 30 s,
    never more than 256, and while the cached histories hold at most 50,000 messages."""
    import time as time_module

    from thinkray.storage import session_store as module

    store = DuckDBSessionStore(tmp_path / "a.duckdb")
    try:
        ids = [store.create_session().id for _ in range(40)]
        for sid in ids:
            store.get_history(sid)
        cache = store._state.cache
        assert len(cache) == 40  # all in use
        later = time_module.monotonic() + module._CACHE_IN_USE_S + 1
        monkeypatch.setattr(time_module, "monotonic", lambda: later)
        store.get_history(ids[0])  # in use again; the 39 others are idle
        store.create_session()
        assert len(cache) == module._CACHED_SESSIONS
        assert ids[0] in cache and ids[1] not in cache
        monkeypatch.setattr(module, "_CACHED_SESSIONS_IN_USE", 20)
        for sid in ids:
            store.get_history(sid)
        assert len(cache) == 20  # the cap, however recent
        monkeypatch.setattr(module, "_CACHED_SESSIONS_IN_USE", 256)
        long = ids[:20]
        for sid in long:
            store.append_message(sid, {"id": f"{sid}-m", "role": "user", "parts": []})
        monkeypatch.setattr(module, "_CACHED_MESSAGES", 17)
        for sid in long:
            store.get_history(sid)  # 20 histories of one message: over the budget of 17
        # the budget, checked as each read's row is remembered: its history joins after
        assert sum(len(e.path) for e in cache.values() if e.path) <= 17 + 1
        assert all(sid in cache for sid in long[-17:]) and long[0] not in cache
    finally:
        store.close()
