"""``thinkray serve --storage-root``: an object-store URI is kept as given (making it
"absolute" turned ``s3://bucket/p`` into ``<cwd>/s3:/bucket/p``); a local path is made
absolute. Only the config building: no Ray, no network."""

from __future__ import annotations

import argparse
import os

import pytest
from thinkray.actors.cli import serve_config


@pytest.fixture(autouse=True)
def _tokens(monkeypatch):
    monkeypatch.setenv("THINKRAY_TOKENS", "alice=t1-not-a-real-token")


def _args(root: str | None) -> argparse.Namespace:
    return argparse.Namespace(storage_root=root, agent=None, token_file=None, cors_origin=None)


@pytest.mark.parametrize(
    "root",
    [
        "s3://bucket/prefix",
        "s3://bucket/prefix?endpoint_override=http://127.0.0.1:9000",
        "file:///srv/thinkray",
    ],
)
def test_a_uri_storage_root_is_kept_as_given(root, monkeypatch):
    config, generated = serve_config(_args(root))
    assert config.storage_root == root and generated is None
    monkeypatch.setenv("THINKRAY_STORAGE_ROOT", root)
    assert serve_config(_args(None))[0].storage_root == root


def test_a_local_storage_root_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config, _ = serve_config(_args("data/agents"))
    assert config.storage_root == os.path.join(str(tmp_path), "data", "agents")


def test_without_agent_options_the_demo_agent_is_served_at_chat(tmp_path):
    """``thinkray serve`` with no ``--agent``: the demo's agent class at ``/agents/chat``
    (tests/test_ingress_serve.py chats with it end to end, named explicitly there beside
    a class of the working directory)."""
    config, _ = serve_config(_args(str(tmp_path)))
    assert list(config.agents) == ["chat"]
    assert config.agents["chat"].agent_cls == "thinkray.actors.demo:DemoAgent"
