"""The ingress's HTTP routes (see :mod:`.app` for the list), as module-level functions
on an ``APIRouter``. Every route depends on :func:`.access.principal`; those that
reach an agent depend on :func:`.access.owned_agent` (or, to create, on the body's
validation and then :func:`.access.claimed_agent`): ownership is decided there, once.
Errors become the protocol's JSON answer in :class:`GuardedRoute`."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from starlette.types import Send
from thinkray.actors.ingress.access import (
    Ingress,
    agent_if_owned,
    agent_of,
    claimed_agent,
    ingress,
    may_open,
    owned_agent,
    path_ids,
    principal,
)
from thinkray.actors.ingress.agents import NotVisibleError
from thinkray.actors.ingress.auth import Principal
from thinkray.actors.ingress.common import (
    HTTPError,
    Turn,
    error_response,
    jsonable,
    need_dict,
    need_id,
    need_str,
    parse_turn,
    read_json,
    rewind_for_regenerate,
    start_turn,
)
from thinkray.actors.response import AgentResponseStream
from thinkray.runtime.chunks import SSE_DONE, SSE_HEADERS, to_sse
from thinkray.storage.errors import NotFoundError, ThinkrayError

log = logging.getLogger("thinkray.ingress")

PAGE = Path(__file__).with_name("page")
DECISIONS = ("once", "session", "always", "deny")  # how an approval may be answered


def json_body_doc(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    """The OpenAPI request body of a route that reads its JSON itself (through
    :func:`json_body`, so FastAPI cannot infer it): clients and fuzzers (Schemathesis)
    learn its shape from ``/openapi.json``."""
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    content = {"application/json": {"schema": schema}}
    return {"requestBody": {"required": bool(required), "content": content}}


_TEXT = {"type": "string"}
_UI_MESSAGE = {
    "type": "object",
    "required": ["id", "role", "parts"],
    "properties": {
        "id": _TEXT,
        "role": {"type": "string", "enum": ["user", "assistant", "system"]},
        "parts": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["type"],
                "properties": {"type": _TEXT, "text": _TEXT},
            },
        },
        "metadata": {"type": "object"},
    },
}
CHAT_BODY = json_body_doc(
    {
        "id": _TEXT,
        "trigger": {"type": "string", "enum": ["submit-message", "regenerate-message"]},
        "messageId": _TEXT,
        "messages": {"type": "array", "items": _UI_MESSAGE},
    },
    ["id", "messages"],
)
APPROVAL_METHODS = ("pending_approvals", "get_approval", "answer_approval")
BASE = "/agents/{agent}/{name}"


class GuardedRoute(APIRoute):
    """A route whose every error (its dependencies' too: a missing credential, a name
    the caller does not own) is answered as ``{"error": {"type", "message"}}``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """The handler, wrapped to map exceptions to answers."""
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                return error_response(exc)

        return route


def router() -> APIRouter:
    """A router of authenticated routes (principal first, then the path's ids)."""
    return APIRouter(
        route_class=GuardedRoute,
        dependencies=[Depends(principal), Depends(path_ids)],
    )


chat_routes = router()
session_routes = router()
approval_routes = router()
page_routes = APIRouter(include_in_schema=False)


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


async def json_body(request: Request, ing: Annotated[Ingress, Depends(ingress)]) -> dict[str, Any]:
    """The request's JSON object (413 over ``max_body_bytes``, 400 otherwise wrong)."""
    return need_dict(await read_json(request, ing.config.max_body_bytes))


async def optional_body(
    request: Request, ing: Annotated[Ingress, Depends(ingress)]
) -> dict[str, Any]:
    """The request's JSON object; an empty body is ``{}``."""
    return need_dict(await read_json(request, ing.config.max_body_bytes) or {})


# -- the AI SDK chat protocol --------------------------------------------------------------


@dataclass(frozen=True)
class ChatRequest:
    """A chat POST, validated before anything is claimed or created."""

    chat_id: str
    turn: Turn


