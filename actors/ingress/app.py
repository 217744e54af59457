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
- ``GET .../approvals?session=<sid>``: the tool calls waiting for a human's approval
  (all sessions without ``session``); ``GET .../approvals/{approval_id}``: one
  approval, pending or decided (who answered, when, how);
  ``POST .../approvals/{approval_id}`` with ``{"decision": "once" | "session" |
  "always" | "deny"}``: answer it. The answerer is the authenticated principal (never
  a body field), checked by the agent's ``may_approve`` hook (403 when refused); an
  unknown or already-decided approval is 404 and nothing is written; an agent class
  without approvals (plain ``Think``) answers 404. The waiting run's stream goes on:
  the tool runs (``tool-output-available``) or is denied (``tool-output-denied``).
- ``GET /agents/{agent}``: the caller's agents of that class.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from opentelemetry.trace import SpanKind
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from thinkray.actors.ingress.agents import Agents, NotVisibleError
from thinkray.actors.ingress.auth import Authenticator, BearerTokens, Principal
from thinkray.actors.ingress.config import IngressConfig, load_object
from thinkray.actors.response import AgentResponseStream
from thinkray.runtime.chunks import SSE_DONE, SSE_HEADERS, to_sse
from thinkray.runtime.errors import (
    AccessDeniedError,
    ApprovalNotFoundError,
    MessageIdConflictError,
    SessionBusyError,
)
from thinkray.runtime.observability import tracing
from thinkray.runtime.observability.setup import configure_from_env
from thinkray.storage.errors import NotFoundError, ThinkrayError, UserError
from thinkray.storage.types import InvalidInputError

log = logging.getLogger("thinkray.ingress")

PAGE = Path(__file__).with_name("page")
DECISIONS = ("once", "session", "always", "deny")  # how an approval may be answered
APPROVAL_METHODS = ("pending_approvals", "get_approval", "answer_approval")


class HTTPError(Exception):
    """An answer with a status and a message (``{"error": {"type", "message"}}``)."""

    def __init__(self, status: int, message: str, kind: str = "bad_request") -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


def error_status(exc: BaseException) -> tuple[int, str]:
    """The HTTP status and error type of an exception a call raised."""
    if isinstance(exc, HTTPError):
        return exc.status, exc.kind
    if isinstance(exc, NotVisibleError | NotFoundError | ApprovalNotFoundError):
        return 404, "not_found"
    if isinstance(exc, AccessDeniedError):
        return 403, "forbidden"
    if isinstance(exc, SessionBusyError):
        return 409, "busy"
    if isinstance(exc, MessageIdConflictError):
        return 409, "message_id_conflict"
    if isinstance(exc, UserError | InvalidInputError | ValueError):
        return 400, type(exc).__name__
    return 500, "internal"


def error_response(exc: BaseException) -> JSONResponse:
    """The JSON error answer for ``exc`` (internal errors are logged, not shown)."""
    cause = getattr(exc, "cause", None)  # a RayTaskError: its str is the actor's traceback
    shown = cause if isinstance(cause, Exception) else exc
    status, kind = error_status(shown)
    message = str(shown) if status < 500 else f"internal error ({type(shown).__name__})"
    if status >= 500:
        log.exception("ingress request failed", exc_info=exc)
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status)


def jsonable(value: Any) -> Any:
    """Session infos and results (dataclasses, pydantic models) as JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if hasattr(value, "model_dump"):
        return jsonable(value.model_dump())
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def make_authenticator(config: IngressConfig) -> Authenticator:
    """The configured authenticator: the user's hook, else the bearer-token map."""
    if config.authenticator:
        factory = load_object(config.authenticator)
        made = factory() if callable(factory) else factory
        if not isinstance(made, Authenticator):
            raise ValueError(f"{config.authenticator!r} did not give an Authenticator")
        return made
    return BearerTokens(config.tokens)


