"""Seed 002 "Compaction": threshold, artifact, soft-hide, the model's view, tail, the
summarizer's discipline, the failure ladder, and tool-output pruning."""

from __future__ import annotations

import asyncio
import logging

import pytest
from pydantic import ValidationError
from thinkray.runtime import SessionBusyError, Think, tool
from thinkray.runtime.agents.agent import Agent as _Agent
from thinkray.runtime.capabilities.compaction import (
    SUMMARY_SYSTEM_PROMPT,
    CompactionConfig,
    CompactionSpecLimitError,
    NothingToCompactError,
    SummarizerError,
    compaction_view,
    summarized_ids,
)
from thinkray.runtime.models.base import ModelRequest
from thinkray.runtime.models.testing import (
    FunctionModel,
    ScriptedModel,
    fail,
    reply,
    text,
    tool_call,
)
from thinkray.runtime.tools.base import ToolContext
from thinkray.runtime.usage import Usage

from tests.conftest import Collector

SUMMARY = "## Goal\nG\n\n## Progress\nP\n\n## Decisions\nD\n\n## Next Steps\nN"


class Agent(_Agent):
    pass


def summarizer(summary: str = SUMMARY, **kwargs) -> FunctionModel:
    kwargs.setdefault("model_id", "cheap")
    return FunctionModel(lambda request, step: reply(summary), **kwargs)


def make(store, main, summ=None, **config) -> Agent:
    agent = Agent(store, model=main)
    config.setdefault("retry_backoff", 0)
    agent.compaction_config = CompactionConfig(summary_model=summ or summarizer(), **config)
    return agent


def request_text(request: ModelRequest) -> list[tuple[str, str]]:
    return [(m.role, "".join(getattr(c, "text", "") for c in m.content)) for m in request.messages]


async def three_turns(agent: Agent) -> list[dict]:
    for i in (1, 2, 3):
        await agent.chat(f"u{i}")
    return agent.get_history()


def main_model(n: int = 8, **kwargs) -> ScriptedModel:
    return ScriptedModel([reply(f"a{i}") for i in range(1, n + 1)], **kwargs)


# -- configuration and threshold ----------------------------------------------------------


def test_config_has_the_seed_shape_and_defaults():
    config = CompactionConfig()
    dumped = config.model_dump()
    assert {
        k: dumped[k]
        for k in (
            "reserve_tokens",
            "tail_turns",
            "tail_budget_pct",
            "retry_on_transient",
            "smart_recovery",
        )
    } == {
        "reserve_tokens": 20000,
        "tail_turns": 2,
        "tail_budget_pct": 0.25,
        "retry_on_transient": 2,
        "smart_recovery": {
            "prune_tool_outputs": True,
            "chunked_summarize": True,
            "drop_middle": True,
        },
    }
    assert "summary_model" not in dumped  # a live object is never persisted
    assert config.temperature <= 0.3 and config.max_output_tokens <= 4096
    with pytest.raises(ValidationError):
        CompactionConfig(tail_turns=0)
    with pytest.raises(ValidationError):
        CompactionConfig(smart_recovery={"prune": True})


def test_reserve_defaults_to_min_of_20k_and_max_output():
    config = CompactionConfig()
    small = ScriptedModel(context_window=200_000, max_output_tokens=8_192)
    large = ScriptedModel(context_window=1_000_000, max_output_tokens=64_000)
    assert config.reserve_for(small) == 8_192
    assert config.usable(small) == 200_000 - 8_192
    assert config.reserve_for(large) == 20_000
    assert config.usable(large) == 1_000_000 - 20_000
    assert CompactionConfig(reserve_tokens=1_000).reserve_for(large) == 1_000


