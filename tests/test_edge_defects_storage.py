"""Defects issue 26, items 1, 9, 10 and 14, each as the scenario a user hits: a resent
message id (same chat, another chat; through the runtime and over HTTP), the fleet
stats after a model switch, a corrupted agent file, and the stored user message
against the one the client sent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from thinkray.actors.cli import main
from thinkray.runtime import Think
from thinkray.runtime.models.testing import ScriptedModel, reply
from thinkray.storage import fleet_index as fi
from thinkray.storage.errors import CorruptDatabaseError, DatabaseFileError, StorageError
from thinkray.storage.session_store import DuckDBSessionStore

NS = "edges"


def user(text: str, message_id: str, **extra: Any) -> dict[str, Any]:
    """A user message as the AI SDK's ``useChat`` sends it (no ``metadata`` key)."""
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}], **extra}


# -- item 14: the stored user message is the one the client sent -----------------------


async def test_a_stored_user_message_equals_the_clients_message(store):
    agent = Think(store, model=ScriptedModel([reply("hello")]))
    sent = user("hi", "u-client-1")
    await agent.chat(dict(sent))
    stored = agent.get_history()[0]
    assert stored == sent  # no "metadata": null the client's message does not have
    # A message that does carry metadata keeps it as sent.
    with_meta = user("again", "u-client-2", metadata={"source": "web"})
    agent.model = ScriptedModel([reply("ok")])
    await agent.chat(dict(with_meta))
    assert agent.get_message("u-client-2") == with_meta


# -- item 10: a corrupted agent file is a typed error naming the agent and the file ----


def test_an_overwritten_agent_file_names_the_agent_and_the_file(tmp_path):
    path = tmp_path / "root" / NS / "alice-notes.duckdb"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a database at all " * 500)  # a bad restore, a stray copy
    with pytest.raises(CorruptDatabaseError) as caught:
        DuckDBSessionStore(path)
    error = caught.value
    assert isinstance(error, StorageError)
    assert (error.agent, error.namespace, error.path) == ("alice-notes", NS, str(path))
    assert "alice-notes" in str(error) and str(path) in str(error)
    assert path.read_bytes().startswith(b"not a database")  # never repaired or replaced


def test_a_truncated_agent_file_names_the_agent_when_it_is_read(tmp_path):
    path = tmp_path / "root" / NS / "bob.duckdb"
    with DuckDBSessionStore(path) as store:
        sid = store.create_session("chat").id
        for i in range(400):
            store.append_message(sid, user("x" * 2000 + str(i), f"m{i}"))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # a copy cut short (disk full, killed rsync)
    with pytest.raises(DatabaseFileError) as caught:
        store = DuckDBSessionStore(path)
        try:
            store.get_history(sid)
        finally:
            store.close()
    assert isinstance(caught.value, CorruptDatabaseError)
    assert caught.value.agent == "bob" and str(path) in str(caught.value)


# -- item 9: usage stays with the model that produced it across a switch ----------------


class Switching(Think):
    """An agent whose user messages pick the model (seed 002 per-turn switch)."""

    def __init__(self, store: Any, registry: dict[str, ScriptedModel]) -> None:
        super().__init__(store, model=registry["model-a"])
        self.registry = registry

    def resolve_model(self, selection: dict[str, Any] | None) -> Any:
        return self.registry[(selection or {}).get("model_id") or "model-a"]


async def test_stats_after_a_model_switch_count_each_models_tokens_once(tmp_path, capsys):
    root = tmp_path / "root"
    path = root / NS / "switcher.duckdb"
    registry = {
        "model-a": ScriptedModel(
            [reply("from a", usage={"input": 100, "output": 10})], model_id="model-a", loop=True
        ),
        "model-b": ScriptedModel(
            [reply("from b", usage={"input": 1000, "output": 200})], model_id="model-b", loop=True
        ),
    }
    store = DuckDBSessionStore(path)
    agent = Switching(store, registry)
    pick_a = user("one", "u1", metadata={"provider_id": "test", "model_id": "model-a"})
    assert (await agent.chat(pick_a)).text == "from a"
    assert fi.write_index_row(store, path) is not None  # what a hibernation writes
    pick_b = user("two", "u2", metadata={"provider_id": "test", "model_id": "model-b"})
    assert (await agent.chat(pick_b)).text == "from b"
    assert fi.write_index_row(store, path) is not None  # the next hibernation
    store.close()
    capsys.readouterr()
    assert main(["stats", "--root", str(root), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    by_model = {u["model"]: (u["input"], u["output"]) for u in stats["by_model"]}
    assert by_model == {"test/model-a": (100, 10), "test/model-b": (1000, 200)}
    by_day = {}
    for usage in stats["by_day"]:
        by_day[usage["model"]] = by_day.get(usage["model"], 0) + usage["input"]
    assert by_day == {"test/model-a": 100, "test/model-b": 1000}  # A's tokens once
