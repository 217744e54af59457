"""Seed 002 "Per-turn model switch" (with its compaction table) and "Context window
tracking" (usage per assistant message, session rollups, cost, context_window_used)."""

from __future__ import annotations

import pytest
from thinkray.runtime import Think, tool
from thinkray.runtime.agents.model_switch import (
    CONTEXT_SWITCH_ERROR,
    UnknownModelError,
    fits_context,
    model_selection,
    reserve_tokens,
)
from thinkray.runtime.messages import new_id
from thinkray.runtime.models.testing import ScriptedModel, reply, tool_call
from thinkray.storage.types import DEFAULT_SETTINGS_KEY, empty_rollup

from tests.conftest import Collector


def pick(text: str, model_id: str | None = None, **selection) -> dict:
    """A user message, selecting ``model_id`` when given."""
    metadata = {"provider_id": "test", "model_id": model_id, **selection} if model_id else None
    return {
        "id": new_id("msg"),
        "role": "user",
        "metadata": metadata,
        "parts": [{"type": "text", "text": text}],
    }


def models(**windows: int) -> dict[str, ScriptedModel]:
    """``name=context_window`` -> a looping ScriptedModel answering with its name."""
    return {
        name: ScriptedModel([reply(f"from {name}")], model_id=name, context_window=w, loop=True)
        for name, w in windows.items()
    }


class Agent(Think):
    """An agent with a model registry and a compaction hook that records its calls."""

    def __init__(self, store, registry, *, shrink_to: int | None = None) -> None:
        super().__init__(store, model=registry["default"])
        self.models = registry
        self.shrink_to = shrink_to
        self.compactions: list[tuple[str, bool, str]] = []

    async def compact(self, session_id, *, auto=False, model=None):
        self.compactions.append((session_id, auto, model.model_id))
        if self.shrink_to is not None:
            self.store.set_usage(session_id, {"prompt_tokens": self.shrink_to})


def used(agent: Think, tokens: int) -> str:
    """A session whose rollup says ``tokens`` are in the context window."""
    sid = agent.create_session().id
    agent.store.set_usage(sid, {"prompt_tokens": tokens - 1000, "cache_read": 1000})
    return sid


# -- selection ---------------------------------------------------------------------------


async def test_selection_picks_the_model_and_carries_forward(store):
    registry = models(default=200_000, big=1_000_000)
    agent = Agent(store, registry)
    result = await agent.chat(pick("hi", "big", variant="thinking"))
    assert result.text == "from big"
    assert len(registry["big"].requests) == 1 and registry["default"].requests == []
    selection = {"provider_id": "test", "model_id": "big", "variant": "thinking"}
    # the picker's "currently using": the model; the variant was this turn's only
    assert agent.get_session().model == {**selection, "variant": None}
    assert agent.get_history()[-1]["metadata"]["model"] == selection
    assert agent.get_history()[0]["metadata"]["model_id"] == "big"  # history is queryable
    # No selection: the row's model carries forward, also for a regenerate.
    assert (await agent.chat("again")).text == "from big"
    assert (await agent.chat(None)).text == "from big"
    assert len(registry["big"].requests) == 3
    # Picking again switches; the variant is per turn.
    assert (await agent.chat(pick("back", "default"))).text == "from default"
    assert agent.get_session().model == {
        "provider_id": "test",
        "model_id": "default",
        "variant": None,
    }
    assert "variant" not in agent.get_history()[-1]["metadata"]["model"]
    assert (await agent.chat("stay")).text == "from default"


async def test_unknown_model_fails_before_anything_is_written(store):
    agent = Agent(store, models(default=200_000))
    await agent.chat("hi")
    sid = agent.current_session_id
    before = (agent.store.message_count(sid), agent.get_session().model)
    collector = Collector()
    result = await agent.chat(pick("hello", "nope"), collector)
    assert result.status == "error" and "unknown model 'nope'" in result.error
    assert collector.errors == [result.error]
    bad = pick("x", "default")
    bad["metadata"]["model_id"] = ""
    assert (await agent.chat(bad)).status == "error"
    assert (agent.store.message_count(sid), agent.get_session().model) == before
    assert agent.get_status(sid).state == "error"
    assert (await agent.chat("recovers")).status == "completed"


