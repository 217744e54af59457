"""Session status: the back-channel that says whether a session is running (seed 002).

Volatile by design: never persisted, so after a restart every session reads idle,
which is true because no run survives a restart.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

from thinkray.runtime.errors import (  # re-exported: the errors live in thinkray.runtime.errors
    SessionBusyError as SessionBusyError,
)
from thinkray.runtime.typed_model import TypedModel

StatusState = Literal["idle", "busy", "retrying", "error"]


class SessionStatus(TypedModel):
    """Whether a session runs now: ``busy`` (``run_id``, since ``started_at``),
    ``retrying`` (``attempt``, ``message``: why), ``error`` (``message``) or ``idle``."""

    state: StatusState = "idle"
    attempt: int | None = None
    message: str | None = None
    started_at: int | None = None  # epoch ms, when busy or retrying
    run_id: str | None = None
    # Messages waiting for their turn (busy policies ``queue``, ``latest``, ``steer``,
    # ``interrupt``), first to run first: ``message_id``, ``run_id``, ``mode``,
    # ``queued_at`` (epoch ms).
    queue: list[dict[str, Any]] = []


StatusListener = Callable[[str, SessionStatus], None]


class StatusBoard:
    """In-memory status per session id, with subscribers (the host's event bus)."""

    def __init__(self) -> None:
        self._status: dict[str, SessionStatus] = {}
        self._queues: dict[str, list[dict[str, Any]]] = {}
        self._listeners: list[StatusListener] = []

    def get(self, session_id: str) -> SessionStatus:
        """The session's status (idle for a session never seen), with its queue."""
        status = self._status.get(session_id) or SessionStatus()
        queue = self._queues.get(session_id)
        return status.model_copy(update={"queue": list(queue)}) if queue else status

    def set_queue(self, session_id: str, queue: list[dict[str, Any]]) -> None:
        """The session's waiting messages changed: subscribers hear the status again."""
        if not queue and session_id not in self._queues:
            return
        if queue:
            self._queues[session_id] = list(queue)
        else:
            self._queues.pop(session_id, None)
        current = self.get(session_id)
        for listener in list(self._listeners):
            listener(session_id, current)

    def is_idle(self, session_id: str) -> bool:
        """Whether no run holds the session (``idle`` or ``error``): a turn may start."""
        return self.get(session_id).state in ("idle", "error")

    def set(self, session_id: str, status: SessionStatus) -> None:
        """Record ``status`` and tell every subscriber, in subscription order."""
        # The queue is kept apart (set_queue): a status read earlier must not bring
        # back a queue that has changed since.
        self._status[session_id] = (
            status.model_copy(update={"queue": []}) if status.queue else status
        )
        current = self.get(session_id)
        for listener in list(self._listeners):
            listener(session_id, current)

    def busy(self, session_id: str, run_id: str) -> None:
        """Run ``run_id`` starts on the session now."""
        self.set(
            session_id,
            SessionStatus(state="busy", started_at=int(time.time() * 1000), run_id=run_id),
        )

    def retrying(self, session_id: str, attempt: int, message: str) -> None:
        """The run waits to retry (``attempt``, ``message``: why); keeps its run id and
        start time."""
        prev = self.get(session_id)
        self.set(
            session_id,
            SessionStatus(
                state="retrying",
                attempt=attempt,
                message=message,
                started_at=prev.started_at or int(time.time() * 1000),
                run_id=prev.run_id,
            ),
        )

    def idle(self, session_id: str) -> None:
        """The session's run ended."""
        self.set(session_id, SessionStatus())

    def error(self, session_id: str, message: str) -> None:
        """The session's run failed with ``message``."""
        self.set(session_id, SessionStatus(state="error", message=message))

    def items(self) -> list[tuple[str, SessionStatus]]:
        """Every session with a recorded status (idle ones included), and its status."""
        return [(sid, self.get(sid)) for sid in self._status]

    def subscribe(self, listener: StatusListener) -> Callable[[], None]:
        """Call ``listener(session_id, status)`` on every change; returns the remover."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None
