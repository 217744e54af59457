"""Client side: ``AgentNamespace`` (the Durable Object namespace binding) and
``AgentHandle`` (a typed stub addressed by name).

A handle exposes the agent's ``@remote`` methods with their own signatures::

    ns = AgentNamespace("chat", Assistant, storage_root=root)
    agent = ns.get("user-42")
    info = agent.create_session.remote("Support").result()        # sync code
    result = await agent.chat.remote("hi", session_id=info.id)      # async code
    for chunk in agent.stream_chat.remote("more", session_id=info.id):
        ...

``handle.<method>.remote(...)`` returns an :class:`~thinkray.actors.response.AgentResponse`
(awaitable, or ``.result(timeout_s=...)``); a stream method an
:class:`~thinkray.actors.response.AgentResponseStream` (``for`` or ``async for``). A
method that is not remote-callable, or arguments that don't fit its signature, raise
:class:`~thinkray.actors.errors.RemoteCallError` before anything is sent.

For a type checker ``ns.get(name)`` is ``AgentHandle[A] | type[A]`` (Ray's
``ActorProxy`` pattern): on the class, a ``@remote`` method's ``.remote`` carries the
method's signature, so ``agent.branch.remote(session_id, 3)`` is flagged.

A handle caches the actor its agent is bound to and re-resolves through the directory
when that actor answers that it no longer hosts the agent (it hibernated) or died (the
directory replaces it and the agent rebinds). Handles are serializable: pass them to
other actors. Operations on the agent's *placement* — hibernate, wake, where — are the
namespace's: ``ns.hibernate(name)``, ``ns.wake(name)``, ``ns.where(name)``.

``AgentNamespace(..., directories=K)`` spreads the names over K directory actors
(:mod:`thinkray.actors.directory` explains the sharding, how the pool and the live cap
divide, and how a crashed directory is replaced and adopts the live agents). A handle
talks to its name's shard only; ``stats()``, ``hibernate_all()`` and ``shutdown()``
cover every shard, and ``connect()`` finds them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
import time
from collections import OrderedDict
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeAlias, TypeVar, cast

import ray
from ray.actor import ActorHandle
from thinkray.actors.directory import (
    PLACEMENTS,
    RAY_NAMESPACE,
    NamespaceConfig,
    Placement,
    RemoteDirectory,
    directory_name,
    session_actor_prefix,
    shard_of,
)
from thinkray.actors.errors import RemoteCallError
from thinkray.actors.host import DEFAULT_HOST_CAPACITY
from thinkray.actors.lane import StreamCall
from thinkray.actors.response import (
    AgentResponse,
    AgentResponseStream,
    CrashPolicy,
    TurnKeys,
    _own_errors,
)
from thinkray.actors.session_actor import DEFAULT_PRELOAD, AgentClassRef
from thinkray.runtime.agents.think import Think
from thinkray.runtime.messages import new_id, parse_message
from thinkray.runtime.observability import tracing
from thinkray.runtime.remote import (
    RemoteMethod,
    arguments_error,
    check_arguments,
    remote_methods,
)
from thinkray.storage.layout import ensure_root, list_names, validate_name

__all__ = [
    "RAY_NAMESPACE",
    "AgentHandle",
    "AgentNamespace",
    "DirectoryRouter",
    "Handle",
    "HandleMethod",
]

HANDLE_CACHE = 4096
"""Agent handles a namespace object keeps for reuse (least recently used dropped)."""

A = TypeVar("A", bound=Think)


DIRECTORY_RETRY = 30.0
"""How long a handle keeps retrying a directory that is being restarted or recreated."""


def _directory_name(namespace: str) -> str:
    return directory_name(namespace)


def _share(total: int | None, shards: int) -> int | None:
    """One shard's share of a namespace-wide figure (at least 1; 0 stays 0)."""
    if total is None:
        return None
    return 0 if total <= 0 else max(1, math.ceil(total / shards))