async def chat_request(body: Annotated[dict[str, Any], Depends(json_body)]) -> ChatRequest:
    """The chat body, checked completely (a 400 writes nothing)."""
    return ChatRequest(need_id(need_str(body, "id")), parse_turn(body))


async def chat_agent(
    agent: str,
    name: str,
    chat: Annotated[ChatRequest, Depends(chat_request)],
    who: Annotated[Principal, Depends(principal)],
    ing: Annotated[Ingress, Depends(ingress)],
) -> Any:
    """The agent a valid chat talks to: a submit may claim the name, a regenerate
    needs the agent already."""
    return await agent_of(ing, agent, name, who, claim=chat.turn.claims)


@chat_routes.post(f"{BASE}/chat", openapi_extra=CHAT_BODY)
async def chat(
    chat: Annotated[ChatRequest, Depends(chat_request)],
    handle: Annotated[Any, Depends(chat_agent)],
    ing: Annotated[Ingress, Depends(ingress)],
) -> Response:
    """Start a turn; its UI message stream as SSE."""
    turn = chat.turn
    if turn.message is None:
        await rewind_for_regenerate(handle, chat.chat_id, turn.regenerate_id)
    stream = await start_turn(handle, chat.chat_id, turn)  # the actor's checks: 4xx here
    return SSEResponse(sse_stream(stream), ing.config.slow_consumer_timeout)


@chat_routes.get(f"{BASE}/chat/{{chat_id}}/stream")
async def resume(
    agent: str,
    name: str,
    chat_id: str,
    handle: Annotated[Any, Depends(agent_if_owned)],
    ing: Annotated[Ingress, Depends(ingress)],
) -> Response:
    """The active run from chunk 0, then its live tail; 204 without one."""
    if handle is None or not await ing.agents.live(agent, name):  # hibernated: runs nothing
        return Response(status_code=204)
    try:
        run_id = await handle.active_run.remote(chat_id)
    except NotFoundError:
        return Response(status_code=204)
    if run_id is None:
        return Response(status_code=204)
    stream = await handle.resume.remote(chat_id, run_id).start()
    return SSEResponse(sse_stream(stream), ing.config.slow_consumer_timeout)


@chat_routes.get(f"{BASE}/chat/{{chat_id}}/messages")
async def messages(chat_id: str, handle: Annotated[Any, Depends(owned_agent)]) -> Response:
    """A session's stored ``UIMessage[]``."""
    return JSONResponse(jsonable(await handle.get_history.remote(chat_id)))


@chat_routes.post(f"{BASE}/chat/{{chat_id}}/abort")
async def abort(
    agent: str,
    name: str,
    chat_id: str,
    handle: Annotated[Any, Depends(owned_agent)],
    ing: Annotated[Ingress, Depends(ingress)],
) -> Response:
    """Stop the run in flight (no effect without one)."""
    if not await ing.agents.live(agent, name):
        return JSONResponse({"aborted": False})
    return JSONResponse({"aborted": bool(await handle.abort.remote(chat_id))})


@chat_routes.get(f"{BASE}/get-messages")
async def get_messages(handle: Annotated[Any, Depends(owned_agent)]) -> Response:
    """The current session's messages (the ``agents`` client)."""
    current = await handle.get_current_session_id.remote()
    if current is None:
        return JSONResponse([])
    return JSONResponse(jsonable(await handle.get_history.remote(current)))


@chat_routes.post(f"{BASE}/ws-ticket")
async def ws_ticket(
    agent: str,
    name: str,
    who: Annotated[Principal, Depends(principal)],
    ing: Annotated[Ingress, Depends(ingress)],
) -> Response:
    """A short-lived ticket to open this agent's WebSocket (``?ticket=``), for clients
    that cannot send headers on an upgrade (browsers). Issued for the caller's agent or
    a name nobody owns yet; 404 for another principal's."""
    await may_open(ing, agent, name, who)
    ticket, expires = ing.tickets.issue(who, agent, name)
    return JSONResponse({"ticket": ticket, "expiresAt": expires, "ttl": ing.tickets.ttl})


