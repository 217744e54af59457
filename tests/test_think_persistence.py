"""Seed 000 suites: maxPersistedMessages, sanitization, row size, sessions; plus the
recorder's batching, the clear-during-stream guard and orphaned tool calls."""

from __future__ import annotations

import asyncio

import pytest
from thinkray.runtime import Think
from thinkray.runtime.errors import MessageTooLargeError, UserError
from thinkray.runtime.models.testing import ScriptedModel, pause, reply, tool_call
from thinkray.runtime.tools.base import tool
from thinkray.runtime.turn.persistence import (
    ROW_MAX_BYTES,
    TRUNCATED_MARKER,
    PersistCache,
    enforce_row_size,
    sanitize_message,
)
from thinkray.storage.types import SessionNotFoundError


def texts(history):
    return ["".join(p.get("text", "") for p in m["parts"] if p["type"] == "text") for m in history]


# -- maxPersistedMessages --------------------------------------------------------------


async def test_max_persisted_messages_drops_oldest(store):
    class Bounded(Think):
        max_persisted_messages = 4

    agent = Bounded(store, model=ScriptedModel([reply(f"a{i}") for i in range(4)]))
    for i in range(4):
        await agent.chat(f"u{i}")
    assert texts(agent.get_history()) == ["u2", "a2", "u3", "a3"]
    assert agent.message_count() == 4


async def test_max_persisted_messages_none_is_unlimited(store):
    agent = Think(store, model=ScriptedModel([reply(f"a{i}") for i in range(5)]))
    for i in range(5):
        await agent.chat(f"u{i}")
    assert agent.message_count() == 10


# -- sanitization ----------------------------------------------------------------------


def test_sanitize_strips_openai_item_id_and_keeps_other_metadata():
    msg = {
        "id": "m",
        "role": "assistant",
        "parts": [
            {
                "type": "text",
                "text": "x",
                "providerMetadata": {"openai": {"itemId": "it_1", "keep": 1}, "other": {"a": 1}},
            }
        ],
    }
    out = sanitize_message(msg)
    assert out["parts"][0]["providerMetadata"] == {"openai": {"keep": 1}, "other": {"a": 1}}
    assert msg["parts"][0]["providerMetadata"]["openai"]["itemId"] == "it_1"  # input untouched


def test_sanitize_strips_reasoning_encrypted_content_and_empty_openai():
    msg = {
        "id": "m",
        "role": "assistant",
        "parts": [
            {
                "type": "reasoning",
                "text": "thought",
                "providerMetadata": {"openai": {"reasoningEncryptedContent": "enc"}},
            }
        ],
    }
    part = sanitize_message(msg)["parts"][0]
    assert "providerMetadata" not in part and part["text"] == "thought"


def test_sanitize_drops_empty_reasoning_without_metadata_only():
    msg = {
        "id": "m",
        "role": "assistant",
        "parts": [
            {"type": "reasoning", "text": ""},
            {
                "type": "reasoning",
                "text": "",
                "providerMetadata": {"anthropic": {"signature": "s"}},
            },
            {"type": "text", "text": "hi"},
        ],
    }
    out = sanitize_message(msg)["parts"]
    assert [p["type"] for p in out] == ["reasoning", "text"]
    assert out[0]["providerMetadata"]["anthropic"]["signature"] == "s"


async def test_empty_reasoning_is_removed_when_persisting(store):
    class Emits(Think):
        async def on_chat_message(self, options):
            yield {"type": "start"}
            yield {"type": "reasoning-start", "id": "r"}
            yield {"type": "reasoning-end", "id": "r"}
            yield {"type": "text-start", "id": "t"}
            yield {"type": "text-delta", "id": "t", "delta": "hi"}
            yield {"type": "text-end", "id": "t"}
            yield {"type": "finish"}

    agent = Emits(store)
    await agent.chat("x")
    assert [p["type"] for p in agent.get_history()[-1]["parts"]] == ["text"]


def test_sanitize_passthrough_for_clean_messages():
    msg = {"id": "m", "role": "user", "parts": [{"type": "text", "text": "plain"}]}
    assert sanitize_message(msg) == msg