class SSEResponse(StreamingResponse):
    """A stream whose every send is bounded: a client that takes nothing for
    ``timeout`` seconds is dropped (the stream detaches; the actor never waited)."""

    def __init__(self, content: AsyncIterator[str], timeout: float, **kwargs: Any) -> None:
        super().__init__(content, headers=dict(SSE_HEADERS), **kwargs)
        self.timeout = timeout

    async def stream_response(self, send: Send) -> None:
        """Send the stream, each send bounded by ``timeout``."""

        async def bounded(message: Any) -> None:
            await asyncio.wait_for(send(message), self.timeout)

        try:
            await super().stream_response(bounded)
        except TimeoutError:
            log.info("dropped a slow SSE consumer after %.0f s", self.timeout)


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


async def read_json(request: Request, limit: int) -> Any:
    """The request body as JSON, at most ``limit`` bytes (413 beyond, 400 if not
    JSON)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPError(413, f"body over {limit} bytes", "too_large")
    body = bytearray()
    async for part in request.stream():
        body.extend(part)
        if len(body) > limit:
            raise HTTPError(413, f"body over {limit} bytes", "too_large")
    try:
        return json.loads(body or b"null")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HTTPError(400, f"malformed JSON: {exc}", "malformed_json") from exc


def need_dict(value: Any, what: str = "body") -> dict[str, Any]:
    """``value`` if it is a JSON object, else a 400."""
    if not isinstance(value, dict):
        raise HTTPError(400, f"the {what} must be a JSON object")
    return value


def need_id(value: Any, what: str = "chat id") -> str:
    """A chat or session id from a body or a path: 1-256 printable characters."""
    if not isinstance(value, str) or not 0 < len(value) <= 256 or not value.isprintable():
        raise HTTPError(400, f"invalid {what} {str(value)[:80]!r}: use 1-256 printable characters")
    return value


def need_str(body: dict[str, Any], key: str, optional: bool = False) -> Any:
    """``body[key]`` as a non-empty string (None if absent and ``optional``), else a 400."""
    value = body.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise HTTPError(400, f"{key!r} must be a non-empty string")
    return value


async def sse_stream(stream: AgentResponseStream[Any]) -> AsyncIterator[str]:
    """UI chunks as SSE frames, ending with ``[DONE]``: one write per batch the actor
    relayed (under Serve every write is a message from the replica to the proxy, so
    a write per chunk costs far more than the chunk). Leaving early (the client went
    away) only stops reading: the run is not aborted."""
    try:
        async for batch in stream.item_batches():
            yield "".join(to_sse(chunk) for chunk in batch)
    except ThinkrayError as exc:  # the actor died mid-stream: say so in the protocol
        yield to_sse({"type": "error", "errorText": str(exc)})
    yield SSE_DONE


def build_app(config: IngressConfig) -> FastAPI:
    """The ingress app for ``config`` (one per replica; any replica serves any
    agent)."""
    app = FastAPI(title="thinkray ingress", docs_url=None, redoc_url=None)
    agents = Agents(config)
    authenticator = make_authenticator(config)
    app.state.agents = agents
    app.state.authenticator = authenticator
    app.state.config = config
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

    async def principal_of(request: Request) -> Principal:
        principal = await authenticator.authenticate(request)
        if principal is None:
            raise HTTPError(401, "missing or invalid bearer token", "unauthorized")
        return principal

    Handler = Callable[..., Awaitable[Any]]

    def guarded(fn: Handler) -> Handler:
        # Every route: authenticate first, map errors to the protocol's answer.
        async def route(request: Request) -> Any:
            try:
                principal = await principal_of(request)
                for key in ("chat_id", "sid"):
                    if key in request.path_params:
                        need_id(request.path_params[key], "session id")
                return await fn(request, principal, **request.path_params)
            except Exception as exc:
                response = error_response(exc)
                if isinstance(exc, HTTPError) and exc.status == 401:
                    response.headers["www-authenticate"] = "Bearer"
                return response

        return route

    def add(path: str, fn: Handler, methods: list[str]) -> None:
        app.add_api_route(path, guarded(fn), methods=methods, include_in_schema=False)

    base = "/agents/{agent}/{name}"

    # -- the AI SDK chat protocol ------------------------------------------------------

    async def chat(request: Request, who: Principal, agent: str, name: str) -> Response:
        body = need_dict(await read_json(request, config.max_body_bytes))
        chat_id = need_id(need_str(body, "id"))
        trigger = body.get("trigger", "submit-message")
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise HTTPError(400, "'messages' must be a list of UI messages")
        if trigger not in ("submit-message", "regenerate-message"):
            raise HTTPError(400, f"unknown trigger {trigger!r}")
        handle: Any = await agents.agent(agent, name, who, claim=True)
        await ensure_session(handle, chat_id)
        if trigger == "submit-message":
            if not messages or not isinstance(messages[-1], dict):
                raise HTTPError(400, "submit-message needs the new message last in 'messages'")
            message = messages[-1]
            if message.get("role") != "user":
                raise HTTPError(400, "the message to submit must have role 'user'")
            stream = handle.stream_chat.remote(message, session_id=chat_id)
        else:
            await rewind_for_regenerate(handle, chat_id, body.get("messageId"))
            stream = handle.stream_chat.remote(None, session_id=chat_id)
        await stream.start()  # validation and busy errors answer 4xx, before any byte
        return SSEResponse(sse_stream(stream), config.slow_consumer_timeout)

    async def resume(
        request: Request, who: Principal, agent: str, name: str, chat_id: str
    ) -> Response:
        try:
            handle: Any = await agents.agent(agent, name, who, claim=False)
        except NotVisibleError:
            return Response(status_code=204)
        if not await agents.live(agent, name):  # a hibernated agent runs nothing
            return Response(status_code=204)
        try:
            run_id = await handle.active_run.remote(chat_id)
        except NotFoundError:
            return Response(status_code=204)
        if run_id is None:
            return Response(status_code=204)
        stream = await handle.resume.remote(chat_id, run_id).start()
        return SSEResponse(sse_stream(stream), config.slow_consumer_timeout)

    async def messages(
        request: Request, who: Principal, agent: str, name: str, chat_id: str
    ) -> Any:
        handle: Any = await agents.agent(agent, name, who, claim=False)
        return JSONResponse(jsonable(await handle.get_history.remote(chat_id)))

    async def abort(request: Request, who: Principal, agent: str, name: str, chat_id: str) -> Any:
        handle: Any = await agents.agent(agent, name, who, claim=False)
        if not await agents.live(agent, name):
            return JSONResponse({"aborted": False})
        return JSONResponse({"aborted": bool(await handle.abort.remote(chat_id))})

    async def get_messages(request: Request, who: Principal, agent: str, name: str) -> Any:
        handle: Any = await agents.agent(agent, name, who, claim=False)
        current = await handle.get_current_session_id.remote()
        if current is None:
            return JSONResponse([])
        return JSONResponse(jsonable(await handle.get_history.remote(current)))

    add(f"{base}/chat", chat, ["POST"])
    add(f"{base}/chat/{{chat_id}}/stream", resume, ["GET"])
    add(f"{base}/chat/{{chat_id}}/messages", messages, ["GET"])
    add(f"{base}/chat/{{chat_id}}/abort", abort, ["POST"])
    add(f"{base}/get-messages", get_messages, ["GET"])

    # -- sessions ----------------------------------------------------------------------

    async def list_agents(request: Request, who: Principal, agent: str) -> Any:
        return JSONResponse({"agents": await agents.owned(agent, who)})

    async def list_sessions(request: Request, who: Principal, agent: str, name: str) -> Any:
        try:
            handle: Any = await agents.agent(agent, name, who, claim=False)
        except NotVisibleError:
            if agent not in config.agents:
                raise
            return JSONResponse({"sessions": [], "current": None})  # a new agent: none yet
        sessions = await handle.get_sessions.remote()
        current = await handle.get_current_session_id.remote()
        return JSONResponse({"sessions": jsonable(sessions), "current": current})

    async def create_session(request: Request, who: Principal, agent: str, name: str) -> Any:
        body = need_dict(await read_json(request, config.max_body_bytes) or {})
        title = body.get("name", "New Chat")
        if not isinstance(title, str):
            raise HTTPError(400, "'name' must be a string")
        session_id = need_str(body, "id", optional=True)
        handle: Any = await agents.agent(agent, name, who, claim=True)
        info = await handle.create_session.remote(title, session_id=session_id)
        return JSONResponse(jsonable(info), status_code=201)

    async def rename_session(
        request: Request, who: Principal, agent: str, name: str, sid: str
    ) -> Any:
        body = need_dict(await read_json(request, config.max_body_bytes))
        handle: Any = await agents.agent(agent, name, who, claim=False)
        await handle.rename_session.remote(sid, need_str(body, "name"))
        return JSONResponse(jsonable(await handle.get_session.remote(sid)))

    async def delete_session(
        request: Request, who: Principal, agent: str, name: str, sid: str
    ) -> Any:
        handle: Any = await agents.agent(agent, name, who, claim=False)
        await handle.get_session.remote(sid)  # 404 for an unknown session
        await handle.delete_session.remote(sid)
        return Response(status_code=204)

    async def branch(request: Request, who: Principal, agent: str, name: str, sid: str) -> Any:
        body = need_dict(await read_json(request, config.max_body_bytes))
        handle: Any = await agents.agent(agent, name, who, claim=False)
        info = await handle.branch.remote(
            sid, need_str(body, "messageId"), name=need_str(body, "name", optional=True)
        )
        return JSONResponse(jsonable(info), status_code=201)

    async def rewind(request: Request, who: Principal, agent: str, name: str, sid: str) -> Any:
        body = need_dict(await read_json(request, config.max_body_bytes))
        include = body.get("includeTarget", False)
        if not isinstance(include, bool):
            raise HTTPError(400, "'includeTarget' must be a boolean")
        handle: Any = await agents.agent(agent, name, who, claim=False)
        result = await handle.rewind.remote(
            sid, need_str(body, "messageId"), include_target=include
        )
        return JSONResponse(jsonable(result))

    async def unrewind(request: Request, who: Principal, agent: str, name: str, sid: str) -> Any:
        handle: Any = await agents.agent(agent, name, who, claim=False)
        return JSONResponse(jsonable(await handle.unrewind.remote(sid)))

    async def compact(request: Request, who: Principal, agent: str, name: str, sid: str) -> Any:
        handle: Any = await agents.agent(agent, name, who, claim=False)
        return JSONResponse(jsonable(await handle.compact.remote(sid)))

    async def status(request: Request, who: Principal, agent: str, name: str, sid: str) -> Any:
        handle: Any = await agents.agent(agent, name, who, claim=False)
        await handle.get_session.remote(sid)  # 404 for an unknown session
        events = status_events(agents, agent, name, handle, sid)
        return SSEResponse(events, config.slow_consumer_timeout)

    add("/agents/{agent}", list_agents, ["GET"])
    add(f"{base}/sessions", list_sessions, ["GET"])
    add(f"{base}/sessions", create_session, ["POST"])
    add(f"{base}/sessions/{{sid}}", rename_session, ["PATCH"])
    add(f"{base}/sessions/{{sid}}", delete_session, ["DELETE"])
    add(f"{base}/sessions/{{sid}}/branch", branch, ["POST"])
    add(f"{base}/sessions/{{sid}}/rewind", rewind, ["POST"])
    add(f"{base}/sessions/{{sid}}/unrewind", unrewind, ["POST"])
    add(f"{base}/sessions/{{sid}}/compact", compact, ["POST"])
    add(f"{base}/sessions/{{sid}}/status", status, ["GET"])

    # -- tool approvals ----------------------------------------------------------------

    def approvals_of(agent: str) -> None:
        # A class without approvals (plain Think) has nothing to list or answer.
        route = config.agents.get(agent)
        if route is None:
            raise NotVisibleError(f"unknown agent class {agent!r}")
        cls = route.load_class()
        if not all(callable(getattr(cls, m, None)) for m in APPROVAL_METHODS):
            raise HTTPError(404, f"agent class {agent!r} has no tool approvals", "not_found")

    async def list_approvals(request: Request, who: Principal, agent: str, name: str) -> Any:
        approvals_of(agent)
        session = request.query_params.get("session")
        if session is not None:
            need_id(session, "session id")
        handle: Any = await agents.agent(agent, name, who, claim=False)
        pending = await handle.pending_approvals.remote(session)
        return JSONResponse({"approvals": jsonable(pending)})

    async def get_approval(
        request: Request, who: Principal, agent: str, name: str, approval_id: str
    ) -> Any:
        approvals_of(agent)
        need_id(approval_id, "approval id")
        handle: Any = await agents.agent(agent, name, who, claim=False)
        approval = await handle.get_approval.remote(approval_id)
        if approval is None:
            raise HTTPError(404, f"no approval {approval_id!r}", "not_found")
        return JSONResponse(jsonable(approval))

    async def answer_approval(
        request: Request, who: Principal, agent: str, name: str, approval_id: str
    ) -> Any:
        approvals_of(agent)
        need_id(approval_id, "approval id")
        body = need_dict(await read_json(request, config.max_body_bytes))
        decision = body.get("decision")
        if decision not in DECISIONS:
            raise HTTPError(400, f"'decision' must be one of {', '.join(DECISIONS)}")
        handle: Any = await agents.agent(agent, name, who, claim=False)
        # The answerer is who authenticated, whatever the body says.
        settled = await handle.answer_approval.remote(approval_id, decision, who.id)
        return JSONResponse(jsonable(settled))

    add(f"{base}/approvals", list_approvals, ["GET"])
    add(f"{base}/approvals/{{approval_id}}", get_approval, ["GET"])
    add(f"{base}/approvals/{{approval_id}}", answer_approval, ["POST"])

    # -- the web page and the WebSocket protocol ---------------------------------------

    @app.get("/", include_in_schema=False)
    async def page() -> Response:
        index = PAGE / "index.html"
        if not index.is_file():
            return Response("no web page in this build", status_code=404)
        return FileResponse(index, media_type="text/html")

    @app.get("/page-config", include_in_schema=False)
    async def page_config() -> Any:
        return {"agent": config.page_agent()}

    from thinkray.actors.ingress.ws import add_websocket_routes

    add_websocket_routes(app, agents, authenticator, config)
    return app


async def ensure_session(handle: Any, chat_id: str) -> None:
    """The AI SDK's chat id names the session: create it on its first message."""
    try:
        await handle.get_session.remote(chat_id)
    except NotFoundError:
        try:
            await handle.create_session.remote("New Chat", session_id=chat_id)
        except UserError:
            await handle.get_session.remote(chat_id)  # created meanwhile: fine


