"""Orchestrator and sub-agents (issue 4) with real actors: registry, delegation with
live buffered relay, the shared workspace through a bridge actor, abort down the tree,
code execution and extensions inside sub-agents."""

from __future__ import annotations

import contextlib
import itertools
import time
from pathlib import Path

import pytest

from tests.helpers import wait_until

pytestmark = pytest.mark.ray


def script(*steps, delay=0.0):
    return {"provider": "script", "steps": [list(s) for s in steps], "delay": delay}


def tool_parts(message):
    return [p for p in message["parts"] if p["type"] == "dynamic-tool"]


_BOSSES = itertools.count()


@pytest.fixture(scope="module")
def orchestrators(module_namespace_factory):
    """The module's namespace of orchestrators: each test has one of its own name."""
    from tests.orchestrator_agents import LeanOrchestrator

    return module_namespace_factory(LeanOrchestrator, idle_timeout=None)


@pytest.fixture
def orchestrator(orchestrators, ray_local):
    """``(namespace, handle)`` of an orchestrator of this test's own (its registry,
    sub-agents, workspace and bridge start empty). At the test's end its sub-agents'
    namespace and bridge stop and it hibernates, which gives its actor to the next
    test's orchestrator."""
    from thinkray.actors.bridge import bridge_name
    from thinkray.actors.namespace import AgentNamespace

    ns = orchestrators
    name = f"boss{next(_BOSSES)}"
    yield ns, ns.get(name)
    with contextlib.suppress(Exception):
        AgentNamespace.connect(f"{ns.name}.{name}.subs").shutdown()
    with contextlib.suppress(Exception):
        ns.hibernate(name, force=True)
    with contextlib.suppress(Exception):
        bridge = ray_local.get_actor(bridge_name(ns.name, name), namespace="thinkray")
        ray_local.get(bridge.close.remote(), timeout=30)
        ray_local.kill(bridge, no_restart=True)


WRITE_PLAN = script(
    [{"tool": "shared_write_file", "input": {"path": "notes/plan.md", "content": "one\ntwo\n"}}],
    [{"text": "I wrote the plan."}],
)
READ_PLAN = script(
    [{"tool": "shared_wait_for_file", "input": {"path": "notes/plan.md"}}],
    [{"tool": "shared_read_file", "input": {"path": "notes/plan.md"}}],
    [{"text": "The plan has two steps."}],
)


def test_registry_persists_and_configures(orchestrator):
    ns, boss = orchestrator
    created = boss.create_subagent.remote("writer", {"model": WRITE_PLAN}).result()
    assert created.status == "idle" and created.access == "read-write"
    assert "token" not in str(created.config)  # grants are never handed out
    boss.configure_subagent.remote("writer", {"instructions": "be terse"}).result()
    assert ns.hibernate(boss.name)  # the registry lives in the orchestrator's file
    listed = boss.list_subagents.remote().result()
    assert [r.name for r in listed] == ["writer"]
    assert listed[0].config["instructions"] == "be terse"
    from thinkray.storage.types import InvalidInputError

    with pytest.raises(InvalidInputError):
        boss.create_subagent.remote("writer", {}).result()
    boss.delete_subagent.remote("writer").result()
    assert boss.list_subagents.remote().result() == []


def test_blocking_and_fire_and_forget_delegation_share_a_workspace(orchestrator):
    _, boss = orchestrator
    boss.create_subagent.remote("writer", {"model": WRITE_PLAN}).result()
    boss.create_subagent.remote("reader", {"model": READ_PLAN}, access="read").result()
    pending = boss.delegate.remote("reader", "read the plan", wait=False).result()
    # returned while the reader waits for a file that only the writer's turn below makes
    assert pending.status == "running"
    done = boss.delegate.remote("writer", "write the plan", wait=True).result()
    assert done.status == "completed" and done.text == "I wrote the plan."
    assert done.message["role"] == "assistant"
    read = boss.wait_task.remote(pending.task_id, 20).result()
    assert read.status == "completed" and read.text == "The plan has two steps."
    records = {r.name: r for r in boss.list_subagents.remote().result()}
    assert records["reader"].last_task == "read the plan"
    assert records["reader"].message_count == 2 and records["reader"].status == "idle"


