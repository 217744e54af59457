"""Defects issue 26, items 3 and 15, through real handles: a handle whose actor was
SIGKILLed reaches the woken agent for its next state-changing call, and the busy error
caught through a handle is thinkray's own, with its own sentence."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from thinkray.actors.errors import CallInterruptedError
from thinkray.runtime.errors import ApprovalNotFoundError, SessionBusyError, UnknownToolCallError

from tests.agents import SessionAgent
from tests.helpers import kill_agent_process, wait_until

pytestmark = pytest.mark.ray


def _dead_or_replaced(ns: Any, name: str, pid: int) -> bool:
    import ray

    live = ns.where(name)
    if live is None or live["pid"] != pid:
        return True
    try:
        state = ray.util.state.get_actor(live["actor_id"])
    except Exception:
        return True
    return state is None or state.state == "DEAD"


# -- item 3: after an interrupted call, the handle resolves the name again ---------------


def test_a_worker_loop_recovers_through_its_handle_after_the_actor_is_killed(namespace_factory):
    ns = namespace_factory(idle_timeout=None)
    agent = ns.get("tools")
    assert agent.claim_tool_calls.remote(["weather"], "worker-1").result() == []
    pid = kill_agent_process(ns, "tools")
    wait_until(lambda: _dead_or_replaced(ns, "tools", pid), timeout=30)
    # The call that met the dead actor cannot know whether it ran: it says so, once.
    with pytest.raises(CallInterruptedError):
        agent.submit_tool_result.remote("call-1", "worker-1", result="sunny").result()
    # "Submit again": the same handle now reaches the woken agent, which answers.
    with pytest.raises(UnknownToolCallError):
        agent.submit_tool_result.remote("call-1", "worker-1", result="sunny").result()
    assert agent.claim_tool_calls.remote(["weather"], "worker-1").result() == []
    assert ns.where("tools")["pid"] != pid


def test_an_approver_recovers_through_its_handle_after_the_actor_is_killed(namespace_factory):
    ns = namespace_factory(SessionAgent, idle_timeout=None)
    agent = ns.get("approver")
    assert agent.pending_approvals.remote().result() == []
    pid = kill_agent_process(ns, "approver")
    wait_until(lambda: _dead_or_replaced(ns, "approver", pid), timeout=30)

    async def answer_twice() -> list[BaseException]:
        seen: list[BaseException] = []
        for _ in range(2):
            try:
                await agent.answer_approval.remote("appr-1", "once", "alice")
            except Exception as exc:  # the test inspects each
                seen.append(exc)
        return seen

    first, second = asyncio.run(answer_twice())
    assert isinstance(first, CallInterruptedError)
    assert isinstance(second, ApprovalNotFoundError), repr(second)  # the agent's answer


# -- item 15: the busy error through a handle is thinkray's own ---------------------------


def test_a_second_turn_on_a_busy_session_raises_thinkrays_busy_error(namespace_factory):
    ns = namespace_factory(agent_kwargs={"chunks": 400, "delay": 0.05}, idle_timeout=None)
    agent = ns.get("busy")
    sid = agent.create_session.remote("chat").result().id
    running = agent.stream_chat.remote("a long answer", session_id=sid)  # opened: busy
    try:
        with pytest.raises(SessionBusyError) as caught:
            agent.chat.remote("and another", session_id=sid).result()
        error = caught.value
        assert type(error) is SessionBusyError
        assert str(error) == (
            f"session {sid!r} already has a run in flight ({running.run_id}); "
            "wait for it to finish or abort it"
        )
        assert error.session_id == sid and error.run_id == running.run_id

        async def from_async_code() -> tuple[BaseException, BaseException]:
            with pytest.raises(SessionBusyError) as awaited:
                await agent.chat.remote("once more", session_id=sid)
            with pytest.raises(SessionBusyError) as streamed:
                await agent.stream_chat.remote("and streamed", session_id=sid).start()
            return awaited.value, streamed.value

        for caught_async in asyncio.run(from_async_code()):
            assert type(caught_async) is SessionBusyError
            assert str(caught_async) == str(error)  # the sentence, no remote traceback
    finally:
        running.abort()


# -- item 10 through a handle: waking an agent whose file is corrupt -----------------------


def test_waking_an_agent_with_a_corrupt_file_names_the_agent_and_the_file(namespace_factory):
    from pathlib import Path

    from thinkray.storage.errors import CorruptDatabaseError

    ns = namespace_factory(idle_timeout=None)
    path = Path(ns.storage_root) / ns.name / "mangled.duckdb"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"restored from the wrong backup " * 400)
    with pytest.raises(CorruptDatabaseError) as caught:
        ns.get("mangled").get_history.remote().result(timeout_s=300)
    error = caught.value
    assert type(error) is CorruptDatabaseError  # thinkray's own, not Ray's wrapper
    assert (error.agent, error.namespace) == ("mangled", ns.name)
    assert str(error).startswith(f"agent {ns.name}/mangled: its file {str(path)!r} is corrupt")
    assert path.read_bytes().startswith(b"restored from the wrong backup")
