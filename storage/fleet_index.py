"""The fleet index: one row per agent of a namespace, readable without waking anyone.

A row says what an agent is without opening its database: ``name``, ``owner`` (the
ingress's owner file, :mod:`thinkray.storage.owners`), ``sessions``, ``messages``
(visible ones), ``bytes`` on disk (the ``.duckdb`` file plus any ``.wal`` and ``.journal``),
``created_at``, ``last_active`` (the newest session update), token rollups by model and
kind (``models``: ``{model: {input, output, reasoning, cache_read, cache_write,
cost_usd}}``) and the same by day (``days``: ``{"YYYY-MM-DD": {model: {...}}}``).
The session actor writes its agent's row at every hibernation and, for an agent that
stays live, from its idle watcher at most once per :data:`REFRESH_SECONDS`.

Layout (beside the agents' files, ``root/<namespace>/.index/``)::

    rows/<name>.json       one small file per agent, replaced whole (tmp + rename)
    merging/<name>.json    rows a compaction has taken and not yet folded in
    snapshot.parquet       every row, as of the last compaction (tmp + rename)
    compact.lock           held (fcntl) by the one compaction running

Why files and not a table: every session actor, on every node, writes rows at once,
and a DuckDB file has one writer. A writer only ever replaces its own agent's row file
with an atomic rename, so writers never wait for each other or a lock, and a reader
sees each row whole, old or new. Readers merge the three layers, newest first
(``rows`` > ``merging`` > ``snapshot``; between the last two the later ``written_at``).
A compaction (the CLI runs one when ``rows/`` has grown, or ``thinkray sessions
compact``) renames each row file into ``merging/`` (a row written meanwhile lands in
``rows/`` again and stays newer), folds them into a new snapshot, renames it in, then
deletes the merged files: a crash at any step loses nothing (the next compaction or
reader picks up what ``merging/`` holds). Deletion (``thinkray sessions rm``) writes a
tombstone row that compaction drops.

Tokens by day: the row's ``days`` are built from deltas. At each write the agent's own
file keeps the totals it last reported (config key :data:`REPORTED_KEY`); what grew
since is added to today's bucket (UTC). Usage is attributed to the day it was indexed
(the hibernation, or the live refresh, at most ``REFRESH_SECONDS`` late), and each
answer's tokens to the model that produced it (its ``metadata.model``; what a session's
rollup holds beyond its answers counts under the session's current model), so a
session that switches model keeps the earlier model's tokens where they were. ``days`` keep the last
:data:`KEEP_DAYS` days.

Cost: the project has no price table. A row keeps the tokens by model and kind, and
``cost_usd`` only when a provider reported one; :func:`cost_of` prices tokens when a
table is configured (``THINKRAY_PRICES`` or ``--prices``: a JSON file ``{model:
{input, output, reasoning, cache_read, cache_write}}`` in USD per million tokens).

The snapshot is columnar (Parquet, zstd; :func:`snapshot_schema`): the numbers ``ls``
sorts and ``stats`` adds up are columns, usage by model and by day are list-of-struct
columns (aggregated by :func:`fleet_stats_table` with ``pyarrow.compute``, no Python loop
over agents), and ``row`` keeps each row's compact JSON, so ``ls --json`` writes the
stored text without decoding a row. Readers take the layers as one Arrow table
(:meth:`FleetIndex.table`: snapshot, then the row files over it, in the order a dict
merge would give); only the row files, a few at most, are parsed in Python. A snapshot
left in the former msgpack format (``snapshot.msgpack``) is still read, and replaced
by the next compaction.

Costs at 100,000 agents (see ``tests/bench/bench_fleet.py`` for measured figures): a
row is ~0.4 KB of JSON, the snapshot a few MB compressed (one read, ~0.1 s, for ``ls`` and
``stats``, which reads only the columns it needs); between compactions each re-indexed
agent adds one ~0.5 KB file, and a read opens each (~20 µs apiece), which is why the CLI
compacts beyond :data:`COMPACT_AFTER` of them; a write is one small file and a rename
(no fsync: a row lost to a power cut is rewritten at the agent's next hibernation, and
``stats --deep`` rebuilds any from the files themselves).

With an object-store root (``s3://bucket/prefix``, ``file:///path``; issue 13) the index
lives in the store, under ``<root>/<namespace>/.index/`` (:class:`ObjectStoreIndex`):
rows are small immutable objects (``rows/<name>/<stamp>-<token>.json``, each write a
new one, the newest stamp wins) since an object store has no rename, and the snapshot
is one object replaced whole; see that class for compaction.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import duckdb
from thinkray.storage.codec import pack, unpack
from thinkray.storage.journal import journal_path
from thinkray.storage.layout import FILE_SUFFIX, validate_name
from thinkray.storage.objectstore import (
    RootURI,
    delete_object,
    is_uri,
    list_folders,
    list_objects,
    put_object_if_absent,
    read_object,
    root_of_session_uri,
    write_object,
)
from thinkray.storage.owners import OwnerRegistry

log = logging.getLogger("thinkray.fleet_index")

INDEX_DIR = ".index"
ROWS_DIR = "rows"
MERGING_DIR = "merging"
SNAPSHOT = "snapshot.msgpack"
"""The row-wise (msgpack) snapshot: a local index's former format, read when no
:data:`SNAPSHOT_PARQUET` exists."""
SNAPSHOT_PARQUET = "snapshot.parquet"
LOCK = "compact.lock"
REPORTED_KEY = "fleet_index.reported"
REFRESH_SECONDS = float(os.environ.get("THINKRAY_INDEX_REFRESH", "300"))
"""A live agent's row is rewritten at most this often (seconds)."""
COMPACT_AFTER = 1000
"""The CLI compacts when ``rows/`` holds more row files than this."""
KEEP_DAYS = 90
KINDS = ("input", "output", "reasoning", "cache_read", "cache_write")
_ROLLUP_OF_KIND = {
    "input": "prompt_tokens",
    "output": "completion_tokens",
    "reasoning": "reasoning_tokens",
    "cache_read": "cache_read",
    "cache_write": "cache_write",
}
DEFAULT_MODEL = "default"
"""The model key of sessions whose row names no model (the agent's ``get_model()``)."""

