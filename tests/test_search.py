"""Search across an agent's sessions (issue 25, part 4): the store's index and ranking,
``Think.search`` and the ``search_history`` model tool (driven by the scripted model).
The HTTP route and its ownership are in ``tests/security/test_sec_search_http.py``."""

from __future__ import annotations

import pytest
from thinkray.runtime import Think
from thinkray.runtime.models.testing import ScriptedModel, reply, tool_call
from thinkray.runtime.tools.history import search_history_tool
from thinkray.storage import DuckDBSessionStore, SearchHit
from thinkray.storage import search as search_mod
from thinkray.storage.testing.session_store_suite import compaction
from thinkray.storage.types import (
    InvalidInputError,
    PartWrite,
    SessionNotFoundError,
    StreamFlush,
)


def msg(mid: str, text: str, role: str = "user", state: str | None = None) -> dict:
    part = {"type": "text", "text": text}
    if state is not None:
        part["state"] = state
    return {"id": mid, "role": role, "parts": [part]}


def say(store, sid: str, *pairs: tuple[str, str]) -> None:
    for i, (mid, text) in enumerate(pairs):
        assert store.append_message(sid, msg(mid, text, "user" if i % 2 == 0 else "assistant"))


def found(store, query: str, **kw) -> list[str]:
    return [h.message_id for h in store.search_messages(query, **kw)]


def index_rows(store, mid: str) -> int:
    row = store.db.fetchone(
        "SELECT count(*) FROM search_index WHERE doc IN "
        "(SELECT doc FROM search_index WHERE term IS NULL AND message_id = ?)",
        [mid],
    )
    return row[0]


def pending(store) -> list[str]:
    """The documents tokenized at write time and waiting for their batch's INSERT."""
    return [d.message_id for d in search_mod._state(store.db).pending]


# -- ranking -----------------------------------------------------------------------------


