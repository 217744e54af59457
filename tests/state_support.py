"""What the synced-state tests share: an ingress serving three classes (``chat``: state
clients may set, ``locked``: state only the agent sets, ``plain``: no state), its
WebSocket and SSE clients, and the Python handle of one of its agents."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import httpx
from thinkray.actors.ingress.app import build_app
from thinkray.actors.ingress.config import AgentRoute, IngressConfig
from websockets.sync.client import ClientConnection, connect

from tests.ingress_support import (
    NAMESPACE_OPTIONS,
    TOKENS,
    hibernate_agents,
    serve_built,
    shared_prefix,
    ws_url,
)

STATE = "cf_agent_state"
STATE_ERROR = "cf_agent_state_error"
CLASSES = {
    "chat": "tests.agents:StateAgent",
    "locked": "tests.agents:ServerStateAgent",
    "plain": "tests.agents:ScriptAgent",
}


def state_config(root: str, prefix: str) -> IngressConfig:
    agents = {
        slug: AgentRoute(
            agent_cls=cls,
            namespace=f"{prefix}-{slug}",
            agent_kwargs={"chunks": 3},
            namespace_options=NAMESPACE_OPTIONS,
        )
        for slug, cls in CLASSES.items()
    }
    return IngressConfig(storage_root=root, agents=agents, tokens=TOKENS)


@contextlib.contextmanager
def state_server(root: str, prefix: str) -> Iterator[tuple[str, Any]]:
    """The base URL and the app (whose namespaces give Python handles)."""
    app = build_app(state_config(root, prefix))
    with serve_built(app) as base:
        yield base, app


def shared_state_server(tmp_path_factory: Any) -> Iterator[tuple[str, Any]]:
    """A module fixture's body: one state app for the module's tests, which each use
    agents of their own names (see :func:`hibernated_state_server`)."""
    folder = tmp_path_factory.mktemp("state")
    with state_server(str(folder / "root"), shared_prefix(folder)) as started:
        yield started


def hibernated_state_server(started: tuple[str, Any]) -> Iterator[tuple[str, Any]]:
    """A test fixture's body: the module's state app, its agents hibernated after the
    test (their actors go back to the pools for the next test's agents)."""
    yield started
    hibernate_agents(started[1])


def handle_of(app: Any, name: str, slug: str = "chat") -> Any:
    """The Python handle of agent ``name`` the app serves (a namespace it opened)."""
    return app.state.agents._namespaces[slug].get(name)


def namespace_of(app: Any, slug: str = "chat") -> Any:
    return app.state.agents._namespaces[slug]


def open_ws(base: str, name: str, headers: dict[str, str], slug: str = "chat") -> ClientConnection:
    return connect(ws_url(base, slug, name), additional_headers=headers, open_timeout=30)


def recv(ws: ClientConnection, timeout: float = 60) -> dict[str, Any]:
    return json.loads(ws.recv(timeout=timeout))


def recv_types(ws: ClientConnection, n: int) -> list[str]:
    return [recv(ws)["type"] for _ in range(n)]


def greet(ws: ClientConnection) -> list[dict[str, Any]]:
    """A stateful class's greeting: identity, state, MCP servers, messages."""
    return [recv(ws) for _ in range(4)]


def next_state(ws: ClientConnection) -> dict[str, Any]:
    """The next state or state-error frame (no chat runs in these tests)."""
    while True:
        frame = recv(ws)
        if frame["type"] in (STATE, STATE_ERROR):
            return frame


def send_state(ws: ClientConnection, state: Any) -> None:
    """What ``AgentClient.setState`` sends."""
    ws.send(json.dumps({"state": state, "type": STATE}))


def ping(ws: ClientConnection) -> dict[str, Any]:
    """The answer to a resume probe: frames are handled in order, so anything sent
    to this connection before its answer was queued comes first."""
    ws.send(json.dumps({"type": "cf_agent_stream_resume_request", "probeId": "ping"}))
    return recv(ws)


def put_state(base: str, name: str, body: Any, headers: dict[str, str], slug: str = "chat") -> Any:
    return httpx.put(f"{base}/agents/{slug}/{name}/state", json=body, headers=headers, timeout=60)


def get_state(base: str, name: str, headers: dict[str, str], slug: str = "chat") -> Any:
    return httpx.get(f"{base}/agents/{slug}/{name}/state", headers=headers, timeout=60)


def board(count: int = 0, title: str = "", items: list[str] | None = None) -> dict[str, Any]:
    return {"count": count, "title": title, "items": items or []}


class StateStream:
    """``GET .../state/stream`` read with httpx: ``next()`` is the next event's data."""

    def __init__(self, base: str, name: str, headers: dict[str, str], slug: str = "chat"):
        self.client = httpx.Client(timeout=httpx.Timeout(60, read=60))
        url = f"{base}/agents/{slug}/{name}/state/stream"
        self.cm = self.client.stream("GET", url, headers=headers)
        self.response = self.cm.__enter__()
        self.lines = self.response.iter_lines()

    def next(self) -> dict[str, Any]:
        event = None
        for line in self.lines:
            if line.startswith("event: "):
                event = line[len("event: ") :]
            elif line.startswith("data: "):
                assert event == "state", line
                return dict(json.loads(line[len("data: ") :]))
        raise AssertionError("the state stream ended")

    def close(self) -> None:
        self.cm.__exit__(None, None, None)
        self.client.close()

    def __enter__(self) -> StateStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
