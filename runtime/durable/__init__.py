"""Durable services of an agent: fibers, schedules and background jobs (rows in its
database, resumed on wake).

The package imports nothing itself (a session actor loads only the modules it uses);
``__all__`` names its modules, so ``from thinkray.runtime.durable import *`` loads them.
"""

__all__ = ["fibers", "jobs", "schedules", "services"]
