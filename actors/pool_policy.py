"""The warm pool's policy as pure functions (see :mod:`thinkray.actors.directory` for
what the pool does and why): how many spares the pool keeps, how many actors to start
now, which spares retire, which idle agents to hibernate for waiting binds, and the
reclaim credit that pays for starts.

The :class:`~thinkray.actors.directory.Directory` actor gathers what the policy reads
into a frozen :class:`PoolContext` (or the few numbers a function takes), calls these
functions and applies what they return (starting actors, retiring spares, hibernating
agents). Nothing here awaits, reads a clock or touches Ray, so each decision is tested
with plain values (``tests/test_pool_policy.py``); the one reading of the node,
:class:`CpuMeter`, is sampled by the directory and enters the context as a boolean.
This is the seam that placement across agent hosts extends.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

RATE_WINDOW = 10.0
"""Seconds of binds the pool's bind rate is measured over."""
RECLAIMS_PER_START = 16
"""Agents hibernated to make room for waiting binds that pay for starting one actor:
an actor start costs about as much CPU as that many hibernate-and-rebind cycles."""
RECLAIM_IDLE = 10.0
"""Below the live cap, a few waiting binds (no more than the agent slots of
``max_starting`` starts, which serve them within seconds) take only agents idle this
long: an agent in a conversation is called again soon, and taking it would cost that
call a rebind, which would take the next agent's actor, and so on (round-robin
sessions all rebinding).
A burst of more binds than starts can serve soon, or binds at the live cap, take any
idle agent, least recently used first."""
FRESH_GRACE = 2.0
"""An agent bound this recently and not called yet is not hibernated for another bind:
the call that woke it is on its way."""


@dataclass(frozen=True)
class PoolConfig:
    """The namespace's pool settings the policy reads (this shard's share):
    ``max_pool`` None means ``max_live``; ``max_starting`` is resolved (the cluster's
    CPUs per shard unless set)."""

    pool_size: int
    max_live: int
    max_pool: int | None
    pool_ttl: float
    max_starting: int
    start_patience: float
    # False: no spare is started for demand (the bind rate, misses); the pool keeps
    # ``pool_size`` and the actors that hibernations give back
    grow: bool = True

    def most_spares(self) -> int:
        """The most spares kept: ``max_pool`` (``max_live`` if None), at least
        ``pool_size``."""
        most = self.max_live if self.max_pool is None else self.max_pool
        return max(self.pool_size, most)


@dataclass(frozen=True)
class Waiting:
    """A bind waiting for an actor on any node: since when (monotonic seconds) and
    whether it waited ``cap_wait`` at the live cap and may exceed it."""

    since: float
    may_exceed: bool = False


@dataclass(frozen=True)
class PoolContext:
    """What :func:`plan_starts` reads, gathered by the directory at one instant.

    ``live``: agents live plus binds holding an actor; ``agents``: agents live;
    ``free``: spares; ``starting``: actor starts in flight (those just launched for
    binds pinned to a node included); ``waiting``: the binds waiting for an actor on any
    node, oldest first (pinned ones excluded: the directory starts one actor on its
    node for each); ``target``: :func:`target`; ``fill``: spares ``start()`` waits for,
    started even on a busy node; ``calm``: the CPU meter shows about a core idle;
    ``credit``: starts earned by hibernations for waiting binds; ``served_at``: when a
    waiting bind last got an actor."""

    config: PoolConfig
    now: float
    live: int
    agents: int
    free: int
    starting: int
    waiting: tuple[Waiting, ...]
    target: int
    fill: int
    calm: bool
    credit: float
    served_at: float
    # agent slots one start adds: 1 for a dedicated actor, the capacity of an agent
    # host (placement "hosts"); ``free`` then counts free slots, not actors
    per_start: int = 1


@dataclass(frozen=True)
class StartPlan:
    """What :func:`plan_starts` decides: ``start`` actors to start now (>= 0), the
    reclaim ``credit`` left, and whether a ``deficit`` remains (actors the pool lacks
    but may not start yet: the directory re-checks it shortly)."""

    start: int
    credit: float
    deficit: bool


