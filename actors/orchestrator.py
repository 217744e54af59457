"""The orchestrator pattern (seed 000): an agent that keeps a registry of sub-agents,
shares a workspace with them through a bridge actor, delegates tasks (blocking or
fire-and-forget) with live, buffered relay, and aborts down the tree.

Both classes are ``Think`` subclasses hosted by the generic session actors:

- :class:`SubAgent` — each its own actor and DuckDB file; a private workspace, plus
  the shared one through its :class:`~thinkray.actors.bridge.BridgeClient` (tools prefixed
  ``shared_``), optional code execution and extensions. Its behaviour comes from the
  config the orchestrator gives it (instructions, model, access, features).
- :class:`Orchestrator` — the registry (persisted in its database), a namespace of its
  sub-agents, the bridge, delegations and their relays, and tools for its own model.
  It also keeps the MCP servers (configs in its database); the bridge holds their
  connections, and each sub-agent sees the MCP tools its grant names (``mcp__<server>
  __<tool>``), called through the bridge.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import ray
from thinkray.actors.bridge import BridgeClient, bridge_name, open_bridge
from thinkray.actors.errors import InvalidStateError, ModelNotConfiguredError, UnknownModelError
from thinkray.actors.namespace import AgentNamespace, Handle
from thinkray.runtime.abort import AbortSignal
from thinkray.runtime.agents.agent import Agent
from thinkray.runtime.agents.think import Think
from thinkray.runtime.chunks import UIChunk
from thinkray.runtime.messages import new_id
from thinkray.runtime.models.base import Model
from thinkray.runtime.observability import tracing
from thinkray.runtime.remote import Batch, idempotent, remote
from thinkray.runtime.tools.base import Tool, ToolContext, tool
from thinkray.runtime.tools.mcp import McpConfigError, McpServerConfig, McpToolInfo, mcp_tools
from thinkray.runtime.tools.workspace import LocalWorkspace, workspace_tools
from thinkray.runtime.turn.stream import RunStream
from thinkray.storage.errors import SubAgentNotFoundError
from thinkray.storage.layout import subagents_namespace, validate_name
from thinkray.storage.objectstore import is_uri
from thinkray.storage.protocols import RegistryStore, SubAgentRecord
from thinkray.storage.removal import remove_agent
from thinkray.storage.types import InvalidInputError

log = logging.getLogger("thinkray.orchestrator")
BRIDGE_KEY = "bridge"
MCP_KEY = "mcp"
"""A sub-agent's config key: the MCP tools it may call (``McpToolInfo`` dicts)."""
MCP_GRANTS_KEY = "mcp_grants"
"""A sub-agent's config key: its MCP grant (server -> tool names, or None for all)."""
MCP_SERVERS_KEY = "mcp_servers"
"""The orchestrator's config-store key: its MCP server configs, by name."""
MCP_TOOLS_KEY = "mcp_tools"
"""The orchestrator's config-store key: each server's tools as last listed."""


def build_model(spec: dict[str, Any] | None, fallback: Model | None = None) -> Model:
    """The model an agent's config names.

    Args:
        spec: ``{"provider": "anthropic", "model_id": ...}`` or ``{"provider": "script",
            "steps": [...]}`` (see :func:`thinkray.runtime.models.testing.model_from_spec`);
            ``None`` or ``{}`` when the config names none.
        fallback: the model given to the agent's constructor, used when ``spec`` is empty.

    Raises:
        ModelNotConfiguredError: ``spec`` is empty and there is no ``fallback``.
        UnknownModelError: ``spec`` names a provider that does not exist.
    """
    spec = spec or {}
    provider = spec.get("provider")
    if provider == "anthropic":
        from thinkray.runtime.models.anthropic import AnthropicModel

        return AnthropicModel(spec.get("model_id", "claude-sonnet-4-6"))
    if provider == "script":
        from thinkray.runtime.models.testing import model_from_spec

        return model_from_spec(spec)
    if provider is not None:
        raise UnknownModelError(
            f"unknown model provider {provider!r}: use 'anthropic' (with 'model_id') or "
            "'script' (with 'steps')"
        )
    if fallback is not None:
        return fallback
    raise ModelNotConfiguredError(
        "this agent has no model: put one in its config, e.g. create_subagent(name, "
        "{'model': {'provider': 'anthropic', 'model_id': 'claude-sonnet-4-6'}})"
    )


