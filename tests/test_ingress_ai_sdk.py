"""The real ``ai`` package talks HTTP to a live ingress (issue 11, item 7): its
``DefaultChatTransport`` POSTs a chat (the bearer token in the transport's ``headers``)
and reads the live UI message stream, through a ``Chat`` (what ``useChat`` wraps) and
through ``readUIMessageStream``; its ``reconnectToStream`` resumes a run in flight. The
message each client ends with must be the one the agent stored (``GET .../messages``).

The clients are those of tests/test_ai_sdk_clients.py (``ai@5``, ``@6``, ``@7``, npm
installed once into ``tests/.npm-cache``); the script is ``tests/ai_sdk_http_client.mjs``.
The ingress is ``build_app`` under uvicorn on loopback (tests/ingress_support.py) in
front of real session actors.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from thinkray.actors.ingress.app import build_app
from thinkray.actors.ingress.config import AgentRoute

from tests.helpers import wait_until
from tests.ingress_support import (
    ALICE,
    NAMESPACE_OPTIONS,
    TOKENS,
    chat_body,
    hibernate_agents,
    make_config,
    serve_built,
    sse_events,
)
from tests.test_ai_sdk_clients import AI_SDK_MAJORS, NODE_TIMEOUT, _install, clean

pytestmark = [pytest.mark.node, pytest.mark.ray]

CLIENT = Path(__file__).resolve().parent / "ai_sdk_http_client.mjs"
TOKEN = next(t for t, who in TOKENS.items() if who == "alice")
SLOW_CHUNKS = 60  # 0.05 s apart: a 3 s run, long enough to resume while it runs


@pytest.fixture(scope="module")
def http_clients() -> dict[int, Path]:
    """Each major's install with the HTTP client script beside its node_modules."""
    out = {}
    for major in AI_SDK_MAJORS:
        project = _install(major)
        tmp = project / f"http_client.mjs.{os.getpid()}.tmp"
        shutil.copyfile(CLIENT, tmp)
        os.replace(tmp, project / "http_client.mjs")
        out[major] = project
    return out


@pytest.fixture(scope="module")
def _app(ray_local, tmp_path_factory) -> Iterator[tuple[str, Any]]:
    """A live ingress: ``chat`` (a tool call, then 5 chunks) and ``slow`` (60 chunks)."""
    root = tmp_path_factory.mktemp("ingress-ai-sdk")
    namespace = f"aisdk-{root.name[-8:]}".replace("_", "-")
    config = make_config(str(root / "root"), namespace)
    config.agents["slow"] = AgentRoute(
        agent_cls="tests.agents:ScriptAgent",
        namespace=f"{namespace}-slow",
        agent_kwargs={"chunks": SLOW_CHUNKS, "delay": 0.05},
        namespace_options=NAMESPACE_OPTIONS,
    )
    app = build_app(config)
    with serve_built(app) as url:
        yield url, app


@pytest.fixture
def base(_app) -> Iterator[str]:
    """The module's ingress; each test's agents (names of its own) hibernate after it,
    so the next test's agents bind their actors instead of starting more."""
    url, app = _app
    yield url
    hibernate_agents(app)


def run_client(project: Path, **request: Any) -> dict[str, Any]:
    """What the ``ai`` client in ``project`` did for ``request`` (see the script)."""
    proc = subprocess.run(
        [shutil.which("node") or "node", "http_client.mjs"],
        cwd=project,
        input=json.dumps({"token": TOKEN, **request}),
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT,
    )
    assert proc.returncode == 0, f"the ai client crashed:\n{proc.stderr[-3000:]}"
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def stored_messages(base: str, agent: str, name: str, chat_id: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{base}/agents/{agent}/{name}/chat/{chat_id}/messages", headers=ALICE)
    assert r.status_code == 200, r.text
    messages: list[dict[str, Any]] = r.json()
    return messages


def active(api: str, chat_id: str) -> bool:
    """Whether a run of ``chat_id`` is in flight (the resume route answers 200, not
    204); reads only the status line."""
    with (
        httpx.Client(timeout=30) as client,
        client.stream("GET", f"{api}/{chat_id}/stream", headers=ALICE) as r,
    ):
        return r.status_code == 200


majors = pytest.mark.parametrize("major", AI_SDK_MAJORS, ids=lambda m: f"ai{m}")


@majors
def test_chat_over_http_ends_with_the_stored_messages(http_clients, base, major):
    name = f"alice-chat{major}"
    api = f"{base}/agents/chat/{name}/chat"
    out = run_client(
        http_clients[major], op="chat", api=api, chatId="c1", text="What is the weather in Oslo?"
    )
    assert out["version"].startswith(f"{major}.")
    result = out["result"]
    assert result["status"] == "ready", result["error"]
    assert result["errors"] == []
    assert result["finish"]["finishReason"] == "stop"
    stored = stored_messages(base, "chat", name, "c1")
    client = result["messages"]
    assert [m["role"] for m in client] == [m["role"] for m in stored] == ["user", "assistant"]
    # The user message the client made (its id too) is the one stored ...
    assert client[0]["id"] == stored[0]["id"]
    assert client[0]["parts"] == [{"type": "text", "text": "What is the weather in Oslo?"}]
    assert [p for p in stored[0]["parts"] if p["type"] == "text"] == client[0]["parts"]
    # ... and the assistant message, with its tool call, text and metadata, is too.
    assert any(p["type"] == "dynamic-tool" for p in stored[1]["parts"])
    assert clean(client[1]) == clean(stored[1])


@majors
def test_read_ui_message_stream_over_http_ends_with_the_stored_message(http_clients, base, major):
    name = f"alice-read{major}"
    api = f"{base}/agents/chat/{name}/chat"
    out = run_client(
        http_clients[major], op="read", api=api, chatId="c1", text="hi", messageId="u1"
    )
    result = out["result"]
    assert result["errors"] == [] and result["snapshots"] > 1
    stored = stored_messages(base, "chat", name, "c1")
    assert [m["id"] for m in stored][:1] == ["u1"]
    assert clean(result["message"]) == clean(stored[-1])


@majors
def test_reconnect_to_stream_resumes_a_run_in_flight(http_clients, base, major):
    name = f"alice-resume{major}"
    api = f"{base}/agents/slow/{name}/chat"
    events: list[Any] = []

    def post() -> None:  # the first client reads the whole run
        with (
            httpx.Client(timeout=60) as client,
            client.stream("POST", api, json=chat_body("c1", "go", "u1"), headers=ALICE) as r,
        ):
            assert r.status_code == 200
            events.extend(sse_events(r.iter_lines()))

    first = threading.Thread(target=post)
    first.start()
    wait_until(lambda: active(api, "c1"), 20)
    out = run_client(http_clients[major], op="resume", api=api, chatId="c1")
    first.join(60)
    result = out["result"]
    assert result["stream"] is True, "reconnectToStream found no run in flight"
    assert result["errors"] == []
    stored = stored_messages(base, "slow", name, "c1")
    assert events[-1] == "[DONE]" and events[0]["messageId"] == stored[-1]["id"]
    # From chunk 0: the resumed client rebuilt the whole message, as stored.
    assert clean(result["message"]) == clean(stored[-1])
    text = "".join(p.get("text", "") for p in result["message"]["parts"])
    assert text == "".join(f"chunk{i} " for i in range(SLOW_CHUNKS))
    # Nothing in flight any more: the transport answers null (the ingress's 204).
    assert run_client(http_clients[major], op="resume", api=api, chatId="c1")["result"] == {
        "stream": None
    }