@dataclass(frozen=True)
class ReclaimPlan:
    """What :func:`plan_reclaim` decides: the agents to hibernate for waiting binds
    (``victims``, least recently used first) and the busy or just-bound ones to watch
    until they are idle (``probe``)."""

    victims: tuple[str, ...]
    probe: tuple[str, ...]


def decayed_boost(boost: float, boost_at: float, now: float, pool_ttl: float) -> float:
    """The misses' boost of the target at ``now``: ``boost`` (set at ``boost_at``)
    halved every ``pool_ttl`` seconds."""
    return boost * 0.5 ** ((now - boost_at) / max(pool_ttl, 1e-3))


def boost_after_miss(boost: float, boost_at: float, now: float, pool_ttl: float) -> float:
    """The boost after a miss at ``now`` (a bind found no spare): one more spare."""
    return decayed_boost(boost, boost_at, now, pool_ttl) + 1


def target(config: PoolConfig, recent_binds: int, start_secs: float, boost: float) -> int:
    """How many spares the pool keeps: ``pool_size`` at least, raised by the decayed
    ``boost`` of recent misses and by the bind rate (``recent_binds`` in the last
    ``RATE_WINDOW`` seconds, times ``start_secs`` an actor takes to start: the spares
    the binds consume while one starts), at most :meth:`PoolConfig.most_spares`;
    ``pool_size`` alone when the config does not ``grow``."""
    if not config.grow:
        return min(config.most_spares(), config.pool_size)
    by_rate = math.ceil(recent_binds / RATE_WINDOW * start_secs - 1e-9)
    by_misses = math.ceil(boost - 1e-9)
    return min(config.most_spares(), max(config.pool_size, by_rate, by_misses))


def fill_for_start(config: PoolConfig, live: int) -> int:
    """How many spares ``Directory.start`` fills the pool to (started even on a busy
    node): ``pool_size``, no more than the live cap (plus one) leaves room for."""
    return max(0, min(config.pool_size, config.max_live + 1 - live))


def _demand(ctx: PoolContext) -> int:
    """Actors the waiting binds need: each one that may exceed the cap, and the others
    as far as the live cap has room."""
    slots, need = ctx.config.max_live - ctx.live, 0
    for waiting in ctx.waiting:
        if waiting.may_exceed:
            need += 1
        elif slots > 0:
            need, slots = need + 1, slots - 1
    return need


def _stalled(ctx: PoolContext, need: int) -> bool:
    """Waiting binds start actors when no actor came for them for ``start_patience``,
    or when there is no agent whose actor could be taken."""
    if need <= 0 or not ctx.waiting:
        return False
    oldest = ctx.waiting[0].since
    patience = ctx.config.start_patience
    return not ctx.agents or ctx.now - max(ctx.served_at, oldest) >= patience


def plan_starts(ctx: PoolContext) -> StartPlan:
    """How many actors to start now for the waiting binds and the spares' target.

    The pool lacks ``short`` = need + spares - free - starting actors. All of them start
    when ``start()`` is filling the pool or the node is calm; when the waiting binds
    stalled, only theirs (spares wait for an idle core); with nobody waiting and the
    spares below ``pool_size``, one at a time; else as many as the reclaim credit pays
    for (ski rental: hibernating agents for waiting binds has cost as much as the
    starts), spending it. Never more than ``max_starting`` in flight. A shortfall left
    over is a ``deficit``; with none, nothing changes (the credit included)."""
    cfg = ctx.config
    per = max(1, ctx.per_start)
    need = _demand(ctx)
    spares = max(0, min(ctx.target, cfg.max_live + 1 - ctx.live - need))
    have = ctx.free + ctx.starting * per
    short = need + spares - have
    if short <= 0:
        return StartPlan(0, ctx.credit, False)
    short_starts = math.ceil(short / per)  # what is short, in starts
    room = cfg.max_starting - ctx.starting
    credit = ctx.credit
    if have < ctx.fill or ctx.calm:
        allowed = short_starts
    elif _stalled(ctx, need):
        allowed = math.ceil((need - have) / per)
    elif not need and have < min(cfg.pool_size, spares):
        # Below the floor with nobody waiting: replenish, one start at a time while
        # the node is busy (the next wake, or a crashed agent's, finds a spare).
        allowed = 1 - ctx.starting
    elif credit >= short_starts:
        allowed = min(short_starts, room)
        credit -= allowed
    else:
        allowed = 0
    allowed = min(allowed, room)
    return StartPlan(max(0, allowed), credit, short_starts > allowed)


