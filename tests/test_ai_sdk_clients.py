"""Real AI SDK clients read thinkray's streams (issue 9, item 10).

Needs ``node`` (>= 20) and ``npm``: once per test session, ``npm install ai@<major>`` for
each major in :data:`AI_SDK_MAJORS` into ``tests/.npm-cache/ai<major>`` (git-ignored,
reused by later sessions; delete it to pick up newer releases). An unreachable registry
fails these tests, it does not skip them.

Each scenario is a real turn of an in-process :class:`Think` on the shipped test models
(text, reasoning, a dynamic tool call and its output, tool errors, an error and aborts
mid-stream, a refused call). Its chunks go through :func:`to_sse`, as over HTTP, into
``tests/ai_sdk_client.mjs``, which hands them to the installed ``ai`` package: a ``Chat``
(what ``useChat`` wraps) over ``DefaultChatTransport``, and ``readUIMessageStream``. The
message each client ends with must be the message thinkray stored: same parts (text,
reasoning and its ids, tool states, inputs, outputs and errors), same id, same metadata
(which the ``finish`` chunk, or a ``message-metadata`` chunk before ``abort``/``error``,
carries).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from thinkray.runtime import Think, tool
from thinkray.runtime.chunks import SSE_DONE, to_sse
from thinkray.runtime.models.base import ToolInputDelta, ToolInputStart
from thinkray.runtime.models.testing import (
    FunctionModel,
    ScriptedModel,
    fail,
    pause,
    reasoning,
    reply,
    text,
    tool_call,
)
from thinkray.runtime.turn.loop import ToolDenial
from thinkray.storage.session_store import DuckDBSessionStore

from tests.conftest import Collector

pytestmark = pytest.mark.node

AI_SDK_MAJORS = (5, 6, 7)
"""The ``ai`` majors the stream is tested against (the README names the same)."""

ROOT = Path(__file__).resolve().parent.parent
NPM_CACHE = Path(__file__).resolve().parent / ".npm-cache"
CLIENT = Path(__file__).resolve().parent / "ai_sdk_client.mjs"
NPM_TIMEOUT = 300
NODE_TIMEOUT = 60


# -- the clients: npm install once per session ----------------------------------------------


def _installed_version(project: Path) -> str | None:
    try:
        return json.loads((project / "node_modules" / "ai" / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


def _install(major: int) -> Path:
    """``tests/.npm-cache/ai<major>`` with ``ai@<major>`` installed and the client script."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail(
            "these tests run the real `ai` npm package: install node (>= 20) and npm "
            f"(found node={node!r}, npm={npm!r})"
        )
    project = NPM_CACHE / f"ai{major}"
    project.mkdir(parents=True, exist_ok=True)
    with open(NPM_CACHE / f"ai{major}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two sessions at once install once
        version = _installed_version(project)
        if version is None or not version.startswith(f"{major}."):
            (project / "package.json").write_text(
                json.dumps({"name": f"thinkray-ai{major}-client", "private": True}) + "\n"
            )
            started = time.monotonic()
            try:
                proc = subprocess.run(
                    [npm, "install", "--no-audit", "--no-fund", "--loglevel=error", f"ai@{major}"],
                    cwd=project,
                    capture_output=True,
                    text=True,
                    timeout=NPM_TIMEOUT,
                )
            except subprocess.TimeoutExpired:
                pytest.fail(
                    f"`npm install ai@{major}` took over {NPM_TIMEOUT} s in {project}: is the "
                    "npm registry reachable from here?"
                )
            version = _installed_version(project)
            if proc.returncode != 0 or version is None:
                pytest.fail(
                    f"`npm install ai@{major}` failed (exit {proc.returncode}) in {project}: "
                    "these tests need the npm registry (or that folder already installed). "
                    f"npm said:\n{proc.stderr[-2000:]}"
                )
            print(f"npm install ai@{major} -> {version} in {time.monotonic() - started:.1f} s")
        # The script sits next to its node_modules, so `import 'ai'` is this major.
        tmp = project / "client.mjs.tmp"
        shutil.copyfile(CLIENT, tmp)
        os.replace(tmp, project / "client.mjs")
    return project


@pytest.fixture(scope="session")
def ai_clients() -> dict[int, Path]:
    return {major: _install(major) for major in AI_SDK_MAJORS}


def read_with_ai(project: Path, body: str) -> dict[str, Any]:
    """What the ``ai`` package in ``project`` makes of the SSE ``body``."""
    proc = subprocess.run(
        [shutil.which("node") or "node", "client.mjs"],
        cwd=project,
        input=body,
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT,
    )
    assert proc.returncode == 0, f"the ai client crashed:\n{proc.stderr[-3000:]}"
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


# -- the turns -----------------------------------------------------------------------------


@tool
async def lookup(city: str) -> dict:
    """Look the weather up."""
    return {"city": city, "celsius": 21}


@tool
async def broken(city: str) -> str:
    """A tool whose service is down."""
    raise RuntimeError("weather service down")


class Refusing(Think):
    async def check_tool_permission(self, tool_name, input, call_id, options=None):
        return ToolDenial("the user said no", by_user=True)


def _stalled_tool_input(request: Any, step: int) -> Any:
    async def events() -> Any:
        yield ToolInputStart(id="call_stall", tool_name="lookup")
        yield ToolInputDelta(id="call_stall", delta='{"city": "Os')
        await asyncio.sleep(30)

    return events()


async def _wait_for(collector: Collector, kind: str, count: int = 1) -> None:
    for _ in range(2000):
        if sum(1 for c in collector.events if c["type"] == kind) >= count:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"no {count} x {kind} in {collector.types()}")


