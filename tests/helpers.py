"""Small helpers shared by the Ray tests."""

from __future__ import annotations

import contextlib
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def wait_until(predicate: Callable[[], Any], timeout: float = 15.0, interval: float = 0.05) -> Any:
    """Poll until ``predicate()`` is truthy; return its value or fail the test."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


def hibernated_after(ns: Any) -> Iterator[Any]:
    """A fixture's body for a namespace shared by a module's tests: yields ``ns``, then
    hibernates its agents, whose actors go back to its pool for the next test's agents
    to bind instead of starting more."""
    yield ns
    with contextlib.suppress(Exception):  # a test that broke it reports that itself
        ns.hibernate_all(force=True)


def text_of(message: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for p in message["parts"] if p["type"] == "text")


class Raiser:
    """A bare Ray actor body for error round trips: raises or returns what it is given."""

    def raise_it(self, error: BaseException) -> None:
        raise error

    def echo(self, error: BaseException) -> BaseException:
        return error


def kill_agent_process(ns: Any, name: str) -> int:
    """SIGKILL the process of the actor hosting agent ``name`` (a real crash); its pid."""
    import os
    import signal

    pid = int(ns.where(name)["pid"])
    os.kill(pid, signal.SIGKILL)
    return pid


def crash_namespace(namespace_factory: Any, log: Any, *, chunks: int, delay: float) -> Any:
    """A namespace of ``tests.agents.CrashAgent`` whose tool executions go to ``log``."""
    from tests.agents import CrashAgent

    return namespace_factory(
        CrashAgent,
        agent_kwargs={"tool_log": str(log), "chunks": chunks, "delay": delay},
        idle_timeout=None,
    )


def start_driver(ray: Any, body: str, *args: str) -> Any:
    """Start another driver process joined to this test session's Ray: it runs ``body``
    (dedented) after ``ray.init`` with the repository on its workers' path, ``args`` in
    ``sys.argv[1:]``. Returns the ``subprocess.Popen`` (text pipes for stdout/stderr)."""
    import os
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    repo = str(Path(__file__).resolve().parent.parent)
    # The session Ray's workers find the repository through their raylet's environment
    # (tests/conftest.py's _init_ray); this driver through its own.
    preamble = (
        "import ray\n"
        f"ray.init(address={ray.get_runtime_context().gcs_address!r}, log_to_driver=False)\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", preamble + textwrap.dedent(body), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=repo),
    )


def run_check(
    script: str, *args: str, timeout: float, cwd: str | None = None, marker: str = ""
) -> dict[str, Any]:
    """Run ``tests/<script>`` (a check that starts a Ray or a cluster of its own) in a
    fresh process with the repository on its path and no ``RAY_ADDRESS``; returns the
    JSON report it prints on its last line that starts with ``marker`` (a killed
    raylet's last words may follow it on stdout), or fails with its output's tail."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(repo) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, str(repo / "tests" / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd or str(repo),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.strip() and line.startswith(marker)]
    assert lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return dict(json.loads(lines[-1][len(marker) :]))


def round_of(report: dict[str, Any], kind: str) -> dict[str, Any]:
    """``kind``'s round of a check that ran several in one cluster (each round catches
    its own failure, so one kind's failure does not hide the other's result)."""
    round_ = report[kind]
    assert "error" not in round_, round_["error"]
    return dict(round_)


def sigkilled_child(code: str, **fields: str) -> None:
    """Run ``code`` (formatted with ``repo`` and ``fields``) in a child Python that
    prints "acknowledged" once its writes returned and then SIGKILLs itself; asserts
    it got that far (a crash test's setup: nothing folded, nothing closed)."""
    repo = str(Path(__file__).resolve().parents[1])
    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code.format(repo=repo, **fields))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert "acknowledged" in child.stdout


def json_report(stdout: str) -> Any:
    """The JSON a child driver printed last. Ray copies its raylet's warnings ("N worker
    processes have been started ...") into a driver's stdout, after the report too, so
    the last line is not the report: the last line that is a JSON object or list is."""
    import json

    for line in reversed(stdout.strip().splitlines()):
        if line.startswith(("{", "[")):
            return json.loads(line)
    raise AssertionError(f"no JSON report in the child's output: {stdout[-2000:]!r}")


def _ephemeral_floor() -> int:
    """The lowest port the kernel hands out to outgoing connections (Linux's
    ``ip_local_port_range``; 32768 where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port free now, for a server started a moment later. Not one the
    kernel picks for ``bind(0)``: those come from the ephemeral range, where Ray's own
    outgoing connections (hundreds in a suite) can take it before the server binds
    (a Serve proxy failed to start so once). Picked at random below that range."""
    floor = _ephemeral_floor()
    for _ in range(200):
        port = random.randrange(10_000, max(10_001, floor))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port below the ephemeral range")


def start_moto(port: int) -> Any:
    """moto's threaded S3 server on loopback ``port``, started, with S3's atomic
    conditional put. moto checks ``If-None-Match: *`` and then stores the object as two
    steps while its server runs requests in threads, so two racers' conditional puts of
    one key could both succeed, which S3 never allows: the lease race in
    tests/test_objectstore.py saw two winners once on a loaded run. Puts are
    serialized here, as S3's are atomic per key."""
    import threading

    from moto.s3.responses import S3Response  # type: ignore[import-untyped]
    from moto.server import ThreadedMotoServer  # type: ignore[import-untyped]

    if not getattr(S3Response.put_object, "atomic", False):
        original = S3Response.put_object
        lock = threading.Lock()

        def put_object(self: Any, *args: Any, **kwargs: Any) -> Any:
            with lock:
                return original(self, *args, **kwargs)

        put_object.atomic = True  # type: ignore[attr-defined]
        S3Response.put_object = put_object
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return server
