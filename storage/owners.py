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
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from thinkray.storage.layout import validate_name
from thinkray.storage.objectstore import (
    delete_object,
    is_uri,
    list_objects,
    put_object_if_absent,
    read_object,
)

OWNERS_DIR = ".owners"


class OwnerRegistry:
    """The owner of each agent name under a storage root.

    Contract: :meth:`claim` is atomic and idempotent — the first principal to claim a
    name owns it; later claims by the same principal return True and change nothing,
    claims by others return False and write nothing. :meth:`release` frees a name
    (only for its owner). Names and namespaces are validated before any filesystem
    call. ``root`` is a local path or an object-store URI (then :attr:`uri` is set)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.uri: str | None = str(root) if is_uri(root) else None
        self.root = Path(root)

    def _key(self, namespace: str, name: str) -> str:
        validate_name(namespace, "namespace")
        validate_name(name, "agent name")
        return f"{namespace}/{OWNERS_DIR}/{name}"

    def _read(self, key: str) -> str | None:
        assert self.uri is not None
        data = read_object(self.uri, key)
        return (data.decode("utf-8") or None) if data is not None else None

    def _path(self, namespace: str, name: str) -> Path:
        validate_name(namespace, "namespace")
        validate_name(name, "agent name")
        return self.root / namespace / OWNERS_DIR / name

    def owner(self, namespace: str, name: str) -> str | None:
        """The principal owning ``name`` (None: unclaimed)."""
        if self.uri is not None:
            return self._read(self._key(namespace, name))
        try:
            return self._path(namespace, name).read_text(encoding="utf-8") or None
        except FileNotFoundError:
            return None

    def claim(self, namespace: str, name: str, principal: str) -> bool:
        """Make ``principal`` the owner of ``name`` unless someone else is; True when
        ``principal`` owns it now."""
        if not principal:
            raise ValueError("a principal must be a non-empty string")
        if self.uri is not None:
            key = self._key(namespace, name)
            put_object_if_absent(self.uri, key, principal.encode("utf-8"))
            return self._read(key) == principal
        path = self._path(namespace, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{name}.{os.getpid()}.{id(self)}.tmp")
        tmp.write_text(principal, encoding="utf-8")
        try:
            # link() fails if the name exists: the owner file appears whole or not at
            # all (an O_EXCL create followed by a write could be read half-written).
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        return self.owner(namespace, name) == principal

    def release(self, namespace: str, name: str, principal: str) -> bool:
        """Free ``name`` if ``principal`` owns it; True when it was freed."""
        if self.owner(namespace, name) != principal:
            return False
        if self.uri is not None:
            delete_object(self.uri, self._key(namespace, name))
            return True
        with contextlib.suppress(FileNotFoundError):
            self._path(namespace, name).unlink()
        return True

    def names(self, namespace: str, principal: str) -> list[str]:
        """The names ``principal`` owns in ``namespace``, sorted."""
        if self.uri is not None:
            folder_key = f"{validate_name(namespace, 'namespace')}/{OWNERS_DIR}"
            return sorted(
                name
                for name, _size in list_objects(self.uri, folder_key)
                if not name.startswith(".") and self._read(f"{folder_key}/{name}") == principal
            )
        folder = self.root / validate_name(namespace, "namespace") / OWNERS_DIR
        if not folder.is_dir():
            return []
        owned = []
        for path in folder.iterdir():
            if path.name.startswith("."):
                continue
            with contextlib.suppress(OSError):
                if path.read_text(encoding="utf-8") == principal:
                    owned.append(path.name)
        return sorted(owned)