class DirectoryRouter:
    """The directory shards of one namespace, routed by name: ``router.for_name(name)``
    is the actor handle of the shard that owns ``name``, and ``router.<method>.remote(
    name, ...)`` sends a per-name directory call (``resolve``, ``hibernate``,
    ``live_actor``, ...) to that shard. Serializable. It recreates a shard that is
    gone for good when it knows the configuration (``revive``)."""

    def __init__(
        self,
        namespace: str,
        handles: list[Any],
        config: NamespaceConfig | None = None,
        detached: bool = True,
    ) -> None:
        self.namespace = namespace
        self.handles = list(handles)
        self.config = config
        self.detached = detached

    @property
    def shards(self) -> int:
        """How many directory shards."""
        return len(self.handles)

    def shard_of(self, name: str) -> int:
        """The shard that owns ``name``."""
        return shard_of(name, len(self.handles))

    def for_name(self, name: str) -> Any:
        """The actor handle of ``name``'s shard."""
        return self.handles[self.shard_of(name)]

    def __getattr__(self, method: str) -> _Routed:
        if method.startswith("_"):
            raise AttributeError(method)
        return _Routed(self, method)

    def __reduce__(self) -> tuple[Any, ...]:
        return (DirectoryRouter, (self.namespace, self.handles, self.config, self.detached))

    def revive(self, shard: int, dead: Any = None) -> Any:
        """Shard ``shard``'s handle after a call found ``dead`` (its old handle) gone:
        the actor registered under its name now, created anew from the configuration
        if there is none (it then adopts the live agents: see the directory module)."""
        current = self.handles[shard]
        if dead is not None and current is not dead:
            return current  # replaced already
        name = directory_name(self.namespace, shard)
        try:
            handle = ray.get_actor(name, namespace=RAY_NAMESPACE)
        except ValueError:
            if self.config is None:
                raise
            handle = _create_shard(replace(self.config, shard=shard), self.detached)
        self.handles[shard] = handle
        return handle


class _Routed:
    def __init__(self, router: DirectoryRouter, method: str) -> None:
        self.router = router
        self.method = method

    def remote(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.router.for_name(name), self.method).remote(name, *args, **kwargs)


def _create_shard(config: NamespaceConfig, detached: bool) -> Any:
    """Get or create the directory actor of ``config.shard`` (restarted by Ray if its
    process dies)."""
    options: dict[str, Any] = {
        "name": directory_name(config.namespace, config.shard),
        "namespace": RAY_NAMESPACE,
        "get_if_exists": True,
        "num_cpus": 0,
        "max_concurrency": 1000,
        "max_restarts": -1,
    }
    if detached:
        options["lifetime"] = "detached"
    return RemoteDirectory.options(**options).remote(config)


