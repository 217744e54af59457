"""W1 and W2 of issue 10, with LangGraph + its SQLite checkpointer beside thinkray.
Prints both systems side by side with ratios, each figure next to its target.

    python tests/bench/bench_w1.py [--quick] [--sessions N] [--no-peer] [--skip-actors]

The same as ``thinkray bench`` (the workload lives in the package:
``thinkray.actors.bench``); ``pip install ".[bench]"`` brings the peer. This machine has
2 cores and is noisy: read medians and p95, compare ratios.
"""

from __future__ import annotations

import os

from thinkray.actors.bench import main

if __name__ == "__main__":
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    raise SystemExit(main())