async def _scenario(name: str, store: DuckDBSessionStore) -> tuple[list[dict], dict, str]:
    """Run scenario ``name``; its chunks, the stored assistant message, the run status."""
    collector = Collector()
    tools: dict[str, Any] = {"lookup": lookup, "broken": broken}
    started = asyncio.Event()
    if name == "text":
        agent = Think(store, model=ScriptedModel([reply("Hel", "lo ", "there")]))
    elif name == "reasoning":
        agent = Think(
            store, model=ScriptedModel([reply(reasoning("thin", "king"), text("an", "swer"))])
        )
    elif name == "tool":
        agent = Think(
            store,
            model=ScriptedModel(
                [
                    reply(text("Looking."), tool_call("lookup", {"city": "Oslo"}, id="call_1")),
                    reply("It is ", "21 °C."),
                ]
            ),
        )
    elif name == "tool-errors":
        agent = Think(
            store,
            model=ScriptedModel(
                [
                    reply(
                        tool_call("broken", {"city": "Oslo"}, id="call_broken"),
                        tool_call("nowhere", {"x": 1}, id="call_unknown"),
                        tool_call("lookup", '{"city": ', id="call_bad_json"),
                    ),
                    reply("Sorry."),
                ]
            ),
        )
    elif name == "tool-denied":
        agent = Refusing(
            store,
            model=ScriptedModel(
                [reply(tool_call("lookup", {"city": "Oslo"}, id="call_no")), reply("Okay.")]
            ),
        )
    elif name == "error-mid-text":
        agent = Think(store, model=ScriptedModel([reply("par", "tial ", fail("model fell over"))]))
    elif name == "error-mid-reasoning":
        agent = Think(
            store,
            model=ScriptedModel([reply(reasoning("hm", "mm"), fail_at=2, error="overloaded")]),
        )
    elif name == "abort-mid-text":
        agent = Think(store, model=ScriptedModel([reply("one ", "two ", pause(30), "three")]))
    elif name == "abort-mid-tool-input":
        agent = Think(store, model=FunctionModel(_stalled_tool_input))
    elif name == "abort-during-tool":

        @tool
        async def slow(seconds: float) -> str:
            """Take a while."""
            started.set()
            await asyncio.sleep(seconds)
            return "done"

        tools = {"slow": slow}
        agent = Think(
            store,
            model=ScriptedModel([reply("Waiting.", tool_call("slow", {"seconds": 30}, id="c"))]),
        )
    else:
        raise AssertionError(name)
    agent.get_tools = lambda: tools
    run = agent.start_chat("hi", collector)
    if name == "abort-mid-text":
        await _wait_for(collector, "text-delta", 2)
        agent.abort(reason="stop button")
    elif name == "abort-mid-tool-input":
        await _wait_for(collector, "tool-input-delta")
        agent.abort(reason="stop button")
    elif name == "abort-during-tool":
        await asyncio.wait_for(started.wait(), 10)
        agent.abort(reason="stop button")
    result = await asyncio.wait_for(run.task, 20)
    stored = agent.get_history()[-1]
    agent.close()
    return collector.events, stored, result.status


SCENARIOS = {
    # name: (run status, ai majors that know every chunk of it)
    "text": ("completed", AI_SDK_MAJORS),
    "reasoning": ("completed", AI_SDK_MAJORS),
    "tool": ("completed", AI_SDK_MAJORS),
    "tool-errors": ("completed", AI_SDK_MAJORS),
    # tool-output-denied (tool approvals) came with ai@6
    "tool-denied": ("completed", tuple(m for m in AI_SDK_MAJORS if m >= 6)),
    "error-mid-text": ("error", AI_SDK_MAJORS),
    "error-mid-reasoning": ("error", AI_SDK_MAJORS),
    "abort-mid-text": ("aborted", AI_SDK_MAJORS),
    "abort-mid-tool-input": ("aborted", AI_SDK_MAJORS),
    "abort-during-tool": ("aborted", AI_SDK_MAJORS),
}


