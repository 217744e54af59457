"""Multi-node: hibernate on one raylet, wake on the other (tests/multinode_check.py, in
tests/two_node_check.py's cluster), and the cluster launcher's config."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import round_of

pytestmark = pytest.mark.ray
REPO = Path(__file__).resolve().parent.parent


@pytest.mark.xdist_group("two-nodes")  # one worker: one cluster (tests/two_node_check.py)
def test_hibernate_on_one_node_wake_on_the_other(two_node_report):
    report = round_of(two_node_report[0], "multinode")
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