# -- row size --------------------------------------------------------------------------


def test_small_parts_pass_through_unchanged():
    part = {"type": "text", "text": "small"}
    assert enforce_row_size(part) is part


async def test_large_tool_output_is_truncated_with_marker(store):
    @tool
    def dump() -> str:
        """Return a lot."""
        return "x" * (ROW_MAX_BYTES + 10_000)

    model = ScriptedModel([reply(tool_call("dump", {})), reply("done")])
    agent = Think(store, model=model)
    agent.get_tools = lambda: {"dump": dump}
    await agent.chat("go")
    part = [p for p in agent.get_history()[-1]["parts"] if p["type"] == "dynamic-tool"][0]
    assert part["state"] == "output-available"
    assert part["output"].startswith(TRUNCATED_MARKER)
    assert len(part["output"]) < ROW_MAX_BYTES
    # within the turn the model still saw the full output
    assert len(model.requests[1].messages[-1].content[0].output) > ROW_MAX_BYTES


async def test_an_oversized_user_message_is_refused_whole_and_nothing_is_written(store):
    """Issue 9 item 17: a user pastes more than a stored row holds. The message is not
    stored cut short (the model would answer text the user never sent, and nobody would
    know): the caller gets a clear UserError and nothing is written."""
    model = ScriptedModel([reply("ok"), reply("fine")])
    agent = Think(store, model=model)
    await agent.chat("hello")
    sid = agent.current_session_id
    before = agent.get_history()
    for oversized in (
        "y" * (ROW_MAX_BYTES + 5000),  # one part over the row cap
        {  # two parts, each under the cap, together over the message limit
            "id": "big-one",
            "role": "user",
            "parts": [{"type": "text", "text": "z" * 1_000_000} for _ in range(2)],
        },
    ):
        with pytest.raises(MessageTooLargeError) as caught:
            await agent.chat(oversized)
        assert isinstance(caught.value, UserError)
        assert caught.value.limit == ROW_MAX_BYTES < caught.value.size
        assert "Nothing was stored" in str(caught.value)
        with pytest.raises(MessageTooLargeError):
            agent.start_chat(oversized)  # the streaming entry point refuses it too
    assert agent.get_history() == before and len(model.requests) == 1
    assert agent.get_status(sid).state == "idle"
    assert (await agent.chat("a short one")).text == "fine"


async def test_the_message_limit_is_the_agents_to_set(store):
    class Small(Think):
        max_user_message_bytes = 1_000

    agent = Small(store, model=ScriptedModel([reply("ok")]))
    with pytest.raises(MessageTooLargeError, match="at most 1,000 bytes"):
        await agent.chat("x" * 2_000)
    assert (await agent.chat("x" * 500)).text == "ok"
    assert agent.message_count() == 2


async def test_an_oversized_inbox_message_is_refused_before_it_is_queued(tmp_path):
    from thinkray.runtime.agents.persistent import PersistentAgent

    agent = PersistentAgent(tmp_path / "p.duckdb", model=ScriptedModel([reply("ok")]))
    with pytest.raises(MessageTooLargeError):
        await agent.send("q" * (ROW_MAX_BYTES + 1), sender="alice")
    assert agent.list_inbox() == [] and agent.get_history() == []
    await agent.dispose()


# -- persist cache and batching --------------------------------------------------------


def test_persist_cache_skips_unchanged():
    cache = PersistCache()
    part = {"type": "text", "text": "a"}
    assert cache.changed("m", 0, part)
    assert not cache.changed("m", 0, dict(part))
    assert cache.changed("m", 0, {"type": "text", "text": "ab"})
    assert cache.skipped == 1