def test_viewer_attaches_mid_turn_and_gets_buffer_then_tail(orchestrator):
    _, boss = orchestrator
    slow = script([{"text": " ".join(f"w{i}" for i in range(60))}], delay=0.02)
    boss.create_subagent.remote("talker", {"model": slow}).result()
    task = boss.delegate.remote("talker", "talk", wait=False).result()
    time.sleep(0.4)  # mid-turn
    first_view = boss.view_task.remote(task.task_id)
    early = [next(first_view) for _ in range(3)]
    del first_view  # a viewer detaches: the task goes on
    view = list(boss.view_task.remote(task.task_id))
    assert view[:3] == early and view[0]["type"] == "start"
    deltas = [c["delta"].strip() for c in view if c["type"] == "text-delta"]
    assert deltas == [f"w{i}" for i in range(60)]  # replay + tail: complete, in order
    assert boss.task_status.remote(task.task_id).result().status == "completed"
    # any caller can view a sub-agent's stream through the orchestrator
    routed = list(boss.view_subagent.remote("talker"))
    assert routed == view


def test_bridge_enforces_access_and_path_safety(orchestrator):
    _, boss = orchestrator
    scribbler = script(
        [{"tool": "shared_write_file", "input": {"path": "x.txt", "content": "no"}}],
        [{"tool": "shared_write_file", "input": {"path": "../escape.txt", "content": "no"}}],
        [{"text": "tried"}],
    )
    boss.create_subagent.remote("ro", {"model": scribbler}, access="read").result()
    boss.create_subagent.remote("rw", {"model": scribbler}, access="read-write").result()
    boss.create_subagent.remote(
        "blind", {"model": script([{"text": "ok"}])}, access="none"
    ).result()
    ro = boss.delegate.remote("ro", "write", wait=True).result()
    parts = tool_parts(ro.message)
    assert all(p["state"] == "output-error" for p in parts)
    assert "unknown tool" in parts[0]["errorText"]  # read access: no write tool at all
    rw = boss.delegate.remote("rw", "write", wait=True).result()
    first, second = tool_parts(rw.message)
    assert first["state"] == "output-available"
    assert second["state"] == "output-error" and ".." in second["errorText"]
    blind_tools = boss.delegate.remote("blind", "hi", wait=True).result()
    assert blind_tools.status == "completed"


def test_forged_and_revoked_grants_are_refused(orchestrator, ray_local):
    from thinkray.actors.bridge import BridgeAccessError, BridgeClient, bridge_name

    ns, boss = orchestrator
    boss.create_subagent.remote("w", {"model": WRITE_PLAN}).result()
    boss.delegate.remote("w", "write", wait=True).result()
    name = bridge_name(ns.name, boss.name)
    forged = BridgeClient(name, "not-a-token", "read-write")
    with pytest.raises(BridgeAccessError):
        ray_local.get(forged.read_file("notes/plan.md"))
    boss.set_access.remote("w", "read").result()
    actor = ray_local.get_actor(name, namespace="thinkray")
    assert ray_local.get(actor.grants.remote())["w"] == "read"


def test_abort_task_reaches_the_sub_agent_tool_call(orchestrator):
    _, boss = orchestrator
    waits = script(
        [{"tool": "shared_wait_for_file", "input": {"path": "never.txt", "timeout": 60}}]
    )
    boss.create_subagent.remote("waiter", {"model": waits}).result()
    task = boss.delegate.remote("waiter", "wait", wait=False).result()
    time.sleep(1.0)
    assert boss.abort_task.remote(task.task_id).result() is True
    status = boss.wait_task.remote(task.task_id, 20).result()
    assert status.status == "aborted"
    from thinkray.actors.namespace import AgentNamespace

    sub = AgentNamespace.connect(f"{boss.namespace}.{boss.name}.subs").existing("waiter")
    part = tool_parts(sub.get_history.remote().result()[-1])[0]
    assert part["state"] == "output-error" and "aborted by parent" in part["errorText"]


