"""The durable workspace: a small virtual filesystem inside the actor's DuckDB file.

One table, ``workspace_files``, holds every file and directory of every namespace:

=========  ===========================================================================
namespace  which filesystem (``"default"`` for the agent's workspace; reserved names
           such as the extension registry live beside it without being visible)
path       canonical relative path, ``"src/app.py"``; the root is ``""`` and has no row
parent     the parent directory's path (``""`` for top-level entries): listing a
           directory is one equality scan
kind       ``"file"`` or ``"dir"``
size       content length in bytes (0 for directories); summed for the quota
content    the bytes (NULL for directories)
meta       msgpack ``{"mime", "ctime", "mtime"}``: read only for ``stat``/listings, so
           it stays in one column (DuckDB spends a few KiB per non-empty column)
=========  ===========================================================================

Paths handed to the store must already be canonical (``thinkray.runtime.tools.paths.normalize_path``
does the hostile-input work; ``storage`` must not import ``runtime``). The store still
refuses malformed paths structurally (``..``, empty segments, a leading ``/``, NUL) so
that a caller skipping normalization cannot corrupt the tree.

Parent directories are created implicitly by writes. All mutations run in one
transaction, so a write that would break a limit changes nothing.
"""

from __future__ import annotations

import builtins
import mimetypes
import time
from collections.abc import Iterator, Sequence
from typing import Any

import duckdb
import msgpack
from thinkray.storage.db import Database, MigratedStore, Migration
from thinkray.storage.errors import InvalidInputError, InvalidTypeError
from thinkray.storage.errors import (  # re-exported: the errors live in thinkray.storage.errors
    WorkspaceError as WorkspaceError,
)
from thinkray.storage.errors import (
    WorkspaceExistsError as WorkspaceExistsError,
)
from thinkray.storage.errors import (
    WorkspaceIsADirectoryError as WorkspaceIsADirectoryError,
)
from thinkray.storage.errors import (
    WorkspaceLimitError as WorkspaceLimitError,
)
from thinkray.storage.errors import (
    WorkspaceNotADirectoryError as WorkspaceNotADirectoryError,
)
from thinkray.storage.errors import (
    WorkspaceNotEmptyError as WorkspaceNotEmptyError,
)
from thinkray.storage.errors import (
    WorkspaceNotFoundError as WorkspaceNotFoundError,
)
from thinkray.storage.errors import (
    WorkspacePathError as WorkspacePathError,
)
from thinkray.storage.records import (
    DEFAULT_MAX_ENTRIES,
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_TOTAL_BYTES,
    EntryInfo,
    WorkspaceLimits,
)

_BATCH = 64  # files fetched per query when iterating contents (grep)