async def test_resolve_model_can_be_overridden(store):
    seen = []

    class PerVariant(Think):
        def resolve_model(self, selection):
            seen.append(selection)
            if selection is None:
                return super().resolve_model(None)
            return ScriptedModel([reply(f"{selection['model_id']}/{selection['variant']}")])

    agent = PerVariant(store, model=ScriptedModel([reply("default")]))
    assert (await agent.chat(pick("a", "m1", variant="json"))).text == "m1/json"
    assert seen == [{"provider_id": "test", "model_id": "m1", "variant": "json"}]


async def test_a_variant_chosen_on_one_turn_does_not_apply_to_the_next(store):
    """Issue 9 item 12 (seed 002: "a reasoning-mode toggle that lasts the session is a
    bug"): the user turns on thinking for one hard question; the next, plain question
    runs the same model without it. Regenerating the first answer is that turn again:
    with its variant."""

    class PerVariant(Think):
        def resolve_model(self, selection):
            model_id = (selection or {}).get("model_id") or "default"
            variant = (selection or {}).get("variant")
            return ScriptedModel([reply(f"{model_id}/{variant}")], model_id=model_id, loop=True)

    agent = PerVariant(store, model=ScriptedModel([reply("default")]))
    first = await agent.chat(pick("a hard one", "big", variant="thinking"))
    assert first.text == "big/thinking"
    second = await agent.chat("and an easy one")
    assert second.text == "big/None"  # the model carried forward, the variant did not
    assert "variant" not in agent.get_history()[-1]["metadata"]["model"]
    assert agent.get_session().model["variant"] is None
    agent.rewind(agent.current_session_id, first.user_message_id)
    assert (await agent.chat(None)).text == "big/thinking"


def test_model_selection_shape():
    assert model_selection(None) is None and model_selection({"snapshot_id": "s"}) is None
    assert model_selection({"model_id": "m"}) == {
        "provider_id": None,
        "model_id": "m",
        "variant": None,
    }
    for bad in ({"provider_id": "p"}, {"model_id": 3}, {"model_id": "m", "variant": 1}):
        with pytest.raises(UnknownModelError):
            model_selection(bad)


# -- the seed's table: switching to a smaller context window ------------------------------


async def test_row1_larger_context_is_a_no_op(store):
    registry = models(default=200_000, big=1_000_000)
    agent = Agent(store, registry)
    sid = used(agent, 190_000)
    result = await agent.chat(pick("go", "big"), session_id=sid)
    assert result.text == "from big" and agent.compactions == []


async def test_row2_smaller_context_that_still_fits_is_a_no_op(store):
    registry = models(default=200_000, small=50_000)
    agent = Agent(store, registry)
    sid = used(agent, 40_000)  # reserve = min(20k, max_output 8192): usable 41,808
    result = await agent.chat(pick("go", "small"), session_id=sid)
    assert result.text == "from small" and agent.compactions == []


async def test_row3_smaller_context_forces_compaction_first(store):
    registry = models(default=200_000, small=50_000)
    agent = Agent(store, registry, shrink_to=5_000)
    sid = used(agent, 45_000)
    result = await agent.chat(pick("go", "small"), session_id=sid)
    assert agent.compactions == [(sid, True, "small")]  # against the new model
    assert result.status == "completed" and result.text == "from small"
    assert agent.get_session(sid).model["model_id"] == "small"


