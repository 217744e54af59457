"""The namespace directory: one Ray actor per namespace that maps agent names to the
live actor hosting each, keeps a warm pool of generic session actors, caps the number
of live agents (least recently used idle ones hibernate first) and wakes hibernated
agents when an alarm is due.

Why a pool: creating a Ray actor costs ~0.5 CPU-s here (a process importing Ray,
DuckDB and thinkray) and actors come up at ~2.3/s, while binding a started one to an
agent's file costs ~40 ms. A wake binds a spare and never waits for a process if it
can help it.

The pool's policy:

- **It grows with demand.** The pool keeps ``target`` spares: at least ``pool_size``,
  more after misses (each adds one, decaying with a half-life of ``pool_ttl``) and when
  binds come fast (the spares that the bind rate consumes while one actor starts).
  Spares above the target that stay unused for ``pool_ttl`` retire; at most
  ``max_pool`` are kept, and never more than the live cap could use.
- **Spares start before they are needed, when the node can afford it**: a spare is
  started only while the node has about a core idle, so a burst's binds and turns are
  not slowed by processes starting for later.
- **Binds queue fairly.** A bind that finds no spare (or the live cap reached) waits
  in one FIFO queue. It takes whichever comes first: an actor another bind gave back,
  a newly started one, or the actor of an idle agent (no call or run in flight, least
  recently used first) that the directory hibernates for it. Under a burst of short
  turns that means a few actors serve many agents in turn instead of the machine
  starting a process per agent; actors are started for waiting binds only when no
  actor was freed for them for ``start_patience`` (every agent is busy: long turns),
  or when the node is idle, and one more for every ``RECLAIMS_PER_START`` agents
  hibernated to make room (renting actors by hibernation long enough pays for buying
  one). At most ``max_starting`` actor starts are in flight (default: the cluster's
  CPUs), whatever the demand.

The decisions above are pure functions of a snapshot of the pool, in
:mod:`thinkray.actors.pool_policy` (tested without actors); the directory gathers the
snapshot, calls them, and starts, retires and hibernates as they say.

Concurrency: a per-name asyncio lock makes get-or-create exactly-once (two processes
resolving one name get one actor and one writer); an entry being hibernated is
removed only after its file is closed, so a concurrent resolve waits on the lock and
never opens a file that is still held.

**Shards.** A namespace may spread its names over K directory actors
(``AgentNamespace(..., directories=K)``): name ``n`` belongs to shard
:func:`shard_of` ``(n, K)`` (sha1 of the name mod K: stable across processes and
restarts), and only that shard binds it, so the exactly-once argument above holds per
shard. Shard 0 is named ``thinkray-directory-<namespace>`` (as with one directory),
shard i ``thinkray-directory-<namespace>/<i>``; shard 0 reports K, so ``connect``
finds the others.

Each shard runs the whole policy above on its own share: its own pool and its own
live cap, ``ceil(max_live / K)`` (likewise ``pool_size``, ``max_pool`` and
``max_starting``, at least 1 each). The trade-off, against one shard hosting a pool
the others borrow from: separate pools keep a bind at one round trip (caller ->
shard -> session actor) and share no lock or queue, which is the point of sharding;
the price is that the caps are approximate (their sum may exceed ``max_live`` by up to
K - 1) and that an idle agent of one shard is never hibernated for a bind waiting in
another, so with load skewed onto few names one shard can wait at its cap (for
``cap_wait``, then exceed it) while another has room. With many names the hash
spreads them evenly. A shared pool would balance better but put a second actor (and
its queue) on every bind's path and make it a single point of contention again.

**Crash recovery.** A directory actor is restarted by Ray when its process dies
(``max_restarts=-1``: same name, same actor id, so the handles held anywhere stay
valid); one stopped for good (``ray.kill(..., no_restart=True)``) is recreated by
the namespace object or by a handle that finds it gone. Session actors of a detached
namespace are themselves detached and named ``thinkray-session/<namespace>/<shard>/<id>``,
so they outlive the directory's process. A directory's first call (any method) first
rebuilds its map from them: each such actor is asked what it hosts (``rehome``,
which also points its alarms and idle timer at the new directory); an agent still
live there is *adopted* (entered as live, never bound a second time), a generic actor
rejoins the pool, and an actor that does not answer within ``ADOPT_TIMEOUT`` is killed
(its file lock goes with it, so the agent's next call binds it cleanly). An actor whose
bind or hibernation is in flight (the previous directory's call; it reports
``binding`` or ``hibernating`` and the agent) is never taken for a spare: offering it
would bind a second agent onto it, and the two would share one storage session (one
lease renewed, one upload). It is taken over once that ends (:meth:`Directory._settle`;
a bind still going after ``SETTLE_TIMEOUT`` is killed), and calls for that agent wait
for it meanwhile, since its file and lease are held. Calls wait for the rebuild. A
directory calls itself (``recover``) as it starts, so a restarted one rebuilds and
runs its alarms even if nobody calls it. Lost on a crash: the pool's statistics.

**A failed wake.** A bind whose ``on_wake`` raises undoes itself in the actor (the
agent's database closed, its file and lease released, the actor generic again) and
reaches the caller as :class:`~thinkray.actors.errors.WakeError` naming the agent and
the cause; the actor rejoins the pool, or is stopped if its database would not close
(``clean`` False), so later wakes, the agent's own included, bind cleanly.

**Alarms survive the directory.** The directory keeps every agent's next due time in
memory (a hibernated agent's, reported by its hibernation, and a live agent's,
reported by its scheduler through ``note_alarm`` so that it fires even if the agent's
process dies) and mirrors that map to one small file per agent,
``<root>/<namespace>/.alarms/<name>`` (:mod:`thinkray.storage.alarms`: written
atomically, removed when the agent has no alarm left, which is after the wake for a
due one). A starting directory reads the files of its own names (filtered by
:func:`shard_of` before any is read) before it adopts the live actors, so a
replaced directory wakes a hibernated agent whose alarm falls due, on time. The
alternative, opening every hibernated agent's file read-only at the rebuild to ask
its schedule, costs a file open per agent (minutes for 100,000 agents, and a download
each under an object-store root) on the path of every call waiting for the rebuild;
the files cost one small write per change of an agent's next due time, done off the
event loop by one writer task (the last change wins). The files can lag the map by
that write: a crash in between may fire an alarm that was just cancelled (a spurious
wake: the agent finds nothing due and idles) or, for a live agent, miss the change
its still-running scheduler handles itself. A wake repeated after a crash is
harmless: resolving a live agent changes nothing. The files also outlive a
namespace's shutdown, so a namespace started again on the root wakes its agents
whose alarms fell due meanwhile. Under an object-store root the same keys live in
the store (one PUT or DELETE per change).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import os
import time
import uuid
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Literal

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from thinkray.actors import pool_policy as policy
from thinkray.actors.errors import ActorBusyError, InvalidStateError, NotBoundError, WakeError
from thinkray.actors.handles import NamedHandle
from thinkray.actors.host_binds import HostBinds
from thinkray.actors.metrics import install_ray_metrics
from thinkray.actors.pool_policy import (
    FRESH_GRACE,
    RATE_WINDOW,
    CpuMeter,
    HostLoad,
    PoolConfig,
    Waiting,
)
from thinkray.actors.session_actor import (
    DEFAULT_PRELOAD,
    AgentClassRef,
    BindSpec,
    RemoteSessionActor,
    agent_module,
)
from thinkray.runtime.observability.metrics import metrics
from thinkray.storage.alarms import read_alarms, write_alarm
from thinkray.storage.errors import DatabaseLockedError, InvalidInputError
from thinkray.storage.layout import (
    ensure_root,
    is_remote_root,
    list_names,
    session_path,
    validate_name,
)
from thinkray.storage.types import SessionNotFoundError

log = logging.getLogger("thinkray.directory")

PROBE_TIMEOUT = 10.0
"""How long one ``until_idle`` call waits on a busy agent before answering."""
STALE_PROBE_TIMEOUT = 5.0
"""How long the directory waits for an actor reported stale to say whether it still
hosts the agent before it replaces it."""
_DEFICIT_CHECK = 0.25  # how often the pool re-checks a deficit it could not fill yet
ADOPT_TIMEOUT = 10.0
"""How long a rebuilding directory waits for a session actor to say what it hosts."""
SETTLE_TIMEOUT = 60.0
"""How long a rebuilding directory lets a bind it found in flight (its caller died with
the previous directory) go on before it stops the actor. A hibernation in flight is
waited for as long as its actor answers: stopping it could lose its upload."""
SETTLE_POLL = 5.0
"""How long one ``settled`` call waits on an actor before answering."""
TRANSIENT = ("binding", "hibernating")
"""Session actor states with a bind or hibernation in flight (never a spare)."""
RECENT_ERRORS = 20
"""How many recent errors (failed binds and actor starts, actors that died) a directory
keeps for ``thinkray top``."""
SNAPSHOT_TIMEOUT = 2.0
"""How long ``top`` waits for a live actor's snapshot before showing it unreachable."""
GAUGE_INTERVAL = 2.0
"""How often a directory sets its gauges (live, hibernated, pool, storage bytes); Ray
exports metrics every few seconds anyway."""
RAY_NAMESPACE = "thinkray"
"""The Ray namespace of the directories' and session actors' names."""

Placement = Literal["dedicated", "hosts"]
"""Where a namespace runs its live agents: ``dedicated``, a Ray actor process each (the
default: isolation), or ``hosts``, packed up to ``host_capacity`` per agent host actor
(:mod:`thinkray.actors.host`: megabytes and milliseconds per agent, not a process)."""
PLACEMENTS = ("dedicated", "hosts")