def test_bm25_ranks_by_rarity_frequency_and_length(store):
    sid = store.create_session().id
    filler = " ".join(f"filler{i}" for i in range(60))
    say(
        store,
        sid,
        ("once", "the kettle is on the stove"),
        ("twice", "kettle kettle: the kettle whistles"),
        ("long", f"the kettle {filler}"),
        ("none", "the stove is hot"),
        ("other", "the teapot is on the table"),
    )
    # More occurrences beat fewer; the same count in a longer text scores lower.
    assert found(store, "kettle") == ["twice", "once", "long"]
    # A rare word outweighs a common one ("the" is everywhere).
    assert found(store, "the teapot")[0] == "other"
    # Every word of the query counts: both words beat either alone.
    assert found(store, "kettle stove")[0] == "once"
    hits = store.search_messages("kettle")
    assert all(isinstance(h, SearchHit) for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert hits[0].session_id == sid and hits[0].role == "assistant"
    assert store.search_messages("kettle", limit=1)[0].message_id == "twice"


def test_words_are_unicode_and_case_insensitive(store):
    sid = store.create_session().id
    say(
        store,
        sid,
        ("fr", "Un CAFÉ crème, s'il vous plaît"),
        ("de", "Die Straße ist lang"),
        ("tr", "İstanbul is large"),
        ("ja", "東京の天気は晴れです"),
        ("ru", "Привет, МИР"),
    )
    assert found(store, "cafe") == ["fr"]
    assert found(store, "Café") == ["fr"]
    assert found(store, "STRASSE") == ["de"]
    assert found(store, "istanbul") == ["tr"]
    assert found(store, "天気") == ["ja"]
    assert found(store, "мир") == ["ru"]
    assert found(store, "absent") == []


def test_session_filter_and_unknown_session(store):
    a = store.create_session("a").id
    b = store.create_session("b").id
    say(store, a, ("a1", "quarterly budget review"))
    say(store, b, ("b1", "budget for the trip"))
    assert sorted(found(store, "budget")) == ["a1", "b1"]
    assert found(store, "budget", session_id=b) == ["b1"]
    assert {h.session_id for h in store.search_messages("budget", session_id=a)} == {a}
    with pytest.raises(SessionNotFoundError):
        store.search_messages("budget", session_id="no-such-session")


def test_snippet_is_cut_around_the_match_and_highlights_it(store):
    sid = store.create_session().id
    before = " ".join(f"word{i}" for i in range(80))
    after = " ".join(f"tail{i}" for i in range(80))
    say(store, sid, ("m", f"{before} the Zeppelin landed {after}"))
    hit = store.search_messages("zeppelin")[0]
    assert hit.snippet.startswith("…") and hit.snippet.endswith("…")
    assert len(hit.snippet) <= search_mod.SNIPPET_CHARS + 2
    [(start, end)] = hit.highlights
    assert hit.snippet[start:end] == "Zeppelin"
    assert hit.part_index == 0 and hit.created_at > 0
    short = store.create_session().id
    say(store, short, ("s", "A short zeppelin note"))
    hit = store.search_messages("zeppelin", session_id=short)[0]
    assert hit.snippet == "A short zeppelin note" and hit.highlights == [[8, 16]]


# -- incremental indexing ------------------------------------------------------------------


def has_index(store) -> bool:
    return bool(
        store.db.fetchall(
            "SELECT 1 FROM duckdb_tables() WHERE table_name = 'search_index' AND database_name = current_database()"
        )
    )


def test_messages_are_indexed_as_they_are_written(store):
    sid = store.create_session().id
    say(store, sid, ("u1", "first words about gardens"))
    # An agent that never searched keeps no index: its writes cost nothing.
    assert not has_index(store)
    assert found(store, "gardens") == ["u1"]  # the first search makes it (and fills it)
    assert has_index(store)
    # Written after a search: tokenized as it is written, its rows written with the
    # batch (at the latest by the next search).
    say(store, sid, ("u2", "orchids in the garden"))
    assert pending(store) == ["u2"] and index_rows(store, "u2") == 0
    assert found(store, "orchids") == ["u2"]
    assert pending(store) == [] and index_rows(store, "u2") > 0


def test_documents_go_in_by_batches_and_the_flag_tells_when_one_waits(store):
    sid = store.create_session().id
    found(store, "warm")  # makes the index
    assert store.get_config("search.backfilled") is True
    # (store.db folds the journal: on a file the words reach the index with that write)
    with store.counting() as count:
        say(store, sid, ("m0", "the first word of a batch"))
        store.db  # noqa: B018
    # The write that starts a batch marks the index incomplete in the same commit.
    assert store.get_config("search.backfilled") is False
    with store.counting() as later:
        say(store, sid, ("m1", "a second word waits too"))
        store.db  # noqa: B018
    assert later.statements < count.statements  # no flag write, no INSERT: it waits
    say(store, sid, *[(f"m{i}", f"word number {i}") for i in range(2, search_mod.PENDING_DOCS)])
    # The batch is full: written by the write that filled it, and the flag set again.
    assert pending(store) == []
    assert index_rows(store, "m0") > 0 and index_rows(store, "m31") > 0
    assert store.get_config("search.backfilled") is True


def test_waiting_documents_are_written_at_close(tmp_path):
    path = tmp_path / "agent.duckdb"
    store = DuckDBSessionStore(path)
    sid = store.create_session().id
    found(store, "warm")
    say(store, sid, ("u1", "a note about lighthouses"))
    assert pending(store) == ["u1"]
    store.close()
    store = DuckDBSessionStore(path)
    try:
        assert index_rows(store, "u1") > 0
        assert store.get_config("search.backfilled") is True  # complete: no backfill
        assert found(store, "lighthouses") == ["u1"]
    finally:
        store.close()


_KILLED_WRITER = """
import os, signal, sys
from thinkray.storage import DuckDBSessionStore
store = DuckDBSessionStore(sys.argv[1])
sid = store.create_session().id
store.search_messages("warm")
for i, text in enumerate(["a note about lighthouses", "the keeper's logbook"]):
    role = "user" if i == 0 else "assistant"
    store.append_message(sid, {"id": f"m{i}", "role": role,
                               "parts": [{"type": "text", "text": text}]})
os.kill(os.getpid(), signal.SIGKILL)  # the batch still waits in memory
"""


def test_a_crash_before_the_batch_is_written_is_backfilled_by_the_next_search(tmp_path):
    import signal
    import subprocess
    import sys

    path = tmp_path / "agent.duckdb"
    done = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(path)], timeout=60)
    assert done.returncode == -signal.SIGKILL
    store = DuckDBSessionStore(path)
    try:
        assert store.get_config("search.backfilled") is False  # committed with m0
        assert index_rows(store, "m0") == 0  # the batch died with the process
        assert found(store, "lighthouses") == ["m0"]
        assert found(store, "logbook") == ["m1"]
        assert store.get_config("search.backfilled") is True
    finally:
        store.close()


def test_a_rollback_drops_its_own_documents_and_keeps_the_committed_ones(store):
    sid = store.create_session().id
    found(store, "warm")
    say(store, sid, ("u1", "committed lighthouses"))
    with pytest.raises(RuntimeError), store.db.transaction():
        say(store, sid, ("u2", "rolled back lighthouses"))
        raise RuntimeError("the write fails after its part was indexed")
    say(store, sid, ("u3", "later lighthouses"))
    assert sorted(found(store, "lighthouses")) == ["u1", "u3"]
    assert index_rows(store, "u2") == 0


