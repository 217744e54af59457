"""Shared fixtures. The Ray fixtures (``ray_local``, ``namespace_factory``) start Ray
lazily, once per test session, only when a Ray test asks for it."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import httpx
import pytest
from thinkray.runtime.models.testing import ScriptedModel
from thinkray.storage.session_store import DuckDBSessionStore

# Ray turns token auth on in the environment of the process that starts it (the token
# is ~/.ray/auth_token); the other xdist workers join the same Ray (see ray_local), so
# every process of the run says so from the start, before anything imports Ray.
__import__("os").environ.setdefault("RAY_AUTH_MODE", "token")

# httpx's module functions wait 5 s by default; the first request to an ingress binds a
# cold agent, which a loaded 2-core machine can take longer than that to do. Tests that
# name no timeout get 60 s: a hang still fails, a slow machine no longer does.
HTTP_TIMEOUT = 60.0


# Each of those calls makes a client, and each client an SSL context with the CA bundle
# loaded (~20 ms of CPU, for loopback http that never uses it: the schema fuzzer alone
# made ~800, 16 CPU-s of the run). They all verify with one default context instead.
_SSL_CONTEXT: list[Any] = []


def _default_ssl_context() -> Any:
    if not _SSL_CONTEXT:
        import ssl

        import certifi

        _SSL_CONTEXT.append(ssl.create_default_context(cafile=certifi.where()))
    return _SSL_CONTEXT[0]


def _patient(call):
    @functools.wraps(call)
    def patient(*args, **kwargs):
        kwargs.setdefault("timeout", HTTP_TIMEOUT)
        kwargs.setdefault("verify", _default_ssl_context())
        return call(*args, **kwargs)

    return patient


for _verb in ("request", "stream", "get", "post", "put", "patch", "delete", "head", "options"):
    setattr(httpx, _verb, _patient(getattr(httpx, _verb)))


def _verified(init):
    @functools.wraps(init)
    def verified(self, *args, **kwargs):
        kwargs.setdefault("verify", _default_ssl_context())
        init(self, *args, **kwargs)

    return verified


for _client in (httpx.Client, httpx.AsyncClient):
    _client.__init__ = _verified(_client.__init__)  # type: ignore[method-assign]


def pytest_configure(config):
    """The run's controller compiles the tests' modules once: the xdist workers, the
    Ray workers (their agents are ``tests.*`` classes) and the checks' drivers import
    them, and with ``PYTHONDONTWRITEBYTECODE`` set (as on this machine) each of those
    ~700 processes compiled the modules it imports from source."""
    if hasattr(config, "workerinput"):  # an xdist worker: the controller did it
        return
    import compileall
    from pathlib import Path

    compileall.compile_dir(Path(__file__).parent, quiet=2)
    _write_rewritten_test_modules(config, Path(__file__).parent)


def _write_rewritten_test_modules(config, folder) -> None:
    """Write pytest's cache of the test modules with their asserts rewritten, once, in
    the controller. pytest writes that cache only when bytecode may be written, so with
    ``PYTHONDONTWRITEBYTECODE`` set every xdist worker rewrote all ~190 test modules on
    every run: ~4.5 of a worker's ~11 s of collection. The workers read the cache even
    then (pytest checks for one before rewriting). This uses pytest's own rewrite and
    cache functions (private: on a pytest without them, the workers rewrite as before)."""
    try:
        from _pytest.assertion.rewrite import (
            PYC_TAIL,
            _read_pyc,
            _rewrite_test,
            _write_pyc,
            assertstate_key,
            get_cache_dir,
        )
    except ImportError:
        return
    state = config.stash.get(assertstate_key, None)
    if state is None:  # --assert=plain
        return
    for source in folder.rglob("*.py"):
        if not (source.name.startswith("test_") or source.name == "conftest.py"):
            continue
        if any(part.startswith(".") for part in source.relative_to(folder).parts):
            continue  # node packages' caches and the like
        cache = get_cache_dir(source)
        pyc = cache / (source.name[:-3] + PYC_TAIL)
        if _read_pyc(source, pyc, state.trace) is not None:
            continue  # up to date
        with contextlib.suppress(OSError, SyntaxError):
            cache.mkdir(parents=True, exist_ok=True)
            stat, code = _rewrite_test(source, config)
            _write_pyc(state, code, stat, pyc)


@pytest.fixture
def store(tmp_path):
    s = DuckDBSessionStore(tmp_path / "agent.duckdb")
    yield s
    s.close()


# -- object storage: a real S3 API (moto's server on loopback), started on first use -----


@pytest.fixture(scope="session")
def moto_server():
    """moto's S3 server on a free loopback port (with dummy AWS credentials in the
    environment while the session runs; each test takes its own bucket): ``{"server", "port", "endpoint"}``."""
    import os

    pytest.importorskip("boto3")
    pytest.importorskip("moto.server")
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    from tests.helpers import free_port, start_moto

    port = free_port()
    server = start_moto(port)
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


# -- two nodes: one cluster for every check that needs one ---------------------------------

# The checks of tests/two_node_check.py each test file's tests read (its xdist group,
# "two-nodes", keeps them in one worker, so the session fixture below runs once).
_TWO_NODE_CHECKS = {
    "test_multinode.py": ("multinode",),
    "test_objectstore.py": ("objectstore-file", "objectstore-s3"),
    "test_bridge_objectstore.py": ("bridge-file", "bridge-s3"),
    "test_durability.py": ("fence", "crash"),
}


# The check runs every round on one cluster: ~80 s alone, 220-300 s while the other
# xdist workers load the 2 cores. Its first test's setup pays all of it, so those tests
# get the check's own limit instead of pytest-timeout's 300 s (which a loaded run hit).
TWO_NODE_TIMEOUT = 900


@pytest.fixture(scope="session")
def two_node_report(request, tmp_path_factory):
    """``(report, cwd)``: tests/two_node_check.py's reports (one cluster of two raylets
    for every check the run's tests read; a check file of its own started a cluster or
    a Ray each, ~7 CPU-s apiece) and the working directory it ran in."""
    from tests.helpers import run_check

    for module in ("pyarrow", "boto3", "moto.server"):
        pytest.importorskip(module)
    files = {item.path.name for item in request.session.items}
    checks = [c for name, cs in _TWO_NODE_CHECKS.items() if name in files for c in cs]
    where = tmp_path_factory.mktemp("two-nodes")
    cwd = where / "cwd"
    cwd.mkdir()
    report = run_check(
        "two_node_check.py",
        str(where),
        ",".join(checks),
        timeout=TWO_NODE_TIMEOUT,
        cwd=str(cwd),
        marker="REPORT ",
    )
    return report, cwd


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

# What the suite started, printed at its end (summed over xdist workers): the costs
# that decide its time on 2 cores are process starts, not the tests' own work.
_STARTS = {"ray_inits": 0, "ray_worker_processes": 0, "namespaces": 0, "pool_spares": 0}
# Ray worker processes started per test file (THINKRAY_TEST_STARTS=1 prints them: where
# the shared Ray's time goes, a count that a loaded machine does not blur).
_FILE_STARTS: dict[str, int] = {}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """Under ``-n 4 --dist loadgroup`` (pyproject.toml's addopts) the xdist workers all
    drive one shared session Ray (see ``ray_local``): the Ray tests of a file run in
    one worker, one after another (module fixtures stay shared), and the files spread
    over the workers beside the storage and unit tests. Ray Serve is one per cluster,
    so every file that runs it goes to one worker. (One Ray test group in one worker
    left the other idle for the last ~9 of 22 minutes, and a Ray test file keeps
    only ~55% of the 2 cores busy: its tests mostly wait for actors.)"""
    serve_files: dict[str, bool] = {}
    for item in items:
        if "two_node_report" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(TWO_NODE_TIMEOUT))
        if "ray_local" not in getattr(item, "fixturenames", ()):
            continue
        path = str(item.path)
        if path not in serve_files:
            serve_files[path] = _runs_serve(item.path)
        group = "ray-serve" if serve_files[path] else f"ray:{item.path.name}"
        item.add_marker(pytest.mark.xdist_group(group))


def _runs_serve(path) -> bool:
    """Whether a test file starts Ray Serve, read from its source (a new file is grouped
    without a list to keep). The ingress tests that run the app in-process (uvicorn in
    a thread, tests/ingress_support.py) are not Serve: their namespaces are named per
    test, so their files spread over the workers like the other Ray files (in one Serve
    group they were ~460 s of the run in one worker, one after another)."""
    source = path.read_text(encoding="utf-8")
    return "from ray import serve" in source


def pytest_collection_finish(session):
    """Move what collection built (~340,000 objects: every module, test item and
    fixture definition, all alive until the run ends) out of the cyclic GC's reach, so
    the full collections that the tests' allocations set off during the run, and the
    ones at the run's end, do not walk it each time (~0.2 s per walk here)."""
    import gc

    gc.freeze()


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand the counts to the controller
        workeroutput["thinkray_starts"] = dict(_STARTS)
        workeroutput["thinkray_file_starts"] = dict(_FILE_STARTS)
        workeroutput["thinkray_class_starts"] = dict(_CLASS_STARTS)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: pytest without xdist has none
def pytest_testnodedown(node, error):
    for key, value in getattr(node, "workeroutput", {}).get("thinkray_starts", {}).items():
        _STARTS[key] += value
    for key, value in getattr(node, "workeroutput", {}).get("thinkray_file_starts", {}).items():
        _FILE_STARTS[key] = _FILE_STARTS.get(key, 0) + value
    for key, value in getattr(node, "workeroutput", {}).get("thinkray_class_starts", {}).items():
        _CLASS_STARTS[key] = _CLASS_STARTS.get(key, 0) + value


def pytest_terminal_summary(terminalreporter):
    if any(_STARTS.values()):
        terminalreporter.write_line(
            "started: " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in _STARTS.items())
        )
    if __import__("os").environ.get("THINKRAY_TEST_STARTS") == "1":
        for path, count in sorted(_FILE_STARTS.items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(f"  {count:4d} ray worker processes  {path}")
        for name, count in sorted(_CLASS_STARTS.items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(f"  {count:4d} actors of class {name}")


def _ray_workers_so_far() -> int | None:
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    with contextlib.suppress(Exception):
        return _count_ray_workers()
    return None


@pytest.fixture(scope="module", autouse=True)
def _count_file_starts(request):
    before = _ray_workers_so_far()
    yield
    after = _ray_workers_so_far()
    if after is not None:
        path = request.node.nodeid
        _FILE_STARTS[path] = _FILE_STARTS.get(path, 0) + after - (before or 0)


# Actors started per class (THINKRAY_TEST_STARTS=1): which kind of process the run pays for.
_CLASS_STARTS: dict[str, int] = {}


def _count_actor_classes() -> None:
    """Every actor the session's Ray created, dead or alive, counted by class (the GCS
    keeps the dead ones' records)."""
    from ray._private import state

    for record in state.actors().values():
        name = record.get("ActorClassName") or record.get("class_name") or "?"
        _CLASS_STARTS[name] = _CLASS_STARTS.get(name, 0) + 1


def _count_ray_workers() -> int:
    """Worker processes the session's Ray started (each writes its own core-worker log)."""
    import ray

    node = ray._private.worker._global_node
    logs = __import__("pathlib").Path(node.get_session_dir_path()) / "logs"
    return len(list(logs.glob("python-core-worker-*.log")))


class _SharedRay:
    """One local Ray for every xdist worker of the run. The first worker to need it
    starts it and writes its address in the run's shared temporary folder; the others
    connect to it. Each writes its pid in and out of a users file; the one that started
    it shuts it down once no live process uses it (a worker that crashed counts as
    gone; a worker that needs Ray after that starts another). All under a file lock:
    two starts at once on a loaded 2-core machine overran Ray's fixed 30 s wait for
    its raylet."""

    def __init__(self, tmp_path_factory) -> None:
        folder = tmp_path_factory.getbasetemp().parent
        self.lock = folder / "thinkray-ray.lock"
        self.address = folder / "thinkray-ray.address"
        self.users = folder / "thinkray-ray.users"
        self.owner = False

    @contextlib.contextmanager
    def _locked(self):
        import fcntl

        with open(self.lock, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _users(self) -> set[int]:
        """The pids in the users file that are still running."""
        import os

        text = self.users.read_text() if self.users.exists() else ""
        alive = set()
        for pid in map(int, text.split()):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            alive.add(pid)
        return alive

    def _write(self, pids: set[int]) -> None:
        self.users.write_text(" ".join(map(str, sorted(pids))))

    def join(self, ray) -> None:
        import os

        with self._locked():
            if self.address.exists():
                try:
                    _init_ray(ray, address=self.address.read_text())
                except Exception:  # its owner shut it down meanwhile: start another
                    self.address.unlink(missing_ok=True)
            if not ray.is_initialized():
                _init_ray(ray)
                self.owner = True
                self.address.write_text(ray.get_runtime_context().gcs_address)
                self._write(set())
            self._write(self._users() | {os.getpid()})

    def leave(self, ray, last_words) -> None:
        """Count out; the owner waits for the other workers, calls ``last_words``, then
        shuts the Ray down."""
        import os
        import time

        while True:
            with self._locked():
                left = self._users() - {os.getpid()}
                self._write(left)
                if not self.owner:
                    ray.shutdown()  # disconnects: the owner's process keeps the Ray
                    return
                if not left:
                    self.address.unlink(missing_ok=True)
                    break
            time.sleep(0.5)  # another worker's tests still use it
        last_words()
        ray.shutdown()


@pytest.fixture(scope="session")
def ray_local(tmp_path_factory):
    import os

    import ray

    shared = _SharedRay(tmp_path_factory) if os.environ.get("PYTEST_XDIST_WORKER") else None
    if not ray.is_initialized():
        if shared is not None:
            shared.join(ray)
        else:
            _init_ray(ray)
        if shared is None or shared.owner:
            _STARTS["ray_inits"] += 1
    yield ray

    def count_workers() -> None:
        with contextlib.suppress(Exception):
            _STARTS["ray_worker_processes"] += _count_ray_workers()
        if os.environ.get("THINKRAY_TEST_STARTS") == "1":
            with contextlib.suppress(Exception):
                _count_actor_classes()

    if shared is not None:
        shared.leave(ray, count_workers)  # the owner counts every worker's starts
    else:
        count_workers()
        ray.shutdown()


def _init_ray(ray, address: str | None = None) -> None:
    """Connect to (``address``, the Ray another xdist worker started) or start the
    suite's Ray (``tests.bench._ray.start_local_ray``: its workers find the repository
    through the raylet's environment, not a ``runtime_env``)."""
    if address is not None:
        ray.init(address=address, log_to_driver=False)
        return
    from tests.bench._ray import start_local_ray

    start_local_ray()


# A test's namespace keeps no spare and skips the warm-up turn: each spare is a process
# importing Ray, DuckDB and thinkray (~0.8 CPU-s here), and the spare a namespace
# starts after its first bind was almost never used before the test ended. Tests of the
# pool's policy or of the warm-up pass their own pool_size / warm_up. The variables set
# other defaults, to measure what they cost (THINKRAY_TEST_POOL_SIZE=1 was the default
# until the suite shared one Ray; THINKRAY_TEST_POOL_SIZE=2 THINKRAY_TEST_WARM_UP=1 the
# one before).
TEST_POOL_SIZE = int(__import__("os").environ.get("THINKRAY_TEST_POOL_SIZE", "0"))
TEST_WARM_UP = __import__("os").environ.get("THINKRAY_TEST_WARM_UP", "0") == "1"
# Nor does it start a spare for demand (grow_pool=False) unless the test sets the pool:
# the first bind of every namespace is a miss, and the spare the miss asked for started
# whenever the node looked calm, then sat unused until the test ended (a loaded run
# seldom looks calm: ~10 of ~370 session actors). THINKRAY_TEST_GROW_POOL=1 restores
# the product's default.
TEST_GROW_POOL = __import__("os").environ.get("THINKRAY_TEST_GROW_POOL", "0") == "1"
# THINKRAY_TEST_PLACEMENT=hosts runs every namespace a test makes on agent hosts (the
# actor-level suites' conformance under both placements; tests/test_hosts.py runs a
# subset under hosts in every run).
TEST_PLACEMENT = __import__("os").environ.get("THINKRAY_TEST_PLACEMENT", "dedicated")


def _test_defaults(kwargs: dict) -> None:
    """Fill in a test namespace's pool and placement options (see above) where the
    test names none of its own."""
    if not {"pool_size", "max_pool", "grow_pool"} & kwargs.keys():
        kwargs["grow_pool"] = TEST_GROW_POOL  # a test of the pool sets its own
    kwargs.setdefault("pool_size", TEST_POOL_SIZE)
    kwargs.setdefault("warm_up", TEST_WARM_UP)
    kwargs.setdefault("placement", TEST_PLACEMENT)


@pytest.fixture
def namespace_test_defaults(monkeypatch):
    """Every AgentNamespace this process makes during the test gets the tests' pool
    and placement defaults (as namespace_factory's do), for code that builds its own
    namespaces, such as the README's examples."""
    from thinkray.actors.namespace import AgentNamespace

    original = AgentNamespace.__init__

    def init(self, *args, **kwargs):
        _test_defaults(kwargs)
        original(self, *args, **kwargs)

    monkeypatch.setattr(AgentNamespace, "__init__", init)


def _namespace_maker(folder, made: list):
    """``make(agent_cls=None, **kwargs)``: an AgentNamespace with the tests' defaults, its
    storage under ``folder``, appended to ``made`` (for the fixture to shut down)."""
    from thinkray.actors.namespace import AgentNamespace

    counter = iter(range(10_000))

    def make(agent_cls=None, **kwargs):
        from tests.agents import ScriptAgent

        kwargs.setdefault("storage_root", str(folder / "root"))
        _test_defaults(kwargs)
        # The xdist worker in the name: every worker's tests share one Ray.
        worker = __import__("os").environ.get("PYTEST_XDIST_WORKER", "")
        tail = folder.name[-12:]
        name = kwargs.pop("name", f"t{next(counter)}{worker}-{tail}".replace("_", "-"))
        ns = AgentNamespace(name, agent_cls or ScriptAgent, **kwargs)
        _STARTS["namespaces"] += 1
        _STARTS["pool_spares"] += kwargs["pool_size"]
        made.append(ns)
        return ns

    return make


def _shut_down(made: list) -> None:
    for ns in made:
        with contextlib.suppress(Exception):
            ns.shutdown()


@pytest.fixture
def namespace_factory(ray_local, tmp_path):
    """Build AgentNamespaces that are shut down (actors stopped) after the test."""
    made: list = []
    yield _namespace_maker(tmp_path, made)
    _shut_down(made)


@pytest.fixture(scope="module")
def module_namespace_factory(ray_local, tmp_path_factory, request):
    """Build AgentNamespaces that the module's tests share, shut down after its last
    test. A namespace's directory is a process (~0.7 CPU-s to start here), and so is
    each agent's actor; tests that each use an agent of their own name in one shared
    namespace start one directory, and an agent hibernated at its test's end gives its
    actor back to the pool for the next test's agent to bind."""
    made: list = []
    folder = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1][-12:])
    yield _namespace_maker(folder, made)
    _shut_down(made)


@pytest.fixture(scope="module")
def _module_namespace(module_namespace_factory):
    return module_namespace_factory()


@pytest.fixture
def shared_namespace(_module_namespace):
    """The module's namespace of default agents, for tests that each use agents of their
    own names and look at nothing namespace-wide but them. Its agents hibernate after
    each test, so the next test's agents bind their actors instead of starting more."""
    from tests.helpers import hibernated_after

    yield from hibernated_after(_module_namespace)


@pytest.fixture(scope="module")
def _module_ingress_apps(ray_local, tmp_path_factory, request):
    from tests.ingress_support import IngressApps

    apps = IngressApps(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1][-12:]))
    yield apps
    apps.close()


@pytest.fixture
def ingress_apps(_module_ingress_apps):
    """The module's ingress apps, one per configuration (tests/ingress_support.py's
    IngressApps), for tests that each use agents of their own names; their agents
    hibernate after each test."""
    yield _module_ingress_apps
    _module_ingress_apps.hibernate_all()
