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
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeAlias, TypeVar, cast

import ray
from ray.actor import ActorHandle
from thinkray.actors.directory import NamespaceConfig, RemoteDirectory
from thinkray.actors.errors import RemoteCallError
from thinkray.actors.response import AgentResponse, AgentResponseStream, CrashPolicy, TurnKeys
from thinkray.actors.session_actor import DEFAULT_PRELOAD
from thinkray.runtime.agents.think import Think
from thinkray.runtime.messages import new_id, parse_message
from thinkray.runtime.remote import RemoteMethod, check_arguments, remote_methods
from thinkray.storage.layout import ensure_root, list_names, validate_name

__all__ = ["RAY_NAMESPACE", "AgentHandle", "AgentNamespace", "Handle", "HandleMethod"]

RAY_NAMESPACE = "thinkray"
HANDLE_CACHE = 4096
"""Agent handles a namespace object keeps for reuse (least recently used dropped)."""

A = TypeVar("A", bound=Think)


def _directory_name(namespace: str) -> str:
    return f"thinkray-directory-{namespace}"


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
    seconds unused. At most ``max_starting`` actors start at once (default: the
    cluster's CPUs); a bind that finds no spare queues (FIFO) and takes the first actor
    freed for it: given back, newly started, or taken from the least recently used
    idle agent, which hibernates. Binds at the ``max_live`` cap wait up to ``cap_wait``
    seconds for such an agent, then exceed the cap.
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
    ) -> None:
        validate_name(name, "namespace")
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
            agent_cls=agent_cls,
            agent_kwargs=dict(agent_kwargs or {}),
            pool_size=pool_size,
            max_live=max_live,
            cap_wait=cap_wait,
            idle_timeout=idle_timeout,
            recycle_after=recycle_after,
            actor_options=dict(actor_options or {}),
            preload=tuple(preload),
            max_pool=max_pool,
            pool_ttl=pool_ttl,
            max_starting=max_starting,
            start_patience=start_patience,
        )
        options: dict[str, Any] = {
            "name": _directory_name(name),
            "namespace": RAY_NAMESPACE,
            "get_if_exists": True,
            "num_cpus": 0,
            "max_concurrency": 1000,
        }
        if detached:
            options["lifetime"] = "detached"
        # Any: Ray types a handle's methods only when they are declared with @ray.method
        self.directory: Any = cast(Any, RemoteDirectory.options(**options).remote(config))
        if start:
            ray.get(self.directory.start.remote())

    async def astart(self) -> AgentNamespace[A]:
        """Wait for the warm pool (the async form of ``start=True``)."""
        await self.directory.start.remote()
        return self

    @classmethod
    def connect(cls, name: str = "default") -> AgentNamespace[Any]:
        """Attach to a namespace another process created (its handles then validate
        calls on the actor's side only)."""
        self = cls.__new__(cls)
        self.name = name
        self.directory = ray.get_actor(_directory_name(name), namespace=RAY_NAMESPACE)
        stats: dict[str, Any] = ray.get(self.directory.stats.remote())
        self.storage_root = stats.get("storage_root", "")
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
                handle = AgentHandle(self.name, name, self.directory, create, self.agent_cls)
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
        return bool(ray.get(self.directory.hibernate.remote(validate_name(name), force)))

    async def ahibernate(self, name: str, force: bool = False) -> bool:
        """:meth:`hibernate` for async code."""
        return bool(await self.directory.hibernate.remote(validate_name(name), force))

    def hibernate_all(self, force: bool = False) -> int:
        """Hibernate every live agent; returns how many went."""
        return int(ray.get(self.directory.hibernate_all.remote(force)))

    def wake(self, name: str, node_id: str | None = None) -> dict[str, Any]:
        """Bind agent ``name`` now (optionally on a given node); returns where it lives."""
        validate_name(name)
        ray.get(self.directory.resolve.remote(name, True, None, node_id))
        where: dict[str, Any] = ray.get(self.directory.live_actor.remote(name))
        return where

    def where(self, name: str) -> dict[str, Any] | None:
        """The live actor hosting agent ``name`` (actor_id, node_id, pid), or None
        when it is hibernated."""
        live: dict[str, Any] | None = ray.get(self.directory.live_actor.remote(validate_name(name)))
        return live

    def stats(self) -> dict[str, Any]:
        """The directory's counters (live, pooled, binds, hibernations, ...)."""
        stats: dict[str, Any] = ray.get(self.directory.stats.remote())
        return stats

    def shutdown(self) -> None:
        """Hibernate every agent and stop the pool and the directory."""
        try:
            ray.get(self.directory.shutdown.remote())
        finally:
            ray.kill(self.directory, no_restart=True)


class AgentHandle(Generic[A]):
    """A stub for one named agent: ``handle.<remote method>.remote(...)``.

    Any other attribute raises :class:`RemoteCallError` naming the methods that are
    remote-callable. Serializable."""

    def __init__(
        self,
        namespace: str,
        name: str,
        directory: ActorHandle,
        create: bool = True,
        agent_cls: type[A] | None = None,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.directory = directory
        self.create = create
        self.agent_cls = agent_cls
        self._actor: ActorHandle | None = None
        self._actor_id: str | None = None

    def __repr__(self) -> str:
        return f"AgentHandle({self.namespace}/{self.name})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            AgentHandle,
            (self.namespace, self.name, self.directory, self.create, self.agent_cls),
        )

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
        return self._actor

    def _actor_sync(self, stale: bool = False) -> ActorHandle:
        if self._actor is None or stale:
            self._actor, self._actor_id = ray.get(
                self.directory.resolve.remote(
                    self.name, self.create, self._actor_id if stale else None, None
                )
            )
        assert self._actor is not None
        return self._actor

    async def _actor_async(self, stale: bool = False) -> ActorHandle:
        if self._actor is None or stale:
            self._actor, self._actor_id = await self.directory.resolve.remote(
                self.name, self.create, self._actor_id if stale else None, None
            )
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
        if self.marker is not None:
            check_arguments(self.marker, args, kwargs)
            if "callback" in self.marker.signature.parameters:
                _check_callback(self.marker, self.method, args, kwargs)
        # A handle that does not know the agent's class (``connect``) still knows
        # Think's own methods: their kind, and whether they may be re-sent.
        marker = self.marker or remote_methods(Think).get(self.method)
        turn = None
        if marker is not None and self.method in TURN_METHODS:
            try:
                args, kwargs, turn = _keyed_turn(marker, args, kwargs)
            except TypeError:  # Think's signature, not the (unknown) class's: the
                turn = None  # actor checks the arguments; the turn goes unkeyed
        policy = CrashPolicy(self.method, bool(marker and marker.idempotent), turn)
        name, method = self.handle.name, self.method
        if marker is not None and marker.kind == "stream":
            return AgentResponseStream(
                self.handle,
                lambda actor: actor.invoke_stream.remote(name, method, args, kwargs),
                policy,
            )
        return AgentResponse(
            self.handle, lambda actor: actor.invoke.remote(name, method, args, kwargs), policy
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
