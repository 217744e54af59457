"""Seed 002 "Branching" and "Rewinding" on a Think agent: the runtime rules on top of
the store primitives (the store's own cases are in the conformance suite)."""

from __future__ import annotations

import asyncio

import pytest
from thinkray.runtime import SessionBusyError, Think
from thinkray.runtime.agents.agent import Agent as _Agent
from thinkray.runtime.agents.sessions import RewindResult, UnrewindResult
from thinkray.runtime.models.base import ModelRequest
from thinkray.runtime.models.testing import FunctionModel, ScriptedModel, last_user_text, reply
from thinkray.storage.types import (
    InvalidInputError,
    MessageNotFoundError,
    NotOnPathError,
    SessionNotFoundError,
)


def echo_model(**kwargs) -> FunctionModel:
    """Answers ``re: <last user text>`` with a usage that identifies the turn."""

    def respond(request: ModelRequest, step: int):
        n = len(request.messages)
        return reply(f"re: {last_user_text(request)}", usage={"input": 100 * n, "output": n})

    return FunctionModel(respond, **kwargs)


def seen(request: ModelRequest) -> list[str]:
    """What the model was sent: each message's text."""
    return ["".join(getattr(c, "text", "") for c in m.content) for m in request.messages]


def texts(history: list[dict]) -> list[str]:
    return ["".join(p.get("text", "") for p in m["parts"] if p["type"] == "text") for m in history]


async def talk(agent: Think, *messages: str) -> list[str]:
    """Run turns; returns the user message ids."""
    out = []
    for text in messages:
        result = await agent.chat(text)
        assert result.status == "completed", result.error
        out.append(result.user_message_id)
    return out


def counts(agent: Think) -> tuple[int, int]:
    sessions = agent.store.list_sessions(include_ephemeral=True)
    return len(sessions), sum(
        agent.store.message_count(s.id, include_hidden=True) for s in sessions
    )


# -- branch ------------------------------------------------------------------------------


async def test_branch_copies_history_and_new_turns_go_to_the_branch(store):
    model = echo_model()
    agent = Think(store, model=model)
    u1, u2 = await talk(agent, "one", "two")
    parent = agent.current_session_id
    a1 = agent.get_history()[1]["id"]
    info = agent.branch(parent, a1, metadata={"purpose": "what if"})
    assert info.parent_session_id == parent and info.parent_message_id == a1
    assert info.metadata == {"purpose": "what if"}
    assert agent.current_session_id == parent  # a branch does not take over
    assert texts(agent.get_history(info.id)) == ["one", "re: one"]
    result = await agent.chat("other", session_id=info.id)
    assert seen(model.requests[-1]) == ["one", "re: one", "other"]
    assert result.text == "re: other"
    assert texts(agent.get_history(info.id)) == ["one", "re: one", "other", "re: other"]
    assert texts(agent.get_history(parent)) == ["one", "re: one", "two", "re: two"]
    assert [s.id for s in agent.get_sessions(parent_session_id=parent)] == [info.id]


async def test_branch_rejected_while_the_parent_runs(store):
    # The second turn is the slow one: it is still streaming while we branch.
    agent = Think(store, model=ScriptedModel([reply("a", "b"), reply("c", "d", delay=0.05)]))
    await talk(agent, "first")
    sid = agent.current_session_id
    fork = agent.get_history()[0]["id"]
    before = counts(agent)
    run = agent.start_chat("second")
    await asyncio.sleep(0.005)
    assert agent.get_status(sid).state == "busy"
    with pytest.raises(SessionBusyError, match="in flight"):
        agent.branch(sid, fork)
    await run.task
    assert counts(agent)[0] == before[0]
    agent.status.retrying(sid, 1, "rate limited")  # retrying is a run in flight too
    with pytest.raises(SessionBusyError):
        agent.branch(sid, fork)
    agent.status.error(sid, "boom")  # a failed run is finished: branching is allowed
    assert agent.branch(sid, fork).parent_message_id == fork
    agent.status.idle(sid)


