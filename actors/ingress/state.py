"""An agent's synced state at the ingress (Cloudflare agents' ``cf_agent_state``): the
feed that carries every change from the agent's actor to this replica's clients, and
the HTTP routes.

One feed per agent per replica, while the agent has clients here (its owner's
WebSocket members or state event streams): it reads the session actor's
``state_events`` (the state now, then each change, whoever made it: the agent, a
Python handle, a client through any replica) and hands each change to the hub
(``ws.Hub.publish_state``), which sends it to the owner's connections only. While
the agent hibernates its state cannot change and nothing keeps it awake: the feed
looks for it to come back every :data:`STATE_POLL` seconds, and its first item then
is the current state (versions tell what is new).

Routes (behind the authenticator and the ownership dependencies of :mod:`.access`,
404 for a class without ``state_model``):

- ``GET /agents/{agent}/{name}/state``: ``{"state", "version"}``.
- ``PUT .../state`` with ``{"state": {...}}``: a client's change (the class must allow
  it: ``client_can_set_state``, then its ``validate_state_change`` hook); 400 when it
  does not fit the model, 403 when refused; nothing is stored then. Checked before the
  name is claimed, like a chat.
- ``GET .../state/stream``: server-sent events ``event: state`` with data
  ``{"state", "version"}``, the current state first, then each change. A consumer that
  falls behind skips to the newest state (state is last-writer-wins).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

import ray
from fastapi import Depends
from fastapi.responses import JSONResponse, Response
from thinkray.actors.ingress.access import (
    Ingress,
    agent_of,
    claimed_agent,
    ingress,
    owned_agent,
    principal,
)
from thinkray.actors.ingress.agents import NotVisibleError
from thinkray.actors.ingress.auth import Principal
from thinkray.actors.ingress.common import HTTPError
from thinkray.actors.ingress.routes import BASE, SSEResponse, json_body, json_body_doc, router
from thinkray.actors.relay import NotBoundError
from thinkray.runtime.agents.state import initial_state_of, validate_state
from thinkray.runtime.errors import StateChangeRefusedError

log = logging.getLogger("thinkray.ingress.state")

STATE_POLL = 1.0
"""Seconds between looks for a hibernated agent to come back (it runs nothing, so its
state cannot change meanwhile; looking never wakes it)."""

Key = tuple[str, str]
Publish = Callable[[dict[str, Any]], None]


def state_class(ing: Ingress, slug: str, *, strict: bool = False) -> type | None:
    """Agent class ``slug`` if it declares a synced state, else None (unknown too).
    A class that cannot be loaded is None too, unless ``strict`` (its ValueError then
    propagates): a socket's greeting and fan-out go on without state, and the request
    that needs the class reports the misconfiguration (as an internal error)."""
    route = ing.config.agents.get(slug)
    if route is None:
        return None
    try:
        cls = route.load_class()
    except ValueError:
        if strict:
            raise
        log.debug("agent class %r cannot be loaded: no synced state", slug)
        return None
    return cls if getattr(cls, "state_model", None) is not None else None


def need_state_class(ing: Ingress, slug: str) -> type:
    """Agent class ``slug``, which must declare a synced state (404 otherwise).

    Raises:
        ValueError: the class cannot be loaded (a misconfiguration: answered 500).
    """
    cls = state_class(ing, slug, strict=True)
    if cls is None:
        if slug not in ing.config.agents:
            raise NotVisibleError(f"unknown agent class {slug!r}")
        raise HTTPError(404, f"agent class {slug!r} has no synced state", "not_found")
    return cls


def initial_snapshot(cls: type) -> dict[str, Any]:
    """The state of an agent nobody made yet: the class's initial state, version 0."""
    initial = initial_state_of(cls)
    assert initial is not None
    return {"state": initial.model_dump(mode="json"), "version": 0}


def precheck_client_state(cls: type, value: Any) -> None:
    """What can be told before anything is claimed or woken: the class lets clients
    set its state and ``value`` fits its model (the agent checks both again, and runs
    its hook).

    Raises:
        StateChangeRefusedError: the class does not let clients set its state.
        InvalidAgentStateError: ``value`` does not fit the model.
    """
    if not getattr(cls, "client_can_set_state", False):
        raise StateChangeRefusedError(
            f"clients may not set the state of {cls.__name__} (client_can_set_state is off)"
        )
    validate_state(cls.state_model, value)  # type: ignore[attr-defined]


def public(change: dict[str, Any]) -> dict[str, Any]:
    """What a client is told of a change: the state and its version."""
    return {"state": change["state"], "version": change["version"]}


# -- the feed ------------------------------------------------------------------------------


_WENT_AWAY = (
    ray.exceptions.RayActorError,
    ray.exceptions.ActorUnavailableError,
    NotBoundError,
    NotVisibleError,
)
"""How a watch ends when the agent's actor is gone or the name is not the caller's: the
feed looks again, quietly. Anything else is logged as a warning."""


