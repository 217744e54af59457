"""Who owns each agent name (the ingress's tenancy): one small file per claimed name,
``root/<namespace>/.owners/<name>``, holding the owning principal.

Why files and not a table: every ingress replica, on any node, claims names
concurrently, and a DuckDB file has one writer. Creating a file with ``O_EXCL`` is
atomic on a local or shared filesystem, so exactly one principal wins a name and the
others read the winner. The owner files sit beside the agents' databases, so a name
and its owner move together.

Under an object-store root (``s3://bucket/prefix``, ``file:///path``; see
:mod:`thinkray.storage.objectstore`) an owner file is the object
``<root>/<namespace>/.owners/<name>``, claimed with the store's conditional write
(put-if-absent: S3's ``PutObject`` with ``If-None-Match: *``), so every replica on every
node agrees on the winner exactly as with a local root.

Listing a principal's names must not read every owner file of the namespace (one GET
per agent of every tenant, under S3). So each principal also has an index folder,
``<namespace>/.owned/<key>/<name>`` (``key``: a digest of the principal, which may
hold any character). Two objects cannot be written atomically on S3, so the order
keeps the index a subset of the truth: a claim writes the owner file, then the index
entry; a release deletes the index entry, then the owner file. A listing still
confirms each entry against its owner file (one GET per own name), so an entry left
behind by anything else never shows a name the principal does not own. A namespace
whose owner files predate the index is indexed once, on its first listing.

Every call here is blocking storage I/O (a GET or PUT under ``s3://``): async callers
use the ``a``-prefixed methods, which run it in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import uuid
from pathlib import Path
from typing import Protocol

from thinkray.storage.layout import validate_name
from thinkray.storage.objectstore import (
    delete_object,
    is_uri,
    list_objects,
    put_object_if_absent,
    read_object,
)

OWNERS_DIR = ".owners"
OWNED_DIR = ".owned"
INDEXED_MARK = ".indexed-v1"
"""Under ``.owned``: present once every owner file of the namespace has its index entry."""


class KeyStore(Protocol):
    """Small objects by key under one root (the seam tests replace to count or slow
    the store's calls).

    Contract: :meth:`put_if_absent` is atomic (exactly one of concurrent callers
    creates a key; the object appears whole or not at all); :meth:`read` of an absent
    key is None; :meth:`delete` of an absent key does nothing; :meth:`list` gives the
    base names of the objects directly under ``prefix`` (none: ``[]``)."""

    def read(self, key: str) -> bytes | None: ...  # noqa: D102

    def put_if_absent(self, key: str, data: bytes) -> bool: ...  # noqa: D102

    def delete(self, key: str) -> None: ...  # noqa: D102

    def list(self, prefix: str) -> list[str]: ...  # noqa: D102


class LocalKeyStore:
    """:class:`KeyStore` on a local folder: a put-if-absent is a hard link of a whole
    temporary file (an ``O_EXCL`` create followed by a write could be read half-written)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def read(self, key: str) -> bytes | None:  # noqa: D102
        try:
            return (self.root / key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def put_if_absent(self, key: str, data: bytes) -> bool:  # noqa: D102
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
        tmp.write_bytes(data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        return True

    def delete(self, key: str) -> None:  # noqa: D102
        with contextlib.suppress(FileNotFoundError):
            (self.root / key).unlink()

    def list(self, prefix: str) -> list[str]:  # noqa: D102
        try:
            with os.scandir(self.root / prefix) as it:
                return [e.name for e in it if e.is_file(follow_symlinks=False)]
        except (FileNotFoundError, NotADirectoryError):
            return []


class UriKeyStore:
    """:class:`KeyStore` on an object-store root (:mod:`thinkray.storage.objectstore`)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri

    def read(self, key: str) -> bytes | None:  # noqa: D102
        return read_object(self.uri, key)

    def put_if_absent(self, key: str, data: bytes) -> bool:  # noqa: D102
        return put_object_if_absent(self.uri, key, data)

    def delete(self, key: str) -> None:  # noqa: D102
        delete_object(self.uri, key)

    def list(self, prefix: str) -> list[str]:  # noqa: D102
        return [rel for rel, _size in list_objects(self.uri, prefix) if "/" not in rel]


def key_store(root: str | os.PathLike[str]) -> KeyStore:
    """The :class:`KeyStore` of a storage root (a local path or an object-store URI)."""
    return UriKeyStore(str(root)) if is_uri(root) else LocalKeyStore(root)


def principal_key(principal: str) -> str:
    """The folder name of ``principal``'s index: principals are free-form strings."""
    return hashlib.sha256(principal.encode("utf-8")).hexdigest()[:40]


class OwnerRegistry:
    """The owner of each agent name under a storage root.

    Contract: :meth:`claim` is atomic and idempotent — the first principal to claim a
    name owns it; later claims by the same principal return True and change nothing,
    claims by others return False and write nothing. :meth:`release` frees a name
    (only for its owner). :meth:`names` reads the principal's index, never every
    owner file. Names and namespaces are validated before any storage call. ``root``
    is a local path or an object-store URI (then :attr:`uri` is set); ``store``
    replaces the storage (a test double)."""

    def __init__(self, root: str | os.PathLike[str], store: KeyStore | None = None) -> None:
        self.uri: str | None = str(root) if is_uri(root) else None
        self.root = Path(root)
        self.store = store if store is not None else key_store(root)

    @staticmethod
    def _key(namespace: str, name: str) -> str:
        validate_name(namespace, "namespace")
        validate_name(name, "agent name")
        return f"{namespace}/{OWNERS_DIR}/{name}"

    @staticmethod
    def _index_key(namespace: str, principal: str, name: str = "") -> str:
        folder = f"{namespace}/{OWNED_DIR}/{principal_key(principal)}"
        return f"{folder}/{name}" if name else folder

    def _read(self, key: str) -> str | None:
        data = self.store.read(key)
        return (data.decode("utf-8", "replace") or None) if data is not None else None

    def owner(self, namespace: str, name: str) -> str | None:
        """The principal owning ``name`` (None: unclaimed)."""
        return self._read(self._key(namespace, name))

    def claim(self, namespace: str, name: str, principal: str) -> bool:
        """Make ``principal`` the owner of ``name`` unless someone else is; True when
        ``principal`` owns it now."""
        if not principal:
            raise ValueError("a principal must be a non-empty string")
        key = self._key(namespace, name)
        self.store.put_if_absent(key, principal.encode("utf-8"))
        if self._read(key) != principal:
            return False
        # After the owner file: an index entry never names what its principal does not own.
        self.store.put_if_absent(
            self._index_key(namespace, principal, name), principal.encode("utf-8")
        )
        return True

    def release(self, namespace: str, name: str, principal: str) -> bool:
        """Free ``name`` if ``principal`` owns it; True when it was freed."""
        if self.owner(namespace, name) != principal:
            return False
        # Index entry first: a crash between the two leaves the name owned, unlisted.
        self.store.delete(self._index_key(namespace, principal, name))
        self.store.delete(self._key(namespace, name))
        return True

    def names(self, namespace: str, principal: str) -> list[str]:
        """The names ``principal`` owns in ``namespace``, sorted (reads the principal's
        index and confirms each entry: O(own names) reads)."""
        validate_name(namespace, "namespace")
        self._index_namespace(namespace)
        owned = []
        for name in self.store.list(self._index_key(namespace, principal)):
            try:
                key = self._key(namespace, name)
            except ValueError:
                continue  # a temporary or foreign file
            if self._read(key) == principal:
                owned.append(name)
        return sorted(owned)

    def _index_namespace(self, namespace: str) -> None:
        """Give every owner file written before the index existed its index entry (a
        one-time pass over the namespace; a racing claim writes its own entry)."""
        mark = f"{namespace}/{OWNED_DIR}/{INDEXED_MARK}"
        if self.store.read(mark) is not None:
            return
        folder = f"{namespace}/{OWNERS_DIR}"
        for name in self.store.list(folder):
            if name.startswith("."):
                continue
            owner = self._read(f"{folder}/{name}")
            if owner:
                self.store.put_if_absent(
                    self._index_key(namespace, owner, name), owner.encode("utf-8")
                )
        self.store.put_if_absent(mark, b"1")

    # -- off the event loop: each call is blocking storage I/O --------------------------

    async def aowner(self, namespace: str, name: str) -> str | None:
        """:meth:`owner` in a worker thread."""
        return await asyncio.to_thread(self.owner, namespace, name)

    async def aclaim(self, namespace: str, name: str, principal: str) -> bool:
        """:meth:`claim` in a worker thread."""
        return await asyncio.to_thread(self.claim, namespace, name, principal)

    async def anames(self, namespace: str, principal: str) -> list[str]:
        """:meth:`names` in a worker thread."""
        return await asyncio.to_thread(self.names, namespace, principal)
