"""``thinkray sessions ls|show|export|rm|compact`` and ``thinkray stats``: the fleet
from its index (:mod:`thinkray.storage.fleet_index`), without waking any agent.

Every command takes ``--root`` (default ``$THINKRAY_STORAGE_ROOT``), ``--namespace``
(default: every namespace under the root) and ``--json`` (for scripts; tables
otherwise). ``stats --deep`` reads the hibernated files themselves through read-only
DuckDB connections, with a progress bar on stderr, and skips live agents (a file
another process holds). ``rm`` refuses a live agent and removes all that is an
agent's (sub-agents, shared workspace, alarm) before releasing its owner.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from thinkray.actors.progress import Progress
from thinkray.storage import fleet_index as fi
from thinkray.storage.layout import list_names, session_path
from thinkray.storage.objectstore import is_uri
from thinkray.storage.removal import AgentInUseError, agent_exists, remove_agent


class CommandError(Exception):
    """A refusal or a bad argument: printed to stderr, exit code 1."""


# -- formatting ----------------------------------------------------------------------


def _size(n: int | None) -> str:
    value = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(n)


def _when(t: float | None) -> str:
    if not t:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def _cost(c: float | None) -> str:
    return "-" if c is None else f"${c:.4f}"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], out: Any = None) -> None:
    """Print ``rows`` under ``headers`` as aligned columns (numbers right-aligned)."""
    cells = [["" if c is None else str(c) for c in r] for r in rows]
    columns = [[r[i] for r in cells] for i in range(len(headers))]
    table_columns(headers, columns, out)


_CHUNK = 4096
"""Lines (or JSON rows) written at once."""


def table_columns(headers: Sequence[str], columns: Sequence[list[str]], out: Any = None) -> None:
    """:func:`table` of the cells given column by column (strings, all as long): a
    column is numeric when each of its distinct cells is; lines are written in chunks."""
    out = out or sys.stdout
    count = len(columns[0]) if columns else 0
    numeric = [count > 0 and all(map(_numeric, set(col))) for col in columns]
    widths = [
        max(len(str(h)), max(map(len, col), default=0))
        for h, col in zip(headers, columns, strict=True)
    ]
    out.write(
        "  ".join(str(h).ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip() + "\n"
    )
    out.write("  ".join("-" * w for w in widths) + "\n")
    for start in range(0, count, _CHUNK):
        padded = [
            [c.rjust(w) if num else c.ljust(w) for c in col[start : start + _CHUNK]]
            for col, w, num in zip(columns, widths, numeric, strict=True)
        ]
        lines = zip(*padded, strict=True)
        out.write("".join("  ".join(cells).rstrip() + "\n" for cells in lines))


def _numeric(s: str) -> bool:
    s = s.replace(",", "").replace("$", "").split(" ")[0]
    try:
        float(s)
    except ValueError:
        return s == "-"
    return True


def _emit_json(value: Any) -> None:
    # json.dumps, not json.dump: dump streams through the pure-Python encoder.
    sys.stdout.write(json.dumps(value, indent=None, separators=(",", ":")) + "\n")


def _emit_json_rows(texts: Iterable[str]) -> None:
    """A JSON list of rows already encoded (compact), written in chunks: the same text
    as :func:`_emit_json` of the decoded rows."""
    out = sys.stdout
    out.write("[")
    chunk: list[str] = []
    first = True
    for text in texts:
        chunk.append(text)
        if len(chunk) >= _CHUNK:
            out.write(("" if first else ",") + ",".join(chunk))
            first, chunk = False, []
    if chunk:
        out.write(("" if first else ",") + ",".join(chunk))
    out.write("]\n")


# -- shared --------------------------------------------------------------------------


def _root(args: argparse.Namespace, *, local_only: str = "") -> Path | str:
    """The storage root: a local folder, or an object-store URI as given (its index
    lives in the store). ``local_only`` names a command that reads the agents' files
    directly, refused under a URI root."""
    root = args.root or os.environ.get("THINKRAY_STORAGE_ROOT")
    if not root:
        raise CommandError("no storage root: pass --root or set THINKRAY_STORAGE_ROOT")
    if is_uri(root):
        if local_only:
            raise CommandError(
                f"{local_only} reads the agents' files on a local storage root; {root!r} is "
                "an object store (its index answers sessions ls/show/compact and stats)"
            )
        return str(root)
    if not Path(root).is_dir():
        raise CommandError(f"storage root {root!r} is not a directory")
    return Path(root)


def _namespaces(args: argparse.Namespace, root: Path | str) -> list[str]:
    if args.namespace:
        return [args.namespace]
    return fi.namespaces(root)


def index_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every indexed row of the chosen namespaces (compacting an index whose row files
    have piled up, unless ``--no-compact``)."""
    root = _root(args)
    out: list[dict[str, Any]] = []
    for ns in _namespaces(args, root):
        index = fi.FleetIndex(root, ns)
        if not args.no_compact and index.pending() > fi.COMPACT_AFTER:
            with contextlib.suppress(OSError):
                index.compact()
        for row in index.rows().values():
            row.setdefault("namespace", ns)
            out.append(row)
    return out


