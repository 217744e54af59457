"""Conformance suite for :class:`thinkray.storage.protocols.SessionStore`.

Every store implementation runs these tests. The importing module provides:

- ``store``: a fresh, empty store, closed by the fixture afterwards (whatever the test
  did to it).
- ``reopen``: a callable ``reopen(store) -> store`` that closes ``store`` and opens
  the same backing file again (the new store is also closed by the fixture), or
  ``None`` for a store that has no file; tests that need it then skip.

The classes follow the clauses of the protocol docstring. ``TestResolutions`` pins
down what the protocol leaves open, so that every implementation resolves it the
same way; each test there says which choice it checks.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from typing import Any

import pytest
from thinkray.storage.errors import DatabaseClosedError
from thinkray.storage.protocols import HEAD, SessionStore, Stores, Thread
from thinkray.storage.types import (
    DEFAULT_SETTINGS_KEY,
    DEFAULT_THREAD_KEY,
    ChunkWrite,
    InvalidInputError,
    MessageNotFoundError,
    NotOnPathError,
    PartWrite,
    RewindInfo,
    SessionInfo,
    SessionNotFoundError,
    StreamFlush,
    ThreadExistsError,
    ThreadNotFoundError,
    UnrewindInfo,
    empty_rollup,
)

__all__ = [
    "TestBranch",
    "TestChunkLog",
    "TestClone",
    "TestConfig",
    "TestFlushStream",
    "TestHiddenAndPath",
    "TestIdempotency",
    "TestInsertBefore",
    "TestLifecycle",
    "TestNotFound",
    "TestResolutions",
    "TestRewind",
    "TestSessions",
    "TestStores",
    "TestThreads",
    "TestTransactions",
    "TestTreeAndHead",
    "TestUsage",
    "TestValidation",
]


# -- helpers -----------------------------------------------------------------------


def msg(mid: str, role: str = "user", text: str | None = None, **extra: Any) -> dict[str, Any]:
    message: dict[str, Any] = {
        "id": mid,
        "role": role,
        "metadata": None,
        "parts": [{"type": "text", "text": text if text is not None else f"text of {mid}"}],
    }
    message.update(extra)
    return message


def ids(messages: list[dict[str, Any]]) -> list[str]:
    return [m["id"] for m in messages]


def chain(store: SessionStore, sid: str, *mids: str) -> None:
    """Append a linear conversation, alternating user/assistant."""
    for i, mid in enumerate(mids):
        assert store.append_message(sid, msg(mid, "user" if i % 2 == 0 else "assistant"))


def tool_part(call_id: str, state: str, **fields: Any) -> dict[str, Any]:
    return {
        "type": "dynamic-tool",
        "toolName": "search",
        "toolCallId": call_id,
        "state": state,
        **fields,
    }


RICH: dict[str, Any] = {
    "id": "rich",
    "role": "assistant",
    "metadata": {
        "usage": {"input": 12, "output": 5, "cache_read": 0},
        "createdAt": 1712345678.25,
        "tags": ["a", "b"],
        "nested": {"none": None, "bool": True, "neg": -3, "unicode": "héllo ✓ 你好"},
    },
    "parts": [
        {"type": "step-start"},
        {"type": "reasoning", "text": "thinking...", "state": "done"},
        {"type": "text", "text": "hi there", "state": "done"},
        tool_part("call-1", "output-available", input={"q": "x", "k": [1, 2.5]}, output="ok"),
        {"type": "data-compaction", "data": {"summary": "s", "tail_start_id": "m9"}},
        {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,AAAA"},
    ],
}


def assert_nothing_written(store: SessionStore, sid: str, before: SessionInfo) -> None:
    after = store.get_session(sid)
    assert after.head_id == before.head_id
    assert after.usage == before.usage
    assert after.metadata == before.metadata


UNKNOWN = "no-such-session"


# -- sessions ----------------------------------------------------------------------


class TestSessions:
    def test_create_and_get(self, store: SessionStore) -> None:
        info = store.create_session(
            "Research",
            metadata={"owner": "ana"},
            parent_session_id="p1",
            parent_message_id="pm1",
            thread_key="topic-a",
            model={"provider": "anthropic", "id": "claude"},
        )
        assert isinstance(info, SessionInfo)
        assert info.id and info.name == "Research"
        got = store.get_session(info.id)
        assert got.to_dict() == info.to_dict()
        assert got.metadata == {"owner": "ana"}
        assert got.parent_session_id == "p1" and got.parent_message_id == "pm1"
        assert got.thread_key == "topic-a"
        assert got.model == {"provider": "anthropic", "id": "claude"}
        assert got.head_id is None
        assert got.usage == empty_rollup()
        assert got.permissions == {} and got.settings == {}
        assert got.created_at <= got.updated_at
        assert abs(got.created_at - time.time()) < 60
        assert store.has_session(info.id)
        assert not store.has_session(UNKNOWN)

    def test_defaults_and_explicit_id(self, store: SessionStore) -> None:
        info = store.create_session(session_id="s-1")
        assert info.id == "s-1" and info.name == "New Chat"
        assert store.get_session("s-1").name == "New Chat"

    def test_generated_ids_are_unique(self, store: SessionStore) -> None:
        made = {store.create_session().id for _ in range(5)}
        assert len(made) == 5

    def test_list_most_recently_updated_first(self, store: SessionStore) -> None:
        a = store.create_session("a").id
        b = store.create_session("b").id
        c = store.create_session("c").id
        assert [s.id for s in store.list_sessions()] == [c, b, a]
        store.rename_session(a, "a2")
        assert [s.id for s in store.list_sessions()] == [a, c, b]
        store.append_message(b, msg("m1"))
        assert [s.id for s in store.list_sessions()] == [b, a, c]

    def test_list_filters_ephemeral(self, store: SessionStore) -> None:
        keep = store.create_session("keep").id
        side = store.create_session("side", metadata={"ephemeral": True}).id
        assert [s.id for s in store.list_sessions()] == [keep]
        listed = store.list_sessions(include_ephemeral=True)
        assert {s.id for s in listed} == {keep, side}
        assert [s.ephemeral for s in listed if s.id == side] == [True]

    def test_list_by_parent(self, store: SessionStore) -> None:
        root = store.create_session("root").id
        b1 = store.create_session("b1", parent_session_id=root).id
        b2 = store.create_session("b2", parent_session_id=root).id
        store.create_session("other", parent_session_id="elsewhere")
        assert [s.id for s in store.list_sessions(parent_session_id=root)] == [b2, b1]
        assert store.list_sessions(parent_session_id=b1) == []
        assert len(store.list_sessions()) == 4

    def test_rename(self, store: SessionStore) -> None:
        sid = store.create_session("old").id
        before = store.get_session(sid).updated_at
        store.rename_session(sid, "new")
        got = store.get_session(sid)
        assert got.name == "new"
        assert got.updated_at > before

    def test_update_merges_metadata_and_replaces_the_rest(self, store: SessionStore) -> None:
        sid = store.create_session(metadata={"a": 1, "b": {"x": 1}}, model={"id": "m1"}).id
        info = store.update_session(sid, metadata={"b": {"y": 2}, "c": 3})
        assert info.metadata == {"a": 1, "b": {"y": 2}, "c": 3}  # shallow merge
        assert info.model == {"id": "m1"}  # untouched
        info = store.update_session(
            sid,
            model={"id": "m2"},
            permissions={"tools": ["read"]},
            settings={"temperature": 0.5},
        )
        assert info.model == {"id": "m2"}
        assert info.permissions == {"tools": ["read"]}
        assert info.settings == {"temperature": 0.5}
        assert info.metadata == {"a": 1, "b": {"y": 2}, "c": 3}
        info = store.update_session(sid, permissions={"tools": []})
        assert info.permissions == {"tools": []}  # replaced, not merged
        assert store.get_session(sid).to_dict() == info.to_dict()

    def test_delete_session(self, store: SessionStore) -> None:
        sid = store.create_session().id
        other = store.create_session().id
        chain(store, sid, "m1", "m2")
        chain(store, other, "o1")
        store.delete_session(sid)
        assert not store.has_session(sid)
        assert store.get_message("m1") is None and store.get_message("m2") is None
        with pytest.raises(SessionNotFoundError):
            store.get_session(sid)
        assert ids(store.get_history(other)) == ["o1"]
        assert [s.id for s in store.list_sessions()] == [other]

    def test_clear_messages(self, store: SessionStore) -> None:
        sid = store.create_session("keep me", metadata={"k": 1}).id
        chain(store, sid, "m1", "m2")
        store.add_usage(sid, {"input": 10, "output": 5})
        store.clear_messages(sid)
        info = store.get_session(sid)
        assert info.name == "keep me" and info.metadata == {"k": 1}
        assert info.head_id is None
        assert info.usage == empty_rollup()
        assert store.get_history(sid) == []
        assert store.message_count(sid, include_hidden=True) == 0
        assert store.get_message("m1") is None
        assert store.append_message(sid, msg("m3"))
        assert ids(store.get_history(sid)) == ["m3"]


# -- not found ---------------------------------------------------------------------

SESSION_CALLS: dict[str, Callable[[SessionStore, str], Any]] = {
    "get_session": lambda s, sid: s.get_session(sid),
    "rename_session": lambda s, sid: s.rename_session(sid, "x"),
    "update_session": lambda s, sid: s.update_session(sid, metadata={"a": 1}),
    "add_usage": lambda s, sid: s.add_usage(sid, {"input": 1}),
    "set_usage": lambda s, sid: s.set_usage(sid, empty_rollup()),
    "delete_session": lambda s, sid: s.delete_session(sid),
    "clear_messages": lambda s, sid: s.clear_messages(sid),
    "append_message": lambda s, sid: s.append_message(sid, msg("nf-1")),
    "upsert_message": lambda s, sid: s.upsert_message(sid, msg("nf-1")),
    "flush_stream": lambda s, sid: s.flush_stream(
        StreamFlush(
            session_id=sid,
            message={"id": "nf-1", "role": "assistant", "metadata": None},
            parts=[PartWrite("nf-1", 0, {"type": "text", "text": "x"})],
            chunks=[ChunkWrite("nf-gen", 0, {"type": "start"})],
        )
    ),
    "get_history": lambda s, sid: s.get_history(sid),
    "get_path": lambda s, sid: s.get_path(sid),
    "message_count": lambda s, sid: s.message_count(sid),
    "set_head": lambda s, sid: s.set_head(sid, None),
    "delete_messages": lambda s, sid: s.delete_messages(sid, ["x"]),
    "set_hidden": lambda s, sid: s.set_hidden(sid, [], None),
}


class TestNotFound:
    def test_unknown_session_raises_and_creates_nothing(self, store: SessionStore) -> None:
        # One loop rather than one test per method: a fresh store per case costs more
        # than the case itself.
        for name, call in SESSION_CALLS.items():
            try:
                call(store, UNKNOWN)
            except SessionNotFoundError:
                pass
            else:
                pytest.fail(f"{name} did not raise SessionNotFoundError")
            assert not store.has_session(UNKNOWN), name
            assert store.list_sessions(include_ephemeral=True) == [], name
            assert store.get_message("nf-1") is None, name
            assert store.get_chunks("nf-gen") == [], name

    def test_not_found_is_a_key_error(self, store: SessionStore) -> None:
        with pytest.raises(KeyError):
            store.get_session(UNKNOWN)

    def test_unknown_message(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "m1")
        assert store.get_message("nope") is None
        assert store.get_message_row("nope") is None
        with pytest.raises(MessageNotFoundError):
            store.get_history(sid, leaf_id="nope")
        with pytest.raises(MessageNotFoundError):
            store.get_path(sid, leaf_id="nope")
        with pytest.raises(MessageNotFoundError):
            store.set_head(sid, "nope")
        with pytest.raises(MessageNotFoundError):
            store.append_message(sid, msg("m2"), parent_id="nope")
        assert store.get_message("m2") is None
        assert store.get_session(sid).head_id == "m1"

    def test_message_of_another_session_is_not_found(self, store: SessionStore) -> None:
        a = store.create_session().id
        b = store.create_session().id
        chain(store, a, "a1")
        chain(store, b, "b1")
        with pytest.raises(MessageNotFoundError):
            store.get_history(b, leaf_id="a1")
        with pytest.raises(MessageNotFoundError):
            store.set_head(b, "a1")
        with pytest.raises(MessageNotFoundError):
            store.append_message(b, msg("b2"), parent_id="a1")
        assert store.get_message("b2") is None


# -- validation --------------------------------------------------------------------

BAD_MESSAGES: dict[str, Any] = {
    "not a dict": ["id", "user"],
    "no id": {"role": "user", "parts": []},
    "empty id": {"id": "", "role": "user", "parts": []},
    "int id": {"id": 7, "role": "user", "parts": []},
    "bad role": {"id": "bad", "role": "robot", "parts": []},
    "no role": {"id": "bad", "parts": []},
    "parts not a list": {"id": "bad", "role": "user", "parts": {"type": "text"}},
    "no parts": {"id": "bad", "role": "user"},
    "part not a dict": {"id": "bad", "role": "user", "parts": ["hello"]},
    "part without type": {"id": "bad", "role": "user", "parts": [{"text": "x"}]},
    "part type not str": {"id": "bad", "role": "user", "parts": [{"type": 3}]},
    "metadata not a dict": {"id": "bad", "role": "user", "metadata": [1], "parts": []},
    "unserializable part": {
        "id": "bad",
        "role": "user",
        "parts": [{"type": "text", "text": "ok"}, {"type": "text", "text": object()}],
    },
}


class TestValidation:
    @pytest.mark.parametrize("method", ["append_message", "upsert_message"])
    def test_invalid_message_writes_nothing(self, store: SessionStore, method: str) -> None:
        sid = store.create_session().id
        chain(store, sid, "m1")
        before = store.get_session(sid)
        for case, bad in BAD_MESSAGES.items():
            try:
                getattr(store, method)(sid, copy.copy(bad))
            except InvalidInputError:
                pass
            else:
                pytest.fail(f"{method} accepted a message with {case}")
            assert store.message_count(sid, include_hidden=True) == 1, case
            assert store.get_message("bad") is None, case
            assert_nothing_written(store, sid, before)

    def test_invalid_input_is_a_value_error(self, store: SessionStore) -> None:
        sid = store.create_session().id
        with pytest.raises(ValueError):
            store.append_message(sid, {"id": "x", "role": "nobody", "parts": []})

    def test_invalid_upsert_keeps_existing_message(self, store: SessionStore) -> None:
        sid = store.create_session().id
        original = msg("m1", text="original")
        store.append_message(sid, original)
        with pytest.raises(InvalidInputError):
            store.upsert_message(sid, {"id": "m1", "role": "user", "parts": [{"text": "x"}]})
        assert store.get_message("m1") == original

    @pytest.mark.parametrize("bad", ["", "a\x00b", "line\n", "tab\tid", "x" * 257, 7])
    def test_unnameable_session_id_is_refused(self, store: SessionStore, bad: Any) -> None:
        # An id no route could name again (a NUL, a newline) must never be stored: such
        # a session could not be renamed or deleted afterwards.
        with pytest.raises(InvalidInputError):
            store.create_session(session_id=bad)
        assert store.list_sessions(include_ephemeral=True) == []
        assert store.create_session(session_id="ok id-1").id == "ok id-1"

    def test_invalid_session_fields(self, store: SessionStore) -> None:
        with pytest.raises(InvalidInputError):
            store.create_session(123)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError):
            store.create_session(metadata=["not", "a", "dict"])  # type: ignore[arg-type]
        assert store.list_sessions(include_ephemeral=True) == []
        sid = store.create_session(metadata={"a": 1}).id
        before = store.get_session(sid)
        with pytest.raises(InvalidInputError):
            store.update_session(sid, metadata="nope")  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError):
            store.update_session(sid, metadata={"bad": object()})
        assert store.get_session(sid).to_dict() == before.to_dict()

    def test_invalid_usage_writes_nothing(self, store: SessionStore) -> None:
        sid = store.create_session().id
        store.add_usage(sid, {"input": 1})
        before = store.get_session(sid).usage
        with pytest.raises(InvalidInputError):
            store.add_usage(sid, {"input": "ten"})
        with pytest.raises(InvalidInputError):
            store.add_usage(sid, "ten")  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError):
            store.set_usage(sid, {"prompt_tokens": "x"})
        assert store.get_session(sid).usage == before

    def test_invalid_flush_writes_nothing(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "m1")
        before = store.get_session(sid)
        bad_flushes = [
            StreamFlush(sid, message={"id": "s1", "role": "wizard"}),
            StreamFlush(
                sid,
                message={"id": "s1", "role": "assistant"},
                parts=[PartWrite("s1", -1, {"type": "text"})],
            ),  # fmt: skip
            StreamFlush(
                sid,
                message={"id": "s1", "role": "assistant"},
                parts=[PartWrite("s1", 0, {"text": "no type"})],
            ),  # fmt: skip
            StreamFlush(
                sid,
                message={"id": "s1", "role": "assistant"},
                chunks=[ChunkWrite("g", 0, "not a dict")],  # type: ignore[arg-type]
            ),  # fmt: skip
            StreamFlush(
                sid,
                message={"id": "s1", "role": "assistant"},
                chunks=[ChunkWrite("g", 0, {"type": "x", "bad": {1, 2}})],
            ),  # fmt: skip
        ]
        for flush in bad_flushes:
            with pytest.raises(InvalidInputError):
                store.flush_stream(flush)
        assert store.get_message("s1") is None
        assert store.get_chunks("g") == []
        assert_nothing_written(store, sid, before)

    def test_invalid_config(self, store: SessionStore) -> None:
        with pytest.raises(InvalidInputError):
            store.set_config("k", {"v": object()})
        assert store.get_config("k", "absent") == "absent"


# -- idempotency -------------------------------------------------------------------


class TestIdempotency:
    def test_append_round_trips_exactly(self, store: SessionStore) -> None:
        sid = store.create_session().id
        original = copy.deepcopy(RICH)
        assert store.append_message(sid, RICH) is True
        assert original == RICH  # the input is not mutated
        assert store.get_message("rich") == RICH
        assert store.get_history(sid) == [RICH]
        got = store.get_history(sid)[0]
        got["parts"].append({"type": "text", "text": "mutated by caller"})
        got["metadata"]["tags"].append("c")
        assert store.get_message("rich") == RICH  # results are copies

    def test_round_trip_keeps_absent_and_null_metadata(self, store: SessionStore) -> None:
        sid = store.create_session().id
        no_meta: dict[str, Any] = {
            "id": "a",
            "role": "user",
            "parts": [{"type": "text", "text": "x"}],
        }
        null_meta: dict[str, Any] = {"id": "b", "role": "assistant", "metadata": None, "parts": []}
        store.append_message(sid, no_meta)
        store.append_message(sid, null_meta)
        assert store.get_history(sid) == [no_meta, null_meta]

    def test_second_append_is_a_no_op(self, store: SessionStore) -> None:
        sid = store.create_session().id
        first = msg("m1", text="first")
        assert store.append_message(sid, first) is True
        chain_head = msg("m2", "assistant")
        store.append_message(sid, chain_head)
        assert store.append_message(sid, msg("m1", text="second", metadata={"x": 1})) is False
        assert store.get_message("m1") == first
        assert store.get_session(sid).head_id == "m2"  # the head did not move back
        assert ids(store.get_history(sid)) == ["m1", "m2"]
        assert store.message_count(sid) == 2

    def test_append_of_an_id_from_another_session_is_a_no_op(self, store: SessionStore) -> None:
        a = store.create_session().id
        b = store.create_session().id
        store.append_message(a, msg("m1", text="in a"))
        assert store.append_message(b, msg("m1", text="in b")) is False
        assert store.get_history(b) == []
        assert store.get_message("m1") == msg("m1", text="in a")
        assert store.get_message_row("m1").session_id == a  # type: ignore[union-attr]

    def test_message_session_names_the_owner_hidden_or_not(self, store: SessionStore) -> None:
        a = store.create_session().id
        assert store.message_session("m1") is None
        store.append_message(a, msg("m1"))
        store.append_message(a, msg("m2", "assistant"))
        store.set_hidden(a, ["m2"], time.time())
        assert (store.message_session("m1"), store.message_session("m2")) == (a, a)

    def test_upsert_inserts_then_replaces(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "m1")
        store.upsert_message(sid, msg("m2", "assistant", text="v1"))
        assert store.get_session(sid).head_id == "m2"
        chain(store, sid, "m3")
        replacement = {
            "id": "m2",
            "role": "assistant",
            "metadata": {"edited": True},
            "parts": [{"type": "text", "text": "v2"}, {"type": "text", "text": "more"}],
        }
        store.upsert_message(sid, replacement)
        assert store.get_message("m2") == replacement
        # Replacing keeps the tree position (and the head).
        assert ids(store.get_history(sid)) == ["m1", "m2", "m3"]
        assert store.get_session(sid).head_id == "m3"
        shrunk: dict[str, Any] = {"id": "m2", "role": "assistant", "metadata": None, "parts": []}
        store.upsert_message(sid, shrunk)
        assert store.get_message("m2") == shrunk
        assert store.get_history(sid)[1] == shrunk
        assert store.message_count(sid) == 3


# -- tree and head -----------------------------------------------------------------


class TestTreeAndHead:
    def test_append_moves_the_head(self, store: SessionStore) -> None:
        sid = store.create_session().id
        assert store.get_session(sid).head_id is None
        store.append_message(sid, msg("m1"))
        assert store.get_session(sid).head_id == "m1"
        store.append_message(sid, msg("m2", "assistant"))
        info = store.get_session(sid)
        assert info.head_id == "m2"
        assert store.get_message_row("m2").parent_id == "m1"  # type: ignore[union-attr]
        assert store.get_message_row("m1").parent_id is None  # type: ignore[union-attr]

    def test_history_default_and_explicit_leaf(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "m1", "m2", "m3", "m4")
        assert ids(store.get_history(sid)) == ["m1", "m2", "m3", "m4"]
        assert ids(store.get_history(sid, leaf_id="m2")) == ["m1", "m2"]
        assert ids(store.get_history(sid, leaf_id="m1")) == ["m1"]

    def test_empty_history(self, store: SessionStore) -> None:
        sid = store.create_session().id
        assert store.get_history(sid) == []
        assert store.get_path(sid) == []
        assert store.message_count(sid) == 0

    def test_branching_via_parent_id(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "m1", "m2", "m3")
        assert store.append_message(sid, msg("m2b", "assistant"), parent_id="m1")
        assert store.get_session(sid).head_id == "m2b"
        assert ids(store.get_history(sid)) == ["m1", "m2b"]
        assert ids(store.get_history(sid, leaf_id="m3")) == ["m1", "m2", "m3"]
        store.append_message(sid, msg("m3b"))  # HEAD: continues the new branch
        assert ids(store.get_history(sid)) == ["m1", "m2b", "m3b"]
        assert ids(store.children("m1")) == ["m2", "m2b"]  # oldest first
        assert ids(store.children("m2")) == ["m3"]
        assert store.children("m3") == []
        assert store.children("m1")[1] == msg("m2b", "assistant")
        assert store.message_count(sid) == 5

    def test_explicit_head_parent(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "m1")
        assert store.append_message(sid, msg("m2", "assistant"), parent_id=HEAD)
        assert ids(store.get_history(sid)) == ["m1", "m2"]

    def test_parent_none_starts_a_new_root(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "m1", "m2")
        store.append_message(sid, msg("r2"), parent_id=None)
        assert store.get_message_row("r2").parent_id is None  # type: ignore[union-attr]
        assert store.get_session(sid).head_id == "r2"
        assert ids(store.get_history(sid)) == ["r2"]
        assert ids(store.get_history(sid, leaf_id="m2")) == ["m1", "m2"]

    def test_set_head(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "m1", "m2", "m3")
        store.set_head(sid, "m2")
        assert store.get_session(sid).head_id == "m2"
        assert ids(store.get_history(sid)) == ["m1", "m2"]
        store.append_message(sid, msg("m3b", "user"))
        assert ids(store.get_history(sid)) == ["m1", "m2", "m3b"]
        assert ids(store.children("m2")) == ["m3", "m3b"]
        store.set_head(sid, "m3")
        assert ids(store.get_history(sid)) == ["m1", "m2", "m3"]

    def test_unset_head_falls_back_to_latest_visible(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "m1", "m2")
        store.append_message(sid, msg("x1"), parent_id="m1")
        store.set_head(sid, "m2")
        store.set_head(sid, None)
        assert store.get_session(sid).head_id is None
        assert ids(store.get_history(sid)) == ["m1", "x1"]  # most recent visible
        store.set_hidden(sid, ["x1"], time.time())
        assert ids(store.get_history(sid)) == ["m1", "m2"]

    def test_seq_increases_across_the_store(self, store: SessionStore) -> None:
        a = store.create_session().id
        b = store.create_session().id
        store.append_message(a, msg("a1"))
        store.append_message(b, msg("b1"))
        store.append_message(a, msg("a2"), parent_id="a1")
        store.flush_stream(StreamFlush(b, message={"id": "b2", "role": "assistant"}))
        seqs = [store.get_message_row(m).seq for m in ("a1", "b1", "a2", "b2")]  # type: ignore[union-attr]
        assert seqs == sorted(seqs) and len(set(seqs)) == 4

    def test_get_message_row(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "m1", "m2")
        row = store.get_message_row("m2")
        assert row is not None
        assert row.id == "m2" and row.session_id == sid and row.parent_id == "m1"
        assert row.role == "assistant" and row.hidden_at is None and not row.hidden
        assert row.message == msg("m2", "assistant")
        assert abs(row.created_at - time.time()) < 60

    def test_children_keep_parts_order(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "m1")
        many = {
            "id": "m2",
            "role": "assistant",
            "parts": [{"type": "text", "text": str(i)} for i in range(20)],
        }
        store.append_message(sid, many)
        assert store.children("m1") == [many]
        assert store.get_history(sid)[-1] == many

    def test_delete_messages(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "m1", "m2", "m3")
        store.delete_messages(sid, ["m3"])
        assert store.get_message("m3") is None
        assert ids(store.get_history(sid)) == ["m1", "m2"]
        assert store.message_count(sid) == 2
        store.delete_messages(sid, [])
        assert store.message_count(sid) == 2


class TestInsertBefore:
    def test_inserted_above_a_message_every_path_reads_it_first(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "u1", "a1", "u2", "a2")
        store.set_head(sid, "u2")
        store.append_message(sid, msg("a2b", "assistant"))  # a second branch under u2
        assert store.insert_before(sid, msg("s", "assistant"), "u2")
        assert store.get_session(sid).head_id == "a2b"  # the head did not move
        assert ids(store.get_history(sid)) == ["u1", "a1", "s", "u2", "a2b"]
        assert ids(store.get_history(sid, leaf_id="a2")) == ["u1", "a1", "s", "u2", "a2"]
        assert ids(store.children("a1")) == ["s"] and ids(store.children("s")) == ["u2"]
        assert store.get_message("s") == msg("s", "assistant")
        # Paths stay in order for everything that reads them: path rows, a branch copy.
        path = store.get_path(sid)
        assert [r.id for r in path] == ["u1", "a1", "s", "u2", "a2b"]
        assert [r.seq for r in path] == sorted(r.seq for r in path)
        copy = store.branch_session(sid, "a2b")
        assert [m["parts"] for m in store.get_history(copy.id)] == [
            msg(m)["parts"] for m in ("u1", "a1", "s", "u2", "a2b")
        ]
        store.append_message(sid, msg("u3"))
        assert ids(store.get_history(sid)) == ["u1", "a1", "s", "u2", "a2b", "u3"]

    def test_above_the_root_and_idempotent(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "u1", "a1")
        assert store.insert_before(sid, msg("s", "system"), "u1")
        assert store.get_message_row("s").parent_id is None  # type: ignore[union-attr]
        assert ids(store.get_history(sid)) == ["s", "u1", "a1"]
        assert not store.insert_before(sid, msg("s", "system", text="again"), "a1")
        assert ids(store.get_history(sid)) == ["s", "u1", "a1"]
        assert store.get_message("s") == msg("s", "system")

    def test_unknown_child_or_session_writes_nothing(self, store: SessionStore) -> None:
        sid = store.create_session().id
        other = store.create_session().id
        chain(store, sid, "u1")
        chain(store, other, "o1")
        with pytest.raises(MessageNotFoundError):
            store.insert_before(sid, msg("s"), "nope")
        with pytest.raises(MessageNotFoundError):
            store.insert_before(sid, msg("s"), "o1")  # another session's message
        with pytest.raises(SessionNotFoundError):
            store.insert_before("no-such-session", msg("s"), "u1")
        assert store.get_message("s") is None
        assert ids(store.get_history(sid)) == ["u1"]


# -- hidden messages and the path ----------------------------------------------------


class TestHiddenAndPath:
    def test_hidden_excluded_unless_asked(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "u1", "a1", "u2", "a2")
        store.set_hidden(sid, ["u2", "a2"], 1234.5)
        assert ids(store.get_history(sid)) == ["u1", "a1"]
        assert ids(store.get_history(sid, include_hidden=True)) == ["u1", "a1", "u2", "a2"]
        assert store.message_count(sid) == 2
        assert store.message_count(sid, include_hidden=True) == 4
        row = store.get_message_row("u2")
        assert row is not None and row.hidden and row.hidden_at == 1234.5
        # Hiding never deletes: parts are intact.
        assert store.get_message("a2") == msg("a2", "assistant")

    def test_unhide(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "u1", "a1", "u2", "a2")
        store.set_hidden(sid, ["u2", "a2"], time.time())
        store.set_hidden(sid, ["u2", "a2"], None)
        assert ids(store.get_history(sid)) == ["u1", "a1", "u2", "a2"]
        assert not store.get_message_row("a2").hidden  # type: ignore[union-attr]
        store.set_hidden(sid, [], None)  # nothing to do

    def test_rewind_then_resend(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "u1", "a1", "u2", "a2")
        store.set_hidden(sid, ["u2", "a2"], time.time())
        store.set_head(sid, "a1")
        store.append_message(sid, msg("u2b"))
        assert ids(store.get_history(sid)) == ["u1", "a1", "u2b"]
        assert ids(store.children("a1")) == ["u2", "u2b"]  # children include hidden
        assert ids(store.get_history(sid, leaf_id="a2", include_hidden=True)) == [
            "u1",
            "a1",
            "u2",
            "a2",
        ]

    def test_get_path_includes_hidden(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "u1", "a1", "u2")
        store.set_hidden(sid, ["a1"], 99.0)
        path = store.get_path(sid)
        assert [r.id for r in path] == ["u1", "a1", "u2"]
        assert [r.hidden for r in path] == [False, True, False]
        assert [r.parent_id for r in path] == [None, "u1", "a1"]
        assert all(r.session_id == sid for r in path)
        assert [r.seq for r in path] == sorted(r.seq for r in path)
        assert path[1].message == msg("a1", "assistant")
        assert path[1].role == "assistant"
        assert [r.id for r in store.get_path(sid, leaf_id="a1")] == ["u1", "a1"]
        assert ids(store.get_history(sid)) == ["u1", "u2"]

    def test_hidden_leaf_with_explicit_leaf(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "u1", "a1")
        store.set_hidden(sid, ["a1"], 1.0)
        assert ids(store.get_history(sid, leaf_id="a1")) == ["u1"]
        assert ids(store.get_history(sid, leaf_id="a1", include_hidden=True)) == ["u1", "a1"]


# -- usage -------------------------------------------------------------------------


class TestUsage:
    def test_add_usage_rollup_arithmetic(self, store: SessionStore) -> None:
        sid = store.create_session().id
        info = store.add_usage(
            sid, {"input": 100, "output": 20, "reasoning": 5, "cache_read": 30, "cache_write": 7}
        )
        assert info.usage == {
            "prompt_tokens": 100,
            "completion_tokens": 20,
            "reasoning_tokens": 5,
            "cache_read": 30,
            "cache_write": 7,
            "total_tokens": 162,
            "cost_usd": None,
        }
        assert info.context_window_used == 162
        info = store.add_usage(sid, {"input": 1, "output": 2})
        assert info.usage["prompt_tokens"] == 101 and info.usage["completion_tokens"] == 22
        assert info.usage["total_tokens"] == 165
        assert info.usage["cost_usd"] is None  # no writer supplied a cost yet
        info = store.add_usage(sid, {"input": 0, "cost_usd": 0.25})
        assert info.usage["cost_usd"] == pytest.approx(0.25)
        info = store.add_usage(sid, {"output": 3, "cost_usd": 0.5})
        assert info.usage["cost_usd"] == pytest.approx(0.75)
        info = store.add_usage(sid, {"output": 1})
        assert info.usage["cost_usd"] == pytest.approx(0.75)  # absent cost adds nothing
        assert info.usage["total_tokens"] == 169
        assert store.get_session(sid).usage == info.usage

    def test_set_usage_replaces(self, store: SessionStore) -> None:
        sid = store.create_session().id
        store.add_usage(sid, {"input": 100, "cost_usd": 1.0})
        rollup = {
            "prompt_tokens": 1,
            "completion_tokens": 2,
            "reasoning_tokens": 3,
            "cache_read": 4,
            "cache_write": 5,
            "total_tokens": 15,
            "cost_usd": None,
        }
        info = store.set_usage(sid, rollup)
        assert info.usage == rollup
        assert store.get_session(sid).usage == rollup
        info = store.add_usage(sid, {"input": 1, "cost_usd": 0.1})
        assert info.usage["total_tokens"] == 16
        assert info.usage["cost_usd"] == pytest.approx(0.1)

    def test_usage_is_per_session(self, store: SessionStore) -> None:
        a = store.create_session().id
        b = store.create_session().id
        store.add_usage(a, {"input": 5})
        assert store.get_session(b).usage == empty_rollup()

    def test_context_window_used_is_the_last_step(self, store: SessionStore, reopen: Any) -> None:
        """What the next request carries: the last step's input + cache + output (seed
        002), not the rollups' sum, which counts every step's re-read again."""
        sid = store.create_session().id
        chain(store, sid, "u1", "a1")
        step = {"input": 100, "output": 20, "reasoning": 5, "cache_read": 30, "cache_write": 7}
        assert store.add_usage(sid, step).context_window_used == 162
        info = store.add_usage(sid, {"input": 10, "output": 8, "cache_read": 162})
        assert info.usage["total_tokens"] == 162 + 180  # billed: every step
        assert info.context_window_used == 180
        assert store.get_session(sid).context_window_used == 180
        # A step that reported no tokens (a cost only) leaves it as it was.
        assert store.add_usage(sid, {"cost_usd": 0.1}).context_window_used == 180
        # A branch of the whole path carries the same; one cut earlier has no last call.
        assert store.branch_session(sid, "a1").context_window_used == 180
        assert store.branch_session(sid, "u1").context_window_used == 0
        # Rollups replaced by set_usage (a compaction) are the context until a step.
        assert store.set_usage(sid, {"prompt_tokens": 50}).context_window_used == 50
        assert store.add_usage(sid, {"input": 60, "output": 2}).context_window_used == 62
        if reopen is not None:
            assert reopen(store).get_session(sid).context_window_used == 62


# -- stream flush ------------------------------------------------------------------


def envelope(mid: str = "s1", metadata: Any = None) -> dict[str, Any]:
    return {"id": mid, "role": "assistant", "metadata": metadata, "parts": []}


class TestFlushStream:
    def test_first_flush_inserts_message_parts_and_chunks(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "u1")
        store.flush_stream(
            StreamFlush(
                sid,
                message=envelope(metadata={"model": "m"}),
                parent_id="u1",
                use_head=False,
                parts=[PartWrite("s1", 0, {"type": "text", "text": "Hel", "state": "streaming"})],
                chunks=[
                    ChunkWrite("run-1", 0, {"type": "start", "messageId": "s1"}),
                    ChunkWrite("run-1", 1, {"type": "text-start", "id": "t"}),
                    ChunkWrite("run-1", 2, {"type": "text-delta", "id": "t", "delta": "Hel"}),
                ],
            )
        )
        assert store.get_session(sid).head_id == "s1"
        assert store.get_history(sid)[-1] == {
            "id": "s1",
            "role": "assistant",
            "metadata": {"model": "m"},
            "parts": [{"type": "text", "text": "Hel", "state": "streaming"}],
        }
        assert [c["type"] for c in store.get_chunks("run-1")] == [
            "start",
            "text-start",
            "text-delta",
        ]

    def test_parts_upsert_by_index(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "u1")
        text = {"type": "text", "text": "Hel", "state": "streaming"}
        store.flush_stream(
            StreamFlush(sid, message=envelope(), parent_id="u1", parts=[PartWrite("s1", 0, text)])
        )
        tool = tool_part("c1", "input-streaming", input={})
        store.flush_stream(
            StreamFlush(
                sid,
                parts=[
                    PartWrite("s1", 0, {"type": "text", "text": "Hello", "state": "done"}),
                    PartWrite("s1", 1, tool),
                ],
            )
        )
        steps: list[tuple[str, dict[str, Any]]] = [
            ("input-available", {"input": {"q": "x"}}),
            ("output-available", {"input": {"q": "x"}, "output": {"hits": 3}}),
        ]
        for state, fields in steps:
            store.flush_stream(StreamFlush(sid, parts=[PartWrite("s1", 1, tool_part("c1", state, **fields))]))  # fmt: skip
        message = store.get_message("s1")
        assert message is not None
        assert message["parts"] == [
            {"type": "text", "text": "Hello", "state": "done"},
            tool_part("c1", "output-available", input={"q": "x"}, output={"hits": 3}),
        ]
        assert store.message_count(sid) == 2  # one message, updated in place

    def test_metadata_update_on_a_later_flush(self, store: SessionStore) -> None:
        sid = store.create_session().id
        store.flush_stream(StreamFlush(sid, message=envelope(metadata={"a": 1}), use_head=False))
        store.flush_stream(StreamFlush(sid, message=envelope(metadata={"a": 1, "usage": {"input": 3}})))  # fmt: skip
        assert store.get_message("s1") == envelope(metadata={"a": 1, "usage": {"input": 3}})
        assert store.message_count(sid) == 1

    def test_parts_length_shrinks(self, store: SessionStore) -> None:
        sid = store.create_session().id
        store.flush_stream(
            StreamFlush(
                sid,
                message=envelope(),
                use_head=False,
                parts=[PartWrite("s1", i, {"type": "text", "text": str(i)}) for i in range(3)],
            )
        )
        store.flush_stream(
            StreamFlush(
                sid,
                message=envelope(),
                parts=[PartWrite("s1", 0, {"type": "text", "text": "only"})],
                parts_length=1,
            )
        )
        assert store.get_message("s1")["parts"] == [{"type": "text", "text": "only"}]  # type: ignore[index]
        store.flush_stream(StreamFlush(sid, message=envelope(), parts_length=0))
        assert store.get_message("s1")["parts"] == []  # type: ignore[index]

    def test_parent_resolution(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "u1", "a1")
        store.flush_stream(StreamFlush(sid, message=envelope("h"), use_head=True))
        assert store.get_message_row("h").parent_id == "a1"  # type: ignore[union-attr]
        store.flush_stream(StreamFlush(sid, message=envelope("r"), use_head=False))
        assert store.get_message_row("r").parent_id is None  # type: ignore[union-attr]
        store.flush_stream(StreamFlush(sid, message=envelope("p"), parent_id="u1"))
        assert store.get_message_row("p").parent_id == "u1"  # type: ignore[union-attr]
        assert store.get_session(sid).head_id == "p"
        assert ids(store.get_history(sid)) == ["u1", "p"]

    def test_chunks_only(self, store: SessionStore) -> None:
        sid = store.create_session().id
        store.flush_stream(
            StreamFlush(sid, chunks=[ChunkWrite("g", i, {"type": "x", "i": i}) for i in range(5)])
        )
        store.flush_stream(
            StreamFlush(
                sid, chunks=[ChunkWrite("g", i, {"type": "x", "i": i}, i == 7) for i in range(5, 8)]
            )
        )
        assert [c["i"] for c in store.get_chunks("g")] == list(range(8))
        assert store.get_history(sid) == []

    def test_atomic_unserializable_part(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "u1")
        before = store.get_session(sid)
        with pytest.raises(InvalidInputError):
            store.flush_stream(
                StreamFlush(
                    sid,
                    message=envelope(metadata={"a": 1}),
                    parent_id="u1",
                    parts=[
                        PartWrite("s1", 0, {"type": "text", "text": "fine"}),
                        PartWrite("s1", 1, {"type": "text", "text": object()}),
                    ],
                    chunks=[ChunkWrite("g", 0, {"type": "start"})],
                )
            )
        assert store.get_message("s1") is None
        assert store.get_chunks("g") == []
        assert "g" not in store.chunk_generations()
        assert_nothing_written(store, sid, before)

    def test_atomic_later_flush(self, store: SessionStore) -> None:
        sid = store.create_session().id
        store.flush_stream(
            StreamFlush(
                sid,
                message=envelope(metadata={"v": 1}),
                use_head=False,
                parts=[PartWrite("s1", 0, {"type": "text", "text": "a"})],
                chunks=[ChunkWrite("g", 0, {"type": "start"})],
            )
        )
        with pytest.raises(InvalidInputError):
            store.flush_stream(
                StreamFlush(
                    sid,
                    message=envelope(metadata={"v": 2}),
                    parts=[
                        PartWrite("s1", 0, {"type": "text", "text": "ab"}),
                        PartWrite("s1", 1, {"type": "text", "text": float("nan"), "x": {1}}),
                    ],
                    chunks=[ChunkWrite("g", 1, {"type": "text-delta"})],
                    parts_length=2,
                )
            )
        assert store.get_message("s1") == {
            "id": "s1",
            "role": "assistant",
            "metadata": {"v": 1},
            "parts": [{"type": "text", "text": "a"}],
        }
        assert store.get_chunks("g") == [{"type": "start"}]

    def test_atomic_part_of_an_unknown_message(self, store: SessionStore) -> None:
        """A batch naming an unknown message writes nothing, not even its valid parts."""
        sid = store.create_session().id
        chain(store, sid, "u1")
        before = store.get_session(sid)
        with pytest.raises(MessageNotFoundError):
            store.flush_stream(
                StreamFlush(
                    sid,
                    message=envelope(),
                    parent_id="u1",
                    parts=[
                        PartWrite("s1", 0, {"type": "text", "text": "ok"}),
                        PartWrite("ghost", 0, {"type": "text", "text": "no such message"}),
                    ],
                    chunks=[ChunkWrite("g", 0, {"type": "start"})],
                )
            )
        assert store.get_message("s1") is None
        assert store.get_chunks("g") == []
        assert store.message_count(sid, include_hidden=True) == 1
        assert_nothing_written(store, sid, before)

    def test_parts_of_an_existing_message_without_envelope(self, store: SessionStore) -> None:
        sid = store.create_session().id
        store.append_message(sid, {"id": "a", "role": "assistant", "parts": [tool_part("c", "input-available", input={})]})  # fmt: skip
        store.flush_stream(
            StreamFlush(
                sid,
                parts=[
                    PartWrite("a", 0, tool_part("c", "output-error", input={}, errorText="died"))
                ],
            )  # fmt: skip
        )
        assert store.get_message("a")["parts"][0]["state"] == "output-error"  # type: ignore[index]

    def test_flush_round_trips_values(self, store: SessionStore) -> None:
        sid = store.create_session().id
        parts = [copy.deepcopy(p) for p in RICH["parts"]]
        store.flush_stream(
            StreamFlush(
                sid,
                message={"id": "r", "role": "assistant", "metadata": RICH["metadata"]},
                use_head=False,
                parts=[PartWrite("r", i, p) for i, p in enumerate(parts)],
            )
        )
        assert store.get_message("r") == {**RICH, "id": "r"}


# -- chunk log ---------------------------------------------------------------------


class TestChunkLog:
    def _log(self, store: SessionStore, sid: str, gen: str, n: int) -> None:
        store.flush_stream(
            StreamFlush(sid, chunks=[ChunkWrite(gen, i, {"type": "d", "i": i}) for i in range(n)])
        )

    def test_get_from_start_index(self, store: SessionStore) -> None:
        sid = store.create_session().id
        self._log(store, sid, "g", 6)
        assert [c["i"] for c in store.get_chunks("g")] == [0, 1, 2, 3, 4, 5]
        assert [c["i"] for c in store.get_chunks("g", 4)] == [4, 5]
        assert store.get_chunks("g", 6) == []
        assert store.get_chunks("unknown") == []

    def test_order_is_by_index(self, store: SessionStore) -> None:
        sid = store.create_session().id
        store.flush_stream(StreamFlush(sid, chunks=[ChunkWrite("g", 2, {"i": 2}), ChunkWrite("g", 0, {"i": 0})]))  # fmt: skip
        store.flush_stream(StreamFlush(sid, chunks=[ChunkWrite("g", 1, {"i": 1})]))
        assert [c["i"] for c in store.get_chunks("g")] == [0, 1, 2]

    def test_generations_oldest_first_and_delete(self, store: SessionStore) -> None:
        sid = store.create_session().id
        for gen in ("zeta", "alpha", "mid"):
            self._log(store, sid, gen, 2)
        self._log(store, sid, "alpha", 0)
        assert store.chunk_generations() == ["zeta", "alpha", "mid"]
        store.flush_stream(StreamFlush(sid, chunks=[ChunkWrite("zeta", 2, {"i": 2})]))
        assert store.chunk_generations() == ["zeta", "alpha", "mid"]
        store.delete_chunks(["zeta", "mid"])
        assert store.chunk_generations() == ["alpha"]
        assert store.get_chunks("zeta") == []
        assert len(store.get_chunks("alpha")) == 2
        store.delete_chunks([])
        store.delete_chunks(["never-existed"])
        assert store.chunk_generations() == ["alpha"]

    def test_open_generations_are_the_logs_without_a_final_chunk(self, store: SessionStore) -> None:
        sid = store.create_session().id
        self._log(store, sid, "cut", 3)
        self._log(store, sid, "done", 2)
        assert store.open_generations() == ["cut", "done"]
        store.flush_stream(StreamFlush(sid, chunks=[ChunkWrite("done", 2, {"i": 2}, True)]))
        assert store.open_generations() == ["cut"]
        assert store.chunk_generations() == ["cut", "done"]
        store.delete_chunks(["cut"])
        assert store.open_generations() == []

    def test_chunk_payloads_round_trip(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chunk = {
            "type": "tool-input-available",
            "toolCallId": "c",
            "toolName": "t",
            "input": {"a": [1, 2, {"b": None}], "f": 1.5, "u": "✓"},
            "dynamic": True,
        }
        store.flush_stream(StreamFlush(sid, chunks=[ChunkWrite("g", 0, chunk, True)]))
        assert store.get_chunks("g") == [chunk]


# -- config ------------------------------------------------------------------------


class TestConfig:
    def test_default_set_get_delete(self, store: SessionStore) -> None:
        assert store.get_config("k") is None
        assert store.get_config("k", 42) == 42
        store.set_config("k", "v")
        assert store.get_config("k") == "v"
        store.set_config("k", {"replaced": True})
        assert store.get_config("k", 42) == {"replaced": True}
        store.delete_config("k")
        assert store.get_config("k", 42) == 42
        store.delete_config("k")  # deleting a missing key is fine

    def test_json_like_values(self, store: SessionStore) -> None:
        values = [
            0,
            -7,
            2**40,
            1.5,
            True,
            False,
            "",
            "text ✓",
            [1, "two", None],
            {"nested": {"list": [{"a": 1}], "none": None, "f": 0.25}},
            [],
            {},
        ]
        for value in values:
            store.set_config("key", value)
            got = store.get_config("key", "default")
            assert got == value and type(got) is type(value), value

    def test_keys_are_independent(self, store: SessionStore) -> None:
        store.set_config("a", 1)
        store.set_config("b", 2)
        store.delete_config("a")
        assert store.get_config("a") is None and store.get_config("b") == 2


# -- lifecycle ---------------------------------------------------------------------


class _Boom(Exception):
    pass


class TestTransactions:
    def test_rollback_leaves_nothing_written(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "u1")
        before = store.get_session(sid)
        with pytest.raises(_Boom), store.transaction():
            store.append_message(sid, msg("a1", "assistant"))
            store.add_usage(sid, {"input": 5})
            store.set_config("k", 1)
            store.create_session("lost", session_id="lost")
            store.stores().kv().set("k", 1)
            raise _Boom
        assert ids(store.get_history(sid)) == ["u1"]
        after = store.get_session(sid)
        assert (after.head_id, after.usage) == (before.head_id, before.usage)
        assert store.get_config("k") is None
        assert not store.has_session("lost")
        assert store.stores().kv().get("k") is None
        # Nothing of the rolled-back block is left behind: the ids are free again.
        assert store.append_message(sid, msg("a1", "assistant")) is True

    def test_commit_covers_the_session_store_and_its_stores(self, store: SessionStore) -> None:
        sid = store.create_session().id
        with store.transaction():
            chain(store, sid, "u1", "a1")
            store.stores().fibers().insert_fiber("m", fiber_id="f1")
            assert ids(store.get_history(sid)) == ["u1", "a1"]  # reads see the block
        assert ids(store.get_history(sid)) == ["u1", "a1"]
        assert store.stores().fibers().get_fiber("f1") is not None

    def test_the_stores_transaction_covers_the_session_store(self, store: SessionStore) -> None:
        sid = store.create_session().id
        with pytest.raises(_Boom), store.stores().transaction():
            store.append_message(sid, msg("u1"))
            store.stores().inbox().insert("x", message_id="i1")
            raise _Boom
        assert store.message_count(sid) == 0
        assert store.stores().inbox().get("i1") is None

    def test_nested_blocks_join_the_outer_one(self, store: SessionStore) -> None:
        sid = store.create_session().id
        with pytest.raises(_Boom), store.transaction():
            chain(store, sid, "u1")
            with store.transaction():
                store.append_message(sid, msg("a1", "assistant"))
            raise _Boom
        assert store.message_count(sid) == 0
        with store.transaction():
            try:
                with store.stores().transaction():
                    chain(store, sid, "u1")
                    raise _Boom
            except _Boom:
                pass
            store.set_config("after", True)
        assert ids(store.get_history(sid)) == ["u1"]  # the caught failure undid nothing
        assert store.get_config("after") is True

    def test_flush_inside_a_rolled_back_block_is_undone(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "u1")
        with pytest.raises(_Boom), store.transaction():
            store.flush_stream(
                StreamFlush(
                    sid,
                    message=envelope("s1"),
                    parts=[PartWrite("s1", 0, {"type": "text", "text": "x"})],
                    chunks=[ChunkWrite("g", 0, {"type": "start"})],
                )
            )
            raise _Boom
        assert store.get_message("s1") is None and store.get_chunks("g") == []
        assert store.get_session(sid).head_id == "u1"


class TestStores:
    def test_stores_is_one_object_on_the_same_database(self, store: SessionStore) -> None:
        stores = store.stores()
        assert isinstance(stores, Stores)
        assert store.stores() is stores
        stores.kv().set("k", "v")
        assert store.stores().kv().get("k") == "v"
        store.set_config("k", "config")  # the session store's config is its own
        assert stores.kv().get("k") == "v"

    def test_closing_the_stores_leaves_the_session_store_open(self, store: SessionStore) -> None:
        stores = store.stores()
        stores.close()
        stores.close()
        sid = store.create_session().id
        stores.kv().set("k", 1)
        assert store.has_session(sid) and stores.kv().get("k") == 1

    def test_closed_store_has_no_stores(self, store: SessionStore) -> None:
        store.close()
        with pytest.raises(DatabaseClosedError):
            store.stores()
        with pytest.raises(DatabaseClosedError), store.transaction():
            pass

    def test_stores_close_with_their_file(self, store: SessionStore, reopen: Any) -> None:
        if reopen is None:
            pytest.skip("store has no file to reopen")
        kv = store.stores().kv()
        kv.set("k", [1, 2])
        store.stores().fibers().insert_fiber("m", fiber_id="f1")
        again: SessionStore = reopen(store)
        with pytest.raises(DatabaseClosedError):
            kv.get("k")
        assert again.stores().kv().get("k") == [1, 2]
        assert again.stores().fibers().get_fiber("f1") is not None


class TestLifecycle:
    def test_deferred_writes_read_back_and_persist_once_synced(
        self, store: SessionStore, reopen: Any
    ) -> None:
        """Writes in a :meth:`defer_syncs` block are read back at once and, made durable
        by :meth:`sync_deferred` called from another thread, are there after a reopen."""
        import threading

        with store.defer_syncs():
            sid = store.create_session("deferred").id
            with store.defer_syncs():  # nested
                chain(store, sid, "u1", "a1")
        assert ids(store.get_history(sid)) == ["u1", "a1"]
        worker = threading.Thread(target=store.sync_deferred)
        worker.start()
        worker.join(30)
        assert not worker.is_alive()
        store.sync_deferred()  # nothing owed any more: a no-op
        if reopen is None:
            return
        again: SessionStore = reopen(store)
        assert ids(again.get_history(sid)) == ["u1", "a1"]

    def test_close_is_idempotent(self, store: SessionStore) -> None:
        store.create_session()
        store.close()
        store.close()

    def test_persistence_across_reopen(self, store: SessionStore, reopen: Any) -> None:
        if reopen is None:
            pytest.skip("store has no file to reopen")
        sid = store.create_session("persisted", metadata={"m": 1}, thread_key="t").id
        branch = store.create_session("branch", parent_session_id=sid, parent_message_id="u1").id
        chain(store, sid, "u1", "a1", "u2")
        store.append_message(sid, RICH, parent_id="a1")
        store.set_hidden(sid, ["u2"], 5.0)
        store.add_usage(sid, {"input": 3, "output": 4, "cost_usd": 0.5})
        store.update_session(sid, permissions={"p": 1}, settings={"s": 2}, model={"id": "x"})
        store.flush_stream(
            StreamFlush(
                sid,
                message=envelope("s1", {"k": "v"}),
                parts=[PartWrite("s1", 0, {"type": "text", "text": "partial"})],
                chunks=[ChunkWrite("g", i, {"i": i}) for i in range(3)],
            )
        )
        store.set_config("cfg", {"x": [1, 2]})
        before_info = store.get_session(sid).to_dict()
        before_history = store.get_history(sid)
        before_all = store.get_history(sid, include_hidden=True, leaf_id="u2")
        before_seq = store.get_message_row("s1").seq  # type: ignore[union-attr]

        again: SessionStore = reopen(store)
        assert again.get_session(sid).to_dict() == before_info
        assert again.get_history(sid) == before_history
        assert again.get_history(sid, include_hidden=True, leaf_id="u2") == before_all
        assert ids(before_history) == ["u1", "a1", "rich", "s1"]
        assert again.get_message("rich") == RICH
        assert [c["i"] for c in again.get_chunks("g")] == [0, 1, 2]
        assert again.chunk_generations() == ["g"]
        assert again.get_config("cfg") == {"x": [1, 2]}
        assert [s.id for s in again.list_sessions(parent_session_id=sid)] == [branch]
        assert again.message_count(sid) == 4
        # Ordering keeps going after a reopen.
        again.append_message(sid, msg("after"))
        assert again.get_message_row("after").seq > before_seq  # type: ignore[union-attr]
        assert again.get_session(sid).updated_at > before_info["updated_at"]
        assert again.append_message(sid, msg("u1", text="dupe")) is False

    def test_reopen_empty(self, store: SessionStore, reopen: Any) -> None:
        if reopen is None:
            pytest.skip("store has no file to reopen")
        again: SessionStore = reopen(store)
        assert again.list_sessions(include_ephemeral=True) == []
        assert again.chunk_generations() == []
        again.close()
        again.close()


# -- resolutions of what the protocol leaves open ------------------------------------


class TestResolutions:
    def test_duplicate_session_id_is_rejected(self, store: SessionStore) -> None:
        """create_session with an existing id raises InvalidInputError, keeps the original."""
        store.create_session("first", session_id="s")
        with pytest.raises(InvalidInputError):
            store.create_session("second", session_id="s")
        assert store.get_session("s").name == "first"

    def test_ephemeral_filter_applies_to_branch_listing(self, store: SessionStore) -> None:
        """list_sessions(parent_session_id=...) also hides ephemeral (sidecar) branches."""
        root = store.create_session().id
        side = store.create_session(parent_session_id=root, metadata={"ephemeral": True}).id
        assert store.list_sessions(parent_session_id=root) == []
        assert [s.id for s in store.list_sessions(parent_session_id=root, include_ephemeral=True)] == [side]  # fmt: skip

    def test_head_parent_without_head_uses_latest_visible(self, store: SessionStore) -> None:
        """HEAD with the head unset attaches to the message history would end at."""
        sid = store.create_session().id
        chain(store, sid, "m1", "m2")
        store.set_head(sid, None)
        store.append_message(sid, msg("m3"))
        assert ids(store.get_history(sid)) == ["m1", "m2", "m3"]

    def test_message_count_spans_all_branches(self, store: SessionStore) -> None:
        """message_count counts the session's messages on every branch, not one path."""
        sid = store.create_session().id
        chain(store, sid, "m1", "m2")
        store.append_message(sid, msg("m2b"), parent_id="m1")
        assert store.message_count(sid) == 3

    def test_children_of_unknown_message(self, store: SessionStore) -> None:
        """children() of an unknown message raises MessageNotFoundError (not [])."""
        with pytest.raises(MessageNotFoundError):
            store.children("nope")

    def test_delete_messages_reparents_and_moves_head(self, store: SessionStore) -> None:
        """Children of a deleted message move up to its nearest surviving ancestor; a
        deleted head moves the same way; unknown ids are ignored."""
        sid = store.create_session().id
        chain(store, sid, "m1", "m2", "m3", "m4")
        store.delete_messages(sid, ["m2", "unknown-id"])
        assert ids(store.get_history(sid)) == ["m1", "m3", "m4"]
        assert store.get_message_row("m3").parent_id == "m1"  # type: ignore[union-attr]
        store.delete_messages(sid, ["m4", "m3"])
        assert store.get_session(sid).head_id == "m1"
        store.delete_messages(sid, ["m1"])
        assert store.get_session(sid).head_id is None
        assert store.get_history(sid) == []

    def test_delete_oldest_keeps_the_tail(self, store: SessionStore) -> None:
        """Deleting the oldest visible messages (max_persisted_messages) keeps the rest."""
        sid = store.create_session().id
        chain(store, sid, "m1", "m2", "m3", "m4")
        store.delete_messages(sid, ["m1", "m2"])
        assert ids(store.get_history(sid)) == ["m3", "m4"]
        assert store.get_message_row("m3").parent_id is None  # type: ignore[union-attr]

    def test_set_hidden_unknown_message(self, store: SessionStore) -> None:
        """set_hidden with an id not in the session raises and hides nothing."""
        sid = store.create_session().id
        chain(store, sid, "m1")
        with pytest.raises(MessageNotFoundError):
            store.set_hidden(sid, ["m1", "ghost"], 1.0)
        assert not store.get_message_row("m1").hidden  # type: ignore[union-attr]

    def test_upsert_of_another_sessions_message(self, store: SessionStore) -> None:
        """upsert_message cannot move a message between sessions."""
        a = store.create_session().id
        b = store.create_session().id
        store.append_message(a, msg("m1"))
        with pytest.raises(InvalidInputError):
            store.upsert_message(b, msg("m1", text="stolen"))
        assert store.get_message("m1") == msg("m1")

    def test_last_write_of_a_slot_wins_within_a_flush(self, store: SessionStore) -> None:
        """Two PartWrites for one (message, index) in one flush: the later one lands."""
        sid = store.create_session().id
        store.flush_stream(
            StreamFlush(
                sid,
                message=envelope(),
                use_head=False,
                parts=[
                    PartWrite("s1", 0, {"type": "text", "text": "a"}),
                    PartWrite("s1", 0, {"type": "text", "text": "ab"}),
                ],
            )
        )
        assert store.get_message("s1")["parts"] == [{"type": "text", "text": "ab"}]  # type: ignore[index]

    def test_parts_length_needs_a_target(self, store: SessionStore) -> None:
        """parts_length applies to flush.message, else to the one message the parts
        name; with neither it is invalid input."""
        sid = store.create_session().id
        store.flush_stream(
            StreamFlush(
                sid,
                message=envelope(),
                use_head=False,
                parts=[PartWrite("s1", i, {"type": "text", "text": str(i)}) for i in range(3)],
            )
        )
        store.flush_stream(
            StreamFlush(sid, parts=[PartWrite("s1", 0, {"type": "t"})], parts_length=1)
        )
        assert store.get_message("s1")["parts"] == [{"type": "t"}]  # type: ignore[index]
        with pytest.raises(InvalidInputError):
            store.flush_stream(StreamFlush(sid, parts_length=0))

    def test_config_none_is_a_value(self, store: SessionStore) -> None:
        """A stored None is returned as None, not replaced by the default."""
        store.set_config("k", None)
        assert store.get_config("k", "default") is None

    def test_tuples_come_back_as_lists(self, store: SessionStore) -> None:
        """Payloads are JSON-like: tuples round-trip as lists."""
        sid = store.create_session().id
        store.append_message(sid, {"id": "t", "role": "user", "parts": [{"type": "x", "v": (1, 2)}]})  # fmt: skip
        assert store.get_message("t")["parts"][0]["v"] == [1, 2]  # type: ignore[index]

    def test_floats_survive(self, store: SessionStore) -> None:
        sid = store.create_session().id
        store.append_message(sid, {"id": "f", "role": "user", "parts": [{"type": "x", "v": math.pi, "inf": math.inf}]})  # fmt: skip
        part = store.get_message("f")["parts"][0]  # type: ignore[index]
        assert part["v"] == math.pi and part["inf"] == math.inf


