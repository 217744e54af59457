"""The session actor: a pooled Ray actor that hosts one agent (``Think``) at a time.

An actor starts generic (imports done, nothing bound) and waits in the namespace's
warm pool. ``bind`` opens the agent's DuckDB file and builds a fresh ``Think`` from it
(the Durable Object constructor path: nothing is carried over from an earlier
binding); ``hibernate`` refuses while anything is in flight, otherwise closes the
file (checkpoint, no ``.wal``) and makes the actor generic again. While either is in
flight the actor says so (``state``: :data:`ActorState`) and refuses another bind
(:class:`~thinkray.actors.errors.ActorBusyError`); a bind whose ``on_wake`` raises is
undone and raises :class:`~thinkray.actors.errors.WakeError`.

Every RPC names the agent it is meant for. An actor that does not host that agent
raises :class:`~thinkray.actors.relay.NotBoundError`, and the caller's handle re-resolves.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import ray
from thinkray.actors.errors import ActorBusyError, RemoteCallError, WakeError
from thinkray.actors.lane import LaneAddress, LaneServer, start_lane
from thinkray.actors.metrics import install_ray_metrics
from thinkray.actors.relay import NotBoundError, as_callback
from thinkray.runtime.observability import tracing
from thinkray.runtime.observability.metrics import metrics
from thinkray.runtime.observability.setup import configure_from_env
from thinkray.runtime.remote import Batch, RemoteMethod, check_arguments, remote_methods
from thinkray.storage.objectstore import (
    LeaseLostError,
    NotDurableError,
    RemoteSession,
    StaleOwnerError,
    default_cache_dir,
    is_uri,
    root_of_session_uri,
)
from thinkray.storage.types import SessionNotFoundError

if TYPE_CHECKING:
    from thinkray.runtime.agents.think import Think
    from thinkray.storage.session_store import DuckDBSessionStore

# The agent's machinery (Think, its turn loop, the session store, DuckDB) is imported by
# the actor's own process, at its start (DEFAULT_PRELOAD) or its first bind, never at
# this module's import: a directory imports this module to create session actors and
# needs none of it (~0.1 CPU-s less in each directory process).

log = logging.getLogger("thinkray.actor")

DEFAULT_PRELOAD = (
    "thinkray.runtime.agents.think",
    "thinkray.runtime.turn.loop",
    "thinkray.storage.session_store",
)
# Relay batches wait at least this long to gather chunks: ~2 ms of latency for far
# fewer Ray items per turn (each costs the actor and the consumer ~0.3-0.5 ms); longer,
# up to RELAY_MAX_WINDOW, while the consumer is slow to take them (runtime Pacing).
RELAY_COALESCE = 0.002
RELAY_MAX_WINDOW = 0.1
# How long a turn's stream header waits to travel with the first batch of chunks.
HEADER_WAIT = 0.02
# How long each of the agent's hibernation hooks (``on_hibernate``, then ``aclose``)
# may take before the actor closes the agent anyway: a hook that never returns must
# not keep the actor (and the agent's file) bound forever.
HIBERNATE_STEP_TIMEOUT = 30.0

ActorState = Literal["idle", "binding", "bound", "hibernating", "broken"]
"""What a session actor is doing: ``idle`` (generic: a spare), ``binding`` (a bind is
in flight, ``on_wake`` included), ``bound`` (it hosts an agent), ``hibernating`` (a
hibernation is in flight, its upload included), ``broken`` (a failed wake could not
close the agent's database: only stopping the process frees its file). Only an idle
actor may bind; a directory rebuilding its map waits for the transient states to end
instead of taking such an actor for a spare."""


@dataclass(frozen=True)
class AgentClassRef:
    """An agent class carried as its pickle by a process that only passes it on: a
    namespace's directory routes binds to the class but never runs it, and unpickling
    the class there imported its module and all it pulls in (``Think``, DuckDB, the
    rest of the runtime: ~0.12 s of CPU at every directory's start on 2 cores, and the
    user's module-level code in the directory's process). The session actor or host
    that runs the agent loads it (:func:`agent_class`)."""

    module: str
    qualname: str
    payload: bytes  # ray.cloudpickle of the class: by reference, by value if dynamic

    @classmethod
    def of(cls, agent_cls: type) -> AgentClassRef:
        """The reference to ``agent_cls``."""
        return cls(agent_cls.__module__, agent_cls.__qualname__, ray.cloudpickle.dumps(agent_cls))

    def load(self) -> type:
        """The class (imports its module). cloudpickle keeps one class object per
        dynamic class in a process, so a by-value class loaded at every bind is the
        same class each time."""
        return ray.cloudpickle.loads(self.payload)


def agent_class(value: type | AgentClassRef) -> type:
    """The class itself, loaded from its reference if needed."""
    return value.load() if isinstance(value, AgentClassRef) else value


def agent_module(value: type | AgentClassRef) -> str:
    """The module that defines the agent class (without importing it)."""
    return value.module if isinstance(value, AgentClassRef) else value.__module__


@dataclass
class BindSpec:
    """What a session actor needs to host agent ``name`` of ``namespace``: its database
    file, the agent class and keyword arguments, whether a missing file may be created,
    and the directory to report alarms and idleness to."""

    namespace: str
    name: str
    path: str
    agent_cls: type[Think] | AgentClassRef
    agent_kwargs: dict[str, Any] = field(default_factory=dict)
    create: bool = True
    directory: Any = None  # the namespace directory's actor handle
    idle_timeout: float | None = None


class SessionActor:
    """Generic host. Use through :class:`thinkray.actors.namespace.AgentNamespace` handles.

    ``hibernate_timeout``: seconds each hibernation hook of the agent may take (see
    :data:`HIBERNATE_STEP_TIMEOUT`)."""

    hibernate_timeout = HIBERNATE_STEP_TIMEOUT

    def __init__(
        self,
        preload: tuple[str, ...] = DEFAULT_PRELOAD,
        warm_up: bool = True,
        agent_module: str | None = None,
        serves_lane: bool = False,
        hosted: bool = False,
    ) -> None:
        for module in preload:
            importlib.import_module(module)
        if agent_module is not None:
            # The first BindSpec would import it. Not found: the class travels by value.
            with contextlib.suppress(ImportError):
                importlib.import_module(agent_module)
        configure_from_env()  # tracing in this process, as the environment says
        self._warm_up_pending = warm_up
        ctx = ray.get_runtime_context()
        self.actor_id = ctx.get_actor_id()
        self.node_id = ctx.get_node_id()
        self.agent: Think | None = None
        self.name: str | None = None
        self.spec: BindSpec | None = None
        self.bindings = 0
        self.inflight = 0
        self.last_activity = self.bound_at = time.monotonic()
        self._watcher: asyncio.Task[None] | None = None
        self._remote: RemoteSession | None = None  # under an object-store root
        self._renewer: asyncio.Future[None] | None = None
        self._shipping = asyncio.Lock()  # turn-log entries go out one at a time, in order
        self._unbound = asyncio.Event()
        self.state: ActorState = "idle"
        self._transit: BindSpec | None = None  # the agent a bind or hibernation is for
        self._steady = asyncio.Event()  # set while no bind or hibernation is in flight
        self._steady.set()
        self._broken = False
        # A dedicated actor serves its streams to callers on its node over a Unix
        # socket (thinkray.actors.lane); a host's activations are served by the host's.
        self._serves_lane = serves_lane
        # An agent host's activation: its agents share the host's event loop, so on a
        # slow disk their turns sync off it (Think.syncs_off_loop).
        self._hosted = hosted
        self._lane: LaneServer | None = None
        install_ray_metrics()  # the runtime's metrics go to Ray's Prometheus endpoint

    # -- lifecycle ---------------------------------------------------------------------

    async def ready(self, directory: Any = None) -> dict[str, Any]:
        """Where this actor runs (``actor_id``, ``node_id``, ``pid``), its binding
        count and the agent it hosts (``bound``, or None). The first call warms the
        actor up (see :meth:`_warm_up`) before answering.

        ``directory``: the namespace directory's handle as binds send it (a
        :class:`~thinkray.actors.handles.NamedHandle`), resolved as this call arrives:
        the lookup (a GCS call, and the import of the directory's module with Ray's
        wrapping of its methods, ~0.1 CPU-s in a fresh process) is done before the
        first bind, not inside it, where it held up every bind of a burst."""
        del directory  # resolved by its arrival; binds bring their own
        if self._warm_up_pending:
            self._warm_up_pending = False
            try:
                await self._warm_up()
            except Exception as exc:  # a cold actor still works
                log.warning("warm-up of a pooled actor failed: %s", exc)
        if self._serves_lane and self._lane is None:
            self._lane = await start_lane(self.invoke_stream, self.node_id, "session actor")
        return self._info()

    async def lane(self) -> LaneAddress | None:
        """Where this actor's stream lane listens, with its secret (None: no lane)."""
        return self._lane.address if self._lane is not None else None

    async def _warm_up(self) -> None:
        """Bind a throwaway agent to a scratch file, run one turn and hibernate it.

        A fresh process pays for much on its first bind and turn (DuckDB's first
        database, code run once, caches): ~130 ms of CPU against ~55 ms later. A pooled
        actor does it while it waits, so the first agent it hosts does not."""
        if self.state != "idle":
            return
        from thinkray.actors.warm_up import WarmUpAgent

        with tempfile.TemporaryDirectory(prefix="thinkray-warm-up-") as scratch:
            spec = BindSpec("warm-up", "warm-up", f"{scratch}/warm-up.duckdb", WarmUpAgent)
            await self.bind(spec)
            try:
                assert self.agent is not None
                run = self.agent.start_chat("warm up")
                async for _batch in run.stream.follow(coalesce=RELAY_COALESCE):
                    pass
                if run.task is not None:
                    await run.task
            finally:
                await self.hibernate("warm-up", force=True)
                self.bindings = 0

    def _info(self) -> dict[str, Any]:
        return {
            "actor_id": self.actor_id,
            "node_id": self.node_id,
            "pid": os.getpid(),
            "bindings": self.bindings,
            "bound": self.name if self.state == "bound" else None,
            "state": self.state,
            "session": self._session(),
            "lane_streams": self._lane.streams if self._lane is not None else None,
            "lane_connections": self._lane.connections if self._lane is not None else None,
        }

    def _session(self) -> str | None:
        """The agent this actor hosts, binds or hibernates (None when generic)."""
        return self._transit.name if self._transit is not None else self.name

    @contextmanager
    def _transition(self, state: ActorState, spec: BindSpec | None) -> Iterator[None]:
        """A bind or hibernation of ``spec``'s agent is in flight: reported as ``state``
        until it ends, then as ``bound`` or ``idle`` (whichever it left)."""
        self.state, self._transit = state, spec
        self._steady.clear()
        try:
            yield
        finally:
            self._transit = None
            if self._broken:
                self.state = "broken"
            else:
                self.state = "bound" if self.agent is not None else "idle"
            self._steady.set()

    async def bind(self, spec: BindSpec, trace: dict[str, str] | None = None) -> dict[str, Any]:
        """Open the agent's file, construct the agent and wake it (``on_wake``);
        returns :meth:`ready`'s info plus ``bind_ms`` and the file's ``bytes`` (None if
        unknown). Traced as ``thinkray.wake``, in the trace of the call that caused it
        (``trace``: that caller's context).

        Raises:
            ActorBusyError: this actor hosts an agent, or a bind or hibernation is in
                flight on it (nothing changed).
            SessionNotFoundError: the file does not exist and ``spec.create`` is False.
            DatabaseLockedError: another process holds the file.
            WakeError: ``on_wake`` raised; the bind was undone (see :meth:`_undo_bind`).
        """
        if self.state != "idle":
            raise ActorBusyError(self.state, self._session())
        with self._transition("binding", spec):
            info = await self._bind_traced(spec, trace)
        info.update(self._info())  # bound now
        return info

    async def _bind_traced(self, spec: BindSpec, trace: dict[str, str] | None) -> dict[str, Any]:
        if not tracing.enabled() or spec.namespace == "warm-up":
            return await self._bind_now(spec)
        attributes = {
            "gen_ai.agent.name": spec.name,
            "thinkray.namespace": spec.namespace,
            "thinkray.actor.id": self.actor_id,
            "thinkray.actor.bindings": self.bindings,
        }
        with tracing.attached(trace), tracing.span("thinkray.wake", attributes) as span:
            info = await self._bind_now(spec)
            tracing.set_attributes(span, {"thinkray.file.bytes": info.get("bytes")})
            return info

    async def _bind_now(self, spec: BindSpec) -> dict[str, Any]:
        started = time.perf_counter()
        remote = await self._open_remote(spec)  # an object-store root: lease + download
        path = remote.local_path if remote is not None else Path(spec.path)
        store: DuckDBSessionStore | None = None
        try:
            if not spec.create and not path.exists():
                raise SessionNotFoundError(
                    f"agent {spec.name!r} does not exist in namespace {spec.namespace!r}"
                )
            from thinkray.runtime.agents.context import AgentContext, constructing
            from thinkray.storage.session_store import DuckDBSessionStore

            # Under an object-store root a turn is durable once DuckDB's WAL is shipped
            # (see _ship): its writes go straight to DuckDB, not to the local journal.
            # Off the loop: a new file is synced to disk, and the open replays a journal
            # a crash left (an agent host's siblings keep running meanwhile).
            store = await asyncio.to_thread(DuckDBSessionStore, path, journal=remote is None)
            root = remote.root if remote is not None else str(path.parent.parent)
            context = AgentContext(
                name=spec.name,
                namespace=spec.namespace,
                storage_root=root,
                make_durable=_Shipper(self, remote, store) if remote is not None else None,
            )
            with constructing(context):
                agent = agent_class(spec.agent_cls)(store, **spec.agent_kwargs)
            if self._hosted and agent.syncs_off_loop is None:
                agent.syncs_off_loop = True
        except BaseException:
            if store is not None:
                store.close()
            if remote is not None:
                self._remote = None
                await asyncio.to_thread(remote.release)
            raise
        self.agent, self.name, self.spec = agent, spec.name, spec
        self._remote = remote
        if remote is not None:
            self._renewer = asyncio.ensure_future(self._renew_lease(remote))
        self.bindings += 1
        self._unbound = asyncio.Event()
        if spec.directory is not None:
            # The namespace keeps this agent's next alarm as it changes, so an alarm
            # survives a crash of this process (the directory then wakes the agent).
            _report_wakes(agent, spec.directory, spec.name)
        self.last_activity = self.bound_at = time.monotonic()
        try:
            await _maybe_await(getattr(agent, "on_wake", None))
        except Exception as exc:
            raise await self._undo_bind(spec, exc) from exc
        # A directory that took this actor over meanwhile (rehome) may have started one.
        if (
            spec.idle_timeout
            and spec.directory is not None
            and (self._watcher is None or self._watcher.done())
        ):
            self._watcher = asyncio.ensure_future(self._watch_idle(spec.idle_timeout))
        info = self._info()
        seconds = time.perf_counter() - started
        info["bind_ms"] = seconds * 1000
        info["bytes"] = _file_bytes(path)
        if spec.namespace != "warm-up":
            tags = {"namespace": spec.namespace}
            metrics().count("thinkray_wakes_total", 1, tags)
            metrics().observe("thinkray_wake_seconds", seconds, tags)
        return info

    async def _undo_bind(self, spec: BindSpec, exc: BaseException) -> WakeError:
        """``on_wake`` raised: close the agent (its database and file), give up the
        lease without uploading (what the failed wake wrote is not a generation: the
        next wake downloads the last one) and become generic again. The WakeError to
        raise says whether that worked; if the database would not close, the actor is
        ``broken`` (it refuses binds; the directory stops its process, which frees the
        file)."""
        agent = self.agent
        self.agent, self.name, self.spec = None, None, None
        self._unbound.set()
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        if self._renewer is not None:
            self._renewer.cancel()
            self._renewer = None
        clean = True
        if agent is not None:
            try:
                await _maybe_await(getattr(agent, "aclose", None))
            except Exception as close_error:  # closing the store below matters more
                log.warning("aclose of %s after a failed wake: %s", spec.name, close_error)
            try:
                agent.close()
            except Exception as close_error:
                log.error("could not close %s after a failed wake: %s", spec.name, close_error)
                clean = False
        remote, self._remote = self._remote, None
        if remote is not None:
            try:
                await asyncio.to_thread(remote.release)
            except Exception as release_error:  # an unreleased lease expires anyway
                log.warning("releasing %s after a failed wake: %s", spec.name, release_error)
        self._broken = self._broken or not clean
        cause = f"{type(exc).__name__}: {exc}"
        log.warning("wake of %s failed in on_wake: %s", spec.name, cause)
        return WakeError(spec.name, cause, clean)

    def busy(self) -> bool:
        """Whether the hosted agent must not hibernate now: a call in flight, a run,
        or work the agent reports pending (``has_pending_work``)."""
        agent = self.agent
        if agent is None:
            return False
        return self.inflight > 0 or bool(agent.turns.runs) or _has_pending_work(agent)

    async def hibernate(self, name: str, force: bool = False) -> dict[str, Any]:
        """Close the agent and become generic. Refused (``ok: False``) while busy.
        Returns ``ok``, ``was_bound``, the agent's ``next_due_at`` and its file's
        ``bytes`` (None if unknown). Traced as ``thinkray.hibernate``. Refused with the
        actor's state as ``reason`` while a bind or hibernation of ``name`` is in
        flight."""
        if self._transit is not None and self._transit.name == name:
            return {"ok": False, "reason": self.state}
        if self.state != "bound" or self.name != name:
            return {"ok": True, "was_bound": False}
        if self.busy() and not force:
            return {"ok": False, "reason": "busy"}
        with self._transition("hibernating", self.spec):
            return await self._hibernate_traced(name)

    async def _hibernate_traced(self, name: str) -> dict[str, Any]:
        if not tracing.enabled() or name == "warm-up":
            return await self._hibernate_now()
        attributes = {"gen_ai.agent.name": name, "thinkray.actor.id": self.actor_id}
        if self.spec is not None:
            attributes["thinkray.namespace"] = self.spec.namespace
        with tracing.span("thinkray.hibernate", attributes) as span:
            done = await self._hibernate_now()
            tracing.set_attributes(span, {"thinkray.file.bytes": done.get("bytes")})
            return done

    async def _hibernate_now(self) -> dict[str, Any]:
        from thinkray.storage import fleet_index

        agent, spec = self.agent, self.spec
        assert agent is not None  # hibernate checked it
        name = self.name
        next_due = None
        row = None
        stuck: list[str] = []
        try:
            next_due = await _maybe_await(getattr(agent, "next_alarm_at", None))
            if not await _bounded(getattr(agent, "on_hibernate", None), self.hibernate_timeout):
                stuck.append("on_hibernate")
            # fleet index row, put after the close (see below).
            # Off the loop: it folds the journal, summarizes the whole file and
            # checkpoints (~10 ms for a short session, more for a long one), and an
            # agent host's siblings share the loop. The agent is idle; a timer of its
            # own that fires meanwhile waits for the file's lock.
            row = await asyncio.to_thread(
                fleet_index.write_index_row, agent.store, getattr(spec, "path", None), put=False
            )
        finally:
            self.agent, self.name, self.spec = None, None, None
            self._unbound.set()
            if self._watcher is not None:
                self._watcher.cancel()
                self._watcher = None
            if not await _bounded(getattr(agent, "aclose", None), self.hibernate_timeout):
                stuck.append("aclose")
            if stuck:
                log.error(
                    "hibernating %s: %s did not return within %g s; the agent was closed "
                    "anyway (its timers and tasks cancelled, its file closed)",
                    name,
                    " and ".join(stuck),
                    self.hibernate_timeout,
                )
            try:
                if not agent.turns.runs and not stuck:
                    # The file's close off the loop too: its vacuum rewrites a small file
                    # (thinkray.storage.vacuum, ~6 ms). A run in flight (or work a stuck
                    # hook left) is first stopped by agent.close, on the loop, which then
                    # closes the file.
                    await asyncio.to_thread(agent.store.close)
            finally:  # a close that failed: the agent's timers and tasks stop all the same
                agent.close()
        local = self._remote.local_path if self._remote is not None else None
        size = _file_bytes(local or Path(spec.path)) if spec is not None else None
        if self._remote is not None and spec is not None:
            await self._commit_remote(spec)
        if row is not None and spec is not None:
            # Put once the file is closed (a vacuum may have shrunk it) and, under an
            # object-store root, committed: the row describes what the store keeps.
            if size is not None:
                row["bytes"] = size
            await asyncio.to_thread(fleet_index.put_index_row, spec.path, row)
        if spec is not None and spec.namespace != "warm-up":
            metrics().count("thinkray_hibernations_total", 1, {"namespace": spec.namespace})
        done: dict[str, Any] = {"ok": True, "was_bound": True, "next_due_at": next_due}
        done["bytes"] = size
        if stuck:
            done["timed_out"] = stuck  # hooks cut off by hibernate_timeout
        return done

    # -- object-store roots (thinkray.storage.objectstore) -------------------------------

    async def _open_remote(self, spec: BindSpec) -> RemoteSession | None:
        """Under an object-store root: take the session's lease and download its newest
        generation into this node's cache (or reuse a valid local copy), replay its turn
        log and commit a fence generation (every earlier owner's writes now fail). None
        for a local root."""
        if not is_uri(spec.path):
            return None
        remote = self._remote
        if remote is not None and remote.held and remote.prefix == f"{spec.namespace}/{spec.name}":
            return remote  # bound again after a failed upload: the local file is newest
        remote = RemoteSession(
            root_of_session_uri(spec.path, spec.namespace, spec.name),
            spec.namespace,
            spec.name,
            owner=f"{self.node_id[:12]}.{os.getpid()}.{uuid.uuid4().hex[:8]}",
            cache_dir=default_cache_dir() / self.node_id[:16],
        )
        await asyncio.to_thread(remote.acquire)
        try:
            await asyncio.to_thread(remote.fetch)
        except BaseException:
            await asyncio.to_thread(remote.release)
            raise
        return remote

    async def _ship(self, remote: RemoteSession, store: DuckDBSessionStore) -> None:
        """Make what ``store`` committed so far durable in the object store (the end of
        a turn, before its ``finish``): the WAL written since the last entry as the next
        turn-log entry, or, after a checkpoint rewrote the file (or for a session's
        first generation), the whole file as the next generation.

        Raises:
            NotDurableError: the agent is no longer hosted here.
            StaleOwnerError: a takeover fenced this owner out.
            UploadError: the store could not be reached after retries.
        """
        async with self._shipping:
            if self._remote is not remote or store.closed:
                raise NotDurableError(f"session {remote.prefix} is no longer hosted here")
            # On this loop's thread, between writes: what is taken ends at a commit.
            upload = remote.prepare_ship(store.checkpoint)
            if upload is not None:
                await asyncio.to_thread(upload)

    async def _renew_lease(self, remote: RemoteSession) -> None:
        while self._remote is remote:
            await asyncio.sleep(remote.lease_ttl / 3)
            if self._remote is not remote:
                return
            try:
                await asyncio.to_thread(remote.renew)
            except LeaseLostError as exc:
                log.error("%s: lost its lease; its hibernation will be refused", exc)
                return
            except Exception as exc:  # the store is unreachable: try again
                log.warning("renewing the lease of %s failed: %s", remote.prefix, exc)

    async def _commit_remote(self, spec: BindSpec) -> None:
        """Upload the closed file as the next generation and release the lease. An
        upload that fails (after retries) leaves the previous generation intact: the
        agent is bound again from its local file and the error goes to the caller."""
        remote = self._remote
        assert remote is not None
        if self._renewer is not None:
            self._renewer.cancel()
            self._renewer = None
        try:
            async with self._shipping:  # a turn's entry in flight lands before the seal
                await asyncio.to_thread(remote.commit)
        except StaleOwnerError:
            self._remote = None  # not ours to write any more: the local copy is dropped
            raise
        except BaseException:
            await self._bind_now(spec)  # still hibernating: this actor is not generic
            raise
        self._remote = None
        await asyncio.to_thread(remote.release)

    async def _watch_idle(self, idle_timeout: float) -> None:
        # Sleeps until the agent could be idle for idle_timeout, not on a fixed tick:
        # a live actor that nobody calls wakes once per timeout, not every few seconds.
        from thinkray.storage import fleet_index

        wait = idle_timeout
        while self.agent is not None:
            await asyncio.sleep(max(0.05, wait))
            if self.agent is None or self.spec is None:
                return
            fleet_index.refresh_if_due(self.agent.store, self.spec.path)  # live agent
            if self.busy():
                self.last_activity = time.monotonic()
                wait = min(idle_timeout, 5.0)  # a run in flight: look again soon
                continue
            wait = self.last_activity + idle_timeout - time.monotonic()
            if wait <= 0:
                name = self.name
                try:
                    if await self.spec.directory.request_hibernate.remote(name, self.actor_id):
                        return
                except Exception as exc:  # the directory is gone: stay bound
                    log.warning("idle hibernate of %s failed: %s", name, exc)
                    return
                wait = idle_timeout  # refused (a call came in meanwhile): keep watching

    async def watch(self, name: str) -> bool:
        """Return when this actor stops hosting ``name`` (True), at once if it does not
        host it (False). The directory keeps one such call pending per binding: if the
        process dies, the call fails, and the directory learns of the crash at once."""
        if self.name != name:
            return False
        await self._unbound.wait()
        return True

    async def rehome(self, directory: Any) -> dict[str, Any]:
        """A replacement namespace directory takes this actor over (it rebuilds its map
        from the live actors): alarms and idleness go to ``directory`` from now on,
        those of a bind or hibernation in flight too. Returns :meth:`settled`'s info
        at once (``state`` says whether a bind or hibernation is in flight)."""
        if self._transit is not None and self._transit.directory is not None:
            self._transit.directory = directory  # a failed upload binds it again
        spec = self.spec
        if spec is not None and spec.directory is not None:
            spec.directory = directory
            if self.agent is not None:
                _report_wakes(self.agent, directory, spec.name)
            if spec.idle_timeout and (self._watcher is None or self._watcher.done()):
                self._watcher = asyncio.ensure_future(self._watch_idle(spec.idle_timeout))
        return self._report()

    async def settled(self, timeout: float = 10.0) -> dict[str, Any]:
        """:meth:`ready`'s info plus ``bound_namespace`` (the namespace of the agent
        hosted, bound or hibernated), once no bind or hibernation is in flight here,
        or after ``timeout`` seconds (``state`` then still says which)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._steady.wait(), timeout)
        return self._report()

    def _report(self) -> dict[str, Any]:
        info = self._info()
        spec = self._transit or self.spec
        info["bound_namespace"] = spec.namespace if spec is not None else None
        return info

    async def activity(self, name: str) -> dict[str, Any]:
        """For the live cap's LRU choice: whether ``name`` is still hosted here
        (``bound``), :meth:`busy`, seconds since the last call (``idle_for``), and
        whether it was bound without a call since (``fresh``: the call that woke it
        is on its way) for ``bound_for`` seconds."""
        now = time.monotonic()
        return {
            "bound": self.name == name,
            "busy": self.busy(),
            "idle_for": now - self.last_activity,
            "fresh": self.last_activity == self.bound_at,
            "bound_for": now - self.bound_at,
        }

    async def until_idle(
        self, name: str, timeout: float = 10.0, fresh_grace: float = 0.0
    ) -> dict[str, Any]:
        """:meth:`activity` once ``name`` is not busy (or no longer hosted here), or
        after ``timeout`` seconds; an agent bound less than ``fresh_grace`` seconds ago
        and not called since counts as busy. The directory keeps one such call on each
        busy agent while binds wait for an actor, and hibernates the first to finish."""
        deadline = time.monotonic() + timeout
        pause = 0.002

        def waiting() -> bool:
            if self.busy():
                return True
            fresh = self.last_activity == self.bound_at
            return fresh and time.monotonic() - self.bound_at < fresh_grace

        while self.name == name and waiting():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            agent = self.agent
            runs = [r.task for r in agent.turns.runs.values() if r.task] if agent else []
            if runs:  # wakes as a run ends, then the relay of its last chunks drains
                await asyncio.wait(runs, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                pause = 0.002
            else:  # a call in flight, or pending work the agent reports
                await asyncio.sleep(min(pause, left))
                pause = min(pause * 2, 0.1)
        return await self.activity(name)

    async def status_events(self, name: str, session_id: str) -> AsyncIterator[dict[str, Any]]:
        """Streaming generator: the status of ``session_id`` of the hosted agent now,
        then each change (``SessionStatus`` as a dict), until the agent stops being
        hosted here (hibernated: nothing runs, so it is idle then). Not counted as a
        call: a page watching a session does not keep its agent from hibernating."""
        if self.agent is None or self.name != name:
            return
        board = self.agent.status
        changes: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        def listen(changed: str, status: Any) -> None:
            if changed == session_id:
                changes.put_nowait(status.model_dump())

        remove = board.subscribe(listen)
        unbound = asyncio.ensure_future(self._unbound.wait())
        try:
            yield board.get(session_id).model_dump()
            while self.name == name:
                change = asyncio.ensure_future(changes.get())
                await asyncio.wait({change, unbound}, return_when=asyncio.FIRST_COMPLETED)
                if not change.done():
                    change.cancel()
                    break
                yield change.result()
        finally:
            remove()
            unbound.cancel()

    async def state_events(self, name: str) -> AsyncIterator[dict[str, Any]]:
        """Streaming generator: the hosted agent's synced state now, then each change
        (:class:`~thinkray.runtime.agents.state.StateChange` as a dict), until the agent
        stops being hosted here. What the ingress fans out to the agent's clients, on
        every replica: a change made anywhere (the agent itself, a handle, a client
        through another replica) reaches them all. Not counted as a call (watching
        does not keep the agent from hibernating); nothing for a class without state."""
        if self.agent is None or self.name != name or not self.agent.synced_state.enabled:
            return
        synced = self.agent.synced_state
        changes: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        remove = synced.subscribe(lambda change: changes.put_nowait(change.to_dict()))
        unbound = asyncio.ensure_future(self._unbound.wait())
        try:
            yield synced.snapshot().to_dict()
            while self.name == name:
                change = asyncio.ensure_future(changes.get())
                await asyncio.wait({change, unbound}, return_when=asyncio.FIRST_COMPLETED)
                if not change.done():
                    change.cancel()
                    break
                yield change.result()
        finally:
            remove()
            unbound.cancel()

    # -- calls -------------------------------------------------------------------------

    @contextmanager
    def _call(self, name: str) -> Iterator[Think]:
        # Refused while the agent binds or hibernates, too: the hooks (on_wake,
        # on_hibernate) run with the agent set, and a turn admitted meanwhile would run
        # before the wake finished, or be cut off by the close that ends the
        # hibernation or undoes a failed wake (it read back "interrupted" with no
        # crash). Refused, the call never ran: the handle re-resolves, which waits for
        # the transition (the directory holds the name's lock), and sends it again.
        if self.agent is None or self.name != name or self._transit is not None:
            raise NotBoundError(name, self.name)
        self.inflight += 1
        self.last_activity = time.monotonic()
        try:
            yield self.agent
        finally:
            self.inflight -= 1
            self.last_activity = time.monotonic()

    def _remote_method(
        self, agent: Think, method: str, kind: str
    ) -> RemoteMethod[Any, Any, Any, Any]:
        """The agent's ``@remote`` method ``method`` of ``kind``; anything else is refused
        with a RemoteCallError naming what is allowed."""
        allowed = remote_methods(type(agent))
        marker = allowed.get(method)
        if marker is None or marker.kind != kind:
            names = sorted(n for n, m in allowed.items() if m.kind == kind)
            what = "remote stream" if kind == "stream" else "remote"
            raise RemoteCallError(
                f"{type(agent).__name__}.{method} is not a {what} method; "
                f"{what} methods: {', '.join(names)}",
                method,
                tuple(names),
            )
        return marker

    async def invoke(
        self,
        name: str,
        method: str,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        trace: dict[str, str] | None = None,
    ) -> Any:
        """Call an ``@remote`` method of the hosted agent (awaited if it is a coroutine).
        An actor handle passed as ``callback`` is relayed to (chunks in batches).
        ``trace``: the caller's trace context, current during the call (a turn the call
        starts is a child of the caller's span)."""
        kwargs = dict(kwargs or {})
        with self._call(name) as agent, tracing.attached(trace):
            marker = self._remote_method(agent, method, "call")
            check_arguments(marker, args, kwargs)
            if "callback" in marker.signature.parameters:
                bound = marker.signature.bind_partial(None, *args, **kwargs)
                if "callback" in bound.arguments:
                    bound.arguments["callback"] = as_callback(bound.arguments["callback"])
                args, kwargs = tuple(bound.args[1:]), dict(bound.kwargs)
            return await _maybe_await(getattr(agent, method)(*args, **kwargs))

    async def invoke_stream(
        self,
        name: str,
        method: str,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        trace: dict[str, str] | None = None,
    ) -> AsyncIterator[Any]:
        """Streaming generator for an ``@remote`` async-generator method: a header dict,
        then lists of items (batched: the more the consumer lags, the more per item).

        ``stream_chat`` and ``resume`` relay the run's own stream: the header carries
        the run (``run_id``, ``session_id``, ``message_id``, an abort ``receiver``;
        for a resume ``run_id`` and ``live``)."""
        kwargs = dict(kwargs or {})
        with self._call(name) as agent:
            marker = self._remote_method(agent, method, "stream")
            check_arguments(marker, args, kwargs)
            if method == "stream_chat":
                # The turn's task copies the context current here: the caller's trace.
                with tracing.attached(trace):
                    run = agent.start_chat(*args, **kwargs)
                header = self._run_header(run)
                batches = run.stream.follow(coalesce=_relay_pacing())
                # The header travels with the first batch (one Ray item fewer, and the
                # first text delta is in it); alone if the turn is slow to start (a
                # long prepare_turn), so the caller can abort meanwhile.
                first = asyncio.ensure_future(anext(batches, None))
                done, _ = await asyncio.wait({first}, timeout=HEADER_WAIT)
                if done:
                    items = first.result()
                    yield {**header, "items": items or []}
                else:
                    yield header
                    items = await first
                    if items is not None:
                        yield items
                if items is not None:
                    async for batch in batches:
                        yield batch
            elif method == "resume":
                run_id, live, batches = agent.replay(*args, **kwargs, coalesce=_relay_pacing())
                yield {"run_id": run_id, "live": live}
                async for batch in batches:
                    yield batch
            else:
                yield {"method": method}
                async for batch in _batched(getattr(agent, method)(*args, **kwargs)):
                    yield batch

    def _run_header(self, run: Any) -> dict[str, Any]:
        # The caller makes the run's abort receiver from this actor's handle
        # (AgentResponseStream._take_header).
        return {
            "run_id": run.run_id,
            "session_id": run.session_id,
            "message_id": run.stream.message_id,
        }

    async def abort_run(self, name: str, run_id: str, reason: str = "aborted") -> bool:
        """Abort run ``run_id`` of the hosted agent ``name``; False if it is not live
        here (finished, or the agent hibernated since)."""
        if self.agent is None or self.name != name:
            return False  # not hosted here any more: that run cannot be live
        return self.agent.abort(run_id=run_id, reason=reason)

    async def shutdown(self) -> None:
        """Hibernate the hosted agent even if it is busy (its runs are aborted)."""
        if self.name is not None:
            await self.hibernate(self.name, force=True)

    # -- live view (thinkray top) --

    async def snapshot(self, name: str | None = None) -> dict[str, Any]:
        """What ``thinkray top`` shows of this actor (``name``: the agent asked about,
        the one it hosts; an agent host routes by it), read from memory only (no file
        access, never waits on a turn): the hosted agent (``agent``, None when generic),
        its ``namespace``, ``actor_id``, ``node_id``, ``pid``, calls in flight and, for
        each session with a run in flight or a status other than idle, a row of
        ``session_id``, ``state`` (idle/busy/retrying/error), ``message`` (the retry's
        reason or the error), ``attempt``, ``run_id``, ``started_at`` (epoch seconds),
        ``duration_s`` (of the run in flight), ``tokens`` (of the run's finished steps,
        all kinds) and ``usage`` (by kind)."""
        now = time.time()
        agent, spec = self.agent, self.spec
        out: dict[str, Any] = {
            "agent": self.name,
            "state": self.state,
            "namespace": spec.namespace if spec is not None else None,
            "actor_id": self.actor_id,
            "node_id": self.node_id,
            "pid": os.getpid(),
            "inflight": self.inflight,
            "bound_for_s": round(time.monotonic() - self.bound_at, 3) if agent else None,
            "idle_for_s": round(time.monotonic() - self.last_activity, 3) if agent else None,
            "sessions": [],
        }
        if agent is None:
            return out
        runs = {run.session_id: run for run in list(agent.turns.runs.values())}
        statuses = dict(agent.status.items())
        rows = []
        for sid in sorted(set(statuses) | set(runs)):
            status = statuses.get(sid)
            run = runs.get(sid)
            state = status.state if status is not None else "idle"
            if run is None and state == "idle":
                continue
            if run is not None and state == "idle":
                state = "busy"  # registered, its status not written yet
            row: dict[str, Any] = {
                "session_id": sid,
                "state": state,
                "message": status.message if status is not None else None,
                "attempt": status.attempt if status is not None else None,
                "run_id": run.run_id if run is not None else None,
                "started_at": None,
                "duration_s": None,
                "tokens": None,
                "usage": None,
            }
            if run is not None:
                usage = run.usage
                row.update(
                    started_at=run.started_at,
                    duration_s=round(max(0.0, now - run.started_at), 3),
                    tokens=usage.total,
                    usage=usage.to_dict(),
                )
            rows.append(row)
        out["sessions"] = rows
        return out


