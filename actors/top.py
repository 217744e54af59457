"""``thinkray top``: the live view of a Ray cluster's namespaces, refreshed in the
terminal (``--json`` for scripts).

Every namespace directory shard is a named actor (``thinkray-directory-<namespace>``,
shard i ``.../<i>``) in the Ray namespace ``thinkray``, whichever process created it,
so the view lists the named actors of the cluster, asks each shard's
:meth:`~thinkray.actors.directory.Directory.top` at once (each shard asks its live
session actors' ``snapshot`` at once, with a short timeout) and shows, per namespace:
the pool (spares free, actors starting, binds waiting, the target), the live agents
with, per session with a run or a status, its state (idle/busy/retrying/error), the
run's duration and the tokens of its finished steps, and the recent errors (failed
binds and actor starts, actors that died, sessions whose last run failed).

Nothing is woken and nothing waits on a turn: a live actor too busy to answer within
the timeout is shown ``unreachable``.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

__all__ = [
    "DIRECTORY_PREFIX",
    "add_command",
    "find_directories",
    "gather",
    "render_json",
    "render_text",
    "run",
]

DIRECTORY_PREFIX = "thinkray-directory-"
"""What :func:`~thinkray.actors.directory.directory_name` puts before a namespace."""
DIRECTORY_TIMEOUT = 5.0
"""How long :func:`gather` waits for a directory shard's answer (it waits at most
``snapshot_timeout`` on its actors)."""
CLEAR = "\033[H\033[2J"
"""ANSI: cursor home, clear the screen."""
MESSAGE_WIDTH = 70
"""Characters of a status or error message shown in the table."""


def parse_directory_name(actor_name: str) -> tuple[str, int] | None:
    """``(namespace, shard)`` of a directory actor's name, or None for another actor."""
    if not actor_name.startswith(DIRECTORY_PREFIX):
        return None
    rest = actor_name[len(DIRECTORY_PREFIX) :]
    namespace, sep, shard = rest.partition("/")
    if not namespace:
        return None
    if not sep:
        return namespace, 0
    return (namespace, int(shard)) if shard.isdigit() else None


def find_directories(namespace: str | None = None) -> list[tuple[str, int, str]]:
    """Every directory shard of the cluster (``namespace``: of that namespace only):
    ``(namespace, shard, actor name)``, sorted."""
    import ray
    from thinkray.actors.directory import RAY_NAMESPACE

    found = []
    for item in ray.util.list_named_actors(all_namespaces=True):
        if not isinstance(item, dict) or item.get("namespace") != RAY_NAMESPACE:
            continue
        parsed = parse_directory_name(str(item.get("name", "")))
        if parsed is None or (namespace is not None and parsed[0] != namespace):
            continue
        found.append((parsed[0], parsed[1], str(item["name"])))
    return sorted(found)


