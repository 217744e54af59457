"""Bridge actors: a shared workspace reachable by other actors only through grants.

The seed's ToolBridge: an orchestrator's shared workspace lives in a bridge actor
that owns its DuckDB file. Each sub-agent gets a :class:`BridgeClient` carrying a
secret token the bridge issued for it; every call is checked against that agent's
access (``none`` / ``read`` / ``read-write``) on the bridge's side, so a client cannot
claim more than it was granted. Paths are normalized (and unsafe ones refused) by the
workspace operations before anything is touched.

A client implements the workspace operation protocols with awaitable results, so
``thinkray.runtime.tools.workspace.workspace_tools(client, access=...)`` turns it into tools.

The bridge also holds the orchestrator's MCP connections (seed 000: sub-agents "share
the parent's workspace and MCP tools via RPC bridges"): a grant names the MCP servers
(and optionally tools) its agent may call, checked on the bridge's side like workspace
access. MCP methods run in their own concurrency group (threads feeding one asyncio
loop that owns the connections), so a slow MCP server never holds up workspace calls,
which stay one at a time in arrival order.

Under an object-store storage root (``s3://``, ``file://``; see
:mod:`thinkray.storage.objectstore`) the bridge's file follows the sessions' mechanism:
it is the object-store session ``<namespace>/.shared/<owner>`` (a dot folder, so never
listed as an agent). The bridge takes its lease and downloads its newest generation
into the node-local cache at start, renews the lease while it lives, uploads the file
as the next generation when it changed (:meth:`WorkspaceBridge.sync`, called at the
orchestrator's hibernation; after a change once ``THINKRAY_BRIDGE_SYNC_SECONDS``, 60 by
default, have passed since the last upload; and at :meth:`WorkspaceBridge.close`), and
releases the lease when it closes. With a local root the file is
``<root>/<namespace>/_shared/<owner>.duckdb`` as before.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import ray
from thinkray.actors.errors import (  # re-exported: the errors live in thinkray.actors.errors
    BridgeAccessError as BridgeAccessError,
)
from thinkray.actors.errors import InvalidArgumentError
from thinkray.actors.metrics import install_ray_metrics
from thinkray.runtime.observability import tracing
from thinkray.runtime.observability.setup import configure_from_env
from thinkray.runtime.tools.mcp import (
    McpClient,
    McpConfigError,
    McpServerConfig,
    McpToolInfo,
    McpUnavailableError,
    call_envelope,
    raise_for_envelope,
)
from thinkray.runtime.tools.workspace import LocalWorkspace
from thinkray.storage.layout import (  # re-exported: removing an agent needs them too
    REMOTE_SHARED_FOLDER as REMOTE_SHARED_FOLDER,
)
from thinkray.storage.layout import SHARED_FOLDER as SHARED_FOLDER
from thinkray.storage.layout import validate_name
from thinkray.storage.objectstore import LeaseHeldError, RemoteSession, is_uri
from thinkray.storage.protocols import KeyValueStore, Stores
from thinkray.storage.stores import open_stores

Access = Literal["none", "read", "read-write"]
McpGrant = dict[str, list[str] | None]
"""The MCP servers an agent may call, by name: the tool names it may call there, or
None for all of them."""
READ_METHODS = frozenset({"read_file", "stat", "list_directory", "find_files", "grep", "exists"})
WRITE_METHODS = frozenset({"write_file", "edit_file", "delete", "mkdir"})
_GRANT = "grant:"
MCP_GROUP = "mcp"
"""The bridge's concurrency group for MCP calls (``MCP_THREADS`` at once)."""
MCP_THREADS = 32
DEFAULT_SYNC_SECONDS = 60.0
log = logging.getLogger("thinkray.bridge")