# -- threads and clone (seed 001) --------------------------------------------------


def counts(store: SessionStore) -> tuple[int, int]:
    """(sessions, messages incl. hidden) across the store: a failed call changes neither."""
    sessions = store.list_sessions(include_ephemeral=True)
    return len(sessions), sum(store.message_count(s.id, include_hidden=True) for s in sessions)


UNSAFE_KEYS = ["", "-lead", ".hidden", "a b", "a/b", "../up", "x" * 129, "naïve", "a\nb", None, 7]


class TestThreads:
    def test_create_or_get(self, store: SessionStore) -> None:
        t = store.thread("topic-a")
        assert isinstance(t, Thread)
        assert t.key == "topic-a" and store.has_session(t.id)
        assert store.thread("topic-a") == t  # get, not a second thread
        info = store.get_session(t.id)
        assert info.thread_key == "topic-a" and info.name == "topic-a"
        assert store.get_thread("topic-a") == t

    def test_append_and_get_messages(self, store: SessionStore) -> None:
        a, b = store.thread("a"), store.thread("b")
        assert a.append(msg("a1")) and a.append(msg("a2", "assistant"))
        assert b.append(msg("b1"))
        assert not a.append(msg("a1"))  # idempotent, like append_message
        assert ids(a.get_messages()) == ["a1", "a2"]
        assert ids(b.get_messages()) == ["b1"]
        assert a.get_messages()[0] == msg("a1")

    def test_default_thread_and_plain_sessions(self, store: SessionStore) -> None:
        plain = store.create_session("chat")
        chain(store, plain.id, "p1")
        default = store.thread()
        assert default.key == DEFAULT_THREAD_KEY == "default"
        assert store.thread(None) == default == store.thread("default")
        assert default.id != plain.id
        assert [i.thread_key for i in store.list_threads()] == ["default"]
        # The session-id API is untouched by the thread API.
        assert ids(store.get_history(plain.id)) == ["p1"]

    def test_list_threads_most_recent_first(self, store: SessionStore) -> None:
        store.thread("one")
        two = store.thread("two")
        store.create_session("not a thread")
        store.thread("one").append(msg("m1"))
        assert [i.thread_key for i in store.list_threads()] == ["one", "two"]
        assert all(isinstance(i, SessionInfo) for i in store.list_threads())
        two.append(msg("m2"))
        assert [i.thread_key for i in store.list_threads()] == ["two", "one"]

    def test_delete_thread(self, store: SessionStore) -> None:
        t = store.thread("gone")
        t.append(msg("g1"))
        keep = store.thread("kept")
        store.delete_thread("gone")
        assert not store.has_session(t.id)
        assert store.get_message("g1") is None
        with pytest.raises(ThreadNotFoundError):
            store.get_thread("gone")
        with pytest.raises(SessionNotFoundError):
            t.get_messages()
        assert [i.thread_key for i in store.list_threads()] == ["kept"]
        assert store.thread("gone") != t  # the key can be used again
        assert keep.get_messages() == []

    @pytest.mark.parametrize("key", UNSAFE_KEYS)
    def test_unsafe_key_writes_nothing(self, store: SessionStore, key: Any) -> None:
        store.thread("ok")
        before = counts(store)
        with pytest.raises(InvalidInputError):
            store.thread(key) if key is not None else store.create_session(thread_key="")
        with pytest.raises(InvalidInputError):
            store.create_session("x", thread_key=key if key is not None else "-")
        with pytest.raises(InvalidInputError):
            store.clone_thread("ok", key if key is not None else "")
        assert counts(store) == before

    def test_safe_keys(self, store: SessionStore) -> None:
        for key in ("a", "A-1", "user_42.topic-b", "9", "x" * 128):
            assert store.thread(key).key == key

    def test_thread_keys_are_unique(self, store: SessionStore) -> None:
        store.thread("dup")
        before = counts(store)
        with pytest.raises(ThreadExistsError):
            store.create_session("again", thread_key="dup")
        assert counts(store) == before

    def test_unknown_thread(self, store: SessionStore) -> None:
        before = counts(store)
        for call in (
            lambda: store.get_thread("nope"),
            lambda: store.delete_thread("nope"),
            lambda: store.clone_thread("nope", "copy"),
        ):
            with pytest.raises(ThreadNotFoundError) as err:
                call()
            assert isinstance(err.value, KeyError) and "nope" in str(err.value)
        assert counts(store) == before

    def test_settings_per_thread_or_inherited(self, store: SessionStore) -> None:
        t = store.thread("s")
        assert t.settings == {} and t.get_effective_settings() == {}
        store.set_config(
            DEFAULT_SETTINGS_KEY, {"compaction": {"tail_turns": 2, "reserve_tokens": 20000}}
        )
        assert t.get_effective_settings() == {
            "compaction": {"tail_turns": 2, "reserve_tokens": 20000}
        }
        t.settings = {"compaction": {"tail_turns": 4}}
        assert t.settings == {"compaction": {"tail_turns": 4}}
        assert t.get_effective_settings() == {
            "compaction": {"tail_turns": 4, "reserve_tokens": 20000}
        }
        assert store.get_effective_settings(store.thread("other").id)["compaction"] == {
            "tail_turns": 2,
            "reserve_tokens": 20000,
        }
        with pytest.raises(SessionNotFoundError):
            store.get_effective_settings(UNKNOWN)


