"""Cloudflare's ``agents`` npm client against the ingress's WebSocket protocol
(issue 11, item 3): ``AgentClient`` connects (a ticket from ``POST .../ws-ticket`` in the
query string, as a browser must), ``WebSocketChatTransport`` chats, cancels and resumes, ``readUIMessageStream``
(``ai``) folds the chunks, ``agentFetch`` reads ``get-messages``.

Needs ``node`` (>= 20; run with ``--experimental-websocket``, the browser WebSocket the
package uses) and ``npm``: ``agents``, ``ai@6`` (its peer) and ``zod@4`` (``ai``'s) are installed once into
``tests/.npm-cache/agents`` (see :mod:`tests.npm_support`). The app runs on a loopback
port in front of real session actors; nothing leaves the machine after the install.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.npm_support import npm_project

pytestmark = [pytest.mark.node, pytest.mark.ray]

CLIENT = Path(__file__).resolve().parent / "agents_client.mjs"
NODE_TIMEOUT = 90


@pytest.fixture(scope="session")
def agents_client() -> Path:
    project = npm_project("agents", {"agents": "", "ai": "6.", "zod": "4."})
    shutil.copyfile(CLIENT, project / "client.mjs")  # next to its node_modules
    return project


@pytest.fixture
def base(ingress_apps):
    """The module's app (its tests use agents of their own names)."""
    with ingress_apps(agent_kwargs={"chunks": 60, "delay": 0.03}) as url:
        yield url


@pytest.fixture
def state_base(ingress_apps):
    """An agent class with synced state that clients may set (``StateAgent``)."""
    with ingress_apps(agent_cls="tests.agents:StateAgent") as url:
        yield url


def run_client(project: Path, base: str, scenario: str, name: str) -> dict[str, Any]:
    host = base[len("http://") :]
    proc = subprocess.run(
        [
            shutil.which("node") or "node",
            "--experimental-websocket",
            "--no-warnings",
            "client.mjs",
            scenario,
            host,
            name,
            "token-alice",
        ],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT,
    )
    assert proc.returncode == 0, f"the agents client failed:\n{proc.stderr[-3000:]}"
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


FULL = "".join(f"chunk{i} " for i in range(60))


def text_of(message: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for p in message["parts"] if p["type"] == "text")


def test_agent_client_chats(agents_client, base):
    out = run_client(agents_client, base, "chat", "alice-npm1")
    assert out["identity"] == {"identified": True, "name": "alice-npm1", "agent": "chat"}
    assert out["errors"] == []
    assert out["types"][0] == "start" and out["types"][-1] == "finish"
    stored = out["stored"]
    assert stored["status"] == 200
    assert [m["role"] for m in stored["messages"]] == ["user", "assistant"]
    # What the client built is what thinkray stored.
    assert out["message"]["id"] == stored["messages"][1]["id"]
    assert text_of(out["message"]) == text_of(stored["messages"][1]) == FULL


def test_agent_client_cancels(agents_client, base):
    out = run_client(agents_client, base, "cancel", "alice-npm2")
    assert out["cancelled"] is True
    assert out["done"] == {
        "type": "cf_agent_use_chat_response",
        "id": out["requestId"],
        "body": "",
        "done": True,
    }
    assert out["serverChunkTypes"][-1] == "abort"
    assert "finish" not in out["serverChunkTypes"]
    assistant = out["stored"]["messages"][1]
    assert assistant["metadata"]["status"] == "aborted"
    assert len(text_of(assistant)) < len(FULL)


def test_agent_client_resumes_after_reconnecting(agents_client, base):
    out = run_client(agents_client, base, "resume", "alice-npm3")
    assert out["resumed"] is True, out
    assert out["seen"].count("text-delta") == 3
    assert out["replayed"] > 0 and out["replayComplete"] == 1
    assert out["errors"] == []
    # From chunk 0 (the replay), then the live tail: the whole answer, not aborted.
    assert out["types"][0] == "start" and out["types"][-1] == "finish"
    assistant = out["stored"]["messages"][1]
    assert out["message"]["id"] == assistant["id"]
    assert text_of(out["message"]) == text_of(assistant) == FULL
    assert assistant["metadata"]["status"] == "completed"


def board(count: int, title: str = "") -> dict[str, Any]:
    return {"count": count, "title": title, "items": []}


def test_agent_clients_sync_state(agents_client, state_base):
    """Issue 25, part 3: ``AgentClient``'s ``onStateUpdate`` and ``setState`` between two
    clients, an invalid ``setState`` refused to its sender only, an HTTP change heard by
    both."""
    out = run_client(agents_client, state_base, "state", "alice-npm-state")
    initial = {"count": 0, "title": "new board", "items": []}
    assert out["initial"] == {"a": initial, "b": initial}  # the state came before ready
    a, b = out["a"], out["b"]
    assert a["updates"][0] == b["updates"][0] == {"source": "server", "state": initial}
    # Each client hears the other's change from the server, its own only as it set it.
    assert {"source": "server", "state": board(1, "from a")} in b["updates"]
    assert {"source": "server", "state": board(1, "from a")} not in a["updates"]
    assert {"source": "server", "state": board(2, "from b")} in a["updates"]
    assert {"source": "server", "state": board(3, "from b")} in a["updates"]
    # The invalid state: an error to its sender, nothing to the other client.
    assert len(a["errors"]) == 1
    assert a["errors"][0].startswith("State update rejected: state does not fit Board")
    assert b["errors"] == []
    assert all(u["state"].get("count") != "many" for u in b["updates"])
    assert out["put"] == 200
    assert out["final"] == {"a": board(10, "from http"), "b": board(10, "from http")}
    assert out["stored"] == {"state": board(10, "from http"), "version": 4}
