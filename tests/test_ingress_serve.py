"""The ingress through real Ray Serve (issue 11, items 1 and 7): two replicas behind
Serve's HTTP proxy, where a stream started through one replica resumes through the
other (the replicas hold no session state; every response names its replica in
``x-thinkray-replica``); and ``thinkray serve`` from the command line answering a chat.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import free_port, wait_until
from tests.ingress_support import ALICE, chat_body, make_config, sse_events

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parent.parent
CHUNKS = 200
DELAY = 0.05  # a 10 s turn: long enough to resume it many times while it runs


def text_of(events: list[Any]) -> str:
    return "".join(e["delta"] for e in events if isinstance(e, dict) and e["type"] == "text-delta")


@pytest.fixture
def serve_ingress(ray_local, tmp_path) -> Iterator[str]:
    """The ingress as a Serve app with two replicas; yields the proxy's base URL."""
    from ray import serve
    from thinkray.actors.ingress.deploy import APP_NAME, ingress_app

    port = free_port()
    namespace = f"serve-{tmp_path.name[-10:]}".replace("_", "-")
    config = make_config(
        str(tmp_path / "root"), namespace, agent_kwargs={"chunks": CHUNKS, "delay": DELAY}
    )
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(ingress_app(config, replicas=2), name=APP_NAME, route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(Exception):
            serve.delete(APP_NAME)
        serve.shutdown()


def test_a_stream_started_through_one_replica_resumes_through_the_other(serve_ingress):
    base = serve_ingress
    path = f"{base}/agents/chat/alice-serve/chat"
    # Two replicas: over a few requests the proxy routes to both.
    replicas = set()
    for _ in range(40):
        r = httpx.get(f"{base}/agents/chat", headers=ALICE, timeout=30)
        assert r.status_code == 200
        replicas.add(r.headers["x-thinkray-replica"])
        if len(replicas) == 2:
            break
    assert len(replicas) == 2, replicas

    seen: list[Any] = []
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", path, json=chat_body("c1", "go", "u1"), headers=ALICE) as r,
    ):
        assert r.status_code == 200, r.read()
        assert r.headers["x-vercel-ai-ui-message-stream"] == "v1"
        started_on = r.headers["x-thinkray-replica"]
        for event in sse_events(r.iter_lines()):
            seen.append(event)
            if len(seen) >= 6:
                break  # the client goes away mid-stream; the run goes on
    (other,) = replicas - {started_on}

    # Resume until the other replica answers one while the run is still going.
    replay: list[Any] = []
    deadline = time.monotonic() + CHUNKS * DELAY
    while time.monotonic() < deadline:
        with (
            httpx.Client(timeout=60) as client,
            client.stream("GET", f"{path}/c1/stream", headers=ALICE) as r,
        ):
            assert r.status_code == 200, "the run ended before the other replica resumed it"
            if r.headers["x-thinkray-replica"] != other:
                continue
            replay = list(sse_events(r.iter_lines()))
            break
    assert replay, "the proxy never routed a resume to the other replica"
    assert replay[: len(seen)] == seen  # from chunk 0, what the first client saw
    assert replay[-1] == "[DONE]" and replay[-2]["type"] == "finish"  # not aborted
    assert text_of(replay) == "".join(f"chunk{i} " for i in range(CHUNKS))
    stored = httpx.get(f"{path}/c1/messages", headers=ALICE, timeout=30).json()
    assert [m["role"] for m in stored] == ["user", "assistant"]
    assert stored[1]["id"] == replay[0]["messageId"]
    assert "".join(p.get("text", "") for p in stored[1]["parts"]) == text_of(replay)
    # Over, for every replica: nothing to resume.
    for _ in range(4):
        assert httpx.get(f"{path}/c1/stream", headers=ALICE, timeout=30).status_code == 204


# -- `thinkray serve` --------------------------------------------------------------------


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM the CLI (it deletes its app and stops its Ray); SIGKILL its process group
    (its own session, started for it) if it takes too long."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_thinkray_serve_answers_a_chat(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "RAY_ADDRESS")}
    env["RAY_DEDUP_LOGS"] = "0"
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "thinkray.actors.cli",
                "serve",
                "--port",
                str(port),
                "--storage-root",
                str(tmp_path / "root"),
                "--agent",
                "chat=thinkray.actors.demo:DemoAgent",
                # A class of the working directory's own code: the workers import it too.
                "--agent",
                "script=tests.agents:ScriptAgent",
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    try:
        base = f"http://127.0.0.1:{port}"

        def up() -> bool:
            assert proc.poll() is None, log.read_text()[-3000:]
            return "thinkray ingress on" in log.read_text()

        wait_until(up, timeout=120, interval=0.5)
        printed = log.read_text()
        match = re.search(r"principal 'user' has bearer token (\S+)", printed)
        assert match, printed
        auth = {"authorization": f"Bearer {match.group(1)}"}
        assert httpx.get(f"{base}/agents/chat", timeout=30).status_code == 401

        def chat(slug: str, chat_id: str, text: str) -> list:
            with (
                httpx.Client(timeout=60) as client,
                client.stream(
                    "POST",
                    f"{base}/agents/{slug}/mine/chat",
                    json=chat_body(chat_id, text, f"u-{chat_id}"),
                    headers=auth,
                ) as r,
            ):
                assert r.status_code == 200, r.read()
                return list(sse_events(r.iter_lines()))

        events = chat("chat", "c1", "What's the weather in Paris?")
        assert events[-1] == "[DONE]" and events[-2]["type"] == "finish"
        # The demo's agent class (the default, tests/test_serve_root.py), offline without
        # ANTHROPIC_API_KEY.
        assert any(e["type"] == "tool-output-available" for e in events if isinstance(e, dict)), (
            events
        )
        assert "light rain" in text_of(events)
        stored = httpx.get(f"{base}/agents/chat/mine/chat/c1/messages", headers=auth).json()
        assert stored[-1]["id"] == events[0]["messageId"]
        assert httpx.get(f"{base}/agents/chat", headers=auth).json() == {"agents": ["mine"]}
        events = chat("script", "c2", "hello")  # a class the workers import from the cwd
        assert events[-2]["type"] == "finish" and text_of(events), events
    finally:
        _stop(proc)
    assert proc.returncode == 0, log.read_text()[-3000:]


def test_the_example_serve_config_is_valid():
    """``actors/ingress/serve_config.yaml`` is a Serve config file whose ``args`` build
    the app (what ``serve run``/``serve deploy`` do with it)."""
    import yaml
    from ray.serve.deployment import Application
    from ray.serve.schema import ServeDeploySchema
    from thinkray.actors.ingress.deploy import app_builder

    config = yaml.safe_load((ROOT / "actors" / "ingress" / "serve_config.yaml").read_text())
    schema = ServeDeploySchema.model_validate(config)
    (app,) = schema.applications
    assert app.import_path == "thinkray.actors.ingress.deploy:app_builder"
    assert isinstance(app_builder(config["applications"][0]["args"]), Application)