class TestClone:
    def test_clone_copies_history_with_new_ids(self, store: SessionStore) -> None:
        src = store.thread("src")
        src.append(msg("u1"))
        src.append(RICH)
        src.append(msg("u2"))
        dst = store.clone_thread("src", "dst")
        assert dst.key == "dst" and dst.id != src.id
        copied, original = dst.get_messages(), src.get_messages()
        assert len(copied) == 3
        new_ids = ids(copied)
        assert not set(new_ids) & set(ids(original))
        assert len(set(new_ids)) == 3
        # Envelopes (metadata) and parts verbatim; only the id changes.
        for c, o in zip(copied, original, strict=True):
            assert {**c, "id": o["id"]} == o
        rows = store.get_path(dst.id)
        assert [r.parent_id for r in rows] == [None, new_ids[0], new_ids[1]]
        assert all(r.session_id == dst.id for r in rows)
        assert store.get_session(dst.id).head_id == new_ids[-1]
        info = store.get_session(dst.id)
        assert info.thread_key == "dst"
        assert (info.parent_session_id, info.parent_message_id) == (src.id, "u2")
        assert store.get_message_row(new_ids[1]).message == {**RICH, "id": new_ids[1]}  # type: ignore[union-attr]

    def test_clone_from_a_message(self, store: SessionStore) -> None:
        src = store.thread("src")
        chain(store, src.id, "u1", "a1", "u2", "a2")
        dst = store.clone_thread("src", "dst", from_message_id="a1")
        assert [m["parts"] for m in dst.get_messages()] == [
            msg("u1")["parts"],
            msg("a1", "assistant")["parts"],
        ]
        assert store.get_session(dst.id).parent_message_id == "a1"

    def test_clone_diverges_without_touching_the_source(self, store: SessionStore) -> None:
        src = store.thread("src")
        chain(store, src.id, "u1", "a1")
        dst = src.clone("dst")
        dst.append(msg("d1"))
        src.append(msg("s1"))
        assert ids(src.get_messages()) == ["u1", "a1", "s1"]
        assert ids(dst.get_messages())[-1] == "d1" and len(dst.get_messages()) == 3

    def test_clone_copies_settings_and_skips_hidden(self, store: SessionStore) -> None:
        src = store.thread("src")
        src.settings = {"compaction": {"tail_turns": 3}}
        chain(store, src.id, "u1", "a1", "u2", "a2", "u3")
        store.set_hidden(src.id, ["a1", "u2"], 5.0)
        dst = store.clone_thread("src", "dst")
        assert [m["parts"][0]["text"] for m in dst.get_messages()] == [
            "text of u1",
            "text of a2",
            "text of u3",
        ]
        assert store.message_count(dst.id, include_hidden=True) == 3
        assert dst.settings == {"compaction": {"tail_turns": 3}}

    def test_clone_of_an_empty_thread(self, store: SessionStore) -> None:
        store.thread("empty")
        dst = store.clone_thread("empty", "copy")
        assert dst.get_messages() == [] and store.get_session(dst.id).head_id is None

    def test_clone_refuses_an_existing_destination(self, store: SessionStore) -> None:
        src = store.thread("src")
        chain(store, src.id, "u1")
        dst = store.thread("dst")
        dst.append(msg("d1"))
        before = counts(store)
        with pytest.raises(ThreadExistsError):
            store.clone_thread("src", "dst")
        assert counts(store) == before
        assert ids(dst.get_messages()) == ["d1"]

    def test_clone_from_a_message_off_the_visible_history(self, store: SessionStore) -> None:
        src = store.thread("src")
        chain(store, src.id, "u1", "a1", "u2", "a2")
        store.append_message(src.id, msg("alt", "user"), parent_id="a1")  # another branch
        store.set_head(src.id, "a2")
        store.set_hidden(src.id, ["u2"], 1.0)
        other = store.thread("other")
        other.append(msg("o1"))
        before = counts(store)
        with pytest.raises(NotOnPathError, match="not on the current path"):
            store.clone_thread("src", "dst", from_message_id="alt")
        with pytest.raises(NotOnPathError, match="hidden"):
            store.clone_thread("src", "dst", from_message_id="u2")
        with pytest.raises(MessageNotFoundError):
            store.clone_thread("src", "dst", from_message_id="o1")  # another thread's
        with pytest.raises(MessageNotFoundError):
            store.clone_thread("src", "dst", from_message_id="missing")
        assert isinstance(NotOnPathError("x"), InvalidInputError)
        assert counts(store) == before
        with pytest.raises(ThreadNotFoundError):
            store.get_thread("dst")

    def test_threads_survive_reopen(self, store: SessionStore, reopen: Any) -> None:
        if reopen is None:
            pytest.skip("store has no file")
        src = store.thread("src")
        chain(store, src.id, "u1", "a1")
        dst = store.clone_thread("src", "dst")
        copied = dst.get_messages()
        store = reopen(store)
        assert [i.thread_key for i in store.list_threads()] == ["dst", "src"]
        assert store.get_thread("dst").get_messages() == copied
        store.get_thread("dst").append(msg("after"))  # seq and ids still line up
        assert ids(store.get_thread("dst").get_messages())[-1] == "after"