def test_a_streaming_part_is_indexed_once_it_is_done(store):
    sid = store.create_session().id
    say(store, sid, ("u1", "tell me about comets"))
    assert found(store, "comets") == ["u1"]

    def flush(text, state, message=None):
        part = {"type": "text", "text": text, "state": state}
        store.flush_stream(
            StreamFlush(
                session_id=sid,
                message=message,
                parent_id="u1" if message else None,
                parts=[PartWrite("a1", 0, part)],
            )
        )

    flush("Comets are", "streaming", {"id": "a1", "role": "assistant"})
    flush("Comets are icy bodies", "streaming")
    assert index_rows(store, "a1") == 0  # a part still streaming is not indexed
    assert found(store, "icy") == []
    flush("Comets are icy bodies with tails", "done")
    assert pending(store) == ["a1"]
    assert found(store, "icy tails") == ["a1"]


def test_a_rewritten_part_is_found_by_its_new_text_only(store):
    sid = store.create_session().id
    say(store, sid, ("u1", "the old wording"))
    store.upsert_message(sid, msg("u1", "the new phrasing"))
    assert found(store, "wording") == []
    assert found(store, "phrasing") == ["u1"]
    # The same through a stream flush that rewrites a finished part in place.
    part = {"type": "text", "text": "a rewritten answer", "state": "done"}
    store.flush_stream(StreamFlush(session_id=sid, parts=[PartWrite("u1", 0, part)]))
    assert found(store, "phrasing") == []
    assert found(store, "rewritten") == ["u1"]


def test_messages_stored_before_the_index_are_backfilled_once(tmp_path):
    path = tmp_path / "old.duckdb"
    store = DuckDBSessionStore(path)
    sid = store.create_session().id
    # Never searched: what a file written before the index existed looks like too.
    say(store, sid, ("u1", "legacy archive notes"), ("a1", "about the archive"))
    assert not has_index(store)
    store.close()
    store = DuckDBSessionStore(path)
    try:
        assert sorted(found(store, "archive")) == ["a1", "u1"]
        assert store.get_config("search.backfilled") is True
        state = search_mod._state(store.db)
        assert search_mod.backfill(store.db, state) == 0  # once: done, and so recorded
        store.close()
        store = DuckDBSessionStore(path)
        assert search_mod.backfill(store.db, search_mod._state(store.db)) == 0
        say(store, sid, ("u2", "a new archive entry"))  # indexed as written from now on
        assert pending(store) == ["u2"]
        assert sorted(found(store, "archive")) == ["a1", "u1", "u2"]
    finally:
        store.close()


# -- rewind, branch, deletion, compaction ---------------------------------------------------


def test_rewound_messages_are_not_found_until_unrewound(store):
    sid = store.create_session().id
    say(
        store,
        sid,
        ("u1", "plan a picnic"),
        ("a1", "bring sandwiches"),
        ("u2", "and lemonade"),
        ("a2", "lemonade and sandwiches it is"),
    )
    assert sorted(found(store, "sandwiches")) == ["a1", "a2"]
    store.rewind_session(sid, "u2", include_target=True)
    assert found(store, "sandwiches") == ["a1"]
    assert found(store, "lemonade") == []
    store.unrewind_session(sid)
    assert sorted(found(store, "lemonade")) == ["a2", "u2"]


def test_a_branch_is_searchable_up_to_its_fork_point(store):
    sid = store.create_session().id
    say(store, sid, ("u1", "volcano facts"), ("a1", "magma rises"), ("u2", "and geysers"))
    branch = store.branch_session(sid, "a1")
    in_branch = store.search_messages("magma", session_id=branch.id)
    assert len(in_branch) == 1 and in_branch[0].message_id != "a1"
    assert store.get_message(in_branch[0].message_id)["parts"][0]["text"] == "magma rises"
    assert found(store, "geysers", session_id=branch.id) == []
    assert {h.session_id for h in store.search_messages("magma")} == {sid, branch.id}
    # A message written to the branch afterwards is indexed there.
    store.append_message(branch.id, msg("b1", "more geysers here"))
    assert found(store, "geysers", session_id=branch.id) == ["b1"]


def test_deleted_messages_sessions_and_cleared_ones_leave_the_index(store):
    a = store.create_session().id
    b = store.create_session().id
    c = store.create_session().id
    say(store, a, ("a1", "secret recipe"), ("a2", "the secret is salt"))
    say(store, b, ("b1", "another secret"))
    say(store, c, ("c1", "secret plans"))
    store.delete_messages(a, ["a2"])
    assert sorted(found(store, "secret")) == ["a1", "b1", "c1"]
    assert index_rows(store, "a2") == 0
    store.delete_session(b)
    store.clear_messages(c)
    assert found(store, "secret") == ["a1"]
    assert index_rows(store, "b1") == 0 and index_rows(store, "c1") == 0