Row = dict[str, Any]
FetchAll = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]

_counter = 0
_counter_lock = threading.Lock()
_last_refresh: dict[str, float] = {}


class AgentLiveError(Exception):
    """The agent's file is held by a live process (DuckDB's lock)."""


def index_dir(root: str | os.PathLike[str], namespace: str) -> Path:
    """``root/<namespace>/.index``."""
    return Path(root) / validate_name(namespace, "namespace") / INDEX_DIR


def today(now: float | None = None) -> str:
    """The UTC day of ``now`` as ``YYYY-MM-DD``."""
    return _dt.datetime.fromtimestamp(time.time() if now is None else now, _dt.UTC).strftime(
        "%Y-%m-%d"
    )


def _model_key(model: Any) -> str:
    if isinstance(model, dict):
        mid = model.get("model_id")
        if mid:
            provider = model.get("provider_id")
            return f"{provider}/{mid}" if provider else str(mid)
    return DEFAULT_MODEL


def _empty_kinds() -> dict[str, Any]:
    out: dict[str, Any] = dict.fromkeys(KINDS, 0)
    out["cost_usd"] = None
    return out


def _add_kinds(into: dict[str, Any], more: dict[str, Any], sign: int = 1) -> None:
    for kind in KINDS:
        into[kind] = into.get(kind, 0) + sign * int(more.get(kind) or 0)
    if more.get("cost_usd") is not None:
        into["cost_usd"] = (into.get("cost_usd") or 0.0) + sign * float(more["cost_usd"])


def summarize(fetchall: FetchAll) -> Row:
    """Sessions, visible messages, times and usage by model of one agent's database,
    through ``fetchall(sql, params)`` (a live store's or a read-only connection's)."""
    sessions = fetchall("SELECT id, created_at, updated_at, info FROM sessions", [])
    counts: dict[str, int] = dict(
        fetchall(
            "SELECT session_id, count(*) FROM messages WHERE hidden_at IS NULL GROUP BY session_id",
            [],
        )
    )
    models: dict[str, dict[str, Any]] = {}
    by_message = _message_usage(fetchall)
    created = last = None
    for sid, created_at, updated_at, blob in sessions:
        info = unpack(blob) if blob is not None else {}
        usage = info.get("usage") or {}
        kinds = {k: usage.get(_ROLLUP_OF_KIND[k], 0) for k in KINDS}
        kinds["cost_usd"] = usage.get("cost_usd")
        # Each answer's tokens count under the model that produced it; what the rollup
        # holds beyond them (a compaction's summarizer, messages since deleted) under
        # the session's current model.
        for model, used in by_message.get(sid, {}).items():
            _add_kinds(models.setdefault(model, _empty_kinds()), used)
            _add_kinds(kinds, used, sign=-1)
        rest: dict[str, Any] = {k: max(0, int(kinds[k] or 0)) for k in KINDS}
        cost = kinds["cost_usd"]
        rest["cost_usd"] = cost if cost is not None and cost > 1e-12 else None
        if any(rest[k] for k in KINDS) or rest["cost_usd"] is not None:
            _add_kinds(models.setdefault(_model_key(info.get("model")), _empty_kinds()), rest)
        created = created_at if created is None else min(created, created_at)
        last = updated_at if last is None else max(last, updated_at)
        counts.setdefault(sid, 0)
    return {
        "sessions": len(sessions),
        "messages": int(sum(counts.values())),
        "created_at": created,
        "last_active": last,
        "models": models,
    }


