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

import contextlib
import os
import re
import stat
import sys
import tempfile
from pathlib import Path, PosixPath
from typing import Any, Literal

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


# -- an orchestrator's other folders -----------------------------------------------------

SHARED_FOLDER = "_shared"
"""The folder of the orchestrators' shared-workspace (bridge) files in a namespace,
under a local root: ``<root>/<namespace>/_shared/<orchestrator>.duckdb``."""
REMOTE_SHARED_FOLDER = ".shared"
"""The same under an object-store root: the fenced session ``<namespace>/.shared/<name>``."""


def subagents_namespace(namespace: str, name: str) -> str:
    """The namespace of the sub-agents of orchestrator ``name`` in ``namespace``."""
    return f"{namespace}.{name}.subs"


# -- default folders ---------------------------------------------------------------------


def user_dir(kind: Literal["data", "cache"]) -> Path:
    """This user's base folder for thinkray's ``kind`` of files: ``$XDG_DATA_HOME`` /
    ``$XDG_CACHE_HOME`` (else ``~/.local/share``, ``~/.cache``) + ``/thinkray``, or,
    without a usable home, ``<tmp>/thinkray-<uid>-<kind>`` (never a shared, predictable
    ``/tmp`` folder another user could create first). Not created here: see
    :func:`private_dir`."""
    env, default = {
        "data": ("XDG_DATA_HOME", (".local", "share")),
        "cache": ("XDG_CACHE_HOME", (".cache",)),
    }[kind]
    base = os.environ.get(env, "")
    if os.path.isabs(base):
        return Path(base) / "thinkray"
    home = os.path.expanduser("~")
    if os.path.isabs(home) and home != "/" and os.access(home, os.W_OK):
        return Path(home, *default, "thinkray")
    # One folder right under the sticky tmp: no other user can rename or replace it.
    return Path(tempfile.gettempdir()) / f"thinkray-{os.geteuid()}-{kind}"


def private_dir(path: str | os.PathLike[str]) -> Path:
    """``path``, created (with its parents) readable and writable by this user only
    (0700), or refused when it already exists and is not this user's own: a symbolic
    link, something else than a folder, owned by another user, or writable by others
    (another user could plant or swap files in it). One that is this user's but
    readable by others is narrowed to 0700 (agents' files are private).

    Raises:
        StorageRootError: the folder is not this user's own, or cannot be created.
    """
    folder = Path(path)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)
        info = os.lstat(folder)
    except OSError as exc:
        raise StorageRootError(f"cannot create {str(folder)!r}: {exc.strerror or exc}") from exc
    problem = _foreign(info)
    if problem:
        raise StorageRootError(
            f"refusing {str(folder)!r}: it {problem}, so another user could read or replace "
            "the agents' files. Remove it, or point thinkray at a folder of your own "
            "(--root / THINKRAY_STORAGE_ROOT, THINKRAY_CACHE_DIR)."
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(folder, 0o700)
    return folder


def _foreign(info: os.stat_result) -> str:
    """Why a pre-existing folder is not this user's own ("" when it is)."""
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    if info.st_uid != os.geteuid():
        return f"is owned by another user (uid {info.st_uid})"
    if info.st_mode & 0o022:
        return f"is writable by other users (mode {stat.S_IMODE(info.st_mode):o})"
    return ""


def default_storage_root(purpose: str) -> Path:
    """The storage root used when none is given (``thinkray serve``, ``thinkray demo``):
    ``<user data dir>/<purpose>`` in this user's private folder (:func:`user_dir`,
    :func:`private_dir`)."""
    return private_dir(private_dir(user_dir("data")) / validate_name(purpose, "folder name"))


def sql_literal(text: str | os.PathLike[str]) -> str:
    """A path (or an option's value) as a SQL string literal, for DuckDB's ``ATTACH``,
    which takes no parameter."""
    return "'" + str(text).replace("'", "''") + "'"


def sync_folder(folder: Path) -> None:
    """Make the new name durable (the file's bytes already are)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