def test_aborting_the_parent_turn_aborts_sub_agent_turns(orchestrator):
    ns, boss = orchestrator
    waits = script(
        [{"tool": "shared_wait_for_file", "input": {"path": "never.txt", "timeout": 60}}]
    )
    boss.create_subagent.remote("deep", {"model": waits}).result()
    boss.configure.remote(
        {"model": script([{"tool": "delegate_task", "input": {"agent": "deep", "task": "wait"}}])}
    ).result()
    run = boss.stream_chat.remote("delegate it")
    wait_until(lambda: any(t.status == "running" for t in boss.list_tasks.remote().result()))
    time.sleep(0.3)
    assert run.receiver.abort("user pressed stop")
    tasks = wait_until(
        lambda: [t for t in boss.list_tasks.remote().result() if t.status == "aborted"],
        timeout=20,
    )
    assert tasks[0].agent == "deep"
    parent_part = tool_parts(boss.get_history.remote().result()[-1])[0]
    assert parent_part["state"] == "output-error"


def test_unknown_sub_agent_is_a_clear_error(orchestrator):
    from thinkray.storage.registry import SubAgentNotFoundError

    _, boss = orchestrator
    with pytest.raises(SubAgentNotFoundError, match="unknown sub-agent 'ghost'"):
        boss.delegate.remote("ghost", "anything").result()


def test_code_execution_in_sub_agent_stays_healthy(orchestrator):
    _, boss = orchestrator
    code = "workspace.write_file('out.txt', 'computed ' + str(6 * 7))\n6 * 7"
    runs = script(
        [{"tool": "execute", "input": {"code": code}}],
        [{"tool": "execute", "input": {"code": "while True:\n    pass"}}],
        [{"tool": "read_file", "input": {"path": "out.txt"}}],
        [{"text": "done"}],
    )
    boss.create_subagent.remote(
        "coder", {"model": runs, "code_execution": True, "code_timeout": 1.5}
    ).result()
    result = boss.delegate.remote("coder", "compute", wait=True).result()
    ok, looped, read = tool_parts(result.message)
    assert ok["state"] == "output-available" and "42" in str(ok["output"])
    assert looped["state"] == "output-error" and "timed out" in looped["errorText"]
    assert "computed 42" in str(read["output"])
    assert result.status == "completed"  # the actor stayed healthy


EXTENSION = """
manifest = {"name": "calc", "description": "arithmetic",
            "permissions": {"network": False, "workspace": "none"}}

@extension_tool(description="Multiply two integers")
def mul(a: int, b: int) -> int:
    return a * b
"""


def test_extension_written_on_one_turn_is_a_tool_on_the_next_and_survives_hibernation(
    orchestrator,
):
    from thinkray.actors.namespace import AgentNamespace

    _, boss = orchestrator
    steps = script(
        [{"tool": "load_extension", "input": {"source": EXTENSION}}],
        [{"text": "loaded"}],
    )
    boss.create_subagent.remote("ext", {"model": steps, "extensions": True}).result()
    first = boss.delegate.remote("ext", "load it", wait=True).result()
    assert tool_parts(first.message)[0]["state"] == "output-available"
    subs = AgentNamespace.connect(f"{boss.namespace}.{boss.name}.subs")
    assert subs.hibernate("ext")
    use = script([{"tool": "calc__mul", "input": {"a": 6, "b": 7}}], [{"text": "42"}])
    boss.configure_subagent.remote("ext", {"model": use}).result()
    second = boss.delegate.remote("ext", "use it", wait=True).result()
    part = tool_parts(second.message)[0]
    assert part["state"] == "output-available" and "42" in str(part["output"])
    assert (Path(subs.storage_root) / subs.name / "ext.duckdb").exists()


