"""Logs: one logger hierarchy, ``thinkray.*``, and the turn's ids on every record.

Every module logs through ``logging.getLogger("thinkray.<part>")``. While a turn runs,
a context variable holds who is speaking — the agent's name, its namespace, the
session, the run, and the run that started the whole exchange (an orchestrator's run,
for a sub-agent's turn) — and a log record factory (``logging.setLogRecordFactory``,
installed when this module is imported) copies them onto each record as ``record.agent``, ``record.namespace``, ``record.session_id``, ``record.run_id``,
``record.root_run_id`` and, while tracing, ``record.trace_id``. Records from outside a
turn carry ``"-"``, so a format string using them never fails.

The turn runner sets the context inside the turn's own task (:func:`enter_turn`):
everything the turn awaits — tools, model calls, hooks — inherits it, and nothing
leaks into the caller. ``root_run_id`` crosses actors in the carrier a handle sends
with each call (:func:`.tracing.inject`, tracing on or off), so ``grep root=run_…``
follows one exchange across the orchestrator's and its sub-agents' actor logs.
"""

from __future__ import annotations

import logging
from typing import Any

from thinkray.runtime.observability import tracing
from thinkray.runtime.observability.context import TurnLogContext, current_turn, root_run

__all__ = [
    "LOG_FORMAT",
    "TurnLogContext",
    "enter_turn",
]

LOG_FORMAT = (
    "%(asctime)s %(levelname)s %(name)s "
    "[agent=%(agent)s session=%(session_id)s run=%(run_id)s root=%(root_run_id)s "
    "trace=%(trace_id)s] %(message)s"
)
"""A format naming every id (README, "Logs")."""


def enter_turn(agent: str, namespace: str | None, session_id: str, run_id: str) -> TurnLogContext:
    """Set the turn's ids for the rest of the running task, with no reset: for a turn's
    own task (its context is a copy, gone with the task, so nothing leaks)."""
    # The root: the enclosing turn's (a sub-agent run in this process) or the one a
    # caller in another actor sent with the call; a turn nobody started is its own.
    ctx = TurnLogContext(agent, namespace or "-", session_id, run_id, root_run() or run_id)
    current_turn.set(ctx)
    return ctx


def _annotate(record: logging.LogRecord) -> None:
    ctx = current_turn.get()
    if ctx is None:
        record.agent = record.namespace = record.session_id = "-"
        record.run_id = record.root_run_id = "-"
    else:
        record.agent = ctx.agent
        record.namespace = ctx.namespace
        record.session_id = ctx.session_id
        record.run_id = ctx.run_id
        record.root_run_id = ctx.root_run_id
    ids = tracing.current_ids()
    record.trace_id = ids[0] if ids else "-"


_previous_factory = logging.getLogRecordFactory()


def _record_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
    # The logging module's documented hook for contextual fields: every record made in
    # this process carries the turn's ids, whatever logger or handler it goes through
    # (a library's record logged inside a turn too), so a user's own format string
    # can name %(run_id)s without installing anything.
    record = _previous_factory(*args, **kwargs)
    _annotate(record)
    return record


if not getattr(logging.getLogRecordFactory(), "_thinkray", False):
    _record_factory._thinkray = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(_record_factory)