async def test_stream_is_written_in_batches_not_per_chunk(store):
    flushes = []
    original = store.flush_stream

    def spy(flush):
        flushes.append(len(flush.chunks))
        return original(flush)

    store.flush_stream = spy
    agent = Think(store, model=ScriptedModel([reply(*["t"] * 2000)]))
    agent.flush_interval = 0.05
    await agent.chat("go")
    total = sum(flushes)
    assert total >= 2000  # every chunk reached the log
    assert len(flushes) < total / 20  # ...in far fewer transactions than chunks
    assert (
        store.get_chunks(
            agent.get_status().run_id or agent.turns.last_stream[agent.current_session_id].run_id
        )[-1]["type"]
        == "finish"
    )


async def test_chunks_are_durable_while_streaming(store):
    agent = Think(store, model=ScriptedModel([reply("a", "b", pause(0.5), "c")]))
    agent.flush_interval = 0.02
    run = agent.start_chat("x")
    await asyncio.sleep(0.2)  # stalled mid-stream: the timer must have flushed
    logged = [c["type"] for c in store.get_chunks(run.run_id)]
    assert "text-delta" in logged
    partial = store.get_message(run.stream.message_id)
    assert partial is not None and partial["parts"][-1]["text"] == "ab"
    await run.task
    assert store.get_message(run.stream.message_id)["parts"][-1]["text"] == "abc"


async def test_tool_part_moves_through_states_on_one_row(store):
    seen_states = []
    gate = asyncio.Event()

    @tool
    async def wait_gate() -> str:
        """Waits."""
        await gate.wait()
        return "opened"

    agent = Think(store, model=ScriptedModel([reply(tool_call("wait_gate", {})), reply("ok")]))
    agent.flush_interval = 0.01
    agent.get_tools = lambda: {"wait_gate": wait_gate}
    run = agent.start_chat("x")
    for _ in range(100):
        msg = store.get_message(run.stream.message_id)
        tools = [p for p in (msg or {"parts": []})["parts"] if p["type"] == "dynamic-tool"]
        if tools:
            seen_states.append(tools[0]["state"])
            if tools[0]["state"] == "input-available":
                break
        await asyncio.sleep(0.01)
    gate.set()
    await run.task
    final = [p for p in agent.get_history()[-1]["parts"] if p["type"] == "dynamic-tool"]
    assert len(final) == 1 and final[0]["state"] == "output-available"
    assert "input-available" in seen_states


# -- clear during stream ---------------------------------------------------------------


async def test_clear_during_stream_does_not_resurrect_messages(store):
    agent = Think(store, model=ScriptedModel([reply("a", pause(0.3), "b")]))
    agent.flush_interval = 0.01
    run = agent.start_chat("x")
    await asyncio.sleep(0.1)
    agent.clear_messages()
    result = await run.task
    assert result.status == "aborted"
    assert agent.get_history() == []
    assert agent.message_count() == 0


# -- orphaned tool calls ---------------------------------------------------------------


async def test_orphaned_tool_call_is_finalized_before_next_run(store):
    model = ScriptedModel([reply("answer")])
    agent = Think(store, model=model)
    sid = agent.create_session().id
    store.append_message(sid, {"id": "u", "role": "user", "parts": [{"type": "text", "text": "q"}]})
    store.append_message(
        sid,
        {
            "id": "a",
            "role": "assistant",
            "parts": [
                {
                    "type": "dynamic-tool",
                    "toolName": "t",
                    "toolCallId": "c1",
                    "state": "input-available",
                    "input": {},
                }
            ],
        },
    )
    result = await agent.chat("again")
    assert result.status == "completed"
    part = store.get_message("a")["parts"][0]
    assert part["state"] == "output-error" and "restart" in part["errorText"]
    sent = model.requests[0].messages
    results = [c for m in sent for c in m.content if c.type == "tool-result"]
    assert all(r.is_error for r in results)


# -- sessions --------------------------------------------------------------------------