async def test_auto_compaction_fires_exactly_at_the_threshold(store):
    # context 1000, max output 100 -> reserve 100 -> usable 900.
    main = ScriptedModel(
        [
            reply(
                "a1",
                usage=Usage(input=400, output=99, reasoning=100, cache_read=200, cache_write=100),
            ),
            # u2's call re-reads the 899 tokens (from the cache) and adds one.
            reply("a2", usage=Usage(input=1, cache_read=899)),
            reply("a3"),
            reply("a4"),
        ],
        context_window=1_000,
        max_output_tokens=100,
    )
    summ = summarizer()
    agent = make(store, main, summ)
    await agent.chat("u1")
    assert agent.get_session().context_window_used == 899
    await agent.chat("u2")  # 899 < 900: no compaction
    assert summ.requests == [] and agent.list_compactions() == []
    assert agent.get_session().context_window_used == 900
    collector = Collector()
    result = await agent.chat("u3", collector)  # 900 >= 900: compaction before the model call
    assert result.status == "completed"
    assert len(summ.requests) == 1
    [compaction] = agent.list_compactions()
    assert compaction["auto"] is True
    # The call that followed saw the summary (system-level, seed 000) and the tail only.
    assert request_text(main.requests[2]) == [
        ("system", f"[Summary of the earlier conversation]\n{SUMMARY}"),
        ("user", "u2"),
        ("assistant", "a2"),
        ("user", "u3"),
    ]
    # The user sees a one-line affordance; it is not stored as a part.
    [note] = [c for c in collector.events if c["type"] == "data-status"]
    assert note["transient"] and note["data"]["state"] == "done"
    assert note["data"]["message"] == "summarized 2 earlier messages"
    assert collector.types()[0] == "start"
    assert [p["type"] for p in result.message["parts"]] == ["step-start", "text"]
    # The rollup now says what the next call carries: summary + tail (+ this turn).
    meta = store.get_message(compaction["message_id"])["metadata"]["compaction"]
    assert meta["context_window_used_at"] == 900
    assert meta["context_window_after"] == compaction["summary_tokens"] + meta["tail_tokens"]
    usage = agent.get_session().usage
    assert usage["prompt_tokens"] + usage["completion_tokens"] == meta["context_window_after"] + 15
    # The context is what the last call reported reading and writing (the scripted
    # model reports 10 + 5 whatever it was sent), not a sum over calls.
    assert agent.get_session().context_window_used == 15
    assert usage["total_tokens"] == 899 + 900 + 15  # what was billed is kept
    await agent.chat("u4")  # far below the threshold again: no second compaction
    assert len(summ.requests) == 1


async def test_threshold_follows_the_model(store):
    agent = make(store, main_model(context_window=1_000, max_output_tokens=100))
    sid = agent.create_session().id
    store.add_usage(sid, {"input": 850})
    assert not agent.needs_compaction(sid)
    assert agent.needs_compaction(sid, ScriptedModel(context_window=900, max_output_tokens=50))
    assert agent.compaction_threshold(sid) == 900


async def test_auto_compaction_can_be_turned_off(store):
    main = ScriptedModel(
        [reply("a1", usage=Usage(input=5_000)), reply("a2"), reply("a3")],
        context_window=1_000,
        max_output_tokens=100,
    )
    summ = summarizer()
    agent = make(store, main, summ, auto=False)
    await agent.chat("u1")
    await agent.chat("u2")
    await agent.chat("u3")
    assert summ.requests == []


# -- the artifact -----------------------------------------------------------------------------


async def test_manual_compaction_writes_the_data_compaction_part(store):
    agent = make(store, main_model())
    history = await three_turns(agent)
    ids = [m["id"] for m in history]
    result = await agent.compact()
    message = store.get_message(result.message_id)
    assert message["role"] == "assistant"
    [part] = message["parts"]
    assert part["type"] == "data-compaction"
    data = part["data"]
    assert data["summary"] == SUMMARY
    assert data["tail_start_id"] == ids[4]  # u3: the last user message + its answer
    assert data["auto"] is False
    assert isinstance(data["summary_tokens"], int) and data["summary_tokens"] > 0
    assert data["covers"] == {"first_id": ids[0], "last_id": ids[3]}
    assert result.summarized == 4 and result.tail_messages == 2 and result.strategy == "one-shot"
    assert message["metadata"]["synthetic"] is True


async def test_summarized_messages_are_hidden_not_deleted(store):
    agent = make(store, main_model())
    history = await three_turns(agent)
    ids = [m["id"] for m in history]
    before = store.message_count(agent.current_session_id, include_hidden=True)
    result = await agent.compact()
    sid = agent.current_session_id
    assert store.message_count(sid, include_hidden=True) == before + 1
    path = store.get_path(sid)
    # The synthetic message sits in the tree right above the tail it keeps.
    assert [r.id for r in path] == [*ids[:4], result.message_id, *ids[4:]]
    hidden = {r.id for r in path if r.hidden}
    assert hidden == set(ids[:4])
    assert summarized_ids(store, sid, result.message_id) == ids[:4]
    assert {r.hidden_at for r in path if r.hidden} == {
        store.get_message(result.message_id)["parts"][0]["data"]["hidden_at"]
    }
    assert [m["id"] for m in agent.get_history()] == [result.message_id, *ids[4:]]
    assert compaction_view(agent.get_history()) == agent.get_history()


