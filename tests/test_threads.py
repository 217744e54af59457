"""Seed 001 on the DuckDB store: threads and clone, beyond the conformance suite.

What is specific to DuckDB here: a clone is ONE ``INSERT ... SELECT`` for messages and
one for parts whatever the history's length (new ids computed in SQL), nothing is
executed on bad input, and threads live beside the sessions ``Think`` uses.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from thinkray.runtime import SessionBusyError, Think
from thinkray.runtime.models.testing import ScriptedModel, reply
from thinkray.storage.session_store import DuckDBSessionStore
from thinkray.storage.testing.session_store_suite import chain, ids, msg
from thinkray.storage.types import (
    InvalidInputError,
    NotOnPathError,
    ThreadExistsError,
    ThreadNotFoundError,
)


class Spy:
    """Stands in for the DuckDB connection and records every statement."""

    def __init__(self, con: Any) -> None:
        self.con = con
        self.sql: list[str] = []

    def execute(self, sql: str, params: Any = None) -> Any:
        self.sql.append(" ".join(sql.split()))
        return self.con.execute(sql) if params is None else self.con.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.con, name)

    def writes(self) -> list[str]:
        return [s for s in self.sql if s.split(" ", 1)[0] in ("INSERT", "UPDATE", "DELETE")]


@pytest.fixture
def spy(store: DuckDBSessionStore) -> Iterator[Spy]:
    real = store.db._con
    s = Spy(real)
    store.db._con = s  # type: ignore[assignment]
    yield s
    store.db._con = real


def conversation(n: int, prefix: str = "m") -> list[dict[str, Any]]:
    return [
        msg(
            f"{prefix}{i}",
            "user" if i % 2 == 0 else "assistant",
            parts=[{"type": "step-start"}, {"type": "text", "text": f"t{i}"}],
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("n", [3, 400])
def test_clone_is_one_insert_select_per_table(store: DuckDBSessionStore, spy: Spy, n: int) -> None:
    src = store.thread("src")
    store.append_messages(src.id, conversation(n))
    spy.sql.clear()
    dst = store.clone_thread("src", "dst")
    inserts = [s for s in spy.writes() if s.startswith("INSERT")]
    assert [s.split()[2] for s in inserts] == ["sessions", "messages"]  # parts come with their rows
    for statement in inserts[1:]:
        assert "SELECT" in statement and "VALUES" not in statement
    assert len(spy.writes()) == 2  # and nothing else is written
    copied = dst.get_messages()
    assert len(copied) == n and [m["parts"] for m in copied] == [
        m["parts"] for m in src.get_messages()
    ]


def test_clone_with_hidden_and_branched_history_is_still_two_statements(
    store: DuckDBSessionStore, spy: Spy
) -> None:
    src = store.thread("src")
    store.append_messages(src.id, conversation(40))
    store.append_message(src.id, msg("alt"), parent_id="m10")  # an abandoned branch
    store.set_head(src.id, "m39")
    store.set_hidden(src.id, ["m5", "m6"], 1.0)
    spy.sql.clear()
    dst = store.clone_thread("src", "dst", from_message_id="m30")
    inserts = [s for s in spy.writes() if s.startswith("INSERT")]
    assert [s.split()[2] for s in inserts] == ["sessions", "messages"]  # parts come with their rows
    texts = [m["parts"][1]["text"] for m in dst.get_messages()]
    assert texts == [f"t{i}" for i in range(31) if i not in (5, 6)]
    assert store.message_count(dst.id, include_hidden=True) == 29


def test_copy_ids_are_computed_from_the_source_ids(store: DuckDBSessionStore) -> None:
    src = store.thread("src")
    chain(store, src.id, "u1", "a1", "u2")
    rows = store.get_path(store.clone_thread("src", "dst").id)
    salt = rows[0].id[: -len("u1")]
    assert re.fullmatch(r"c[0-9a-f]{12}_", salt)
    assert [r.id for r in rows] == [salt + "u1", salt + "a1", salt + "u2"]
    assert [r.parent_id for r in rows] == [None, salt + "u1", salt + "a1"]
    src_seq = max(r.seq for r in store.get_path(src.id))
    assert [r.seq for r in rows] == [src_seq + 1, src_seq + 2, src_seq + 3]
    # A second clone of the same source gets different ids.
    assert not {r.id for r in rows} & {
        r.id for r in store.get_path(store.clone_thread("src", "again").id)
    }


def test_bad_input_executes_no_write(store: DuckDBSessionStore, spy: Spy) -> None:
    src = store.thread("src")
    chain(store, src.id, "u1", "a1")
    store.set_hidden(src.id, ["a1"], 1.0)
    store.thread("dst")
    spy.sql.clear()
    for call, error in (
        (lambda: store.thread("../etc"), InvalidInputError),
        (lambda: store.clone_thread("src", "bad key"), InvalidInputError),
        (lambda: store.clone_thread("src", "dst"), ThreadExistsError),
        (lambda: store.clone_thread("src", "new", from_message_id="a1"), NotOnPathError),
        (lambda: store.rewind_session(src.id, "a1"), NotOnPathError),
    ):
        with pytest.raises(error):
            call()
    assert spy.writes() == []


def test_deleting_a_thread_removes_its_rewind_log(store: DuckDBSessionStore) -> None:
    t = store.thread("t")
    chain(store, t.id, "u1", "a1")
    store.rewind_session(t.id, "u1")
    assert store.db.fetchall("SELECT key FROM config WHERE key LIKE 'sessions.rewinds:%'")
    store.delete_thread("t")
    assert not store.db.fetchall("SELECT key FROM config WHERE key LIKE 'sessions.rewinds:%'")


async def test_existing_think_callers_are_unaffected(store: DuckDBSessionStore) -> None:
    """No key anywhere = behaviour unchanged: Think's sessions are not threads, and the
    default thread is its own session beside them."""
    agent = Think(store, model=ScriptedModel([reply("one"), reply("two")]))
    await agent.chat("hello")
    sid = agent.current_session_id
    assert sid is not None
    assert store.list_threads() == []
    default = store.thread()
    default.append(msg("d1"))
    assert default.id != sid
    assert [m["role"] for m in agent.get_history()] == ["user", "assistant"]
    # A thread is a session: Think can run turns in it.
    result = await agent.chat("in the thread", session_id=default.id)
    assert result.text == "two"
    assert ids(default.get_messages())[0] == "d1" and len(default.get_messages()) == 3
    assert [i.thread_key for i in store.list_threads()] == ["default"]
    assert len(agent.get_sessions()) == 2


async def test_threads_through_think(store: DuckDBSessionStore) -> None:
    """The seed-001 API on the agent (so the session actor reaches it through
    ``invoke``): rows, not handles, since a handle holds the store."""
    agent = Think(store, model=ScriptedModel([reply("a", delay=0.01), reply("b")], loop=True))
    info = agent.thread("research")
    assert info.thread_key == "research" and agent.thread("research").id == info.id
    await agent.chat("question", session_id=info.id)
    run = agent.start_chat("more", session_id=info.id)
    with pytest.raises(SessionBusyError):
        agent.clone_thread("research", "copy")  # a clone cannot fork a running turn
    await run.task
    copy = agent.clone_thread("research", "copy")
    assert copy.thread_key == "copy" and copy.parent_session_id == info.id
    assert [m["role"] for m in agent.get_history(copy.id)] == ["user", "assistant"] * 2
    assert [t.thread_key for t in agent.list_threads()] == ["copy", "research"]
    agent.switch_session(copy.id)
    agent.delete_thread("copy")
    assert agent.current_session_id is None
    assert [t.thread_key for t in agent.list_threads()] == ["research"]
    with pytest.raises(ThreadNotFoundError):
        agent.delete_thread("copy")