# -- branch (seed 002) -------------------------------------------------------------


def usage_msg(mid: str, **usage: Any) -> dict[str, Any]:
    return msg(mid, "assistant", metadata={"usage": usage})


class TestBranch:
    def test_copies_the_visible_path_up_to_the_fork(self, store: SessionStore) -> None:
        parent = store.create_session("main").id
        chain(store, parent, "u1")
        store.append_message(parent, RICH)
        chain(store, parent, "u2", "a2", "u3")
        store.set_hidden(parent, ["a2"], 2.0)
        info = store.branch_session(parent, "u3")
        assert info.parent_session_id == parent and info.parent_message_id == "u3"
        assert info.name == "main" and info.thread_key is None
        history = store.get_history(info.id)
        assert [m["parts"] for m in history] == [
            msg("u1")["parts"],
            RICH["parts"],
            msg("u2")["parts"],
            msg("u3")["parts"],
        ]
        assert history[1]["metadata"] == RICH["metadata"]
        assert not set(ids(history)) & {"u1", "rich", "u2", "u3"}
        assert store.get_session(info.id).head_id == ids(history)[-1] == info.head_id
        assert store.message_count(info.id, include_hidden=True) == 4  # hidden ones skipped
        assert store.get_session(info.id).to_dict() == info.to_dict()

    def test_fork_point_in_the_middle(self, store: SessionStore) -> None:
        parent = store.create_session().id
        chain(store, parent, "u1", "a1", "u2", "a2")
        info = store.branch_session(parent, "a1")
        assert [m["parts"][0]["text"] for m in store.get_history(info.id)] == [
            "text of u1",
            "text of a1",
        ]
        # New turns append only to the branch.
        store.append_message(info.id, msg("b1"))
        assert ids(store.get_history(parent)) == ["u1", "a1", "u2", "a2"]
        assert ids(store.get_history(info.id))[-1] == "b1"

    def test_only_the_current_path_is_copied(self, store: SessionStore) -> None:
        parent = store.create_session().id
        chain(store, parent, "u1", "a1", "u2")
        store.append_message(parent, msg("alt"), parent_id="a1")
        store.set_head(parent, "u2")
        info = store.branch_session(parent, "u2")
        assert [m["parts"][0]["text"] for m in store.get_history(info.id)] == [
            "text of u1",
            "text of a1",
            "text of u2",
        ]
        assert store.message_count(info.id, include_hidden=True) == 3

    def test_rollups_recomputed_from_the_copies(self, store: SessionStore) -> None:
        parent = store.create_session().id
        store.append_message(parent, msg("u1"))
        store.append_message(parent, usage_msg("a1", input=100, output=20, cache_read=50))
        store.append_message(parent, msg("u2"))
        store.append_message(
            parent,
            usage_msg("a2", input=7, output=3, reasoning=2, cache_write=4, cost_usd=0.5),
        )
        store.append_message(parent, msg("u3"))
        store.append_message(parent, usage_msg("a3", input=1000, output=1))
        store.add_usage(parent, {"input": 999_999})  # the parent's row is not the source
        info = store.branch_session(parent, "a2")
        assert info.usage == {
            "prompt_tokens": 107,
            "completion_tokens": 23,
            "reasoning_tokens": 2,
            "cache_read": 50,
            "cache_write": 4,
            "total_tokens": 186,
            "cost_usd": 0.5,
        }
        assert info.context_window_used == 186
        early = store.branch_session(parent, "a1")
        assert early.usage["total_tokens"] == 170 and early.usage["cost_usd"] is None
        store.set_hidden(parent, ["a1"], 3.0)  # hidden messages are neither copied nor counted
        assert store.branch_session(parent, "u3").usage["prompt_tokens"] == 7

    def test_metadata_model_settings(self, store: SessionStore) -> None:
        parent = store.create_session(
            "p", metadata={"agent": "coder", "tag": 1}, model={"model_id": "big"}
        ).id
        store.update_session(parent, settings={"workspace": "/w"}, permissions={"bash": "allow"})
        chain(store, parent, "u1")
        info = store.branch_session(parent, "u1", metadata={"tag": 2, "note": "x"}, name="b")
        assert info.metadata == {"agent": "coder", "tag": 2, "note": "x"}
        assert info.model == {"model_id": "big"} and info.settings == {"workspace": "/w"}
        assert info.permissions == {}  # session-scope rules are "this session only"
        assert info.name == "b"
        assert store.get_session(parent).metadata == {"agent": "coder", "tag": 1}

    def test_ephemeral_branches_and_listing(self, store: SessionStore) -> None:
        parent = store.create_session().id
        chain(store, parent, "u1")
        kept = store.branch_session(parent, "u1")
        side = store.branch_session(parent, "u1", metadata={"ephemeral": True})
        assert side.ephemeral
        listed = [s.id for s in store.list_sessions()]
        assert kept.id in listed and side.id not in listed
        assert side.id in [s.id for s in store.list_sessions(include_ephemeral=True)]
        assert [s.id for s in store.list_sessions(parent_session_id=parent)] == [kept.id]
        assert {
            s.id for s in store.list_sessions(parent_session_id=parent, include_ephemeral=True)
        } == {kept.id, side.id}

    def test_branch_of_a_branch(self, store: SessionStore) -> None:
        parent = store.create_session().id
        chain(store, parent, "u1", "a1")
        first = store.branch_session(parent, "a1")
        second = store.branch_session(first.id, first.head_id)  # type: ignore[arg-type]
        assert second.parent_session_id == first.id
        assert [m["parts"] for m in store.get_history(second.id)] == [
            m["parts"] for m in store.get_history(parent)
        ]

    def test_bad_fork_points_write_nothing(self, store: SessionStore) -> None:
        parent = store.create_session().id
        chain(store, parent, "u1", "a1", "u2", "a2")
        store.append_message(parent, msg("alt"), parent_id="a1")
        store.set_head(parent, "a2")
        store.set_hidden(parent, ["u2"], 1.0)
        other = store.create_session().id
        chain(store, other, "o1")
        before = counts(store)
        with pytest.raises(NotOnPathError):
            store.branch_session(parent, "alt")
        with pytest.raises(NotOnPathError):
            store.branch_session(parent, "u2")  # hidden
        with pytest.raises(MessageNotFoundError):
            store.branch_session(parent, "o1")
        with pytest.raises(MessageNotFoundError):
            store.branch_session(parent, "missing")
        with pytest.raises(SessionNotFoundError):
            store.branch_session(UNKNOWN, "u1")
        with pytest.raises(InvalidInputError):
            store.branch_session(parent, "u1", metadata=["not", "a", "dict"])  # type: ignore[arg-type]
        assert counts(store) == before