async def rewind_for_regenerate(handle: Any, chat_id: str, message_id: Any) -> None:
    """``regenerate-message``: hide the assistant message (``messageId``, default the
    last one) and what follows, so the next turn answers its user message again."""
    history = await handle.get_history.remote(chat_id)
    if message_id is not None and not isinstance(message_id, str):
        raise HTTPError(400, "'messageId' must be a string")
    index = None
    for i, message in enumerate(history):
        wanted = message.get("role") == "assistant" if message_id is None else None
        if wanted or (message_id is not None and message.get("id") == message_id):
            index = i
    if index is None:
        raise HTTPError(404, f"no message {message_id!r} to regenerate", "not_found")
    users = [m for m in history[: index + 1] if m.get("role") == "user"]
    if not users:
        raise HTTPError(400, "nothing to regenerate: no user message before it")
    await handle.rewind.remote(chat_id, users[-1]["id"])


async def status_events(
    agents: Agents, agent: str, name: str, handle: Any, session_id: str
) -> AsyncIterator[str]:
    """A session's status as server-sent events (``event: status``), the current one
    first. While the agent is hibernated its status is idle and nothing wakes it: the
    stream looks for it to come back once a second."""
    last: Any = None
    stale = False
    while True:
        if await agents.live(agent, name):
            heard = False
            try:
                # A handle may remember the actor of an earlier binding: after a watch
                # that heard nothing, ask the directory again.
                actor = await handle._actor_async(stale=stale)
                gen = actor.status_events.options(num_returns="streaming").remote(name, session_id)
                async for ref in gen:
                    status = await ref
                    heard = True
                    if status != last:
                        last = status
                        yield f"event: status\ndata: {json.dumps(status)}\n\n"
            except Exception as exc:  # the actor went away: look again
                log.debug("status watch of %s ended: %s", name, exc)
            stale = not heard
        idle = {"state": "idle"}
        if last is None or last.get("state") != "idle":
            last = {**idle, "attempt": None, "message": None, "started_at": None, "run_id": None}
            yield f"event: status\ndata: {json.dumps(last)}\n\n"
        await asyncio.sleep(1.0)