# -- sessions -------------------------------------------------------------------------------


@session_routes.get("/agents/{agent}")
async def list_agents(
    agent: str,
    who: Annotated[Principal, Depends(principal)],
    ing: Annotated[Ingress, Depends(ingress)],
) -> Response:
    """The caller's agents of that class."""
    return JSONResponse({"agents": await ing.agents.owned(agent, who)})


@session_routes.get(f"{BASE}/sessions")
async def list_sessions(
    agent: str,
    handle: Annotated[Any, Depends(agent_if_owned)],
    ing: Annotated[Ingress, Depends(ingress)],
) -> Response:
    """The agent's sessions and the current one (none yet for a new name)."""
    if handle is None:
        if agent not in ing.config.agents:
            raise NotVisibleError(f"unknown agent class {agent!r}")
        return JSONResponse({"sessions": [], "current": None})
    sessions = await handle.get_sessions.remote()
    current = await handle.get_current_session_id.remote()
    return JSONResponse({"sessions": jsonable(sessions), "current": current})


@dataclass(frozen=True)
class NewSession:
    """A session to create: its title and optional id."""

    title: str
    session_id: str | None


async def new_session(body: Annotated[dict[str, Any], Depends(optional_body)]) -> NewSession:
    """A session to create (``name``, optional ``id``), checked before any claim."""
    title = body.get("name", "New Chat")
    if not isinstance(title, str):
        raise HTTPError(400, "'name' must be a string")
    session_id = body.get("id")
    if session_id is not None:  # checked before the name is claimed: a 400 writes nothing
        need_id(session_id, "session id")
    return NewSession(title, session_id)


@session_routes.post(f"{BASE}/sessions", openapi_extra=json_body_doc({"name": _TEXT, "id": _TEXT}))
async def create_session(
    new: Annotated[NewSession, Depends(new_session)], handle: Annotated[Any, Depends(claimed_agent)]
) -> Response:
    """A new session (claims an unclaimed name)."""
    info = await handle.create_session.remote(new.title, session_id=new.session_id)
    return JSONResponse(jsonable(info), status_code=201)


@session_routes.patch(
    f"{BASE}/sessions/{{sid}}", openapi_extra=json_body_doc({"name": _TEXT}, ["name"])
)
async def rename_session(
    sid: str,
    body: Annotated[dict[str, Any], Depends(json_body)],
    handle: Annotated[Any, Depends(owned_agent)],
) -> Response:
    """Rename a session (``{"name"}``)."""
    await handle.rename_session.remote(sid, need_str(body, "name"))
    return JSONResponse(jsonable(await handle.get_session.remote(sid)))


@session_routes.delete(f"{BASE}/sessions/{{sid}}")
async def delete_session(sid: str, handle: Annotated[Any, Depends(owned_agent)]) -> Response:
    """Delete a session (404 for an unknown one)."""
    await handle.get_session.remote(sid)
    await handle.delete_session.remote(sid)
    return Response(status_code=204)


@session_routes.post(
    f"{BASE}/sessions/{{sid}}/branch",
    openapi_extra=json_body_doc({"messageId": _TEXT, "name": _TEXT}, ["messageId"]),
)
async def branch(
    sid: str,
    body: Annotated[dict[str, Any], Depends(json_body)],
    handle: Annotated[Any, Depends(owned_agent)],
) -> Response:
    """A new session up to ``messageId``."""
    info = await handle.branch.remote(
        sid, need_str(body, "messageId"), name=need_str(body, "name", optional=True)
    )
    return JSONResponse(jsonable(info), status_code=201)


