"""Where an agent's database file lives under a storage root.

A session name becomes a file name, so it is validated before any filesystem call:
``root/<namespace>/<name>.duckdb``. Every node of a cluster must see the same root
(shared storage) for a session hibernated on one node to wake on another.

A root may also be an object-store URI (``s3://bucket/prefix``, ``file:///path``):
then :func:`session_path` returns a :class:`RemotePath` (its ``str`` is the session's
URI, handed to the session actor) and the files live as fenced generations
(:mod:`thinkray.storage.objectstore`).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path, PosixPath
from typing import Any

from thinkray.storage.errors import (  # re-exported: the errors live in thinkray.storage.errors
    StorageRootError as StorageRootError,
)
from thinkray.storage.types import InvalidInputError

# fullmatch, not match: "$" also matches before a final newline ("nl-1\n")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
FILE_SUFFIX = ".duckdb"


def validate_name(name: str, what: str = "session name") -> str:
    """A safe identifier: letters, digits, ``_ . -``; starts alphanumeric; ≤ 128 chars;
    no ``..``. Anything else is refused before touching the filesystem."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise InvalidInputError(
            f"invalid {what} {name!r}: use 1-128 letters, digits, '_', '.', '-' "
            "starting with a letter or digit (it becomes a file name)"
        )
    return name


class RemotePath(PosixPath):
    """The file of a session under an object-store root. A ``Path`` for the callers
    that take one, but ``str()`` is the session's URI (``<root>/<namespace>/<name>.duckdb``,
    what a session actor is handed) and :meth:`exists` asks the store."""

    def __new__(cls, storage_root: str, namespace: str, session: str) -> RemotePath:  # noqa: D102
        # Python 3.11 builds the parts in __new__, 3.12+ in __init__
        if sys.version_info >= (3, 12):
            return super().__new__(cls)
        return super().__new__(cls, "/", namespace, f"{session}{FILE_SUFFIX}")

    def __init__(self, storage_root: str, namespace: str, session: str) -> None:
        from thinkray.storage.objectstore import session_uri

        if sys.version_info >= (3, 12):
            super().__init__("/", namespace, f"{session}{FILE_SUFFIX}")
        self.storage_root, self.namespace, self.session = storage_root, namespace, session
        self.uri = session_uri(storage_root, namespace, session)

    def with_segments(self, *segments: Any) -> PosixPath:
        """Derived paths are plain local paths (Python 3.12+)."""
        return PosixPath(*segments)

    def exists(self, *args: Any, **kwargs: Any) -> bool:
        """Whether the session has a committed generation or a live lease."""
        from thinkray.storage.objectstore import remote_exists

        if "uri" not in self.__dict__:  # a path derived from this one (Python 3.11)
            return super().exists()
        return remote_exists(self.storage_root, self.namespace, self.session)

    def __str__(self) -> str:
        return self.__dict__.get("uri") or super().__str__()

    def __repr__(self) -> str:
        return f"RemotePath({str(self)!r})"


def is_remote_root(root: str | os.PathLike[str]) -> bool:
    """Whether ``root`` is an object-store URI rather than a local path."""
    from thinkray.storage.objectstore import is_uri

    return is_uri(root)


def normalize_root(root: str | os.PathLike[str]) -> str:
    """A local root made absolute (actors open files from their own working
    directory); a URI as given."""
    return str(root) if is_remote_root(root) else os.path.abspath(root)


def session_path(root: str | os.PathLike[str], namespace: str, name: str) -> Path:
    """The DuckDB file of actor ``name`` in ``namespace``: ``root/namespace/name.duckdb``
    (a :class:`RemotePath` under a URI root). Touches nothing on disk.

    Raises:
        InvalidInputError: ``namespace`` or ``name`` is not a safe identifier
            (:func:`validate_name`).
    """
    validate_name(namespace, "namespace")
    validate_name(name)
    if is_remote_root(root):
        return RemotePath(str(root), namespace, name)
    return Path(root) / namespace / f"{name}{FILE_SUFFIX}"


def ensure_root(root: str | os.PathLike[str], namespace: str | None = None) -> Path | str:
    """Create the root (and namespace folder) and prove it is writable, or raise a
    clear :class:`StorageRootError`. An object-store URI is probed instead (reachable,
    writable, honours conditional writes) and returned as given."""
    if namespace is not None:
        validate_name(namespace, "namespace")
    if is_remote_root(root):
        from thinkray.storage.objectstore import check_root

        check_root(str(root), namespace)
        return str(root)
    path = Path(root)
    if namespace is not None:
        path = path / namespace
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise StorageRootError(
            f"storage root {str(path)!r} is not usable: {exc.strerror or exc}. "
            "Point storage_root at a writable directory (on a cluster: storage every node "
            "shares)."
        ) from exc
    return path


def list_names(root: str | os.PathLike[str], namespace: str) -> list[str]:
    """The names that have a database file in ``namespace`` under ``root``, sorted;
    ``[]`` when the folder does not exist.

    Raises:
        InvalidInputError: ``namespace`` is not a safe identifier.
    """
    validate_name(namespace, "namespace")
    if is_remote_root(root):
        from thinkray.storage.objectstore import list_remote_names

        return list_remote_names(str(root), namespace)
    folder = Path(root) / namespace
    if not folder.is_dir():
        return []
    return sorted(p.name[: -len(FILE_SUFFIX)] for p in folder.glob(f"*{FILE_SUFFIX}"))