async def state_changes(
    ing: Ingress, key: Key, who: Principal, stale: bool
) -> AsyncIterator[dict[str, Any]]:
    """The changes the agent's actor reports until it goes away (``stale``: the handle
    may remember the actor of an earlier binding, ask the directory again)."""
    slug, name = key
    try:
        handle = await agent_of(ing, slug, name, who, claim=False)
        actor = await handle._actor_async(stale=stale)
        gen = actor.state_events.options(num_returns="streaming").remote(name)
        async for ref in gen:
            yield await ref
    except _WENT_AWAY as exc:  # the actor died or unbound, or the name is not theirs
        log.debug("state feed of %s/%s ended: %s", slug, name, exc)
    except Exception as exc:  # anything else is a fault the clients would only see as silence
        log.warning("state feed of %s/%s failed: %r (looking again)", slug, name, exc)


async def live(ing: Ingress, key: Key) -> bool:
    """Whether the agent is live (False when the directory cannot say)."""
    try:
        return await ing.agents.live(*key)
    except Exception as exc:
        log.debug("could not tell whether %s/%s is live: %s", *key, exc)
        return False


async def follow_state(ing: Ingress, key: Key, who: Principal, publish: Publish) -> None:
    """The agent's state changes, to ``publish``, until cancelled (the hub does, once
    the agent has no client here)."""
    stale = False
    while True:
        if await live(ing, key):
            heard = False
            async for change in state_changes(ing, key, who, stale):
                heard = True
                publish(change)
            stale = not heard
        await asyncio.sleep(STATE_POLL)


@dataclass(eq=False)
class StateWatcher:
    """One state event stream: the newest change it has not sent yet (older ones are
    skipped: only the last state matters)."""

    principal: Principal
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    version: int = -1
    pending: dict[str, Any] | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    def offer(self, change: dict[str, Any]) -> None:
        """Keep ``change`` to send if it is newer than what was sent or kept."""
        if change["version"] > self.version:
            self.version = change["version"]
            self.pending = change
            self.ready.set()

    async def next(self) -> dict[str, Any]:
        """The newest change not sent yet (waits for one)."""
        while self.pending is None:
            self.ready.clear()
            await self.ready.wait()
        change, self.pending = self.pending, None
        return change


def sse_state(change: dict[str, Any]) -> str:
    """One ``event: state`` frame."""
    return f"event: state\ndata: {json.dumps(public(change))}\n\n"


async def state_events(
    ing: Ingress, key: Key, who: Principal, first: dict[str, Any]
) -> AsyncIterator[str]:
    """The stream of ``GET .../state/stream``: registered with the hub while it is
    read (one path for every client of the agent), the current state first."""
    watcher = StateWatcher(who)
    hub = ing.hub
    try:
        hub.watch_state(key, watcher, ing)
        watcher.offer(first)
        watcher.offer(hub.latest_state(key) or first)
        while True:
            yield sse_state(await watcher.next())
    finally:
        hub.unwatch_state(key, watcher)


# -- routes --------------------------------------------------------------------------------

state_routes = router()


async def with_state(agent: str, ing: Annotated[Ingress, Depends(ingress)]) -> type:
    """The agent class, which must declare a synced state (404 otherwise)."""
    return need_state_class(ing, agent)


async def client_state(
    body: Annotated[dict[str, Any], Depends(json_body)],
    cls: Annotated[type, Depends(with_state)],
) -> Any:
    """The body's ``state``, checked before the name is claimed."""
    if "state" not in body:
        raise HTTPError(400, "the body needs a 'state'")
    precheck_client_state(cls, body["state"])
    return body["state"]


@state_routes.get(f"{BASE}/state", dependencies=[Depends(with_state)])
async def get_state(handle: Annotated[Any, Depends(owned_agent)]) -> Response:
    """The agent's state and its version."""
    return JSONResponse(public(await handle.state_snapshot.remote()))


@state_routes.put(
    f"{BASE}/state", openapi_extra=json_body_doc({"state": {"type": "object"}}, ["state"])
)
async def put_state(
    agent: str,
    name: str,
    value: Annotated[Any, Depends(client_state)],
    handle: Annotated[Any, Depends(claimed_agent)],
    who: Annotated[Principal, Depends(principal)],
    ing: Annotated[Ingress, Depends(ingress)],
) -> Response:
    """A client's state change; every client of the agent hears it (the caller's
    sockets that waited on a name this request claimed too)."""
    ing.hub.claimed((agent, name), who)
    return JSONResponse(public(await handle.set_client_state.remote(value)))


@state_routes.get(f"{BASE}/state/stream", dependencies=[Depends(with_state)])
async def stream_state(
    agent: str,
    name: str,
    handle: Annotated[Any, Depends(owned_agent)],
    who: Annotated[Principal, Depends(principal)],
    ing: Annotated[Ingress, Depends(ingress)],
) -> Response:
    """The agent's state as server-sent events: now, then each change."""
    first = await handle.state_snapshot.remote()
    return SSEResponse(
        state_events(ing, (agent, name), who, first), ing.config.slow_consumer_timeout
    )
