"""A built history skips the young collections (``session_store._no_gc``).

Reading a 10,000-message history makes ~50,000 lists and dicts. Left in the young
generation, the first collection after the read walks every one of them (~5 ms), and
the next middle one again, although none is part of a cycle: they are freed by their
reference counts. A large read moves them to the oldest generation instead; a small
one leaves the young collections to do their (cheap) work; neither touches the objects
an application froze (``gc.freeze``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
from thinkray.storage.session_store import PROMOTE_FROM, DuckDBSessionStore

MESSAGES = 3_000  # ~4 containers each: over PROMOTE_FROM


def _message(i: int) -> dict[str, object]:
    role = "user" if i % 2 == 0 else "assistant"
    parts = [{"type": "text", "text": f"message {i}"}, {"type": "data-x", "data": {"i": [i]}}]
    return {"id": f"m{i}", "role": role, "metadata": {"n": {"i": i}}, "parts": parts}


@pytest.fixture
def reopened(tmp_path: Path) -> Iterator[tuple[DuckDBSessionStore, str]]:
    path = tmp_path / "agent.duckdb"
    store = DuckDBSessionStore(path)
    sid = store.thread("main").id
    store.append_messages(sid, [_message(i) for i in range(MESSAGES)])
    store.close()
    store = DuckDBSessionStore(path)  # a wake: nothing of the session in memory
    yield store, sid
    store.close()


def _containers(history: list[dict[str, object]]) -> list[object]:
    out: list[object] = []
    for message in history:
        out += [message, message["parts"], message["metadata"]]
        out += list(message["parts"])  # type: ignore[call-overload]
    return [o for o in out if gc.is_tracked(o)]


@pytest.fixture
def nothing_frozen() -> Iterator[None]:
    """The suite freezes what its collection built (tests/conftest.py); an application
    that froze nothing is the case under test."""
    count = gc.get_freeze_count()
    gc.unfreeze()
    yield
    if count:
        gc.freeze()


def test_a_read_history_lands_in_the_oldest_generation(
    reopened: tuple[DuckDBSessionStore, str], nothing_frozen: None
) -> None:
    store, sid = reopened
    assert gc.get_freeze_count() == 0
    assert gc.isenabled()
    history = store.get_history(sid)
    assert len(history) == MESSAGES and gc.isenabled()
    built = {id(o) for o in _containers(history)}
    assert len(built) > PROMOTE_FROM  # messages, parts lists, metadata, the data parts
    young = {id(o) for o in gc.get_objects(generation=0) + gc.get_objects(generation=1)}
    assert not built & young
    assert built <= {id(o) for o in gc.get_objects(generation=2)}


def test_objects_an_application_froze_stay_frozen(
    reopened: tuple[DuckDBSessionStore, str],
) -> None:
    store, sid = reopened
    already = gc.get_freeze_count()  # the suite's own (tests/conftest.py): kept frozen
    kept = [{"frozen": [1]}]
    gc.freeze()
    try:
        assert len(store.get_history(sid)) == MESSAGES and gc.isenabled()
        tracked = gc.get_objects(generation=0) + gc.get_objects(generation=1)
        tracked += gc.get_objects(generation=2)
        assert not any(o is kept for o in tracked)  # still in the permanent generation
    finally:
        if not already:
            gc.unfreeze()


def test_the_read_leaves_a_disabled_collector_disabled(
    reopened: tuple[DuckDBSessionStore, str],
) -> None:
    store, sid = reopened
    gc.disable()
    try:
        assert len(store.get_history(sid)) == MESSAGES
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_small_read_leaves_the_young_collections_alone(
    tmp_path: Path, nothing_frozen: None
) -> None:
    store = DuckDBSessionStore(tmp_path / "small.duckdb")
    sid = store.thread("main").id
    store.append_messages(sid, [_message(i) for i in range(100)])
    gc.collect()
    history = store.get_history(sid)
    built = {id(o) for o in _containers(history)}
    assert len(built) < PROMOTE_FROM
    assert not built & {id(o) for o in gc.get_objects(generation=2)}  # still young
    store.close()