async def test_the_summary_reaches_the_model_system_level_and_is_stored_before_the_tail(store):
    """Issue 9 item 15 (seed 000: summarized messages "are replaced with a single system
    message containing the summary"), with the real Anthropic adapter against the fake
    API: after a compaction the next request carries the summary at system level and
    the tail as the conversation, and the stored history reads summary, then tail."""
    from fake_anthropic import FakeAnthropicServer, message, text
    from thinkray.runtime.models.anthropic import AnthropicModel

    def plain(content) -> str:
        if isinstance(content, str):
            return content
        return "".join(block.get("text", "") for block in content)

    with FakeAnthropicServer() as fake:
        fake.enqueue(*(message(text(f"a{i}")) for i in range(1, 5)))
        agent = make(store, AnthropicModel(api_key="test-key", base_url=fake.base_url))
        history = await three_turns(agent)
        result = await agent.compact()
        tail = [m["id"] for m in history[4:]]
        assert [m["id"] for m in agent.get_history()] == [result.message_id, *tail]
        await agent.chat("u4")
        body = fake.bodies[-1]
    assert SUMMARY in plain(body["system"])
    assert [(m["role"], plain(m["content"])) for m in body["messages"]] == [
        ("user", "u3"),
        ("assistant", "a3"),
        ("user", "u4"),
    ]
    stored = agent.get_history()
    assert [m["id"] for m in stored[:3]] == [result.message_id, *tail]
    assert [m["role"] for m in stored[3:]] == ["user", "assistant"]


async def test_a_tail_that_opens_with_an_answer_still_opens_the_request_with_a_user_turn(store):
    """The summary is system-level now, so a tail cut to the last answer would open the
    Anthropic conversation with an assistant turn, which the API refuses: the adapter
    puts a short user turn in front."""
    from fake_anthropic import FakeAnthropicServer, message, text
    from thinkray.runtime.models.anthropic import CONTINUED, AnthropicModel

    with FakeAnthropicServer() as fake:
        fake.enqueue(*(message(text(f"a{i}")) for i in range(1, 5)))
        model = AnthropicModel(api_key="test-key", base_url=fake.base_url)
        agent = make(store, model, tail_turns=1)
        await three_turns(agent)
        await agent.compact()  # the tail is a3 alone
        await agent.chat("u4")
        body = fake.bodies[-1]
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][0]["content"] == [{"type": "text", "text": CONTINUED}]
    system = body["system"]
    assert SUMMARY in (system if isinstance(system, str) else "".join(b["text"] for b in system))


async def test_model_sees_summary_plus_tail_only(store):
    main = main_model()
    agent = make(store, main)
    await three_turns(agent)
    await agent.compact()
    await agent.chat("u4")
    assert request_text(main.requests[-1]) == [
        ("system", f"[Summary of the earlier conversation]\n{SUMMARY}"),
        ("user", "u3"),
        ("assistant", "a3"),
        ("user", "u4"),
    ]
    # And it stays that way on the following turn.
    await agent.chat("u5")
    assert [t for _, t in request_text(main.requests[-1])][1:] == ["u3", "a3", "u4", "a4", "u5"]


async def test_second_compaction_summarizes_the_first(store):
    main = main_model()
    summ = FunctionModel(lambda request, step: reply(f"summary {step}"), model_id="cheap")
    agent = make(store, main, summ)
    await three_turns(agent)
    first = await agent.compact()
    await agent.chat("u4")
    await agent.chat("u5")
    second = await agent.compact()
    transcript = request_text(summ.requests[1])[0][1]
    assert "summary 0" in transcript and "u3" in transcript and "u5" not in transcript
    compactions = agent.list_compactions()
    assert [c["message_id"] for c in compactions] == [first.message_id, second.message_id]
    assert [c["hidden"] for c in compactions] == [True, False]
    await agent.chat("u6")
    assert [t for _, t in request_text(main.requests[-1])] == [
        "[Summary of the earlier conversation]\nsummary 1",
        "u5",
        "a5",
        "u6",
    ]


# -- tail -----------------------------------------------------------------------------------


