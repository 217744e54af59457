"""Agent hosts: one async Ray actor process hosting up to K agents at once.

A dedicated session actor (:class:`~thinkray.actors.session_actor.SessionActor` run as
a Ray actor) costs a process per live agent: ~70 MiB and ~0.5 CPU-s to start. An
:class:`AgentHost` runs the same per-agent state machine for many agents in one
process: each hosted agent is an *activation*, a plain ``SessionActor`` object (not a
Ray actor) in this process, keyed by the agent's name. So each agent keeps exactly
what a dedicated actor gives it (its own DuckDB file, turn lock, bind/wake,
hibernation, idle timer, relay, abort receivers, object-store lease and shipping);
only the process is shared.

Every RPC names its agent (as a dedicated actor's do); the host routes it to that
agent's activation, and answers :class:`~thinkray.actors.relay.NotBoundError` for an
agent it does not host, so a handle re-resolves exactly as with a dedicated actor.

Control calls (``abort_run``, ``hibernate``, ``activity``, ``snapshot``,
``host_status``) run in their own Ray concurrency group, so they never wait for a
slot behind the turns and streams of the default group. Each concurrency group of an
async Ray actor has its own event loop thread; the agents' state belongs to the
default group's loop (the *main* loop), so a control call that changes state hops to
it (:meth:`AgentHost._on_main`); ``snapshot`` and ``host_status`` only read memory and
answer from their own thread even while the main loop is busy.

The host measures its main loop's lag (how late a 50 ms timer fires): reported by
``host_status``, in ``snapshot``, and as the ``thinkray_host_loop_lag_seconds`` gauge.

A host that dies takes its agents with it: the directory's one ``watch_host`` call
on it fails, each of its agents is then no longer live, and its next call or alarm
wakes it elsewhere, as for a dead dedicated actor.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import ray
from ray import cloudpickle as ray_pickle
from thinkray.actors.errors import ActorBusyError, InvalidStateError
from thinkray.actors.lane import LaneAddress, LaneServer, start_lane
from thinkray.actors.metrics import install_ray_metrics
from thinkray.actors.relay import NotBoundError
from thinkray.actors.session_actor import DEFAULT_PRELOAD, BindSpec, SessionActor
from thinkray.runtime.observability.metrics import metrics
from thinkray.runtime.observability.setup import configure_from_env

log = logging.getLogger("thinkray.host")

T = TypeVar("T")

DEFAULT_HOST_CAPACITY = 64
"""Agents one host holds at most, unless the namespace says otherwise."""
CONTROL_GROUP = "control"
"""The Ray concurrency group of the control calls (see the module)."""
CONTROL_CONCURRENCY = 256
WATCH_RENEW = 300.0
"""How long a ``watch_host`` call stays pending before the directory renews it (s)."""
LAG_TICK = 0.05
"""How often the loop-lag probe wakes (seconds): lag is how late it wakes."""
LAG_WINDOW = 2.0
"""The lag reported is the largest seen over this many seconds."""


class AgentHost:
    """Hosts up to ``capacity`` agents in one process (see the module). Use through an
    :class:`~thinkray.actors.namespace.AgentNamespace` with ``placement="hosts"``."""

    def __init__(
        self,
        preload: tuple[str, ...] = DEFAULT_PRELOAD,
        warm_up: bool = True,
        agent_module: str | None = None,
        capacity: int = DEFAULT_HOST_CAPACITY,
        namespace: str = "",
    ) -> None:
        for module in preload:
            importlib.import_module(module)
        if agent_module is not None:
            with contextlib.suppress(ImportError):
                importlib.import_module(agent_module)
        configure_from_env()
        install_ray_metrics()
        ctx = ray.get_runtime_context()
        self.actor_id = ctx.get_actor_id()
        self.node_id = ctx.get_node_id()
        self.capacity = max(1, int(capacity))
        self.namespace = namespace
        self.activations: dict[str, SessionActor] = {}
        self.broken: set[str] = set()  # failed wakes whose database would not close
        self.bindings = 0
        self._warm_up_pending = warm_up
        self._main: asyncio.AbstractEventLoop | None = None
        self._lag_task: asyncio.Task[None] | None = None
        self._lag_samples: list[tuple[float, float]] = []  # (at, lag)
        self.lag_max = 0.0
        self._lane: LaneServer | None = None

    # -- loops -------------------------------------------------------------------------

    def _claim_main(self) -> None:
        """The default group's loop is the agents' loop: remember it (every
        default-group method calls this first) and start the lag probe on it."""
        if self._main is None:
            self._main = asyncio.get_running_loop()
            self._lag_task = asyncio.ensure_future(self._probe_lag())

    async def _on_main(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run ``make()`` on the agents' loop and wait for it from this one."""
        loop = asyncio.get_running_loop()
        if self._main is None or self._main is loop:
            return await make()

        async def run() -> T:
            return await make()

        future = asyncio.run_coroutine_threadsafe(run(), self._main)
        return await asyncio.wrap_future(future)

    async def _probe_lag(self) -> None:
        tags = {"namespace": self.namespace}
        reported = 0.0
        while True:
            before = time.monotonic()
            await asyncio.sleep(LAG_TICK)
            now = time.monotonic()
            lag = max(0.0, now - before - LAG_TICK)
            self._lag_samples.append((now, lag))
            while self._lag_samples and self._lag_samples[0][0] < now - LAG_WINDOW:
                self._lag_samples.pop(0)
            self.lag_max = max(lag for _, lag in self._lag_samples)
            if now - reported >= 1.0:  # Ray exports every few seconds anyway
                metrics().set("thinkray_host_loop_lag_seconds", self.lag_max, tags)
                reported = now

    # -- lifecycle ---------------------------------------------------------------------

    async def ready(self, directory: Any = None) -> dict[str, Any]:
        """Where this host runs, its capacity and the agents it hosts. The first call
        warms the process up (one throwaway agent bound, one turn, hibernated).
        ``directory``: as for :meth:`SessionActor.ready` (resolved before any bind)."""
        del directory  # resolved by its arrival; binds bring their own
        self._claim_main()
        if self._warm_up_pending:
            self._warm_up_pending = False
            scratch = SessionActor((), True, None, hosted=True)
            try:
                await scratch.ready()
            except Exception as exc:  # a cold host still works
                log.warning("warm-up of an agent host failed: %s", exc)
        await self._start_lane()
        return self._info()

    async def _start_lane(self) -> None:
        """Serve streams to callers on this node over a Unix socket (see
        :mod:`thinkray.actors.lane`), on the agents' loop, before the first bind."""
        if self._lane is None:
            self._lane = await start_lane(self.invoke_stream, self.node_id, "agent host")

    @ray.method(concurrency_group=CONTROL_GROUP)
    async def lane(self) -> LaneAddress | None:
        """Where this host's stream lane listens, with its secret (None: no lane)."""
        return self._lane.address if self._lane is not None else None

    def _info(self) -> dict[str, Any]:
        agents = {name: a.state for name, a in list(self.activations.items())}
        return {
            "host": True,
            "actor_id": self.actor_id,
            "node_id": self.node_id,
            "pid": os.getpid(),
            "capacity": self.capacity,
            "bindings": self.bindings,
            "agents": agents,
            "broken": sorted(self.broken),
            "loop_lag_s": round(self.lag_max, 4),
            "lane_streams": self._lane.streams if self._lane is not None else None,
            "lane_connections": self._lane.connections if self._lane is not None else None,
        }

    def _activation(self, name: str) -> SessionActor:
        activation = self.activations.get(name)
        if activation is None or activation.name != name:
            raise NotBoundError(name, None)
        return activation

    async def bind(self, spec: BindSpec, trace: dict[str, str] | None = None) -> dict[str, Any]:
        """Wake agent ``spec.name`` here, in an activation of its own: what
        :meth:`SessionActor.bind` returns plus the host's identity and load (``host``,
        ``actor_id``, ``node_id``, ``pid``, ``capacity``, ``bindings``, ``hosted``; its
        agents are in :meth:`ready` and :meth:`host_status`).

        Raises:
            ActorBusyError: the host already hosts (or binds, or hibernates) that agent,
                or is full (state ``full``).
            SessionNotFoundError, DatabaseLockedError, WakeError: as a dedicated bind.
        """
        self._claim_main()
        current = self.activations.get(spec.name)
        if current is not None:
            raise ActorBusyError(current.state, spec.name)
        if len(self.activations) >= self.capacity:
            raise ActorBusyError("full", spec.name)
        activation = SessionActor((), False, None, hosted=True)
        self.activations[spec.name] = activation
        try:
            info = await activation.bind(spec, trace)
        except BaseException:
            if activation.state == "broken":
                self.broken.add(spec.name)  # its file stays open in this process
            elif self.activations.get(spec.name) is activation:
                del self.activations[spec.name]
            raise
        self.bindings += 1
        # The host's identity and load, not its agents: a bind's reply listing every
        # hosted agent cost the directory O(agents) to deserialize per bind (~1 ms a
        # bind with 300 agents on the host, on the directory's one loop).
        info.update(
            host=True,
            actor_id=self.actor_id,
            node_id=self.node_id,
            pid=os.getpid(),
            capacity=self.capacity,
            bindings=self.bindings,
            hosted=len(self.activations),
        )
        info["bound"] = spec.name
        info["state"] = "bound"
        return info

    async def bind_many(
        self, binds: list[tuple[BindSpec, dict[str, str] | None]]
    ) -> list[tuple[bool, Any]]:
        """:meth:`bind` for each ``(spec, trace)``, concurrently, in one call (see
        :mod:`thinkray.actors.host_binds`): per bind, ``(True, reply)`` or ``(False,
        error)``, in the order given."""
        outcomes = await asyncio.gather(
            *(self.bind(spec, trace) for spec, trace in binds), return_exceptions=True
        )
        return [
            (False, _portable(o)) if isinstance(o, BaseException) else (True, o) for o in outcomes
        ]

    async def _hibernate_main(self, name: str, force: bool) -> dict[str, Any]:
        activation = self.activations.get(name)
        if activation is None:
            return {"ok": True, "was_bound": False}
        try:
            report = await activation.hibernate(name, force)
        finally:
            if activation.state == "idle" and self.activations.get(name) is activation:
                del self.activations[name]
        return report

    @ray.method(concurrency_group=CONTROL_GROUP)
    async def hibernate(self, name: str, force: bool = False) -> dict[str, Any]:
        """Hibernate agent ``name`` (see :meth:`SessionActor.hibernate`); its siblings
        go on."""
        return await self._on_main(lambda: self._hibernate_main(name, force))

    async def shutdown(self) -> None:
        """Hibernate every hosted agent, busy ones too."""
        self._claim_main()
        await asyncio.gather(
            *(self._hibernate_main(n, True) for n in list(self.activations)),
            return_exceptions=True,
        )

    # -- calls -------------------------------------------------------------------------

    async def invoke(
        self,
        name: str,
        method: str,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        trace: dict[str, str] | None = None,
    ) -> Any:
        """:meth:`SessionActor.invoke` on agent ``name``'s activation."""
        self._claim_main()
        return await self._activation(name).invoke(name, method, args, kwargs, trace)

    async def invoke_stream(
        self,
        name: str,
        method: str,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        trace: dict[str, str] | None = None,
    ) -> AsyncIterator[Any]:
        """:meth:`SessionActor.invoke_stream` on agent ``name``'s activation."""
        self._claim_main()
        activation = self._activation(name)
        async for item in activation.invoke_stream(name, method, args, kwargs, trace):
            yield item

    async def status_events(self, name: str, session_id: str) -> AsyncIterator[dict[str, Any]]:
        """:meth:`SessionActor.status_events` of agent ``name`` (nothing if it is not
        hosted here)."""
        self._claim_main()
        activation = self.activations.get(name)
        if activation is None:
            return
        async for item in activation.status_events(name, session_id):
            yield item

    async def state_events(self, name: str) -> AsyncIterator[dict[str, Any]]:
        """:meth:`SessionActor.state_events` of agent ``name``: its synced state, then
        each change, until it stops being hosted here (nothing if it is not)."""
        self._claim_main()
        activation = self.activations.get(name)
        if activation is None:
            return
        async for item in activation.state_events(name):
            yield item

    async def _abort_main(self, name: str, run_id: str, reason: str) -> bool:
        activation = self.activations.get(name)
        if activation is None:
            return False
        return await activation.abort_run(name, run_id, reason)

    @ray.method(concurrency_group=CONTROL_GROUP)
    async def abort_run(self, name: str, run_id: str, reason: str = "aborted") -> bool:
        """Abort run ``run_id`` of agent ``name``; False if it is not live here."""
        return await self._on_main(lambda: self._abort_main(name, run_id, reason))

    async def _activity_main(self, name: str) -> dict[str, Any]:
        activation = self.activations.get(name)
        if activation is None:
            return {
                "bound": False,
                "busy": False,
                "idle_for": 0.0,
                "fresh": False,
                "bound_for": 0.0,
            }
        return await activation.activity(name)

    @ray.method(concurrency_group=CONTROL_GROUP)
    async def activity(self, name: str) -> dict[str, Any]:
        """:meth:`SessionActor.activity` of agent ``name`` (``bound`` False when it is
        not hosted here)."""
        return await self._on_main(lambda: self._activity_main(name))

    async def until_idle(
        self, name: str, timeout: float = 10.0, fresh_grace: float = 0.0
    ) -> dict[str, Any]:
        """:meth:`SessionActor.until_idle` of agent ``name``."""
        self._claim_main()
        activation = self.activations.get(name)
        if activation is None:
            return await self._activity_main(name)
        return await activation.until_idle(name, timeout, fresh_grace)

    @ray.method(concurrency_group=CONTROL_GROUP)
    async def watch_host(self) -> None:
        """Return after ``WATCH_RENEW`` seconds, to be called again. The directory keeps
        one pending per host: if the process dies, it fails, and the directory learns
        that all its agents are gone. (The renewal bounds what a directory that died
        leaves pending here.)"""
        await asyncio.sleep(WATCH_RENEW)

    # -- a replacement directory ---------------------------------------------------------

    async def rehome(self, directory: Any) -> dict[str, Any]:
        """A replacement directory takes this host over: each activation reports to it
        from now on. Returns :meth:`settled`'s info at once."""
        self._claim_main()
        for activation in list(self.activations.values()):
            await activation.rehome(directory)
        return self._report()

    async def settled(self, timeout: float = 10.0) -> dict[str, Any]:
        """:meth:`ready`'s info once no bind or hibernation is in flight in any
        activation (or after ``timeout`` seconds)."""
        self._claim_main()
        deadline = time.monotonic() + timeout
        for activation in list(self.activations.values()):
            left = max(0.0, deadline - time.monotonic())
            await activation.settled(left)
        return self._report()

    def _report(self) -> dict[str, Any]:
        info = self._info()
        info["state"] = "host"
        info["namespaces"] = {name: _namespace_of(a) for name, a in list(self.activations.items())}
        return info

    # -- live view ---------------------------------------------------------------------

    @ray.method(concurrency_group=CONTROL_GROUP)
    async def snapshot(self, name: str | None = None) -> dict[str, Any]:
        """:meth:`SessionActor.snapshot` of agent ``name`` (of the host itself, with
        every agent's, when None), read from memory on the control thread: it answers
        even while the agents' loop is busy."""
        if name is not None:
            activation = self.activations.get(name)
            if activation is None:
                return {"agent": None, "state": "idle", "sessions": []}
            snap = await _retrying(activation.snapshot)
            snap["host"] = self._status()
            return snap
        agents = [await _retrying(a.snapshot) for a in list(self.activations.values())]
        return {**self._status(), "agents": agents}

    def _status(self) -> dict[str, Any]:
        return {
            "actor_id": self.actor_id,
            "pid": os.getpid(),
            "capacity": self.capacity,
            "hosted": len(self.activations),
            "busy": sum(1 for a in list(self.activations.values()) if a.busy()),
            "loop_lag_s": round(self.lag_max, 4),
        }

    @ray.method(concurrency_group=CONTROL_GROUP)
    async def host_status(self) -> dict[str, Any]:
        """The host at a glance: capacity, agents hosted and busy, loop lag (the most
        over the last ``LAG_WINDOW`` seconds), pid. Answers from the control thread."""
        return {**self._info(), **self._status()}


def _portable(error: BaseException) -> BaseException:
    """``error`` if it survives a pickle round trip (a reply of ``bind_many`` carries
    it as a value); otherwise an :class:`InvalidStateError` that says what it was, so
    one agent's odd error does not fail its siblings' reply."""
    try:
        ray_pickle.loads(ray_pickle.dumps(error))
    except Exception:  # noqa: BLE001 - any failure to travel
        return InvalidStateError(f"bind failed: {type(error).__name__}: {error}")
    return error


async def _retrying(read: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """A snapshot read from another thread than the one changing it may meet a dict
    resized under it: read again."""
    for _ in range(4):
        try:
            return await read()
        except RuntimeError:
            await asyncio.sleep(0)
    return await read()


def _namespace_of(activation: SessionActor) -> str | None:
    """The namespace of the agent an activation hosts, binds or hibernates."""
    spec = activation._transit or activation.spec
    return spec.namespace if spec is not None else None


RemoteAgentHost = ray.remote(concurrency_groups={CONTROL_GROUP: CONTROL_CONCURRENCY})(AgentHost)  # type: ignore[call-overload]
