"""W1 and W2 of issue 10, with LangGraph + its SQLite checkpointer beside thinkray.
Prints both systems side by side with ratios, each figure next to its target.

    python tests/bench/bench_w1.py [--quick] [--sessions N] [--no-peer] [--skip-actors]
    python tests/bench/bench_w1.py --write-path [--rounds N] [--profile]   (issue 23)

The workload lives beside this script (``tests/bench/w1.py``, ``workloads.py``,
``langgraph_peer.py``), not in the package; ``pip install ".[bench]"`` brings the peer. This machine has
2 cores and is noisy: read medians and p95, compare ratios.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo, for tests.bench

from tests.bench.w1 import main  # noqa: E402

if __name__ == "__main__":
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if "--write-path" in sys.argv:  # the write path's rows only (tests/bench/write_path.py)
        from tests.bench.write_path import main as write_path

        raise SystemExit(write_path([a for a in sys.argv[1:] if a != "--write-path"]))
    raise SystemExit(main())