@pytest.fixture(scope="module")
def turns(tmp_path_factory) -> dict[str, tuple[list[dict], dict, str]]:
    root = tmp_path_factory.mktemp("ai-sdk-turns")

    async def run_all() -> dict[str, tuple[list[dict], dict, str]]:
        out = {}
        for i, name in enumerate(SCENARIOS):
            store = DuckDBSessionStore(root / f"{i}.duckdb")
            try:
                out[name] = await _scenario(name, store)
            finally:
                store.close()
        return out

    return asyncio.run(run_all())


def sse(chunks: list[dict]) -> str:
    return "".join(to_sse(c) for c in chunks) + SSE_DONE


def clean(value: Any) -> Any:
    """``value`` without null fields (the clients leave unset fields undefined)."""
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value


# -- the tests -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("major", "name"),
    [(m, n) for n, (_, majors) in SCENARIOS.items() for m in majors],
    ids=lambda v: f"ai{v}" if isinstance(v, int) else v,
)
def test_client_final_message_is_the_stored_one(ai_clients, turns, major, name):
    chunks, stored, status = turns[name]
    assert status == SCENARIOS[name][0]
    out = read_with_ai(ai_clients[major], sse(chunks))
    assert out["version"].startswith(f"{major}.")
    chat, reader = out["chat"], out["reader"]
    if status == "error":
        error_text = chunks[-1]["errorText"]
        assert chat["status"] == "error" and chat["error"] == error_text
        assert reader["errors"] == [error_text]
    else:
        assert chat["status"] == "ready", chat["error"]
        assert chat["errors"] == [] and reader["errors"] == []
    if status == "completed":
        assert chat["finish"]["finishReason"] == stored["metadata"]["finishReason"]
    # useChat stops at an error chunk: the message it shows is what came before it.
    assert clean(chat["message"]) == clean(stored)
    assert clean(reader["message"]) == clean(stored)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_stream_ends_with_the_stored_metadata(turns, name):
    chunks, stored, status = turns[name]
    meta = stored["metadata"]
    assert meta["status"] == status and meta["usage"] and meta["model"]
    last = chunks[-1]
    if status == "completed":
        assert last["type"] == "finish"
        assert last["messageMetadata"] == meta
        assert last["finishReason"] == meta["finishReason"]
        assert [c["type"] for c in chunks].count("finish") == 1
    else:
        assert last["type"] == ("abort" if status == "aborted" else "error")
        assert chunks[-2] == {"type": "message-metadata", "messageMetadata": meta}
        # Everything open was closed before: nothing in the stored message streams on.
        assert all(p.get("state") != "streaming" for p in stored["parts"])
        assert not [
            p
            for p in stored["parts"]
            if p["type"] == "dynamic-tool" and not p["state"].startswith("output-")
        ]


def test_tool_result_chunks_say_dynamic(turns):
    """The ai@5 break: results of dynamic-tool parts must repeat ``dynamic: true``."""
    results = [
        c
        for name in ("tool", "tool-errors", "abort-during-tool")
        for c in turns[name][0]
        if c["type"] in ("tool-output-available", "tool-output-error")
    ]
    assert results and all(c.get("dynamic") is True for c in results)


def test_reasoning_ids_match_between_stream_and_store(turns):
    for name in ("reasoning", "error-mid-reasoning"):
        chunks, stored, _ = turns[name]
        streamed = [c["id"] for c in chunks if c["type"] == "reasoning-start"]
        kept = [p["id"] for p in stored["parts"] if p["type"] == "reasoning"]
        assert streamed == kept and kept


@pytest.mark.skipif(5 not in AI_SDK_MAJORS, reason="ai@5 is not among the tested majors")
def test_ai5_rejects_tool_approval_chunks(ai_clients, turns):
    """What the README says: approvals (``tool-output-denied``) need ai@6 or later."""
    chunks, _, _ = turns["tool-denied"]
    out = read_with_ai(ai_clients[5], sse(chunks))
    assert out["chat"]["status"] == "error"
    assert "tool-output-denied" in out["chat"]["error"]


def test_readme_names_the_tested_majors():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### AI SDK clients", 1)[1].split("\n#", 1)[0]
    named = {int(m) for m in re.findall(r"`ai@(\d+)`", section)}
    assert named == set(AI_SDK_MAJORS)


def test_installed_clients_are_those_majors(ai_clients):
    for major, project in ai_clients.items():
        version = _installed_version(project)
        assert version is not None and version.startswith(f"{major}.")
    ignored = (ROOT / ".gitignore").read_text().split()
    assert "node_modules/" in ignored and "tests/.npm-cache/" in ignored