async def test_branch_rollups_are_recomputed_from_the_copies(store):
    def respond(request, step):
        return reply("x", usage={"input": 10 * (step + 1), "output": 1, "cost_usd": 0.25})

    agent = Think(store, model=FunctionModel(respond))
    await talk(agent, "one", "two", "three")
    sid = agent.current_session_id
    parent = agent.get_session(sid)
    assert parent.usage["prompt_tokens"] == 60 and parent.usage["cost_usd"] == 0.75
    a2 = agent.get_history()[3]["id"]
    branch = agent.branch(sid, a2)
    assert branch.usage == {
        "prompt_tokens": 30,
        "completion_tokens": 2,
        "reasoning_tokens": 0,
        "cache_read": 0,
        "cache_write": 0,
        "total_tokens": 32,
        "cost_usd": 0.5,
    }
    assert branch.context_window_used == 32
    assert agent.get_session(sid).usage == parent.usage  # the parent's row is untouched


async def test_sidecar_branch_is_hidden_from_the_picker(store):
    agent = Think(store, model=echo_model())
    await talk(agent, "main question")
    sid = agent.current_session_id
    side = agent.branch(sid, agent.get_history()[-1]["id"], {"ephemeral": True})
    assert side.ephemeral
    assert [s.id for s in agent.get_sessions()] == [sid]
    assert side.id in [s.id for s in agent.get_sessions(include_ephemeral=True)]
    result = await agent.chat("side question", session_id=side.id)
    assert result.status == "completed"
    assert texts(agent.get_history(sid)) == ["main question", "re: main question"]


async def test_branch_bad_input_writes_nothing(store):
    agent = Think(store, model=echo_model())
    u1, u2, u3 = await talk(agent, "one", "two", "three")
    sid = agent.current_session_id
    agent.rewind(sid, u3)  # hides re: three
    assert agent.get_session(sid).head_id == u3
    a3 = agent.store.children(u3)[0]["id"]
    agent.store.set_hidden(sid, [u2], 1.0)
    other = agent.create_session("other").id
    before = counts(agent)
    with pytest.raises(NotOnPathError):
        agent.branch(sid, a3)  # rewound: off the current path
    with pytest.raises(NotOnPathError, match="hidden"):
        agent.branch(sid, u2)  # on the path but hidden
    with pytest.raises(MessageNotFoundError):
        agent.branch(other, u1)  # another session's message
    with pytest.raises(SessionNotFoundError):
        agent.branch("no-such-session", u1)
    assert counts(agent) == before


# -- rewind ------------------------------------------------------------------------------


async def test_rewind_then_regenerate_never_shows_the_hidden_part(store):
    model = echo_model()
    agent = Think(store, model=model)
    u1, u2, u3 = await talk(agent, "one", "two", "three")
    sid = agent.current_session_id
    old_head = agent.get_session(sid).head_id
    result = agent.rewind(sid, u2)
    assert isinstance(result, RewindResult)
    assert result.target["id"] == u2 and texts([result.target]) == ["two"]
    assert result.head_id == u2 and result.previous_head_id == old_head
    assert len(result.hidden_ids) == 3  # re: two, three, re: three
    assert texts(agent.get_history(sid)) == ["one", "re: one", "two"]
    regenerated = await agent.chat(None)
    assert seen(model.requests[-1]) == ["one", "re: one", "two"]
    assert regenerated.text == "re: two"
    assert agent.store.get_message_row(regenerated.message_id).parent_id == u2
    assert texts(agent.get_history()) == ["one", "re: one", "two", "re: two"]
    # The hidden rows stay for inspection, from the old head.
    path = agent.store.get_path(sid, leaf_id=old_head)
    assert [r.hidden for r in path] == [False, False, False, True, True, True]
    assert [r.id for r in path if r.hidden] == result.hidden_ids


async def test_next_turn_after_rewind_only_sees_up_to_the_target(store):
    model = echo_model()
    agent = Think(store, model=model)
    _, u2, _ = await talk(agent, "one", "two", "three")
    agent.rewind(agent.current_session_id, u2)
    await agent.chat("two, again")
    assert seen(model.requests[-1]) == ["one", "re: one", "two", "two, again"]


