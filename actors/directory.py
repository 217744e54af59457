"""The namespace directory: one Ray actor per namespace that maps agent names to the
live actor hosting each, keeps a warm pool of generic session actors, caps the number
of live agents (least recently used idle ones hibernate first) and wakes hibernated
agents when an alarm is due.

Why a pool: creating a Ray actor costs ~0.5 s here (1.5 s with anthropic imported)
and actors come up at ~2.3/s, while opening a DuckDB file costs ~25 ms. A wake binds a
pre-started actor and never creates one unless the pool is empty.

Concurrency: a per-name asyncio lock makes get-or-create exactly-once (two processes
resolving one name get one actor and one writer); an entry being hibernated is
removed only after its file is closed, so a concurrent resolve waits on the lock and
never opens a file that is still held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from thinkray.actors.errors import InvalidStateError
from thinkray.actors.session_actor import DEFAULT_PRELOAD, BindSpec, RemoteSessionActor
from thinkray.storage.errors import DatabaseLockedError
from thinkray.storage.layout import ensure_root, session_path, validate_name
from thinkray.storage.types import SessionNotFoundError

log = logging.getLogger("thinkray.directory")


@dataclass
class NamespaceConfig:
    """How a namespace hosts its agents: where their files live, the agent class and
    its keyword arguments, the warm pool size, the live cap, the idle timeout before
    hibernation, after how many bindings an actor process is recycled, and the Ray
    options of the session actors."""

    namespace: str
    storage_root: str
    agent_cls: type
    agent_kwargs: dict[str, Any] = field(default_factory=dict)
    pool_size: int = 2
    max_live: int = 64
    idle_timeout: float | None = 300.0
    recycle_after: int = 200
    actor_options: dict[str, Any] = field(default_factory=dict)
    preload: tuple[str, ...] = DEFAULT_PRELOAD
    cap_wait: float = 5.0  # how long a wake waits at the live cap before exceeding it


@dataclass
class PooledActor:
    """A generic session actor of the pool: its handle, where it runs, and how many
    agents it has hosted so far (``bindings``)."""

    handle: Any
    actor_id: str
    node_id: str
    pid: int
    bindings: int = 0


@dataclass
class Entry:
    """A live agent: the pooled actor bound to it and since when."""

    actor: PooledActor
    bound_at: float = field(default_factory=time.time)


class Directory:
    """The directory of one namespace (see the module); run as a named Ray actor.

    Raises:
        InvalidInputError: an invalid namespace name.
        StorageRootError: the storage root is not a writable directory.
    """

    def __init__(self, config: NamespaceConfig) -> None:
        validate_name(config.namespace, "namespace")
        ensure_root(config.storage_root, config.namespace)
        self.cfg = config
        self.entries: dict[str, Entry] = {}
        self.free: list[PooledActor] = []
        self.starting = 0
        self.binding = 0  # binds in flight: they count toward the live cap
        self._admission = asyncio.Lock()
        self.locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self.alarms: dict[str, float] = {}
        self._alarm_changed: asyncio.Event | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self.counters: defaultdict[str, int] = defaultdict(int)
        self._closed = False

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def start(self) -> dict[str, Any]:
        """Fill the pool and start the alarm loop (idempotent)."""
        if self._alarm_changed is None:
            self._alarm_changed = asyncio.Event()
            self._spawn(self._alarm_loop())
        await self._top_up()
        return await self.stats()

    # -- pool ------------------------------------------------------------------------

    def _new_actor(self, node_id: str | None = None) -> Any:
        options: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 1000}
        options.update(self.cfg.actor_options)
        if node_id is not None:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
            options.pop("resources", None)
        return RemoteSessionActor.options(**options).remote(self.cfg.preload)

    async def _start_actor(self, node_id: str | None = None) -> PooledActor:
        handle = self._new_actor(node_id)
        info = await handle.ready.remote()
        self.counters["actors_created"] += 1
        return PooledActor(handle, info["actor_id"], info["node_id"], info["pid"])

    async def _top_up(self) -> None:
        # Spare processes beyond the live cap are useless (a wake at the cap reuses the
        # actor of the agent it hibernates), and starting one costs ~1 s of CPU.
        headroom = self.cfg.max_live + 1 - len(self.entries) - self.binding - len(self.free)
        missing = min(self.cfg.pool_size - len(self.free), headroom) - self.starting
        if missing <= 0 or self._closed:
            return
        self.starting += missing

        async def one() -> None:
            try:
                actor = await self._start_actor()
                if self._closed:
                    ray.kill(actor.handle)
                else:
                    self.free.append(actor)
            except Exception as exc:
                log.warning("could not start a pooled actor: %s", exc)
            finally:
                self.starting -= 1

        await asyncio.gather(*(one() for _ in range(missing)))

    async def _take_actor(self, node_id: str | None) -> PooledActor:
        for i, actor in enumerate(self.free):
            if node_id is None or actor.node_id == node_id:
                self.free.pop(i)
                self.counters["pool_hits"] += 1
                self._spawn(self._top_up())
                return actor
        self.counters["pool_misses"] += 1
        self._spawn(self._top_up())
        return await self._start_actor(node_id)

    def _release(self, actor: PooledActor) -> None:
        actor.bindings += 1
        if (
            self._closed
            or actor.bindings >= self.cfg.recycle_after
            or len(self.free) >= max(self.cfg.pool_size, 1) * 4
        ):
            # Recycle the process: long-lived workers accumulate memory.
            ray.kill(actor.handle, no_restart=True)
            self.counters["actors_recycled"] += 1
            return
        self.free.append(actor)

    # -- resolve ---------------------------------------------------------------------

    async def resolve(
        self,
        name: str,
        create: bool = True,
        stale_actor_id: str | None = None,
        node_id: str | None = None,
    ) -> tuple[Any, str]:
        """The live actor for ``name``, binding one if needed. ``stale_actor_id`` says
        the caller found that actor dead or no longer hosting ``name``."""
        validate_name(name)
        async with self.locks[name]:
            entry = self.entries.get(name)
            if entry is not None and stale_actor_id == entry.actor.actor_id:
                del self.entries[name]
                self.counters["stale_rebinds"] += 1
                with contextlib.suppress(Exception):
                    ray.kill(entry.actor.handle, no_restart=True)
                entry = None
            if entry is not None:
                return entry.actor.handle, entry.actor.actor_id
            return await self._bind(name, create, node_id)

    async def _bind(self, name: str, create: bool, node_id: str | None) -> tuple[Any, str]:
        path = session_path(self.cfg.storage_root, self.cfg.namespace, name)
        if not create and not path.exists():
            raise SessionNotFoundError(
                f"agent {name!r} does not exist in namespace {self.cfg.namespace!r}"
            )
        await self._make_room(name)
        self.binding += 1
        try:
            return await self._bind_admitted(name, path, create, node_id)
        finally:
            self.binding -= 1

    async def _bind_admitted(
        self, name: str, path: Any, create: bool, node_id: str | None
    ) -> tuple[Any, str]:
        spec = BindSpec(
            namespace=self.cfg.namespace,
            name=name,
            path=str(path),
            agent_cls=self.cfg.agent_cls,
            agent_kwargs=self.cfg.agent_kwargs,
            create=create,
            directory=ray.get_runtime_context().current_actor,
            idle_timeout=self.cfg.idle_timeout,
        )
        last_error: BaseException | None = None
        for _attempt in range(4):
            actor = await self._take_actor(node_id)
            try:
                await actor.handle.bind.remote(spec)
            except ray.exceptions.RayActorError as exc:
                last_error = exc  # the pooled actor died: take another
                continue
            except DatabaseLockedError as exc:
                # A killed previous owner's lock lingers ~50 ms; Database already
                # retried for a while, so give the actor back and try again.
                self.free.append(actor)
                last_error = exc
                await asyncio.sleep(0.1)
                continue
            except BaseException:
                self.free.append(actor)
                raise
            entry = Entry(actor)
            self.entries[name] = entry
            self.alarms.pop(name, None)  # the woken agent reports its own (note_alarm)
            self.counters["binds"] += 1
            self._spawn(self._watch(name, entry))
            return actor.handle, actor.actor_id
        raise InvalidStateError(f"could not bind {name!r}: {last_error}")

    async def _make_room(self, incoming: str) -> None:
        """Admission at the live cap (binds in flight count too): hibernate the least
        recently used idle agent and reuse its actor.

        One admission runs at a time, with one activity poll per attempt: under a wake
        storm the waiters queue on the lock instead of polling every actor. While every
        live agent is busy it waits briefly; after ``cap_wait`` the cap is exceeded
        rather than risk a deadlock (an orchestrator waiting on its sub-agents keeps
        them busy)."""
        if len(self.entries) + self.binding < self.cfg.max_live:
            return
        async with self._admission:
            deadline = time.monotonic() + self.cfg.cap_wait
            while len(self.entries) + self.binding >= self.cfg.max_live:
                names = [n for n in self.entries if n != incoming and not self.locks[n].locked()]
                reports = await asyncio.gather(
                    *(self.entries[n].actor.handle.activity.remote(n) for n in names),
                    return_exceptions=True,
                )
                idle = sorted(
                    (
                        (r["idle_for"], n)
                        for n, r in zip(names, reports, strict=True)
                        if isinstance(r, dict) and not r["busy"]
                    ),
                    reverse=True,
                )
                hibernated = False
                for _, victim in idle:
                    if victim in self.entries and await self.hibernate(victim):
                        self.counters["lru_hibernations"] += 1
                        hibernated = True
                        break
                if hibernated:
                    continue
                if time.monotonic() >= deadline:
                    self.counters["cap_exceeded"] += 1
                    return
                await asyncio.sleep(0.01)

    # -- hibernate -------------------------------------------------------------------

    async def hibernate(self, name: str, force: bool = False) -> bool:
        """Close ``name``'s file and return its actor to the pool. False if busy."""
        lock = self.locks[name]
        async with lock:
            entry = self.entries.get(name)
            if entry is None:
                return False
            try:
                report = await entry.actor.handle.hibernate.remote(name, force)
            except ray.exceptions.RayActorError:
                del self.entries[name]
                return True
            if not report.get("ok"):
                return False
            del self.entries[name]
            self.counters["hibernations"] += 1
            due = report.get("next_due_at")
            if due is not None:
                self.set_alarm(name, due)
            self._release(entry.actor)
            return True

    async def request_hibernate(self, name: str, actor_id: str) -> bool:
        """An actor's idle timer asks to hibernate its agent."""
        entry = self.entries.get(name)
        if entry is None or entry.actor.actor_id != actor_id:
            return False
        return await self.hibernate(name)

    async def hibernate_all(self, force: bool = False) -> int:
        """:meth:`hibernate` every live agent at once (busy ones too with ``force``);
        returns how many hibernated."""
        results = await asyncio.gather(*(self.hibernate(n, force) for n in list(self.entries)))
        return sum(1 for r in results if r)

    # -- alarms ----------------------------------------------------------------------

    def set_alarm(self, name: str, due_at: float) -> None:
        """Wake ``name`` at ``due_at`` (epoch seconds) if it is hibernated then."""
        current = self.alarms.get(name)
        if current is None or due_at < current:
            self.alarms[name] = due_at
        if self._alarm_changed is not None:
            self._alarm_changed.set()

    def note_alarm(self, name: str, due_at: float | None) -> None:
        """A live agent's next alarm changed (None: it has none). Kept so that the
        alarm still fires if the agent's process dies before it is due."""
        if due_at is None:
            self.alarms.pop(name, None)
        else:
            self.alarms[name] = due_at
        if self._alarm_changed is not None:
            self._alarm_changed.set()

    async def _watch(self, name: str, entry: Entry) -> None:
        """Learn of the death of ``name``'s actor as it happens: its ``watch`` call
        fails. The agent is then no longer live; its next call (or alarm) wakes it on
        another actor, and a pending alarm fires on time."""
        try:
            await entry.actor.handle.watch.remote(name)
        except ray.exceptions.RayActorError:
            if self.entries.get(name) is entry:
                del self.entries[name]
                self.counters["crashes"] += 1
                log.warning("the actor of %s died; it wakes on its next call or alarm", name)
                if self._alarm_changed is not None:
                    self._alarm_changed.set()
        except Exception:  # the directory is shutting down
            return

    async def _alarm_loop(self) -> None:
        assert self._alarm_changed is not None
        while not self._closed:
            self._alarm_changed.clear()
            timeout = None
            if self.alarms:
                timeout = max(0.0, min(self.alarms.values()) - time.time())
            try:
                await asyncio.wait_for(self._alarm_changed.wait(), timeout)
                continue
            except TimeoutError:
                pass
            now = time.time()
            for name, due in list(self.alarms.items()):
                if due <= now:
                    self.alarms.pop(name, None)
                    if name not in self.entries:
                        self._spawn(self._wake_for_alarm(name))

    async def _wake_for_alarm(self, name: str) -> None:
        try:
            await self.resolve(name, create=False)
            self.counters["alarm_wakes"] += 1
        except Exception as exc:
            log.warning("alarm wake of %s failed: %s", name, exc)

    # -- introspection ---------------------------------------------------------------

    async def stats(self) -> dict[str, Any]:
        """The namespace, its storage root, live agents (name → actor id), the free
        pool size, actors starting, pending alarms and the event counters."""
        return {
            "namespace": self.cfg.namespace,
            "storage_root": self.cfg.storage_root,
            "live": {n: e.actor.actor_id for n, e in self.entries.items()},
            "free": len(self.free),
            "starting": self.starting,
            "alarms": dict(self.alarms),
            "counters": dict(self.counters),
        }

    async def live_actor(self, name: str) -> dict[str, Any] | None:
        """Where ``name`` runs (``actor_id``, ``node_id``, ``pid``), or None when it is
        not live."""
        entry = self.entries.get(name)
        if entry is None:
            return None
        return {
            "actor_id": entry.actor.actor_id,
            "node_id": entry.actor.node_id,
            "pid": entry.actor.pid,
        }

    async def shutdown(self) -> None:
        """Hibernate everything (forcing), then stop every actor this directory made."""
        await self.hibernate_all(force=True)
        self._closed = True
        if self._alarm_changed is not None:
            self._alarm_changed.set()
        for actor in self.free:
            with contextlib.suppress(Exception):
                ray.kill(actor.handle, no_restart=True)
        self.free.clear()


RemoteDirectory = ray.remote(Directory)