# -- rewind (seed 002) -------------------------------------------------------------


def compaction(mid: str, **data: Any) -> dict[str, Any]:
    return {
        "id": mid,
        "role": "assistant",
        "metadata": {"compaction": True},
        "parts": [{"type": "data-compaction", "data": {"summary": "s", "auto": True, **data}}],
    }


def compacted(store: SessionStore, **data: Any) -> str:
    """u1 a1 u2 a2 | u3 a3 | c1: a compaction appended at the head that summarized
    u1..a2 (soft-hidden) and keeps u3 a3 verbatim."""
    sid = store.create_session().id
    chain(store, sid, "u1", "a1", "u2", "a2", "u3", "a3")
    store.append_message(sid, compaction("c1", tail_start_id="u3", **data))
    store.set_hidden(sid, ["u1", "a1", "u2", "a2"], 10.0)
    return sid


class TestRewind:
    def test_rewind_hides_everything_after(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "u1", "a1", "u2", "a2", "u3", "a3")
        info = store.rewind_session(sid, "u2")
        assert isinstance(info, RewindInfo)
        assert info.hidden_ids == ["a2", "u3", "a3"] and info.unhidden_ids == []
        assert info.head_before == "a3" and info.head_id == "u2"
        assert info.target.id == "u2" and info.target.message == msg("u2")
        assert ids(store.get_history(sid)) == ["u1", "a1", "u2"]
        # Hidden, never deleted: inspectable from the old head.
        path = store.get_path(sid, leaf_id="a3")
        assert [(r.id, r.hidden) for r in path] == [
            ("u1", False),
            ("a1", False),
            ("u2", False),
            ("a2", True),
            ("u3", True),
            ("a3", True),
        ]
        assert path[3].hidden_at == info.hidden_at
        assert store.message_count(sid, include_hidden=True) == 6
        # The next turn appends after the target.
        store.append_message(sid, msg("a2b", "assistant"))
        assert store.get_message_row("a2b").parent_id == "u2"  # type: ignore[union-attr]
        assert ids(store.get_history(sid)) == ["u1", "a1", "u2", "a2b"]

    def test_include_target_resends_at_the_parent(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "u1", "a1", "u2", "a2")
        info = store.rewind_session(sid, "u2", include_target=True)
        assert info.hidden_ids == ["u2", "a2"] and info.head_id == "a1"
        assert info.include_target
        store.append_message(sid, msg("u2-edited"))
        assert ids(store.get_history(sid)) == ["u1", "a1", "u2-edited"]
        assert ids(store.children("a1")) == ["u2", "u2-edited"]
        first = store.rewind_session(sid, "u1", include_target=True)
        assert first.head_id is None
        assert store.get_history(sid) == []

    def test_rewind_to_a_non_user_message_writes_nothing(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "u1", "a1", "u2", "a2")
        store.append_message(sid, msg("alt"), parent_id="a1")
        store.set_head(sid, "a2")
        before, session = counts(store), store.get_session(sid)
        with pytest.raises(NotOnPathError, match="user message"):
            store.rewind_session(sid, "a1")
        with pytest.raises(NotOnPathError, match="current path"):
            store.rewind_session(sid, "alt")
        with pytest.raises(MessageNotFoundError):
            store.rewind_session(sid, "missing")
        with pytest.raises(SessionNotFoundError):
            store.rewind_session(UNKNOWN, "u1")
        assert counts(store) == before
        assert_nothing_written(store, sid, session)
        assert store.message_count(sid) == 5
        with pytest.raises(InvalidInputError):
            store.unrewind_session(sid)  # nothing was rewound

    @pytest.mark.parametrize(
        "covers",
        [
            None,
            ["u1", "a1", "u2", "a2"],
            {"from_id": "u1", "to_id": "a2"},
            {"first_id": "u1", "last_id": "a2"},
        ],
        ids=["tail_start_id", "covers-list", "covers-range", "covers-first-last"],
    )
    def test_rewind_past_a_compaction_unhides_what_it_summarized(
        self, store: SessionStore, covers: Any
    ) -> None:
        sid = compacted(store, **({"covers": covers} if covers is not None else {}))
        assert ids(store.get_history(sid)) == ["u3", "a3", "c1"]
        info = store.rewind_session(sid, "u2")
        assert info.unhidden_ids == ["u1", "a1", "u2"]
        assert info.hidden_ids == ["u3", "a3", "c1"]  # a2 keeps its compaction hiding
        assert ids(store.get_history(sid)) == ["u1", "a1", "u2"]
        assert store.get_message_row("a2").hidden_at == 10.0  # type: ignore[union-attr]

    def test_rewind_after_a_compaction_keeps_it(self, store: SessionStore) -> None:
        sid = compacted(store)
        chain(store, sid, "u4", "a4")
        info = store.rewind_session(sid, "u4")
        assert info.unhidden_ids == [] and info.hidden_ids == ["a4"]
        assert ids(store.get_history(sid)) == ["u3", "a3", "c1", "u4"]
        # A summarized message cannot be a target unless the rewind goes past its summary.
        info = store.rewind_session(sid, "u1")
        assert "c1" in info.hidden_ids and ids(store.get_history(sid)) == ["u1"]

    def test_an_earlier_compaction_still_on_the_path_keeps_its_summary(
        self, store: SessionStore
    ) -> None:
        sid = compacted(store)
        chain(store, sid, "u4", "a4", "u5", "a5")
        store.append_message(sid, compaction("c2", tail_start_id="u5"))
        store.set_hidden(sid, ["u3", "a3", "c1", "u4", "a4"], 20.0)
        assert ids(store.get_history(sid)) == ["u5", "a5", "c2"]
        info = store.rewind_session(sid, "u4")  # past c2, not past c1
        assert info.unhidden_ids == ["u3", "a3", "c1", "u4"]
        assert ids(store.get_history(sid)) == ["u3", "a3", "c1", "u4"]

    def test_compaction_hidden_at_narrows_its_range(self, store: SessionStore) -> None:
        """A range that spans messages an earlier compaction hid gives back only what
        this one hid (those it records ``hidden_at`` for)."""
        sid = compacted(store, covers={"first_id": "u1", "last_id": "a2"}, hidden_at=10.0)
        store.set_hidden(sid, ["a1"], 5.0)  # hidden earlier, by something else
        info = store.rewind_session(sid, "u2")
        assert info.unhidden_ids == ["u1", "u2"]
        assert ids(store.get_history(sid)) == ["u1", "u2"]

    def test_unrewind_moves_the_pointer_back(self, store: SessionStore) -> None:
        sid = compacted(store)
        chain(store, sid, "u4", "a4")
        before = store.get_history(sid)
        rewound = store.rewind_session(sid, "u2")
        undone = store.unrewind_session(sid)
        assert isinstance(undone, UnrewindInfo)
        assert undone.head_id == "a4" and undone.detached_ids == []
        assert undone.unhidden_ids == rewound.hidden_ids == ["u3", "a3", "c1", "u4", "a4"]
        assert undone.rehidden_ids == ["u1", "a1", "u2"]
        assert store.get_history(sid) == before
        assert store.get_message_row("u1").hidden_at == 10.0  # type: ignore[union-attr]
        with pytest.raises(InvalidInputError):
            store.unrewind_session(sid)

    def test_unrewind_keeps_later_turns_on_their_own_branch(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "u1", "a1", "u2", "a2")
        store.rewind_session(sid, "u2", include_target=True)
        chain(store, sid, "u2b", "a2b")
        undone = store.unrewind_session(sid)
        assert undone.detached_ids == ["u2b", "a2b"]
        assert ids(store.get_history(sid)) == ["u1", "a1", "u2", "a2"]
        assert ids(store.children("a1")) == ["u2", "u2b"]
        assert ids(store.get_history(sid, leaf_id="a2b")) == ["u1", "a1", "u2b", "a2b"]
        assert not store.get_message_row("a2b").hidden  # type: ignore[union-attr]

    def test_unrewinds_unwind_in_order(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "u1", "a1", "u2", "a2", "u3", "a3")
        store.rewind_session(sid, "u3")
        store.rewind_session(sid, "u1")
        assert ids(store.get_history(sid)) == ["u1"]
        assert store.unrewind_session(sid).head_id == "u3"
        assert ids(store.get_history(sid)) == ["u1", "a1", "u2", "a2", "u3"]
        assert store.unrewind_session(sid).head_id == "a3"
        assert ids(store.get_history(sid)) == ["u1", "a1", "u2", "a2", "u3", "a3"]

    def test_unrewind_refused_after_a_compaction_since(self, store: SessionStore) -> None:
        sid = store.create_session().id
        chain(store, sid, "u1", "a1", "u2", "a2")
        store.rewind_session(sid, "u2")
        chain(store, sid, "a2b")
        store.append_message(sid, compaction("c", tail_start_id="u2"))
        store.set_hidden(sid, ["u1", "a1"], time.time() + 10)
        before = store.get_session(sid)
        hidden = [r.hidden_at for r in store.get_path(sid)]
        with pytest.raises(InvalidInputError, match="compacted"):
            store.unrewind_session(sid)
        assert store.get_session(sid).head_id == before.head_id
        assert [r.hidden_at for r in store.get_path(sid)] == hidden

    def test_rewind_log_survives_reopen_and_goes_with_the_session(
        self, store: SessionStore, reopen: Any
    ) -> None:
        if reopen is None:
            pytest.skip("store has no file")
        sid = store.create_session().id
        chain(store, sid, "u1", "a1", "u2", "a2")
        store.rewind_session(sid, "u2")
        store = reopen(store)
        assert store.unrewind_session(sid).head_id == "a2"
        store.rewind_session(sid, "u1")
        store.clear_messages(sid)
        chain(store, sid, "n1")
        with pytest.raises(InvalidInputError):
            store.unrewind_session(sid)