def index_table(args: argparse.Namespace, columns: Sequence[str] | None = None) -> Any:
    """:func:`index_rows` as one Arrow table (:func:`fi.snapshot_schema`, only ``columns``
    and the merge's own when given) with ``pos``, the row's place in that list."""
    import pyarrow as pa  # type: ignore[import-untyped]

    root = _root(args)
    tables = []
    for ns in _namespaces(args, root):
        index = fi.FleetIndex(root, ns)
        if not args.no_compact and index.pending() > fi.COMPACT_AFTER:
            with contextlib.suppress(OSError):
                index.compact()
        tables.append(index.table(columns))
    if not tables:
        tables.append(fi.rows_table([], "", columns))
    merged = pa.concat_tables([t.cast(tables[0].schema) for t in tables])
    return merged.append_column("pos", pa.array(range(merged.num_rows), type=pa.int64()))


def _find(
    args: argparse.Namespace, name: str, local_only: str = ""
) -> tuple[Path | str, str, dict[str, Any] | None]:
    """(root, namespace, index row or None) of agent ``name``: in ``--namespace``, else
    the one namespace holding it (an error when none or several do)."""
    root = _root(args, local_only=local_only)
    found = []
    for ns in _namespaces(args, root):
        row = fi.FleetIndex(root, ns).get(name)
        # The owner too: a removal that crashed after the file and the row went
        # leaves the owner held, and a re-run must find the agent to finish.
        if row is not None or agent_exists(root, ns, name):
            found.append((ns, row))
    if not found:
        raise CommandError(f"no agent {name!r} under {root}")
    if len(found) > 1:
        spaces = ", ".join(ns for ns, _ in found)
        raise CommandError(f"agent {name!r} is in several namespaces ({spaces}): pass --namespace")
    return root, found[0][0], found[0][1]


def _tokens(row: dict[str, Any]) -> int:
    return sum(fi._tokens(k) for k in (row.get("models") or {}).values())


# -- sessions ------------------------------------------------------------------------

_SORTS: dict[str, tuple[tuple[str, ...], str]] = {
    # the index table's columns, and the order; ties keep the listing's order (``pos``)
    "name": (("namespace", "name"), "ascending"),
    "bytes": (("bytes",), "descending"),
    "messages": (("messages",), "descending"),
    "last_active": (("last_active",), "descending"),  # none: as 0
    "tokens": (("tokens",), "descending"),
}
_LS_COLUMNS = ("namespace", "owner", "sessions", "messages", "bytes", "tokens", "last_active")


def _cached(func: Any) -> Any:
    """``func`` of one argument, computed once per distinct value (sizes, minutes)."""
    memo: dict[Any, Any] = {}

    def get(value: Any) -> Any:
        out = memo.get(value)
        if out is None:
            out = memo[value] = func(value)
        return out

    return get


def _ls_order(args: argparse.Namespace, table: Any) -> list[int]:
    """Row numbers of ``table`` in ``ls``'s order: ``--owner``, ``--sort`` (stable over
    the index's order), ``--limit``."""
    import pyarrow as pa
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    keys = {"pos": table["pos"]}
    columns, order = _SORTS[args.sort]
    for c in columns:
        keys[c] = table[c].fill_null(0.0) if c == "last_active" else table[c]
    sort_keys = [*((c, order) for c in columns), ("pos", "ascending")]
    keyed = pa.table(keys)
    if args.owner:
        keyed = keyed.filter(pc.equal(table["owner"], args.owner).fill_null(False))
    ranked = pc.sort_indices(keyed, sort_keys=sort_keys)
    picked: list[int] = keyed["pos"].take(ranked).to_pylist()
    return picked if args.limit is None else picked[: args.limit]