def gather(
    namespace: str | None = None,
    snapshot_timeout: float | None = None,
    directory_timeout: float = DIRECTORY_TIMEOUT,
) -> dict[str, Any]:
    """The live view as one JSON-ready document: ``at`` (epoch seconds) and
    ``namespaces``, one per namespace (sorted), each with its ``shards`` (how many
    answered, of ``shards_total``), ``pool`` (summed over the shards), ``live``, its
    ``agents`` (each one's snapshot, with its ``shard``), ``recent_errors`` (newest
    first) and ``unreachable_shards`` (a shard that did not answer, with why)."""
    import ray
    from thinkray.actors.directory import RAY_NAMESPACE, SNAPSHOT_TIMEOUT

    timeout = SNAPSHOT_TIMEOUT if snapshot_timeout is None else snapshot_timeout
    shards = find_directories(namespace)
    asked: list[tuple[str, int, Any]] = []
    failed: list[tuple[str, int, str]] = []
    for ns, shard, actor_name in shards:
        try:
            handle = ray.get_actor(actor_name, namespace=RAY_NAMESPACE)
            asked.append((ns, shard, handle.top.remote(timeout)))
        except Exception as exc:  # gone since the listing
            failed.append((ns, shard, f"{type(exc).__name__}: {exc}"))
    refs = [ref for _, _, ref in asked]
    ready: set[Any] = set()
    if refs:
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=directory_timeout + timeout)
        ready = set(done)
    by_ns: dict[str, dict[str, Any]] = {}

    def entry(ns: str) -> dict[str, Any]:
        return by_ns.setdefault(
            ns,
            {
                "namespace": ns,
                "shards": 0,
                "shards_total": 0,
                "storage_root": None,
                "pool": {"free": 0, "starting": 0, "waiting": 0, "target": 0, "max_live": 0},
                "live": 0,
                "agents": [],
                "recent_errors": [],
                "unreachable_shards": [],
            },
        )

    for ns, shard, ref in asked:
        out = entry(ns)
        out["shards_total"] += 1
        if ref not in ready:
            out["unreachable_shards"].append({"shard": shard, "reason": "timeout"})
            continue
        try:
            report = ray.get(ref)
        except Exception as exc:  # dead, or a directory without top (an older version)
            reason = f"{type(exc).__name__}: {str(exc)[:200]}"
            out["unreachable_shards"].append({"shard": shard, "reason": reason})
            continue
        out["shards"] += 1
        out["storage_root"] = out["storage_root"] or report.get("storage_root")
        for key, value in report.get("pool", {}).items():
            if isinstance(value, int | float):
                out["pool"][key] = out["pool"].get(key, 0) + value
        out["live"] += int(report.get("live", 0))
        for agent in report.get("agents", ()):
            out["agents"].append({**agent, "shard": shard})
        for error in report.get("recent_errors", ()):
            out["recent_errors"].append({**error, "shard": shard})
    for ns, shard, reason in failed:
        out = entry(ns)
        out["shards_total"] += 1
        out["unreachable_shards"].append({"shard": shard, "reason": reason[:200]})
    for out in by_ns.values():
        out["agents"].sort(key=lambda a: str(a.get("agent")))
        # Newest first; a session's error status (no time) after the timed ones.
        out["recent_errors"].sort(key=lambda e: -(e.get("at") or 0.0))
    return {"at": time.time(), "namespaces": [by_ns[ns] for ns in sorted(by_ns)]}


def render_json(doc: dict[str, Any]) -> str:
    """The document as one line of JSON."""
    return json.dumps(doc, separators=(",", ":"), default=str)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _short(text: Any, width: int = MESSAGE_WIDTH) -> str:
    if text is None:
        return ""
    one_line = " ".join(str(text).split())
    return one_line if len(one_line) <= width else one_line[: width - 1] + "…"


