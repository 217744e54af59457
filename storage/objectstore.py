"""Session files on object storage (``s3://bucket/prefix``, ``file:///path``), fenced.

With a storage root that is a URI, a live agent's DuckDB file sits in a node-local
cache; a hibernation uploads it as the session's next *generation*, and a wake on any
node downloads the newest one (or reuses the local copy when it is that generation,
byte for byte). Under ``<root>/<namespace>/<name>/``:

* ``gen-<n>.json``: the manifest of generation ``n`` (sha256, size, owner, data key),
  created with a conditional write (put-if-absent). Only one owner can create it, so
  two owners never both commit generation ``n``, and an owner whose base is stale
  (someone committed ``n`` after it downloaded ``n - 1``) is refused. Manifests are
  never deleted: deleting one would let a stale owner commit it.
* ``data-<n>-<token>.duckdb``: the database file of generation ``n``; only the last
  two generations' files are kept.
* ``log-<n>-<k>.msgpack``: the turn log of generation ``n``. At the end of every turn,
  before its ``finish`` chunk goes out, the owner ships what DuckDB wrote to its WAL
  since the previous entry as entry ``k`` (put-if-absent, msgpack ``{kind: "wal",
  offset, data}``): an acknowledged turn is in the store, and a crash loses at most
  the turns that were not acknowledged. A wake downloads generation ``n``, replays
  its log (DuckDB's own WAL replay) and commits the result as generation ``n + 1``.
  A log ends with a ``seal`` entry: only the owner that sealed generation ``n``'s log
  may commit ``n + 1``, and an owner whose next entry's key is taken by a seal has
  been fenced out (its turn fails instead of being acknowledged).
* ``lease-<epoch>.json``: who may write the session (owner id, a version renewed while
  live, the TTL; ``THINKRAY_LEASE_TTL`` seconds, 30 by default). The current lease is
  the highest epoch. Another node takes it over (put-if-absent of the next epoch, so
  one of two racers wins) once released, or once it has seen the same version for a
  TTL on its own monotonic clock (the DynamoDB lock client's rule: no wall clocks are
  compared). The lease only keeps two owners from both running; safety comes from the
  fence: a taker's wake seals the log and commits a generation at once, so whatever a
  paused or partitioned previous owner writes afterwards is refused.

A manifest, data object or log entry that is missing, empty or garbled fails the wake
with :class:`CorruptObjectError` naming the session and the object: a session never
comes back empty or older than what was acknowledged, and the local copy is kept.
Downloads are verified against the manifest's sha256: a corrupted object raises
:class:`ChecksumError` and never replaces the local copy. Uploads are retried; a
failure leaves the previous generation as it was.

Reads, listings, downloads and deletes go through ``pyarrow.fs``. Its filesystems
have no conditional write, so the put-if-absent of ``s3://`` goes through boto3
(``PutObject`` with ``If-None-Match: *``, which S3 and S3-compatible stores honour)
and that of ``file://`` through a hard link (atomic, fails if the name exists). The
other writes of ``s3://`` go through boto3 too: pyarrow's output stream always
completes a multipart upload, which some S3-compatible servers (moto) refuse for
small objects. A root checks at start that the store really
refuses a second put-if-absent; other schemes are refused with a clear message.

The endpoint of an S3-compatible store comes from the URI
(``s3://bucket/prefix?endpoint_override=http://127.0.0.1:9000``, pyarrow's own query
parameter) or from ``AWS_ENDPOINT_URL``; credentials and region from the usual AWS
variables and files.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl

import msgpack
from thinkray.storage.errors import StorageError, StorageRootError

log = logging.getLogger("thinkray.objectstore")

__all__ = [
    "ChecksumError",
    "CorruptObjectError",
    "LeaseHeldError",
    "LeaseLostError",
    "Manifest",
    "NotDurableError",
    "RemoteSession",
    "RootURI",
    "StaleOwnerError",
    "UploadError",
    "check_root",
    "delete_object",
    "delete_prefix",
    "live_lease_owner",
    "list_folders",
    "list_objects",
    "put_object_if_absent",
    "read_object",
    "write_object",
    "is_uri",
    "list_remote_names",
    "remote_exists",
    "root_of_session_uri",
    "session_uri",
]

WIDTH = 20  # zero-padded numbers sort as text
DEFAULT_LEASE_TTL = 30.0
UPLOAD_ATTEMPTS = 3
SUFFIX = ".duckdb"
T = TypeVar("T")


class LeaseHeldError(StorageError):
    """Another owner holds the session's lease (it is live elsewhere)."""

    def __init__(self, message: str, owner: str = "", expires_in: float = 0.0) -> None:
        super().__init__(message)
        self.owner = owner
        self.expires_in = expires_in


class LeaseLostError(StorageError):
    """This owner's lease was taken over (it expired): it may not commit any more."""


class StaleOwnerError(StorageError):
    """A commit refused: another owner committed that generation, or holds the lease."""


class UploadError(StorageError):
    """An upload failed after its retries; the previous generation is intact."""


class NotDurableError(StorageError):
    """A turn's changes could not be shipped to the store: the turn is not acknowledged."""


class CorruptObjectError(StorageError):
    """An object a wake needs (a manifest, a data object, a turn-log entry) is missing,
    empty or garbled. The wake fails; nothing falls back to an empty agent and the
    local copy is left as it was."""

    def __init__(self, message: str, session: str = "", key: str = "") -> None:
        super().__init__(message)
        self.session = session
        self.key = key