class WorkspaceBridge:
    """Owns the shared workspace file and the grants. Run as a named Ray actor."""

    def __init__(
        self, path: str, *, root: str | None = None, namespace: str = "", owner: str = ""
    ) -> None:
        """Open the workspace file ``path`` (a local root), or, given an object-store
        ``root``, the newest generation of ``namespace``'s ``owner`` bridge file (its
        lease taken first; ``path`` is then unused)."""
        install_ray_metrics()  # what this process measures goes to Ray's endpoint
        configure_from_env()  # and its spans where the environment says
        self._remote: RemoteSession | None = None
        self._remote_lock = threading.Lock()
        self._stop_renewing = threading.Event()
        self._dirty = False
        self._synced_at = time.monotonic()
        self._sync_seconds = float(
            os.environ.get("THINKRAY_BRIDGE_SYNC_SECONDS") or DEFAULT_SYNC_SECONDS
        )
        if root is not None:
            remote = RemoteSession(root, f"{namespace}/{REMOTE_SHARED_FOLDER}", owner)
            _acquire(remote)
            try:
                remote.fetch()
            except BaseException:
                remote.release()
                raise
            self._remote = remote
            path = str(remote.local_path)
            threading.Thread(
                target=self._renew_lease, name="thinkray-bridge-lease", daemon=True
            ).start()
        self._path = path
        self._open()
        self.calls = 0
        self.mcp_calls = 0
        self._mcp: McpClient | None = None
        self._mcp_loop: asyncio.AbstractEventLoop | None = None
        self._mcp_start = threading.Lock()

    def _open(self) -> None:
        Path(self._path).parent.mkdir(parents=True, exist_ok=True)
        self._stores: Stores = open_stores(self._path)  # its own file: grants and workspace
        self.kv: KeyValueStore = self._stores.kv()
        self.ops = LocalWorkspace(self._stores.workspace())
        # Token -> grant, as stored: this actor is the only writer of its grants, so
        # a call checks its token without a read of the file.
        self._grants: dict[str, dict[str, Any]] = {
            key[len(_GRANT) :]: grant for key, grant in self.kv.items(_GRANT).items()
        }

    # -- object-store roots ------------------------------------------------------------

    def _renew_lease(self) -> None:
        remote = self._remote
        assert remote is not None
        while not self._stop_renewing.wait(remote.lease_ttl / 3):
            try:
                with self._remote_lock:
                    if not remote.held:
                        return
                    remote.renew()
            except Exception as exc:  # lost (logged, its uploads are refused) or transient
                log.warning("renewing the lease of bridge %s failed: %s", remote.prefix, exc)

    def _changed(self) -> None:
        """Note a write; under an object-store root, upload once the sync interval has
        passed since the last upload (so a long-lived bridge is never far behind)."""
        self._dirty = True
        if self._remote is not None and time.monotonic() - self._synced_at >= self._sync_seconds:
            try:
                self.sync()
            except Exception as exc:  # the write itself succeeded; the next sync retries
                log.warning("periodic upload of bridge %s failed: %s", self._remote.prefix, exc)

    def sync(self) -> int | None:
        """Under an object-store root, upload the workspace file as its next generation
        if it changed since the last upload (closed, checkpointed, then reopened);
        returns the committed generation (None: a local root or nothing changed).

        Raises:
            StaleOwnerError: the lease was lost; UploadError: the upload failed (the
                bridge goes on with its local file; a later sync retries).
        """
        remote = self._remote
        if remote is None or not self._dirty:
            return None
        self._stores.close()
        try:
            with self._remote_lock:
                manifest = remote.commit()
        finally:
            self._open()
        self._dirty = False
        self._synced_at = time.monotonic()
        return manifest.generation

    def generation(self) -> int | None:
        """The generation the bridge's file was last fetched or committed as (None: a
        local root, or nothing committed yet)."""
        remote = self._remote
        return remote.base.generation if remote is not None and remote.base else None

    def ready(self) -> bool:
        """True once the actor is constructed (callers ``ray.get`` it to wait)."""
        return True

    def grant(self, agent: str, access: Access, mcp: McpGrant | None = None) -> str:
        """Issue (or replace) ``agent``'s grant: workspace ``access`` and the ``mcp``
        servers it may call; returns its token."""
        if access not in ("none", "read", "read-write"):
            raise InvalidArgumentError(f"access must be none, read or read-write, not {access!r}")
        self.revoke(agent)
        token = secrets.token_urlsafe(18)
        grant = {"agent": agent, "access": access, "mcp": _check_mcp_grant(mcp)}
        self.kv.set(_GRANT + token, grant)
        self._grants[token] = grant
        self._changed()
        return token

    def set_mcp_grant(self, agent: str, mcp: McpGrant | None) -> int:
        """Replace the MCP part of ``agent``'s grants (its token is kept); returns how
        many grants changed (0: the agent has none)."""
        mcp = _check_mcp_grant(mcp)
        changed = 0
        for key, grant in self.kv.items(_GRANT).items():
            if grant["agent"] == agent:
                updated = {**grant, "mcp": mcp}
                self.kv.set(key, updated)
                self._grants[key[len(_GRANT) :]] = updated
                changed += 1
        if changed:
            self._changed()
        return changed

    def revoke(self, agent: str) -> int:
        """Delete ``agent``'s grants: their tokens stop working at once. Returns how
        many were deleted (0 for an agent without one)."""
        revoked = 0
        for key, grant in self.kv.items(_GRANT).items():
            if grant["agent"] == agent:
                self.kv.delete(key)
                self._grants.pop(key[len(_GRANT) :], None)
                revoked += 1
        if revoked:
            self._changed()
        return revoked

    def grants(self) -> dict[str, str]:
        """Each granted agent's access, by agent name."""
        return {g["agent"]: g["access"] for g in self.kv.items(_GRANT).values()}

    def mcp_grants(self) -> dict[str, McpGrant]:
        """Each granted agent's MCP servers (see :data:`McpGrant`), by agent name."""
        return {g["agent"]: dict(g.get("mcp") or {}) for g in self.kv.items(_GRANT).values()}

    def call(
        self,
        token: str,
        method: str,
        kwargs: dict[str, Any],
        trace: dict[str, str] | None = None,
    ) -> Any:
        """Run workspace operation ``method(**kwargs)`` for the holder of ``token`` and
        return its result (its errors propagate). Traced as ``thinkray.bridge``, a
        child of the caller's span (``trace``: the caller's context).

        Raises:
            BridgeAccessError: the token is unknown or revoked, ``method`` is not a
                workspace operation, or the grant's access does not cover it.
        """
        if not tracing.enabled():
            return self._call_now(token, method, kwargs)
        grant = self._grants.get(token) or {}
        attributes = {"thinkray.bridge.operation": method, "gen_ai.agent.name": grant.get("agent")}
        with tracing.attached(trace), tracing.span("thinkray.bridge", attributes):
            return self._call_now(token, method, kwargs)

    def _call_now(self, token: str, method: str, kwargs: dict[str, Any]) -> Any:
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
        if method in READ_METHODS:
            return getattr(self.ops, method)(**kwargs)
        try:
            return getattr(self.ops, method)(**kwargs)
        finally:
            self._changed()

    # -- MCP ---------------------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the MCP loop (started on first use) and return its result."""
        with self._mcp_start:
            if self._mcp_loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="thinkray-mcp", daemon=True).start()
                self._mcp_loop = loop
                self._mcp = McpClient()
        return asyncio.run_coroutine_threadsafe(coro, self._mcp_loop).result()

    def _client(self) -> McpClient:
        assert self._mcp is not None  # _run started it
        return self._mcp

    @ray.method(concurrency_group=MCP_GROUP)
    def mcp_sync(self, configs: list[dict[str, Any]]) -> None:
        """Make the bridge's MCP servers exactly ``configs`` (config dicts with their
        ``name``); none is connected here (each connects on first use)."""
        parsed = [McpServerConfig.parse(c["name"], c) for c in configs]

        async def sync() -> None:
            await self._client().sync(parsed)

        self._run(sync())

    @ray.method(concurrency_group=MCP_GROUP)
    def mcp_add(self, config: dict[str, Any]) -> dict[str, Any]:
        """Add (or replace) a server and try to connect and list its tools now; returns
        its status plus ``tool_infos`` (each :meth:`McpToolInfo.to_dict`). A server that
        cannot be reached is still added: ``last_error`` says why."""
        parsed = McpServerConfig.parse(config["name"], config)

        async def add() -> dict[str, Any]:
            status = await self._client().add(parsed)
            status["tool_infos"] = await self._infos(parsed.name)
            return status

        return self._run(add())

    async def _infos(self, server: str, refresh: bool = False) -> list[dict[str, Any]] | None:
        connection = self._client().server(server)
        if not connection.connected and not refresh and connection.last_error:
            return None  # just failed: don't try again at once
        try:
            return [t.to_dict() for t in await connection.list_tools(refresh=refresh)]
        except McpUnavailableError:
            return None

    @ray.method(concurrency_group=MCP_GROUP)
    def mcp_remove(self, server: str) -> bool:
        """Close and forget ``server``; False if the bridge had no such server."""
        return self._run(self._client().remove(server))

    @ray.method(concurrency_group=MCP_GROUP)
    def mcp_list(self, server: str, refresh: bool = False) -> list[dict[str, Any]]:
        """``server``'s tools (each :meth:`McpToolInfo.to_dict`), connecting if needed;
        ``refresh`` lists them again.

        Raises:
            McpConfigError: no such server.
            McpError: it cannot be reached (or backs off) or answers garbage.
        """

        async def listed() -> list[dict[str, Any]]:
            tools = await self._client().list_tools(server, refresh=refresh)
            return [t.to_dict() for t in tools]

        return self._run(listed())

    @ray.method(concurrency_group=MCP_GROUP)
    def mcp_status(self) -> list[dict[str, Any]]:
        """Every MCP server's status (see ``McpServerConnection.status``), by name."""

        async def status() -> list[dict[str, Any]]:
            return self._client().status()

        return self._run(status())

    @ray.method(concurrency_group=MCP_GROUP)
    def mcp_call(
        self,
        token: str,
        server: str,
        tool: str,
        arguments: dict[str, Any],
        trace: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Call MCP ``server``'s ``tool`` for the holder of ``token``; the outcome as an
        envelope (``runtime.tools.mcp.call_envelope``): a refused grant, an unknown
        server and every MCP failure are ``{"ok": False, ...}``, never an exception.
        Traced as ``thinkray.bridge`` (operation ``mcp_call``)."""
        if not tracing.enabled():
            return self._mcp_call_now(token, server, tool, arguments)
        attributes = {
            "thinkray.bridge.operation": "mcp_call",
            "thinkray.mcp.server": server,
            "gen_ai.tool.name": tool,
        }
        with tracing.attached(trace), tracing.span("thinkray.bridge", attributes) as span:
            envelope = self._mcp_call_now(token, server, tool, arguments)
            if not envelope.get("ok", True):
                tracing.record_error(span, str(envelope.get("error") or "mcp error"))
            return envelope

    def _mcp_call_now(
        self, token: str, server: str, tool: str, arguments: dict[str, Any]
    ) -> dict[str, Any]:
        grant = self._grants.get(token)
        if grant is None:
            return {"ok": False, "kind": "tool", "error": "unknown or revoked bridge grant"}
        allowed = (grant.get("mcp") or {}).get(server, False)
        if allowed is False or (allowed is not None and tool not in allowed):
            what = f"MCP server {server!r}" if allowed is False else f"tool {tool!r} of {server!r}"
            return {
                "ok": False,
                "kind": "tool",
                "error": f"agent {grant['agent']!r} has no grant for {what}",
            }
        self.mcp_calls += 1
        return self._run(call_envelope(self._client().call(server, tool, arguments)))

    def close(self) -> None:
        """Close the MCP connections (stdio servers stop), then checkpoint and close
        the bridge's database file; under an object-store root, upload it if it changed
        and release the lease (kept, to expire, if the upload fails: its error is
        raised)."""
        try:
            if self._mcp_loop is not None:
                try:
                    self._run(self._client().close())
                finally:
                    self._mcp_loop.call_soon_threadsafe(self._mcp_loop.stop)
        finally:
            self._stores.close()
            remote = self._remote
            if remote is not None and remote.held:
                self._stop_renewing.set()
                with self._remote_lock:
                    if self._dirty:
                        remote.commit()
                        self._dirty = False
                    remote.release()


def _check_mcp_grant(mcp: McpGrant | None) -> McpGrant:
    if mcp is None:
        return {}
    if not isinstance(mcp, dict) or not all(
        isinstance(k, str)
        and (v is None or (isinstance(v, list) and all(isinstance(t, str) for t in v)))
        for k, v in mcp.items()
    ):
        raise McpConfigError(
            "an MCP grant maps server names to a list of tool names, or None for all tools"
        )
    return {k: (None if v is None else list(v)) for k, v in mcp.items()}


RemoteBridge = ray.remote(concurrency_groups={MCP_GROUP: MCP_THREADS})(WorkspaceBridge)  # type: ignore[call-overload]


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


def _acquire(remote: RemoteSession) -> None:
    """Take ``remote``'s lease, waiting out one held by a bridge that died without
    releasing it (the Ray name is unique: a new bridge of that name means the previous
    one is gone); raise LeaseHeldError if it is still held after that."""
    deadline = time.monotonic() + remote.lease_ttl + 5
    while True:
        try:
            remote.acquire()
            return
        except LeaseHeldError as exc:
            if time.monotonic() >= deadline:
                raise
            log.warning("bridge %s: %s; waiting for it to expire", remote.prefix, exc)
            time.sleep(min(max(exc.expires_in, 0.2), 1.0))


def bridge_path(storage_root: str, namespace: str, owner: str) -> str:
    """Where ``owner``'s bridge file lives under a local root."""
    return str(Path(storage_root) / namespace / SHARED_FOLDER / f"{owner}.duckdb")


def open_bridge(storage_root: str, namespace: str, owner: str) -> Any:
    """Get or create the named bridge actor of ``owner`` (idempotent across processes).
    Under an object-store root its file is fenced and kept in the store (see the module
    docstring)."""
    options = RemoteBridge.options(
        name=bridge_name(namespace, owner),
        namespace="thinkray",
        get_if_exists=True,
        # Detached: it serves the sub-agents while its orchestrator hibernates (a bridge
        # owned by the orchestrator's actor was stopped by Ray as soon as the agent
        # hibernated and dropped its handle). The namespace's shutdown stops it.
        lifetime="detached",
        num_cpus=0,
        max_concurrency=1,  # one writer, calls in arrival order
    )
    if is_uri(storage_root):
        return options.remote("", root=storage_root, namespace=namespace, owner=owner)
    return options.remote(bridge_path(storage_root, namespace, owner))


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
        return self._actor().call.remote(self.token, method, kwargs, tracing.inject())

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

    def call_mcp(self, server: str, tool: str, arguments: dict[str, Any]) -> Any:
        """An ObjectRef of the envelope of MCP ``server``'s ``tool`` called with
        ``arguments`` (the grant must name the server; see ``WorkspaceBridge.mcp_call``)."""
        return self._actor().mcp_call.remote(self.token, server, tool, arguments, tracing.inject())

    def mcp_caller(self, deadline: float = 120.0) -> Any:
        """An ``McpCall`` for MCP tools (``runtime.tools.mcp.McpTool``): calls
        through the bridge and raises the outcome's McpError; a bridge that cannot be
        reached, or does not answer within ``deadline`` seconds (the server's own
        timeout is enforced on the bridge), is an ``McpUnavailableError``."""

        async def call(info: McpToolInfo, arguments: dict[str, Any]) -> Any:
            try:
                envelope = await asyncio.wait_for(
                    self.call_mcp(info.server, info.tool, arguments), deadline
                )
            except TimeoutError:
                raise McpUnavailableError(
                    f"the MCP bridge did not answer within {deadline:g}s"
                ) from None
            except Exception as exc:
                raise McpUnavailableError(
                    f"the MCP bridge cannot be reached: {type(exc).__name__}"
                ) from None
            return raise_for_envelope(envelope)

        return call

    def to_config(self) -> dict[str, str]:
        """The client as a plain dict (``name``, ``token``, ``access``) to store."""
        return {"name": self.name, "token": self.token, "access": self.access}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> BridgeClient:
        """The client :meth:`to_config` saved (``KeyError`` for a missing key)."""
        return cls(config["name"], config["token"], config["access"])