def _message_usage(fetchall: FetchAll) -> dict[str, dict[str, dict[str, Any]]]:
    """``{session: {model: kinds}}`` from the assistant messages that name both their
    ``metadata.usage`` and ``metadata.model`` (what the turn that wrote them used),
    hidden ones included: a rollup keeps the tokens of rewound turns too."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    rows = fetchall("SELECT session_id, envelope FROM messages WHERE role = 'assistant'", [])
    for sid, blob in rows:
        if blob is None or b"usage" not in blob:
            continue
        envelope = unpack(blob)
        meta = envelope.get("metadata") if isinstance(envelope, dict) else None
        if not isinstance(meta, dict):
            continue
        usage, model = meta.get("usage"), meta.get("model")
        if not isinstance(usage, dict) or not isinstance(model, dict) or not model.get("model_id"):
            continue
        try:
            kinds: dict[str, Any] = {k: max(0, int(usage.get(k) or 0)) for k in KINDS}
            cost = usage.get("cost_usd")
            kinds["cost_usd"] = float(cost) if cost is not None else None
        except (TypeError, ValueError):  # a hand-written metadata: left to the rollup
            continue
        into = out.setdefault(sid, {}).setdefault(_model_key(model), _empty_kinds())
        _add_kinds(into, kinds)
    return out


def _reported(fetchall: FetchAll) -> dict[str, Any]:
    rows = fetchall("SELECT value FROM config WHERE key = ?", [REPORTED_KEY])
    value = unpack(rows[0][0]) if rows else None
    return value if isinstance(value, dict) else {}


def _with_days(models: dict[str, Any], reported: dict[str, Any], now: float) -> dict[str, Any]:
    """The day buckets after adding what grew since ``reported["models"]`` to today."""
    days = {d: {m: dict(k) for m, k in v.items()} for d, v in (reported.get("days") or {}).items()}
    before = reported.get("models") or {}
    bucket = days.setdefault(today(now), {})
    for model, kinds in models.items():
        delta = dict(kinds)
        _add_kinds(delta, before.get(model) or {}, sign=-1)
        clean = {k: max(0, int(delta.get(k) or 0)) for k in KINDS}
        cost = delta.get("cost_usd")
        clean_cost = cost if cost is not None and cost > 0 else None
        if any(clean.values()) or clean_cost is not None:
            into = bucket.setdefault(model, _empty_kinds())
            _add_kinds(into, {**clean, "cost_usd": clean_cost})
    if not bucket:
        days.pop(today(now))
    for day in sorted(days)[:-KEEP_DAYS]:
        del days[day]
    return days


def _file_bytes(path: Path) -> int:
    total = 0
    for p in (path, path.with_name(path.name + ".wal"), journal_path(path)):
        with contextlib.suppress(OSError):
            total += p.stat().st_size
    return total


def _split(path: str | os.PathLike[str]) -> tuple[Path | str, str, str]:
    """``root/<namespace>/<name>.duckdb`` -> (root, namespace, name); the root of a
    session URI (``s3://bucket/prefix/ns/name.duckdb``) is the root's URI."""
    if is_uri(path):
        parts = RootURI.parse(str(path)).path.rsplit("/", 2)
        if len(parts) < 3 or not parts[2].endswith(FILE_SUFFIX):
            raise ValueError(f"not an agent file: {path}")
        namespace, name = parts[1], parts[2][: -len(FILE_SUFFIX)]
        return root_of_session_uri(str(path), namespace, name), namespace, name
    p = Path(path)
    if not p.name.endswith(FILE_SUFFIX):
        raise ValueError(f"not an agent file: {p}")
    return p.parent.parent, p.parent.name, p.name[: -len(FILE_SUFFIX)]


def agent_row(
    store: Any, path: str | os.PathLike[str], *, live: bool, now: float | None = None
) -> Row:
    """The index row of the agent whose open store is ``store`` (file ``path``), and
    the day buckets' bookkeeping saved in the store (:data:`REPORTED_KEY`)."""
    now = time.time() if now is None else now
    root, namespace, name = _split(path)
    fetchall = store.db.fetchall
    row = summarize(fetchall)
    reported = _reported(fetchall)
    days = _with_days(row["models"], reported, now)
    if row["models"] != reported.get("models") or days != reported.get("days"):
        store.set_config(REPORTED_KEY, {"models": row["models"], "days": days})
    if not live:
        # The hibernation's close checkpoints anyway: done now, the close has nothing
        # left to write. (A hibernation puts the row after the close, with the size the
        # file keeps once vacuumed: thinkray.storage.vacuum.)
        store.db.execute("CHECKPOINT")
    row.update(
        name=name,
        namespace=namespace,
        owner=OwnerRegistry(root).owner(namespace, name),
        # under an object-store root: the node-local copy being hibernated
        bytes=_file_bytes(Path(store.db.path if is_uri(path) else path)),
        days=days,
        live=live,
        written_at=now,
    )
    return row


def write_index_row(
    store: Any, path: str | os.PathLike[str] | None, *, live: bool = False, put: bool = True
) -> Row | None:
    """Compute and write the row of the agent at ``path`` (``root/ns/name.duckdb``)
    from its open ``store``. Never raises: a failure is logged and the agent's
    hibernation goes on (the row is rewritten next time, or by ``stats --deep``).
    Nothing is written for ``path`` None or a file outside a namespace folder. Under
    an object-store root ``path`` is the session's URI and the row goes to the
    store (:class:`ObjectStoreIndex`). ``put=False`` only computes the row: the
    caller puts it (:func:`put_index_row`) once the file it describes is committed,
    so a refused commit leaves the row of what the store holds."""
    if path is None:
        return None
    try:
        row = agent_row(store, path, live=live)
    except Exception as exc:
        log.warning("fleet index row of %s not written: %s", path, exc)
        return None
    if put and not put_index_row(path, row):
        return None
    return row


def put_index_row(path: str | os.PathLike[str], row: Row) -> bool:
    """Write ``row`` (from :func:`write_index_row`) to the index of ``path``'s
    namespace. Never raises: False (logged) when it could not."""
    try:
        root, namespace, _ = _split(path)
        FleetIndex(root, namespace).put(row)
        _last_refresh[str(path)] = time.monotonic()
        return True
    except Exception as exc:
        log.warning("fleet index row of %s not written: %s", path, exc)
        return False


def refresh_if_due(store: Any, path: str | os.PathLike[str], every: float | None = None) -> bool:
    """For a live agent: write its row if none was written by this process in the
    last ``every`` seconds (default :data:`REFRESH_SECONDS`). True when written."""
    every = REFRESH_SECONDS if every is None else every
    last = _last_refresh.get(str(path))
    now = time.monotonic()
    if last is None:
        _last_refresh[str(path)] = now  # the first tick only starts the clock
        return False
    if now - last < every:
        return False
    return write_index_row(store, path, live=True) is not None


def _tmp_name(final: Path) -> Path:
    global _counter
    with _counter_lock:
        _counter += 1
        n = _counter
    return final.with_name(f".{final.name}.{os.getpid()}.{threading.get_ident()}.{n}.tmp")


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = _tmp_name(path)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _read_json(path: Path) -> Row | None:
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None  # moved by a compaction meanwhile, or foreign
    return value if isinstance(value, dict) and "name" in value else None


def _row_files(folder: Path) -> list[Path]:
    try:
        with os.scandir(folder) as it:
            return [Path(e.path) for e in it if e.name.endswith(".json") and e.name[0] != "."]
    except FileNotFoundError:
        return []


class FleetIndex:
    """The index of one namespace under a storage root (see the module docstring).
    Under an object-store root (a URI) it is an :class:`ObjectStoreIndex`."""

    def __new__(cls, root: str | os.PathLike[str], namespace: str) -> FleetIndex:  # noqa: D102
        if cls is FleetIndex and is_uri(root):
            return super().__new__(ObjectStoreIndex)
        return super().__new__(cls)

    def __init__(self, root: str | os.PathLike[str], namespace: str) -> None:
        self.root = Path(root)
        self.namespace = namespace
        self.dir = index_dir(root, namespace)
        self.rows_dir = self.dir / ROWS_DIR
        self.merging_dir = self.dir / MERGING_DIR
        self.snapshot = self.dir / SNAPSHOT_PARQUET
        self.legacy_snapshot = self.dir / SNAPSHOT

    # -- writing -----------------------------------------------------------------

    def put(self, row: Row) -> None:
        """Replace the row of ``row["name"]`` (atomic; any number of concurrent writers)."""
        name = validate_name(row["name"], "agent name")
        row.setdefault("written_at", time.time())
        row.setdefault("namespace", self.namespace)
        self.rows_dir.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.rows_dir / f"{name}.json", json.dumps(row).encode())

    def delete(self, name: str) -> None:
        """Drop ``name`` from the index (a tombstone row until the next compaction)."""
        self.put({"name": name, "deleted": True, "written_at": time.time()})

    def put_snapshot(self, rows: Iterable[Row]) -> int:
        """Bulk load: fold ``rows`` into the snapshot directly (one file written), as a
        compaction would. Returns the number of rows in the snapshot."""
        with self._compaction() as locked:
            if not locked:
                raise RuntimeError("a compaction is running")
            merged = overlay(self._read_snapshot_table(), [], list(rows), self.namespace)
            self._write_snapshot_table(merged)
            return int(merged.num_rows)

    # -- reading -----------------------------------------------------------------
    # Three layers (snapshot, merging/, rows/), each read by one method, so another
    # backing store (an object-store root) replaces how a layer is read, not the merge.

    def _read_snapshot_table(self, columns: Sequence[str] | None = None) -> Any:
        """The snapshot as an Arrow table (:func:`snapshot_schema`, only ``columns``
        when given; every column :func:`overlay` needs is always read)."""
        pq = _parquet()
        try:
            data = self.snapshot.read_bytes()
        except FileNotFoundError:
            return self._read_legacy_snapshot(columns)
        return pq.read_table(_pyarrow().BufferReader(data), columns=_columns(columns))

    def _read_legacy_snapshot(self, columns: Sequence[str] | None) -> Any:
        try:
            data = self.legacy_snapshot.read_bytes()
        except FileNotFoundError:
            return rows_table([], self.namespace, columns)
        value = unpack(data)
        return rows_table(value.get("rows", []), self.namespace, columns)

    def _write_snapshot_table(self, table: Any) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        pa, pq = _pyarrow(), _parquet()
        live = table.filter(_pc().invert(table["deleted"])).select(snapshot_schema().names)
        sink = pa.BufferOutputStream()
        pq.write_table(
            live.cast(snapshot_schema()),
            sink,
            compression="zstd",
            use_dictionary=["namespace", "owner", "models", "days"],
        )
        _atomic_write(self.snapshot, sink.getvalue().to_pybytes())
        with contextlib.suppress(FileNotFoundError):
            self.legacy_snapshot.unlink()  # folded into the new one

    def pending(self) -> int:
        """How many row files wait for a compaction."""
        return len(_row_files(self.rows_dir)) + len(_row_files(self.merging_dir))

    def _read_rows(self, folder: Path) -> list[Row]:
        """The rows of one row-file layer (``rows/`` or ``merging/``)."""
        return [r for p in _row_files(folder) if (r := _read_json(p))]

    def table(self, columns: Sequence[str] | None = None) -> Any:
        """Every agent's current row as an Arrow table (:func:`snapshot_schema`; only
        ``columns`` and the merge's own when given), tombstones applied, in the order
        of a dict merge of the layers: the snapshot's rows, each in place when a row
        file replaces it, then the agents only row files have."""
        # Row files first: a compaction moving one from rows/ to merging/ meanwhile
        # is then seen in one layer or the other (or the snapshot), never in none.
        newest = self._read_rows(self.rows_dir)
        merging = self._read_rows(self.merging_dir)
        snapshot = self._read_snapshot_table(columns)
        return overlay(snapshot, merging, newest, self.namespace, columns)

    def rows(self) -> dict[str, Row]:
        """Every agent's current row by name (tombstones applied)."""
        return {r["name"]: r for r in map(json.loads, self.table(["row"])["row"].to_pylist())}

    def get(self, name: str) -> Row | None:
        """The row of ``name`` (None: not indexed)."""
        validate_name(name, "agent name")
        row = _read_json(self.rows_dir / f"{name}.json")
        if row is None:
            table = self.table(["row"])
            found = table.filter(_pc().equal(table["name"], name))["row"].to_pylist()
            return json.loads(found[-1]) if found else None
        return None if row.get("deleted") else row

    # -- compaction --------------------------------------------------------------

    @contextlib.contextmanager
    def _compaction(self) -> Any:
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    def compact(self) -> int | None:
        """Fold the row files into the snapshot. Returns how many were folded, None
        when another compaction holds the lock."""
        with self._compaction() as locked:
            if not locked:
                return None
            self.merging_dir.mkdir(parents=True, exist_ok=True)
            for path in _row_files(self.rows_dir):
                with contextlib.suppress(FileNotFoundError):
                    # rows/ is always newer than merging/: replacing is right.
                    os.replace(path, self.merging_dir / path.name)
            taken = _row_files(self.merging_dir)
            rows = [r for p in taken if (r := _read_json(p))]
            merged = overlay(self._read_snapshot_table(), rows, [], self.namespace)
            self._write_snapshot_table(merged)
            for path in taken:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            return len(taken)

    def size_bytes(self) -> int:
        """Bytes the index takes on disk (snapshot and row files)."""
        total = 0
        files = [self.snapshot, self.legacy_snapshot]
        for p in [*files, *_row_files(self.rows_dir), *_row_files(self.merging_dir)]:
            with contextlib.suppress(OSError):
                total += p.stat().st_size
        return total