class AgentNamespace(Generic[A]):
    """Agents of one class under one storage root, addressed by name.

    ``get(name)`` gets or creates; ``existing(name)`` refuses unknown names for
    read-only use. Two processes that construct the same namespace share one
    directory actor (the first one's settings win).

    Lifetime: a namespace is a service. Its directory actor is detached: it outlives
    the driver that created it and this object; any driver reaches it by name with
    :meth:`connect`, and only :meth:`shutdown` stops it (hibernating every agent).
    ``detached=False`` ties it to the creating driver instead (a one-off script). ``start=False`` skips the blocking
    wait for the pool (inside an async actor, ``await ns.astart()`` instead).

    The warm pool (:mod:`thinkray.actors.directory` has the policy) keeps ``pool_size``
    spare actors at least and grows with demand up to ``max_pool`` (default
    ``max_live``); spares above what demand calls for retire after ``pool_ttl``
    seconds unused (``grow_pool=False``: no spare is started for demand, the pool
    keeps ``pool_size`` and the actors hibernations give back; a bind that finds none
    starts its own: for tests and rarely called namespaces, where an idle process
    costs more than a wait). At most ``max_starting`` actors start at once (default: the
    cluster's CPUs); a bind that finds no spare queues (FIFO) and takes the first actor
    freed for it: given back, newly started, or taken from the least recently used
    idle agent, which hibernates. Binds at the ``max_live`` cap wait up to ``cap_wait``
    seconds for such an agent, then exceed the cap.
    With ``directories=K`` the names spread over K directory actors (sha1 of the name
    mod K); each shard keeps its own pool and a share of the caps (``ceil(max_live /
    K)`` live agents, and so on: the directory module weighs this choice).
    ``ns.directory`` is the directory's actor handle with one shard, a
    :class:`DirectoryRouter` (per-name calls only) with several.
    ``placement`` (:data:`~thinkray.actors.directory.Placement`) chooses where live
    agents run: ``"dedicated"`` (the default), a Ray actor process each; ``"hosts"``,
    up to ``host_capacity`` agents per agent host actor (:mod:`thinkray.actors.host`),
    each with its own file, turn lock and hibernation, at megabytes and milliseconds
    per agent instead of a process. The pool then counts free agent slots (a host
    started adds ``host_capacity``). An agent class with ``dedicated_actor = True``
    always gets its own actor. A host that dies takes its agents with it; each wakes
    on its next call or alarm, as after a dedicated actor's crash.
    ``warm_up=False`` skips the throwaway turn each new pooled actor runs before it
    becomes a spare (it saves the first agent an actor hosts ~75 ms of CPU, at ~130
    ms per actor started): for tests and short scripts that start many namespaces.
    Raises a storage error at once for a root that cannot be written.
    """

    def __init__(
        self,
        name: str = "default",
        agent_cls: type[A] = Think,  # type: ignore[assignment]  # the default class
        *,
        storage_root: str,
        agent_kwargs: dict[str, Any] | None = None,
        pool_size: int = 2,
        max_live: int = 64,
        cap_wait: float = 5.0,
        idle_timeout: float | None = 300.0,
        recycle_after: int = 200,
        actor_options: dict[str, Any] | None = None,
        preload: tuple[str, ...] = DEFAULT_PRELOAD,
        detached: bool = True,
        start: bool = True,
        max_pool: int | None = None,
        pool_ttl: float = 60.0,
        max_starting: int | None = None,
        start_patience: float = 0.5,
        grow_pool: bool = True,
        directories: int = 1,
        warm_up: bool = True,
        placement: Placement = "dedicated",
        host_capacity: int = DEFAULT_HOST_CAPACITY,
    ) -> None:
        validate_name(name, "namespace")
        if not isinstance(directories, int) or directories < 1:
            raise ValueError(f"directories must be a positive integer, not {directories!r}")
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, not {placement!r}")
        if not isinstance(host_capacity, int) or host_capacity < 1:
            raise ValueError(f"host_capacity must be a positive integer, not {host_capacity!r}")
        if getattr(agent_cls, "dedicated_actor", False):
            placement = "dedicated"  # the class asks for a process of its own
        # Absolute: the actors open the files from their own working directory (a URI
        # root, s3://... or file://..., is kept as given: thinkray.storage.objectstore).
        storage_root = storage_root if "://" in storage_root else os.path.abspath(storage_root)
        ensure_root(storage_root, name)
        self.name = name
        self.storage_root = storage_root
        self.agent_cls: type[A] | None = agent_cls
        self._init_handles()
        config = NamespaceConfig(
            namespace=name,
            storage_root=storage_root,
            agent_cls=AgentClassRef.of(agent_cls),  # the directory never imports it
            agent_kwargs=dict(agent_kwargs or {}),
            pool_size=_share(pool_size, directories) or 0,
            max_live=_share(max_live, directories) or 0,
            cap_wait=cap_wait,
            idle_timeout=idle_timeout,
            recycle_after=recycle_after,
            actor_options=dict(actor_options or {}),
            preload=tuple(preload),
            max_pool=_share(max_pool, directories),
            pool_ttl=pool_ttl,
            max_starting=_share(max_starting, directories),
            start_patience=start_patience,
            grow_pool=grow_pool,
            shards=directories,
            detached=detached,
            warm_up=warm_up,
            placement=placement,
            host_capacity=host_capacity,
        )
        handles = [_create_shard(replace(config, shard=i), detached) for i in range(directories)]
        self._router = DirectoryRouter(name, handles, config, detached)
        self._set_directory()
        if start:
            ray.get([d.start.remote() for d in self._router.handles])

    def _set_directory(self) -> None:
        # Any: Ray types a handle's methods only when they are declared with @ray.method
        router = self._router
        self.directory: Any = cast(Any, router.handles[0] if router.shards == 1 else router)

    @property
    def shards(self) -> int:
        """How many directory actors the names are spread over."""
        return self._router.shards

    def directory_for(self, name: str) -> Any:
        """The directory actor (shard) that owns agent ``name``."""
        return self._router.for_name(validate_name(name))

    def _call(self, shard: int, method: str, *args: Any) -> Any:
        """``ray.get`` of a directory call on ``shard``, asked again while the shard is
        being restarted by Ray, and recreated if it is gone for good (for up to
        ``DIRECTORY_RETRY`` seconds)."""
        return self._get(
            shard, getattr(self._router.handles[shard], method).remote(*args), method, args
        )

    def _get(self, shard: int, ref: Any, method: str, args: tuple[Any, ...]) -> Any:
        started = time.monotonic()
        while True:
            try:
                return ray.get(ref)
            except ray.exceptions.RayActorError:
                if time.monotonic() - started > DIRECTORY_RETRY:
                    raise
                time.sleep(0.2)
                handle = self._router.handles[shard]
                with contextlib.suppress(ValueError):  # not registered yet: wait
                    handle = self._router.revive(shard, handle)
                    self._set_directory()
                ref = getattr(handle, method).remote(*args)

    def _all(self, method: str, *args: Any) -> list[Any]:
        """``method`` on every shard at once (each asked again as in :meth:`_call`)."""
        refs = [getattr(h, method).remote(*args) for h in self._router.handles]
        return [self._get(shard, ref, method, args) for shard, ref in enumerate(refs)]

    async def astart(self) -> AgentNamespace[A]:
        """Wait for the warm pool (the async form of ``start=True``)."""
        for handle in self._router.handles:
            await handle.start.remote()
        return self

    @classmethod
    def connect(cls, name: str = "default") -> AgentNamespace[Any]:
        """Attach to a namespace another process created (its handles then validate
        calls on the actor's side only)."""
        self = cls.__new__(cls)
        self.name = name
        first: Any = ray.get_actor(directory_name(name), namespace=RAY_NAMESPACE)
        config = cast(NamespaceConfig, ray.get(first.config.remote()))
        handles: list[Any] = [first]
        for shard in range(1, config.shards):
            handles.append(ray.get_actor(directory_name(name, shard), namespace=RAY_NAMESPACE))
        self._router = DirectoryRouter(name, handles, config, config.detached)
        self._set_directory()
        self.storage_root = config.storage_root
        self.agent_cls = None
        self._init_handles()
        return self

    def __getstate__(self) -> dict[str, Any]:
        # Picklable (sent to tasks and actors): the handle cache and its lock stay behind.
        state = dict(self.__dict__)
        state.pop("_handles", None)
        state.pop("_handles_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_handles()

    def _init_handles(self) -> None:
        self._handles: OrderedDict[tuple[str, bool], AgentHandle[A]] = OrderedDict()
        self._handles_lock = threading.Lock()

    def get(self, name: str) -> Handle[A]:
        """The handle of agent ``name``, created on first use."""
        return self._handle(validate_name(name), True)

    def existing(self, name: str) -> Handle[A]:
        """The handle of an existing agent: its calls raise SessionNotFoundError for a
        name that has no database file."""
        return self._handle(validate_name(name), False)

    def _handle(self, name: str, create: bool) -> AgentHandle[A]:
        # One handle per name and mode, reused: a handle remembers the actor it
        # resolved, so ``ns.get(name).chat.remote(...)`` in a loop asks the directory
        # once instead of once per call (a round trip to the directory actor each).
        # A handle re-resolves by itself when its actor died or hibernated.
        key = (name, create)
        with self._handles_lock:
            handle = self._handles.get(key)
            if handle is None:
                handle = AgentHandle(self.name, name, self._router, create, self.agent_cls)
                self._handles[key] = handle
                if len(self._handles) > HANDLE_CACHE:
                    self._handles.popitem(last=False)
            else:
                self._handles.move_to_end(key)
        return handle

    def names(self) -> list[str]:
        """Every agent that has a database file (live or hibernated)."""
        return list_names(self.storage_root, self.name)

    def hibernate(self, name: str, force: bool = False) -> bool:
        """Hibernate agent ``name`` now; False while it is busy (unless ``force``)."""
        shard = self._router.shard_of(validate_name(name))
        return bool(self._call(shard, "hibernate", name, force))

    async def ahibernate(self, name: str, force: bool = False) -> bool:
        """:meth:`hibernate` for async code."""
        return bool(await self.directory_for(name).hibernate.remote(name, force))

    def hibernate_all(self, force: bool = False) -> int:
        """Hibernate every live agent (on every shard); returns how many went."""
        return sum(int(n) for n in self._all("hibernate_all", force))

    def wake(self, name: str, node_id: str | None = None) -> dict[str, Any]:
        """Bind agent ``name`` now (optionally on a given node); returns where it lives."""
        shard = self._router.shard_of(validate_name(name))
        where, actor, actor_id = self._call(shard, "wake", name, node_id)
        self._handle(name, True).resolved(actor, actor_id)
        return cast(dict[str, Any], where)

    def place(
        self, name: str, placement: Placement, timeout: float = 30.0
    ) -> dict[str, Any] | None:
        """Move agent ``name`` out of the agent hosts to a Ray actor of its own
        (``"dedicated"``: a hot agent, or one whose blocking work delays its siblings)
        or back into the hosts (``"hosts"``), at its next turn boundary: a live agent
        finishes what it runs (up to ``timeout`` seconds), hibernates, and wakes where
        it now belongs; a hibernated one wakes there on its next call. Returns where
        it lives afterwards (:meth:`where`). For a namespace with placement
        ``"hosts"``; the move lasts while its directory lives (a replacement directory
        keeps it for an agent it finds live).

        Raises:
            InvalidInputError: an unknown ``placement``.
            InvalidStateError: the namespace's placement is ``"dedicated"``.
            SessionNotFoundError: no such agent.
            ActorBusyError: still busy after ``timeout`` (nothing changed).
        """
        shard = self._router.shard_of(validate_name(name))
        where: dict[str, Any] | None = self._call(shard, "place", name, placement, timeout)
        return where

    def where(self, name: str) -> dict[str, Any] | None:
        """The live actor hosting agent ``name`` (actor_id, node_id, pid), or None
        when it is hibernated."""
        shard = self._router.shard_of(validate_name(name))
        live: dict[str, Any] | None = self._call(shard, "live_actor", name)
        return live

    def stats(self) -> dict[str, Any]:
        """The directory's counters (live, pooled, binds, hibernations, ...): with
        several shards their sum (``live`` and ``alarms`` merged, ``max_live`` the
        sum of the shares), and each shard's own under ``by_shard``."""
        return _aggregate(self._all("stats"))

    def shutdown(self) -> None:
        """Hibernate every agent and stop the pool and the directories (every shard),
        then any session actor of the namespace still registered."""
        handles = list(self._router.handles)
        try:
            refs = [h.shutdown.remote() for h in handles]
            for ref in refs:
                with contextlib.suppress(ray.exceptions.ActorDiedError):
                    ray.get(ref)  # gone already: its actors are stopped below
        finally:
            for handle in handles:
                with contextlib.suppress(Exception):
                    ray.kill(handle, no_restart=True)
            _kill_session_actors(self.name)


def _kill_session_actors(namespace: str) -> None:
    """Stop the named session actors of ``namespace`` that are still registered (detached,
    they would outlive the directories: a start in flight at shutdown, a lost shard)."""
    prefix = session_actor_prefix(namespace)
    try:
        named = ray.util.list_named_actors(all_namespaces=True)
    except Exception:
        return
    for item in named:
        if not isinstance(item, dict) or item.get("namespace") != RAY_NAMESPACE:
            continue
        if not str(item.get("name", "")).startswith(prefix):
            continue
        with contextlib.suppress(Exception):
            ray.kill(ray.get_actor(item["name"], namespace=RAY_NAMESPACE), no_restart=True)


def _aggregate(shards: list[dict[str, Any]]) -> dict[str, Any]:
    """One namespace's stats from its shards' (one shard: its own, plus ``by_shard``)."""
    first = shards[0]
    if len(shards) == 1:
        return {**first, "by_shard": [_shard_summary(first)]}
    counters: dict[str, int] = {}
    for s in shards:
        for key, value in s.get("counters", {}).items():
            counters[key] = counters.get(key, 0) + value
    pools = [s.get("pool", {}) for s in shards]
    return {
        "namespace": first["namespace"],
        "storage_root": first["storage_root"],
        "shards": len(shards),
        "max_live": sum(s.get("max_live", 0) for s in shards),
        "live": {n: a for s in shards for n, a in s["live"].items()},
        "free": sum(s["free"] for s in shards),
        "starting": sum(s["starting"] for s in shards),
        "waiting": sum(s["waiting"] for s in shards),
        "alarms": {n: t for s in shards for n, t in s["alarms"].items()},
        "counters": counters,
        "pool": {
            "target": sum(p.get("target", 0) for p in pools),
            "max_starting": sum(p.get("max_starting", 0) for p in pools),
            "starting_peak": sum(p.get("starting_peak", 0) for p in pools),
            "bind_rate": sum(p.get("bind_rate", 0.0) for p in pools),
            "start_secs": max(p.get("start_secs", 0.0) for p in pools),
        },
        "by_shard": [_shard_summary(s) for s in shards],
    }


def _shard_summary(stats: dict[str, Any]) -> dict[str, Any]:
    return {
        "shard": stats.get("shard", 0),
        "live": len(stats["live"]),
        "free": stats["free"],
        "waiting": stats["waiting"],
        "counters": dict(stats.get("counters", {})),
    }


class AgentHandle(Generic[A]):
    """A stub for one named agent: ``handle.<remote method>.remote(...)``.

    Any other attribute raises :class:`RemoteCallError` naming the methods that are
    remote-callable. Serializable."""

    def __init__(
        self,
        namespace: str,
        name: str,
        directory: ActorHandle | DirectoryRouter,
        create: bool = True,
        agent_cls: type[A] | None = None,
    ) -> None:
        self.namespace = namespace
        self.name = name
        # The shard that owns the name; the router (when given) revives a lost one.
        self._router = directory if isinstance(directory, DirectoryRouter) else None
        self.directory: Any = directory
        if self._router is not None:
            self.directory = self._router.for_name(name)
        self.create = create
        self.agent_cls = agent_cls
        self._actor: ActorHandle | None = None
        self._actor_id: str | None = None
        # Set when a call through this handle was interrupted (its actor died): the
        # actor it holds is dead, so the next call resolves the name again, naming it.
        self._stale = False

    def __repr__(self) -> str:
        return f"AgentHandle({self.namespace}/{self.name})"

    def __reduce__(self) -> tuple[Any, ...]:
        directory = self._router if self._router is not None else self.directory
        return (AgentHandle, (self.namespace, self.name, directory, self.create, self.agent_cls))

    def __getattr__(self, method: str) -> HandleMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        marker = None
        if self.agent_cls is not None:
            allowed = remote_methods(self.agent_cls)
            marker = allowed.get(method)
            if marker is None:
                raise RemoteCallError(
                    f"{self.agent_cls.__name__}.{method} is not remote-callable; "
                    f"remote methods: {', '.join(sorted(allowed))}",
                    method,
                    tuple(sorted(allowed)),
                )
        return HandleMethod(self, method, marker)

    # -- resolution (used by the responses) -------------------------------------------

    def _cached_actor(self) -> ActorHandle | None:
        return None if self._stale else self._actor

    def _forget_actor(self) -> None:
        """The actor died under a call that is not re-sent: resolve anew next time
        (otherwise every later call would go to the dead actor and be refused)."""
        self._stale = True

    def _resolve(self, stale: bool) -> Any:
        # Resolving runs in the caller's thread or task: a wake it causes is traced as
        # part of the caller's trace.
        return self.directory.resolve.remote(
            self.name, self.create, self._actor_id if stale else None, None, tracing.inject()
        )

    def _directory_lost(self, started: float, error: BaseException) -> float:
        """A resolve found the directory gone (crashed mid-call, or stopped for good):
        how long to wait before asking again (its replacement), or ``error`` re-raised
        after ``DIRECTORY_RETRY`` seconds."""
        if time.monotonic() - started > DIRECTORY_RETRY:
            raise error
        if self._router is not None:
            with contextlib.suppress(ValueError):  # not registered (yet): keep waiting
                self.directory = self._router.revive(
                    self._router.shard_of(self.name), self.directory
                )
        return 0.2

    def resolved(self, actor: ActorHandle, actor_id: str) -> None:
        """Where the agent lives, as its directory just said (a wake): the handle's
        next call goes there without asking. A stale answer costs what a hibernated
        agent's does: the call finds it gone and the handle asks again."""
        self._actor, self._actor_id, self._stale = actor, actor_id, False

    def _actor_sync(self, stale: bool = False) -> ActorHandle:
        stale = stale or self._stale
        if self._actor is None or stale:
            started = time.monotonic()
            while True:
                try:
                    with _own_errors():  # a wake's failure (a corrupt file) as itself
                        self._actor, self._actor_id = ray.get(self._resolve(stale))
                    self._stale = False
                    break
                except ray.exceptions.RayActorError as exc:
                    time.sleep(self._directory_lost(started, exc))
        assert self._actor is not None
        return self._actor

    async def _actor_async(self, stale: bool = False) -> ActorHandle:
        stale = stale or self._stale
        if self._actor is None or stale:
            started = time.monotonic()
            while True:
                try:
                    with _own_errors():
                        self._actor, self._actor_id = await self._resolve(stale)
                    self._stale = False
                    break
                except ray.exceptions.RayActorError as exc:
                    await asyncio.sleep(self._directory_lost(started, exc))
        assert self._actor is not None
        return self._actor


class HandleMethod:
    """One remote method of a handle: ``.remote(*args, **kwargs)`` sends the call."""

    def __init__(
        self, handle: AgentHandle[Any], method: str, marker: RemoteMethod[Any, Any, Any, Any] | None
    ) -> None:
        self.handle = handle
        self.method = method
        self.marker = marker

    def __repr__(self) -> str:
        return f"{self.handle!r}.{self.method}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Always refused: a remote method is sent with ``.remote(...)``.

        Raises:
            RemoteCallError: naming the ``.remote(...)`` form to use.
        """
        raise RemoteCallError(
            f"call {self.method} through .remote(...): handle.{self.method}.remote(...)",
            self.method,
        )

    def send(self, *args: Any, **kwargs: Any) -> AgentResponse[Any] | AgentResponseStream[Any]:
        """Send the call (what ``.remote(...)`` does); returns an AgentResponse (a stream
        method: an AgentResponseStream). Raises RemoteCallError when the arguments don't
        fit the method's signature; nothing is sent then."""
        # A handle that does not know the agent's class (``connect``) still knows
        # Think's own methods: their kind, and whether they may be re-sent.
        marker = self.marker or remote_methods(Think).get(self.method)
        turn = None
        if marker is not None and self.method in TURN_METHODS:
            try:  # keying a turn binds its arguments: that is the check as well
                args, kwargs, turn = _keyed_turn(marker, args, kwargs)
            except TypeError as exc:
                if self.marker is not None:
                    raise arguments_error(marker, exc) from None
                turn = None  # Think's signature, not the (unknown) class's: the actor
                # checks the arguments; the turn goes unkeyed
        elif self.marker is not None:
            check_arguments(self.marker, args, kwargs)
        if self.marker is not None and "callback" in self.marker.signature.parameters:
            _check_callback(self.marker, self.method, args, kwargs)
        policy = CrashPolicy(self.method, bool(marker and marker.idempotent), turn)
        name, method = self.handle.name, self.method
        # The caller's trace context (None while tracing is off) travels with the call:
        # the turn it starts is a child of the caller's span.
        carrier = tracing.inject()
        if marker is not None and marker.kind == "stream":
            return AgentResponseStream(
                self.handle, StreamCall(name, method, args, kwargs, carrier), policy
            )
        return AgentResponse(
            self.handle,
            lambda actor: actor.invoke.remote(name, method, args, kwargs, carrier),
            policy,
        )

    if TYPE_CHECKING:
        # For a type checker this half of ``Handle`` adds nothing (``NoReturn`` drops out
        # of the union): the agent class's @remote descriptor types the call and its
        # result, so a streamed chunk is a ``UIChunk`` that narrows, not ``Any | UIChunk``.
        def remote(self, *args: Any, **kwargs: Any) -> NoReturn:
            """Send the call: see :meth:`send`."""
            ...
    else:
        remote = send


if TYPE_CHECKING:
    # What a type checker sees for a handle: the agent class's @remote descriptors
    # (whose ``.remote`` carries each method's signature) or the handle itself.
    Handle: TypeAlias = AgentHandle[A] | type[A]
else:
    Handle = AgentHandle


TURN_METHODS = frozenset({"chat", "stream_chat"})
"""Methods that run a turn: the handle keys them (user message id, run id) before sending."""


def _keyed_turn(
    marker: RemoteMethod[Any, Any, Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any], TurnKeys]:
    """The turn's arguments with its user message id and run id fixed by the caller, so
    that a re-send after a crash is recognised (the store keeps one message per id)
    and the turn can be named if it was interrupted. Raises InvalidMessageError for a
    message that is not valid (nothing is sent)."""
    bound = marker.signature.bind(None, *args, **kwargs)
    message = bound.arguments.get("message")
    message_id = None
    if message is not None:
        wire = parse_message(message, role=bound.arguments.get("role", "user"))
        bound.arguments["message"] = wire
        message_id = wire["id"]
    run_id = bound.arguments.get("run_id") or new_id("run")
    bound.arguments["run_id"] = run_id
    keys = TurnKeys(message_id, run_id, bound.arguments.get("session_id"))
    return tuple(bound.args[1:]), dict(bound.kwargs), keys


def _check_callback(
    marker: RemoteMethod[Any, Any, Any, Any],
    method: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    """A callback that crosses to the actor must be an actor handle (chunks are relayed
    to it); a local object would run in the actor's process, out of the caller's reach."""
    callback = marker.signature.bind(None, *args, **kwargs).arguments.get("callback")
    if callback is not None and not isinstance(callback, ActorHandle):
        raise RemoteCallError(
            f"{method}: a callback through a handle must be a Ray actor handle, not "
            f"{type(callback).__name__}; to follow a turn locally iterate "
            "handle.stream_chat.remote(...)",
            method,
        )