def test_sub_agent_without_a_model_is_a_clear_user_error(orchestrator):
    from thinkray.runtime.errors import ModelNotConfiguredError, UserError

    _, boss = orchestrator
    with pytest.raises(ModelNotConfiguredError, match="sub-agent 'blank' has no model") as caught:
        boss.create_subagent.remote("blank", {"instructions": "help"}).result()
    assert isinstance(caught.value, UserError)
    assert boss.list_subagents.remote().result() == []  # nothing was registered
    # configuring it away later is refused too, and changes nothing
    boss.create_subagent.remote("writer", {"model": WRITE_PLAN}).result()
    with pytest.raises(ModelNotConfiguredError):
        boss.configure_subagent.remote("writer", {"model": None}).result()
    assert boss.get_subagent.remote("writer").result().config["model"] == WRITE_PLAN


def test_a_sub_agent_without_its_own_model_uses_the_orchestrators(orchestrator):
    _, boss = orchestrator
    boss.configure.remote({"model": WRITE_PLAN}).result()
    record = boss.create_subagent.remote("heir", {"instructions": "write"}).result()
    assert record.config["model"] == WRITE_PLAN
    done = boss.delegate.remote("heir", "write the plan").result()
    assert done.status == "completed" and done.text == "I wrote the plan."


def test_build_model_never_falls_back_to_a_demo_model():
    from thinkray.actors.orchestrator import build_model
    from thinkray.runtime.errors import ModelNotConfiguredError, UnknownModelError
    from thinkray.runtime.models.testing import ScriptedModel

    with pytest.raises(ModelNotConfiguredError):
        build_model(None)
    with pytest.raises(ModelNotConfiguredError):
        build_model({})
    with pytest.raises(UnknownModelError, match="'openai'"):
        build_model({"provider": "openai"})
    given = ScriptedModel([])
    assert build_model({}, given) is given
    assert build_model({"provider": "script", "steps": [[{"text": "hi"}]]}) is not given


# -- issue 9 item 19: one bridge per (namespace, owner) -------------------------------------


def test_bridge_names_cannot_collide():
    from thinkray.actors.bridge import bridge_name
    from thinkray.storage.types import InvalidInputError

    # Joined with "-" (which names may contain) these were one name, one bridge.
    assert bridge_name("a-b", "c") != bridge_name("a", "b-c")
    assert bridge_name("a.b", "c") != bridge_name("a", "b.c")
    assert bridge_name("a_b", "c") != bridge_name("a", "b_c")
    for namespace, owner in (("a:b", "c"), ("a", "b:c"), ("", "c"), ("a", "../c")):
        with pytest.raises(InvalidInputError):
            bridge_name(namespace, owner)


def test_orchestrators_whose_names_used_to_collide_keep_their_workspaces_apart(
    namespace_factory, ray_local
):
    """Namespace ``<x>-b`` with orchestrator ``c`` and namespace ``<x>`` with orchestrator
    ``b-c``: each reads only its own shared workspace."""
    import uuid

    from thinkray.actors.namespace import AgentNamespace

    from tests.orchestrator_agents import LeanOrchestrator

    x = f"x{uuid.uuid4().hex[:8]}"
    first = namespace_factory(LeanOrchestrator, name=f"{x}-b", idle_timeout=None)
    second = namespace_factory(LeanOrchestrator, name=x, idle_timeout=None)
    try:
        mine = first.get("c").shared_workspace.remote().result()
        theirs = second.get("b-c").shared_workspace.remote().result()
        ray_local.get(mine.write_file("secret.txt", "for c only"))
        assert ray_local.get(mine.exists("secret.txt"))
        assert not ray_local.get(theirs.exists("secret.txt"))
        assert ray_local.get(theirs.list_directory("")) == []
    finally:
        for ns, owner in ((first, "c"), (second, "b-c")):
            with contextlib.suppress(Exception):
                ray_local.kill(ray_local.get_actor(bridge_name_of(ns, owner), namespace="thinkray"))
            with contextlib.suppress(Exception):
                AgentNamespace.connect(f"{ns.name}.{owner}.subs").shutdown()


def bridge_name_of(ns, owner):
    from thinkray.actors.bridge import bridge_name

    return bridge_name(ns.name, owner)