class ObjectStoreIndex(FleetIndex):
    """The index of one namespace under an object-store root, in the store itself
    (``<root>/<namespace>/.index/``), through the helpers of
    :mod:`thinkray.storage.objectstore`::

        rows/<name>/<stamp>-<token>.json   one immutable object per write
        snapshot.msgpack                   every row as of the last compaction
        compact.lock                       put-if-absent by the compaction running

    An object store has no rename, so instead of replacing ``rows/<name>.json`` a
    writer creates a new object (its stamp: nanoseconds since the epoch) and then
    deletes its agent's older ones; readers take the newest object of each name (and
    the snapshot's row when its ``written_at`` is newer). Objects are never
    rewritten, so a compaction deletes exactly the objects it folded into the
    snapshot and a row written meanwhile survives (no ``merging/`` stage is needed).
    The compaction lock is an object created with the store's conditional write; one
    left by a crashed compaction is taken over after :attr:`LOCK_TTL` seconds."""

    LOCK_TTL = 300.0

    def __init__(self, root: str | os.PathLike[str], namespace: str) -> None:
        self.uri = str(root)
        self.namespace = validate_name(namespace, "namespace")
        self.prefix = f"{namespace}/{INDEX_DIR}"
        self.rows_key = f"{self.prefix}/{ROWS_DIR}"
        self.snapshot_key = f"{self.prefix}/{SNAPSHOT}"
        self.lock_key = f"{self.prefix}/{LOCK}"

    def __repr__(self) -> str:
        return f"ObjectStoreIndex({self.uri!r}, {self.namespace!r})"

    def _row_objects(self, name: str | None = None) -> dict[str, list[str]]:
        """The row objects' keys by agent name, oldest first."""
        base = self.rows_key if name is None else f"{self.rows_key}/{name}"
        out: dict[str, list[str]] = {}
        for rel, _size in list_objects(self.uri, base, recursive=True):
            if name is not None:
                rel = f"{name}/{rel}"
            agent, sep, leaf = rel.partition("/")
            if sep and leaf.endswith(".json") and not leaf.startswith(".") and "/" not in leaf:
                out.setdefault(agent, []).append(f"{self.rows_key}/{rel}")
        for keys in out.values():
            keys.sort()
        return out

    def _read_row(self, key: str) -> Row | None:
        try:
            data = read_object(self.uri, key)
            value = json.loads(data) if data is not None else None
        except ValueError:
            return None
        return value if isinstance(value, dict) and "name" in value else None

    def put(self, row: Row) -> None:
        """Write the row of ``row["name"]`` as a new object, then drop its older ones."""
        name = validate_name(row["name"], "agent name")
        row.setdefault("written_at", time.time())
        row.setdefault("namespace", self.namespace)
        key = f"{self.rows_key}/{name}/{time.time_ns():020d}-{os.urandom(4).hex()}.json"
        write_object(self.uri, key, json.dumps(row).encode())
        for old in self._row_objects(name).get(name, []):
            if old < key:
                with contextlib.suppress(Exception):  # a compaction may have taken it
                    delete_object(self.uri, old)

    def _read_snapshot(self) -> dict[str, Row]:
        data = read_object(self.uri, self.snapshot_key)
        if data is None:
            return {}
        return {r["name"]: r for r in unpack(data).get("rows", [])}

    def _write_snapshot(self, rows: dict[str, Row]) -> None:
        live = [r for r in rows.values() if not r.get("deleted")]
        data = pack({"v": 1, "written_at": time.time(), "rows": live})
        write_object(self.uri, self.snapshot_key, data)

    @staticmethod
    def _fold(into: dict[str, Row], row: Row) -> None:
        old = into.get(row["name"])
        if old is None or row.get("written_at", 0) >= old.get("written_at", 0):
            into[row["name"]] = row

    def pending(self) -> int:
        """How many row objects wait for a compaction."""
        return sum(len(keys) for keys in self._row_objects().values())

    def rows(self) -> dict[str, Row]:
        """Every agent's current row by name (tombstones applied)."""
        merged = self._read_snapshot()
        for keys in self._row_objects().values():
            for key in reversed(keys):  # the newest readable one
                if (row := self._read_row(key)) is not None:
                    self._fold(merged, row)
                    break
        return {n: r for n, r in merged.items() if not r.get("deleted")}

    def get(self, name: str) -> Row | None:
        """The row of ``name`` (None: not indexed)."""
        validate_name(name, "agent name")
        for key in reversed(self._row_objects(name).get(name, [])):
            if (row := self._read_row(key)) is not None:
                snap = self._read_snapshot().get(name)
                if snap is not None and snap.get("written_at", 0) > row.get("written_at", 0):
                    row = snap
                return None if row.get("deleted") else row
        row = self._read_snapshot().get(name)
        return None if row is None or row.get("deleted") else row

    @contextlib.contextmanager
    def _compaction(self) -> Any:
        body = json.dumps({"pid": os.getpid(), "expires_at": time.time() + self.LOCK_TTL})
        locked = put_object_if_absent(self.uri, self.lock_key, body.encode())
        if not locked:
            try:
                held = json.loads(read_object(self.uri, self.lock_key) or b"{}")
            except ValueError:
                held = {}
            if float(held.get("expires_at", 0)) < time.time():  # left by a crashed one
                delete_object(self.uri, self.lock_key)
                locked = put_object_if_absent(self.uri, self.lock_key, body.encode())
        try:
            yield locked
        finally:
            if locked:
                with contextlib.suppress(Exception):
                    delete_object(self.uri, self.lock_key)

    def put_snapshot(self, rows: Iterable[Row]) -> int:
        """Bulk load: fold ``rows`` into the snapshot (one object written). Returns the
        number of rows in the snapshot."""
        with self._compaction() as locked:
            if not locked:
                raise RuntimeError("a compaction is running")
            merged = self._read_snapshot()
            for row in rows:
                merged[row["name"]] = row
            self._write_snapshot(merged)
            return len(merged)

    def compact(self) -> int | None:
        """Fold the row objects into the snapshot and delete them. Returns how many
        were folded, None when another compaction holds the lock."""
        with self._compaction() as locked:
            if not locked:
                return None
            taken = [key for keys in self._row_objects().values() for key in keys]
            merged = self._read_snapshot()
            for key in taken:
                if (row := self._read_row(key)) is not None:
                    self._fold(merged, row)
            self._write_snapshot(merged)
            for key in taken:
                with contextlib.suppress(Exception):
                    delete_object(self.uri, key)
            return len(taken)

    def table(self, columns: Sequence[str] | None = None) -> Any:
        """Every agent's current row as an Arrow table (see :meth:`FleetIndex.table`)."""
        return rows_table(list(self.rows().values()), self.namespace, columns)

    def size_bytes(self) -> int:
        """Bytes the index takes in the store (snapshot and row objects)."""
        return sum(size for _rel, size in list_objects(self.uri, self.prefix, recursive=True))