def sessions_ls(args: argparse.Namespace) -> int:
    """``thinkray sessions ls``: one line per indexed agent (sorted, filtered and cut by
    columnar operations on the index; the lines written as they are formatted)."""
    import pyarrow as pa

    table = index_table(args, (*_LS_COLUMNS, "row") if args.json else _LS_COLUMNS)
    order = _ls_order(args, table)
    if args.json:

        def texts() -> Iterable[str]:
            for start in range(0, len(order), _CHUNK):
                yield from table["row"].take(order[start : start + _CHUNK]).to_pylist()

        _emit_json_rows(texts())
        return 0
    picked = table.select(["name", *_LS_COLUMNS]).take(pa.array(order, type=pa.int64()))
    size = _cached(_size)
    minute = _cached(lambda m: time.strftime("%Y-%m-%d %H:%M", time.localtime(m * 60)))
    table_columns(
        ("namespace", "name", "owner", "sessions", "messages", "size", "tokens", "last active"),
        [
            picked["namespace"].to_pylist(),
            picked["name"].to_pylist(),
            [o or "-" for o in picked["owner"].to_pylist()],
            list(map(str, picked["sessions"].to_pylist())),
            list(map(str, picked["messages"].to_pylist())),
            list(map(size, picked["bytes"].to_pylist())),
            [f"{t:,}" for t in picked["tokens"].to_pylist()],
            ["-" if not t else minute(int(t) // 60) for t in picked["last_active"].to_pylist()],
        ],
    )
    return 0


def sessions_show(args: argparse.Namespace) -> int:
    """``thinkray sessions show NAME``: the agent's index row (and whether it is live)."""
    root, ns, row = _find(args, args.name)
    path = session_path(root, ns, args.name)
    prices = fi.load_prices(args.prices)
    detail = dict(row or {"name": args.name, "namespace": ns, "indexed": False})
    detail["file"] = str(path)
    detail["exists"] = path.exists()
    detail["live"] = fi.is_locked(path)
    for model, kinds in (detail.get("models") or {}).items():
        kinds["cost_usd"] = fi.cost_of(model, kinds, prices)
    if args.json:
        _emit_json(detail)
        return 0
    for key in ("namespace", "name", "owner", "file", "live", "sessions", "messages"):
        print(f"{key:>12}: {detail.get(key, '-')}")
    print(f"{'size':>12}: {_size(detail.get('bytes'))}")
    print(f"{'created':>12}: {_when(detail.get('created_at'))}")
    print(f"{'last active':>12}: {_when(detail.get('last_active'))}")
    print(f"{'indexed':>12}: {_when(detail.get('written_at'))}")
    models = detail.get("models") or {}
    if models:
        print()
        table(
            ("model", *fi.KINDS, "cost"),
            (
                (m, *(k.get(x, 0) for x in fi.KINDS), _cost(k.get("cost_usd")))
                for m, k in models.items()
            ),
        )
    return 0


def sessions_export(args: argparse.Namespace) -> int:
    """``thinkray sessions export NAME``: every session of a hibernated agent with its
    history, as JSON (read from a copy of the file: the agent is neither woken nor
    touched). Refuses a live agent."""
    from thinkray.storage.journal import journal_path
    from thinkray.storage.session_store import DuckDBSessionStore

    root, ns, row = _find(args, args.name, local_only="sessions export")
    path = session_path(root, ns, args.name)
    if not path.exists():
        raise CommandError(f"agent {args.name!r} has no file ({path})")
    if fi.is_locked(path):
        raise CommandError(f"agent {args.name!r} is live: hibernate it first")
    with tempfile.TemporaryDirectory(prefix="thinkray-export-") as scratch:
        copy = Path(scratch) / path.name
        shutil.copyfile(path, copy)
        # What a crash left unfolded comes along (the copy's open replays it).
        journal = journal_path(path)
        if journal.exists():
            shutil.copyfile(journal, journal_path(copy))
        with DuckDBSessionStore(copy) as store:
            sessions = []
            for info in store.list_sessions(include_ephemeral=True):
                item = info.to_dict()
                item["messages"] = store.get_history(info.id)
                sessions.append(item)
    doc = {"namespace": ns, "name": args.name, "index": row, "sessions": sessions}
    text = json.dumps(doc, indent=2 if args.output else None, default=str)
    if args.output and args.output != "-":
        Path(args.output).write_text(text + "\n", encoding="utf-8")
        print(f"exported {len(sessions)} session(s) of {args.name!r} to {args.output}")
    else:
        sys.stdout.write(text + "\n")
    return 0


def sessions_rm(args: argparse.Namespace) -> int:
    """``thinkray sessions rm NAME``: delete a hibernated agent with everything that is
    its (its file, sub-agents, shared workspace, alarm file, index row; see
    :mod:`thinkray.storage.removal`), then release its owner. Refuses a live agent;
    after a crash midway, running it again finishes the job."""
    root, ns, _row = _find(args, args.name)
    try:
        done = remove_agent(root, ns, args.name)
    except AgentInUseError as exc:
        raise CommandError(str(exc)) from exc
    owner = done.owner_released
    result = {
        "namespace": ns,
        "name": args.name,
        "removed": done.removed,
        "agents": done.agents,
        "owner_released": owner,
    }
    if args.json:
        _emit_json(result)
    else:
        subs = len(done.agents) - 1
        print(
            f"removed {ns}/{args.name} ({len(done.removed)} file(s), {subs} sub-agent(s), "
            f"index row, owner {owner or '-'})"
        )
    return 0


def sessions_compact(args: argparse.Namespace) -> int:
    """``thinkray sessions compact``: fold the index's row files into its snapshot."""
    root = _root(args)
    out = {}
    for ns in _namespaces(args, root):
        out[ns] = fi.FleetIndex(root, ns).compact()
    if args.json:
        _emit_json(out)
    else:
        for ns, n in out.items():
            print(f"{ns}: {'busy (another compaction)' if n is None else f'{n} row(s) folded'}")
    return 0


# -- stats ---------------------------------------------------------------------------


def deep_rows(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows read from every hibernated file (read-only), and the live ones skipped."""
    root = _root(args, local_only="stats --deep")
    files = [(ns, n) for ns in _namespaces(args, root) for n in list_names(root, ns)]
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    with Progress(len(files), "scanning", enabled=not args.quiet) as progress:
        for ns, name in files:
            try:
                rows.append(fi.scan_file(session_path(root, ns, name)))
            except fi.AgentLiveError:
                skipped.append(f"{ns}/{name}")
            except Exception as exc:  # a damaged or foreign file: say so, go on
                print(f"\nskipped {ns}/{name}: {exc}", file=sys.stderr)
                skipped.append(f"{ns}/{name}")
            progress.step()
    if args.reindex:
        by_ns: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            by_ns.setdefault(row["namespace"], []).append(row)
        for ns, ns_rows in by_ns.items():
            fi.FleetIndex(root, ns).put_snapshot(ns_rows)
    return rows, skipped


def stats(args: argparse.Namespace) -> int:
    """``thinkray stats``: usage by model and by day, the biggest agents, idle ones."""
    prices = fi.load_prices(args.prices)
    skipped: list[str] = []
    if args.deep:
        rows, skipped = deep_rows(args)
        rows_of = fi.rows_table(rows, "", fi.STATS_COLUMNS)
    else:
        rows_of = index_table(args, fi.STATS_COLUMNS)
    result = fi.fleet_stats_table(rows_of, prices=prices, top=args.top, idle_days=args.idle_days)
    if args.days is not None:
        days = sorted({d["day"] for d in result["by_day"]})[-args.days :]
        result["by_day"] = [d for d in result["by_day"] if d["day"] in days]
    result["source"] = "files" if args.deep else "index"
    if args.deep:
        result["skipped_live"] = skipped
    if args.json:
        _emit_json(result)
        return 0
    print(
        f"{result['agents']:,} agents, {result['sessions']:,} sessions, "
        f"{result['messages']:,} messages, {_size(result['bytes'])} on disk "
        f"(from the {result['source']})"
    )
    if args.deep and skipped:
        print(f"skipped {len(skipped)} live agent(s): {', '.join(skipped[:10])}")
    if not prices:
        print("no price table (THINKRAY_PRICES or --prices): costs only where providers reported")

    def usage_cells(u: dict[str, Any]) -> tuple[Any, ...]:
        return (*(f"{u[k]:,}" for k in fi.KINDS), f"{u['tokens']:,}", _cost(u["cost_usd"]))

    print("\nusage by model")
    table(
        ("model", *fi.KINDS, "tokens", "cost"),
        ((u["model"], *usage_cells(u)) for u in result["by_model"]),
    )
    print("\nusage by day")
    table(
        ("day", "model", *fi.KINDS, "tokens", "cost"),
        ((u["day"], u["model"], *usage_cells(u)) for u in result["by_day"]),
    )
    print(f"\nbiggest agents (top {args.top})")
    table(("name", "size"), ((b["name"], _size(b["bytes"])) for b in result["biggest"]))
    print(f"\nidle for {args.idle_days:g}+ days: {result['idle_count']:,} agent(s)")
    table(("name", "last active"), ((i["name"], _when(i["last_active"])) for i in result["idle"]))
    return 0


# -- wiring --------------------------------------------------------------------------


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", help="storage root (default: $THINKRAY_STORAGE_ROOT)")
    p.add_argument("--namespace", help="one namespace (default: every one under the root)")
    p.add_argument("--json", action="store_true", help="JSON for scripts instead of tables")
    p.add_argument(
        "--no-compact", action="store_true", help="never compact the index while reading it"
    )


def _guarded(func: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return int(func(args) or 0)
        except (CommandError, ValueError) as exc:
            print(f"thinkray {args.command}: {exc}", file=sys.stderr)
            return 1

    return run


def add_commands(sub: Any) -> None:
    """Add ``sessions`` and ``stats`` to the ``thinkray`` subparsers ``sub``."""
    p_sessions = sub.add_parser("sessions", help="the fleet's agents, from the index")
    ssub = p_sessions.add_subparsers(dest="sessions_command", required=True)
    p_ls = ssub.add_parser("ls", help="list agents (no agent is woken)")
    _common(p_ls)
    p_ls.add_argument("--owner", help="only agents this principal owns")
    p_ls.add_argument("--sort", choices=sorted(_SORTS), default="last_active")
    p_ls.add_argument("--limit", type=int, help="at most this many lines")
    p_ls.set_defaults(func=_guarded(sessions_ls))
    p_show = ssub.add_parser("show", help="one agent's index row")
    _common(p_show)
    p_show.add_argument("name")
    p_show.add_argument("--prices", help="price table JSON (default: $THINKRAY_PRICES)")
    p_show.set_defaults(func=_guarded(sessions_show))
    p_export = ssub.add_parser("export", help="a hibernated agent's sessions and histories, JSON")
    _common(p_export)
    p_export.add_argument("name")
    p_export.add_argument("-o", "--output", help="file to write (default: stdout)")
    p_export.set_defaults(func=_guarded(sessions_export))
    p_rm = ssub.add_parser(
        "rm", help="delete a hibernated agent and all that is its, then its owner"
    )
    _common(p_rm)
    p_rm.add_argument("name")
    p_rm.set_defaults(func=_guarded(sessions_rm))
    p_compact = ssub.add_parser("compact", help="fold the index's row files into its snapshot")
    _common(p_compact)
    p_compact.set_defaults(func=_guarded(sessions_compact))
    p_stats = sub.add_parser("stats", help="usage by model and day, biggest and idle agents")
    _common(p_stats)
    p_stats.add_argument(
        "--deep", action="store_true", help="read the hibernated files (read-only)"
    )
    p_stats.add_argument(
        "--reindex", action="store_true", help="with --deep: write the rows read into the index"
    )
    p_stats.add_argument("--quiet", action="store_true", help="no progress bar")
    p_stats.add_argument("--top", type=int, default=10, help="biggest/idle agents shown (10)")
    p_stats.add_argument("--idle-days", type=float, default=30.0, help="idle threshold (30)")
    p_stats.add_argument("--days", type=int, help="only the last N days of usage")
    p_stats.add_argument("--prices", help="price table JSON (default: $THINKRAY_PRICES)")
    p_stats.set_defaults(func=_guarded(stats))