async def test_tail_drops_to_one_message_with_a_warning_when_over_budget(store, caplog):
    # usable = 900 tokens -> tail budget 225 tokens (~900 chars).
    long_answer = "x" * 1_200
    main = ScriptedModel(
        [reply("a1"), reply("a2"), reply(long_answer), reply("a4")],
        context_window=1_000,
        max_output_tokens=100,
    )
    agent = make(store, main, auto=False)
    history = await three_turns(agent)
    with caplog.at_level(logging.WARNING, logger="thinkray.compaction"):
        result = await agent.compact()
    assert result.tail_start_id == history[-1]["id"] and result.tail_messages == 1
    assert result.summarized == 5
    assert result.warnings and "tail budget" in result.warnings[0]
    assert any("tail budget" in r.getMessage() for r in caplog.records)
    await agent.chat("u4")
    assert [t for _, t in request_text(main.requests[-1])][1:] == [long_answer, "u4"]


async def test_tail_turns_setting_is_honoured(store):
    agent = make(store, main_model(), tail_turns=4)
    history = await three_turns(agent)
    result = await agent.compact()
    assert result.tail_start_id == history[2]["id"] and result.summarized == 2


# -- summarizer discipline ---------------------------------------------------------------------


async def test_summarizer_gets_no_tools_low_temperature_and_a_cap(store):
    @tool
    def lookup(q: str) -> str:
        """Look up."""
        return q

    class ToolAgent(Agent):
        def get_tools(self):
            return {"lookup": lookup}

    summ = summarizer(max_output_tokens=1_000)
    agent = ToolAgent(store, model=main_model())
    agent.compaction_config = CompactionConfig(summary_model=lambda: summ, max_output_tokens=4_000)
    await three_turns(agent)
    await agent.compact()
    [request] = summ.requests
    assert request.tools == []
    assert request.temperature == 0.2
    assert request.max_output_tokens == 1_000  # min(config cap, model's own max)
    assert request.system == SUMMARY_SYSTEM_PROMPT
    for heading in ("## Goal", "## Progress", "## Decisions", "## Next Steps"):
        assert heading in request.system
    [(role, body)] = request_text(request)
    assert role == "user"
    assert "u1" in body and "a2" in body and "u3" not in body and "a3" not in body


async def test_summarizer_defaults_to_the_agents_model(store):
    main = ScriptedModel([reply("a1"), reply("a2"), reply("a3"), reply(SUMMARY)])
    agent = Agent(store, model=main)
    agent.compaction_config = CompactionConfig()
    await three_turns(agent)
    result = await agent.compact()
    assert result.summary == SUMMARY and main.requests[-1].tools == []


# -- failure ladder: transient ------------------------------------------------------------------


def flaky(failures: int) -> FunctionModel:
    def step(request, n):
        if n < failures:
            return reply(fail("overloaded", transient=True))
        return reply(SUMMARY)

    return FunctionModel(step, model_id="cheap")


async def test_transient_failure_is_retried_then_succeeds(store):
    summ = flaky(2)
    agent = make(store, main_model(), summ, retry_on_transient=2, retry_backoff=0.001)
    await three_turns(agent)
    result = await agent.compact()
    assert len(summ.requests) == 3 and result.summary == SUMMARY


async def test_transient_failures_exhausted_auto_proceeds_without_compaction(store, caplog):
    main = ScriptedModel(
        [reply("a1"), reply("a2", usage=Usage(input=2_000)), reply("a3")],
        context_window=1_000,
        max_output_tokens=100,
    )
    summ = flaky(99)
    agent = make(store, main, summ, retry_on_transient=2, retry_backoff=0.001)
    states = []
    agent.status.subscribe(lambda sid, status: states.append(status.state))
    await agent.chat("u1")
    await agent.chat("u2")
    collector = Collector()
    with caplog.at_level(logging.WARNING, logger="thinkray.compaction"):
        result = await agent.chat("u3", collector)
    assert result.status == "completed" and result.text == "a3"
    assert len(summ.requests) == 3  # one try + retry_on_transient
    assert "retrying" in states
    assert agent.list_compactions() == []
    assert not any(r.hidden for r in store.get_path(agent.current_session_id))
    assert any("continuing without it" in r.getMessage() for r in caplog.records)
    [note] = [c for c in collector.events if c["type"] == "data-status"]
    assert note["data"]["state"] == "failed" and note["transient"]
    assert [t for _, t in request_text(main.requests[-1])] == ["u1", "a1", "u2", "a2", "u3"]