# -- the files themselves (offline) ------------------------------------------------


def namespaces(root: str | os.PathLike[str]) -> list[str]:
    """The namespaces under ``root`` (folders with agent files or an index), sorted."""
    if is_uri(root):
        out = []
        for folder in list_folders(str(root), ""):
            if not folder.startswith("."):
                with contextlib.suppress(Exception):
                    out.append(validate_name(folder, "namespace"))
        return out
    base = Path(root)
    if not base.is_dir():
        return []
    out = []
    for p in base.iterdir():
        if p.is_dir() and not p.name.startswith("."):
            with contextlib.suppress(Exception):
                validate_name(p.name, "namespace")
                out.append(p.name)
    return sorted(out)


def is_locked(path: str | os.PathLike[str]) -> bool:
    """Whether another process holds a lock on the DuckDB file ``path`` (a live agent:
    DuckDB takes an fcntl lock). Only tests; holds nothing after returning. A lock held
    by this very process is not seen (fcntl locks are per process)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.lockf(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def scan_file(path: str | os.PathLike[str], now: float | None = None) -> Row:
    """The index row of a hibernated agent's file, read through a read-only DuckDB
    connection (nothing is written, the agent is not woken).

    Raises:
        AgentLiveError: a live process holds the file.
    """
    root, namespace, name = _split(path)
    if is_locked(path):
        raise AgentLiveError(f"{name} is live")
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.IOException as exc:
        if "lock" in str(exc).lower():
            raise AgentLiveError(f"{name} is live: {exc}") from exc
        raise
    except duckdb.Error as exc:
        # attached by an agent of this very process (DuckDB's lock is per process)
        if "already attached" in str(exc).lower():
            raise AgentLiveError(f"{name} is live in this process: {exc}") from exc
        raise
    try:

        def fetchall(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
            return con.execute(sql, list(params)).fetchall()

        tables = {t for (t,) in fetchall("SELECT table_name FROM information_schema.tables", [])}
        if "sessions" in tables:
            row = summarize(fetchall)
        else:
            row = {"sessions": 0, "messages": 0, "created_at": None, "last_active": None}
            row["models"] = {}
        reported = _reported(fetchall) if "config" in tables else {}
    finally:
        con.close()
    row.update(
        name=name,
        namespace=namespace,
        owner=OwnerRegistry(root).owner(namespace, name),
        bytes=_file_bytes(Path(path)),
        days=reported.get("days") or {},
        live=False,
        written_at=time.time() if now is None else now,
    )
    return row


# -- pricing and stats --------------------------------------------------------------


def load_prices(path: str | os.PathLike[str] | None = None) -> dict[str, dict[str, float]] | None:
    """The price table (USD per million tokens by model and kind) from ``path`` or
    ``$THINKRAY_PRICES``; None when none is configured."""
    path = path or os.environ.get("THINKRAY_PRICES")
    if not path:
        return None
    value = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(value, dict):
        raise ValueError(f"price table {path} must be a JSON object of models")
    return value


def cost_of(
    model: str, kinds: dict[str, Any], prices: dict[str, dict[str, float]] | None
) -> float | None:
    """USD for ``kinds`` of ``model``: from the price table when it names the model,
    else the cost the provider reported (None: unknown)."""
    table = (prices or {}).get(model)
    if table is not None:
        return sum(int(kinds.get(k) or 0) * float(table.get(k, 0.0)) for k in KINDS) / 1e6
    cost = kinds.get("cost_usd")
    return None if cost is None else float(cost)


def _tokens(kinds: dict[str, Any]) -> int:
    return sum(int(kinds.get(k) or 0) for k in KINDS)


def fleet_stats(
    rows: Iterable[Row],
    *,
    prices: dict[str, dict[str, float]] | None = None,
    top: int = 10,
    idle_days: float = 30.0,
    now: float | None = None,
) -> dict[str, Any]:
    """Totals, usage by model, usage by day and model, the biggest agents (bytes) and
    the idle ones (no activity for ``idle_days``) of ``rows``."""
    now = time.time() if now is None else now
    by_model: dict[str, dict[str, Any]] = {}
    by_day: dict[tuple[str, str], dict[str, Any]] = {}
    agents = sessions = messages = size = 0
    biggest: list[tuple[int, str]] = []
    idle: list[tuple[float, str]] = []
    cutoff = now - idle_days * 86400
    for row in rows:
        agents += 1
        sessions += row.get("sessions") or 0
        messages += row.get("messages") or 0
        size += row.get("bytes") or 0
        biggest.append((row.get("bytes") or 0, row["name"]))
        last = row.get("last_active")
        if last is None or last < cutoff:
            idle.append((last or 0.0, row["name"]))
        for model, kinds in (row.get("models") or {}).items():
            _add_kinds(by_model.setdefault(model, _empty_kinds()), kinds)
        for day, models in (row.get("days") or {}).items():
            for model, kinds in models.items():
                _add_kinds(by_day.setdefault((day, model), _empty_kinds()), kinds)

    def usage(model: str, kinds: dict[str, Any]) -> dict[str, Any]:
        out = {k: kinds.get(k, 0) for k in KINDS}
        out["tokens"] = _tokens(kinds)
        out["cost_usd"] = cost_of(model, kinds, prices)
        return out

    biggest.sort(reverse=True)
    idle.sort()
    return {
        "agents": agents,
        "sessions": sessions,
        "messages": messages,
        "bytes": size,
        "priced": prices is not None,
        "by_model": [{"model": m, **usage(m, k)} for m, k in sorted(by_model.items())],
        "by_day": [{"day": d, "model": m, **usage(m, k)} for (d, m), k in sorted(by_day.items())],
        "biggest": [{"name": n, "bytes": b} for b, n in biggest[:top]],
        "idle": [{"name": n, "last_active": t or None} for t, n in idle[:top]],
        "idle_count": len(idle),
    }


# -- the columnar snapshot ----------------------------------------------------------
# pyarrow is imported on first use: a session actor only writes row files.

_MERGE_COLUMNS = ("name", "written_at", "deleted")
"""Columns :func:`overlay` reads whatever a reader asked for."""


def _pyarrow() -> Any:
    import pyarrow  # type: ignore[import-untyped]

    return pyarrow


def _parquet() -> Any:
    import pyarrow.parquet  # type: ignore[import-untyped]

    return pyarrow.parquet


def _pc() -> Any:
    import pyarrow.compute  # type: ignore[import-untyped]

    return pyarrow.compute


@functools.cache
def snapshot_schema() -> Any:
    """The snapshot's columns: what ``ls`` sorts and filters on, what ``stats`` adds up
    (usage by model and by day as lists of structs, one per model or day and model),
    and ``row``, the row's compact JSON (what ``ls --json`` prints)."""
    pa = _pyarrow()
    kinds = [pa.field(k, pa.int64()) for k in KINDS] + [pa.field("cost_usd", pa.float64())]
    model = pa.struct([pa.field("model", pa.string()), *kinds])
    day = pa.struct([pa.field("day", pa.string()), pa.field("model", pa.string()), *kinds])
    return pa.schema(
        [
            pa.field("name", pa.string()),
            pa.field("namespace", pa.string()),
            pa.field("owner", pa.string()),
            pa.field("sessions", pa.int64()),
            pa.field("messages", pa.int64()),
            pa.field("bytes", pa.int64()),
            pa.field("tokens", pa.int64()),
            pa.field("last_active", pa.float64()),
            pa.field("written_at", pa.float64()),
            pa.field("deleted", pa.bool_()),
            pa.field("models", pa.list_(model)),
            pa.field("days", pa.list_(day)),
            pa.field("row", pa.string()),
        ]
    )


