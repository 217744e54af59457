"""``thinkray serve --direct``: the ingress under uvicorn in the command's own process,
without Ray Serve (issue 22: Serve's proxy and replica cost ~15 ms of CPU per streamed
turn). It joins the running Ray (``RAY_ADDRESS``, the suite's), answers a chat behind
its bearer token, refuses ``--replicas``, reports a port in use and stops on SIGTERM;
the agents it made stay in their namespace for the next ingress."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.helpers import free_port, wait_until
from tests.ingress_support import chat_body, sse_events

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parent.parent
SLUG = "directcli"  # the namespace too (thinkray serve names it after the slug)


def _cli(*args: str, env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "thinkray.actors.cli", "serve", *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )


def test_direct_refuses_replicas(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "thinkray.actors.cli", "serve", "--direct", "--replicas", "2",
         "--storage-root", str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2
    assert "--direct serves from this one process: no --replicas" in run.stderr


def test_direct_reports_a_port_in_use_and_exits_1(ray_local, tmp_path):
    import socket

    env = dict(os.environ, RAY_ADDRESS=ray_local.get_runtime_context().gcs_address)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        run = subprocess.run(
            [sys.executable, "-m", "thinkray.actors.cli", "serve", "--direct", "--port",
             str(port), "--storage-root", str(tmp_path)],
            capture_output=True, text=True, cwd=ROOT, env=env, timeout=120,
        )  # fmt: skip
    assert run.returncode == 1, run.stderr[-3000:]
    assert "thinkray serve: " in run.stderr and "Address already in use" in run.stderr
    assert "Traceback" not in run.stderr and "thinkray ingress on" not in run.stdout


def test_thinkray_serve_direct_answers_a_chat_and_stops_on_sigterm(ray_local, tmp_path):
    from thinkray.actors.namespace import AgentNamespace

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    env["RAY_ADDRESS"] = ray_local.get_runtime_context().gcs_address
    log = tmp_path / "serve.log"
    proc = _cli(
        "--direct", "--port", str(port), "--storage-root", str(tmp_path / "root"),
        "--agent", f"{SLUG}=tests.agents:ScriptAgent",
        env=env, log=log,
    )  # fmt: skip
    try:

        def up() -> bool:
            assert proc.poll() is None, log.read_text()[-3000:]
            return "thinkray ingress on" in log.read_text()

        wait_until(up, timeout=120, interval=0.2)
        printed = log.read_text()
        assert f"thinkray ingress on http://127.0.0.1:{port} (direct" in printed
        match = re.search(r"principal 'user' has bearer token (\S+)", printed)
        assert match, printed
        auth = {"authorization": f"Bearer {match.group(1)}"}
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/agents/{SLUG}").status_code == 401

        with (
            httpx.Client(timeout=60) as client,
            client.stream(
                "POST", f"{base}/agents/{SLUG}/mine/chat",
                json=chat_body("c1", "hello", "u-1"), headers=auth,
            ) as r,
        ):  # fmt: skip
            assert r.status_code == 200, r.read()
            assert r.headers["x-thinkray-replica"]  # the one process names itself
            events = list(sse_events(r.iter_lines()))
        assert events[-1] == "[DONE]" and events[-2]["type"] == "finish", events
        stored = httpx.get(f"{base}/agents/{SLUG}/mine/chat/c1/messages", headers=auth).json()
        assert [m["role"] for m in stored] == ["user", "assistant"]
        assert stored[-1]["id"] == events[0]["messageId"]

        proc.send_signal(signal.SIGTERM)
        # SIGTERM: a graceful shutdown (no stream open) and a clean exit.
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
        # The agent outlives the ingress: its namespace answers without any HTTP.
        ns = AgentNamespace.connect(SLUG)
        history = ns.get("mine").get_history.remote("c1").result()
        assert [m["role"] for m in history] == ["user", "assistant"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        with contextlib.suppress(Exception):  # never started: nothing to stop
            AgentNamespace.connect(SLUG).shutdown()