class ChecksumError(CorruptObjectError):
    """A downloaded session file does not match its manifest's sha256 (the local copy
    was left as it was)."""


def is_uri(root: str | os.PathLike[str]) -> bool:
    """Whether ``root`` is a URI (``scheme://...``) rather than a local path."""
    scheme, sep, _ = str(root).partition("://")
    return bool(sep) and len(scheme) > 1 and scheme.replace("+", "").replace("-", "").isalnum()


@dataclass(frozen=True)
class RootURI:
    """A parsed storage root: ``scheme``, ``path`` (``bucket/prefix`` or an absolute
    local path, no trailing slash) and the raw ``query`` string."""

    scheme: str
    path: str
    query: str = ""

    @classmethod
    def parse(cls, uri: str) -> RootURI:
        """Parse ``scheme://path?query``."""
        if not is_uri(uri):
            raise StorageRootError(f"storage root {uri!r} is not a URI (scheme://...)")
        scheme, _, rest = uri.partition("://")
        path, _, query = rest.partition("?")
        scheme = scheme.lower()
        path = path.rstrip("/")
        if scheme != "file":
            path = path.lstrip("/")
        if not path or (scheme == "file" and not path.startswith("/")):
            raise StorageRootError(
                f"storage root {uri!r}: give a bucket (s3://bucket/prefix) or an absolute "
                "path (file:///path)"
            )
        return cls(scheme, path, query)

    def child(self, *parts: str) -> str:
        """The URI of ``parts`` under this root (query kept at the end)."""
        text = f"{self.scheme}://{'/'.join((self.path, *parts))}"
        return f"{text}?{self.query}" if self.query else text

    def options(self) -> dict[str, str]:
        """The query parameters."""
        return dict(parse_qsl(self.query))

    def __str__(self) -> str:
        return self.child()


def session_uri(root: str, namespace: str, name: str) -> str:
    """``root/namespace/name.duckdb`` as a URI (what a session actor is handed)."""
    return RootURI.parse(root).child(namespace, f"{name}{SUFFIX}")


def root_of_session_uri(uri: str, namespace: str, name: str) -> str:
    """The storage root of a :func:`session_uri`."""
    parsed = RootURI.parse(uri)
    tail = f"/{namespace}/{name}{SUFFIX}"
    if not parsed.path.endswith(tail):
        raise StorageRootError(f"{uri!r} is not the file of {namespace}/{name}")
    return str(RootURI(parsed.scheme, parsed.path[: -len(tail)], parsed.query))


# -- backends ---------------------------------------------------------------------------


