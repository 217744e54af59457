"""Multi-node: hibernate on one raylet, wake on the other (ray.cluster_utils.Cluster)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import json_report

pytestmark = pytest.mark.ray
REPO = Path(__file__).resolve().parent.parent


def test_hibernate_on_one_node_wake_on_the_other(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "multinode_check.py"), str(tmp_path / "shared")],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=str(REPO),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json_report(proc.stdout)
    assert len(report["nodes"]) == 2
    assert report["first_node"] != report["second_node"]
    assert report["serving_node"] == report["second_node"]
    assert report["same_history"] and report["messages"] == 4


def test_cluster_yaml_is_a_valid_launcher_config():
    import yaml
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((REPO / "cluster.yaml").read_text())
    validate_config(prepare_config(config))
    assert config["provider"]["type"] == "local"
    assert any("pip install /opt/thinkray" in c for c in config["setup_commands"])