def _columns(columns: Sequence[str] | None) -> list[str]:
    names = snapshot_schema().names
    if columns is None:
        return list(names)
    return [c for c in names if c in {*columns, *_MERGE_COLUMNS}]


def _kinds_of(kinds: Any) -> dict[str, Any]:
    kinds = kinds if isinstance(kinds, dict) else {}
    out: dict[str, Any] = {k: int(kinds.get(k) or 0) for k in KINDS}
    cost = kinds.get("cost_usd")
    out["cost_usd"] = None if cost is None else float(cost)
    return out


def rows_table(rows: Iterable[Row], namespace: str, columns: Sequence[str] | None = None) -> Any:
    """``rows`` (dicts, as written) as an Arrow table of :func:`snapshot_schema` (only
    ``columns`` and the merge's own when given). A row without a ``namespace`` gets
    ``namespace`` (last, as the CLI always added it)."""
    pa = _pyarrow()
    wanted = _columns(columns)
    out: dict[str, list[Any]] = {c: [] for c in wanted}
    for r in rows:
        if "namespace" not in r:
            r = {**r, "namespace": namespace}
        models = r.get("models") or {}
        values: dict[str, Any] = {
            "name": r["name"],
            "namespace": r["namespace"],
            "owner": None if r.get("owner") is None else str(r["owner"]),
            "sessions": int(r.get("sessions") or 0),
            "messages": int(r.get("messages") or 0),
            "bytes": int(r.get("bytes") or 0),
            "last_active": None if r.get("last_active") is None else float(r["last_active"]),
            "written_at": float(r.get("written_at", 0) or 0),
            "deleted": bool(r.get("deleted")),
        }
        if "models" in out or "tokens" in out:
            values["models"] = [{"model": m, **_kinds_of(k)} for m, k in models.items()]
            values["tokens"] = sum(_tokens(k) for k in models.values() if isinstance(k, dict))
        if "days" in out:
            values["days"] = [
                {"day": d, "model": m, **_kinds_of(k)}
                for d, by_model in (r.get("days") or {}).items()
                for m, k in (by_model or {}).items()
            ]
        if "row" in out:
            values["row"] = json.dumps(r, separators=(",", ":"))
        for c, column in out.items():
            column.append(values[c])
    schema = snapshot_schema()
    return pa.table(
        {c: pa.array(v, type=schema.field(c).type) for c, v in out.items()},
        schema=pa.schema([schema.field(c) for c in wanted]),
    )