class _Backend:
    """Objects by key under one root: data through ``pyarrow.fs``, put-if-absent by
    scheme."""

    def __init__(self, root: RootURI) -> None:
        try:
            import pyarrow.fs as pafs  # type: ignore[import-untyped]
        except ImportError as exc:  # pragma: no cover - pyarrow is a dependency
            raise StorageRootError(
                "a URI storage root needs pyarrow (pip install pyarrow)"
            ) from exc
        self.root = root
        self.pafs = pafs
        self.fs: Any
        self.local = root.scheme == "file"
        self._s3: Any = None
        opts = root.options()
        if self.local:
            self.fs = pafs.LocalFileSystem()
        elif root.scheme == "s3":
            endpoint = opts.get("endpoint_override") or os.environ.get(
                "AWS_ENDPOINT_URL_S3", os.environ.get("AWS_ENDPOINT_URL", "")
            )
            scheme = opts.get("scheme", "https")
            if "://" in endpoint:
                scheme, _, endpoint = endpoint.partition("://")
            region = opts.get("region") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
            self.endpoint = f"{scheme}://{endpoint}" if endpoint else None
            self.region = region
            self.fs = pafs.S3FileSystem(
                endpoint_override=endpoint or None,
                scheme=scheme,
                region=region,
                connect_timeout=3,
                request_timeout=20,
                retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=2),
            )
        else:
            raise StorageRootError(
                f"storage root {root}: scheme {root.scheme!r} has no conditional write "
                "(put-if-absent) thinkray can use for fencing; use s3:// (S3 or an "
                "S3-compatible store) or file://"
            )

    def _path(self, key: str) -> str:
        return f"{self.root.path}/{key}" if key else self.root.path

    def _client(self) -> Any:
        if self._s3 is None:
            try:
                import boto3  # type: ignore[import-untyped]
                from botocore.config import Config  # type: ignore[import-untyped]
            except ImportError as exc:
                raise StorageRootError(
                    "an s3:// storage root needs boto3 for its conditional writes "
                    "(pip install boto3)"
                ) from exc
            config = Config(
                connect_timeout=3, read_timeout=20, retries={"max_attempts": 2, "mode": "standard"}
            )
            self._s3 = boto3.client(
                "s3", endpoint_url=self.endpoint, region_name=self.region, config=config
            )
        return self._s3

    def _bucket_key(self, key: str) -> tuple[str, str]:
        bucket, _, prefix = self.root.path.partition("/")
        return bucket, f"{prefix}/{key}" if prefix else key

    def read(self, key: str) -> bytes | None:
        try:
            with self.fs.open_input_stream(self._path(key)) as f:
                return bytes(f.read())
        except FileNotFoundError:
            return None

    def write(self, key: str, data: bytes) -> None:
        if self.local:
            path = Path(self._path(key))
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
            tmp.write_bytes(data)
            os.replace(tmp, path)
            return
        bucket, object_key = self._bucket_key(key)
        self._client().put_object(Bucket=bucket, Key=object_key, Body=data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` with ``data`` unless it exists (atomic); False if it did."""
        if self.local:
            path = Path(self._path(key))
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
            tmp.write_bytes(data)
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            finally:
                tmp.unlink()
            return True
        from botocore.exceptions import ClientError  # type: ignore[import-untyped]

        bucket, object_key = self._bucket_key(key)
        try:
            self._client().put_object(Bucket=bucket, Key=object_key, Body=data, IfNoneMatch="*")
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (
                409,
                412,
            ):
                return False
            raise
        return True

    def children(self, key: str) -> list[tuple[str, bool]]:
        """``(base name, is a directory)`` of what is directly under ``key``."""
        selector = self.pafs.FileSelector(self._path(key), allow_not_found=True)
        try:
            infos = self.fs.get_file_info(selector)
        except FileNotFoundError:
            # pyarrow's local listing checks whether a missing directory exists only
            # after listing it failed: created in between (another owner's first write
            # into a new session's folder), it raises. Listed again, it is there.
            infos = self.fs.get_file_info(selector)
        return [(i.base_name, i.type == self.pafs.FileType.Directory) for i in infos]

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(self._path(key))

    def upload(self, local: Path, key: str) -> None:
        if not self.local:
            bucket, object_key = self._bucket_key(key)
            self._client().upload_file(str(local), bucket, object_key)
            return
        dest = Path(self._path(key))
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(local, "rb") as src, self.fs.open_output_stream(self._path(key)) as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)

    def download(self, key: str, local: Path) -> str:
        """Copy ``key`` to ``local``; returns the sha256 of what was written."""
        digest = hashlib.sha256()
        with self.fs.open_input_stream(self._path(key)) as src, open(local, "wb") as out:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        return digest.hexdigest()


_BACKENDS: dict[str, _Backend] = {}
_BACKENDS_LOCK = threading.Lock()


def _backend(root: str) -> _Backend:
    with _BACKENDS_LOCK:
        backend = _BACKENDS.get(root)
        if backend is None:
            backend = _BACKENDS[root] = _Backend(RootURI.parse(root))
        return backend


def check_root(root: str, namespace: str | None = None) -> None:
    """Prove the store is reachable, writable and honours put-if-absent, or raise a
    clear :class:`StorageRootError`."""
    probe = f"{namespace}/.probe-{uuid.uuid4().hex}" if namespace else f".probe-{uuid.uuid4().hex}"
    try:
        backend = _backend(root)
        if not backend.put_if_absent(probe, b"1"):
            raise StorageRootError(f"storage root {root!r}: a fresh probe object already exists")
        try:
            if backend.put_if_absent(probe, b"2"):
                raise StorageRootError(
                    f"storage root {root!r}: the store ignores conditional writes "
                    "(PutObject If-None-Match: *); fencing needs them"
                )
        finally:
            backend.delete(probe)
    except StorageRootError:
        raise
    except Exception as exc:
        raise StorageRootError(
            f"storage root {root!r} is not usable: {type(exc).__name__}: {exc}. Check the "
            "bucket, the endpoint (endpoint_override= or AWS_ENDPOINT_URL) and credentials."
        ) from exc


@dataclass
class _Listing:
    """What is under one session's folder: generations, lease epochs, data object
    names, and the turn-log entry numbers of each generation."""

    gens: list[int]
    leases: list[int]
    data: list[str]
    logs: dict[int, list[int]]


def _listing(backend: _Backend, prefix: str) -> _Listing:
    out = _Listing([], [], [], {})
    for base, _is_dir in backend.children(prefix):
        stem = base.split(".", 1)[0]
        try:
            if base.startswith("gen-") and base.endswith(".json"):
                out.gens.append(int(stem[4:]))
            elif base.startswith("lease-") and base.endswith(".json"):
                out.leases.append(int(stem[6:]))
            elif base.startswith("data-"):
                out.data.append(base)
            elif base.startswith("log-") and base.endswith(".msgpack"):
                gen, k = stem[4:].split("-")
                out.logs.setdefault(int(gen), []).append(int(k))
        except ValueError:
            continue
    out.gens.sort()
    out.leases.sort()
    for numbers in out.logs.values():
        numbers.sort()
    return out


def _entries(backend: _Backend, prefix: str) -> tuple[list[int], list[int], list[str]]:
    """Generations, lease epochs and data object names under ``prefix``."""
    listing = _listing(backend, prefix)
    return listing.gens, listing.leases, listing.data


# -- small objects by key (the owner registry and the fleet index of a URI root) -------


def read_object(root: str, key: str) -> bytes | None:
    """The bytes of ``key`` under ``root`` (None: absent)."""
    return _backend(root).read(key)


def write_object(root: str, key: str, data: bytes) -> None:
    """Create or replace ``key`` whole (readers see the old or the new object)."""
    _backend(root).write(key, data)


def put_object_if_absent(root: str, key: str, data: bytes) -> bool:
    """Create ``key`` unless it exists (atomic, the store's conditional write); False
    when it existed."""
    return _backend(root).put_if_absent(key, data)


def delete_object(root: str, key: str) -> None:
    """Delete ``key`` (nothing if absent)."""
    _backend(root).delete(key)


def list_objects(root: str, key: str, *, recursive: bool = False) -> list[tuple[str, int]]:
    """``(path relative to key, size)`` of the objects under ``key`` (recursively or
    directly under it; folders left out); ``[]`` when there is nothing."""
    backend = _backend(root)
    base = backend._path(key).rstrip("/")
    selector = backend.pafs.FileSelector(base, allow_not_found=True, recursive=recursive)
    out = []
    for info in backend.fs.get_file_info(selector):
        if info.type != backend.pafs.FileType.File:
            continue
        path = info.path
        rel = path[len(base) + 1 :] if path.startswith(base + "/") else info.base_name
        out.append((rel, int(info.size or 0)))
    return out


def list_folders(root: str, key: str) -> list[str]:
    """The names of the folders (common prefixes) directly under ``key``, sorted."""
    return sorted(base for base, is_dir in _backend(root).children(key) if is_dir)


def remote_exists(root: str, namespace: str, name: str) -> bool:
    """Whether session ``name`` has a committed generation or a lease."""
    gens, leases, _ = _entries(_backend(root), f"{namespace}/{name}")
    return bool(gens or leases)


def live_lease_owner(root: str, namespace: str, name: str) -> str | None:
    """The owner whose lease on session ``name`` may still be live (None: nobody's).

    Liveness is judged as a takeover judges it (:meth:`RemoteSession.acquire`): a lease
    not released counts as live until this node has seen it unrenewed for its TTL on its
    own monotonic clock, so asking again after the TTL sees a dead owner's lease lapse.
    """
    session = RemoteSession(root, namespace, name)
    current = session.lease()
    if current is None or current.released:
        return None
    return current.owner if session._waited(current) < current.ttl else None


def delete_prefix(root: str, key: str) -> list[str]:
    """Delete every object under ``key`` (recursively), leaving no folder behind (an
    empty folder would still list as a session name); the keys of the objects."""
    backend = _backend(root)
    if backend.local:
        removed = [f"{key}/{rel}" for rel, _size in list_objects(root, key, recursive=True)]
        with contextlib.suppress(FileNotFoundError):
            backend.fs.delete_dir(backend._path(key))
        return removed
    # Through boto3: pyarrow's delete leaves a marker object for the parent "folder".
    bucket, prefix = backend._bucket_key(key)
    client = backend._client()
    removed = []
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=f"{prefix}/"
    ):
        for item in page.get("Contents", []):
            client.delete_object(Bucket=bucket, Key=item["Key"])
            removed.append(f"{key}/{item['Key'][len(prefix) + 1 :]}")
    return removed


def list_remote_names(root: str, namespace: str) -> list[str]:
    """The session names under ``root/namespace``, sorted."""
    return sorted(
        base
        for base, is_dir in _backend(root).children(namespace)
        if is_dir and not base.startswith(".")
    )


# -- one session ------------------------------------------------------------------------


@dataclass
class Manifest:
    """A committed generation: its number, the data object, checksum and writer.
    ``fence``: written by a takeover (its data is the base's, folded with the base's
    turn log if it had one)."""

    generation: int
    sha256: str
    size: int
    owner: str
    data: str
    committed_at: float
    fence: bool = False


@dataclass
class Lease:
    """Who may write a session. ``version`` changes at every renewal: another node
    judges the lease lapsed once it has seen the same ``(epoch, version)`` for ``ttl``
    seconds of its own monotonic clock (no wall clocks are compared)."""

    epoch: int
    owner: str
    version: str = ""
    ttl: float = DEFAULT_LEASE_TTL
    released: bool = False


def _sha256(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _stat(path: Path) -> tuple[int, int, int] | None:
    """What changes when DuckDB writes the main file (a checkpoint)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def _wal(path: Path) -> Path:
    return path.with_name(path.name + ".wal")


def _fold(path: Path) -> None:
    """Replay ``path``'s WAL into it (DuckDB's open) and checkpoint (its close)."""
    from thinkray.storage.db import Database

    Database(path).close()


def default_cache_dir() -> Path:
    """Where live session files sit on this node: ``THINKRAY_CACHE_DIR``, else this
    user's private cache folder (``$XDG_CACHE_HOME/thinkray/objects``, created 0700;
    one that is a link, another user's or writable by others is refused with
    :class:`StorageRootError`: it would hand the agents' files to that user)."""
    configured = os.environ.get("THINKRAY_CACHE_DIR")
    if configured:
        return Path(configured)
    from thinkray.storage.layout import private_dir, user_dir

    return private_dir(private_dir(user_dir("cache")) / "objects")


def _retry(what: str, fn: Callable[[], T], attempts: int = UPLOAD_ATTEMPTS) -> T:
    delay = 0.2
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except (StaleOwnerError, LeaseLostError, CorruptObjectError):
            raise
        except Exception as exc:
            if attempt == attempts:
                raise UploadError(f"{what} failed after {attempts} attempts: {exc}") from exc
            log.warning("%s failed (attempt %d/%d): %s", what, attempt, attempts, exc)
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")  # pragma: no cover


class RemoteSession:
    """One session's file on an object-store root, as seen by one owner.

    ``acquire`` (the lease), ``fetch`` (download or reuse ``local_path``, replay the
    turn log, fence), ``renew`` while live, ``take_delta`` + ``append`` at the end of
    every turn (or ``snapshot`` + ``commit`` when ``needs_commit``), ``commit`` (upload
    the closed file as the next generation), ``release``. ``clock`` is the monotonic
    clock lease expiry is judged on (injectable for tests).
    """

    def __init__(
        self,
        root: str,
        namespace: str,
        name: str,
        *,
        owner: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        lease_ttl: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self.backend = _backend(root)
        self.namespace, self.name = namespace, name
        self.prefix = f"{namespace}/{name}"
        key = hashlib.sha256(root.encode()).hexdigest()[:16]
        base = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.local_path = base / key / namespace / f"{name}{SUFFIX}"
        self.owner = owner or f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        self.lease_ttl = float(
            lease_ttl or os.environ.get("THINKRAY_LEASE_TTL") or DEFAULT_LEASE_TTL
        )
        self.clock = clock
        self.lease_epoch: int | None = None
        self.base: Manifest | None = None
        # The turn log of the base generation: entries shipped, WAL bytes they cover,
        # and the main file as it was when the log started (a checkpoint changes it,
        # and then only a whole-file commit can carry the changes).
        self.log_seq = 0
        self.wal_offset = 0
        self._baseline: tuple[int, int, int] | None = None
        self._unlogged = False  # checkpointed since the base: the next point commits

    # -- reading -----------------------------------------------------------------------

    def _gen_key(self, n: int) -> str:
        return f"{self.prefix}/gen-{n:0{WIDTH}d}.json"

    def _lease_key(self, n: int) -> str:
        return f"{self.prefix}/lease-{n:0{WIDTH}d}.json"

    def _log_key(self, n: int, k: int) -> str:
        return f"{self.prefix}/log-{n:0{WIDTH}d}-{k:0{WIDTH}d}.msgpack"

    def _corrupt(self, key: str, what: str) -> CorruptObjectError:
        return CorruptObjectError(
            f"session {self.prefix}: object {key} {what}; refusing to wake it (restore the "
            "object, or delete the session's newer generation to roll back)",
            self.prefix,
            key,
        )

    def latest(self) -> Manifest | None:
        """The newest committed generation, or None (no generation).

        Raises:
            CorruptObjectError: the newest manifest is missing, empty or garbled.
        """
        gens, _, _ = _entries(self.backend, self.prefix)
        if not gens:
            return None
        key = self._gen_key(gens[-1])
        raw = self.backend.read(key)
        if not raw:
            raise self._corrupt(key, "is missing" if raw is None else "is empty (0 bytes)")
        try:
            fields = json.loads(raw)
            manifest = Manifest(**fields)
        except (ValueError, TypeError) as exc:
            raise self._corrupt(key, f"is garbled ({type(exc).__name__}: {exc})") from exc
        if manifest.generation != gens[-1] or not manifest.data or len(manifest.sha256) != 64:
            raise self._corrupt(key, "is garbled (fields do not match its name)")
        return manifest

    def lease(self) -> Lease | None:
        """The current (highest-epoch) lease, or None."""
        _, leases, _ = _entries(self.backend, self.prefix)
        return self._read_lease(leases[-1]) if leases else None

    def _read_lease(self, epoch: int) -> Lease | None:
        raw = self.backend.read(self._lease_key(epoch))
        if raw is None:
            return None
        try:
            fields = json.loads(raw)
            known = {k: fields[k] for k in ("owner", "version", "ttl", "released") if k in fields}
            return Lease(epoch=epoch, **known)
        except (ValueError, TypeError, AttributeError):
            # Unreadable: held by nobody we know; it lapses like any other.
            return Lease(epoch, "?", f"garbled-{len(raw)}", self.lease_ttl)

    # -- the lease ---------------------------------------------------------------------

    def _lease_body(self, epoch: int, released: bool = False) -> bytes:
        lease = Lease(epoch, self.owner, uuid.uuid4().hex, self.lease_ttl, released)
        return json.dumps(asdict(lease)).encode()

    def _seen_path(self) -> Path:
        return self.local_path.with_name(f".{self.local_path.name}.lease-seen")

    def _waited(self, lease: Lease) -> float:
        """Seconds of our clock since this node first saw ``lease`` as it is now (same
        epoch, same version): 0 the first time. Kept in the node's cache folder so
        every process of the node (the monotonic clock is per machine) counts from the
        first sighting."""
        now = self.clock()
        seen = self._seen_path()
        ident = [lease.epoch, lease.version]
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            record = json.loads(seen.read_text())
            if record["lease"] == ident and float(record["at"]) <= now:
                return now - float(record["at"])
        seen.parent.mkdir(parents=True, exist_ok=True)
        seen.write_text(json.dumps({"lease": ident, "at": now}))
        return 0.0

    def acquire(self) -> None:
        """Take the session's lease (or renew ours). A lease held by another owner is
        taken over once this node has seen it unchanged (not renewed) for its TTL on
        its own monotonic clock; the takeover's :meth:`fetch` then fences the old
        owner out.

        Raises:
            LeaseHeldError: another owner holds a live lease, or won the race for it.
        """
        _, leases, _ = _entries(self.backend, self.prefix)
        current = self._read_lease(leases[-1]) if leases else None
        if current is not None and current.owner == self.owner and not current.released:
            self.lease_epoch = current.epoch
            self.renew()
            return
        if current is not None and not current.released:
            waited = self._waited(current)
            if waited < current.ttl:
                left = current.ttl - waited
                raise LeaseHeldError(
                    f"session {self.prefix} is held by {current.owner}: it lapses if not "
                    f"renewed for {left:.1f} s more",
                    current.owner,
                    left,
                )
        epoch = (leases[-1] if leases else 0) + 1
        if not self.backend.put_if_absent(self._lease_key(epoch), self._lease_body(epoch)):
            winner = self._read_lease(epoch)
            raise LeaseHeldError(
                f"session {self.prefix}: another owner ({winner.owner if winner else '?'}) "
                "took the lease first",
                winner.owner if winner else "",
                self.lease_ttl,
            )
        self.lease_epoch = epoch
        self._seen_path().unlink(missing_ok=True)
        for old in leases:  # nobody creates a lower epoch again: safe to drop
            with contextlib.suppress(Exception):
                self.backend.delete(self._lease_key(old))

    def _check_not_superseded(self) -> None:
        _, leases, _ = _entries(self.backend, self.prefix)
        assert self.lease_epoch is not None
        if leases and leases[-1] > self.lease_epoch:
            epoch = self.lease_epoch
            self.lease_epoch = None
            raise LeaseLostError(
                f"session {self.prefix}: lease {epoch} of {self.owner} was taken over "
                f"(epoch {leases[-1]})"
            )

    def renew(self) -> None:
        """Renew our lease (a new version: whoever watches it starts counting again).
        A renewal that comes too late to stop a takeover is harmless: the taker's
        fence refuses our writes.

        Raises:
            LeaseLostError: another owner took the lease over.
        """
        if self.lease_epoch is None:
            raise LeaseLostError(f"session {self.prefix}: {self.owner} holds no lease")
        self._check_not_superseded()
        current = self._read_lease(self.lease_epoch)
        if current is None or current.owner != self.owner or current.released:
            self.lease_epoch = None
            raise LeaseLostError(f"session {self.prefix}: the lease of {self.owner} is gone")
        self.backend.write(self._lease_key(self.lease_epoch), self._lease_body(self.lease_epoch))
        self._check_not_superseded()  # a takeover raced the renewal

    def release(self) -> None:
        """Give the lease up (best effort: an unreleased lease lapses anyway)."""
        epoch, self.lease_epoch = self.lease_epoch, None
        if epoch is None:
            return
        try:
            _, leases, _ = _entries(self.backend, self.prefix)
            if leases and leases[-1] == epoch:
                self.backend.write(self._lease_key(epoch), self._lease_body(epoch, released=True))
        except Exception as exc:
            log.warning("releasing the lease of %s failed (it lapses): %s", self.prefix, exc)

    @property
    def held(self) -> bool:
        """Whether this owner believes it holds the lease."""
        return self.lease_epoch is not None

    # -- the turn log ------------------------------------------------------------------

    def _read_entry(self, generation: int, k: int) -> dict[str, Any]:
        key = self._log_key(generation, k)
        raw = self.backend.read(key)
        if not raw:
            raise self._corrupt(key, "is missing" if raw is None else "is empty (0 bytes)")
        try:
            entry = msgpack.unpackb(raw, raw=False)
        except Exception as exc:
            raise self._corrupt(key, f"is garbled ({type(exc).__name__})") from exc
        if not isinstance(entry, dict) or entry.get("kind") not in ("wal", "seal"):
            raise self._corrupt(key, "is garbled (not a turn-log entry)")
        if entry["kind"] == "wal" and not isinstance(entry.get("data"), bytes):
            raise self._corrupt(key, "is garbled (no WAL bytes)")
        return entry

    def _chain(self, generation: int) -> tuple[list[dict[str, Any]], str | None]:
        """The turn-log entries of ``generation`` in order, and who sealed the log
        (None: still open)."""
        numbers = _listing(self.backend, self.prefix).logs.get(generation, [])
        if numbers != list(range(1, len(numbers) + 1)):
            missing = sorted(set(range(1, max(numbers) + 1)) - set(numbers))
            raise self._corrupt(self._log_key(generation, missing[0]), "is missing")
        entries: list[dict[str, Any]] = []
        offset = 0
        for k in numbers:
            entry = self._read_entry(generation, k)
            if entry["kind"] == "seal":
                return entries, str(entry.get("owner", "?"))
            if entry.get("offset") != offset:
                raise self._corrupt(self._log_key(generation, k), "does not follow its previous")
            offset += len(entry["data"])
            entries.append(entry)
        return entries, None

    def _seal(self, generation: int) -> tuple[list[dict[str, Any]], str]:
        """Close ``generation``'s turn log (its next key, put-if-absent): no owner
        appends to it again. Returns its entries and who sealed it (maybe not us)."""
        for _ in range(16):
            entries, sealer = self._chain(generation)
            if sealer is not None:
                return entries, sealer
            body = msgpack.packb({"kind": "seal", "owner": self.owner}, use_bin_type=True)
            if self.backend.put_if_absent(self._log_key(generation, len(entries) + 1), body):
                return entries, self.owner
        raise StaleOwnerError(f"session {self.prefix}: its turn log kept growing while sealed")

    def _reset_log(self) -> None:
        self.log_seq = 0
        self.wal_offset = 0
        self._baseline = _stat(self.local_path)
        self._unlogged = False

    def needs_commit(self) -> bool:
        """Whether the next durable point must commit the whole file (no generation
        yet, a checkpoint changed the file since the log started, or an earlier commit
        did not finish) instead of appending to the turn log."""
        if self.base is None or self._unlogged or _stat(self.local_path) != self._baseline:
            return True
        wal = _stat(_wal(self.local_path))
        return (wal[0] if wal else 0) < self.wal_offset

    def take_delta(self) -> tuple[int, bytes]:
        """``(offset, bytes)`` of the WAL written since the last shipped entry. Call it
        on the thread that writes the database, between writes: then the bytes end at
        a commit boundary (a torn tail would still be dropped by DuckDB's replay)."""
        try:
            with open(_wal(self.local_path), "rb") as f:
                f.seek(self.wal_offset)
                return self.wal_offset, f.read()
        except FileNotFoundError:
            return self.wal_offset, b""

    def append(self, offset: int, data: bytes) -> None:
        """Ship one turn-log entry (WAL bytes from ``offset``) as the next key of the
        base generation's log, put-if-absent.

        Raises:
            StaleOwnerError: the log was sealed: another owner took over (fenced).
            UploadError: the store could not be reached after retries (nothing shipped).
        """
        if offset != self.wal_offset:
            raise ValueError(f"entry at {offset}, log at {self.wal_offset}")
        generation = self.base.generation if self.base else 0
        k = self.log_seq + 1
        key = self._log_key(generation, k)
        body = msgpack.packb(
            {"kind": "wal", "owner": self.owner, "offset": offset, "data": data},
            use_bin_type=True,
        )

        def put() -> bool:
            if self.backend.put_if_absent(key, body):
                return True
            return self.backend.read(key) == body  # ours: an earlier response was lost

        if not _retry(f"shipping {key}", put):
            raise StaleOwnerError(
                f"session {self.prefix}: its turn log {generation} was sealed by a "
                f"takeover; {self.owner} is fenced out"
            )
        self.log_seq = k
        self.wal_offset = offset + len(data)

    def snapshot(self) -> Path:
        """Copy the local file, just checkpointed by its writer, for :meth:`commit`
        while the agent stays live (call it on the writer's thread right after the
        checkpoint). Later writes log against the copy's generation."""
        tmp = self.local_path.with_name(f".{self.local_path.name}.{uuid.uuid4().hex[:8]}")
        shutil.copyfile(self.local_path, tmp)
        self._baseline = _stat(self.local_path)
        wal = _stat(_wal(self.local_path))
        self.wal_offset = wal[0] if wal else 0
        self._unlogged = True  # until the commit of the copy succeeds
        return tmp

    def prepare_ship(self, checkpoint: Callable[[], None]) -> Callable[[], None] | None:
        """The end of a turn: on the thread that writes the database (between writes),
        take what must be shipped and return the blocking upload (run it anywhere;
        None: nothing to ship). Normally the WAL written since the last entry, as the
        next turn-log entry; when :meth:`needs_commit`, ``checkpoint()`` (the writer's
        CHECKPOINT) and the whole file as the next generation.

        The upload raises :class:`StaleOwnerError` (fenced out by a takeover) or
        :class:`UploadError` (nothing shipped; the next point ships it with its own)."""
        if self.needs_commit():
            checkpoint()
            snapshot = self.snapshot()

            def commit() -> None:
                try:
                    self.commit(snapshot)
                finally:
                    snapshot.unlink(missing_ok=True)

            return commit
        offset, data = self.take_delta()
        if not data:
            return None
        return lambda: self.append(offset, data)

    # -- the file ----------------------------------------------------------------------

    def _meta_path(self) -> Path:
        return self.local_path.with_name(self.local_path.name + ".gen")

    def _drop_local(self) -> None:
        for path in (self.local_path, _wal(self.local_path)):
            path.unlink(missing_ok=True)
        self._meta_path().unlink(missing_ok=True)

    def fetch(self) -> bool:
        """Make ``local_path`` the session's newest durable state and fence every
        earlier owner out: seal the newest generation's turn log, replay it over that
        generation's file (the local copy if it is that generation byte for byte, else
        a verified download) and commit the result as a fence generation. Returns
        whether the session has a generation (False: a new session, no local file).

        Raises:
            CorruptObjectError: a manifest, data object or log entry is missing, empty
                or garbled (:class:`ChecksumError`: a download does not match); the
                local copy is left as it was.
            StaleOwnerError: another owner committed the fence generation first.
        """
        manifest = self.latest()
        self.local_path.parent.mkdir(parents=True, exist_ok=True)
        if manifest is None:
            # Nothing was ever committed, so nothing was acknowledged: owners race for
            # generation 1 (put-if-absent) at their first durable point.
            self.base = None
            self._drop_local()  # an uncommitted leftover of an owner that died
            self._reset_log()
            return False
        generation = manifest.generation
        entries, _sealer = _retry(
            f"sealing the turn log of {self.prefix}", lambda: self._seal(generation)
        )
        tmp = self.local_path.with_name(f".{self.local_path.name}.{uuid.uuid4().hex[:8]}")
        try:
            source = self._verified_copy(manifest, tmp, need_copy=bool(entries))
            if entries:
                _wal(tmp).write_bytes(b"".join(e["data"] for e in entries))
                _fold(tmp)
            fence = self._put_generation(
                generation + 1, source, reuse=None if entries else manifest, fence=True
            )
            if source == tmp:
                _wal(self.local_path).unlink(missing_ok=True)
                os.replace(tmp, self.local_path)
        finally:
            tmp.unlink(missing_ok=True)
            _wal(tmp).unlink(missing_ok=True)
        self._meta_path().write_text(json.dumps(asdict(fence)))
        self.base = fence
        self._reset_log()
        self._collect(fence.generation)
        return True

    def _verified_copy(self, manifest: Manifest, tmp: Path, need_copy: bool) -> Path:
        """The local copy when it is ``manifest``'s file (copied to ``tmp`` if
        ``need_copy``), else ``tmp`` holding the verified download."""
        if self._local_matches(manifest):
            if not need_copy:
                return self.local_path
            shutil.copyfile(self.local_path, tmp)
            return tmp
        try:
            digest = self.backend.download(manifest.data, tmp)
        except FileNotFoundError as exc:
            raise self._corrupt(manifest.data, "is missing (its manifest names it)") from exc
        if digest != manifest.sha256:
            raise ChecksumError(
                f"session {self.prefix} generation {manifest.generation}: the downloaded "
                f"file's sha256 {digest[:12]}… is not the manifest's "
                f"{manifest.sha256[:12]}…; refusing it",
                self.prefix,
                manifest.data,
            )
        return tmp

    def _local_matches(self, manifest: Manifest) -> bool:
        meta = self._meta_path()
        if not self.local_path.exists() or not meta.exists():
            return False
        if _wal(self.local_path).exists():
            return False
        try:
            if json.loads(meta.read_text()).get("sha256") != manifest.sha256:
                return False
        except ValueError:
            return False
        return _sha256(self.local_path)[0] == manifest.sha256

    def _put_generation(
        self, generation: int, source: Path, reuse: Manifest | None = None, fence: bool = False
    ) -> Manifest:
        """Upload ``source`` (or reuse ``reuse``'s data object) and create generation
        ``generation``'s manifest, put-if-absent.

        Raises:
            StaleOwnerError: that generation exists already (another owner's).
            UploadError: the store could not be reached after retries.
        """
        if reuse is not None:
            digest, size, data_key = reuse.sha256, reuse.size, reuse.data
        else:
            digest, size = _sha256(source)
            data_key = f"{self.prefix}/data-{generation:0{WIDTH}d}-{uuid.uuid4().hex[:8]}{SUFFIX}"
            _retry(f"uploading {self.prefix}", lambda: self.backend.upload(source, data_key))
        manifest = Manifest(generation, digest, size, self.owner, data_key, time.time(), fence)
        body = json.dumps(asdict(manifest)).encode()

        def put() -> bool:
            if self.backend.put_if_absent(self._gen_key(generation), body):
                return True
            # Ours if an earlier attempt's response was lost after the write.
            raw = self.backend.read(self._gen_key(generation))
            return raw == body

        if not _retry(f"committing {self.prefix} generation {generation}", put):
            if reuse is None:
                with contextlib.suppress(Exception):
                    self.backend.delete(data_key)
            raise StaleOwnerError(
                f"session {self.prefix}: generation {generation} was committed by another "
                f"owner; {self.owner}'s is refused"
            )
        return manifest

    def commit(self, source: Path | None = None) -> Manifest:
        """Upload the (closed, checkpointed) local file, or ``source`` (a
        :meth:`snapshot`), as the next generation: seal the base's turn log (only the
        owner that seals it may commit the next generation), then upload and create
        the manifest.

        Raises:
            StaleOwnerError: the lease is lost, another owner sealed the log (a
                takeover) or that generation exists already.
            UploadError: the upload failed after its retries (nothing was committed).
        """
        try:
            _retry(f"renewing the lease of {self.prefix}", self.renew)
        except LeaseLostError as exc:
            raise StaleOwnerError(str(exc)) from exc
        base = self.base.generation if self.base else 0
        entries: list[dict[str, Any]] = []
        sealer = self.owner
        if self.base is not None:
            entries, sealer = _retry(
                f"sealing the turn log of {self.prefix}", lambda: self._seal(base)
            )
        if sealer != self.owner or len(entries) != self.log_seq:
            raise StaleOwnerError(
                f"session {self.prefix}: its turn log {base} was sealed by {sealer}; "
                f"{self.owner}'s commit is refused"
            )
        manifest = self._put_generation(base + 1, source or self.local_path)
        self.base = manifest
        if source is None:
            self._meta_path().write_text(json.dumps(asdict(manifest)))
        self.log_seq = 0
        self._unlogged = False
        self._collect(base + 1)
        return manifest

    def _collect(self, generation: int) -> None:
        """Drop data objects older than the previous generation, and turn logs older
        than the previous generation's (best effort)."""
        try:
            listing = _listing(self.backend, self.prefix)
            keep = self.base.data if self.base else ""
            for base in listing.data:
                with contextlib.suppress(ValueError):
                    old = int(base.split("-")[1]) < generation - 1
                    if old and f"{self.prefix}/{base}" != keep:
                        self.backend.delete(f"{self.prefix}/{base}")
            for gen, numbers in listing.logs.items():
                if gen < generation - 1:
                    for k in numbers:
                        self.backend.delete(self._log_key(gen, k))
        except Exception as exc:
            log.warning("collecting old generations of %s failed: %s", self.prefix, exc)