async def test_row4_still_too_big_after_compaction_fails_the_swap(store):
    registry = models(default=200_000, small=50_000)
    # The turn before re-reads the 45,000-token conversation, as a real model reports.
    registry["default"] = ScriptedModel(
        [reply("from default", usage={"input": 10, "cache_read": 45_000, "output": 5})],
        model_id="default",
        context_window=200_000,
        loop=True,
    )
    agent = Agent(store, registry, shrink_to=44_000)
    sid = used(agent, 45_000)
    assert (await agent.chat("before", session_id=sid)).status == "completed"
    count, row_model = agent.store.message_count(sid), agent.get_session(sid).model
    collector = Collector()
    result = await agent.chat(pick("go", "small"), collector, session_id=sid)
    assert result.status == "error"
    assert result.error == CONTEXT_SWITCH_ERROR
    assert result.error == (
        "Switching to a model with a smaller context window would lose the conversation; "
        "consider branching with the new model."
    )
    assert collector.errors == [CONTEXT_SWITCH_ERROR]
    assert len(agent.compactions) == 1
    assert registry["small"].requests == []  # the model is never called
    assert agent.store.message_count(sid) == count  # the user message did not land
    assert agent.get_session(sid).model == row_model
    # The escape hatch the message suggests: a branch with the new model and only the tail.
    last = agent.get_history(sid)[-1]["id"]
    branch = agent.branch(sid, last)
    agent.store.set_usage(branch.id, {"prompt_tokens": 1_000})  # e.g. the user trimmed it
    assert (await agent.chat(pick("go", "small"), session_id=branch.id)).text == "from small"


async def test_row4_without_a_compaction_hook(store):
    registry = models(default=200_000, small=50_000)
    agent = Think(store, model=registry["default"])
    agent.models = registry
    sid = used(agent, 45_000)
    result = await agent.chat(pick("go", "small"), session_id=sid)
    assert result.error == CONTEXT_SWITCH_ERROR and registry["small"].requests == []


async def test_a_refused_switch_writes_nothing_not_even_a_compaction(store):
    """Issue 9 item 14: switching to a model whose window the conversation cannot fit
    even summarized. The summarizer is tried, but its summary would not make room, so
    the switch is refused with seed 002's message and the session is exactly as it
    was: no compaction message, nothing hidden, the rollups and the row's model
    unchanged, no user message."""
    from thinkray.runtime.agents.agent import Agent as FullAgent
    from thinkray.runtime.capabilities.compaction import CompactionConfig
    from thinkray.runtime.models.testing import FunctionModel

    small = ScriptedModel(
        [reply("from small")], model_id="small", context_window=10_000, max_output_tokens=1_000
    )
    big = ScriptedModel(
        # each request carries ~9.2k tokens: over what the small model can use (9k)
        [reply(f"a{i}", usage={"input": 9_200, "output": 10}) for i in range(3)],
        model_id="big",
        context_window=200_000,
    )
    wordy = FunctionModel(
        lambda request, step: reply("a summary as long as the window", usage={"output": 9_500}),
        model_id="cheap",
    )

    class Switching(FullAgent):
        models = {"small": small}

    agent = Switching(store, model=big)
    agent.compaction_config = CompactionConfig(summary_model=wordy, retry_backoff=0)
    for text in ("u1", "u2", "u3"):
        await agent.chat(text)
    sid = agent.current_session_id

    def snapshot():
        info = agent.get_session(sid)
        path = [(r.id, r.hidden) for r in store.get_path(sid)]
        return path, store.message_count(sid, include_hidden=True), info.usage, info.model

    before = snapshot()
    result = await agent.chat(pick("now the small one", "small"), session_id=sid)
    assert result.status == "error" and result.error == CONTEXT_SWITCH_ERROR
    assert len(wordy.requests) == 1  # compaction was tried, against the new model
    assert small.requests == []
    assert agent.list_compactions(sid) == []
    assert snapshot() == before


async def test_reserve_comes_from_settings_and_the_threshold_is_strict(store):
    registry = models(default=200_000, small=50_000)
    agent = Agent(store, registry)
    sid = used(agent, 45_000)
    agent.store.set_config(DEFAULT_SETTINGS_KEY, {"compaction": {"reserve_tokens": 1_000}})
    assert (await agent.chat(pick("go", "small"), session_id=sid)).status == "completed"
    assert agent.compactions == []
    small = registry["small"]
    assert reserve_tokens(small) == 8_192  # min(20k, max_output_tokens)
    assert reserve_tokens(small, {"compaction": {"reserve_tokens": 1_000}}) == 1_000
    assert fits_context(50_000 - 8_192 - 1, small) and not fits_context(50_000 - 8_192, small)