def _create_v1(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(
        """
        CREATE TABLE IF NOT EXISTS workspace_files (
            namespace VARCHAR NOT NULL,
            path VARCHAR NOT NULL,
            parent VARCHAR NOT NULL,
            kind VARCHAR NOT NULL,
            size BIGINT NOT NULL,
            content BLOB,
            meta BLOB,
            PRIMARY KEY (namespace, path)
        )
        """
    )


MIGRATIONS = [Migration(1, _create_v1)]

_ROOT_INFO = EntryInfo("", "dir", 0, None, 0.0, 0.0)
_MIME = mimetypes.MimeTypes()
for _ext, _type in {
    ".md": "text/markdown",
    ".ts": "text/typescript",
    ".tsx": "text/tsx",
    ".jsx": "text/jsx",
    ".toml": "application/toml",
    ".yaml": "application/yaml",
    ".yml": "application/yaml",
    ".jsonl": "application/jsonl",
}.items():
    _MIME.add_type(_type, _ext)


def guess_mime_type(path: str, content: bytes) -> str:
    """The MIME type of a file: from its extension when known, else
    ``application/octet-stream`` for binary content (a NUL byte near the start, or
    not UTF-8) and ``text/plain`` for text."""
    guessed, _ = _MIME.guess_type(path, strict=False)
    if guessed:
        return guessed
    if b"\x00" in content[:8192]:
        return "application/octet-stream"
    try:
        content.decode("utf-8")
    except UnicodeDecodeError:
        return "application/octet-stream"
    return "text/plain"


def check_canonical(path: str, *, allow_root: bool = False) -> str:
    """Structural check of a canonical path; raises :class:`WorkspacePathError`."""
    if not isinstance(path, str):
        raise WorkspacePathError(f"path must be a string, got {type(path).__name__}")
    if path == "":
        if allow_root:
            return path
        raise WorkspacePathError("the workspace root is not a valid target here")
    if "\x00" in path or path.startswith("/") or path.endswith("/"):
        raise WorkspacePathError(f"path {path!r} is not canonical")
    for segment in path.split("/"):
        if segment in ("", ".", ".."):
            raise WorkspacePathError(f"path {path!r} is not canonical")
    return path


def _parent(path: str) -> str:
    return path.rpartition("/")[0]


def _ancestors(path: str) -> list[str]:
    """``"a/b/c"`` -> ``["a", "a/b"]`` (outermost first, root excluded)."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


class DuckDBWorkspaceStore(MigratedStore):
    """:class:`~thinkray.storage.protocols.WorkspaceStore`: one namespace of the
    ``workspace_files`` table of a :class:`Database` (the contract is the protocol's;
    paths are checked by :func:`check_canonical`). Safe to share between threads (the
    :class:`Database` serializes calls). Get one from
    :meth:`~thinkray.storage.protocols.Stores.workspace`.

    Raises:
        InvalidInputError: an empty namespace.
    """

    component = "workspace"
    migrations = MIGRATIONS

    def __init__(
        self,
        db: Database,
        namespace: str = "default",
        *,
        limits: WorkspaceLimits | None = None,
        max_file_bytes: int | None = DEFAULT_MAX_FILE_BYTES,
        max_total_bytes: int | None = DEFAULT_MAX_TOTAL_BYTES,
        max_entries: int | None = DEFAULT_MAX_ENTRIES,
    ) -> None:
        if not namespace or not isinstance(namespace, str):
            raise InvalidInputError("namespace must be a non-empty string")
        self.namespace = namespace
        self.limits = limits or WorkspaceLimits(max_file_bytes, max_total_bytes, max_entries)
        super().__init__(db)

    # -- reads ---------------------------------------------------------------------

    def exists(self, path: str) -> bool:
        """Whether ``path`` is a file or directory (the root always is).

        Raises:
            WorkspacePathError: ``path`` is not canonical.
        """
        check_canonical(path, allow_root=True)
        if path == "":
            return True
        row = self.db.fetchone(
            "SELECT 1 FROM workspace_files WHERE namespace = ? AND path = ?",
            [self.namespace, path],
        )
        return row is not None

    def stat(self, path: str) -> EntryInfo:
        """Metadata of ``path``; raises :class:`WorkspaceNotFoundError`."""
        info = self.try_stat(path)
        if info is None:
            raise WorkspaceNotFoundError(f"no such file or directory: {path!r}")
        return info

    def try_stat(self, path: str) -> EntryInfo | None:
        """Metadata of ``path``, or ``None`` if nothing is there.

        Raises:
            WorkspacePathError: ``path`` is not canonical.
        """
        check_canonical(path, allow_root=True)
        if path == "":
            return _ROOT_INFO
        row = self.db.fetchone(
            "SELECT path, kind, size, meta FROM workspace_files WHERE namespace = ? AND path = ?",
            [self.namespace, path],
        )
        return _info(row) if row else None

    def read(self, path: str) -> bytes:
        """The bytes of a file. Raises not-found or is-a-directory errors."""
        check_canonical(path)
        row = self.db.fetchone(
            "SELECT kind, content FROM workspace_files WHERE namespace = ? AND path = ?",
            [self.namespace, path],
        )
        if row is None:
            raise WorkspaceNotFoundError(f"no such file: {path!r}")
        if row[0] == "dir":
            raise WorkspaceIsADirectoryError(f"{path!r} is a directory, not a file")
        return bytes(row[1] or b"")

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """:meth:`read`, decoded with ``encoding`` (same errors, plus
        ``UnicodeDecodeError`` for bytes that do not decode)."""
        return self.read(path).decode(encoding)

    def list(self, path: str = "") -> list[EntryInfo]:
        """Direct children of a directory, sorted by name."""
        self._require_dir(path)
        rows = self.db.fetchall(
            "SELECT path, kind, size, meta FROM workspace_files "
            "WHERE namespace = ? AND parent = ? ORDER BY path",
            [self.namespace, path],
        )
        return [_info(r) for r in rows]

    def walk(self, path: str = "", *, include_dirs: bool = False) -> Iterator[EntryInfo]:
        """Every file (and directory, if asked) below ``path``, not ``path`` itself.

        Sorted by path string, so a directory comes before its contents. Metadata
        only, fetched in one query; read contents with :meth:`iter_contents`.
        """
        self._require_dir(path)
        sql = "SELECT path, kind, size, meta FROM workspace_files WHERE namespace = ?"
        params: builtins.list[Any] = [self.namespace]
        if path:
            sql += " AND starts_with(path, ?)"
            params.append(path + "/")
        if not include_dirs:
            sql += " AND kind = 'file'"
        rows = self.db.fetchall(sql + " ORDER BY path", params)
        for row in rows:
            yield _info(row)

    def iter_contents(self, paths: Sequence[str]) -> Iterator[tuple[EntryInfo, bytes]]:
        """``(info, content)`` of the given files, in the given order, fetched in
        batches. Paths that vanished or are directories are skipped."""
        for start in range(0, len(paths), _BATCH):
            batch = paths[start : start + _BATCH]
            rows = self.db.fetchall(
                "SELECT path, kind, size, meta, content FROM workspace_files "
                "WHERE namespace = ? AND kind = 'file' AND list_contains(?, path)",
                [self.namespace, batch],
            )
            found = {r[0]: r for r in rows}
            for p in batch:
                row = found.get(p)
                if row is not None:
                    yield _info(row[:4]), bytes(row[4] or b"")

    def usage(self) -> dict[str, int]:
        """``{"entries": n, "bytes": total}`` for this namespace."""
        count, total = self._usage()
        return {"entries": count, "bytes": total}

    # -- writes --------------------------------------------------------------------

    def write(self, path: str, content: str | bytes, *, mime_type: str | None = None) -> EntryInfo:
        """Create or replace a file (``str`` is stored as UTF-8). Returns its metadata."""
        check_canonical(path)
        if isinstance(content, str):
            data = content.encode("utf-8")
        elif isinstance(content, bytes | bytearray | memoryview):
            data = bytes(content)
        else:
            raise InvalidTypeError(f"content must be str or bytes, got {type(content).__name__}")
        limit = self.limits.max_file_bytes
        if limit is not None and len(data) > limit:
            raise WorkspaceLimitError(
                f"file {path!r} is {len(data)} bytes; the limit is {limit} bytes"
            )
        now = time.time()
        mime = mime_type or guess_mime_type(path, data)
        with self.db.transaction() as con:
            existing, ancestors, usage = self._inspect(con, path)
            if existing is not None and existing[1] == "dir":
                raise WorkspaceIsADirectoryError(f"{path!r} is a directory, not a file")
            missing = self._missing(path, ancestors)
            new_entries = len(missing) + (0 if existing else 1)
            old_size = existing[2] if existing else 0
            self._check_quota(con, new_entries, len(data) - old_size, usage)
            for ancestor in missing:
                self._insert_dir(con, ancestor, now)
            if existing is None:
                meta = _pack(mime, now, now)
                con.execute(
                    "INSERT INTO workspace_files VALUES (?, ?, ?, 'file', ?, ?, ?)",
                    [self.namespace, path, _parent(path), len(data), data, meta],
                )
                created = now
            else:
                created = _unpack(existing[3]).get("ctime", now)
                meta = _pack(mime, created, now)
                con.execute(
                    "UPDATE workspace_files SET size = ?, content = ?, meta = ? "
                    "WHERE namespace = ? AND path = ?",
                    [len(data), data, meta, self.namespace, path],
                )
        return EntryInfo(path, "file", len(data), mime, created, now)

    def mkdir(self, path: str, *, exist_ok: bool = True) -> EntryInfo:
        """Create a directory and its missing parents."""
        check_canonical(path)
        now = time.time()
        with self.db.transaction() as con:
            existing, ancestors, usage = self._inspect(con, path)
            if existing is not None:
                if existing[1] == "file":
                    raise WorkspaceExistsError(f"{path!r} exists and is a file")
                if not exist_ok:
                    raise WorkspaceExistsError(f"directory {path!r} already exists")
                return _info(existing)
            missing = self._missing(path, ancestors)
            self._check_quota(con, len(missing) + 1, 0, usage)
            for p in [*missing, path]:
                self._insert_dir(con, p, now)
        return EntryInfo(path, "dir", 0, None, now, now)

    def delete(self, path: str, *, recursive: bool = False) -> int:
        """Delete a file or directory; returns how many entries were removed.

        A non-empty directory needs ``recursive=True``. The root cannot be deleted.
        """
        check_canonical(path)
        with self.db.transaction() as con:
            existing = self._row(con, path)
            if existing is None:
                raise WorkspaceNotFoundError(f"no such file or directory: {path!r}")
            if existing[1] == "file":
                con.execute(
                    "DELETE FROM workspace_files WHERE namespace = ? AND path = ?",
                    [self.namespace, path],
                )
                return 1
            (children,) = con.execute(
                "SELECT count(*) FROM workspace_files WHERE namespace = ? AND starts_with(path, ?)",
                [self.namespace, path + "/"],
            ).fetchone() or (0,)
            if children and not recursive:
                raise WorkspaceNotEmptyError(
                    f"directory {path!r} is not empty ({children} entries); "
                    "delete it with recursive=true"
                )
            con.execute(
                "DELETE FROM workspace_files WHERE namespace = ? "
                "AND (path = ? OR starts_with(path, ?))",
                [self.namespace, path, path + "/"],
            )
            return children + 1

    def clear(self) -> int:
        """Delete everything in this namespace. Returns the number of entries removed."""
        with self.db.transaction() as con:
            count = self._usage(con)[0]
            con.execute("DELETE FROM workspace_files WHERE namespace = ?", [self.namespace])
            return count

    # -- helpers -------------------------------------------------------------------

    def _require_dir(self, path: str) -> None:
        check_canonical(path, allow_root=True)
        if path == "":
            return
        info = self.try_stat(path)
        if info is None:
            raise WorkspaceNotFoundError(f"no such directory: {path!r}")
        if info.kind != "dir":
            raise WorkspaceNotADirectoryError(f"{path!r} is a file, not a directory")

    def _row(self, con: duckdb.DuckDBPyConnection, path: str) -> tuple[Any, ...] | None:
        return con.execute(
            "SELECT path, kind, size, meta FROM workspace_files WHERE namespace = ? AND path = ?",
            [self.namespace, path],
        ).fetchone()

    def _inspect(
        self, con: duckdb.DuckDBPyConnection, path: str
    ) -> tuple[tuple[Any, ...] | None, Sequence[tuple[str, str | None]], tuple[int, int] | None]:
        """What a write needs to know, in one statement: ``path``'s row (path, kind,
        size, meta) or None; its ancestors as ``(path, kind)``, kind None where there is
        no entry, root first; and the namespace's ``(entries, bytes)`` when a quota
        applies (else None)."""
        ancestors = _ancestors(path)
        quota = self.limits.max_entries is not None or self.limits.max_total_bytes is not None
        wanted = (
            "SELECT path, kind, size, meta FROM workspace_files "
            "WHERE namespace = $ns AND (path = $path OR list_contains($ancestors, path))"
        )
        if quota:
            sql = (
                "SELECT f.path, f.kind, f.size, f.meta, u.n, u.total FROM (SELECT count(*) AS n, "
                "coalesce(sum(size), 0) AS total FROM workspace_files WHERE namespace = $ns) u "
                f"LEFT JOIN ({wanted}) f ON true"
            )
        else:
            sql = wanted
        rows = con.execute(
            sql, {"ns": self.namespace, "path": path, "ancestors": ancestors}
        ).fetchall()
        usage = (int(rows[0][4]), int(rows[0][5])) if quota and rows else None
        found = {row[0]: row[:4] for row in rows if row[0] is not None}
        kinds = {p: (found[p][1] if p in found else None) for p in ancestors}
        return found.get(path), list(kinds.items()), usage

    @staticmethod
    def _missing(path: str, ancestors: Sequence[tuple[str, str | None]]) -> Sequence[str]:
        """The ancestors (from :meth:`_inspect`) to create, root first.

        Raises:
            WorkspaceNotADirectoryError: an ancestor is a file.
        """
        for ancestor, kind in ancestors:
            if kind == "file":
                raise WorkspaceNotADirectoryError(
                    f"cannot create {path!r}: {ancestor!r} is a file, not a directory"
                )
        return [a for a, kind in ancestors if kind is None]

    def _usage(self, con: duckdb.DuckDBPyConnection | None = None) -> tuple[int, int]:
        sql = "SELECT count(*), coalesce(sum(size), 0) FROM workspace_files WHERE namespace = ?"
        row = (con or self.db).execute(sql, [self.namespace]).fetchone() or (0, 0)
        return int(row[0]), int(row[1])

    def _check_quota(
        self,
        con: duckdb.DuckDBPyConnection,
        new_entries: int,
        added_bytes: int,
        usage: tuple[int, int] | None = None,
    ) -> None:
        max_entries, max_total = self.limits.max_entries, self.limits.max_total_bytes
        if max_entries is None and max_total is None:
            return
        count, total = usage if usage is not None else self._usage(con)
        if max_entries is not None and new_entries and count + new_entries > max_entries:
            raise WorkspaceLimitError(
                f"the workspace holds {count} entries; the limit is {max_entries}"
            )
        if max_total is not None and added_bytes > 0 and total + added_bytes > max_total:
            raise WorkspaceLimitError(
                f"the workspace would hold {total + added_bytes} bytes; "
                f"the limit is {max_total} bytes"
            )

    def _insert_dir(self, con: duckdb.DuckDBPyConnection, path: str, now: float) -> None:
        con.execute(
            "INSERT INTO workspace_files VALUES (?, ?, ?, 'dir', 0, NULL, ?)",
            [self.namespace, path, _parent(path), _pack(None, now, now)],
        )


def _pack(mime: str | None, ctime: float, mtime: float) -> bytes:
    return msgpack.packb({"mime": mime, "ctime": ctime, "mtime": mtime})


def _unpack(meta: bytes | None) -> dict[str, Any]:
    if not meta:
        return {}
    return msgpack.unpackb(bytes(meta))


def _info(row: tuple[Any, ...]) -> EntryInfo:
    path, kind, size, meta = row
    m = _unpack(meta)
    return EntryInfo(
        path=path,
        kind=kind,
        size=int(size),
        mime_type=m.get("mime"),
        created=float(m.get("ctime", 0.0)),
        modified=float(m.get("mtime", 0.0)),
    )