async def test_transient_failures_exhausted_manual_raises_and_writes_nothing(store):
    agent = make(store, main_model(), flaky(99), retry_on_transient=1, retry_backoff=0.001)
    await three_turns(agent)
    sid = agent.current_session_id
    with pytest.raises(SummarizerError) as info:
        await agent.compact()
    assert info.value.transient
    assert store.message_count(sid, include_hidden=True) == 6
    assert not any(r.hidden for r in store.get_path(sid))


async def test_summarizer_timeout_counts_as_transient(store):
    slow = summarizer(delay=0.2)
    agent = make(store, main_model(), slow, timeout=0.05, retry_on_transient=1)
    await three_turns(agent)
    with pytest.raises(SummarizerError, match="timed out"):
        await agent.compact()
    assert len(slow.requests) == 2 and agent.list_compactions() == []


async def test_non_transient_summarizer_error_is_not_retried(store):
    broken = FunctionModel(lambda r, n: reply(fail("bad request")), model_id="cheap")
    agent = make(store, main_model(), broken)
    await three_turns(agent)
    with pytest.raises(SummarizerError) as info:
        await agent.compact()
    assert not info.value.transient and len(broken.requests) == 1


async def test_abort_during_auto_compaction_writes_nothing(store):
    main = ScriptedModel(
        [reply("a1"), reply("a2", usage=Usage(input=2_000)), reply("a3")],
        context_window=1_000,
        max_output_tokens=100,
    )
    summ = summarizer(delay=0.5)
    agent = make(store, main, summ)
    await agent.chat("u1")
    await agent.chat("u2")
    run = agent.start_chat("u3")
    await asyncio.sleep(0.05)
    assert len(summ.requests) == 1  # the summarizer is running
    agent.abort()
    result = await run.task
    assert result.status == "aborted" and len(main.requests) == 2
    assert agent.list_compactions() == []
    assert not any(r.hidden for r in store.get_path(agent.current_session_id))


# -- failure ladder: spec limit --------------------------------------------------------------------

BIG = "x" * 4_000  # ~1000 tokens


@tool
def read(path: str) -> str:
    """Read a file."""
    return BIG


@tool
def todo(item: str) -> str:
    """The todo list."""
    return BIG


class ToolAgent(Agent):
    def get_tools(self):
        return {"read": read, "todo": todo}


def tool_turns(*tools: str) -> ScriptedModel:
    replies = []
    for i, name in enumerate(tools, 1):
        if name:
            replies.append(
                reply(
                    tool_call(
                        name, {"path": f"f{i}"} if name == "read" else {"item": f"i{i}"}, id=f"c{i}"
                    )
                )
            )
        replies.append(reply(f"done{i}"))
    return ScriptedModel(replies)


async def run_turns(agent, n: int, prefix: str = "u") -> None:
    for i in range(1, n + 1):
        await agent.chat(f"{prefix}{i}")


def tight_summarizer(window: int = 1_000) -> FunctionModel:
    return summarizer(context_window=window, max_output_tokens=100)


async def test_spec_limit_prunes_tool_outputs_then_summarizes(store):
    summ = tight_summarizer()
    agent = ToolAgent(store, model=tool_turns("read", "read", "", ""))
    agent.compaction_config = CompactionConfig(summary_model=summ)
    await run_turns(agent, 4)
    result = await agent.compact()
    assert result.strategy == "pruned" and result.pruned.pruned == 2
    assert len(summ.requests) == 1
    transcript = request_text(summ.requests[0])[0][1]
    assert "<output pruned, 1000 tokens>" in transcript and BIG not in transcript
    parts = [
        p
        for m in store.get_history(agent.current_session_id, include_hidden=True)
        for p in m["parts"]
        if p["type"] == "dynamic-tool"
    ]
    assert [p["output"] for p in parts] == ["<output pruned, 1000 tokens>"] * 2
    assert [p["input"] for p in parts] == [{"path": "f1"}, {"path": "f2"}]
    assert {p["state"] for p in parts} == {"output-available"}


async def test_spec_limit_falls_back_to_chunked_summaries(store):
    summ = FunctionModel(
        lambda request, step: reply(f"part summary {step}"),
        model_id="cheap",
        context_window=1_000,
        max_output_tokens=100,
    )
    agent = make(store, main_model(), summ)
    for i in (1, 2, 3):
        await agent.chat(f"u{i} " + "y" * 2_400)  # ~600 tokens each, not prunable
    result = await agent.compact()
    assert result.strategy == "chunked"
    assert len(summ.requests) >= 2
    assert "### Part 1 of" in result.summary and "part summary 1" in result.summary
    for request in summ.requests:
        assert request.tools == [] and "part" in request_text(request)[0][1]


