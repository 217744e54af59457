"""Progress bars for long command-line operations (``thinkray stats --deep``, the
benchmarks' bursts of wakes and turns), without a dependency.

A :class:`Progress` writes to stderr (stdout stays the command's result, which scripts
and tests parse). On a terminal it redraws one line (``\\r``) at most ~10 times a
second; elsewhere (a pipe, a CI log) it prints a plain line now and then (every
``LINE_EVERY`` seconds, and at the end), so a log shows it is moving without a line
per step. ``enabled=False`` (a command's ``--quiet``) makes it silent.

    with Progress(len(files), "scanning") as bar:
        for f in files:
            scan(f)
            bar.step()
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import Any, TextIO

__all__ = ["LINE_EVERY", "Progress"]

LINE_EVERY = 5.0
"""Seconds between two plain progress lines when stderr is not a terminal."""
REDRAW_EVERY = 0.1
"""Seconds between two redraws of the bar on a terminal."""
WIDTH = 30
"""Characters of the bar itself."""


def _is_tty(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except (ValueError, OSError):  # closed
        return False


class Progress:
    """A progress bar of ``total`` steps named ``label`` on ``stream`` (default stderr).

    ``step`` may be called from several threads or tasks at once. ``tty`` forces the
    redrawn bar (True) or the plain lines (False); None asks the stream. ``total`` 0
    or None shows a count without a bar."""

    def __init__(
        self,
        total: int | None,
        label: str,
        stream: TextIO | None = None,
        *,
        enabled: bool = True,
        tty: bool | None = None,
        line_every: float = LINE_EVERY,
    ) -> None:
        self.total = total or 0
        self.label = label
        self.done = 0
        self.failed = 0
        self.stream: TextIO = stream or sys.stderr
        self.enabled = enabled
        self.tty = _is_tty(self.stream) if tty is None else tty
        self.line_every = line_every
        self.started = time.monotonic()
        self._last = 0.0 if self.tty else self.started  # plain lines: not at the start
        self._closed = False
        self._lock = threading.Lock()

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def step(self, n: int = 1, *, failed: bool = False) -> None:
        """Count ``n`` more done (``failed``: they failed; still counted as done) and
        draw if due."""
        with self._lock:
            self.done += n
            if failed:
                self.failed += n
            if not self.enabled or self._closed:
                return
            now = time.monotonic()
            every = REDRAW_EVERY if self.tty else self.line_every
            if now - self._last >= every or (self.tty and self.total and self.done >= self.total):
                self._last = now
                self._draw(now)

    def text(self, now: float | None = None) -> str:
        """The progress as one line (no ``\\r`` or newline)."""
        now = time.monotonic() if now is None else now
        elapsed = now - self.started
        parts = [self.label]
        if self.total:
            share = min(1.0, self.done / self.total)
            filled = int(WIDTH * share)
            parts.append(f"[{'#' * filled}{'.' * (WIDTH - filled)}]")
            parts.append(f"{self.done}/{self.total}")
            parts.append(f"{share * 100:3.0f}%")
        else:
            parts.append(f"{self.done}")
        if self.failed:
            parts.append(f"({self.failed} failed)")
        parts.append(f"{elapsed:.1f}s")
        if self.total and 0 < self.done < self.total and elapsed > 1.0:
            left = elapsed / self.done * (self.total - self.done)
            parts.append(f"~{left:.0f}s left")
        return " ".join(parts)

    def _draw(self, now: float) -> None:
        line = self.text(now)
        if self.tty:
            self.stream.write(f"\r{line}\033[K")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """The final state: on a terminal the bar's last draw and a newline; elsewhere
        one plain line. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if not self.enabled:
                return
            now = time.monotonic()
            line = self.text(now)
            if self.tty:
                self.stream.write(f"\r{line}\033[K\n")
            else:
                self.stream.write(line + "\n")
            self.stream.flush()