@session_routes.post(
    f"{BASE}/sessions/{{sid}}/rewind",
    openapi_extra=json_body_doc(
        {"messageId": _TEXT, "includeTarget": {"type": "boolean"}}, ["messageId"]
    ),
)
async def rewind(
    sid: str,
    body: Annotated[dict[str, Any], Depends(json_body)],
    handle: Annotated[Any, Depends(owned_agent)],
) -> Response:
    """Hide the messages after ``messageId`` (and it, with ``includeTarget``)."""
    include = body.get("includeTarget", False)
    if not isinstance(include, bool):
        raise HTTPError(400, "'includeTarget' must be a boolean")
    message_id = need_str(body, "messageId")
    result = await handle.rewind.remote(sid, message_id, include_target=include)
    return JSONResponse(jsonable(result))


@session_routes.post(f"{BASE}/sessions/{{sid}}/unrewind")
async def unrewind(sid: str, handle: Annotated[Any, Depends(owned_agent)]) -> Response:
    """Undo the last rewind."""
    return JSONResponse(jsonable(await handle.unrewind.remote(sid)))


@session_routes.post(f"{BASE}/sessions/{{sid}}/compact")
async def compact(sid: str, handle: Annotated[Any, Depends(owned_agent)]) -> Response:
    """Compact the session's history now."""
    return JSONResponse(jsonable(await handle.compact.remote(sid)))


@dataclass(frozen=True)
class SearchRequest:
    """A search's query string, checked before the agent is reached."""

    query: str
    limit: int
    session_id: str | None


async def search_request(request: Request) -> SearchRequest:
    """``?q=`` (required), ``&limit=`` (an integer, default 10; the agent checks its
    bounds) and ``&session=`` (one session's id), as a 400 when malformed."""
    params = request.query_params
    query = params.get("q")
    if not query or not query.strip():
        raise HTTPError(400, "the query parameter 'q' is required and must not be empty")
    raw_limit = params.get("limit", "10")
    try:
        limit = int(raw_limit)
    except ValueError:
        raise HTTPError(400, f"'limit' must be an integer, got {raw_limit[:40]!r}") from None
    session_id = params.get("session")
    if session_id is not None:
        need_id(session_id, "session id")
    return SearchRequest(query, limit, session_id)


@session_routes.get(f"{BASE}/search")
async def search(
    search: Annotated[SearchRequest, Depends(search_request)],
    handle: Annotated[Any, Depends(owned_agent)],
) -> Response:
    """The agent's stored messages that best match ``q`` (BM25), best first, one hit per
    message: ``{"query", "hits": [{session_id, message_id, role, score, snippet,
    highlights, part_index, created_at}]}``; 400 for a bad query or limit (1-100), 404
    for an unknown session or an agent that is not the caller's."""
    hits = await handle.search.remote(search.query, search.limit, search.session_id)
    return JSONResponse({"query": search.query, "hits": jsonable(hits)})


@session_routes.get(f"{BASE}/sessions/{{sid}}/status")
async def status(
    agent: str,
    name: str,
    sid: str,
    handle: Annotated[Any, Depends(owned_agent)],
    ing: Annotated[Ingress, Depends(ingress)],
) -> Response:
    """The session's status changes as server-sent events."""
    await handle.get_session.remote(sid)  # 404 for an unknown session
    events = status_events(ing, agent, name, handle, sid)
    return SSEResponse(events, ing.config.slow_consumer_timeout)


async def watch_status(handle: Any, name: str, session_id: str, stale: bool) -> AsyncIterator[Any]:
    """The statuses the agent's actor reports until it goes away (a handle may
    remember the actor of an earlier binding: ``stale`` asks the directory again)."""
    try:
        actor = await handle._actor_async(stale=stale)
        gen = actor.status_events.options(num_returns="streaming").remote(name, session_id)
        async for ref in gen:
            yield await ref
    except Exception as exc:  # the actor went away: look again
        log.debug("status watch of %s ended: %s", name, exc)


IDLE: dict[str, Any] = {
    "state": "idle",
    "attempt": None,
    "message": None,
    "started_at": None,
    "run_id": None,
    "queue": [],
}