async def test_spec_limit_drops_the_middle_when_chunking_is_off(store):
    summ = tight_summarizer()
    agent = make(
        store,
        main_model(12),
        summ,
        smart_recovery={
            "prune_tool_outputs": True,
            "chunked_summarize": False,
            "drop_middle": True,
        },
    )
    for i in range(1, 11):
        await agent.chat(f"m{i}:" + "w" * 600)
    result = await agent.compact()
    assert result.strategy == "drop-middle" and len(summ.requests) == 1
    transcript = request_text(summ.requests[0])[0][1]
    assert "m1:" in transcript and "a9" in transcript and "m5:" not in transcript
    assert "omitted from the middle" in transcript


async def test_spec_limit_with_no_recovery_is_a_clear_error_writing_nothing(store):
    summ = tight_summarizer()
    agent = ToolAgent(store, model=tool_turns("read", "read", "", ""))
    agent.compaction_config = CompactionConfig(
        summary_model=summ,
        smart_recovery={
            "prune_tool_outputs": False,
            "chunked_summarize": False,
            "drop_middle": False,
        },
    )
    await run_turns(agent, 4)
    sid = agent.current_session_id
    before = store.get_history(sid, include_hidden=True)
    with pytest.raises(CompactionSpecLimitError, match="exceeds the summarizer's input"):
        await agent.compact()
    assert store.get_history(sid, include_hidden=True) == before
    assert not any(r.hidden for r in store.get_path(sid)) and summ.requests == []


# -- pruning -------------------------------------------------------------------------------------


async def test_prune_stubs_old_outputs_keeps_protected_tools_and_recent_turns(store):
    agent = ToolAgent(store, model=tool_turns("read", "todo", "read", "read", "read"))
    await run_turns(agent, 5)
    sid = agent.current_session_id
    result = agent.prune_tool_outputs(sid)
    outputs = [
        (p["toolName"], p["output"], p["input"], p["state"])
        for m in store.get_history(sid)
        for p in m["parts"]
        if p["type"] == "dynamic-tool"
    ]
    assert outputs == [
        ("read", "<output pruned, 1000 tokens>", {"path": "f1"}, "output-available"),
        ("todo", BIG, {"item": "i2"}, "output-available"),  # protected tool
        ("read", "<output pruned, 1000 tokens>", {"path": "f3"}, "output-available"),
        ("read", BIG, {"path": "f4"}, "output-available"),  # last two turns
        ("read", BIG, {"path": "f5"}, "output-available"),
    ]
    assert result.pruned == 2 and result.reclaimed_tokens > 1_900
    assert agent.prune_tool_outputs(sid).pruned == 0  # idempotent
    # The model still sees that the call happened.
    assert agent.get_history(sid)[1]["parts"][1]["output"].startswith("<output pruned")


async def test_prune_stops_once_the_target_is_reclaimed(store):
    agent = ToolAgent(store, model=tool_turns("read", "read", "read", "", ""))
    await run_turns(agent, 5)
    result = agent.prune_tool_outputs(target_tokens=10)
    assert result.pruned == 1
    outputs = [
        p["output"] for m in agent.get_history() for p in m["parts"] if p["type"] == "dynamic-tool"
    ]
    assert outputs == [BIG, BIG, "<output pruned, 1000 tokens>"]  # newest old turn first


async def test_prune_from_inside_a_turn_never_touches_the_current_turn(store):
    freed = {}

    @tool
    async def free_space(ctx: ToolContext) -> str:
        """Free context space."""
        freed["result"] = ctx.agent.prune_tool_outputs(ctx.session_id)
        return BIG

    class Agent2(ToolAgent):
        def get_tools(self):
            return {"read": read, "free_space": free_space}

    model = tool_turns("read", "read", "read")
    model.add(reply(tool_call("free_space", {}, id="c4")), reply("done4"))
    agent = Agent2(store, model=model)
    await run_turns(agent, 4)
    assert freed["result"].pruned == 1  # turn 1 only: turns 2-3 and the current are protected
    outputs = [
        p["output"] for m in agent.get_history() for p in m["parts"] if p["type"] == "dynamic-tool"
    ]
    assert outputs == ["<output pruned, 1000 tokens>", BIG, BIG, BIG]


# -- bad input and concurrency ---------------------------------------------------------------------