async def test_resend_an_edited_message(store):
    model = echo_model()
    agent = Think(store, model=model)
    _, u2 = await talk(agent, "one", "two")
    sid = agent.current_session_id
    a1 = agent.get_history()[1]["id"]
    result = await agent.resend(sid, u2, "two, edited")
    assert seen(model.requests[-1]) == ["one", "re: one", "two, edited"]
    assert result.text == "re: two, edited"
    assert texts(agent.get_history()) == ["one", "re: one", "two, edited", "re: two, edited"]
    assert texts(agent.children(a1)) == ["two", "two, edited"]  # the original is kept
    assert agent.store.get_message_row(u2).hidden


async def test_an_edit_keeps_the_old_branch_readable_through_the_agent(store):
    """Issue 9 item 11 (seed 000: an edit "creates a new branch without losing the old
    one"): after editing a message, the old branch is read back whole, by its leaf,
    through the agent's own API."""
    agent = Think(store, model=echo_model())
    _, u2 = await talk(agent, "one", "two")
    sid = agent.current_session_id
    old_leaf = agent.get_history()[-1]["id"]
    await agent.resend(sid, u2, "two, edited")
    assert texts(agent.get_history()) == ["one", "re: one", "two, edited", "re: two, edited"]
    assert texts(agent.get_history(leaf_id=old_leaf)) == ["one", "re: one", "two", "re: two"]
    assert texts(agent.get_history(sid, leaf_id=u2)) == ["one", "re: one", "two"]
    new_leaf = agent.get_history()[-1]["id"]
    assert agent.get_history(leaf_id=new_leaf) == agent.get_history()
    with pytest.raises(MessageNotFoundError):
        agent.get_history(leaf_id="no-such-message")


async def test_an_old_branch_reads_its_summary_not_what_it_summarized(store):
    """Issue 9 item 11 with a compaction on the shared part: the old branch reads as it
    did at its leaf, the summary standing for the summarized turns."""
    from thinkray.runtime.capabilities.compaction import CompactionConfig

    summarizer = FunctionModel(lambda request, step: reply("SUMMARY"), model_id="cheap")
    agent = _Agent(store, model=echo_model())
    agent.compaction_config = CompactionConfig(summary_model=summarizer, retry_backoff=0)
    _, _, u3 = await talk(agent, "one", "two", "three")
    await agent.compact()
    sid = agent.current_session_id
    old_leaf = agent.get_history()[-1]["id"]
    assert texts(agent.get_history(leaf_id=old_leaf)) == texts(agent.get_history())
    await agent.resend(sid, u3, "three, edited")
    old = agent.get_history(leaf_id=old_leaf)
    assert [m["parts"][0]["type"] for m in old].count("data-compaction") == 1
    assert [t for t in texts(old) if t] == ["three", "re: three"]


async def test_rewind_including_the_target_then_send(store):
    model = echo_model()
    agent = Think(store, model=model)
    _, u2 = await talk(agent, "one", "two")
    sid = agent.current_session_id
    result = agent.rewind(sid, u2, include_target=True)
    assert result.include_target and u2 in result.hidden_ids
    assert result.head_id == agent.get_history()[-1]["id"]  # re: one
    await agent.chat("edited")
    assert seen(model.requests[-1]) == ["one", "re: one", "edited"]


async def test_resend_without_text_resends_the_original(store):
    model = echo_model()
    agent = Think(store, model=model)
    _, u2 = await talk(agent, "one", "two")
    sid = agent.current_session_id
    result = await agent.resend(sid, u2)
    assert result.user_message_id != u2
    assert seen(model.requests[-1]) == ["one", "re: one", "two"]
    assert texts(agent.get_history()) == ["one", "re: one", "two", "re: two"]