@dataclass(frozen=True)
class HostLoad:
    """One agent host as placement sees it: its id, ``free`` slots of ``capacity``,
    whether it takes no more agents (``draining``), and since when all its slots are
    free (``empty_since``, monotonic seconds; None while it hosts an agent)."""

    host_id: str
    free: int
    capacity: int
    draining: bool = False
    empty_since: float | None = None


def pick_host(hosts: Sequence[HostLoad]) -> str | None:
    """The host a bind goes to: the least loaded one with a free slot (the most free
    slots; ties by id, so placement is stable), never a draining one. None: all full."""
    open_ = [h for h in hosts if h.free > 0 and not h.draining]
    if not open_:
        return None
    return min(open_, key=lambda h: (-h.free, h.host_id)).host_id


def spread_target(per_start: int, hosts: int, cores: int) -> int:
    """Free agent slots to keep while fewer hosts run than ``cores`` (the CPUs the
    directory may start actors for): more than a whole host's worth, so an empty host
    is always running ahead of the agents. A host is one process, so it uses one core
    at most: agents spread over a host per core (placement picks the least loaded)
    before they pack. Started ahead, not on demand: a burst of new sessions arrives
    faster than a host process starts (~1 s), and binds already placed stay where
    they are (issue 22: 50 brand-new sessions at once all landed on the one host
    running, whose loop they queued on while the second core sat idle). 0 once there
    are enough hosts."""
    return per_start + 1 if hosts < cores else 0


def hosts_to_retire(
    hosts: Sequence[HostLoad], target: int, waiting: bool, now: float, pool_ttl: float
) -> list[str]:
    """The empty hosts to stop: each whose slots have all been free for ``pool_ttl``,
    longest empty first, as long as the free slots left stay at ``target`` or more;
    none while binds are ``waiting``. A draining host is stopped as soon as it is
    empty."""
    if waiting:
        return []
    free = sum(h.free for h in hosts if not h.draining)
    out = [h.host_id for h in hosts if h.draining and h.free >= h.capacity]
    empty = sorted(
        (h for h in hosts if not h.draining and h.empty_since is not None),
        key=lambda h: (h.empty_since, h.host_id),
    )
    for host in empty:
        aged = host.empty_since is not None and host.empty_since + pool_ttl <= now
        if aged and free - host.capacity >= target:
            out.append(host.host_id)
            free -= host.capacity
    return out


def credit_after_reclaim(credit: float) -> float:
    """The credit after an agent was hibernated for a waiting bind:
    1/``RECLAIMS_PER_START`` of an actor start more."""
    return credit + 1 / RECLAIMS_PER_START


def start_backoff(failures: int) -> float:
    """Seconds no actor starts after ``failures`` consecutive failed starts."""
    return min(5.0, 0.05 * 2**failures)


def smoothed_start_secs(start_secs: float, took: float) -> float:
    """The moving average of an actor's start time after one that ``took`` seconds."""
    return 0.7 * start_secs + 0.3 * took


def spares_to_retire(
    free_since: Sequence[float], target: int, waiting: bool, now: float, pool_ttl: float
) -> list[int]:
    """The spares to retire (indices into ``free_since``, when each became a spare):
    those above ``target``, oldest first, unused for ``pool_ttl``; none while binds are
    ``waiting``."""
    excess = len(free_since) - target
    if excess <= 0 or waiting:
        return []
    oldest_first = sorted(range(len(free_since)), key=lambda i: free_since[i])[:excess]
    return [i for i in oldest_first if free_since[i] + pool_ttl <= now]


def retire_recheck(
    free_since: Sequence[float], pool_size: int, now: float, pool_ttl: float
) -> float | None:
    """Seconds until the pool should look again for spares to retire (the target
    decays): when the oldest spare could retire, at least ``pool_ttl`` / 4; None when
    the spares are no more than ``pool_size``."""
    if len(free_since) <= pool_size:
        return None
    return max(min(free_since) + pool_ttl - now, pool_ttl / 4)