def overlay(
    snapshot: Any,
    merging: Sequence[Row],
    newest: Sequence[Row],
    namespace: str,
    columns: Sequence[str] | None = None,
) -> Any:
    """The table a dict merge of the layers gives: ``snapshot`` (a table), then each
    row of ``merging`` unless the row it replaces has a later ``written_at``, then every
    row of ``newest``; a replaced row keeps its place, a new agent comes after the
    snapshot's (in the order of the row files); tombstones are dropped."""
    pc = _pc()
    if merging or newest:
        n = snapshot.num_rows
        slot = {name: i for i, name in enumerate(snapshot["name"].to_pylist())}
        written = snapshot["written_at"]
        replaced: dict[int, Row] = {}
        extra: dict[str, Row] = {}
        for r in merging:
            i = slot.get(r["name"])
            if i is None:
                old = extra.get(r["name"])
                old_written = None if old is None else old.get("written_at", 0)
            else:
                old = replaced.get(i)
                old_written = written[i].as_py() if old is None else old.get("written_at", 0)
            if old_written is None or r.get("written_at", 0) >= old_written:
                if i is None:
                    extra[r["name"]] = r
                else:
                    replaced[i] = r
        for r in newest:
            i = slot.get(r["name"])
            if i is None:
                extra[r["name"]] = r
            else:
                replaced[i] = r
        order = sorted(replaced)
        added = rows_table([*(replaced[i] for i in order), *extra.values()], namespace, columns)
        take = list(range(n))
        for j, i in enumerate(order):
            take[i] = n + j
        take.extend(range(n + len(order), n + added.num_rows))
        snapshot = _pyarrow().concat_tables([snapshot, added.cast(snapshot.schema)]).take(take)
    if snapshot.num_rows and pc.any(snapshot["deleted"]).as_py():
        snapshot = snapshot.filter(pc.invert(snapshot["deleted"]))
    return snapshot


