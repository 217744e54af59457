"""The ingress's ASGI app: the AI SDK's HTTP chat protocol, session operations for a
UI, live status, and (``ws``) the ``cf_agent_*`` WebSocket protocol, in front of the
session actors. Replicas hold no session state: a live stream belongs to its session
actor, so a stream started through one replica resumes through any other.

Routes (every one behind the authenticator; ``{agent}`` is an agent class's slug,
``{name}`` an agent instance the caller owns, ``{chat_id}`` a session of it):

- ``POST /agents/{agent}/{name}/chat``: the body ``DefaultChatTransport`` sends
  (``id``, ``messages``, ``trigger``, ``messageId``) -> the UI message stream (SSE,
  ``x-vercel-ai-ui-message-stream: v1``, ending ``data: [DONE]``). A client that
  disconnects detaches; the run goes on.
- ``GET .../chat/{chat_id}/stream``: the active run from chunk 0, then its live tail;
  204 when none is active.
- ``GET .../chat/{chat_id}/messages``: the stored ``UIMessage[]``.
- ``POST .../chat/{chat_id}/abort``: stop the run in flight (no effect without one).
- ``GET .../get-messages``: the current session's messages (the ``agents`` client).
- ``GET|POST .../sessions``, ``PATCH|DELETE .../sessions/{sid}``,
  ``POST .../sessions/{sid}/{branch|rewind|unrewind|compact}``,
  ``GET .../sessions/{sid}/status`` (an event stream of status changes).
- ``GET .../search?q=<words>[&limit=10][&session=<sid>]``: the agent's stored messages
  that best match (BM25), best first, with session, message id, role and snippet.
- ``GET .../approvals?session=<sid>``: the tool calls waiting for a human's approval
  (all sessions without ``session``); ``GET .../approvals/{approval_id}``: one
  approval, pending or decided (who answered, when, how);
  ``POST .../approvals/{approval_id}`` with ``{"decision": "once" | "session" |
  "always" | "deny"}``: answer it. The answerer is the authenticated principal (never
  a body field), checked by the agent's ``may_approve`` hook (403 when refused); an
  unknown or already-decided approval is 404 and nothing is written; an agent class
  without approvals (plain ``Think``) answers 404. The waiting run's stream goes on:
  the tool runs (``tool-output-available``) or is denied (``tool-output-denied``).
- ``GET|PUT .../state``, ``GET .../state/stream``: the agent's synced state (a class
  with ``state_model``; :mod:`.state`), its changes as server-sent events.
- ``GET /agents/{agent}``: the caller's agents of that class.
- ``POST .../ws-ticket``: a short-lived ticket to open this agent's WebSocket from a
  browser (``/agents/{agent}/{name}?ticket=...``; :mod:`.tickets`).
- ``/agents/{agent}/{name}`` upgraded: the ``cf_agent_*`` WebSocket protocol
  (:mod:`.ws`).

The routes are module-level functions on ``APIRouter``s (:mod:`.routes`, :mod:`.ws`)
whose dependencies (:mod:`.access`) authenticate the caller and decide, in one place,
which agent it may reach; :mod:`.common` holds what both protocols share.
"""

from __future__ import annotations

import uuid

from fastapi import FastAPI
from opentelemetry.trace import SpanKind
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from thinkray.actors.ingress.access import Ingress
from thinkray.actors.ingress.agents import Agents
from thinkray.actors.ingress.auth import Authenticator, BearerTokens
from thinkray.actors.ingress.common import (  # noqa: F401  (the names callers import from here)
    HTTPError,
    error_response,
    error_status,
    jsonable,
    rewind_for_regenerate,
)
from thinkray.actors.ingress.config import IngressConfig, load_object, resolve_tokens
from thinkray.actors.ingress.routes import approval_routes, chat_routes, page_routes, session_routes
from thinkray.actors.ingress.state import state_routes
from thinkray.actors.ingress.tickets import TICKET_KEY_ENV, Tickets, new_key
from thinkray.actors.ingress.ws import Hub, ws_routes
from thinkray.runtime.observability import tracing
from thinkray.runtime.observability.setup import configure_from_env


