"""One trace across actors (issue 14, "Done when"): a user's request span in the driver,
the orchestrator's turn in its actor, two delegations whose sub-agents run in their own
actors and call a workspace tool that goes through the bridge actor — every span in one
tree, parents right, GenAI attributes set. Real OpenTelemetry SDK in every process
(tests/otel_support.py installs it through THINKRAY_OTEL_SETUP); the driver's spans go
to the SDK's in-memory exporter."""

from __future__ import annotations

import pytest

from tests.helpers import wait_until
from tests.otel_support import SPANS_ENV, in_memory_spans, read_spans

pytestmark = pytest.mark.ray


def script(*steps, model_id="scripted"):
    return {"provider": "script", "steps": [list(s) for s in steps], "model_id": model_id}


def writes(path: str, text: str):
    return script(
        [{"tool": "shared_write_file", "input": {"path": path, "content": "x"}}],
        [{"text": text}],
        model_id="sub-model",
    )


@pytest.fixture
def driver_spans():
    with in_memory_spans() as spans:
        yield spans


def test_an_orchestrator_turn_is_one_trace_across_its_sub_agents(
    namespace_factory, tmp_path, driver_spans
):
    from thinkray.actors.namespace import AgentNamespace
    from thinkray.actors.orchestrator import Orchestrator

    provider, exporter = driver_spans
    folder = tmp_path / "spans"
    env = {"THINKRAY_OTEL_SETUP": "tests.otel_support:install", SPANS_ENV: str(folder)}
    # The orchestrator's actors get the environment; the actors it creates (its
    # sub-agents' directory and actors, the bridge) inherit it from its process.
    ns = namespace_factory(
        Orchestrator,
        pool_size=1,
        warm_up=True,  # the warm-up turn runs, to check below that it is not traced
        idle_timeout=None,
        actor_options={"runtime_env": {"env_vars": env}},
    )
    boss = ns.get("boss")
    try:
        boss.create_subagent.remote("writer", {"model": writes("a.md", "wrote a")}).result()
        boss.create_subagent.remote("editor", {"model": writes("b.md", "wrote b")}).result()
        both = [
            {"tool": "delegate_task", "input": {"agent": "writer", "task": "write a"}},
            {"tool": "delegate_task", "input": {"agent": "editor", "task": "write b"}},
        ]
        boss.configure.remote(
            {"model": script(both, [{"text": "both done"}], model_id="boss-model")}
        ).result()

        assert ns.hibernate("boss")  # so the request below wakes it
        with provider.get_tracer("test").start_as_current_span("user request") as request:
            result = boss.chat.remote("get both written").result()
        assert result.status == "completed"
        trace_id = f"0x{request.get_span_context().trace_id:032x}"
        request_id = f"0x{request.get_span_context().span_id:016x}"
        assert [s.name for s in exporter.get_finished_spans()] == ["user request"]

        def spans_so_far():
            got = [s for s in read_spans(folder) if s["context"]["trace_id"] == trace_id]
            names = [s["name"] for s in got]
            ready = names.count("thinkray.bridge") >= 2 and "invoke_agent boss" in names
            return got if ready else None

        try:
            spans = wait_until(spans_so_far, timeout=30)
        except AssertionError:
            got = [(s["pid"], s["name"], s["status"]) for s in read_spans(folder)]
            raise AssertionError(f"spans of the trace missing; all spans: {got}") from None
    finally:
        with_subs = AgentNamespace.connect(f"{ns.name}.boss.subs")
        with_subs.shutdown()

    by_id = {s["context"]["span_id"]: s for s in spans}

    def children(span, name=None):
        return [
            s
            for s in spans
            if s["parent_id"] == span["context"]["span_id"] and (name is None or s["name"] == name)
        ]

    def one(name, **attrs):
        found = [
            s
            for s in spans
            if s["name"] == name and all(s["attributes"].get(k) == v for k, v in attrs.items())
        ]
        assert len(found) == 1, (name, attrs, [s["name"] for s in spans])
        return found[0]

    # the handle carried the driver's context: the orchestrator's turn continues it
    boss_turn = one("invoke_agent boss")
    assert boss_turn["parent_id"] == request_id
    assert boss_turn["attributes"]["gen_ai.conversation.id"] == result.session_id
    assert boss_turn["attributes"]["gen_ai.agent.name"] == "boss"
    assert boss_turn["attributes"]["thinkray.run.status"] == "completed"

    chats = children(boss_turn, "chat boss-model")
    assert len(chats) == 2
    assert {c["kind"] for c in chats} == {"SpanKind.CLIENT"}
    calls = children(boss_turn, "execute_tool delegate_task")
    assert len(calls) == 2

    sub_turns = {}
    for call in calls:
        (delegation,) = children(call, "thinkray.delegate")
        sub = delegation["attributes"]["gen_ai.agent.name"]
        (sub_turn,) = children(delegation, f"invoke_agent {sub}")
        # a different process: the sub-agent's actor
        assert sub_turn["pid"] != boss_turn["pid"]
        sub_turns[sub] = sub_turn
        assert len(children(sub_turn, "chat sub-model")) == 2
        (write,) = children(sub_turn, "execute_tool shared_write_file")
        assert write["attributes"]["gen_ai.tool.call.id"]
        (bridge,) = children(write, "thinkray.bridge")
        assert bridge["attributes"]["thinkray.bridge.operation"] == "write_file"
        assert bridge["pid"] not in (boss_turn["pid"], sub_turn["pid"])
    assert sorted(sub_turns) == ["editor", "writer"]
    assert sub_turns["writer"]["pid"] != sub_turns["editor"]["pid"]
    assert (
        sub_turns["writer"]["attributes"]["gen_ai.conversation.id"]
        != sub_turns["editor"]["attributes"]["gen_ai.conversation.id"]
    )

    # nothing dangles: every span's parent is in the trace, or is the driver's span
    for span in spans:
        assert span["parent_id"] in by_id or span["parent_id"] == request_id, span["name"]
    # a pooled actor's warm-up turn is neither traced nor counted
    assert not [s for s in read_spans(folder) if "warm-up" in s["name"]]
    # the wake the request caused is in its trace, in the actor that woke
    wake = one("thinkray.wake", **{"gen_ai.agent.name": "boss"})
    assert wake["parent_id"] == request_id and wake["pid"] == boss_turn["pid"]
