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


# -- object storage: a real S3 API (moto's server on loopback), started on first use -----


@pytest.fixture(scope="module")
def moto_server():
    """moto's S3 server on a free loopback port (with dummy AWS credentials in the
    environment while the module runs): ``{"server", "port", "endpoint"}``."""
    import os
    import socket

    pytest.importorskip("boto3")
    moto_server_mod = pytest.importorskip("moto.server")
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = moto_server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    state = {"server": server, "port": port, "endpoint": f"http://127.0.0.1:{port}"}
    yield state
    state["server"].stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


_s3_buckets = iter(range(100_000))


def new_s3_root(server: dict) -> str:
    """A fresh bucket on the moto ``server``, as an ``s3://`` storage root."""
    import boto3  # type: ignore[import-untyped]

    bucket = f"root{next(_s3_buckets)}"
    boto3.client("s3", endpoint_url=server["endpoint"]).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/pre?endpoint_override={server['endpoint']}"


@pytest.fixture(params=["local", "file", "s3"])
def any_root(request, tmp_path):
    """A storage root of each kind: a local path, a ``file://`` URI and an ``s3://``
    bucket on the moto server."""
    if request.param == "s3":
        pytest.importorskip("pyarrow")
        return new_s3_root(request.getfixturevalue("moto_server"))
    if request.param == "file":
        pytest.importorskip("pyarrow")
        return f"file://{tmp_path}/store"
    return str(tmp_path / "store")


@pytest.fixture(params=["file", "s3"])
def uri_root(request, tmp_path):
    """An object-store storage root: a ``file://`` URI and an ``s3://`` bucket on the
    moto server."""
    pytest.importorskip("pyarrow")
    if request.param == "s3":
        return new_s3_root(request.getfixturevalue("moto_server"))
    return f"file://{tmp_path}/store"


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