# -- context window tracking ----------------------------------------------------------------


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return f"found {q}"


async def test_usage_per_assistant_message_from_steps(store):
    model = ScriptedModel(
        [
            reply(
                tool_call("lookup", {"q": "x"}),
                usage={
                    "input": 10,
                    "output": 5,
                    "reasoning": 2,
                    "cache_read": 30,
                    "cache_write": 4,
                },
            ),
            reply("done", usage={"input": 20, "output": 7, "cache_read": 40}),
            reply("second", usage={"input": 1, "output": 1}),
        ]
    )
    agent = Think(store, model=model)
    agent.get_tools = lambda: {"lookup": lookup}
    await agent.chat("first")
    message = agent.get_history()[-1]
    assert message["metadata"]["usage"] == {
        "input": 30,
        "output": 12,
        "reasoning": 2,
        "cache_read": 70,
        "cache_write": 4,
    }
    await agent.chat("next")
    session = agent.get_session()
    assert session.usage == {
        "prompt_tokens": 31,
        "completion_tokens": 13,
        "reasoning_tokens": 2,
        "cache_read": 70,
        "cache_write": 4,
        "total_tokens": 120,
        "cost_usd": None,  # no writer supplied a cost: none is computed
    }
    # The context is the last call's (seed 002: what the next request carries), not the
    # sum above: that adds every step's re-read of the conversation.
    assert session.context_window_used == 1 + 1


async def test_cost_only_when_a_writer_supplies_it(store):
    model = ScriptedModel(
        [reply("a", usage={"input": 1, "cost_usd": 0.002}), reply("b", usage={"input": 1})]
    )
    agent = Think(store, model=model)
    await agent.chat("one")
    assert agent.get_history()[-1]["metadata"]["usage"]["cost_usd"] == 0.002
    await agent.chat("two")
    assert "cost_usd" not in agent.get_history()[-1]["metadata"]["usage"]
    assert agent.get_session().usage["cost_usd"] == pytest.approx(0.002)


async def test_finish_step_chunks_never_bump_the_rollups(store):
    """Seed 002: the recorder bumps rollups from per-step usage only, NEVER from
    finish-step chunks (or any chunk) on the wire."""
    fake = {"input": 500, "output": 500, "inputTokens": 900, "outputTokens": 500}

    class Wire(Think):
        async def on_chat_message(self, options):
            yield {"type": "start", "messageMetadata": {"usage": fake}}
            yield {"type": "start-step"}
            yield {"type": "text-start", "id": "t"}
            yield {"type": "text-delta", "id": "t", "delta": "hi"}
            yield {"type": "text-end", "id": "t"}
            yield {"type": "finish-step", "usage": fake, "messageMetadata": {"usage": fake}}
            yield {"type": "message-metadata", "messageMetadata": {"usage": fake}}
            yield {"type": "finish", "finishReason": "stop", "messageMetadata": {"usage": fake}}

    agent = Wire(store)
    result = await agent.chat("hello")
    assert result.status == "completed" and result.text == "hi"
    assert agent.get_session().usage == empty_rollup()
    assert agent.get_session().context_window_used == 0
    assert agent.get_history()[-1]["metadata"]["usage"] == {
        "input": 0,
        "output": 0,
        "reasoning": 0,
        "cache_read": 0,
        "cache_write": 0,
    }


def test_context_window_used_is_the_seed_formula(store):
    sid = store.create_session().id
    info = store.set_usage(
        sid,
        {
            "prompt_tokens": 100,
            "completion_tokens": 20,
            "reasoning_tokens": 3,
            "cache_read": 400,
            "cache_write": 50,
            "total_tokens": 10_000,  # billed across re-reads: not the context window
        },
    )
    assert info.context_window_used == 573
    assert store.get_session(sid).to_dict()["context_window_used"] == 573