async def status_events(
    ing: Ingress, agent: str, name: str, handle: Any, session_id: str
) -> AsyncIterator[str]:
    """A session's status as server-sent events (``event: status``), the current one
    first. While the agent is hibernated its status is idle and nothing wakes it: the
    stream looks for it to come back once a second."""
    last: Any = None
    stale = False
    while True:
        if await ing.agents.live(agent, name):
            heard = False
            async for status in watch_status(handle, name, session_id, stale):
                heard = True
                if status != last:
                    last = status
                    yield f"event: status\ndata: {json.dumps(status)}\n\n"
            stale = not heard
        if last is None or last.get("state") != "idle":
            last = dict(IDLE)
            yield f"event: status\ndata: {json.dumps(last)}\n\n"
        await asyncio.sleep(1.0)


# -- tool approvals -------------------------------------------------------------------------


async def with_approvals(agent: str, ing: Annotated[Ingress, Depends(ingress)]) -> None:
    """A class without approvals (plain Think) has nothing to list or answer (404)."""
    route = ing.config.agents.get(agent)
    if route is None:
        raise NotVisibleError(f"unknown agent class {agent!r}")
    cls = route.load_class()
    if not all(callable(getattr(cls, m, None)) for m in APPROVAL_METHODS):
        raise HTTPError(404, f"agent class {agent!r} has no tool approvals", "not_found")


APPROVALS = [Depends(with_approvals)]


@approval_routes.get(f"{BASE}/approvals", dependencies=APPROVALS)
async def list_approvals(
    request: Request, handle: Annotated[Any, Depends(owned_agent)]
) -> Response:
    """The tool calls waiting for an answer (of one ``session``, or all)."""
    session = request.query_params.get("session")
    if session is not None:
        need_id(session, "session id")
    pending = await handle.pending_approvals.remote(session)
    return JSONResponse({"approvals": jsonable(pending)})


@approval_routes.get(f"{BASE}/approvals/{{approval_id}}", dependencies=APPROVALS)
async def get_approval(approval_id: str, handle: Annotated[Any, Depends(owned_agent)]) -> Response:
    """One approval, pending or decided."""
    approval = await handle.get_approval.remote(approval_id)
    if approval is None:
        raise HTTPError(404, f"no approval {approval_id!r}", "not_found")
    return JSONResponse(jsonable(approval))


async def decision_of(body: Annotated[dict[str, Any], Depends(json_body)]) -> str:
    """The body's ``decision``, one of :data:`DECISIONS`."""
    decision = body.get("decision")
    if decision not in DECISIONS:
        raise HTTPError(400, f"'decision' must be one of {', '.join(DECISIONS)}")
    return str(decision)


@approval_routes.post(
    f"{BASE}/approvals/{{approval_id}}",
    dependencies=APPROVALS,
    openapi_extra=json_body_doc(
        {"decision": {"type": "string", "enum": list(DECISIONS)}}, ["decision"]
    ),
)
async def answer_approval(
    approval_id: str,
    decision: Annotated[str, Depends(decision_of)],
    who: Annotated[Principal, Depends(principal)],
    handle: Annotated[Any, Depends(owned_agent)],
) -> Response:
    """Answer an approval; the answerer is who authenticated, whatever the body says."""
    settled = await handle.answer_approval.remote(approval_id, decision, who.id)
    return JSONResponse(jsonable(settled))


# -- the web page ---------------------------------------------------------------------------


@page_routes.get("/")
async def page() -> Response:
    """The web chat page."""
    index = PAGE / "index.html"
    if not index.is_file():
        return Response("no web page in this build", status_code=404)
    return FileResponse(index, media_type="text/html")


@page_routes.get("/page-config")
async def page_config(ing: Annotated[Ingress, Depends(ingress)]) -> Any:
    """The agent class the page talks to."""
    return {"agent": ing.config.page_agent()}
