"""Where an agent's database file lives under a storage root.

A session name becomes a file name, so it is validated before any filesystem call:
``root/<namespace>/<name>.duckdb``. Every node of a cluster must see the same root
(shared storage) for a session hibernated on one node to wake on another.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from thinkray.storage.errors import (  # re-exported: the errors live in thinkray.storage.errors
    StorageRootError as StorageRootError,
)
from thinkray.storage.types import InvalidInputError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
FILE_SUFFIX = ".duckdb"


def validate_name(name: str, what: str = "session name") -> str:
    """A safe identifier: letters, digits, ``_ . -``; starts alphanumeric; ≤ 128 chars;
    no ``..``. Anything else is refused before touching the filesystem."""
    if not isinstance(name, str) or not _NAME.match(name) or ".." in name:
        raise InvalidInputError(
            f"invalid {what} {name!r}: use 1-128 letters, digits, '_', '.', '-' "
            "starting with a letter or digit (it becomes a file name)"
        )
    return name


def session_path(root: str | os.PathLike[str], namespace: str, name: str) -> Path:
    """The DuckDB file of actor ``name`` in ``namespace``: ``root/namespace/name.duckdb``.
    Touches nothing on disk.

    Raises:
        InvalidInputError: ``namespace`` or ``name`` is not a safe identifier
            (:func:`validate_name`).
    """
    validate_name(namespace, "namespace")
    validate_name(name)
    return Path(root) / namespace / f"{name}{FILE_SUFFIX}"


def ensure_root(root: str | os.PathLike[str], namespace: str | None = None) -> Path:
    """Create the root (and namespace folder) and prove it is writable, or raise a
    clear :class:`StorageRootError`."""
    path = Path(root)
    if namespace is not None:
        validate_name(namespace, "namespace")
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
    folder = Path(root) / validate_name(namespace, "namespace")
    if not folder.is_dir():
        return []
    return sorted(p.name[: -len(FILE_SUFFIX)] for p in folder.glob(f"*{FILE_SUFFIX}"))