class SubAgent(Agent):
    """A worker of an orchestrator. Config keys: ``instructions``, ``model`` (see
    :func:`build_model`), ``bridge`` (set by the orchestrator), ``code_execution``,
    ``extensions`` and ``extension_network`` (``True``: extensions that declare
    network access may load and get the network; default: no network).

    ``allow_weak_sandbox`` (class attribute, default False): a deployment whose hosts
    cannot run the OS sandbox (bubblewrap) may subclass with True to run ``execute``
    and extension code under the audit hook only; it is logged and every result says
    so. It is not a config key, so nothing the model sets can weaken the sandbox."""

    allow_weak_sandbox: bool = False

    def on_start(self) -> None:
        """Start without a workspace or extension manager: both open on first use."""
        self._workspace: LocalWorkspace | None = None
        self._extensions: Any = None

    def get_workspace(self) -> LocalWorkspace:
        """The sub-agent's private workspace (in its own database), made on first use."""
        if self._workspace is None:
            self._workspace = LocalWorkspace(self.store.stores().workspace())
        return self._workspace

    def get_model(self) -> Model:
        """The model its config names, else the one it was constructed with.

        Raises:
            ModelNotConfiguredError: neither names one.
            UnknownModelError: the config names an unknown provider.
        """
        return build_model((self.get_config() or {}).get("model"), self._model)

    def get_manifest_prompt(self) -> str:
        """The config's ``instructions`` (a generic helper prompt without them)."""
        return (self.get_config() or {}).get("instructions") or "You are a helpful sub-agent."

    def bridge(self) -> BridgeClient | None:
        """The client of the orchestrator's shared workspace, or None before the
        orchestrator configured one."""
        spec = (self.get_config() or {}).get(BRIDGE_KEY)
        return BridgeClient.from_config(spec) if spec else None

    def extension_manager(self) -> Any:
        """The sub-agent's :class:`ExtensionManager` (its extensions may use its private
        workspace), made on first use."""
        if self._extensions is None:
            from thinkray.runtime.tools.extensions import ExtensionManager

            self._extensions = ExtensionManager(
                self.store.stores(),
                self.get_workspace(),
                allow_weak_sandbox=self.allow_weak_sandbox,
            )
        # No network for extension code unless the config says so (read on every use:
        # a reconfigured sub-agent follows its new config).
        config = self.get_config() or {}
        self._extensions.allow_network = config.get("extension_network") is True
        return self._extensions

    def get_tools(self) -> dict[str, Tool]:
        """The private workspace tools; the shared workspace's (``shared_``, as its grant
        allows, plus ``shared_wait_for_file``); the MCP tools its grant names
        (``mcp__<server>__<tool>``, called through the bridge); ``execute`` with
        ``code_execution``; the extension tools and loaded extensions with
        ``extensions``."""
        config = self.get_config() or {}
        tools = dict(workspace_tools(self.get_workspace()))
        client = self.bridge()
        if client is not None and client.access != "none":
            tools.update(workspace_tools(client, access=client.access, prefix="shared_"))
            tools["shared_wait_for_file"] = _wait_for_file_tool(client)
        if client is not None and config.get(MCP_KEY):
            infos = [McpToolInfo.from_dict(d) for d in config[MCP_KEY]]
            tools.update(mcp_tools(infos, client.mcp_caller()))
        if config.get("code_execution"):
            from thinkray.runtime.tools.sandbox import CodeSandbox, execute_tool

            sandbox = CodeSandbox(
                self.get_workspace(),
                timeout=config.get("code_timeout", 10.0),
                allow_weak_sandbox=self.allow_weak_sandbox,
            )
            tools["execute"] = execute_tool(sandbox)
        if config.get("extensions"):
            from thinkray.runtime.tools.extensions import extension_tools

            manager = self.extension_manager()
            tools.update(extension_tools(manager))
            tools.update(manager.get_tools())
        return tools


def _wait_for_file_tool(client: BridgeClient) -> Tool:
    @tool(name="shared_wait_for_file")
    async def wait_for_file(path: str, timeout: float = 30.0) -> dict[str, Any]:
        """Wait until a file exists in the shared workspace (another agent may be writing it)."""
        deadline = time.monotonic() + min(timeout, 120.0)
        while time.monotonic() < deadline:
            if await client.exists(path):
                return {"path": path, "exists": True}
            await asyncio.sleep(0.05)
        return {"path": path, "exists": False, "timed_out": True}

    return wait_for_file


TaskStatus = Literal["running", "completed", "aborted", "error"]
"""``running`` until the sub-agent's turn ends; then how it ended."""