def _grouped(flat: Any, keys: list[str]) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """Sums of the kinds of ``flat`` (a struct array of usage) by ``keys``, sorted: the
    token counts by ``group_by``, the reported costs added in row order as a Python
    loop over the rows would (None where no row reported one)."""
    pa, pc = _pyarrow(), _pc()
    if len(flat) == 0:
        return []
    names = [*keys, *KINDS, "cost_usd"]
    table = pa.table({name: pc.struct_field(flat, name) for name in names})
    sums = table.group_by(keys, use_threads=False).aggregate([(k, "sum") for k in KINDS])
    out: dict[tuple[str, ...], dict[str, Any]] = {}
    for rec in sums.to_pylist():
        kinds: dict[str, Any] = {k: int(rec[f"{k}_sum"] or 0) for k in KINDS}
        kinds["cost_usd"] = None
        out[tuple(rec[k] for k in keys)] = kinds
    reported = pc.indices_nonzero(pc.is_valid(table["cost_usd"]))
    if len(reported):
        picked = table.select([*keys, "cost_usd"]).take(reported).to_pylist()
        for rec in picked:
            kinds = out[tuple(rec[k] for k in keys)]
            kinds["cost_usd"] = (kinds["cost_usd"] or 0.0) + rec["cost_usd"]
    return sorted(out.items())


STATS_COLUMNS = ("name", "sessions", "messages", "bytes", "last_active", "models", "days")
"""The columns :func:`fleet_stats_table` reads."""


def fleet_stats_table(
    table: Any,
    *,
    prices: dict[str, dict[str, float]] | None = None,
    top: int = 10,
    idle_days: float = 30.0,
    now: float | None = None,
) -> dict[str, Any]:
    """:func:`fleet_stats` of a table of rows (:meth:`FleetIndex.table`, :func:`rows_table`),
    by columnar aggregates: the same result, without a Python loop over the agents."""
    pa, pc = _pyarrow(), _pc()
    now = time.time() if now is None else now
    cutoff = now - idle_days * 86400

    def total(column: str) -> int:
        return int(pc.sum(table[column]).as_py() or 0)

    def usage(model: str, kinds: dict[str, Any]) -> dict[str, Any]:
        out = {k: kinds.get(k, 0) for k in KINDS}
        out["tokens"] = _tokens(kinds)
        out["cost_usd"] = cost_of(model, kinds, prices)
        return out

    by_model = _grouped(pc.list_flatten(table["models"]), ["model"])
    by_day = _grouped(pc.list_flatten(table["days"]), ["day", "model"])
    last = table["last_active"]
    keys = pa.table({"name": table["name"], "bytes": table["bytes"], "last": last.fill_null(0.0)})
    biggest = pc.sort_indices(keys, sort_keys=[("bytes", "descending"), ("name", "descending")])
    idle_mask = pc.or_(pc.is_null(last), pc.less(last, cutoff)).fill_null(True)
    idle_keys = keys.filter(idle_mask)
    idle = pc.sort_indices(idle_keys, sort_keys=[("last", "ascending"), ("name", "ascending")])
    top = max(top, 0)
    return {
        "agents": int(table.num_rows),
        "sessions": total("sessions"),
        "messages": total("messages"),
        "bytes": total("bytes"),
        "priced": prices is not None,
        "by_model": [{"model": m, **usage(m, k)} for (m,), k in by_model],
        "by_day": [{"day": d, "model": m, **usage(m, k)} for (d, m), k in by_day],
        "biggest": [
            {"name": r["name"], "bytes": r["bytes"]} for r in keys.take(biggest[:top]).to_pylist()
        ],
        "idle": [
            {"name": r["name"], "last_active": r["last"] or None}
            for r in idle_keys.take(idle[:top]).to_pylist()
        ],
        "idle_count": int(idle_keys.num_rows),
    }
