"""Shared fixtures. Ray fixtures live in tests/ray_support.py and start Ray lazily,
once per test session, only when a Ray test asks for it."""

from __future__ import annotations

import contextlib

import pytest
from thinkray.runtime.models.testing import ScriptedModel
from thinkray.storage.session_store import DuckDBSessionStore


@pytest.fixture
def store(tmp_path):
    s = DuckDBSessionStore(tmp_path / "agent.duckdb")
    yield s
    s.close()


@pytest.fixture
def model():
    return ScriptedModel()


class Collector:
    """A StreamCallback that records what it was given."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.done = 0
        self.errors: list[str] = []

    def on_event(self, chunk: dict) -> None:
        self.events.append(chunk)

    def on_done(self) -> None:
        self.done += 1

    def on_error(self, error: str) -> None:
        self.errors.append(error)

    def types(self) -> list[str]:
        return [c["type"] for c in self.events]


@pytest.fixture
def collector():
    return Collector()


# -- Ray: one local instance per test session, started on first use ---------------------

_REPO = __import__("pathlib").Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def ray_local():
    import os

    import ray

    if not ray.is_initialized():
        ray.init(
            address="local",  # the suite's own Ray, never another instance on the machine
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={
                "env_vars": {
                    "PYTHONPATH": str(_REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")
                }
            },
        )
    yield ray
    ray.shutdown()


@pytest.fixture
def namespace_factory(ray_local, tmp_path):
    """Build AgentNamespaces that are shut down (actors stopped) after the test."""
    from thinkray.actors.namespace import AgentNamespace

    made = []
    counter = iter(range(10_000))

    def make(agent_cls=None, **kwargs):
        from tests.agents import ScriptAgent

        kwargs.setdefault("storage_root", str(tmp_path / "root"))
        kwargs.setdefault("pool_size", 2)
        name = kwargs.pop("name", f"t{next(counter)}-{tmp_path.name[-12:]}".replace("_", "-"))
        ns = AgentNamespace(name, agent_cls or ScriptAgent, **kwargs)
        made.append(ns)
        return ns

    yield make
    for ns in made:
        with contextlib.suppress(Exception):
            ns.shutdown()
