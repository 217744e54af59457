"""From a request to an agent: the slug names an agent class (its namespace), the
name an instance, and the principal must own it. Shared by the HTTP and WebSocket
routes; holds no session state (the session actors own their streams), so any
replica serves any agent."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from thinkray.actors.ingress.auth import Principal
from thinkray.actors.ingress.config import IngressConfig
from thinkray.actors.namespace import AgentHandle, AgentNamespace
from thinkray.storage.errors import UserError
from thinkray.storage.layout import validate_name
from thinkray.storage.owners import OwnerRegistry


class NotVisibleError(UserError, LookupError):
    """No such agent for this principal: unknown, or another principal's (the two are
    answered alike, 404, so names do not leak)."""


class Agents:
    """The namespaces an ingress serves and the owner of every agent name."""

    def __init__(self, config: IngressConfig) -> None:
        self.config = config
        self.owners = OwnerRegistry(config.storage_root)
        self._namespaces: dict[str, AgentNamespace[Any]] = {}
        self._lock = asyncio.Lock()

    async def namespace(self, slug: str) -> AgentNamespace[Any]:
        """The namespace of agent class ``slug``, created (or attached to) on first use."""
        route = self.config.agents.get(slug)
        if route is None:
            raise NotVisibleError(
                f"unknown agent class {slug!r}; this server has: {', '.join(self.config.agents)}"
            )
        ns = self._namespaces.get(slug)
        if ns is not None:
            return ns
        async with self._lock:
            ns = self._namespaces.get(slug)
            if ns is None:
                # Detached and shared by name: the first replica creates the directory,
                # the others attach to it (get_if_exists), and it outlives them all.
                ns = AgentNamespace(
                    route.namespace,
                    route.load_class(),
                    storage_root=self.config.storage_root,
                    agent_kwargs=route.agent_kwargs,
                    start=False,
                    **route.namespace_options,
                )
                await ns.astart()
                self._namespaces[slug] = ns
        return ns

    async def agent(
        self, slug: str, name: str, principal: Principal, *, claim: bool
    ) -> AgentHandle[Any]:
        """The handle of ``principal``'s agent ``name``. ``claim``: the request may
        create it (a chat, a new session), so an unclaimed name becomes the caller's;
        otherwise an unclaimed name is not found and nothing is written.

        Raises:
            InvalidInputError: an invalid agent name.
            NotVisibleError: an unknown slug, or a name the caller does not own.
        """
        validate_name(name, "agent name")
        ns = await self.namespace(slug)
        await self.check_owner(slug, name, principal, claim=claim)
        handle = ns.get(name) if claim else ns.existing(name)
        return cast("AgentHandle[Any]", handle)

    async def check_owner(self, slug: str, name: str, principal: Principal, *, claim: bool) -> None:
        """Pass when ``principal`` owns ``name`` (or, with ``claim``, has just claimed
        it). The owner store is read in a worker thread: under an ``s3://`` root each
        read or claim is a blocking HTTP call, which would stall every stream this
        replica serves if it ran on the event loop.

        Raises:
            NotVisibleError: an unknown slug, or a name the caller does not own.
        """
        route = self.config.agents.get(slug)
        if route is None:
            raise NotVisibleError(f"unknown agent class {slug!r}")
        owner = await self.owner_of(slug, name)
        if owner is None and claim:
            won = await self.owners.aclaim(route.namespace, name, principal.id)
            owner = principal.id if won else await self.owner_of(slug, name)
        if owner != principal.id:
            raise NotVisibleError(f"no agent {name!r} of class {slug!r}")

    async def owner_of(self, slug: str, name: str) -> str | None:
        """The principal owning agent ``name`` of class ``slug`` (None: unclaimed),
        read off the event loop."""
        route = self.config.agents.get(slug)
        if route is None:
            raise NotVisibleError(f"unknown agent class {slug!r}")
        return await self.owners.aowner(route.namespace, name)

    async def live(self, slug: str, name: str) -> bool:
        """Whether agent ``name`` is live now (asks the directory; never wakes it)."""
        ns = await self.namespace(slug)
        return bool(await ns.directory.live_actor.remote(name))

    async def owned(self, slug: str, principal: Principal) -> list[str]:
        """The agent names of class ``slug`` that ``principal`` owns (from the
        principal's owner index, off the event loop: O(own agents) reads)."""
        route = self.config.agents.get(slug)
        if route is None:
            raise NotVisibleError(f"unknown agent class {slug!r}")
        return await self.owners.anames(route.namespace, principal.id)
