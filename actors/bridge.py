"""Bridge actors: a shared workspace reachable by other actors only through grants.

The seed's ToolBridge: an orchestrator's shared workspace lives in a bridge actor
that owns its DuckDB file. Each sub-agent gets a :class:`BridgeClient` carrying a
secret token the bridge issued for it; every call is checked against that agent's
access (``none`` / ``read`` / ``read-write``) on the bridge's side, so a client cannot
claim more than it was granted. Paths are normalized (and unsafe ones refused) by the
workspace operations before anything is touched.

A client implements the workspace operation protocols with awaitable results, so
``thinkray.runtime.tools.workspace.workspace_tools(client, access=...)`` turns it into tools.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import ray
from thinkray.actors.errors import (  # re-exported: the errors live in thinkray.actors.errors
    BridgeAccessError as BridgeAccessError,
)
from thinkray.actors.errors import InvalidArgumentError
from thinkray.runtime.tools.workspace import LocalWorkspace
from thinkray.storage.layout import validate_name
from thinkray.storage.protocols import KeyValueStore, Stores
from thinkray.storage.stores import open_stores

Access = Literal["none", "read", "read-write"]
READ_METHODS = frozenset({"read_file", "stat", "list_directory", "find_files", "grep", "exists"})
WRITE_METHODS = frozenset({"write_file", "edit_file", "delete", "mkdir"})
_GRANT = "grant:"


class WorkspaceBridge:
    """Owns the shared workspace file and the grants. Run as a named Ray actor."""

    def __init__(self, path: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._stores: Stores = open_stores(path)  # its own file: grants and the workspace
        self.kv: KeyValueStore = self._stores.kv()
        self.ops = LocalWorkspace(self._stores.workspace())
        self.calls = 0
        # Token -> grant, as stored: this actor is the only writer of its grants, so
        # a call checks its token without a read of the file.
        self._grants: dict[str, dict[str, Any]] = {
            key[len(_GRANT) :]: grant for key, grant in self.kv.items(_GRANT).items()
        }

    def ready(self) -> bool:
        """True once the actor is constructed (callers ``ray.get`` it to wait)."""
        return True

    def grant(self, agent: str, access: Access) -> str:
        """Issue (or replace) ``agent``'s grant; returns its token."""
        if access not in ("none", "read", "read-write"):
            raise InvalidArgumentError(f"access must be none, read or read-write, not {access!r}")
        self.revoke(agent)
        token = secrets.token_urlsafe(18)
        grant = {"agent": agent, "access": access}
        self.kv.set(_GRANT + token, grant)
        self._grants[token] = grant
        return token

    def revoke(self, agent: str) -> int:
        """Delete ``agent``'s grants: their tokens stop working at once. Returns how
        many were deleted (0 for an agent without one)."""
        revoked = 0
        for key, grant in self.kv.items(_GRANT).items():
            if grant["agent"] == agent:
                self.kv.delete(key)
                self._grants.pop(key[len(_GRANT) :], None)
                revoked += 1
        return revoked

    def grants(self) -> dict[str, str]:
        """Each granted agent's access, by agent name."""
        return {g["agent"]: g["access"] for g in self.kv.items(_GRANT).values()}

    def call(self, token: str, method: str, kwargs: dict[str, Any]) -> Any:
        """Run workspace operation ``method(**kwargs)`` for the holder of ``token`` and
        return its result (its errors propagate).

        Raises:
            BridgeAccessError: the token is unknown or revoked, ``method`` is not a
                workspace operation, or the grant's access does not cover it.
        """
        grant = self._grants.get(token)
        if grant is None:
            raise BridgeAccessError("unknown or revoked bridge grant")
        access = grant["access"]
        if method in READ_METHODS:
            allowed = access in ("read", "read-write")
        elif method in WRITE_METHODS:
            allowed = access == "read-write"
        else:
            raise BridgeAccessError(f"{method!r} is not a workspace operation")
        if not allowed:
            raise BridgeAccessError(
                f"agent {grant['agent']!r} has {access!r} access to the shared workspace; "
                f"{method} needs {'read' if method in READ_METHODS else 'read-write'}"
            )
        self.calls += 1
        return getattr(self.ops, method)(**kwargs)

    def close(self) -> None:
        """Checkpoint and close the bridge's database file."""
        self._stores.close()