@dataclass
class TaskInfo:
    """A delegated task, as :meth:`Orchestrator.delegate`, :meth:`~Orchestrator.task_status`,
    :meth:`~Orchestrator.wait_task` and :meth:`~Orchestrator.list_tasks` return it.

    ``text`` is the sub-agent's answer so far (all of it once finished); ``chunks`` how
    many stream chunks the task's buffer holds; ``message`` the sub-agent's stored
    assistant message, filled only by a blocking :meth:`~Orchestrator.delegate`."""

    task_id: str
    agent: str
    task: str
    run_id: str | None
    status: TaskStatus
    text: str
    error: str | None
    started_at: float
    finished_at: float | None
    chunks: int
    message: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field (what the orchestrator's tools give its model)."""
        return asdict(self)


@dataclass
class Delegation:
    """One delegated task: its buffered relay and how to abort it."""

    task_id: str
    agent: str
    task: str
    stream: RunStream
    run_id: str | None = None
    message_id: str | None = None
    receiver: Any = None
    status: TaskStatus = "running"
    text: str = ""
    error: str | None = None
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    consumer: asyncio.Task[Any] | None = None

    def summary(self) -> TaskInfo:
        """The task's public record (no message)."""
        return TaskInfo(
            task_id=self.task_id,
            agent=self.agent,
            task=self.task,
            run_id=self.run_id,
            status=self.status,
            text=self.text,
            error=self.error,
            started_at=self.started_at,
            finished_at=self.finished_at,
            chunks=len(self.stream.chunks),
        )


class Orchestrator(Agent):
    """Registry, shared workspace, delegation. Subclass to set :attr:`subagent_cls`."""

    subagent_cls: type[Think] = SubAgent
    # its own actor even in a namespace of hosts: it owns bridges and delegates, and its
    # tools may be CPU-heavy (its sub-agents may still share hosts)
    dedicated_actor = True
    subagent_pool_size: int = 2
    subagent_grow_pool: bool = True  # AgentNamespace's grow_pool for the sub-agents
    subagent_warm_up: bool = True  # AgentNamespace's warm_up for the sub-agents
    subagent_idle_timeout: float | None = 300.0

    def on_start(self) -> None:
        """Open the registry; the sub-agents' namespace and the bridge start on first use."""
        self.registry: RegistryStore = self.store.stores().registry()
        self._subs: AgentNamespace | None = None
        self._bridge: Any = None
        self._delegations: dict[str, Delegation] = {}
        self._handles: dict[str, Handle[Think]] = {}
        self._mcp_synced = False

    # -- infrastructure ------------------------------------------------------------------

    def _identity(self) -> tuple[str, str, str]:
        root = self.storage_root
        if root is None:
            raise InvalidStateError("an Orchestrator must run in a session actor (no storage root)")
        return self.namespace, self.agent_name, root

    async def subagents_namespace(self) -> AgentNamespace:
        """The namespace hosting the sub-agents (``<namespace>.<name>.subs``, under the
        same storage root), started on first use.

        Raises:
            InvalidStateError: the orchestrator does not run in a session actor.
        """
        if self._subs is None:
            namespace, name, root = self._identity()
            ns = AgentNamespace(
                subagents_namespace(namespace, name),
                self.subagent_cls,
                storage_root=root,
                pool_size=self.subagent_pool_size,
                grow_pool=self.subagent_grow_pool,
                warm_up=self.subagent_warm_up,
                idle_timeout=self.subagent_idle_timeout,
                start=False,
            )
            self._subs = await ns.astart()
        return self._subs

    async def shared_bridge(self) -> Any:
        """The handle of the bridge actor owning the shared workspace, got or created
        (and waited for) on first use.

        Raises:
            InvalidStateError: the orchestrator does not run in a session actor.
        """
        if self._bridge is None:
            namespace, name, root = self._identity()
            bridge = open_bridge(root, namespace, name)
            await bridge.ready.remote()
            self._bridge = bridge
        if not self._mcp_synced:
            # The MCP servers live in this agent's database; the bridge (which may have
            # been restarted meanwhile) holds their connections.
            await self._bridge.mcp_sync.remote(list(self._mcp_servers().values()))
            self._mcp_synced = True
        return self._bridge

    @remote
    async def shared_workspace(self) -> BridgeClient:
        """The orchestrator's own (read-write) view of the shared workspace."""
        namespace, name, _ = self._identity()
        bridge = await self.shared_bridge()
        token = await bridge.grant.remote(f"{name}(orchestrator)", "read-write")
        return BridgeClient(bridge_name(namespace, name), token, "read-write")

    async def _handle(self, name: str) -> Handle[Think]:
        if name not in self._handles:
            self._handles[name] = (await self.subagents_namespace()).get(name)
        return self._handles[name]

    # -- registry ------------------------------------------------------------------------

    @remote
    async def create_subagent(
        self,
        name: str,
        config: dict[str, Any] | None = None,
        access: str = "read-write",
        mcp: dict[str, list[str] | None] | list[str] | None = None,
    ) -> SubAgentRecord:
        """Register sub-agent ``name`` with ``config`` (see :class:`SubAgent`),
        ``access`` to the shared workspace and the ``mcp`` servers it may call (server
        names, or server -> tool names or None for all; see :meth:`grant_mcp`),
        configure its actor and grant it; returns its record (the grant's token left
        out).

        Raises:
            InvalidInputError: an invalid name or access, or the name exists.
            McpConfigError: ``mcp`` names an unknown server.
            ModelNotConfiguredError: neither the config nor the orchestrator names a
                model.
        """
        validate_name(name, "sub-agent name")
        if access not in ("none", "read", "read-write"):
            raise InvalidInputError(f"access must be none, read or read-write, not {access!r}")
        if self.registry.has(name):
            raise InvalidInputError(f"sub-agent {name!r} already exists")
        config = self._with_model(name, dict(config or {}))
        grants = self._check_grants(_grant_dict(mcp))
        namespace, me, _ = self._identity()
        bridge = await self.shared_bridge()
        token = await bridge.grant.remote(name, access, grants)
        config[BRIDGE_KEY] = BridgeClient(bridge_name(namespace, me), token, access).to_config()  # type: ignore[arg-type]
        config[MCP_GRANTS_KEY] = grants
        config[MCP_KEY] = await self._granted_tools(grants)
        record = SubAgentRecord(name=name, id=uuid.uuid4().hex, config=config, access=access)
        handle = await self._handle(name)
        await handle.configure.remote(config)
        self.registry.add(record)
        return _public(record)

    def _with_model(self, name: str, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` with a model: its own, else the orchestrator's (a sub-agent with no
        model of its own uses its orchestrator's). Raises ModelNotConfiguredError when
        neither has one and the sub-agent class takes its model from its config."""
        if config.get("model") or self.subagent_cls.get_model is not SubAgent.get_model:
            return config
        inherited = (self.get_config() or {}).get("model")
        if inherited:
            return {**config, "model": inherited}
        raise ModelNotConfiguredError(
            f"sub-agent {name!r} has no model: give it one in its config, e.g. "
            "{'model': {'provider': 'anthropic', 'model_id': 'claude-sonnet-4-6'}}, or "
            "configure the orchestrator's own 'model', which sub-agents then share"
        )

    @remote
    async def configure_subagent(self, name: str, config: dict[str, Any]) -> SubAgentRecord:
        """Merge ``config`` over the sub-agent's (its bridge grant is kept) and apply it;
        returns the updated record.

        Raises:
            SubAgentNotFoundError: no such sub-agent.
            ModelNotConfiguredError: the merged config leaves it without a model.
        """
        record = self.registry.get(name)
        merged = {
            **record.config,
            **config,
            BRIDGE_KEY: record.config.get(BRIDGE_KEY),
            MCP_GRANTS_KEY: record.config.get(MCP_GRANTS_KEY) or {},
            MCP_KEY: record.config.get(MCP_KEY) or [],
        }
        merged = self._with_model(name, merged)
        await (await self._handle(name)).configure.remote(merged)
        return _public(self.registry.update(name, config=merged))

    @remote
    async def set_access(self, name: str, access: str) -> SubAgentRecord:
        """Change what a sub-agent may do in the shared workspace (new grant)."""
        record = self.registry.get(name)
        namespace, me, _ = self._identity()
        grants = record.config.get(MCP_GRANTS_KEY) or {}
        token = await (await self.shared_bridge()).grant.remote(name, access, grants)
        config = dict(record.config)
        config[BRIDGE_KEY] = BridgeClient(bridge_name(namespace, me), token, access).to_config()  # type: ignore[arg-type]
        await (await self._handle(name)).configure.remote(config)
        return _public(self.registry.update(name, config=config, access=access))

    @idempotent
    @remote
    def list_subagents(self) -> list[SubAgentRecord]:
        """Every sub-agent's record, by name (grant tokens left out)."""
        return [_public(r) for r in self.registry.list()]

    @idempotent
    @remote
    def get_subagent(self, name: str) -> SubAgentRecord:
        """The sub-agent's record (grant token left out).

        Raises:
            SubAgentNotFoundError: no such sub-agent.
        """
        return _public(self.registry.get(name))

    @remote
    async def delete_subagent(self, name: str) -> None:
        """Abort its running tasks, hibernate it, revoke its grant, delete its database
        file with all that is its (:func:`~thinkray.storage.removal.remove_agent`) and
        its record.

        Raises:
            SubAgentNotFoundError: no such sub-agent.
        """
        self.registry.get(name)
        for delegation in list(self._delegations.values()):
            if delegation.agent == name and delegation.status == "running":
                await self.abort_task(delegation.task_id, "sub-agent deleted")
        ns = await self.subagents_namespace()
        await ns.directory.hibernate.remote(name, True)
        await (await self.shared_bridge()).revoke.remote(name)
        # Its file and all that is its (its own sub-agents, shared workspace, alarm),
        # under a local or an object-store root; blocking I/O, so off the loop.
        await asyncio.to_thread(remove_agent, self._identity()[2], ns.name, name)
        self._handles.pop(name, None)
        self.registry.remove(name)

    # -- MCP servers ---------------------------------------------------------------------

    def _mcp_servers(self) -> dict[str, dict[str, Any]]:
        return dict(self.store.get_config(MCP_SERVERS_KEY) or {})

    def _mcp_listing(self) -> dict[str, list[dict[str, Any]]]:
        return dict(self.store.get_config(MCP_TOOLS_KEY) or {})

    def _check_grants(self, grants: dict[str, list[str] | None]) -> dict[str, list[str] | None]:
        unknown = sorted(set(grants) - set(self._mcp_servers()))
        if unknown:
            raise McpConfigError(
                f"unknown MCP server(s) {unknown}; known: {sorted(self._mcp_servers()) or 'none'}"
            )
        return grants

    async def _granted_tools(self, grants: dict[str, list[str] | None]) -> list[dict[str, Any]]:
        """The tool infos a sub-agent with ``grants`` sees: each granted server's tools as
        last listed (listed now if never), filtered by the grant."""
        listing = self._mcp_listing()
        tools: list[dict[str, Any]] = []
        for server, allowed in sorted(grants.items()):
            if server not in listing:
                try:
                    await self.refresh_mcp_server(server, apply=False)
                except Exception as exc:  # down now: its tools appear once it is listed
                    log.warning("MCP server %r: cannot list its tools: %s", server, exc)
                listing = self._mcp_listing()
            for info in listing.get(server, []):
                if allowed is None or info["tool"] in allowed:
                    tools.append(info)
        return tools

    async def _apply_mcp(self, name: str, grants: dict[str, list[str] | None]) -> SubAgentRecord:
        """Give sub-agent ``name`` the MCP grant ``grants``: on the bridge, then in its
        config (the tools it sees) and record."""
        record = self.registry.get(name)
        await (await self.shared_bridge()).set_mcp_grant.remote(name, grants)
        config = {
            **record.config,
            MCP_GRANTS_KEY: grants,
            MCP_KEY: await self._granted_tools(grants),
        }
        await (await self._handle(name)).configure.remote(config)
        return _public(self.registry.update(name, config=config))

    @remote
    async def add_mcp_server(self, name: str, config: dict[str, Any]) -> dict[str, Any]:
        """Add (or replace) MCP server ``name`` (see ``McpServerConfig``: ``transport``
        ``stdio`` with ``command``/``args``/``env``/``cwd``, or ``http`` with
        ``url``/``headers``; ``timeout``, ``connect_timeout``, backoff). The config is
        stored in this agent's database; the bridge connects and lists its tools now.
        Returns its status (``connected``, ``tools``, ``last_error``): a server that
        cannot be reached is still added and connects on first use. Sub-agents granted
        it see its new tool list.

        Raises:
            McpConfigError: the config is invalid.
        """
        parsed = McpServerConfig.parse(name, config)
        servers = self._mcp_servers()
        servers[name] = parsed.model_dump()
        self.store.set_config(MCP_SERVERS_KEY, servers)
        bridge = await self.shared_bridge()
        status: dict[str, Any] = await bridge.mcp_add.remote(parsed.model_dump())
        infos = status.pop("tool_infos", None)
        if infos is not None:
            await self._store_listing(name, infos)
        return status

    async def _store_listing(self, server: str, infos: list[dict[str, Any]]) -> None:
        listing = self._mcp_listing()
        changed = listing.get(server) != infos
        listing[server] = infos
        self.store.set_config(MCP_TOOLS_KEY, listing)
        if changed:
            for record in self.registry.list():
                grants = record.config.get(MCP_GRANTS_KEY) or {}
                if server in grants:
                    await self._apply_mcp(record.name, grants)

    @remote
    async def refresh_mcp_server(self, name: str, apply: bool = True) -> list[dict[str, Any]]:
        """List server ``name``'s tools again (connecting if needed) and store the list;
        with ``apply``, sub-agents granted it see the new list. Returns the tools.

        Raises:
            McpConfigError: no such server.
            McpError: the server cannot be reached or answers garbage.
        """
        if name not in self._mcp_servers():
            raise McpConfigError(f"unknown MCP server {name!r}")
        bridge = await self.shared_bridge()
        infos: list[dict[str, Any]] = await bridge.mcp_list.remote(name, True)
        if apply:
            await self._store_listing(name, infos)
        else:
            listing = self._mcp_listing()
            listing[name] = infos
            self.store.set_config(MCP_TOOLS_KEY, listing)
        return infos

    @remote
    async def remove_mcp_server(self, name: str) -> None:
        """Disconnect and forget MCP server ``name``; every sub-agent's grant of it goes.

        Raises:
            McpConfigError: no such server.
        """
        servers = self._mcp_servers()
        if servers.pop(name, None) is None:
            raise McpConfigError(f"unknown MCP server {name!r}")
        for record in self.registry.list():
            grants = dict(record.config.get(MCP_GRANTS_KEY) or {})
            if grants.pop(name, False) is not False:
                await self._apply_mcp(record.name, grants)
        self.store.set_config(MCP_SERVERS_KEY, servers)
        listing = self._mcp_listing()
        listing.pop(name, None)
        self.store.set_config(MCP_TOOLS_KEY, listing)
        await (await self.shared_bridge()).mcp_remove.remote(name)

    @idempotent
    @remote
    async def list_mcp_servers(self) -> list[dict[str, Any]]:
        """Every MCP server: ``name``, ``config`` (as stored), and its connection's
        ``status`` on the bridge (connected, connects, last_error, tools)."""
        servers = self._mcp_servers()
        if not servers:
            return []
        statuses = {s["name"]: s for s in await (await self.shared_bridge()).mcp_status.remote()}
        return [
            {"name": n, "config": servers[n], "status": statuses.get(n)} for n in sorted(servers)
        ]

    @idempotent
    @remote
    def list_mcp_tools(self, name: str) -> list[dict[str, Any]]:
        """Server ``name``'s tools as last listed (``McpToolInfo`` dicts).

        Raises:
            McpConfigError: no such server.
        """
        if name not in self._mcp_servers():
            raise McpConfigError(f"unknown MCP server {name!r}")
        return list(self._mcp_listing().get(name, []))

    @remote
    async def grant_mcp(
        self, agent: str, server: str, tools: list[str] | None = None
    ) -> SubAgentRecord:
        """Let sub-agent ``agent`` call MCP ``server``'s ``tools`` (None: all of them);
        it sees them from its next turn on. Returns its record.

        Raises:
            SubAgentNotFoundError: no such sub-agent.
            McpConfigError: no such server.
        """
        record = self.registry.get(agent)
        self._check_grants({server: tools})
        grants = dict(record.config.get(MCP_GRANTS_KEY) or {})
        grants[server] = None if tools is None else list(tools)
        return await self._apply_mcp(agent, grants)

    @remote
    async def revoke_mcp(self, agent: str, server: str | None = None) -> SubAgentRecord:
        """Take MCP ``server`` (None: every server) away from sub-agent ``agent``; the
        bridge refuses its calls at once. Returns its record.

        Raises:
            SubAgentNotFoundError: no such sub-agent.
        """
        record = self.registry.get(agent)
        grants = dict(record.config.get(MCP_GRANTS_KEY) or {})
        if server is None:
            grants = {}
        else:
            grants.pop(server, None)
        return await self._apply_mcp(agent, grants)

    # -- delegation ----------------------------------------------------------------------

    @remote
    async def delegate(
        self,
        name: str,
        task: str,
        *,
        wait: bool = True,
        signal: AbortSignal | None = None,
    ) -> TaskInfo:
        """Give ``task`` to sub-agent ``name``. Blocking returns its final message;
        ``wait=False`` returns at once with a task id whose chunks are relayed live and
        buffered (see :meth:`view_task`). ``signal``: the parent run's abort signal —
        aborting it aborts this task. Traced as ``thinkray.delegate`` (the sub-agent's
        turn, in its own actor, is that span's child)."""
        if not self.registry.has(name):
            raise SubAgentNotFoundError(
                f"unknown sub-agent {name!r}; known: {[r.name for r in self.registry.list()]}"
            )
        if not tracing.enabled():
            return await self._delegate(name, task, wait, signal)
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": name,
            "thinkray.delegate.wait": wait,
        }
        with tracing.span("thinkray.delegate", attributes) as span:
            info = await self._delegate(name, task, wait, signal)
            tracing.set_attributes(
                span, {"thinkray.task.id": info.task_id, "thinkray.task.status": info.status}
            )
            if info.status == "error":
                tracing.record_error(span, info.error or "sub-agent error")
            return info

    async def _delegate(
        self, name: str, task: str, wait: bool, signal: AbortSignal | None
    ) -> TaskInfo:
        if self.registry.get(name).access != "none":
            # The bridge is not detached: once this agent hibernated, nothing referred
            # to it and Ray stopped it. The sub-agent's workspace tools look it up by
            # name, so it must be running (opened again from its file) before the task.
            await self.shared_bridge()
        handle = await self._handle(name)
        stream = await handle.stream_chat.remote(task).start()
        delegation = Delegation(
            task_id=new_id("task"),
            agent=name,
            task=task,
            stream=RunStream(stream.run_id or "", name),
            run_id=stream.run_id,
            message_id=stream.message_id,
            receiver=stream.receiver,
        )
        self._delegations[delegation.task_id] = delegation
        self.registry.update(name, status="busy", last_task=task, last_active=time.time())
        if signal is not None:
            signal.add_listener(
                lambda reason: asyncio.ensure_future(
                    self.abort_task(delegation.task_id, "aborted by parent")
                )
            )
        delegation.consumer = asyncio.ensure_future(self._relay(delegation, stream, handle))
        if wait:
            await asyncio.shield(delegation.consumer)
            return await self._final(delegation, handle)
        return delegation.summary()

    async def _relay(self, delegation: Delegation, stream: Any, handle: Handle[Think]) -> None:
        texts: list[str] = []
        try:
            async for chunk in stream:
                delegation.stream.push(chunk)
                t = chunk.get("type")
                if t == "text-delta":
                    texts.append(chunk["delta"])
                elif t == "abort":
                    delegation.status = "aborted"
                elif t == "error":
                    delegation.status = "error"
                    delegation.error = chunk.get("errorText")
            if delegation.status == "running":
                delegation.status = "completed"
        except Exception as exc:
            delegation.status = "error"
            delegation.error = f"{type(exc).__name__}: {exc}"
        finally:
            delegation.text = "".join(texts)
            delegation.finished_at = time.time()
            delegation.stream.close(delegation.error)
            count: int | None
            try:
                count = await handle.message_count.remote()
            except Exception:
                count = None
            fields: dict[str, Any] = {
                "status": "error" if delegation.status == "error" else "idle",
                "last_active": time.time(),
                "last_error": delegation.error,
            }
            if count is not None:
                fields["message_count"] = count
            if self.registry.has(delegation.agent):
                self.registry.update(delegation.agent, **fields)

    async def _final(self, delegation: Delegation, handle: Handle[Think]) -> TaskInfo:
        result = delegation.summary()
        # The run's own message, by id: no read of the sub-agent's whole history.
        result.message = (
            await handle.get_message.remote(delegation.message_id)
            if delegation.message_id
            else None
        )
        return result

    @idempotent
    @remote
    async def wait_task(self, task_id: str, timeout: float | None = None) -> TaskInfo:
        """The task once it finished (waiting at most ``timeout`` seconds).

        Raises:
            InvalidInputError: an unknown task id.
            TimeoutError: still running after ``timeout`` (the task goes on).
        """
        delegation = self._delegation(task_id)
        if delegation.consumer is not None:
            await asyncio.wait_for(asyncio.shield(delegation.consumer), timeout)
        return delegation.summary()

    @idempotent
    @remote
    def task_status(self, task_id: str) -> TaskInfo:
        """The task now: status and the text so far.

        Raises:
            InvalidInputError: an unknown task id.
        """
        return self._delegation(task_id).summary()

    @idempotent
    @remote
    def list_tasks(self) -> list[TaskInfo]:
        """Every task delegated since this orchestrator woke, oldest first."""
        return [d.summary() for d in self._delegations.values()]

    @idempotent
    @remote
    async def abort_task(self, task_id: str, reason: str = "aborted by parent") -> bool:
        """Abort the task's run on its sub-agent; False if it is no longer running.

        Raises:
            InvalidInputError: an unknown task id.
        """
        delegation = self._delegation(task_id)
        if delegation.status != "running" or delegation.receiver is None:
            return False
        return await delegation.receiver.abort_async(reason)

    def _delegation(self, task_id: str) -> Delegation:
        try:
            return self._delegations[task_id]
        except KeyError:
            raise InvalidInputError(f"unknown task {task_id!r}") from None

    @idempotent
    @remote
    async def view_task(self, task_id: str) -> AsyncIterator[UIChunk]:
        """Async generator: the task's chunks from index 0 (the buffer), then the live
        tail. Leaving early detaches; the task goes on."""
        delegation = self._delegation(task_id)
        async for batch in delegation.stream.follow(coalesce=0.002):
            yield Batch(batch)  # type: ignore[misc]  # a Batch of chunks travels as one

    @idempotent
    @remote
    async def view_subagent(self, name: str) -> AsyncIterator[UIChunk]:
        """Any caller can watch any sub-agent: its latest delegated task if this
        orchestrator holds one, else the sub-agent's own resume stream."""
        self.registry.get(name)
        latest = [d for d in self._delegations.values() if d.agent == name]
        if latest:
            async for batch in self.view_task(latest[-1].task_id):
                yield batch
            return
        async for chunk in (await self._handle(name)).resume.remote():
            yield chunk

    # -- tools for the orchestrator's own model ------------------------------------------

    def get_tools(self) -> dict[str, Tool]:
        """The orchestrator model's tools: ``delegate_task``, ``task_status``,
        ``list_agents``, ``create_agent``."""
        orchestrator = self

        @tool
        async def delegate_task(
            agent: str, task: str, wait: bool = True, *, ctx: ToolContext
        ) -> dict[str, Any]:
            """Give a task to a sub-agent. wait=true returns its answer; wait=false
            returns a task id at once (check it with task_status)."""
            result = await orchestrator.delegate(agent, task, wait=wait, signal=ctx.signal)
            result.message = None  # the text is the answer; the parts stay with the sub-agent
            return result.to_dict()

        @tool
        def task_status(task_id: str) -> dict[str, Any]:
            """Status and text so far of a delegated task."""
            return orchestrator.task_status(task_id).to_dict()

        @tool
        def list_agents() -> list[dict[str, Any]]:
            """The sub-agents, their status and last task."""
            return [r.to_dict() for r in orchestrator.list_subagents()]

        @tool
        async def create_agent(
            name: str, instructions: str, access: str = "read-write"
        ) -> dict[str, Any]:
            """Create a sub-agent with the given instructions and shared-workspace access
            (none, read or read-write)."""
            record = await orchestrator.create_subagent(
                name, {"instructions": instructions}, access=access
            )
            return record.to_dict()

        return {t.name: t for t in (delegate_task, task_status, list_agents, create_agent)}

    def get_manifest_prompt(self) -> str:
        """The config's ``instructions``, else a coordinator's default prompt."""
        return (self.get_config() or {}).get("instructions") or (
            "You coordinate sub-agents. Delegate focused tasks with delegate_task; run "
            "independent tasks in parallel with wait=false and check them with task_status."
        )

    def get_model(self) -> Model:
        """The model its config names, else the one it was constructed with (see
        :func:`build_model`, same errors)."""
        return build_model((self.get_config() or {}).get("model"), self._model)

    def has_pending_work(self) -> bool:
        """True while a delegated task runs (its relay lives here), or Think says so."""
        running = any(d.status == "running" for d in self._delegations.values())
        return running or super().has_pending_work()

    async def on_hibernate(self) -> None:
        """Drop the sub-agents' namespace object; its directory actor lives on (as does
        the bridge with its MCP connections; the next wake syncs its server list).
        Under an object-store root the bridge uploads its workspace file if it changed
        (its sub-agents may have written with this agent idle)."""
        if self._subs is not None:
            self._subs = None  # the directory actor lives on; handles re-resolve
        root = self.storage_root
        if root is not None and is_uri(root):
            try:
                bridge = ray.get_actor(
                    bridge_name(self.namespace, self.agent_name), namespace="thinkray"
                )
            except ValueError:
                return  # no bridge: nothing to upload
            try:
                await bridge.sync.remote()
            except Exception as exc:  # the bridge keeps its file; its next sync retries
                log.error("the shared workspace of %s was not uploaded: %s", self.agent_name, exc)


def _grant_dict(mcp: dict[str, list[str] | None] | list[str] | None) -> dict[str, list[str] | None]:
    """``create_subagent``'s ``mcp``: server names (all their tools) or a grant dict."""
    if mcp is None:
        return {}
    if isinstance(mcp, list | tuple):
        return {str(server): None for server in mcp}
    if isinstance(mcp, dict):
        return {str(k): (None if v is None else [str(t) for t in v]) for k, v in mcp.items()}
    raise McpConfigError("mcp must be a list of server names or a dict server -> tools")


def _public(record: SubAgentRecord) -> SubAgentRecord:
    """The record as callers see it: the bridge grant's token is never handed out."""
    bridge = record.config.get(BRIDGE_KEY)
    if not bridge:
        return record
    return dataclasses.replace(
        record, config={**record.config, BRIDGE_KEY: {"access": bridge["access"]}}
    )
