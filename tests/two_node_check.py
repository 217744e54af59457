"""Run by the two-node tests (``two_node_report`` in tests/conftest.py) in a process of
its own: one cluster of two raylets on this machine (``ray.cluster_utils.Cluster``) for
every check that needs two nodes or an object-store root, instead of a cluster or a Ray
per check file (each start is ~7 CPU-s of GCS, raylets, agents and prestarted workers on
this 2-core machine, and the suite ran four).

    python tests/two_node_check.py WHERE CHECK[,CHECK...]

Checks, run in this order whatever the order asked (the crash removes the worker node,
so it comes last); each catches its own failure, so one check's error does not hide
another's report:

- ``multinode``: tests/multinode_check.py (hibernate on one node, wake on the other);
- ``objectstore-file``, ``objectstore-s3``: tests/objectstore_check.py's rounds;
- ``bridge-file``, ``bridge-s3``: tests/test_bridge_objectstore.py's rounds (the shared
  workspace of an orchestrator on an object-store root);
- ``fence``, ``crash``: tests/durability_check.py's scenarios.

Prints ``REPORT <json>``: each check's report, or the error that ended it. The working
directory is the caller's (the bridge rounds look for folders named after a scheme in it).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

import ray
from ray.cluster_utils import Cluster

from tests.bench._ray import RAY_ENV

# The lease TTL every check's workers see (read by the storage layer from the environment
# the raylets hand their workers): short, so takeovers happen within a test, and long
# enough that an owner on a loaded machine still renews in time.
LEASE_TTL = 4.0

ORDER = (
    "multinode",
    "objectstore-file",
    "objectstore-s3",
    "bridge-file",
    "bridge-s3",
    "fence",
    "crash",
)


def _checks(
    cluster: Cluster, worker: Any, where: str
) -> tuple[dict[str, Callable[[], dict[str, Any]]], list[Any]]:
    """Each check by name (run in this process, connected to ``cluster``), and the list
    that holds the durability scenarios' rig once made (closed by the caller)."""
    from tests import durability_check, multinode_check, objectstore_check
    from tests import test_bridge_objectstore as bridge

    rig: list[Any] = []

    def durability(scenario: str) -> dict[str, Any]:
        if not rig:  # one moto server and store for both scenarios
            rig.append(durability_check.Rig(where, cluster, worker))
        run = {"crash": durability_check.crash, "fence": durability_check.fence}[scenario]
        return dict(run(rig[0]))

    checks: dict[str, Callable[[], dict[str, Any]]] = {
        "multinode": lambda: multinode_check.one_round(os.path.join(where, "multinode")),
        "objectstore-file": lambda: objectstore_check.one_round("file", where),
        "objectstore-s3": lambda: objectstore_check.one_round("s3", where),
        "bridge-file": lambda: bridge.one_round("file", where, "orch-file"),
        "bridge-s3": lambda: bridge.one_round("s3", where, "orch-s3"),
        "fence": lambda: durability("fence"),
        "crash": lambda: durability("crash"),
    }
    return checks, rig


def main(where: str, asked: str) -> int:
    names = set(asked.split(","))
    unknown = names - set(ORDER)
    if unknown:
        raise SystemExit(f"unknown checks {sorted(unknown)}; known: {', '.join(ORDER)}")
    os.environ.update(  # before the cluster starts: its workers inherit it
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        THINKRAY_LEASE_TTL=str(LEASE_TTL),
        THINKRAY_CACHE_DIR=os.path.join(where, "cache"),
    )
    # The suite's Ray settings (tests/bench/_ray.py): without them this cluster's workers
    # ran at nice 15 and reported per-task events nobody reads; 84 CPU-s -> 63 here.
    os.environ.update(RAY_ENV)
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False}
    )
    worker = cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    report: dict[str, Any] = {}
    checks, rig = _checks(cluster, worker, where)
    try:
        for name in ORDER:
            if name not in names:
                continue
            try:
                report[name] = checks[name]()
            except Exception:
                report[name] = {"error": traceback.format_exc()[-3000:]}
        print("REPORT " + json.dumps(report), flush=True)
        return 0
    finally:
        for r in rig:
            r.close()
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