def test_what_a_compaction_summarized_stays_searchable(store):
    sid = store.create_session().id
    say(
        store,
        sid,
        ("u1", "the wifi password is swordfish"),
        ("a1", "noted"),
        ("u2", "thanks"),
        ("a2", "welcome"),
    )
    store.append_message(sid, compaction("c1", tail_start_id="u2", hidden_at=10.0))
    store.set_hidden(sid, ["u1", "a1"], 10.0)
    assert "u1" not in [m["id"] for m in store.get_history(sid)]
    assert found(store, "swordfish") == ["u1"]
    # Hidden by anything but a live compaction (a rewind, by hand): not found.
    store.set_hidden(sid, ["u1"], 11.0)
    assert found(store, "swordfish") == []


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "kw", "reason"),
    [
        ("", {}, "empty"),
        ("   ", {}, "empty"),
        ("?!… --", {}, "no searchable words"),
        ("x" * 1001, {}, "at most 1000"),
        (" ".join(f"w{i}" for i in range(33)), {}, "at most 32"),
        (None, {}, "must be a string"),
        ("ok", {"limit": 0}, "limit"),
        ("ok", {"limit": 101}, "limit"),
        ("ok", {"limit": True}, "limit"),
        ("ok", {"limit": "5"}, "limit"),
        ("ok", {"session_id": ""}, "session_id"),
    ],
)
def test_bad_input_is_a_clear_error(store, query, kw, reason):
    sid = store.create_session().id
    say(store, sid, ("u1", "ok fine"))
    with pytest.raises(InvalidInputError, match=reason):
        store.search_messages(query, **kw)
    assert found(store, "fine") == ["u1"]  # nothing was lost or changed


def test_limit_bounds_and_many_hits(store):
    sid = store.create_session().id
    say(store, sid, *[(f"m{i}", f"common word number {i}") for i in range(150)])
    assert len(found(store, "common", limit=100)) == 100
    assert len(found(store, "common")) == 10
    assert len(set(found(store, "common", limit=100))) == 100


# -- the agent: Think.search and the search_history tool -----------------------------------


class Searching(Think):
    def get_tools(self):
        return {"search_history": search_history_tool(self)}


async def test_think_search_finds_both_sides_of_a_turn(store):
    agent = Think(store, model=ScriptedModel([reply("Photosynthesis turns light into sugar")]))
    result = await agent.chat("How does photosynthesis work?")
    hits = agent.search("photosynthesis")
    assert {h.role for h in hits} == {"user", "assistant"}
    assert {h.session_id for h in hits} == {result.session_id}
    assert agent.search("sugar")[0].message_id == result.message_id
    with pytest.raises(InvalidInputError):
        agent.search("")


async def test_the_model_searches_its_history_with_the_tool(store):
    model = ScriptedModel(
        [
            reply("Noted: the launch code is PELICAN-42."),
            reply(tool_call("search_history", {"query": "launch code"})),
            reply("It was PELICAN-42."),
            reply(tool_call("search_history", {"query": "   "})),
            reply("I could not search that."),
        ]
    )
    agent = Searching(store, model=model)
    first = await agent.chat("Remember: the launch code is PELICAN-42.")
    agent.create_session("later")
    result = await agent.chat("What was the launch code?")
    assert result.text == "It was PELICAN-42."
    [tool_part] = [
        p for m in agent.get_history() for p in m["parts"] if p["type"] == "dynamic-tool"
    ]
    assert tool_part["state"] == "output-available"
    hits = tool_part["output"]["hits"]
    # The earlier session's messages are found (beside the question just asked).
    earlier = [h for h in hits if h["session_id"] == first.session_id]
    assert {h["role"] for h in earlier} == {"user", "assistant"}
    assert all("PELICAN" in h["snippet"] for h in earlier)
    # The tool was given to the model with its schema.
    spec = {t.name: t for t in model.requests[1].tools}["search_history"]
    assert spec.input_schema["required"] == ["query"]
    # A bad query goes back to the model as the tool's error; the turn goes on.
    result = await agent.chat("Search for nothing")
    assert result.text == "I could not search that."
    errors = [
        p
        for m in agent.get_history()
        for p in m["parts"]
        if p["type"] == "dynamic-tool" and p["state"] == "output-error"
    ]
    assert len(errors) == 1 and "query" in errors[0]["errorText"]