async def test_snapshot_id_from_the_message_user_hook_comes_back_on_rewind(store):
    class Snapshotting(Think):
        snapshots = 0

        async def on_user_message(self, session_id, message):
            message = await super().on_user_message(session_id, message)
            self.snapshots += 1
            message["metadata"] = {
                **(message.get("metadata") or {}),
                "snapshot_id": f"snap-{self.snapshots}",
            }
            return message

    agent = Snapshotting(store, model=echo_model())
    _, u2, _ = await talk(agent, "one", "two", "three")
    result = agent.rewind(agent.current_session_id, u2)
    assert result.snapshot_id == "snap-2"
    plain = Think(store, model=echo_model())
    (u,) = await talk(plain, "no snapshot layer")
    assert plain.rewind(plain.current_session_id, u).snapshot_id is None


async def test_rewind_rejected_while_running(store):
    agent = Think(store, model=ScriptedModel([reply("a"), reply("b", "c", delay=0.01)]))
    (u1,) = await talk(agent, "one")
    sid = agent.current_session_id
    run = agent.start_chat("two")
    await asyncio.sleep(0.005)
    with pytest.raises(SessionBusyError):
        agent.rewind(sid, u1)
    with pytest.raises(SessionBusyError):
        agent.unrewind(sid)
    await run.task
    assert texts(agent.get_history()) == ["one", "a", "two", "bc"]


async def test_rewind_to_a_non_user_message_writes_nothing(store):
    agent = Think(store, model=echo_model())
    u1, _ = await talk(agent, "one", "two")
    sid = agent.current_session_id
    a1 = agent.get_history()[1]["id"]
    other = agent.create_session("other").id
    before, head = counts(agent), agent.get_session(sid).head_id
    with pytest.raises(NotOnPathError, match="user message"):
        agent.rewind(sid, a1)
    with pytest.raises(MessageNotFoundError):
        agent.rewind(other, u1)
    with pytest.raises(SessionNotFoundError):
        agent.rewind("no-such-session", u1)
    with pytest.raises(InvalidInputError, match="no rewind"):
        agent.unrewind(sid)
    assert counts(agent) == before
    assert agent.get_session(sid).head_id == head
    assert agent.store.message_count(sid) == 4


async def test_unrewind_restores_and_keeps_the_regenerated_turn(store):
    model = echo_model()
    agent = Think(store, model=model)
    _, u2 = await talk(agent, "one", "two")
    sid = agent.current_session_id
    original = agent.get_history()
    agent.rewind(sid, u2)
    regenerated = await agent.chat(None)
    undone = agent.unrewind(sid)
    assert isinstance(undone, UnrewindResult)
    assert undone.detached_ids == [regenerated.message_id]
    assert agent.get_history() == original
    # The regenerated answer is still there, on its own branch.
    assert texts(agent.children(u2)) == ["re: two", "re: two"]
    await agent.chat("three")
    assert seen(model.requests[-1])[-3:] == ["two", "re: two", "three"]


async def test_rewind_past_a_real_compaction_unhides_the_summarized_turns(store):
    from thinkray.runtime.capabilities.compaction import CompactionConfig

    class Agent(_Agent):
        pass

    model = echo_model()
    agent = Agent(store, model=model)
    agent.compaction_config = CompactionConfig(
        summary_model=FunctionModel(lambda r, s: reply("## Goal\nG"), model_id="cheap"),
        retry_backoff=0,
    )
    u1, u2, u3 = await talk(agent, "one", "two", "three")
    sid = agent.current_session_id
    compaction = await agent.compact(sid)
    visible = agent.get_history()
    assert u1 not in [m["id"] for m in visible] and visible[0]["id"] == compaction.message_id
    a1 = agent.store.children(u1)[0]["id"]
    summarized = [r.id for r in agent.store.get_path(sid) if r.hidden]
    assert summarized == [u1, a1, u2, agent.store.children(u2)[0]["id"]]
    result = agent.rewind(sid, u2)
    assert result.unhidden_ids == [u1, a1, u2]  # up to the target; re: two stays hidden
    assert compaction.message_id in result.hidden_ids
    assert texts(agent.get_history()) == ["one", "re: one", "two"]
    await agent.chat(None)
    assert seen(model.requests[-1]) == ["one", "re: one", "two"]
    # Un-rewinding puts the summary (and the summarized turns' hiding) back.
    agent.unrewind(sid)
    assert [m["id"] for m in agent.get_history()] == [m["id"] for m in visible]
