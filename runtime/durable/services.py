"""An agent's durable services: fibers, schedules and background jobs.

They share one trait: their state is rows in the agent's database, and a wake resumes
them (interrupted fibers restart from their checkpoint, due schedules run, jobs the
dead incarnation left ``running`` become ``interrupted`` — reported to the registry's
push listeners as those jobs' outcome). The agent owns one :class:`DurableServices`;
the session actor asks it whether anything is running (``has_pending_work``: never
hibernate then) and when to wake the agent next.
"""

from __future__ import annotations

import logging
from typing import Any

from thinkray.runtime.durable.fibers import FiberManager
from thinkray.runtime.durable.jobs import JobRegistry
from thinkray.runtime.durable.schedules import Scheduler
from thinkray.storage.protocols import FiberStore

__all__ = ["DurableServices"]

log = logging.getLogger("thinkray.durable")


class DurableServices:
    """Fibers, schedules and jobs of one agent (``host``: the agent, whose methods
    fibers and schedules call by name), over the fiber store of the agent's database
    (``store.stores().fibers()``)."""

    def __init__(self, fiber_store: FiberStore, host: Any, *, recover: bool) -> None:
        self.host = host
        self.fibers = FiberManager(fiber_store, host, recover=recover)
        self.scheduler = Scheduler(fiber_store, host)

    def fiber_manager(self) -> FiberManager:
        """The fiber manager."""
        return self.fibers

    def schedules(self) -> Scheduler:
        """The scheduler."""
        return self.scheduler

    def jobs(self) -> JobRegistry:
        """The agent's background jobs (async tools), created on first use."""
        return JobRegistry.for_agent(self.host)

    async def start(self) -> None:
        """Resume interrupted fibers, start the schedule timer and open the job
        registry (after a wake): jobs found ``running`` belonged to the dead
        incarnation and become ``interrupted`` now, not when an async tool is next
        used."""
        await self.fibers.start()
        self.scheduler.start()
        try:
            self.jobs()
        except Exception:  # never fails a wake: the registry is opened again on first use
            log.exception("opening the job registry at wake failed")

    def has_pending_work(self) -> bool:
        """True while fibers, due schedules or background jobs run."""
        jobs = JobRegistry.existing(self.host)
        return bool(
            self.fibers.has_work or self.scheduler.busy or (jobs is not None and jobs.has_running())
        )

    def next_alarm_at(self) -> float | None:
        """Epoch seconds of the next due schedule, or None."""
        return self.scheduler.next_due_at()

    async def aclose(self) -> None:
        """Stop fibers, timers and jobs without marking them finished (hibernation)."""
        if not self.fibers.closed:
            await self.fibers.close()
        await self.scheduler.close()
        jobs = JobRegistry.existing(self.host)
        if jobs is not None:
            await jobs.aclose()

    def stop(self) -> None:
        """Synchronous close (``Think.close``, right before the database closes): cancel
        the fiber tasks, the fiber recovery pass and the schedule timer at once."""
        self.fibers.stop()
        self.scheduler.stop()
