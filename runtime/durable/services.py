"""An agent's durable services: fibers, schedules and background jobs.

They share one trait: their state is rows in the agent's database, and a wake resumes
them (interrupted fibers restart from their checkpoint, due schedules run). The agent
owns one :class:`DurableServices`; the session actor asks it whether anything is
running (``has_pending_work``: never hibernate then) and when to wake the agent next.
"""

from __future__ import annotations

from typing import Any

from thinkray.runtime.durable.fibers import FiberManager
from thinkray.runtime.durable.schedules import Scheduler
from thinkray.runtime.errors import ThinkrayError
from thinkray.storage.fibers import FiberStore

__all__ = ["DurableServices", "DurableUnavailableError"]


class DurableUnavailableError(ThinkrayError, RuntimeError):
    """Fibers or schedules were used on an agent whose store has no database."""


class DurableServices:
    """Fibers, schedules and jobs of one agent (``host``: the agent, whose methods
    fibers and schedules call by name).

    ``fiber_store`` is None for a store without a database: every fiber or schedule
    call then raises :class:`DurableUnavailableError`."""

    def __init__(self, fiber_store: FiberStore | None, host: Any, *, recover: bool) -> None:
        self.host = host
        self.fibers: FiberManager | None = None
        self.scheduler: Scheduler | None = None
        if fiber_store is not None:
            self.fibers = FiberManager(fiber_store, host, recover=recover)
            self.scheduler = Scheduler(fiber_store, host)

    def fiber_manager(self) -> FiberManager:
        """The fiber manager; raises :class:`DurableUnavailableError` without a database."""
        if self.fibers is None:
            raise DurableUnavailableError(
                "fibers need a store with a database (DuckDBSessionStore)"
            )
        return self.fibers

    def schedules(self) -> Scheduler:
        """The scheduler; raises :class:`DurableUnavailableError` without a database."""
        if self.scheduler is None:
            raise DurableUnavailableError(
                "schedules need a store with a database (DuckDBSessionStore)"
            )
        return self.scheduler

    async def start(self) -> None:
        """Resume interrupted fibers and start the schedule timer (after a wake)."""
        if self.fibers is not None:
            await self.fibers.start()
        if self.scheduler is not None:
            self.scheduler.start()

    def has_pending_work(self) -> bool:
        """True while fibers, due schedules or background jobs run."""
        from thinkray.runtime.agents.worker import JobRegistry

        fibers = self.fibers is not None and self.fibers.has_work
        scheduled = self.scheduler is not None and self.scheduler.busy
        jobs = JobRegistry.existing(self.host)
        return bool(fibers or scheduled or (jobs is not None and jobs.has_running()))

    def next_alarm_at(self) -> float | None:
        """Epoch seconds of the next due schedule, or None."""
        return self.scheduler.next_due_at() if self.scheduler is not None else None

    async def aclose(self) -> None:
        """Stop fibers, timers and jobs without marking them finished (hibernation)."""
        from thinkray.runtime.agents.worker import JobRegistry

        if self.fibers is not None and not self.fibers.closed:
            await self.fibers.close()
        if self.scheduler is not None:
            await self.scheduler.close()
        jobs = JobRegistry.existing(self.host)
        if jobs is not None:
            await jobs.aclose()

    def stop(self) -> None:
        """Stop the schedule timer at once (synchronous close)."""
        if self.scheduler is not None:
            self.scheduler.stop()