@dataclass
class HostRecord:
    """An agent host of the pool (placement ``hosts``): its handle, where it runs, its
    capacity, whether it takes no more agents (``draining``: a failed wake left a
    database open in it; it stops once empty) and since when all its slots are free."""

    handle: Any
    actor_id: str
    node_id: str
    pid: int
    capacity: int
    draining: bool = False
    empty_since: float | None = None
    bindings: int = 0  # agents it hosted so far (recycled at recycle_after x capacity)
    binds: HostBinds | None = None  # its binds, coalesced (made on the first)


def _queued(record: HostRecord) -> int:
    """Binds to ``record``'s host waiting for a call (see :mod:`host_binds`)."""
    return record.binds.queued if record.binds is not None else 0


def _transient(info: dict[str, Any]) -> bool:
    """Whether an actor's report shows a bind or hibernation in flight (for a host: of
    any of its agents)."""
    if info.get("state") in TRANSIENT:
        return True
    return any(state in TRANSIENT for state in (info.get("agents") or {}).values())


def shard_of(name: str, shards: int) -> int:
    """The directory shard (0 .. ``shards`` - 1) that owns agent ``name``: sha1 of the
    name mod ``shards``, the same in every process."""
    if shards <= 1:
        return 0
    digest = hashlib.sha1(name.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % shards


def directory_name(namespace: str, shard: int = 0) -> str:
    """The Ray actor name of ``namespace``'s directory shard ``shard``."""
    base = f"thinkray-directory-{namespace}"
    return base if shard == 0 else f"{base}/{shard}"


def session_actor_prefix(namespace: str, shard: int | None = None) -> str:
    """The Ray actor names of ``namespace``'s session actors (of one shard) start so."""
    prefix = f"thinkray-session/{namespace}/"
    return prefix if shard is None else f"{prefix}{shard}/"


@dataclass
class NamespaceConfig:
    """How a namespace hosts its agents: where their files live, the agent class and
    its keyword arguments, the warm pool (see the module: ``pool_size`` spares at least,
    ``max_pool`` at most, retired after ``pool_ttl`` unused, ``max_starting`` actor
    starts in flight, ``start_patience`` before a waiting bind starts one), the live
    cap, the idle timeout before hibernation, after how many bindings an actor process
    is recycled, and the Ray options of the session actors."""

    namespace: str
    storage_root: str
    agent_cls: type | AgentClassRef  # AgentNamespace passes a reference (see there)
    agent_kwargs: dict[str, Any] = field(default_factory=dict)
    pool_size: int = 2
    max_live: int = 64
    idle_timeout: float | None = 300.0
    recycle_after: int = 200
    actor_options: dict[str, Any] = field(default_factory=dict)
    preload: tuple[str, ...] = DEFAULT_PRELOAD
    cap_wait: float = 5.0  # how long a wake waits at the live cap before exceeding it
    max_pool: int | None = None  # most spares kept (None: max_live)
    pool_ttl: float = 60.0
    max_starting: int | None = None  # actor starts in flight (None: the cluster's CPUs)
    start_patience: float = 0.5
    grow_pool: bool = True  # spares started for demand (False: pool_size only)
    shard: int = 0  # this directory's shard (see the module)
    shards: int = 1  # how many directory shards the namespace has
    detached: bool = True  # session actors outlive the directory's process (named)
    # each new pooled actor runs one throwaway turn before it is a spare (SessionActor.
    # _warm_up); off where actors are cheap to keep cold (tests, short scripts)
    warm_up: bool = True
    # "dedicated": a Ray actor per live agent; "hosts": up to host_capacity agents per
    # agent host actor (thinkray.actors.host). Under hosts the pool counts free agent
    # slots: pool_size, max_pool and the spares' target are slots, and a start adds
    # host_capacity of them.
    placement: Placement = "dedicated"
    host_capacity: int = 64


@dataclass(eq=False)
class PooledActor:
    """A generic session actor of the pool: its handle, where it runs, how many
    agents it has hosted so far (``bindings``) and since when it is a spare. Under
    placement ``hosts``, one free agent slot of the host ``actor_id`` (a host has one
    such object per slot, all with its handle)."""

    handle: Any
    actor_id: str
    node_id: str
    pid: int
    bindings: int = 0
    free_since: float = 0.0


@dataclass
class Entry:
    """A live agent: the pooled actor bound to it and since when."""

    actor: PooledActor
    bound_at: float = field(default_factory=time.time)


@dataclass(eq=False)
class _Waiter:
    """A bind waiting for an actor (FIFO). ``may_exceed``: it waited ``cap_wait`` at the
    live cap and may now exceed it; ``start_pending``: an actor is being started on its
    node for it (binds pinned to a node)."""

    name: str
    node_id: str | None
    future: asyncio.Future[PooledActor]
    since: float
    may_exceed: bool = False
    start_pending: bool = False


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
        self.hosts: dict[str, HostRecord] = {}  # placement "hosts": actor id -> host
        # placement "hosts": agents moved to an actor of their own (see place); such
        # an actor is started for the agent's bind and stopped at its hibernation
        self.own_actor: set[str] = set()
        self._started_slots: dict[str, list[PooledActor]] = {}  # see _start_actor
        self.waiters: deque[_Waiter] = deque()
        self.starting = 0  # actor starts in flight
        self.starting_peak = 0
        self.binding = 0  # binds holding an actor, not yet live: they count toward the cap
        self.locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self.alarms: dict[str, float] = {}
        # Live agents with queued messages (waiting, or their turn running): a crash
        # must not leave them waiting for a caller (see note_queue).
        self.queued: set[str] = set()
        self._alarm_changed: asyncio.Event | None = None
        self._alarm_dirty: set[str] = set()  # alarms whose file lags self.alarms
        self._alarm_writer: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self.counters: defaultdict[str, int] = defaultdict(int)
        # metrics: this shard's agents with a file → its size (see _count_files)
        install_ray_metrics()
        self._ns_tags = {"namespace": config.namespace}
        self._shard_tags = {"namespace": config.namespace, "shard": str(config.shard)}
        self._sizes: dict[str, int] = {}
        self._size_total = 0
        self._counted = False
        self.recent_errors: deque[dict[str, Any]] = deque(maxlen=RECENT_ERRORS)  # top
        self._closed = False
        # pool policy state (see the module)
        self._max_starting = max(1, config.max_starting or 1)
        self._me: Any = None  # see _own_handle
        self._boost = 0.0
        self._boost_at = time.monotonic()
        self._bind_times: deque[float] = deque()
        self._start_secs = 1.0  # moving average of how long an actor takes to start
        self._served_at = time.monotonic()  # a waiting bind last got an actor
        self._credit = 0.0  # starts earned by hibernations for waiting binds
        self._fill = 0  # spares start() waits for, started even on a busy node
        self._failures = 0
        self._backoff_until = 0.0
        self._cpu = CpuMeter()
        self._pool_changed: asyncio.Event | None = None
        self._pool_grew = asyncio.Event()  # an actor started (or failed to)
        self._pool_idle = False  # the pool loop sleeps with nothing to re-check
        self._short = False  # the last kick left a deficit it may not fill yet
        self._reclaim_changed: asyncio.Event | None = None
        self._reclaimer: asyncio.Task[None] | None = None
        self._reclaiming: set[str] = set()
        self._probing: set[str] = set()
        self._recovery: asyncio.Future[None] | None = None
        # agents whose bind or hibernation a rebuild found in flight → the task that
        # waits for it to end; their resolve and hibernate wait for it
        self._settling: dict[str, asyncio.Task[None]] = {}
        self.recovery_secs: float | None = None  # how long the rebuild took
        # A directory restarted by Ray (its process died) may get no call for a long
        # time, but its alarms must fire: it calls itself once to rebuild and start.
        with contextlib.suppress(Exception):  # not run as an actor (tests)
            self._own_handle().recover.remote()

    async def recover(self) -> None:
        """Rebuild the map and start the loops now (what every call does first; a
        directory calls it on itself as it starts)."""
        await self._ready()

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _ready(self) -> None:
        """Start the alarm and pool loops and rebuild the map from the live session
        actors, once (every public method waits for it: see the module)."""
        if self._recovery is None:
            if self.cfg.max_starting is None:
                cpus = ray.cluster_resources().get("CPU", 1)
                self._max_starting = max(1, math.ceil(int(cpus) / max(1, self.cfg.shards)))
            self._alarm_changed = asyncio.Event()
            self._pool_changed = asyncio.Event()
            self._reclaim_changed = asyncio.Event()
            self._spawn(self._alarm_loop())
            self._spawn(self._count_files())
            self._spawn(self._gauge_loop())
            self._recovery = asyncio.ensure_future(self._recover())
        if not self._recovery.done():
            await asyncio.shield(self._recovery)

    async def _recover(self) -> None:
        """Load this shard's recorded alarms, then adopt the live session actors of
        this shard (see the module)."""
        started = time.monotonic()
        try:
            await self._load_alarms()
            await self._adopt()
        finally:
            self.recovery_secs = round(time.monotonic() - started, 3)
            # The pool starts after the adoption: a spare it started meanwhile would be
            # listed among the named session actors, still warming up, and be taken
            # for a mute one and killed (one wasted actor start per directory start).
            self._spawn(self._pool_loop())

    async def _adopt(self) -> None:
        prefix = session_actor_prefix(self.cfg.namespace, self.cfg.shard)
        try:
            named = ray.util.list_named_actors(all_namespaces=True)
        except Exception as exc:
            log.warning("could not list the session actors to adopt: %s", exc)
            return
        found = [
            a["name"]
            for a in named
            if isinstance(a, dict)
            and a.get("namespace") == RAY_NAMESPACE
            and str(a.get("name", "")).startswith(prefix)
        ]
        if not found:
            return
        me = self._own_handle()

        async def ask(actor_name: str) -> tuple[Any, dict[str, Any] | None]:
            try:
                handle = ray.get_actor(actor_name, namespace=RAY_NAMESPACE)
            except Exception:  # gone since the listing
                return None, None
            info: dict[str, Any]
            try:
                info = await asyncio.wait_for(handle.rehome.remote(me), ADOPT_TIMEOUT)
            except Exception:
                return handle, None
            return handle, info

        for handle, info in await asyncio.gather(*(ask(n) for n in found)):
            if handle is None:
                continue
            if info is not None and _transient(info):
                self._settle_later(handle, info)  # never a spare while in flight
            else:
                self._adopt_one(handle, info)
        if self.entries:
            log.warning(
                "directory %s/%d adopted %d live agents",
                self.cfg.namespace,
                self.cfg.shard,
                len(self.entries),
            )

    def _adopt_one(self, handle: Any, info: dict[str, Any] | None) -> None:
        """Take over a session actor that has no bind or hibernation in flight: its
        agent becomes live here, a generic actor a spare; a mute or broken one, or
        one hosting another namespace's agent or a name already live elsewhere, is
        stopped."""
        if info is not None and info.get("host"):
            self._adopt_host(handle, info)
            return
        bound = info.get("bound") if info is not None else None
        known = self.entries.get(bound) if bound is not None else None
        if info is not None and known is not None and known.actor.actor_id == info.get("actor_id"):
            return  # known already: that binding is live here
        if (
            info is None
            or info.get("state") == "broken"
            or (
                bound is not None
                and (info.get("bound_namespace") != self.cfg.namespace or bound in self.entries)
            )
        ):
            # Mute, warming up, or (never expected) a second host of a name: stop it.
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)
            self.counters["adopt_killed"] += 1
            return
        actor = PooledActor(
            handle, info["actor_id"], info["node_id"], info["pid"], info.get("bindings", 0)
        )
        if bound is None:
            if self._hosted():  # an agent's own actor whose agent left: not a slot
                self._stop_own(actor)
                return
            self.counters["adopted_spares"] += 1
            self._offer(actor)
            return
        if self._hosted():
            self.own_actor.add(bound)  # it was moved out of the hosts: it stays out
        entry = Entry(actor)
        self.entries[bound] = entry
        self.counters["adopted"] += 1
        self._spawn(self._watch(bound, entry))

    def _adopt_host(self, handle: Any, info: dict[str, Any]) -> None:
        """Take over an agent host: its agents of this namespace become live here (one
        already live elsewhere, never expected, is hibernated on the host), its free
        slots join the pool; a host with a broken activation drains."""
        if info["actor_id"] in self.hosts:
            return  # known already
        slots = self._host_slots(handle, info, adopted=True)
        record = self.hosts[info["actor_id"]]
        namespaces = info.get("namespaces") or {}
        for name, state in (info.get("agents") or {}).items():
            if state != "bound":
                continue  # broken (below), or idle: its slot is counted as taken
            if namespaces.get(name) != self.cfg.namespace or name in self.entries:
                self._spawn(
                    self._abandon_slot(
                        PooledActor(handle, record.actor_id, record.node_id, record.pid), name
                    )
                )
                continue
            entry = Entry(PooledActor(handle, record.actor_id, record.node_id, record.pid))
            self.entries[name] = entry  # watched through its host (_watch_host)
            self.counters["adopted"] += 1
        if info.get("broken"):
            record.draining = True
            return
        for slot in slots:
            self._offer(slot)

    def _settle_later(self, handle: Any, info: dict[str, Any]) -> None:
        """A session actor with a bind or hibernation in flight, whose caller was the
        previous directory: taken over once it ends (:meth:`_settle`). Meanwhile the
        agent concerned is neither live nor free to bind elsewhere (its file and
        lease are held), so its resolve and hibernate wait for the outcome."""
        if info.get("host"):
            namespaces = info.get("namespaces") or {}
            names = [
                n
                for n, state in (info.get("agents") or {}).items()
                if state in TRANSIENT and namespaces.get(n) == self.cfg.namespace
            ]
        else:
            session = info.get("session")
            ours = info.get("bound_namespace") == self.cfg.namespace and isinstance(session, str)
            names = [session] if ours and isinstance(session, str) else []
        task = self._spawn(self._settle(handle, names[0] if len(names) == 1 else None, names))
        for name in names:
            self._settling[name] = task
        self.counters["adopt_settling"] += 1

    async def _settle(self, handle: Any, name: str | None, names: list[str] | None = None) -> None:
        deadline = time.monotonic() + SETTLE_TIMEOUT
        info: dict[str, Any] | None = None
        try:
            while True:
                try:
                    info = await asyncio.wait_for(
                        handle.settled.remote(SETTLE_POLL), SETTLE_POLL + ADOPT_TIMEOUT
                    )
                except Exception:  # died (its file lock went with it) or mute
                    info = None
                    break
                state = info.get("state") if isinstance(info, dict) else None
                if not isinstance(info, dict) or not _transient(info):
                    break
                if state == "binding" and time.monotonic() > deadline:
                    info = None  # a wake stuck in its agent's hook: stop it
                    break
            self._adopt_one(handle, info)
        finally:
            for settled in names if names is not None else [name]:
                if settled is not None and self._settling.get(settled) is asyncio.current_task():
                    del self._settling[settled]

    async def _await_settling(self, name: str) -> None:
        """Wait until a bind or hibernation of ``name`` that a rebuild found in flight
        has ended (and its actor was taken over)."""
        task = self._settling.get(name)
        if task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(task)

    def _owns(self, name: str) -> str:
        validate_name(name)
        if shard_of(name, self.cfg.shards) != self.cfg.shard:
            raise InvalidInputError(
                f"agent {name!r} belongs to shard {shard_of(name, self.cfg.shards)} of "
                f"namespace {self.cfg.namespace!r}, not to shard {self.cfg.shard}"
            )
        return name

    async def start(self) -> dict[str, Any]:
        """Fill the pool to ``pool_size`` and start the alarm and pool loops
        (idempotent)."""
        await self._ready()
        self._fill = policy.fill_for_start(self._pool_config(), self._live())
        self._kick()
        while len(self.free) < self._fill and self.starting and not self._closed:
            self._pool_grew.clear()
            await self._pool_event(self._pool_grew, 1.0)
        self._fill = 0
        return await self.stats()

    # -- pool ------------------------------------------------------------------------

    def _own_handle(self) -> Any:
        """This directory's actor handle, made once (``current_actor`` builds a new
        handle on every call, ~0.3 ms of CPU, and every bind names it)."""
        if self._me is None:
            self._me = ray.get_runtime_context().current_actor
        return self._me

    def _named_self(self) -> NamedHandle:
        """This directory's handle as actors receive it: by name, resolved once per
        process (see :mod:`~thinkray.actors.handles`)."""
        return NamedHandle(
            self._own_handle(), directory_name(self.cfg.namespace, self.cfg.shard), RAY_NAMESPACE
        )

    def _hosted(self) -> bool:
        return self.cfg.placement == "hosts"

    def _per_start(self) -> int:
        """Agent slots one start adds (a host's capacity under placement ``hosts``)."""
        return max(1, self.cfg.host_capacity) if self._hosted() else 1

    def _new_actor(self, node_id: str | None = None, own: bool = False) -> Any:
        """A new pooled actor (a host under placement ``hosts``), or with ``own`` a
        session actor for one agent moved out of the hosts (see :meth:`place`)."""
        hosted = self._hosted() and not own
        kind = "host-" if hosted else ("own-" if own else "")
        prefix = session_actor_prefix(self.cfg.namespace, self.cfg.shard)
        options: dict[str, Any] = {
            "num_cpus": 0,
            # a host keeps maybe a stream and a status feed per agent pending
            "max_concurrency": max(1000, 8 * (self._per_start() if hosted else 1)),
            # Named, so that a replacement directory finds it (see the module).
            "name": f"{prefix}{kind}{uuid.uuid4().hex}",
            "namespace": RAY_NAMESPACE,
        }
        if self.cfg.detached:
            options["lifetime"] = "detached"
        options.update(self.cfg.actor_options)
        if node_id is not None:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
            options.pop("resources", None)
        # The agent class's module too, for the first bind to find it loaded.
        module = agent_module(self.cfg.agent_cls)
        if hosted:
            from thinkray.actors.host import RemoteAgentHost

            return RemoteAgentHost.options(**options).remote(
                self.cfg.preload, self.cfg.warm_up, module, self._per_start(), self.cfg.namespace
            )
        return RemoteSessionActor.options(**options).remote(
            self.cfg.preload, self.cfg.warm_up, module, serves_lane=True
        )

    async def _start_actor(self, node_id: str | None = None) -> PooledActor:
        """Start an actor; its first free slot (a host's others wait in
        ``_started_slots`` for :meth:`_run_start`)."""
        handle = self._new_actor(node_id)
        info = await handle.ready.remote(self._named_self())
        self.counters["actors_created"] += 1
        if not info.get("host"):
            return PooledActor(handle, info["actor_id"], info["node_id"], info["pid"])
        first, *rest = self._host_slots(handle, info)
        self._started_slots[first.actor_id] = rest
        return first

    def _host_slots(
        self, handle: Any, info: dict[str, Any], adopted: bool = False
    ) -> list[PooledActor]:
        """Register a host (started or adopted) and return its free slots."""
        record = HostRecord(
            handle, info["actor_id"], info["node_id"], info["pid"], int(info["capacity"])
        )
        self.hosts[record.actor_id] = record
        self._spawn(self._watch_host(record))
        self.counters["hosts_adopted" if adopted else "hosts_started"] += 1
        taken = len(info.get("agents") or {})
        return [
            PooledActor(handle, record.actor_id, record.node_id, record.pid)
            for _ in range(max(0, record.capacity - taken))
        ]

    def _host_loads(self) -> list[HostLoad]:
        free: defaultdict[str, int] = defaultdict(int)
        for slot in self.free:
            free[slot.actor_id] += 1
        return [
            HostLoad(h.actor_id, free[h.actor_id], h.capacity, h.draining, h.empty_since)
            for h in self.hosts.values()
        ]

    def _drop_host(self, actor_id: str, kill: bool = True) -> None:
        """Forget host ``actor_id`` (dead, retired or drained): its free slots go."""
        record = self.hosts.pop(actor_id, None)
        self.free = [a for a in self.free if a.actor_id != actor_id]
        if record is not None and kill:
            with contextlib.suppress(Exception):
                ray.kill(record.handle, no_restart=True)

    def _live(self) -> int:
        return len(self.entries) + self.binding

    def _pool_config(self) -> PoolConfig:
        """The settings the pool policy reads (read anew: ``_max_starting`` is resolved
        once the cluster's CPUs are known)."""
        cfg = self.cfg
        pool_size = cfg.pool_size
        if self._hosted():
            # Slots: a quarter host free ahead of demand, and an empty host running
            # ahead while there are fewer hosts than cores (started with the
            # namespace and while the node is busy: it is the floor, see spread_target).
            per = self._per_start()
            spread = policy.spread_target(per, len(self.hosts), self._max_starting)
            pool_size = max(pool_size, per // 4, spread)
        return PoolConfig(
            pool_size=pool_size,
            max_live=cfg.max_live,
            max_pool=cfg.max_pool,
            pool_ttl=cfg.pool_ttl,
            max_starting=self._max_starting,
            start_patience=cfg.start_patience,
            grow=cfg.grow_pool,
        )

    def _max_pool(self) -> int:
        return self._pool_config().most_spares()

    def target(self) -> int:
        """How many spares the pool keeps now (:func:`~thinkray.actors.pool_policy.target`
        over the binds of the last ``RATE_WINDOW`` seconds and the decayed misses)."""
        now = time.monotonic()
        while self._bind_times and self._bind_times[0] < now - RATE_WINDOW:
            self._bind_times.popleft()
        boost = policy.decayed_boost(self._boost, self._boost_at, now, self.cfg.pool_ttl)
        return policy.target(self._pool_config(), len(self._bind_times), self._start_secs, boost)

    def _pop_free(self, node_id: str | None) -> PooledActor | None:
        if self._hosted():
            return self._pop_host_slot(node_id)
        for i in range(len(self.free) - 1, -1, -1):  # the most recently used first
            if node_id is None or self.free[i].node_id == node_id:
                return self.free.pop(i)
        return None

    def _pop_host_slot(self, node_id: str | None) -> PooledActor | None:
        """A free slot of the least loaded host (on ``node_id`` if given)."""
        loads = self._host_loads()
        if node_id is not None:
            loads = [h for h in loads if self.hosts[h.host_id].node_id == node_id]
        chosen = policy.pick_host(loads)
        if chosen is None:
            return None
        for i in range(len(self.free) - 1, -1, -1):
            if self.free[i].actor_id == chosen:
                self.hosts[chosen].empty_since = None
                return self.free.pop(i)
        return None

    async def _acquire(self, name: str, node_id: str | None, retry: bool) -> PooledActor:
        """An actor for ``name``'s bind, counted in ``binding`` (the caller gives it
        back or makes it live). Waits in the FIFO queue when there is no spare, or at
        the live cap; ``retry`` (a bind that failed on a dead actor) rejoins at the
        head."""
        if self._closed:
            raise InvalidStateError(f"namespace {self.cfg.namespace!r} is shutting down")
        now = time.monotonic()
        self._bind_times.append(now)
        if not self.waiters and self._live() < self.cfg.max_live:
            actor = self._pop_free(node_id)
            if actor is not None:
                self.counters["pool_hits"] += 1
                metrics().count("thinkray_pool_hits_total", 1, self._ns_tags)
                self.binding += 1
                self._kick()
                return actor
        if not any(node_id is None or a.node_id == node_id for a in self.free):
            self.counters["pool_misses"] += 1
            metrics().count("thinkray_pool_misses_total", 1, self._ns_tags)
            self._boost = policy.boost_after_miss(
                self._boost, self._boost_at, now, self.cfg.pool_ttl
            )
            self._boost_at = now
        loop = asyncio.get_running_loop()
        waiter = _Waiter(name, node_id, loop.create_future(), now)
        if retry:
            self.waiters.appendleft(waiter)
        else:
            self.waiters.append(waiter)
        timer = loop.call_later(self.cfg.cap_wait, self._cap_waited, waiter)
        self._kick()
        try:
            return await waiter.future
        except asyncio.CancelledError:
            future = waiter.future
            if future.done() and not future.cancelled() and future.exception() is None:
                self.binding -= 1  # granted as the bind was cancelled: give it back
                self._offer(future.result())
            raise
        finally:
            timer.cancel()
            with contextlib.suppress(ValueError):
                self.waiters.remove(waiter)

    def _cap_waited(self, waiter: _Waiter) -> None:
        if not waiter.future.done():
            waiter.may_exceed = True
            self._kick()

    def _grant(self, waiter: _Waiter, actor: PooledActor) -> None:
        with contextlib.suppress(ValueError):
            self.waiters.remove(waiter)
        self.binding += 1
        self._served_at = time.monotonic()
        waiter.future.set_result(actor)

    def _kick(self) -> None:
        """Hand spares to the waiting binds in FIFO order, then start actors and
        hibernate idle agents for those still waiting (see the module)."""
        if self._closed:
            for waiter in self.waiters:
                if not waiter.future.done():
                    waiter.future.set_exception(
                        InvalidStateError(f"namespace {self.cfg.namespace!r} is shutting down")
                    )
            self.waiters.clear()
            return
        i = 0
        while i < len(self.waiters):
            waiter = self.waiters[i]
            if waiter.future.done():
                del self.waiters[i]
                continue
            over = self._live() >= self.cfg.max_live
            if over and not waiter.may_exceed:
                break  # at the live cap: a hibernation makes room (and frees an actor)
            actor = self._pop_free(waiter.node_id)
            if actor is None:
                if waiter.node_id is None:
                    break
                i += 1  # a bind pinned to a node does not hold up the others
                continue
            if over:
                self.counters["cap_exceeded"] += 1
            self._grant(waiter, actor)
        self._start_actors()
        if self.waiters:
            if self._reclaimer is None or self._reclaimer.done():
                self._reclaimer = self._spawn(self._reclaim_loop())
            elif self._reclaim_changed is not None:
                self._reclaim_changed.set()

    def _start_actors(self) -> None:
        """Start the actors the pool lacks, within ``max_starting`` in flight: one on
        its node for each bind pinned to a node, and what
        :func:`~thinkray.actors.pool_policy.plan_starts` decides for the others and the
        spares."""
        now = time.monotonic()
        if now < self._backoff_until:
            self._deficit()
            return
        waiting: list[Waiting] = []
        for waiter in self.waiters:
            if waiter.future.done():
                continue
            if waiter.node_id is None:
                waiting.append(Waiting(waiter.since, waiter.may_exceed))
            elif not waiter.start_pending and self.starting < self._max_starting:
                waiter.start_pending = True
                self._launch(waiter.node_id, waiter)
        plan = policy.plan_starts(
            policy.PoolContext(
                config=self._pool_config(),
                now=now,
                live=self._live(),
                agents=len(self.entries),
                free=len(self.free),
                starting=self.starting,
                waiting=tuple(waiting),
                target=self.target(),
                fill=self._fill,
                calm=self._cpu.calm(),
                credit=self._credit,
                served_at=self._served_at,
                per_start=self._per_start(),
            )
        )
        self._credit = plan.credit
        for _ in range(plan.start):
            self._launch(None, None)
        if plan.deficit:
            self._deficit()

    def _deficit(self) -> None:
        """The pool lacks actors it may not start yet: have the pool loop look again."""
        self._short = True
        self._wake_pool()

    def _wake_pool(self) -> None:
        if self._pool_idle and self._pool_changed is not None:
            self._pool_changed.set()

    def _launch(self, node_id: str | None, waiter: _Waiter | None) -> None:
        self.starting += 1
        self.starting_peak = max(self.starting_peak, self.starting)
        self._spawn(self._run_start(node_id, waiter))

    async def _run_start(self, node_id: str | None, waiter: _Waiter | None) -> None:
        started = time.monotonic()
        try:
            actor = await self._start_actor(node_id)
        except Exception as exc:
            self.starting -= 1
            log.warning("could not start a pooled actor: %s", exc)
            self._note_error("actor_start", None, exc)
            self._failures += 1
            self._backoff_until = time.monotonic() + policy.start_backoff(self._failures)
            self._fail_waiter(waiter, exc)
            self._pool_grew.set()
            self._kick()
            return
        self.starting -= 1
        self._failures = 0
        took = time.monotonic() - started
        self._start_secs = policy.smoothed_start_secs(self._start_secs, took)
        rest = self._started_slots.pop(actor.actor_id, [])  # a host's other slots
        if self._closed:
            with contextlib.suppress(Exception):
                ray.kill(actor.handle, no_restart=True)
            return
        self.free.extend(rest)
        if waiter is not None and not waiter.future.done():
            waiter.start_pending = False
            if waiter.may_exceed or self._live() < self.cfg.max_live:
                self._grant(waiter, actor)  # started on its node for it
                self._kick()
                return
        self._offer(actor)

    def _fail_waiter(self, waiter: _Waiter | None, exc: BaseException) -> None:
        """A start failed: the bind it was for (or the oldest one waiting longer than
        ``start_patience`` with nothing else on the way) gets the error rather than
        waiting on starts that keep failing."""
        if waiter is None or waiter.future.done():
            waiter = None
            now = time.monotonic()
            for w in self.waiters:
                if not w.future.done() and now - w.since >= self.cfg.start_patience:
                    waiter = w
                    break
            if waiter is None or self.starting or self._reclaiming:
                return
        waiter.start_pending = False
        with contextlib.suppress(ValueError):
            self.waiters.remove(waiter)
        waiter.future.set_exception(exc)

    def _offer(self, actor: PooledActor) -> None:
        """An actor is free (started, given back, or its agent hibernated)."""
        if self._closed:
            with contextlib.suppress(Exception):
                ray.kill(actor.handle, no_restart=True)
            return
        actor.free_since = time.monotonic()
        self.free.append(actor)
        record = self.hosts.get(actor.actor_id)
        if (
            record is not None
            and record.empty_since is None
            and sum(1 for a in self.free if a.actor_id == actor.actor_id) >= record.capacity
        ):
            record.empty_since = actor.free_since
        self._pool_grew.set()
        self._kick()
        self._wake_pool()  # a spare's retirement to schedule

    def _release(self, actor: PooledActor) -> None:
        if self._hosted():
            if actor.actor_id in self.hosts:
                self._release_slot(actor)
            else:
                self._stop_own(actor)
            return
        actor.bindings += 1
        if self._closed or actor.bindings >= self.cfg.recycle_after:
            # Recycle the process: long-lived workers accumulate memory.
            with contextlib.suppress(Exception):
                ray.kill(actor.handle, no_restart=True)
            self.counters["actors_recycled"] += 1
            self._kick()
            return
        if not policy.keep_released(len(self.free), self._max_pool(), bool(self.waiters)):
            with contextlib.suppress(Exception):
                ray.kill(actor.handle, no_restart=True)
            self.counters["spares_retired"] += 1
            return
        self._offer(actor)

    def _release_slot(self, slot: PooledActor) -> None:
        """A host's agent hibernated: its slot is free again (a draining host's is not;
        the host stops once it hosts nobody). A host that hosted recycle_after times its
        capacity drains, to be recycled."""
        record = self.hosts.get(slot.actor_id)
        if record is None:
            return  # the host is gone
        record.bindings += 1
        if not record.draining and record.bindings >= self.cfg.recycle_after * record.capacity:
            # Recycle the process as a dedicated actor is (long-lived workers accumulate
            # memory), once its agents left: it takes no more meanwhile.
            record.draining = True
            self.free = [a for a in self.free if a.actor_id != slot.actor_id]
            self.counters["actors_recycled"] += 1
        if record.draining:
            if not any(e.actor.actor_id == slot.actor_id for e in self.entries.values()):
                self._drop_host(slot.actor_id)
                self.counters["hosts_drained"] += 1
            return
        self._offer(slot)

    def _retire_hosts(self, now: float) -> None:
        retire = policy.hosts_to_retire(
            self._host_loads(), self.target(), bool(self.waiters), now, self.cfg.pool_ttl
        )
        for host_id in retire:
            self._drop_host(host_id)
            self.counters["hosts_retired"] += 1

    async def _pool_loop(self) -> None:
        """Retire spares above the target unused for ``pool_ttl``, and re-check a
        deficit (spares waiting for an idle core, a start backoff) every
        ``_DEFICIT_CHECK`` seconds while there is one. Sleeps otherwise."""
        assert self._pool_changed is not None
        while not self._closed:
            self._pool_changed.clear()
            now = time.monotonic()
            ttl = self.cfg.pool_ttl
            retire = policy.spares_to_retire(
                [a.free_since for a in self.free], self.target(), bool(self.waiters), now, ttl
            )
            if self._hosted():
                self._retire_hosts(now)
                retire = []
            for actor in [self.free[i] for i in retire]:
                self.free.remove(actor)
                with contextlib.suppress(Exception):
                    ray.kill(actor.handle, no_restart=True)
                self.counters["spares_retired"] += 1
            # The target decays: look again when the oldest spare could retire.
            timeout = policy.retire_recheck(
                [a.free_since for a in self.free], self.cfg.pool_size, now, ttl
            )
            if self._short:
                self._cpu.sample()
            self._short = False
            self._kick()
            if self._short:  # a deficit it may not fill yet: look again shortly
                timeout = _DEFICIT_CHECK if timeout is None else min(timeout, _DEFICIT_CHECK)
            self._pool_idle = timeout is None
            await self._pool_event(self._pool_changed, timeout)
            self._pool_idle = False

    @staticmethod
    async def _pool_event(event: asyncio.Event, timeout: float | None) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    # -- hibernating idle agents for waiting binds ----------------------------------

    def _reclaim_need(self) -> int:
        waiting = sum(1 for w in self.waiters if not w.future.done())
        return waiting - len(self._reclaiming)

    def _reclaim_min_idle(self) -> float:
        """How long an agent must have been idle to be hibernated for a waiting bind
        now (:func:`~thinkray.actors.pool_policy.reclaim_min_idle`)."""
        waiting = sum(1 for w in self.waiters if not w.future.done())
        return policy.reclaim_min_idle(
            self._pool_config(), self._live(), waiting, self._per_start()
        )

    async def _reclaim_loop(self) -> None:
        """While binds wait: hibernate idle agents for them, least recently used first
        (one activity poll of the live agents per round), and keep one ``until_idle``
        call on each busy agent, so the first to finish is hibernated at once."""
        assert self._reclaim_changed is not None
        while not self._closed and self._reclaim_need() > 0:
            self._reclaim_changed.clear()
            names = [
                n
                for n in self.entries
                if n not in self._reclaiming
                and n not in self._probing
                and not self.locks[n].locked()
            ]
            entries = [self.entries[n] for n in names]
            reports = await asyncio.gather(
                *(e.actor.handle.activity.remote(n) for n, e in zip(names, entries, strict=True)),
                return_exceptions=True,
            )
            current = [
                (name, report)
                for name, entry, report in zip(names, entries, reports, strict=True)
                if isinstance(report, dict) and self.entries.get(name) is entry
            ]
            plan = policy.plan_reclaim(current, self._reclaim_min_idle(), self._reclaim_need())
            for name in plan.probe:
                if name not in self._probing:
                    self._probing.add(name)
                    self._spawn(self._probe(name, self.entries[name]))
            for victim in plan.victims:
                if victim in self.entries and victim not in self._reclaiming:
                    self._reclaiming.add(victim)
                    self._spawn(self._reclaim(victim))
            if self._reclaim_need() > 0:
                await self._pool_event(self._reclaim_changed, 1.0)

    async def _probe(self, name: str, entry: Entry) -> None:
        try:
            report = await entry.actor.handle.until_idle.remote(name, PROBE_TIMEOUT, FRESH_GRACE)
        except Exception:
            report = None
        finally:
            self._probing.discard(name)
        if (
            policy.takeable(report, self._reclaim_min_idle())
            and self.entries.get(name) is entry
            and name not in self._reclaiming
            and self._reclaim_need() > 0
        ):
            self._reclaiming.add(name)
            await self._reclaim(name)
        elif self._reclaim_changed is not None:
            self._reclaim_changed.set()

    async def _reclaim(self, victim: str) -> None:
        try:
            if await self.hibernate(victim):
                self.counters["lru_hibernations"] += 1
                self._credit = policy.credit_after_reclaim(self._credit)
        except Exception as exc:
            log.warning("could not hibernate %s for a waiting bind: %s", victim, exc)
        finally:
            self._reclaiming.discard(victim)
            if self._reclaim_changed is not None:
                self._reclaim_changed.set()
            self._kick()

    # -- resolve ---------------------------------------------------------------------

    async def resolve(
        self,
        name: str,
        create: bool = True,
        stale_actor_id: str | None = None,
        node_id: str | None = None,
        trace: dict[str, str] | None = None,
    ) -> tuple[Any, str]:
        """The live actor for ``name``, binding one if needed. ``stale_actor_id`` says
        the caller found that actor dead or no longer hosting ``name``; ``trace``: the
        caller's trace context (a wake is a span of the caller's trace)."""
        self._owns(name)
        await self._ready()
        self.counters["resolves"] += 1
        async with self.locks[name]:
            await self._await_settling(name)
            entry = self.entries.get(name)
            if (
                entry is not None
                and stale_actor_id == entry.actor.actor_id
                and not await self._still_hosts(entry, name)
            ):
                self.entries.pop(name, None)  # _watch may have removed it meanwhile
                self.counters["stale_rebinds"] += 1
                with contextlib.suppress(Exception):
                    ray.kill(entry.actor.handle, no_restart=True)
                entry = None
            if entry is not None:
                return entry.actor.handle, entry.actor.actor_id
            return await self._bind(name, create, node_id, trace)

    async def _still_hosts(self, entry: Entry, name: str) -> bool:
        """Whether ``entry``'s actor is alive and hosts ``name``. A caller that reports
        an actor stale may be late: pooled actors are reused, so the agent can have
        been hibernated and bound again on the very same actor since the caller's
        call failed (two calls sharing a handle both report it). Killing that actor
        would kill the new binding and the calls in flight on it."""
        try:
            report = await asyncio.wait_for(
                entry.actor.handle.activity.remote(name), STALE_PROBE_TIMEOUT
            )
        except Exception:  # dead, or too wedged to answer: replace it
            return False
        return bool(isinstance(report, dict) and report.get("bound"))

    def _bound(self, name: str, actor: PooledActor, info: Any, held_alarm: bool) -> tuple[Any, str]:
        """Record ``name`` live on ``actor`` after its bind returned ``info``."""
        entry = Entry(actor)
        self.entries[name] = entry
        self._note_size(name, info)
        if held_alarm:
            self._persist_alarm(name)  # the file follows the map: the report, or none
        self.counters["binds"] += 1
        self._watch_unless_hosted(name, entry)
        if self._reclaim_changed is not None and self.waiters:
            self._reclaim_changed.set()  # one more agent to watch for idleness
        return actor.handle, actor.actor_id

    async def _bind(
        self, name: str, create: bool, node_id: str | None, trace: dict[str, str] | None = None
    ) -> tuple[Any, str]:
        path = session_path(self.cfg.storage_root, self.cfg.namespace, name)
        if not create and not path.exists():
            raise SessionNotFoundError(
                f"agent {name!r} does not exist in namespace {self.cfg.namespace!r}"
            )
        spec = BindSpec(
            namespace=self.cfg.namespace,
            name=name,
            path=str(path),
            agent_cls=self.cfg.agent_cls,
            agent_kwargs=self.cfg.agent_kwargs,
            create=create,
            # by name: the host resolves it once, not a handle deserialized per bind
            directory=self._named_self(),
            idle_timeout=self.cfg.idle_timeout,
        )
        last_error: BaseException | None = None
        for attempt in range(4):
            if self._hosted() and name in self.own_actor:
                actor = await self._start_own(node_id)
            else:
                actor = await self._acquire(name, node_id, retry=attempt > 0)
            error: BaseException | None = None
            info: Any = None
            # Once bound, the agent reports its own next alarm (note_alarm), possibly
            # before the bind's reply arrives here: the alarm held for it is dropped
            # now, so that such a report is kept, and put back if the bind fails.
            held_alarm = self.alarms.pop(name, None)
            try:
                info = await self._bind_on(actor, spec, trace)
            except BaseException as exc:
                error = exc
            self.binding -= 1
            if error is not None and held_alarm is not None and name not in self.alarms:
                self.alarms[name] = held_alarm  # not bound: the alarm still wakes it
            if error is None:
                return self._bound(name, actor, info, held_alarm is not None)
            if isinstance(error, ray.exceptions.RayActorError):
                self._note_error("bind", name, f"the pooled actor died: {error}")
                last_error = error  # the pooled actor died: take another
                if actor.actor_id in self.hosts:
                    self._drop_host(actor.actor_id, kill=False)  # its other slots too
                self._kick()
                continue
            if isinstance(error, asyncio.CancelledError):
                if actor.actor_id in self.hosts:
                    # Killing a host would kill its other agents: undo this one.
                    self._spawn(self._abandon_slot(actor, name))
                    raise error
                # Whether the actor bound is unknown: never reuse it.
                with contextlib.suppress(Exception):
                    ray.kill(actor.handle, no_restart=True)
                self._kick()
                raise error
            if isinstance(error, ActorBusyError) and actor.actor_id in self.hosts:
                # The host hosts that agent already, or is full (never expected: a
                # rebuild's count was off): bind elsewhere, the slot is not free.
                self._note_error("bind", name, f"an agent host refused the bind: {error}")
                last_error = error
                continue
            if isinstance(error, ActorBusyError):
                # Not a spare after all (never expected): take it over once whatever
                # it does ends, and bind on another actor.
                self._note_error("bind", name, f"a pooled actor was not generic: {error}")
                self._spawn(self._settle(actor.handle, None))
                last_error = error
                continue
            self._give_back(actor, error)
            if isinstance(error, DatabaseLockedError):
                # A killed previous owner's lock lingers ~50 ms; Database already
                # retried for a while, so give the actor back and try again.
                last_error = error
                await asyncio.sleep(0.1)
                continue
            self._note_error("bind", name, error)
            raise error
        self._note_error("bind", name, f"could not bind: {last_error}")
        raise InvalidStateError(f"could not bind {name!r}: {last_error}")

    def _bind_on(self, actor: PooledActor, spec: BindSpec, trace: dict[str, str] | None) -> Any:
        """Bind ``spec`` on ``actor``: through its host's coalescer on an agent host (a
        burst's binds to one host share few calls), a call of its own otherwise."""
        record = self.hosts.get(actor.actor_id)
        if record is None:
            return actor.handle.bind.remote(spec, trace)
        if record.binds is None:
            record.binds = HostBinds(record.handle, on_call=self._count_bind_call)
        return record.binds.bind(spec, trace)

    def _count_bind_call(self, binds: int) -> None:
        self.counters["host_bind_calls"] += 1
        self.counters["host_binds_coalesced"] += binds - 1

    async def _abandon_slot(self, slot: PooledActor, name: str) -> None:
        """A bind on a host was cancelled mid-way: hibernate whatever it bound (once
        the bind has ended), then the slot is free again."""
        for _ in range(50):
            try:
                report = await slot.handle.hibernate.remote(name, True)
            except Exception:  # the host died: its slots go with it
                self._drop_host(slot.actor_id, kill=False)
                return
            if report.get("ok"):
                self._release_slot(slot)
                return
            await asyncio.sleep(0.1)  # the bind is still in flight
        self._note_error("bind", name, "a cancelled bind on an agent host never ended")

    def _give_back(self, actor: PooledActor, error: BaseException) -> None:
        """A bind failed on ``actor`` and undid itself: the actor is a spare again,
        unless its failed wake could not close the agent's database (WakeError not
        ``clean``): then its process is stopped, which frees the file (a host is
        drained instead: it takes no more agents and stops once its others left)."""
        if self._hosted() and actor.actor_id not in self.hosts:
            self._stop_own(actor)
            return
        record = self.hosts.get(actor.actor_id)
        if record is not None and isinstance(error, WakeError) and not error.clean:
            record.draining = True
            self.free = [a for a in self.free if a.actor_id != actor.actor_id]
            self.counters["hosts_draining"] += 1
            self._release_slot(actor)
            self._kick()
            return
        if isinstance(error, WakeError) and not getattr(error, "clean", True):
            with contextlib.suppress(Exception):
                ray.kill(actor.handle, no_restart=True)
            self.counters["actors_retired_unclean"] += 1
            self._kick()
            return
        self._offer(actor)

    # -- one agent's placement -------------------------------------------------------

    async def _start_own(self, node_id: str | None) -> PooledActor:
        """A session actor of its own for an agent moved out of the hosts, counted in
        ``binding`` as :meth:`_acquire`'s actors are (its caller gives it back)."""
        if self._closed:
            raise InvalidStateError(f"namespace {self.cfg.namespace!r} is shutting down")
        self.binding += 1
        try:
            handle = self._new_actor(node_id, own=True)
            info = await handle.ready.remote(self._named_self())
        except BaseException:
            self.binding -= 1
            raise
        self.counters["own_actors_started"] += 1
        return PooledActor(handle, info["actor_id"], info["node_id"], info["pid"])

    def _stop_own(self, actor: PooledActor) -> None:
        """Stop an agent's own actor (never pooled: the pool holds host slots)."""
        with contextlib.suppress(Exception):
            ray.kill(actor.handle, no_restart=True)
        self.counters["own_actors_stopped"] += 1
        self._kick()

    async def place(
        self, name: str, placement: str, timeout: float = 30.0
    ) -> dict[str, Any] | None:
        """Move agent ``name`` to an actor of its own (``"dedicated"``) or back into
        the agent hosts (``"hosts"``), at its next turn boundary: a live agent is
        hibernated once no turn or call of its own runs (waiting up to ``timeout``
        seconds) and woken where it now belongs; a hibernated one wakes there on its
        next call. Returns :meth:`live_actor`'s answer afterwards (None: not live).
        Kept while this directory lives; a replacement directory keeps it for the
        moved agents it finds live (a hibernated one then wakes into a host again).

        Raises:
            InvalidInputError: ``placement`` is neither ``"dedicated"`` nor ``"hosts"``.
            InvalidStateError: the namespace has no hosts (every agent already has
                an actor of its own).
            SessionNotFoundError: no such agent (nothing recorded).
            ActorBusyError: the agent was still busy after ``timeout`` (it stays
                where it was, and its placement is unchanged).
        """
        self._owns(name)
        await self._ready()
        if placement not in ("dedicated", "hosts"):
            raise InvalidInputError(f"placement must be 'dedicated' or 'hosts', not {placement!r}")
        if not self._hosted():
            raise InvalidStateError(
                f"namespace {self.cfg.namespace!r} has placement {self.cfg.placement!r}: "
                "every agent has an actor of its own already"
            )
        path = session_path(self.cfg.storage_root, self.cfg.namespace, name)
        if name not in self.entries and not path.exists():
            raise SessionNotFoundError(
                f"agent {name!r} does not exist in namespace {self.cfg.namespace!r}"
            )
        before = name in self.own_actor
        if placement == "dedicated":
            self.own_actor.add(name)
        else:
            self.own_actor.discard(name)
        try:
            moved = await self._move_live(name, placement, timeout)
        except BaseException:
            if before:  # nothing changed: the agent keeps its placement
                self.own_actor.add(name)
            else:
                self.own_actor.discard(name)
            raise
        if moved:
            await self.resolve(name, False, None, None)
        return await self.live_actor(name)

    async def _move_live(self, name: str, placement: str, timeout: float) -> bool:
        """Hibernate ``name`` at its next turn boundary if it is live on the wrong
        kind of actor; whether it was."""
        deadline = time.monotonic() + timeout
        while True:
            await self._await_settling(name)
            entry = self.entries.get(name)
            if entry is None:
                return False
            on_host = entry.actor.actor_id in self.hosts
            if on_host == (placement == "hosts"):
                return False  # already there
            left = deadline - time.monotonic()
            with contextlib.suppress(Exception):  # a dead actor: hibernate says so
                await entry.actor.handle.until_idle.remote(name, max(0.0, left))
            if await self.hibernate(name):
                return True
            if time.monotonic() >= deadline:
                raise ActorBusyError("busy", name)

    # -- hibernate -------------------------------------------------------------------

    async def hibernate(self, name: str, force: bool = False) -> bool:
        """Close ``name``'s file and return its actor to the pool. False if busy."""
        await self._ready()
        lock = self.locks[name]
        async with lock:
            await self._await_settling(name)
            entry = self.entries.get(name)
            if entry is None:
                return False
            try:
                report = await entry.actor.handle.hibernate.remote(name, force)
            except ray.exceptions.RayActorError:
                self.entries.pop(name, None)  # _watch may have removed it meanwhile
                self._kick()
                return True
            if not report.get("ok"):
                return False
            del self.entries[name]
            self.queued.discard(name)  # its next_due_at says so now
            self.counters["hibernations"] += 1
            self._note_size(name, report)
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
        await self._ready()
        results = await asyncio.gather(*(self.hibernate(n, force) for n in list(self.entries)))
        return sum(1 for r in results if r)

    # -- alarms ----------------------------------------------------------------------

    def set_alarm(self, name: str, due_at: float) -> None:
        """Wake ``name`` at ``due_at`` (epoch seconds) if it is hibernated then."""
        current = self.alarms.get(name)
        if current is None or due_at < current:
            self.alarms[name] = due_at
            self._persist_alarm(name)
        if self._alarm_changed is not None:
            self._alarm_changed.set()

    def note_queue(self, name: str, busy: bool) -> None:
        """A live agent's queue of messages sent mid-turn became non-empty (``busy``) or
        empty. If its actor dies meanwhile the directory wakes it at once, so the
        wake runs what waited instead of leaving it for the next caller."""
        if busy:
            self.queued.add(name)
        else:
            self.queued.discard(name)

    def note_alarm(self, name: str, due_at: float | None) -> None:
        """A live agent's next alarm changed (None: it has none). Kept so that the
        alarm still fires if the agent's process dies before it is due."""
        if due_at is None:
            if self.alarms.pop(name, None) is not None:
                self._persist_alarm(name)
        elif self.alarms.get(name) != due_at:
            self.alarms[name] = due_at
            self._persist_alarm(name)
        if self._alarm_changed is not None:
            self._alarm_changed.set()

    def _persist_alarm(self, name: str) -> None:
        """Bring ``name``'s alarm file in line with :attr:`alarms` (soon, off the
        event loop: one writer task writes whatever the map holds when it gets there,
        so the last change wins)."""
        self._alarm_dirty.add(name)
        if self._alarm_writer is None or self._alarm_writer.done():
            self._alarm_writer = self._spawn(self._write_alarms())

    async def _write_alarms(self) -> None:
        while self._alarm_dirty:
            batch = {n: self.alarms.get(n) for n in self._alarm_dirty}
            self._alarm_dirty.clear()
            try:
                await asyncio.to_thread(self._write_alarm_files, batch)
            except Exception as exc:  # kept in memory; written again on its next change
                log.warning("could not record alarms of %s: %s", sorted(batch), exc)

    def _write_alarm_files(self, batch: dict[str, float | None]) -> None:
        for name, due in batch.items():
            write_alarm(self.cfg.storage_root, self.cfg.namespace, name, due)

    async def _load_alarms(self) -> None:
        """Take over the recorded alarms of this shard's names (a replaced directory's
        included); an alarm noted since this directory started is newer and kept."""
        shard, shards = self.cfg.shard, self.cfg.shards
        try:
            loaded = await asyncio.to_thread(
                read_alarms,
                self.cfg.storage_root,
                self.cfg.namespace,
                lambda n: shard_of(n, shards) == shard,
            )
        except Exception as exc:  # the directory works without them
            log.warning("could not read the recorded alarms: %s", exc)
            return
        for name, due in loaded.items():
            self.alarms.setdefault(name, due)
        if loaded:
            self.counters["alarms_loaded"] += len(loaded)
            if self._alarm_changed is not None:
                self._alarm_changed.set()

    def _watch_unless_hosted(self, name: str, entry: Entry) -> None:
        """Watch ``name``'s own actor for its death; an agent on a host needs no call of
        its own: its host's one watch covers it (:meth:`_watch_host`)."""
        if entry.actor.actor_id not in self.hosts:
            self.counters["watches"] += 1
            self._spawn(self._watch(name, entry))

    async def _watch(self, name: str, entry: Entry) -> None:
        """Learn of the death of ``name``'s own actor as it happens: its ``watch`` call
        fails (see :meth:`_actor_died`)."""
        try:
            await entry.actor.handle.watch.remote(name)
        except ray.exceptions.RayActorError:
            self._actor_died(name, entry)
        except Exception:  # the directory is shutting down
            return

    async def _watch_host(self, record: HostRecord) -> None:
        """Learn of a host's death as it happens: the one ``watch_host`` call this
        directory keeps pending on it fails (the host returns it now and then, to be
        called again while the host is registered). Every agent it hosted then died
        with it (:meth:`_actor_died`). One call per host instead of one per hosted
        agent: a bind costs the directory and the host a Ray call less."""
        while self.hosts.get(record.actor_id) is record and not self._closed:
            self.counters["host_watches"] += 1
            try:
                await record.handle.watch_host.remote()
            except ray.exceptions.RayActorError:
                if self._closed:
                    return
                self._drop_host(record.actor_id, kill=False)  # all its slots
                for name, entry in list(self.entries.items()):
                    if entry.actor.actor_id == record.actor_id:
                        self._actor_died(name, entry)
                return
            except Exception:  # the directory is shutting down
                return

    def _actor_died(self, name: str, entry: Entry) -> None:
        """``name``'s actor (or host) died: the agent is no longer live; its next call
        (or alarm) wakes it on another actor, and a pending alarm fires on time."""
        if self.entries.get(name) is entry:
            self.entries.pop(name, None)  # a hibernation may have removed it meanwhile
            self.counters["crashes"] += 1
            log.warning("the actor of %s died; it wakes on its next call or alarm", name)
            self._note_error("actor_died", name, "its actor died")
            if self._alarm_changed is not None:
                self._alarm_changed.set()
            self._kick()
        if name in self.queued:
            self.queued.discard(name)
            self.set_alarm(name, time.time())  # messages were queued: wake it now

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
        # The alarm's file stays until the wake is over: a directory that dies meanwhile
        # is replaced and wakes the agent again (a wake of a live agent changes nothing).
        try:
            await self.resolve(name, create=False)
            self.counters["alarm_wakes"] += 1
        except Exception as exc:
            log.warning("alarm wake of %s failed: %s", name, exc)
            self._note_error("alarm_wake", name, exc)
        finally:
            self._persist_alarm(name)

    # -- introspection ---------------------------------------------------------------

    # -- metrics -----------------------------------------------------------------------

    def _note_size(self, name: str, report: Any) -> None:
        """A bind or hibernation of ``name`` reported its file's ``bytes``."""
        size = report.get("bytes") if isinstance(report, dict) else None
        if isinstance(size, int):
            self._size_total += size - self._sizes.get(name, 0)
            self._sizes[name] = size
        elif name not in self._sizes:
            self._sizes[name] = 0

    async def _count_files(self) -> None:
        """Learn this shard's agents with a file, once, as the directory starts: their
        names and (local roots) sizes. Binds keep it current from then on; a file
        deleted behind the directory's back counts until it restarts. Under an
        object-store root only the names are listed: sizes count from each agent's
        next wake."""
        root, namespace = self.cfg.storage_root, self.cfg.namespace
        shard, shards = self.cfg.shard, self.cfg.shards

        def scan() -> dict[str, int]:
            found: dict[str, int] = {}
            remote = is_remote_root(root)
            for name in list_names(root, namespace):
                if shard_of(name, shards) != shard:
                    continue
                size = 0
                if not remote:
                    with contextlib.suppress(OSError):
                        size = os.stat(session_path(root, namespace, name)).st_size
                found[name] = size
            return found

        try:
            found = await asyncio.to_thread(scan)
        except Exception as exc:  # the gauges go without hibernated agents and bytes
            log.warning("could not count the agents' files: %s", exc)
            return
        for name, size in found.items():
            if name not in self._sizes:  # a bind's report since is newer
                self._sizes[name] = size
                self._size_total += size
        self._counted = True

    def _set_gauges(self) -> None:
        sink, tags = metrics(), self._shard_tags
        sink.set("thinkray_agents_live", len(self.entries), tags)
        sink.set("thinkray_pool_free", len(self.free), tags)
        if self._counted:
            hibernated = max(0, len(self._sizes) - len(self.entries))
            sink.set("thinkray_agents_hibernated", hibernated, tags)
            sink.set("thinkray_storage_bytes", self._size_total, tags)

    async def _gauge_loop(self) -> None:
        while not self._closed:
            self._set_gauges()
            await asyncio.sleep(GAUGE_INTERVAL)

    async def stats(self) -> dict[str, Any]:
        """The namespace, its storage root, live agents (name → actor id), the free
        pool size, actors starting, binds waiting, pending alarms, the event counters
        and the pool's state (``target`` spares, ``max_starting`` starts in flight and
        the most seen at once, ``starting_peak``), and which shard of how many this is."""
        await self._ready()
        return {
            "namespace": self.cfg.namespace,
            "shard": self.cfg.shard,
            "pid": os.getpid(),
            "shards": self.cfg.shards,
            "max_live": self.cfg.max_live,
            "storage_root": self.cfg.storage_root,
            "live": {n: e.actor.actor_id for n, e in self.entries.items()},
            "free": len(self.free),
            "starting": self.starting,
            "waiting": sum(1 for w in self.waiters if not w.future.done()),
            "alarms": dict(self.alarms),
            "counters": dict(self.counters),
            "recovery_secs": self.recovery_secs,
            "placement": self.cfg.placement,
            "hosts": self._hosts_summary(),
            "pool": {
                "target": self.target(),
                "max_starting": self._max_starting,
                "starting_peak": self.starting_peak,
                "bind_rate": len(self._bind_times) / RATE_WINDOW,
                "start_secs": round(self._start_secs, 3),
            },
        }

    def _hosts_summary(self) -> dict[str, dict[str, Any]]:
        """Placement ``hosts``: each host's pid, capacity, agents live on it and free
        slots (empty under ``dedicated``)."""
        live: defaultdict[str, int] = defaultdict(int)
        for entry in self.entries.values():
            live[entry.actor.actor_id] += 1
        return {
            load.host_id: {
                "pid": self.hosts[load.host_id].pid,
                "capacity": load.capacity,
                "live": live[load.host_id],
                "free": load.free,
                "draining": load.draining,
                "binds_queued": _queued(self.hosts[load.host_id]),
            }
            for load in self._host_loads()
        }

    async def wake(self, name: str, node_id: str | None = None) -> tuple[dict[str, Any], Any, str]:
        """Bind ``name`` now if it is not live (optionally on a given node): where it
        lives (:meth:`live_actor`) and what :meth:`resolve` answers (the actor and its
        id), in one call. A namespace's ``wake`` gives the actor to the agent's handle,
        whose first call then needs no resolve of its own (a round trip here, ~3.6 ms)."""
        for _ in range(2):  # hibernated again already (idle_timeout 0): bind once more
            actor, actor_id = await self.resolve(name, True, None, node_id)
            where = await self.live_actor(name)
            if where is not None and where["actor_id"] == actor_id:
                return where, actor, actor_id
        raise NotBoundError(name, None)

    async def live_actor(self, name: str) -> dict[str, Any] | None:
        """Where ``name`` runs (``actor_id``, ``node_id``, ``pid``), or None when it is
        not live."""
        await self._ready()
        entry = self.entries.get(name)
        if entry is None:
            return None
        return {
            "actor_id": entry.actor.actor_id,
            "node_id": entry.actor.node_id,
            "pid": entry.actor.pid,
            "placement": "hosts" if entry.actor.actor_id in self.hosts else "dedicated",
        }

    async def shutdown(self) -> None:
        """Hibernate everything (forcing), then stop every actor this directory made
        (waiting a little for the starts in flight: a detached actor would outlive it)."""
        await self.hibernate_all(force=True)
        if self._alarm_writer is not None:  # the hibernated agents' alarms are on disk
            await asyncio.gather(self._alarm_writer, return_exceptions=True)
        self._closed = True
        deadline = time.monotonic() + 10.0
        while self.starting and time.monotonic() < deadline:
            self._pool_grew.clear()
            await self._pool_event(self._pool_grew, 0.5)
        self._kick()  # fails the binds still waiting
        for event in (self._alarm_changed, self._pool_changed, self._reclaim_changed):
            if event is not None:
                event.set()
        for actor in self.free:
            with contextlib.suppress(Exception):
                ray.kill(actor.handle, no_restart=True)
        self.free.clear()
        for host_id in list(self.hosts):
            self._drop_host(host_id)
        await self._stop_bridges()
        self._set_gauges()

    async def _stop_bridges(self) -> None:
        """Close and stop the workspace bridges of this shard's orchestrators: they are
        detached (an orchestrator hibernates; its sub-agents still need the bridge), so
        they last as long as the namespace does."""
        from thinkray.actors.bridge import bridge_name

        prefix = bridge_name(self.cfg.namespace, "x")[:-1]  # "thinkray-bridge:<ns>:"
        try:
            named = ray.util.list_named_actors(all_namespaces=True)
        except Exception as exc:
            log.warning("listing the bridges of %s failed: %s", self.cfg.namespace, exc)
            return
        for entry in named:
            name = entry.get("name", "") if isinstance(entry, dict) else str(entry)
            if not name.startswith(prefix) or entry.get("namespace") != "thinkray":
                continue
            if shard_of(name[len(prefix) :], self.cfg.shards) != self.cfg.shard:
                continue
            try:
                bridge = ray.get_actor(name, namespace="thinkray")
                await asyncio.wait_for(bridge.close.remote(), 10.0)
            except Exception as exc:  # gone already, or stuck: it is killed anyway
                log.info("closing bridge %s: %s", name, exc)
                bridge = None
            if bridge is not None:
                with contextlib.suppress(Exception):
                    ray.kill(bridge, no_restart=True)

    async def config(self) -> NamespaceConfig:
        """This shard's configuration (a namespace object recreates lost shards from it)."""
        return self.cfg

    # -- live view (thinkray top) --

    def _note_error(self, kind: str, name: str | None, error: Any) -> None:
        """Keep an error for ``thinkray top`` (the last ``RECENT_ERRORS``): ``kind``
        (``bind``, ``actor_start``, ``actor_died``, ``alarm_wake``), the agent (None:
        the pool's) and the message."""
        message = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        self.recent_errors.append(
            {"at": time.time(), "kind": kind, "agent": name, "message": message[:500]}
        )

    async def top(self, timeout: float = SNAPSHOT_TIMEOUT) -> dict[str, Any]:
        """The live view of this shard (``thinkray top``): the namespace and shard, the
        pool (``free`` spares, actors ``starting``, binds ``waiting``, the ``target``
        and ``max_live``), how many agents are ``live``, each live agent's
        :meth:`SessionActor.snapshot` (asked of all at once; an actor that does not
        answer within ``timeout`` seconds is ``unreachable``, never waited on longer),
        and ``recent_errors``: this directory's (failed binds and actor starts, actors
        that died) followed by the sessions whose status is error, newest first."""
        await self._ready()
        live = list(self.entries.items())

        async def ask(name: str, entry: Entry) -> dict[str, Any]:
            base = {
                "agent": name,
                "actor_id": entry.actor.actor_id,
                "node_id": entry.actor.node_id,
                "pid": entry.actor.pid,
                "bound_at": entry.bound_at,
            }
            try:
                snap = await asyncio.wait_for(entry.actor.handle.snapshot.remote(name), timeout)
            except Exception as exc:  # dead, wedged or slow: shown, never waited on
                reason = "timeout" if isinstance(exc, TimeoutError) else type(exc).__name__
                return {**base, "unreachable": True, "reason": reason, "sessions": []}
            if not isinstance(snap, dict) or snap.get("agent") != name:
                # Hibernated (or rebound) between the listing and the answer.
                return {**base, "unreachable": False, "gone": True, "sessions": []}
            return {**snap, **base, "unreachable": False}

        agents = list(await asyncio.gather(*(ask(n, e) for n, e in live)))
        agents.sort(key=lambda a: a["agent"])
        errors = sorted(self.recent_errors, key=lambda e: e["at"], reverse=True)
        for snap in agents:
            for row in snap.get("sessions", ()):
                if row.get("state") == "error":
                    errors.append(
                        {
                            "at": None,
                            "kind": "session",
                            "agent": snap["agent"],
                            "session_id": row.get("session_id"),
                            "message": row.get("message"),
                        }
                    )
        return {
            "namespace": self.cfg.namespace,
            "shard": self.cfg.shard,
            "shards": self.cfg.shards,
            "storage_root": self.cfg.storage_root,
            "at": time.time(),
            "pool": {
                "free": len(self.free),
                "starting": self.starting,
                "waiting": sum(1 for w in self.waiters if not w.future.done()),
                "target": self.target(),
                "max_live": self.cfg.max_live,
            },
            "live": len(self.entries),
            "agents": agents,
            "recent_errors": errors,
        }


RemoteDirectory = ray.remote(Directory)
