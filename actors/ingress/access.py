"""Who may reach which agent: the FastAPI dependencies every route goes through.

- :func:`principal`: the authenticated caller of an HTTP request (401 otherwise).
- :func:`owned_agent` / :func:`claimed_agent`: the caller's agent handle; the single
  place ownership is decided (:func:`agent_of`). Another principal's name and an
  unknown class are answered alike (404), so names do not leak.
- :func:`ws_upgrade`: the same for a WebSocket upgrade, plus its ``Origin`` and its
  ticket; a socket on a name nobody owns yet is accepted but joins no fan-out until
  its principal owns the name (``ws.Hub``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import Depends, Request
from starlette.requests import HTTPConnection
from thinkray.actors.ingress.agents import Agents, NotVisibleError
from thinkray.actors.ingress.auth import Authenticator, Principal
from thinkray.actors.ingress.common import HTTPError, need_id
from thinkray.actors.ingress.config import IngressConfig
from thinkray.actors.ingress.tickets import Tickets
from thinkray.storage.layout import validate_name
from thinkray.storage.types import InvalidInputError

PATH_IDS = {"chat_id": "chat id", "sid": "session id", "approval_id": "approval id"}


@dataclass
class Ingress:
    """What one replica's routes share (``app.state.ingress``)."""

    config: IngressConfig
    agents: Agents
    authenticator: Authenticator
    tickets: Tickets
    hub: Any = None  # the WebSocket connections (``ws.Hub``)


async def ingress(conn: HTTPConnection) -> Ingress:
    """The replica's shared state (a dependency for HTTP and WebSocket routes)."""
    state: Ingress = conn.app.state.ingress
    return state


async def owner_of(ing: Ingress, slug: str, name: str) -> str | None:
    """The principal owning agent ``slug``/``name``, None if nobody does yet.

    Raises:
        InvalidInputError: an invalid agent name.
        NotVisibleError: an unknown agent class.
    """
    validate_name(name, "agent name")
    return await ing.agents.owner_of(slug, name)  # off the loop (a GET on s3:// roots)


async def agent_of(ing: Ingress, slug: str, name: str, who: Principal, *, claim: bool) -> Any:
    """``who``'s handle of agent ``slug``/``name`` (``claim``: an unclaimed name becomes
    theirs). Every route and every WebSocket fan-out reaches an agent through here.

    Raises:
        NotVisibleError: unknown class, another principal's name, or (without
            ``claim``) a name nobody owns.
    """
    return await ing.agents.agent(slug, name, who, claim=claim)


async def may_open(ing: Ingress, slug: str, name: str, who: Principal) -> bool:
    """Whether ``who`` owns ``slug``/``name`` (True) or nobody does yet (False).

    Raises:
        NotVisibleError: another principal's name, or an unknown class.
    """
    owner = await owner_of(ing, slug, name)
    if owner is not None and owner != who.id:
        raise NotVisibleError(f"no agent {name!r} of class {slug!r}")
    return owner is not None


# -- HTTP ---------------------------------------------------------------------------------


async def principal(request: Request, ing: Annotated[Ingress, Depends(ingress)]) -> Principal:
    """The caller (401 without a valid credential). ``get-messages`` also takes the
    agent's WebSocket ticket: the ``agents`` client fetches it with the socket's query."""
    who = await ing.authenticator.authenticate(request)
    ticket = request.query_params.get("ticket")
    if who is None and ticket and request.url.path.endswith("/get-messages"):
        params = request.path_params
        who = ing.tickets.check(ticket, params.get("agent", ""), params.get("name", ""))
    if who is None:
        raise HTTPError(401, "missing or invalid bearer token", "unauthorized")
    return who


async def path_ids(request: Request) -> None:
    """Chat, session and approval ids in the path: printable, 1-256 characters."""
    for key, what in PATH_IDS.items():
        if key in request.path_params:
            need_id(request.path_params[key], what)


async def owned_agent(
    agent: str,
    name: str,
    who: Annotated[Principal, Depends(principal)],
    ing: Annotated[Ingress, Depends(ingress)],
) -> Any:
    """The caller's existing agent (404 for an unclaimed or another's name)."""
    return await agent_of(ing, agent, name, who, claim=False)


async def claimed_agent(
    agent: str,
    name: str,
    who: Annotated[Principal, Depends(principal)],
    ing: Annotated[Ingress, Depends(ingress)],
) -> Any:
    """The caller's agent, claiming an unclaimed name (routes that create something,
    once their input is valid: depend on the body's validation first)."""
    return await agent_of(ing, agent, name, who, claim=True)


async def agent_if_owned(
    agent: str,
    name: str,
    who: Annotated[Principal, Depends(principal)],
    ing: Annotated[Ingress, Depends(ingress)],
) -> Any | None:
    """The caller's existing agent, None where :func:`owned_agent` would answer 404."""
    try:
        return await agent_of(ing, agent, name, who, claim=False)
    except NotVisibleError:
        return None


# -- WebSocket ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Upgrade:
    """A WebSocket upgrade, decided: its principal and whether it owns the name, or
    why it is refused (``status``, ``message``)."""

    principal: Principal | None = None
    owned: bool = False
    status: int = 0
    message: str = ""


def origin_allowed(conn: HTTPConnection, allowed: list[str]) -> bool:
    """A browser's upgrade comes from the page's own origin or a configured one (else
    any site could open a socket with the user's cookies). No ``Origin``: not a
    browser, nothing to hijack."""
    origin = conn.headers.get("origin")
    if origin is None or "*" in allowed or origin in allowed:
        return True
    return urlsplit(origin).netloc == conn.headers.get("host")


async def upgrade_principal(websocket: HTTPConnection, ing: Ingress) -> Principal | None:
    """The caller of an upgrade: a ticket for this agent (browsers), else the
    authenticator (a header, a cookie)."""
    ticket = websocket.query_params.get("ticket")
    if ticket:
        params = websocket.path_params
        return ing.tickets.check(ticket, params.get("agent", ""), params.get("name", ""))
    return await ing.authenticator.authenticate(websocket)


async def ws_upgrade(
    websocket: HTTPConnection, agent: str, name: str, ing: Annotated[Ingress, Depends(ingress)]
) -> Upgrade:
    """Decide an upgrade before it is accepted: origin (403), credential (401),
    visibility (404)."""
    if not origin_allowed(websocket, ing.config.cors_origins):
        return Upgrade(status=403, message="origin not allowed")
    who = await upgrade_principal(websocket, ing)
    if who is None:
        return Upgrade(status=401, message="missing or invalid bearer token or ticket")
    try:
        return Upgrade(who, await may_open(ing, agent, name, who))
    except (NotVisibleError, InvalidInputError) as exc:
        return Upgrade(status=404, message=str(exc))
