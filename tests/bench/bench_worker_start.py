"""What a ``runtime_env`` costs each actor start: the CPU seconds a fresh session actor's
process has used by the time it answers its first call, for a local Ray whose workers
get ``PYTHONPATH`` from the raylet's environment, against one that gets it through
``runtime_env={"env_vars": ...}`` (Ray then starts every worker through
``setup_worker.py``, a second Python that imports half of Ray first).

    python tests/bench/bench_worker_start.py [--actors 6]

Each variant runs in its own subprocess (its own Ray); prints the median and p95 CPU-s
per actor process and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[2])
sys.path.insert(0, REPO)

from tests.bench._report import line, pct  # noqa: E402


def _measure(variant: str, actors: int) -> list[float]:  # pragma: no cover - subprocess
    import ray
    from thinkray.actors.session_actor import RemoteSessionActor

    if variant == "runtime_env":
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": REPO}},
        )
    else:
        from tests.bench._ray import start_local_ray

        start_local_ray()
    try:
        handles = [RemoteSessionActor.remote(warm_up=False) for _ in range(actors)]
        infos = ray.get([h.ready.remote() for h in handles])
        pids = [info["pid"] for info in infos]
        return [_cpu_of(pid) for pid in pids]
    finally:
        ray.shutdown()


def _cpu_of(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (an exec keeps the count)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--actors", type=int, default=6)
    args = parser.parse_args(argv)
    figures: dict[str, list[float]] = {}
    for variant in ("environment", "runtime_env"):
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        out = subprocess.run(
            [sys.executable, __file__, "--child", variant, str(args.actors)],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        ).stdout
        figures[variant] = json.loads(out.strip().splitlines()[-1])
    print(f"CPU-s per session actor process at its first answer ({args.actors} actors each)")
    for variant, values in figures.items():
        median, p95 = statistics.median(values), pct(values, 0.95)
        line(f"  PYTHONPATH through {variant}", f"{median:.2f} / {p95:.2f} s (p50 / p95)")
    ratio = statistics.median(figures["runtime_env"]) / statistics.median(figures["environment"])
    line("  runtime_env / environment", f"{ratio:.2f}x")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(_measure(sys.argv[2], int(sys.argv[3]))))
        sys.exit(0)
    sys.exit(main())