async def test_compaction_of_an_empty_session_is_a_clear_error(store):
    agent = make(store, main_model())
    sid = agent.create_session().id
    with pytest.raises(NothingToCompactError, match="no messages"):
        await agent.compact(sid)
    assert store.message_count(sid, include_hidden=True) == 0
    await agent.chat("u1")
    with pytest.raises(NothingToCompactError, match="nothing before"):
        await agent.compact(sid)
    assert store.message_count(sid, include_hidden=True) == 2
    assert not any(r.hidden for r in store.get_path(sid))
    assert agent.compaction_config.summary_model.requests == []


async def test_manual_compaction_is_refused_while_a_run_is_in_flight(store):
    main = ScriptedModel([reply("a1"), reply("a2"), reply("a3"), reply(text("slow"), delay=0.05)])
    agent = make(store, main)
    await three_turns(agent)
    run = agent.start_chat("u4")
    await asyncio.sleep(0.01)
    with pytest.raises(SessionBusyError):
        await agent.compact()
    await run.task


async def test_a_turn_is_refused_while_a_manual_compaction_runs(store):
    agent = make(store, main_model(), summarizer(delay=0.02))
    await three_turns(agent)
    task = asyncio.ensure_future(agent.compact())
    await asyncio.sleep(0.01)
    with pytest.raises(SessionBusyError):
        agent.start_chat("u4")
    await task
    assert (await agent.chat("u4")).status == "completed"


async def test_continuing_without_a_user_message_skips_with_a_note(store, caplog):
    main = ScriptedModel(
        [reply("a1", usage=Usage(input=2_000)), reply("again")],
        context_window=1_000,
        max_output_tokens=100,
    )
    summ = summarizer()
    agent = make(store, main, summ)
    await agent.chat("u1")
    collector = Collector()
    with caplog.at_level(logging.WARNING, logger="thinkray.compaction"):
        result = await agent.chat(None, collector)
    assert result.status == "completed" and summ.requests == []
    [note] = [c for c in collector.events if c["type"] == "data-status"]
    assert note["data"]["state"] == "skipped"


# -- per-session configuration ---------------------------------------------------------------------


async def test_config_per_session_over_store_defaults_over_the_agent_default(store):
    agent = make(store, main_model(), reserve_tokens=5_000)
    s1 = agent.create_session("one").id
    s2 = agent.create_session("two").id
    agent.set_compaction_config(s1, {"tail_turns": 1, "smart_recovery": {"drop_middle": False}})
    assert store.get_session(s1).settings["compaction"] == {
        "tail_turns": 1,
        "smart_recovery": {"drop_middle": False},
    }
    one = agent.get_compaction_config(s1)
    assert one.tail_turns == 1 and one.reserve_tokens == 5_000
    assert one.smart_recovery.drop_middle is False and one.smart_recovery.chunked_summarize is True
    assert one.summary_model is agent.compaction_config.summary_model
    assert agent.get_compaction_config(s2).tail_turns == 2
    if hasattr(store, "get_effective_settings"):  # store-wide defaults, which threads inherit
        from thinkray.storage.types import DEFAULT_SETTINGS_KEY

        store.set_config(DEFAULT_SETTINGS_KEY, {"compaction": {"tail_budget_pct": 0.5}})
        assert agent.get_compaction_config(s2).tail_budget_pct == 0.5
        assert agent.get_compaction_config(s1).tail_budget_pct == 0.5
        assert agent.get_compaction_config(s1).tail_turns == 1
    with pytest.raises(ValidationError):
        agent.set_compaction_config(s2, {"tail_turns": 0})
    assert "compaction" not in store.get_session(s2).settings
    agent.set_compaction_config(s1, None)
    assert agent.get_compaction_config(s1).tail_turns == 2


async def test_session_tail_setting_drives_compaction(store):
    agent = make(store, main_model())
    history = await three_turns(agent)
    agent.set_compaction_config(agent.current_session_id, {"tail_turns": 1})
    result = await agent.compact()
    assert result.tail_start_id == history[-1]["id"] and result.summarized == 5


# -- views and composition ------------------------------------------------------------------------


def test_view_of_a_copied_history_keeps_every_visible_message():
    # A branch copies visible messages under new ids: the tail start is gone, the
    # tail itself is still there (before the synthetic message).
    synthetic = {
        "id": "c",
        "role": "assistant",
        "parts": [{"type": "data-compaction", "data": {"summary": "s", "tail_start_id": "old"}}],
    }
    u = {"id": "u", "role": "user", "parts": [{"type": "text", "text": "u"}]}
    a = {"id": "a", "role": "assistant", "parts": [{"type": "text", "text": "a"}]}
    n = {"id": "n", "role": "user", "parts": [{"type": "text", "text": "n"}]}
    assert [m["id"] for m in compaction_view([u, a, synthetic, n])] == ["c", "u", "a", "n"]
    assert compaction_view([u, a]) == [u, a]