RemoteBridge = ray.remote(WorkspaceBridge)


def bridge_name(namespace: str, owner: str) -> str:
    """The Ray actor name of ``owner``'s bridge in ``namespace``:
    ``thinkray-bridge:<namespace>:<owner>``.

    Both are validated names (:func:`~thinkray.storage.layout.validate_name`), whose
    alphabet has no ``:``, so the name is unambiguous: joining with ``-`` (which names
    may contain) gave namespace ``a-b``/owner ``c`` and namespace ``a``/owner ``b-c``
    one bridge, and one orchestrator the other's shared workspace.

    Raises:
        InvalidInputError: ``namespace`` or ``owner`` is not a valid name.
    """
    validate_name(namespace, "namespace")
    validate_name(owner, "bridge owner")
    return f"thinkray-bridge:{namespace}:{owner}"


def open_bridge(storage_root: str, namespace: str, owner: str) -> Any:
    """Get or create the named bridge actor of ``owner`` (idempotent across processes)."""
    path = Path(storage_root) / namespace / "_shared" / f"{owner}.duckdb"
    return RemoteBridge.options(
        name=bridge_name(namespace, owner),
        namespace="thinkray",
        get_if_exists=True,
        num_cpus=0,
        max_concurrency=1,  # one writer, calls in arrival order
    ).remote(str(path))


@dataclass(frozen=True)
class BridgeClient:
    """Serializable: what a sub-agent holds. Methods return awaitable ObjectRefs.

    It resolves the bridge by name when first used (and again if the bridge was
    restarted), so it survives being stored in an agent's config across hibernation.
    """

    name: str
    token: str
    access: Access

    def _actor(self) -> Any:
        return ray.get_actor(self.name, namespace="thinkray")

    def _call(self, method: str, **kwargs: Any) -> Any:
        return self._actor().call.remote(self.token, method, kwargs)

    def read_file(self, path: str) -> Any:
        """An ObjectRef of the file's text (``ReadOperations.read_file``; read access)."""
        return self._call("read_file", path=path)

    def stat(self, path: str) -> Any:
        """An ObjectRef of the entry's metadata or None (``ReadOperations.stat``; read
        access)."""
        return self._call("stat", path=path)

    def exists(self, path: str) -> Any:
        """An ObjectRef of whether ``path`` exists (read access)."""
        return self._call("exists", path=path)

    def list_directory(self, path: str = "") -> Any:
        """An ObjectRef of a directory's children (``ReadOperations.list_directory``;
        read access)."""
        return self._call("list_directory", path=path)

    def find_files(self, pattern: str, path: str = "", limit: int = 200) -> Any:
        """An ObjectRef of the paths matching a glob (``ReadOperations.find_files``;
        read access)."""
        return self._call("find_files", pattern=pattern, path=path, limit=limit)

    def grep(
        self,
        pattern: str,
        glob: str | None = None,
        path: str = "",
        ignore_case: bool = False,
        limit: int = 100,
    ) -> Any:
        """An ObjectRef of the lines matching a regex (``ReadOperations.grep``; read
        access)."""
        return self._call(
            "grep", pattern=pattern, glob=glob, path=path, ignore_case=ignore_case, limit=limit
        )

    def write_file(self, path: str, content: str) -> Any:
        """Create or replace a file (``WriteOperations.write_file``; read-write
        access); an ObjectRef of the result."""
        return self._call("write_file", path=path, content=content)

    def edit_file(
        self, path: str, old_string: str, new_string: str, replace_all: bool = False
    ) -> Any:
        """Replace text in a file, on the bridge's side (``WriteOperations.edit_file``;
        read-write access); an ObjectRef of the result."""
        return self._call(
            "edit_file",
            path=path,
            old_string=old_string,
            new_string=new_string,
            replace_all=replace_all,
        )

    def delete(self, path: str, recursive: bool = False) -> Any:
        """Delete a file or directory (``WriteOperations.delete``; read-write access);
        an ObjectRef of the result."""
        return self._call("delete", path=path, recursive=recursive)

    def to_config(self) -> dict[str, str]:
        """The client as a plain dict (``name``, ``token``, ``access``) to store."""
        return {"name": self.name, "token": self.token, "access": self.access}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> BridgeClient:
        """The client :meth:`to_config` saved (``KeyError`` for a missing key)."""
        return cls(config["name"], config["token"], config["access"])