async def test_session_crud_and_counts(store):
    agent = Think(store, model=ScriptedModel([reply("r1"), reply("r2")]))
    a = agent.create_session("alpha")
    assert agent.get_current_session_id() == a.id
    await agent.chat("hello")
    b = agent.create_session("beta")
    assert {s.name for s in agent.get_sessions()} == {"alpha", "beta"}
    agent.rename_session(b.id, "gamma")
    assert agent.get_session(b.id).name == "gamma"
    assert agent.message_count(a.id) == 2 and agent.message_count(b.id) == 0
    agent.delete_session(a.id)
    assert [s.id for s in agent.get_sessions()] == [b.id]
    with pytest.raises(SessionNotFoundError):
        agent.get_history(a.id)
    agent.switch_session(b.id)
    await agent.chat("in beta")
    agent.clear_messages()
    assert agent.message_count(b.id) == 0
    assert agent.get_session(b.id).name == "gamma"  # cleared, not deleted


async def test_branching_by_editing_an_earlier_message(store):
    agent = Think(store, model=ScriptedModel([reply("Hi there"), reply("X is"), reply("Y is")]))
    sid = agent.create_session().id
    await agent.chat({"id": "m1", "role": "user", "parts": [{"type": "text", "text": "Hello"}]})
    hello_reply = agent.get_history()[-1]["id"]
    await agent.chat({"id": "m3", "role": "user", "parts": [{"type": "text", "text": "X?"}]})
    # edit: a new user message under the same parent makes a sibling branch
    store.set_head(sid, hello_reply)
    await agent.chat({"id": "m5", "role": "user", "parts": [{"type": "text", "text": "Y?"}]})
    assert [m["id"] for m in agent.children(hello_reply)] == ["m3", "m5"]
    assert texts(agent.get_history()) == ["Hello", "Hi there", "Y?", "Y is"]
    leaf_a = agent.children("m3")[0]["id"]
    assert texts(agent.get_history(leaf_id=leaf_a)) == ["Hello", "Hi there", "X?", "X is"]


async def test_regenerate_without_new_message(store):
    agent = Think(store, model=ScriptedModel([reply("first"), reply("second")]))
    await agent.chat("q")
    sid = agent.current_session_id
    user_id = agent.get_history()[0]["id"]
    store.set_head(sid, user_id)
    result = await agent.chat()
    assert result.text == "second"
    assert texts(agent.get_history()) == ["q", "second"]
    assert len(agent.children(user_id)) == 2


async def test_configuration_persists(tmp_path):
    from thinkray.storage.session_store import DuckDBSessionStore

    path = tmp_path / "c.duckdb"
    agent = Think(DuckDBSessionStore(path))
    agent.configure({"modelTier": "capable", "systemPrompt": "be brief"})
    agent.close()
    again = Think(DuckDBSessionStore(path))
    assert again.get_config() == {"modelTier": "capable", "systemPrompt": "be brief"}
    again.close()


async def test_tool_call_awaiting_approval_is_finalized_after_restart(store):
    agent = Think(store, model=ScriptedModel([reply("ok")]))
    sid = agent.create_session().id
    store.append_message(sid, {"id": "u", "role": "user", "parts": [{"type": "text", "text": "q"}]})
    store.append_message(
        sid,
        {
            "id": "a",
            "role": "assistant",
            "parts": [
                {
                    "type": "dynamic-tool",
                    "toolName": "t",
                    "toolCallId": "c1",
                    "state": "approval-requested",
                    "input": {},
                    "approval": {"id": "ap1"},
                }
            ],
        },
    )
    await agent.chat("again")
    assert store.get_message("a")["parts"][0]["state"] == "output-error"


async def test_old_chunk_logs_are_pruned_a_few_at_a_time(store):
    from thinkray.runtime.agents.turns import PRUNE_SLACK

    agent = Think(store, model=ScriptedModel(["ok"], loop=True))
    runs = []
    for i in range(12):
        runs.append((await agent.chat(f"m{i}")).run_id)
        kept = store.chunk_generations()
        # The newest keep_chunk_logs runs' logs are always there, in order...
        assert kept[-agent.keep_chunk_logs :] == runs[-agent.keep_chunk_logs :]
        # ...and at most PRUNE_SLACK older ones wait for the next pruning.
        assert len(kept) <= agent.keep_chunk_logs + PRUNE_SLACK
    assert store.chunk_generations()[0] != runs[0]