def make_authenticator(config: IngressConfig) -> Authenticator:
    """The configured authenticator: the user's hook, else the bearer tokens
    (``tokens``, ``tokens_file`` or ``$THINKRAY_TOKENS``; a placeholder is refused)."""
    if config.authenticator:
        factory = load_object(config.authenticator)
        made = factory() if callable(factory) else factory
        if not isinstance(made, Authenticator):
            raise ValueError(f"{config.authenticator!r} did not give an Authenticator")
        return made
    return BearerTokens(resolve_tokens(config))


def ticket_key(given: bytes | None) -> bytes:
    """The key tickets are signed with: ``given`` (the application's, shared by its
    replicas), else ``$THINKRAY_TICKET_KEY``, else a fresh one (a single replica)."""
    if given is not None:
        return given
    import os

    env = os.environ.get(TICKET_KEY_ENV, "")
    if env:
        if len(env) < 32:
            raise ValueError(f"${TICKET_KEY_ENV} needs at least 32 characters")
        return env.encode()
    return new_key()


class ReplicaHeader:
    """Names the replica that answered in every HTTP response (``x-thinkray-replica``,
    random per app instance): which replica served a request, for operators and tests
    (a stream started through one replica resumes through another)."""

    def __init__(self, app: ASGIApp, replica: str) -> None:
        self.app, self.value = app, replica.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; add the header to the response's start."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), (b"x-thinkray-replica", self.value)]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, tagged)


class TraceContext:
    """Continues the client's trace: a request's W3C ``traceparent``/``tracestate``
    (and ``baggage``) headers become the parent of a ``SERVER`` span for the request,
    which is current while the app handles it, so the turn the request starts (in its
    session actor) is part of the client's trace. Without those headers the request's
    span starts a trace. A WebSocket gets no span (it may stay open for hours): the
    turns it starts continue the handshake's trace. Only while tracing is on; otherwise
    it passes straight through."""

    HEADERS = (b"traceparent", b"tracestate", b"baggage")

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle the request inside its span."""
        if scope["type"] not in ("http", "websocket") or not tracing.enabled():
            await self.app(scope, receive, send)
            return
        carrier = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in scope.get("headers", ())
            if k in self.HEADERS
        }
        if scope["type"] == "websocket":
            # A socket may stay open for hours: no span for it; the turns it starts
            # continue the client's trace if the handshake carried one.
            with tracing.attached(carrier):
                await self.app(scope, receive, send)
            return
        method = scope.get("method", "GET")
        attributes = {
            "http.request.method": method,
            "url.path": scope.get("path", ""),
            "thinkray.ingress": True,
        }
        status: dict[str, int] = {}

        async def noted(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = int(message.get("status", 0))
            await send(message)

        with (
            tracing.attached(carrier),
            tracing.span(method, attributes, kind=SpanKind.SERVER) as span,
        ):
            await self.app(scope, receive, noted)
            if "code" in status:
                tracing.set_attributes(span, {"http.response.status_code": status["code"]})
                if status["code"] >= 500:
                    tracing.record_error(span, f"HTTP {status['code']}")


def build_app(config: IngressConfig, ticket_key_bytes: bytes | None = None) -> FastAPI:
    """The ingress app for ``config`` (one per replica; any replica serves any
    agent). ``ticket_key_bytes``: the key WebSocket tickets are signed with, the same
    for every replica of an application (see :func:`ticket_key`)."""
    app = FastAPI(title="thinkray ingress", docs_url=None, redoc_url=None)
    state = Ingress(
        config=config,
        agents=Agents(config),
        authenticator=make_authenticator(config),
        tickets=Tickets(ticket_key(ticket_key_bytes), config.ticket_ttl),
        hub=Hub(),
    )
    app.state.ingress = state
    app.state.agents = state.agents
    app.state.authenticator = state.authenticator
    app.state.config = config
    app.state.ws_hub = state.hub
    if config.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=config.cors_origins,
            allow_methods=["*"],
            allow_headers=["authorization", "content-type"],
        )
    app.state.replica = uuid.uuid4().hex[:12]
    app.add_middleware(ReplicaHeader, replica=app.state.replica)
    configure_from_env()  # this replica's tracing, as the environment says
    app.add_middleware(TraceContext)
    routers = (chat_routes, session_routes, approval_routes, state_routes, page_routes, ws_routes)
    for router in routers:
        app.include_router(router)
    return app