def keep_released(spares: int, most_spares: int, waiting: bool) -> bool:
    """Whether an actor whose agent was released rejoins the pool (else it is
    stopped): while binds wait, or the pool holds fewer than ``most_spares``."""
    return waiting or spares < most_spares


def reclaim_min_idle(config: PoolConfig, live: int, waiting: int, per_start: int = 1) -> float:
    """How long an agent must have been idle to be hibernated for a waiting bind: any
    idle agent at the live cap or when more binds wait than ``max_starting`` starts
    serve soon (``per_start`` each), else ``RECLAIM_IDLE`` (see there). ``per_start``:
    the agent slots one start brings (a host's capacity under placement ``hosts``, else 1): a host start
    serves that many waiting binds, so a ramp of binds into starting hosts hibernates
    no agent the live cap leaves room for."""
    if live >= config.max_live or waiting > config.max_starting * max(1, per_start):
        return 0.0
    return RECLAIM_IDLE


def young(report: Mapping[str, Any]) -> bool:
    """An agent just bound for a call that has not reached it yet (``FRESH_GRACE``)."""
    return bool(report.get("fresh") and report.get("bound_for", 0.0) < FRESH_GRACE)


def takeable(report: Any, min_idle: float) -> bool:
    """Whether an ``activity``/``until_idle`` report (anything else: no) shows an agent
    that may be hibernated for a waiting bind: not busy, not just bound for a call on
    its way, idle at least ``min_idle``."""
    if not isinstance(report, dict) or report["busy"] or young(report):
        return False
    return bool(report["idle_for"] >= min_idle)


def plan_reclaim(
    reports: Sequence[tuple[str, Mapping[str, Any]]], min_idle: float, need: int
) -> ReclaimPlan:
    """Given the activity ``reports`` of the live agents not already being reclaimed
    or watched, and ``need`` binds waiting without a hibernation on the way: hibernate
    up to ``need`` takeable agents, the longest idle first, and watch every busy or
    just-bound one (its ``until_idle`` answers when it finishes)."""
    idle: list[tuple[float, str]] = []
    probe: list[str] = []
    for name, report in reports:
        if takeable(report, min_idle):
            idle.append((report["idle_for"], name))
        elif report["busy"] or young(report):
            probe.append(name)
    victims = [name for _, name in sorted(idle, reverse=True)[: max(0, need)]]
    return ReclaimPlan(tuple(victims), tuple(probe))


class CpuMeter:
    """Idle cores of this node, from /proc/stat deltas (Linux; elsewhere the node always
    looks idle). Sampled by the pool loop only while the pool is short of spares; its
    reading enters :class:`PoolContext` as ``calm``."""

    def __init__(self) -> None:
        self.ncpu = os.cpu_count() or 1
        self._prev: tuple[int, int] | None = None
        self._prev_at = 0.0
        self.idle_cores: float | None = None
        self.at = 0.0

    def sample(self) -> None:
        """Take a sample; the idle cores since the previous one become current."""
        now = time.monotonic()
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:9]]
        except (OSError, ValueError):
            self.idle_cores, self.at = float(self.ncpu), now
            return
        idle, total = fields[3] + fields[4], sum(fields)
        # A delta over a long quiet spell says nothing about now: start over.
        if self._prev is not None and now - self._prev_at < 2.0 and total > self._prev[1]:
            share = (idle - self._prev[0]) / (total - self._prev[1])
            self.idle_cores, self.at = share * self.ncpu, now
        self._prev, self._prev_at = (idle, total), now

    def calm(self) -> bool:
        """About a core idle (half the node's on a one-core node) in a recent sample."""
        return node_calm(self.idle_cores, time.monotonic() - self.at, self.ncpu)


def node_calm(idle_cores: float | None, age: float, ncpu: int) -> bool:
    """Whether a CPU reading ``age`` seconds old shows about a core idle (half the
    node's on a one-core node); no reading, or one older than a second, is not."""
    if idle_cores is None or age > 1.0:
        return False
    return idle_cores >= min(1.0, ncpu / 2)
