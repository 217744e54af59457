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
* ``lease-<epoch>.json``: who may write the session (owner id, wall-clock expiry).
  The current lease is the highest epoch. Taking a lease over (absent, released or
  expired) is a put-if-absent of the next epoch, so one of two racers wins; the
  holder renews it while live and releases it at hibernation; the lease of a dead
  owner expires after its TTL (``THINKRAY_LEASE_TTL`` seconds, 30 by default) instead
  of blocking forever. Clocks of the nodes must agree to well within the TTL.

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
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from thinkray.storage.errors import StorageError, StorageRootError

log = logging.getLogger("thinkray.objectstore")

__all__ = [
    "ChecksumError",
    "LeaseHeldError",
    "LeaseLostError",
    "Manifest",
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


class ChecksumError(StorageError):
    """A downloaded session file does not match its manifest's sha256 (the local copy
    was left as it was)."""


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


def _entries(backend: _Backend, prefix: str) -> tuple[list[int], list[int], list[str]]:
    """Generations, lease epochs and data object names under ``prefix``."""
    gens: list[int] = []
    leases: list[int] = []
    data: list[str] = []
    for base, _is_dir in backend.children(prefix):
        stem = base.split(".", 1)[0]
        try:
            if base.startswith("gen-") and base.endswith(".json"):
                gens.append(int(stem[4:]))
            elif base.startswith("lease-") and base.endswith(".json"):
                leases.append(int(stem[6:]))
            elif base.startswith("data-"):
                data.append(base)
        except ValueError:
            continue
    return sorted(gens), sorted(leases), data


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
    """The owner holding a live lease on session ``name`` (None: nobody does)."""
    backend = _backend(root)
    _, leases, _ = _entries(backend, f"{namespace}/{name}")
    if not leases:
        return None
    raw = backend.read(f"{namespace}/{name}/lease-{leases[-1]:0{WIDTH}d}.json")
    lease = Lease(**json.loads(raw)) if raw else None
    return lease.owner if lease is not None and lease.live() else None


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
    """A committed generation: its number, the data object, checksum and writer."""

    generation: int
    sha256: str
    size: int
    owner: str
    data: str
    committed_at: float


@dataclass
class Lease:
    """Who may write a session, until when (epoch seconds)."""

    epoch: int
    owner: str
    expires_at: float
    released: bool = False

    def live(self, now: float | None = None) -> bool:
        """Held and not expired."""
        return not self.released and self.expires_at > (time.time() if now is None else now)


def _sha256(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


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
        except (StaleOwnerError, LeaseLostError, ChecksumError):
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

    ``acquire`` (the lease), ``fetch`` (download or reuse ``local_path``), ``renew``
    while live, ``commit`` (upload the closed file as the next generation), ``release``.
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
        self.lease_epoch: int | None = None
        self.base: Manifest | None = None

    # -- reading -----------------------------------------------------------------------

    def _gen_key(self, n: int) -> str:
        return f"{self.prefix}/gen-{n:0{WIDTH}d}.json"

    def _lease_key(self, n: int) -> str:
        return f"{self.prefix}/lease-{n:0{WIDTH}d}.json"

    def latest(self) -> Manifest | None:
        """The newest committed generation, or None."""
        gens, _, _ = _entries(self.backend, self.prefix)
        if not gens:
            return None
        raw = self.backend.read(self._gen_key(gens[-1]))
        return Manifest(**json.loads(raw)) if raw else None

    def lease(self) -> Lease | None:
        """The current (highest-epoch) lease, or None."""
        _, leases, _ = _entries(self.backend, self.prefix)
        return self._read_lease(leases[-1]) if leases else None

    def _read_lease(self, epoch: int) -> Lease | None:
        raw = self.backend.read(self._lease_key(epoch))
        return Lease(**json.loads(raw)) if raw else None

    # -- the lease ---------------------------------------------------------------------

    def _lease_body(self, epoch: int, released: bool = False) -> bytes:
        expires = 0.0 if released else time.time() + self.lease_ttl
        return json.dumps(asdict(Lease(epoch, self.owner, expires, released))).encode()

    def acquire(self) -> None:
        """Take the session's lease (or renew ours).

        Raises:
            LeaseHeldError: another owner holds a live lease, or won the race for it.
        """
        _, leases, _ = _entries(self.backend, self.prefix)
        current = self._read_lease(leases[-1]) if leases else None
        if current is not None and current.owner == self.owner and not current.released:
            self.lease_epoch = current.epoch
            self.renew()
            return
        if current is not None and current.live():
            raise LeaseHeldError(
                f"session {self.prefix} is held by {current.owner} for "
                f"{current.expires_at - time.time():.1f} s more",
                current.owner,
                current.expires_at - time.time(),
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
        """Push our lease's expiry out by the TTL.

        Raises:
            LeaseLostError: the lease expired and another owner took it.
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
        """Give the lease up (best effort: an unreleased lease expires anyway)."""
        epoch, self.lease_epoch = self.lease_epoch, None
        if epoch is None:
            return
        try:
            _, leases, _ = _entries(self.backend, self.prefix)
            if leases and leases[-1] == epoch:
                self.backend.write(self._lease_key(epoch), self._lease_body(epoch, released=True))
        except Exception as exc:
            log.warning("releasing the lease of %s failed (it expires): %s", self.prefix, exc)

    @property
    def held(self) -> bool:
        """Whether this owner believes it holds the lease."""
        return self.lease_epoch is not None

    # -- the file ----------------------------------------------------------------------

    def _meta_path(self) -> Path:
        return self.local_path.with_name(self.local_path.name + ".gen")

    def _drop_local(self) -> None:
        for path in (self.local_path, self.local_path.with_name(self.local_path.name + ".wal")):
            path.unlink(missing_ok=True)
        self._meta_path().unlink(missing_ok=True)

    def fetch(self) -> bool:
        """Make ``local_path`` the newest committed generation: reuse the local copy if
        it is that generation byte for byte, else download and verify it. Returns
        whether the session has a generation (False: a new session, no local file).

        Raises:
            ChecksumError: the download does not match the manifest (local copy kept).
        """
        manifest = self.latest()
        self.local_path.parent.mkdir(parents=True, exist_ok=True)
        if manifest is None:
            self.base = None
            self._drop_local()  # an uncommitted leftover of an owner that died
            return False
        if self._local_matches(manifest):
            self.base = manifest
            return True
        tmp = self.local_path.with_name(f".{self.local_path.name}.{uuid.uuid4().hex[:8]}")
        try:
            digest = self.backend.download(manifest.data, tmp)
            if digest != manifest.sha256:
                raise ChecksumError(
                    f"session {self.prefix} generation {manifest.generation}: the downloaded "
                    f"file's sha256 {digest[:12]}… is not the manifest's "
                    f"{manifest.sha256[:12]}…; refusing it"
                )
            self.local_path.with_name(self.local_path.name + ".wal").unlink(missing_ok=True)
            os.replace(tmp, self.local_path)
        finally:
            tmp.unlink(missing_ok=True)
        self._meta_path().write_text(json.dumps(asdict(manifest)))
        self.base = manifest
        return True

    def _local_matches(self, manifest: Manifest) -> bool:
        meta = self._meta_path()
        if not self.local_path.exists() or not meta.exists():
            return False
        if self.local_path.with_name(self.local_path.name + ".wal").exists():
            return False
        try:
            if json.loads(meta.read_text()).get("generation") != manifest.generation:
                return False
        except ValueError:
            return False
        return _sha256(self.local_path)[0] == manifest.sha256

    def commit(self) -> Manifest:
        """Upload the (closed, checkpointed) local file as the next generation.

        Raises:
            StaleOwnerError: the lease is lost or that generation exists already.
            UploadError: the upload failed after its retries (nothing was committed).
        """
        try:
            _retry(f"renewing the lease of {self.prefix}", self.renew)
        except LeaseLostError as exc:
            raise StaleOwnerError(str(exc)) from exc
        generation = (self.base.generation if self.base else 0) + 1
        digest, size = _sha256(self.local_path)
        data_key = f"{self.prefix}/data-{generation:0{WIDTH}d}-{uuid.uuid4().hex[:8]}{SUFFIX}"
        _retry(f"uploading {self.prefix}", lambda: self.backend.upload(self.local_path, data_key))
        manifest = Manifest(generation, digest, size, self.owner, data_key, time.time())
        body = json.dumps(asdict(manifest)).encode()

        def put() -> bool:
            if self.backend.put_if_absent(self._gen_key(generation), body):
                return True
            # Ours if an earlier attempt's response was lost after the write.
            raw = self.backend.read(self._gen_key(generation))
            return raw is not None and json.loads(raw).get("data") == data_key

        if not _retry(f"committing {self.prefix} generation {generation}", put):
            with contextlib.suppress(Exception):
                self.backend.delete(data_key)
            raise StaleOwnerError(
                f"session {self.prefix}: generation {generation} was committed by another "
                f"owner; {self.owner}'s upload is refused"
            )
        self.base = manifest
        self._meta_path().write_text(json.dumps(asdict(manifest)))
        self._collect(generation)
        return manifest

    def _collect(self, generation: int) -> None:
        """Drop data objects older than the previous generation (best effort)."""
        try:
            _, _, data = _entries(self.backend, self.prefix)
            for base in data:
                with contextlib.suppress(ValueError):
                    if int(base.split("-")[1]) < generation - 1:
                        self.backend.delete(f"{self.prefix}/{base}")
        except Exception as exc:
            log.warning("collecting old generations of %s failed: %s", self.prefix, exc)
