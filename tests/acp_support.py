"""A ``thinkray acp`` process driven with raw JSON-RPC lines (the ACP tests that need no
npm client): its stdin, and its stdout read line by line, every line parsed."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
HANG_GUARD = 120  # seconds: only against a hang, never a measured time


class Server:
    """A ``thinkray acp`` process and its stdout, line by line."""

    def __init__(self, root: Path | None, *extra: str, env: dict[str, str] | None = None) -> None:
        thinkray = Path(sys.executable).with_name("thinkray")
        env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
        # A file, not a pipe nobody reads: a chatty stderr must not block the server.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        self.proc = subprocess.Popen(
            [
                str(thinkray),
                "acp",
                "--agent",
                "tests.acp_agents:AcpTestAgent",
                *(["--storage-root", str(root)] if root is not None else []),
                *extra,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            cwd=REPO,
            env=env,
        )
        self.lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.next_id = 1000
        self.notes: list[dict[str, Any]] = []  # notifications read while awaiting answers

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(b"")

    def send(self, raw: bytes | str | dict[str, Any]) -> None:
        if isinstance(raw, dict):
            raw = json.dumps(raw)
        if isinstance(raw, str):
            raw = raw.encode()
        assert self.proc.stdin is not None
        self.proc.stdin.write(raw + b"\n")
        self.proc.stdin.flush()

    def read(self) -> dict[str, Any]:
        line = self.lines.get(timeout=HANG_GUARD)
        assert line, f"the server closed its output (exit {self.proc.poll()})"
        message: dict[str, Any] = json.loads(line)  # every stdout line is a protocol message
        return message

    def request(self, method: str, params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while True:
            message = self.read()
            if message.get("id") == self.next_id:
                return message
            if "method" in message and "id" not in message:
                self.notes.append(message)

    def kill(self) -> None:
        """SIGKILL the process (by its pid) if it still runs, and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=HANG_GUARD)

    def close(self) -> int:
        """Close its input (as an editor does) and wait for it to exit; its stderr is
        then in ``self.stderr``. Returns the exit code."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        code = self.proc.wait(timeout=HANG_GUARD)
        self._stderr.seek(0)
        self.stderr = self._stderr.read().decode(errors="replace")
        self._stderr.close()
        return code


def error_of(message: dict[str, Any]) -> tuple[Any, int]:
    """The id and code of an error response (fails on a result)."""
    assert "error" in message and "result" not in message, message
    return message["id"], message["error"]["code"]
