"""A local Ray whose workers import ``tests.*`` from the repository: the benchmarks'
and the test suite's (tests/conftest.py), started as the product should run."""

from __future__ import annotations

import os
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[2])


def start_local_ray() -> bool:
    """Start a local 2-CPU Ray whose workers import ``tests.*`` (the agents of the tests
    and benchmarks) from the repository; False when Ray was already running (it is left
    as it is).

    The path reaches the workers through the environment the raylet inherits (set for
    the start only; this process's own is restored after), never a ``runtime_env``: with
    one, Ray starts every worker through a second Python (``setup_worker.py``) that
    imports much of Ray first. A session actor's process then uses 1.1-1.3 CPU-s by its
    first answer instead of 0.8-1.0 here (``tests/bench/bench_worker_start.py``), a cost
    in every figure that starts actors and in each of the suite's ~650 workers."""
    import ray

    if ray.is_initialized():
        return False
    before = {key: os.environ.get(key) for key in (*RAY_ENV, "PYTHONPATH")}
    os.environ.update(RAY_ENV)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, before["PYTHONPATH"]) if p)
    try:
        # "local": a Ray of its own, never another instance on the machine
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    finally:  # subprocesses started later see the environment they were given
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return True


# Read from the environment by the processes the start launches:
RAY_ENV = {
    # Ray runs its workers at nice 15, so that a busy node's workers yield to the raylet
    # and the GCS. Here they also yield to every nice-0 process: the test processes
    # beside them, a benchmark's driver and its peer. Under such load a session actor
    # took 8-11 s to start instead of ~1 s (its share of a core: ~3% against a busy
    # nice-0 process), and a first turn overran a test's wait. Workers run at the
    # priority of the processes they compete with.
    "RAY_worker_niceness": "0",
    # Ray's log monitor lists the session's log folder every 0.1 s while it holds fewer
    # than a thousand files, to forward workers' output to drivers; these drivers ask
    # for none (log_to_driver=False) and the suite starts ~650 workers with files of
    # their own. It lists them every 5 s (read at its start: ray/_private/log_monitor.py).
    "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0",
    "LOG_NAME_UPDATE_INTERVAL_S": "5",
    # Bookkeeping no test or benchmark reads, in every process at every call: per-task
    # state events reported to the GCS (for the dashboard's task views; 0 turns them
    # off) and the event loops' handler statistics. Off: tests/test_actors.py used
    # 78-82 CPU-s instead of 84-89.
    "RAY_task_events_report_interval_ms": "0",
    "RAY_event_stats": "0",
}
