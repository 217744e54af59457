"""Defects issue 26, items 1, 9, 10 and 14, each as the scenario a user hits: a resent
message id (same chat, another chat; through the runtime and over HTTP), the fleet
stats after a model switch, a corrupted agent file, and the stored user message
against the one the client sent."""

from __future__ import annotations

import json
from typing import Any

import pytest
from thinkray.actors.cli import main
from thinkray.runtime import Think
from thinkray.runtime.errors import MessageIdConflictError
from thinkray.runtime.models.testing import ScriptedModel, reply
from thinkray.storage import fleet_index as fi
from thinkray.storage.errors import CorruptDatabaseError, DatabaseFileError, StorageError
from thinkray.storage.session_store import DuckDBSessionStore

from tests.conftest import Collector

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


# -- item 1: a message id is the turn's idempotency key ----------------------------------


async def test_a_resent_message_replays_its_answer_and_runs_no_second_turn(tmp_path):
    path = tmp_path / "root" / NS / "retry.duckdb"
    store = DuckDBSessionStore(path)
    model = ScriptedModel([reply("the ", "first ", "answer")])  # one turn's worth only
    agent = Think(store, model=model)
    c1 = agent.create_session("c1").id
    first = await agent.chat(user("Weather in Paris?", "u1"), session_id=c1)
    live = Collector()
    again = await agent.chat(user("Weather in Paris?", "u1"), live, session_id=c1)
    assert len(model.requests) == 1  # the model ran once
    assert [m["role"] for m in agent.get_history(c1)] == ["user", "assistant"]
    assert again.replayed and not first.replayed
    assert (again.status, again.text, again.message_id) == (
        "completed",
        first.text,
        first.message_id,
    )
    assert again.message == agent.get_history(c1)[-1]
    assert await agent.wait_run(again.run_id) == again
    assert "".join(c.get("delta", "") for c in live.events) == "the first answer"
    assert live.types()[0] == "start" and live.types()[-1] == "finish" and live.done == 1
    # After a hibernation (a new agent on the file) it is the same: replayed from the
    # run's chunk log, or rebuilt from the stored answer once that log is pruned.
    store.close()
    for pruned in (False, True):
        store = DuckDBSessionStore(path)
        if pruned:
            store.delete_chunks(store.chunk_generations())
        woken = Think(store, model=ScriptedModel([]))
        streamed = [
            c async for c in woken.stream_chat(user("Weather in Paris?", "u1"), session_id=c1)
        ]
        assert "".join(c.get("delta", "") for c in streamed) == "the first answer"
        assert streamed[0] == {"type": "start", "messageId": first.message_id}
        assert streamed[-1]["type"] == "finish"
        assert [m["role"] for m in woken.get_history(c1)] == ["user", "assistant"]
        store.close()


async def test_a_message_id_used_by_another_chat_is_refused_and_nothing_is_lost(store):
    agent = Think(store, model=ScriptedModel([reply("answer one"), reply("answer two")]))
    c1 = agent.create_session("c1").id
    c2 = agent.create_session("c2").id
    await agent.chat(user("Weather in Paris?", "u1"), session_id=c1)
    with pytest.raises(MessageIdConflictError) as caught:
        await agent.chat(user("And in Rome?", "u1"), session_id=c2)
    assert caught.value.message_id == "u1" and caught.value.session_id == c2
    assert "u1" in str(caught.value) and "new id" in str(caught.value)
    assert agent.get_history(c2) == []  # no answer to a message that is not there
    assert [m["role"] for m in agent.get_history(c1)] == ["user", "assistant"]
    # The same text under a fresh id is answered in c2.
    result = await agent.chat(user("And in Rome?", "u2"), session_id=c2)
    assert result.text == "answer one" or result.text == "answer two"
    assert [m["id"] for m in agent.get_history(c2)][0] == "u2"


async def test_a_rewound_message_id_is_refused_not_answered_out_of_place(store):
    agent = Think(store, model=ScriptedModel([reply("one"), reply("two")]))
    sid = agent.create_session("c1").id
    await agent.chat(user("first", "u1"), session_id=sid)
    await agent.chat(user("second", "u2"), session_id=sid)
    agent.rewind(sid, "u2", include_target=True)  # the user edits their last message
    with pytest.raises(MessageIdConflictError):
        await agent.chat(user("second, edited", "u2"), session_id=sid)
    assert [m["id"] for m in agent.get_history(sid)][:1] == ["u1"]


@pytest.mark.ray
def test_over_http_a_resent_id_replays_and_another_chats_id_is_a_409(ray_local, tmp_path):
    import httpx

    from tests.ingress_support import ALICE, chat_body, make_config, serve_app, sse_events

    def post_chat(base: str, path: str, body: Any, headers: dict[str, str]) -> list[Any]:
        # A first chat wakes a cold actor: on a loaded machine that takes a while.
        with (
            httpx.Client(timeout=180) as client,
            client.stream("POST", base + path, json=body, headers=headers) as response,
        ):
            assert response.status_code == 200, response.read()
            return list(sse_events(response.iter_lines()))

    namespace = f"edges-{tmp_path.name[-10:]}".replace("_", "-")
    with serve_app(make_config(str(tmp_path / "root"), namespace)) as base:
        path = "/agents/chat/alice-edges/chat"
        first = post_chat(base, path, chat_body("c1", "Weather in Paris?", "u1"), ALICE)
        again = post_chat(base, path, chat_body("c1", "Weather in Paris?", "u1"), ALICE)
        assert again == first  # the same stream, replayed: the model did not run twice
        messages = f"{base}/agents/chat/alice-edges/chat/c1/messages"
        stored = httpx.get(messages, headers=ALICE, timeout=180).json()
        assert [m["role"] for m in stored] == ["user", "assistant"]
        # The README's example id in a second chat: refused, with a reason, before any
        # byte of a stream; nothing of c2 is stored.
        answer = httpx.post(
            base + path, json=chat_body("c2", "And in Rome?", "u1"), headers=ALICE, timeout=180
        )
        assert answer.status_code == 409, answer.text
        error = answer.json()["error"]
        assert error["type"] == "message_id_conflict" and "'u1'" in error["message"]
        assert "Traceback" not in error["message"]
        c2 = httpx.get(messages.replace("/c1/", "/c2/"), headers=ALICE, timeout=180)
        assert c2.json() == []
        assert httpx.get(messages, headers=ALICE, timeout=180).json() == stored
