"""The benchmarks' local Ray: one place that starts it as the product should run."""

from __future__ import annotations

import os
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[2])


def start_local_ray() -> bool:
    """Start a local 2-CPU Ray whose workers import ``tests.*`` (the benchmarks' agents)
    from the repository; False when Ray was already running (it is left as it is).

    The path reaches the workers through the environment the raylet inherits, never a
    ``runtime_env``: with one, Ray starts every worker through a second Python
    (``setup_worker.py``) that imports half of Ray before the worker does, which
    doubles an actor's start (0.84 against 0.44 CPU-s on the 2-core machine) and would
    put that cost into every figure that starts actors."""
    import ray

    if ray.is_initialized():
        return False
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if REPO not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([REPO, *paths])
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    return True
