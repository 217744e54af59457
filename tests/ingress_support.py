"""Run the ingress app on a loopback port for tests (uvicorn in a thread: real
sockets, real streaming, real disconnects), and read its SSE streams."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from thinkray.actors.ingress.app import build_app
from thinkray.actors.ingress.config import AgentRoute, IngressConfig

TOKENS = {"token-alice": "alice", "token-bob": "bob"}
ALICE = {"authorization": "Bearer token-alice"}
BOB = {"authorization": "Bearer token-bob"}


# The test apps' namespaces keep no spare and start none for demand, as
# tests/conftest.py's namespace_factory: each spare is a process start (the one started
# after the first bind was rarely used), a warm-up turn only saves a first turn's CPU,
# and an actor a hibernation gives back stays for the next agent to bind (IngressApps).
NAMESPACE_OPTIONS = {"detached": False, "pool_size": 0, "warm_up": False, "grow_pool": False}


# One slow answer for the tests that act while a run streams (one app serves them all).
SLOW = {"chunks": 100, "delay": 0.02}


def make_config(root: str, namespace: str, **overrides: Any) -> IngressConfig:
    agent_kwargs = overrides.pop("agent_kwargs", {"chunks": 5})
    # ScriptAgent's answers; it also counts the session calls a turn costs its agent
    agent_cls = overrides.pop("agent_cls", "tests.agents:SessionCallsAgent")
    fields: dict[str, Any] = {
        "storage_root": root,
        "agents": {
            "chat": AgentRoute(
                agent_cls=agent_cls,
                namespace=namespace,
                agent_kwargs=agent_kwargs,
                namespace_options=NAMESPACE_OPTIONS,
            )
        },
        "tokens": TOKENS,
    }
    fields.update(overrides)
    return IngressConfig(**fields)


@contextlib.contextmanager
def serve_app(config: IngressConfig) -> Iterator[str]:
    """Serve ``build_app(config)`` on 127.0.0.1 (a free port); yields its base URL."""
    with serve_built(build_app(config)) as base:
        yield base


@contextlib.contextmanager
def serve_built(app: Any) -> Iterator[str]:
    """Serve an app :func:`build_app` made (a test may look at its state); yields its
    base URL."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the ingress did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        for ns in app.state.agents._namespaces.values():
            with contextlib.suppress(Exception):
                ns.shutdown()


class IngressApps:
    """Ingress apps the tests of a module share, one per configuration (the overrides
    of :func:`make_config`): an app's directory and each agent's actor are processes,
    and tests that each use agents of their own names need no app of their own. The
    fixture that hands this out calls :meth:`hibernate_all` after each test, so the
    next test's agents bind the actors given back instead of starting more.

    ``apps(**overrides)`` is a context manager yielding the shared app's base URL (the
    app stays up for the module); ``apps.fresh(**overrides)`` serves an app of the
    test's own, stopped at the ``with``'s end, whose root no other test wrote to (for
    "writes nothing" checks). ``apps.root_of(base)`` is an app's storage root."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self._prefix = shared_prefix(folder)
        self._count = itertools.count()
        self._shared: dict[str, str] = {}
        self._live: dict[str, Any] = {}  # base URL -> app, while it serves
        self._roots: dict[str, Path] = {}
        self._stack = contextlib.ExitStack()

    def __call__(self, **overrides: Any) -> contextlib.AbstractContextManager[str]:
        key = repr(sorted(overrides.items()))
        if key not in self._shared:
            self._shared[key] = self._stack.enter_context(self.fresh(**overrides))
        return contextlib.nullcontext(self._shared[key])

    @contextlib.contextmanager
    def fresh(self, **overrides: Any) -> Iterator[str]:
        n = next(self._count)
        root = self._folder / f"root{n}"
        app = build_app(make_config(str(root), f"{self._prefix}{n}", **overrides))
        with serve_built(app) as base:
            self._live[base], self._roots[base] = app, root
            try:
                yield base
            finally:
                del self._live[base]

    def root_of(self, base: str) -> Path:
        return self._roots[base]

    def namespace_of(self, base: str, slug: str = "chat") -> Any:
        """The namespace the app at ``base`` serves ``slug`` from (opened by then)."""
        return self._live[base].state.agents._namespaces[slug]

    def hibernate_all(self) -> None:
        for app in self._live.values():
            hibernate_agents(app)

    def close(self) -> None:
        self._stack.close()


def hibernate_agents(app: Any) -> None:
    """Hibernate every agent of the namespaces an app opened (their actors go back to
    the namespaces' pools for the next test's agents)."""
    for ns in app.state.agents._namespaces.values():
        with contextlib.suppress(Exception):  # a test that broke it says so
            ns.hibernate_all(force=True)


def shared_prefix(folder: Path) -> str:
    """A namespace prefix for a module's shared apps: Ray-wide names, and every xdist
    worker drives one Ray."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return f"i{folder.name[-12:]}{worker}-".replace("_", "-")


def agent_names(base: str, headers: dict[str, str]) -> list[str]:
    """The agents of the ``chat`` route the caller of ``headers`` owns."""
    names: list[str] = httpx.get(f"{base}/agents/chat", headers=headers).json()["agents"]
    return names


def sse_events(lines: Iterator[str]) -> Iterator[Any]:
    """The ``data:`` payloads of an SSE stream, parsed (``[DONE]`` as the string)."""
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            yield data if data == "[DONE]" else json.loads(data)


def ws_url(base: str, agent: str, name: str, query: str = "") -> str:
    """The WebSocket URL of agent ``agent``/``name`` on ``base``."""
    return "ws" + base[len("http") :] + f"/agents/{agent}/{name}" + query


def ws_ticket(base: str, agent: str, name: str, headers: dict[str, str]) -> str:
    """A WebSocket ticket for ``agent``/``name`` (what a browser opens the socket with)."""
    r = httpx.post(f"{base}/agents/{agent}/{name}/ws-ticket", headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return str(r.json()["ticket"])


def user_message(text: str, message_id: str) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


def chat_body(chat_id: str, text: str, message_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": chat_id,
        "messages": [user_message(text, message_id)],
        "trigger": "submit-message",
        **extra,
    }


def post_chat(base: str, path: str, body: Any, headers: dict[str, str]) -> list[Any]:
    """POST a chat and read its whole stream."""
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", base + path, json=body, headers=headers) as response,
    ):
        assert response.status_code == 200, response.read()
        assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
        assert response.headers["content-type"].startswith("text/event-stream")
        return list(sse_events(response.iter_lines()))