async def test_mixins_compose_with_permissions_and_prompt(store):

    @tool
    def bash(command: str) -> str:
        """Run a command."""
        return f"ran {command}"

    class Full(_Agent):
        manifest_prompt = "You are Full."
        permission_rules = ({"tool": "bash", "action": "ask"},)

        def get_tools(self):
            return {"bash": bash}

    main = ScriptedModel(
        [
            reply("a1"),
            reply("a2", usage=Usage(input=2_000)),
            reply(tool_call("bash", {"command": "ls"}, id="c1")),
            reply("a3"),
        ],
        context_window=1_000,
        max_output_tokens=100,
    )
    summ = summarizer()
    agent = Full(store, model=main)
    agent.compaction_config = CompactionConfig(summary_model=summ)
    await agent.chat("u1")
    await agent.chat("u2")
    collector = Collector()
    run = agent.start_chat("u3", collector)
    for _ in range(400):
        if agent.pending_approvals():
            break
        await asyncio.sleep(0.005)
    [pending] = agent.pending_approvals()
    agent.answer_approval(pending["approval_id"], "once")
    result = await run.task
    assert result.status == "completed" and result.text == "a3"
    types = collector.types()
    assert types[:2] == ["start", "data-status"]
    assert types.index("tool-input-available") < types.index("tool-approval-request")
    assert len(summ.requests) == 1
    first = request_text(main.requests[2])
    assert first[0][1].startswith("[Summary of the earlier conversation]")
    assert [t for _, t in first[1:]] == ["u2", "a2", "u3"]
    assert main.requests[2].system.startswith("# Agent\n\nYou are Full.")
    assert "## bash" in main.requests[2].system
    assert result.message["metadata"]["system_prompt_digest"]
    assert [p["type"] for p in result.message["parts"]] == [
        "step-start",
        "dynamic-tool",
        "step-start",
        "text",
    ]


async def test_a_turn_may_compact_for_itself_before_its_stream_starts(store):
    calls = []

    class SelfCompacting(Agent):
        async def on_user_message(self, session_id, message):
            message = await super().on_user_message(session_id, message)
            if message["parts"][0]["text"] == "u4":
                calls.append(await self.compact(session_id, auto=True))
            return message

    main = main_model()
    agent = SelfCompacting(store, model=main)
    agent.compaction_config = CompactionConfig(summary_model=summarizer())
    await three_turns(agent)
    collector = Collector()
    result = await agent.chat("u4", collector)
    assert result.status == "completed" and calls[0] is not None
    assert [t for _, t in request_text(main.requests[-1])][1:] == ["u3", "a3", "u4"]
    assert any(c["type"] == "data-status" for c in collector.events)
    # auto=True is best effort: nothing to compact is None, not an error.
    fresh = agent.create_session().id
    assert await agent.compact(fresh, auto=True) is None


async def test_switching_to_a_smaller_model_compacts_first(store):
    if not hasattr(Think, "resolve_model"):
        pytest.skip("no per-turn model selection in Think")
    small = ScriptedModel(
        [reply("small answer")], model_id="small", context_window=1_000, max_output_tokens=100
    )
    big = ScriptedModel(
        [reply("a1"), reply("a2", usage=Usage(input=5_000))],
        model_id="big",
        context_window=200_000,
        max_output_tokens=8_192,
    )
    summ = summarizer()

    class Switching(Agent):
        models = {"small": small}

    agent = Switching(store, model=big)
    agent.compaction_config = CompactionConfig(summary_model=summ)
    await agent.chat("u1")
    await agent.chat("u2")
    assert not agent.needs_compaction()  # fine for the big model
    message = {
        "id": "msg-switch",
        "role": "user",
        "metadata": {"provider_id": "test", "model_id": "small"},
        "parts": [{"type": "text", "text": "u3"}],
    }
    result = await agent.chat(message)
    assert result.status == "completed" and result.text == "small answer"
    assert len(summ.requests) == 1 and len(agent.list_compactions()) == 1
    assert request_text(small.requests[0])[0][1].startswith("[Summary of the earlier conversation]")
