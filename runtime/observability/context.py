"""Who is speaking, as context variables: the turn in progress in this task, and the
exchange's root run id a caller in another actor sent along.

Kept apart from :mod:`.logs` and :mod:`.tracing` because both read it: logs put the
ids on records, tracing's carrier takes the root run id across actors (with or without
an OpenTelemetry provider), so a sub-agent's records name the orchestrator run that
started the exchange.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

__all__ = ["ROOT_RUN_HEADER", "TurnLogContext", "current_turn", "inherited_root", "root_run"]

ROOT_RUN_HEADER = "x-thinkray-root-run"
"""The carrier entry (beside W3C ``traceparent``) with the exchange's first run id."""


@dataclass(frozen=True)
class TurnLogContext:
    """Who is speaking: the ids a turn's records carry."""

    agent: str
    namespace: str
    session_id: str
    run_id: str
    root_run_id: str


current_turn: contextvars.ContextVar[TurnLogContext | None] = contextvars.ContextVar(
    "thinkray_turn", default=None
)
inherited_root: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "thinkray_inherited_root_run", default=None
)


def root_run() -> str | None:
    """The root run id of the exchange this task belongs to: the current turn's, else
    the one a caller sent (None outside any exchange)."""
    turn = current_turn.get()
    if turn is not None:
        return turn.root_run_id
    return inherited_root.get()