def _table(headers: Sequence[str], rows: list[list[str]], out: TextIO) -> None:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    out.write("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip() + "\n")
    for row in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")


def agent_rows(doc: dict[str, Any]) -> list[list[str]]:
    """The table's rows: namespace, agent, session, state, run duration, tokens this
    turn, message (one row per session with a run or a status; an agent without one
    reads idle)."""
    rows: list[list[str]] = []
    for ns in doc.get("namespaces", ()):
        for agent in ns.get("agents", ()):
            name = str(agent.get("agent"))
            if agent.get("unreachable"):
                reason = agent.get("reason") or ""
                rows.append([ns["namespace"], name, "-", "unreachable", "-", "-", reason])
                continue
            sessions = agent.get("sessions") or []
            if not sessions:
                state = "gone" if agent.get("gone") else "idle"
                rows.append([ns["namespace"], name, "-", state, "-", "-", ""])
                continue
            for row in sessions:
                tokens = row.get("tokens")
                message = row.get("message") or ""
                if row.get("attempt"):
                    message = f"attempt {row['attempt']}: {message}"
                rows.append(
                    [
                        ns["namespace"],
                        name,
                        str(row.get("session_id")),
                        str(row.get("state")),
                        _duration(row.get("duration_s")),
                        "-" if tokens is None else f"{tokens:,}",
                        _short(message),
                    ]
                )
    return rows


def render_text(doc: dict[str, Any]) -> str:
    """The document as the terminal view: a header line, the namespaces' pools, the
    agents' table and the recent errors."""
    out = io.StringIO()
    namespaces = doc.get("namespaces", [])
    live = sum(int(ns.get("live", 0)) for ns in namespaces)
    stamp = time.strftime("%H:%M:%S", time.localtime(doc.get("at") or time.time()))
    out.write(f"thinkray top  {stamp}  {len(namespaces)} namespaces, {live} live agents\n\n")
    if not namespaces:
        out.write("no namespace directory found in this Ray cluster\n")
        return out.getvalue()
    pools = []
    for ns in namespaces:
        pool = ns.get("pool", {})
        shards = f"{ns.get('shards', 0)}/{ns.get('shards_total', 0)}"
        pools.append(
            [
                ns["namespace"],
                shards,
                f"{ns.get('live', 0)}/{pool.get('max_live', 0)}",
                str(pool.get("free", 0)),
                str(pool.get("starting", 0)),
                str(pool.get("waiting", 0)),
                str(pool.get("target", 0)),
            ]
        )
    _table(["NAMESPACE", "SHARDS", "LIVE/MAX", "POOL", "STARTING", "WAITING", "TARGET"], pools, out)
    out.write("\n")
    rows = agent_rows(doc)
    if rows:
        headers = ["NAMESPACE", "AGENT", "SESSION", "STATE", "RUN", "TOKENS", "MESSAGE"]
        _table(headers, rows, out)
    else:
        out.write("no live agents\n")
    errors = [(ns["namespace"], e) for ns in namespaces for e in ns.get("recent_errors", ())]
    unreachable = [(ns["namespace"], u) for ns in namespaces for u in ns["unreachable_shards"]]
    if errors or unreachable:
        out.write("\nrecent errors\n")
        for ns_name, u in unreachable:
            out.write(f"  {ns_name} shard {u['shard']}: directory unreachable ({u['reason']})\n")
        for ns_name, e in errors[:20]:
            when = time.strftime("%H:%M:%S", time.localtime(e["at"])) if e.get("at") else "now"
            who = e.get("agent") or "pool"
            if e.get("session_id"):
                who = f"{who} session {e['session_id']}"
            message = _short(e.get("message"), 100)
            out.write(f"  {when}  {ns_name}  {who}  {e.get('kind')}: {message}\n")
    return out.getvalue()


def _connect(address: str) -> bool:
    """Join the Ray cluster at ``address``; False when this process already was in one."""
    import ray

    if ray.is_initialized():
        return False
    ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    return True


def run(args: argparse.Namespace) -> int:
    """``thinkray top``: ``--json`` prints one document and exits, ``--once`` renders
    the table once; otherwise it redraws every ``--interval`` seconds until Ctrl-C.
    Returns the exit code (1 when no Ray cluster answers at ``--address``)."""
    import ray

    if args.interval <= 0:
        print("thinkray top: --interval must be positive", file=sys.stderr)
        return 2
    try:
        joined = _connect(args.address)
    except Exception as exc:
        print(f"thinkray top: no Ray cluster at {args.address!r}: {exc}", file=sys.stderr)
        return 1
    try:
        if args.json:
            sys.stdout.write(render_json(gather(args.namespace, args.timeout)) + "\n")
            return 0
        if args.once:
            sys.stdout.write(render_text(gather(args.namespace, args.timeout)))
            return 0
        tty = sys.stdout.isatty()
        try:
            while True:
                text = render_text(gather(args.namespace, args.timeout))
                sys.stdout.write((CLEAR if tty else "") + text + ("" if tty else "\n"))
                sys.stdout.flush()
                time.sleep(args.interval)
        except KeyboardInterrupt:
            return 0
    finally:
        if joined:
            ray.shutdown()


def add_command(sub: Any) -> None:
    """Add ``top`` to the ``thinkray`` subparsers ``sub``."""
    p = sub.add_parser("top", help="live agents, their runs, pools and errors, refreshed")
    p.add_argument(
        "--address",
        default=os.environ.get("RAY_ADDRESS") or "auto",
        help="the Ray cluster (default: $RAY_ADDRESS, else auto: the running local one)",
    )
    p.add_argument("--namespace", help="one namespace (default: every one)")
    p.add_argument("--json", action="store_true", help="print one JSON document and exit")
    p.add_argument("--once", action="store_true", help="print the table once and exit")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (2)")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds to wait for a live actor's answer before it reads unreachable (2)",
    )
    p.set_defaults(func=run)