class _Shipper:
    """The ``make_durable`` of an agent under an object-store root (see
    :meth:`SessionActor._ship`), bound to its binding's session and store."""

    def __init__(self, actor: SessionActor, remote: RemoteSession, store: Any) -> None:
        self.actor, self.remote, self.store = actor, remote, store

    async def __call__(self) -> None:
        await self.actor._ship(self.remote, self.store)


def _relay_pacing() -> Any:
    """How a relayed stream batches its chunks (:data:`RELAY_COALESCE`, up to
    :data:`RELAY_MAX_WINDOW`)."""
    from thinkray.runtime.turn.stream import Pacing

    return Pacing(RELAY_COALESCE, RELAY_MAX_WINDOW)


def _file_bytes(path: Path) -> int | None:
    """The size of an agent's database file (None: it cannot be read)."""
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _has_pending_work(agent: Think) -> bool:
    pending = getattr(agent, "has_pending_work", None)
    return bool(pending()) if callable(pending) else False


async def _batched(items: AsyncIterator[Any]) -> AsyncIterator[list[Any]]:
    """Lists of a stream method's items: a :class:`~thinkray.runtime.remote.Batch` it
    yields travels as one list; otherwise whatever accumulated while the previous list
    was in transit goes together (the first item at once)."""
    queue: asyncio.Queue[Any] = asyncio.Queue()
    done = object()
    failure: list[BaseException] = []

    async def pump() -> None:
        try:
            async for item in items:
                await queue.put(item)
        except BaseException as exc:  # re-raised on the consumer's side
            failure.append(exc)
        finally:
            await queue.put(done)

    task = asyncio.ensure_future(pump())
    try:
        while True:
            item = await queue.get()
            batch: list[Any] = []
            while item is not done:
                if isinstance(item, Batch):
                    batch.extend(item)
                else:
                    batch.append(item)
                if queue.empty() or len(batch) >= 2048:
                    break
                item = queue.get_nowait()
            if batch:
                yield batch
            if item is done:
                if failure:
                    raise failure[0]
                return
    finally:
        task.cancel()


async def _bounded(fn: Any, timeout: float) -> bool:
    """Call ``fn`` (awaited if it returns an awaitable) for at most ``timeout`` seconds;
    False if it had not returned by then (it is cancelled, not waited for: a hook that
    swallows its cancel cannot hang the caller). Its own error propagates."""
    task = asyncio.ensure_future(_maybe_await(fn))
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        task.cancel()
        return False
    task.result()
    return True


async def _maybe_await(fn: Any) -> Any:
    if fn is None:
        return None
    result = fn() if callable(fn) else fn
    if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
        return await result
    return result


RemoteSessionActor = ray.remote(SessionActor)


def _report_wakes(agent: Any, directory: Any, name: str) -> None:
    """Keep the namespace's directory told what would need ``name`` woken if this
    process died: its next alarm, and whether messages wait in its queue."""

    def alarm(due_at: float | None) -> None:
        directory.note_alarm.remote(name, due_at)

    def queue(busy: bool) -> None:
        directory.note_queue.remote(name, busy)

    # The directory dropped the agent's alarm as it bound it: only a due time is news.
    agent.durable.scheduler.report_to(alarm, known=None)
    turns = getattr(agent, "turns", None)
    if turns is not None:
        turns.queue.watch_work(queue)
