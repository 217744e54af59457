"""The typed remote API: only @remote methods cross the actor boundary, through one
response type that async code awaits and sync code ``.result()``s."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from thinkray.actors.errors import RemoteCallError, SyncInEventLoopError
from thinkray.runtime.agents.think import Think
from thinkray.runtime.remote import remote, remote_methods

from tests.typing.mypy_farm import mypy_farm

REPO = Path(__file__).resolve().parent.parent


# -- the registry, without Ray -----------------------------------------------------------


class Base(Think):
    @remote
    def visible(self, x: int) -> int:
        return x

    def hidden(self) -> int:
        return 1


class Child(Base):
    def visible(self, x: int) -> int:  # a plain override stays remote
        return x * 2

    @remote
    async def stream(self, n: int):
        for i in range(n):
            yield i


def test_remote_methods_are_what_is_marked_and_overrides_stay_remote():
    methods = remote_methods(Child)
    assert {"visible", "stream", "chat", "branch"} <= set(methods)
    assert "hidden" not in methods and "close" not in methods
    assert "persist_message" not in methods and "store" not in methods
    assert methods["stream"].kind == "stream" and methods["visible"].kind == "call"
    assert Child().visible(2) == 4  # inside the actor, an ordinary method


def test_remote_on_the_class_only_types_the_call():
    with pytest.raises(TypeError, match=r"handle\.branch\.remote"):
        Think.branch.remote("s", "m")


def test_remote_refuses_what_is_not_a_function():
    with pytest.raises(TypeError, match="decorates a function"):
        remote(42)  # type: ignore[call-overload]


def test_handle_typing_is_checked_by_mypy():
    # mypy follows handles.py into thinkray, Ray, pydantic...: most of its time. It
    # runs with .ci/typecheck's options, link tree and cache, so after CI's type check
    # (or a second run) only the sample is checked.
    farm = mypy_farm(REPO)
    sample = REPO / "tests" / "typing" / "handles.py"
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
         str(sample)],
        capture_output=True, text=True, env=dict(os.environ, MYPYPATH=str(farm)), cwd=farm,
    )  # fmt: skip
    reported = {
        (int(m.group(1)), m.group(2))
        for m in re.finditer(r"handles\.py:(\d+): error: .*\[([a-z-]+)\]", run.stdout)
    }
    expected = {
        (number, m.group(1))
        for number, line in enumerate(sample.read_text().splitlines(), 1)
        if (m := re.search(r"# E: ([a-z-]+)", line))
    }
    assert reported == expected, run.stdout


# -- through the actor --------------------------------------------------------------------


def test_a_method_that_is_not_remote_is_refused_naming_what_is_allowed(shared_namespace):
    ns = shared_namespace
    agent = ns.get("guarded")
    agent.chat.remote("hello").result()
    for name in ("close", "persist_message", "store", "finalize_orphaned_tool_calls"):
        with pytest.raises(RemoteCallError, match="not remote-callable") as info:
            getattr(agent, name)
        assert "get_history" in str(info.value) and "chat" in info.value.allowed
    # The actor enforces it too, for handles that do not know the agent's class.
    from thinkray.actors.namespace import AgentHandle

    blind = AgentHandle(ns.name, "guarded", ns.directory, True, None)
    with pytest.raises(RemoteCallError, match="not a remote method") as info:
        blind.close.remote().result()
    assert "chat" in str(info.value)
    with pytest.raises(RemoteCallError, match="not a remote method"):
        blind.persist_message.remote("s", {"role": "user", "parts": []}).result()
    # Nothing changed: the agent is alive and its history intact.
    assert len(agent.get_history.remote().result()) == 2
    assert agent.chat.remote("again").result().status == "completed"


def test_arguments_that_do_not_fit_are_refused_before_anything_runs(shared_namespace):
    ns = shared_namespace
    agent = ns.get("strict")
    with pytest.raises(RemoteCallError, match=r"rename_session\(session_id: str, name: str\)"):
        agent.rename_session.remote("only-one-argument")
    with pytest.raises(RemoteCallError, match="unexpected keyword"):
        agent.get_history.remote(colour="blue")
    with pytest.raises(RemoteCallError, match=r"branch\(parent_session_id: str, from_message_id"):
        agent.branch.remote()
    # A turn's arguments are checked as the handle keys it (one bind for both).
    with pytest.raises(RemoteCallError, match=r"chat\(message.*unexpected keyword"):
        agent.chat.remote("hi", colour="blue")
    with pytest.raises(RemoteCallError, match=r"stream_chat\(message.*too many"):
        agent.stream_chat.remote("hi", None, "extra", "args", "beyond", "any")
    assert ns.where("strict") is None  # nothing was sent: the agent never woke


def test_result_and_await_both_work_and_result_refuses_inside_a_loop(shared_namespace):
    ns = shared_namespace
    agent = ns.get("both")
    info = agent.create_session.remote("one").result(timeout_s=30)
    assert info.name == "one"

    async def inside() -> tuple[int, str]:
        response = agent.message_count.remote(info.id)
        with pytest.raises(SyncInEventLoopError, match="await"):
            response.result()
        count = await response
        result = await agent.chat.remote("hi", session_id=info.id)
        return count, result.text

    count, text = asyncio.run(inside())
    assert count == 0 and text.startswith("chunk0")
    status = agent.get_status.remote(info.id).result()
    assert status.state == "idle"  # a typed SessionStatus, not a dict


def test_a_remote_error_keeps_its_type(shared_namespace):
    from thinkray.storage.types import SessionNotFoundError

    agent = shared_namespace.get("errs")
    with pytest.raises(SessionNotFoundError):
        agent.get_history.remote("no-such-session").result()


def test_streams_iterate_with_for_and_async_for(namespace_factory):
    ns = namespace_factory(agent_kwargs={"chunks": 50})
    agent = ns.get("streams")
    stream = agent.stream_chat.remote("go")
    assert stream.run_id and stream.receiver is not None  # known before iterating
    sync_chunks = list(stream)
    assert sync_chunks[-1]["type"] == "finish"

    async def follow() -> list[dict]:
        stream = agent.resume.remote()
        return [chunk async for chunk in stream]

    assert asyncio.run(follow()) == sync_chunks  # the same run, replayed from index 0

    async def loop_guard() -> None:
        with pytest.raises(SyncInEventLoopError, match="async for"):
            iter(agent.resume.remote())

    asyncio.run(loop_guard())


def test_a_stream_method_delivers_items_one_by_one(namespace_factory):
    from tests.agents import Counter

    agent = namespace_factory(Counter).get("counter")
    assert list(agent.count.remote(3)) == [0, 1, 2, 3, 4]
