"""The ``cf_agent_*`` WebSocket protocol at ``/agents/{agent}/{name}``: what
Cloudflare's ``agents`` package speaks (``AgentClient`` from ``agents/client``,
``WebSocketChatTransport``/``useAgentChat`` from ``agents/chat``, the server side of
``@cloudflare/ai-chat``'s ``AIChatAgent`` and ``@cloudflare/think``'s ``Think``).

The frames, as read in github.com/cloudflare/agents (``packages/agents/src``:
``index.ts`` ``onConnect``/``onMessage``, ``types.ts``, ``chat/wire-types.ts``,
``chat/protocol.ts``, ``chat/parse-protocol.ts``, ``chat/resume-handshake.ts``,
``chat/resumable-stream.ts``, ``chat/ws-chat-transport.ts``, ``client.ts``;
``packages/think/src/think.ts``; ``packages/ai-chat/src/index.ts``):

On connect (server -> client)::

    {"type": "cf_agent_identity", "name": <name>, "agent": <slug>}
    {"type": "cf_agent_mcp_servers", "mcp": {"prompts": [], "resources": [],
                                             "servers": {}, "tools": []}}
    then, as Think does: a run in flight -> {"type": "cf_agent_stream_resuming", "id"}
    (the connection is left out of the live broadcast until it acks), else
    {"type": "cf_agent_chat_messages", "messages": [...]} (the current session)

Chat::

    -> {"type": "cf_agent_use_chat_request", "id", "init": {"method": "POST",
        "body": "<json: {messages, trigger, messageId?, ...}>"}}
    <- {"type": "cf_agent_use_chat_response", "id", "body": "<json chunk>", "done": false}
       ... one UI message chunk per frame ...
    <- an ``error`` chunk becomes {"id", "body": <errorText>, "done": false, "error": true}
    <- {"type": "cf_agent_use_chat_response", "id", "body": "", "done": true}
    <- {"type": "cf_agent_chat_messages", "messages": [...]}  (to every connection)
    A request refused before it runs (busy session, invalid message):
    <- {"type": "cf_agent_use_chat_response", "id", "body": <why>, "done": true,
        "error": true}
    -> {"type": "cf_agent_chat_request_cancel", "id"}    (aborts that run)
    -> {"type": "cf_agent_chat_clear"}  -> the others get {"type": "cf_agent_chat_clear"}

Resume (``chat/resume-handshake.ts``)::

    -> {"type": "cf_agent_stream_resume_request", "probeId"?}
    <- {"type": "cf_agent_stream_resuming", "id", "probeId"?}
     | {"type": "cf_agent_stream_resume_none", "reason": "idle", "probeId"?}
    -> {"type": "cf_agent_stream_resume_ack", "id"}
    <- the run's chunks from index 0 with "replay": true, then (run still live)
       {"body": "", "done": false, "replay": true, "replayComplete": true}, the live
       tail, and "done"; a finished run: its chunks then {"done": true, "replay": true}

The request id is the run id (``stream_chat(run_id=...)``), so a cancel or a resume
that reaches another replica finds the run through the session actor: replicas keep
no state a reconnect needs.

Broadcasts (the chunks of a run to the agent's other tabs, ``cf_agent_chat_messages``
and ``cf_agent_chat_clear``) reach the connections *this replica* holds. Fanning them
out across replicas would take a subscription to the session actor per connection
(one more streaming call per open tab, all of them idle most of the time) for what is
a convenience: the session actor is the truth, and a tab on another replica gets it
at its next reconnect or resume probe, or from ``get-messages``. Deployments that want
live cross-tab updates pin an agent's connections to one replica (a session-affinity
load balancer).

Tool results and approvals: thinkray runs every tool on the server, so a
``cf_agent_tool_result`` never has a call to complete. ``cf_agent_tool_approval``
answers a pending ask of an agent with approvals (``Agent.answer_approval``: ``once``
or ``deny``, answered by the connection's principal, which the agent's ``may_approve``
hook may refuse); asks are durable rows in the agent's database, so one made before a
restart is still answerable. An approval for no pending ask, one the hook refuses, or
one for an agent class without approvals, is answered with the protocol's error frame
addressed by the tool call id (``{"type": "cf_agent_use_chat_response", "id": <toolCallId>, "body",
"done": true, "error": true}``; the package's transport ignores an unknown id, raw
clients see why).

Bad input is treated as the package treats it: a frame that is not JSON, not an
object, of an unknown type, or binary is ignored (the package hands it to the user's
``onMessage``, a no-op by default); client-pushed ``cf_agent_chat_messages`` are
ignored (Think is server-authoritative); ``rpc`` calls are answered
``{"type": "rpc", "id", "success": false, "error"}`` (no method is callable here);
``cf_agent_state`` is answered ``cf_agent_state_error``. Nothing is written and the
connection stays open.

A disconnect detaches (never aborts). Each connection has a bounded outbox written by
its own task, each send bounded by ``slow_consumer_timeout``: a consumer that falls
behind is dropped (close 1013, so the client reconnects and resumes); a run's stream
is never held up by a slow tab.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocket, WebSocketDisconnect
from thinkray.actors.ingress.agents import Agents, NotVisibleError
from thinkray.actors.ingress.app import HTTPError, error_status, jsonable, rewind_for_regenerate
from thinkray.actors.ingress.auth import Authenticator, Principal
from thinkray.actors.ingress.config import IngressConfig
from thinkray.storage.errors import NotFoundError, ThinkrayError
from thinkray.storage.layout import validate_name
from thinkray.storage.types import InvalidInputError

log = logging.getLogger("thinkray.ingress.ws")

IDENTITY = "cf_agent_identity"
MCP_SERVERS = "cf_agent_mcp_servers"
STATE = "cf_agent_state"
STATE_ERROR = "cf_agent_state_error"
RPC = "rpc"
CHAT_MESSAGES = "cf_agent_chat_messages"
USE_CHAT_REQUEST = "cf_agent_use_chat_request"
USE_CHAT_RESPONSE = "cf_agent_use_chat_response"
CHAT_CLEAR = "cf_agent_chat_clear"
CHAT_REQUEST_CANCEL = "cf_agent_chat_request_cancel"
STREAM_RESUMING = "cf_agent_stream_resuming"
STREAM_RESUME_ACK = "cf_agent_stream_resume_ack"
STREAM_RESUME_REQUEST = "cf_agent_stream_resume_request"
STREAM_RESUME_NONE = "cf_agent_stream_resume_none"
TOOL_RESULT = "cf_agent_tool_result"
TOOL_APPROVAL = "cf_agent_tool_approval"

OUTBOX_FRAMES = 4096
"""Frames a connection may have waiting to be written before it counts as slow."""

CLOSE_TRY_AGAIN = 1013
"""Dropping a slow consumer: not a terminal code, so ``AgentClient`` reconnects."""

REQUEST_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
"""Request ids become run ids (``nanoid`` ids and uuids fit)."""

_EMPTY_MCP: dict[str, Any] = {"prompts": [], "resources": [], "servers": {}, "tools": []}


@dataclass(eq=False)
class Connection:
    """One accepted WebSocket. ``pending_resume``: told of a run and not acked yet
    (left out of live broadcasts, as the package does); ``following``: runs this
    connection reads through its own resume stream (the broadcast skips it)."""

    ws: WebSocket
    slug: str
    name: str
    principal: Principal
    timeout: float
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    outbox: asyncio.Queue[str | None] = field(
        default_factory=lambda: asyncio.Queue(maxsize=OUTBOX_FRAMES)
    )
    pending_resume: bool = False
    following: set[str] = field(default_factory=set)
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    closed: bool = False
    dropped: bool = False
    main: asyncio.Task[Any] | None = None

    @property
    def key(self) -> tuple[str, str]:
        """The agent this connection talks to: (slug, name)."""
        return (self.slug, self.name)

    def send(self, frame: dict[str, Any]) -> None:
        """Queue ``frame``; never waits. A full outbox drops the connection."""
        if self.closed:
            return
        try:
            self.outbox.put_nowait(json.dumps(frame))
        except asyncio.QueueFull:
            self.drop("its outbox is full")

    def drop(self, why: str) -> None:
        """Give up on a consumer that does not keep up (it may reconnect and resume)."""
        if self.closed:
            return
        log.info("dropping WebSocket %s of %s/%s: %s", self.id, self.slug, self.name, why)
        self.closed = self.dropped = True
        if self.main is not None:
            self.main.cancel()

    async def write_loop(self) -> None:
        """Write the outbox, each send bounded by ``timeout``."""
        while True:
            text = await self.outbox.get()
            if text is None:
                return
            try:
                await asyncio.wait_for(self.ws.send_text(text), self.timeout)
            except TimeoutError:
                self.drop(f"a send took over {self.timeout:g} s")
                return
            except Exception:  # the socket is gone: the receive loop ends too
                return

    def spawn(self, coro: Any) -> None:
        """Run ``coro`` for this connection (cancelled when it closes: a detach)."""
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


class Hub:
    """The connections this replica holds, by agent."""

    def __init__(self) -> None:
        self.groups: dict[tuple[str, str], dict[str, Connection]] = {}

    def add(self, conn: Connection) -> None:
        """Hold ``conn`` (accepted)."""
        self.groups.setdefault(conn.key, {})[conn.id] = conn

    def remove(self, conn: Connection) -> None:
        """Forget ``conn`` (closed)."""
        group = self.groups.get(conn.key, {})
        group.pop(conn.id, None)
        if not group:
            self.groups.pop(conn.key, None)

    def members(self, key: tuple[str, str]) -> list[Connection]:
        """The open connections to agent ``key``."""
        return [c for c in self.groups.get(key, {}).values() if not c.closed]

    def live_targets(self, key: tuple[str, str], run_id: str) -> list[Connection]:
        """Who gets a run's live frames: not waiting on a resume ack, not reading the
        run on its own."""
        return [c for c in self.members(key) if not c.pending_resume and run_id not in c.following]

    def broadcast(self, key: tuple[str, str], frame: dict[str, Any], exclude: Any = ()) -> None:
        """Send ``frame`` to agent ``key``'s connections but ``exclude``."""
        for conn in self.members(key):
            if conn not in exclude:
                conn.send(frame)


def response(run_id: str, body: str = "", *, done: bool = False, **flags: Any) -> dict[str, Any]:
    """A ``cf_agent_use_chat_response`` frame."""
    return {"type": USE_CHAT_RESPONSE, "id": run_id, "body": body, "done": done, **flags}


def chunk_frame(run_id: str, chunk: dict[str, Any], replay: bool = False) -> dict[str, Any]:
    """One UI chunk as a frame; an ``error`` chunk is the protocol's error frame."""
    flags: dict[str, Any] = {"replay": True} if replay else {}
    if chunk.get("type") == "error":
        return response(run_id, str(chunk.get("errorText") or "error"), error=True, **flags)
    return response(run_id, json.dumps(chunk), **flags)


def error_text(exc: BaseException) -> str:
    """What a client is told about a refused request (internal errors are logged)."""
    status, _ = error_status(exc)
    if status >= 500:
        log.error("WebSocket request failed", exc_info=exc)
        return f"internal error ({type(exc).__name__})"
    # An error raised in the actor arrives wrapped (Ray's ``RayTaskError`` subclass of
    # it, whose text is the remote traceback): tell the original message.
    cause = getattr(exc, "cause", None)
    return str(cause if isinstance(cause, BaseException) else exc)


def add_websocket_routes(
    app: FastAPI, agents: Agents, authenticator: Authenticator, config: IngressConfig
) -> None:
    """Serve the ``cf_agent_*`` protocol at ``/agents/{agent}/{name}``."""
    hub = Hub()
    app.state.ws_hub = hub

    async def visible(slug: str, name: str, who: Principal) -> Any:
        """The caller's agent handle, None for a name nobody owns yet (the first chat
        claims it), NotVisibleError for an unknown class or another principal's."""
        validate_name(name, "agent name")
        route = config.agents.get(slug)
        if route is None:
            raise NotVisibleError(f"unknown agent class {slug!r}")
        owner = await agents.owner_of(slug, name)
        if owner is None:
            return None
        if owner != who.id:
            raise NotVisibleError(f"no agent {name!r} of class {slug!r}")
        return await agents.agent(slug, name, who, claim=False)

    async def existing(conn: Connection) -> Any:
        """The handle of the connection's agent if it exists and is live (never wakes a
        hibernated one: it runs nothing), else None."""
        handle = await visible(conn.slug, conn.name, conn.principal)
        if handle is None or not await agents.live(conn.slug, conn.name):
            return None
        return handle

    async def history(handle: Any, session_id: str | None) -> list[Any]:
        if handle is None:
            return []
        if session_id is None:
            session_id = await handle.get_current_session_id.remote()
            if session_id is None:
                return []
        try:
            return list(jsonable(await handle.get_history.remote(session_id)))
        except NotFoundError:
            return []

    async def deny(ws: WebSocket, status: int, message: str) -> None:
        # Refused before accept: an HTTP answer where the server can send one, else
        # a close before accept (which servers answer with 403).
        if "websocket.http.response" in ws.scope.get("extensions", {}):
            kind = "unauthorized" if status == 401 else "not_found"
            headers = {"www-authenticate": "Bearer"} if status == 401 else None
            body = {"error": {"type": kind, "message": message}}
            await ws.send_denial_response(JSONResponse(body, status_code=status, headers=headers))
        else:
            await ws.close(code=1008)

    # -- connect -----------------------------------------------------------------------

    async def endpoint(websocket: WebSocket, agent: str, name: str) -> None:
        principal = await authenticator.authenticate(websocket)
        if principal is None:
            await deny(websocket, 401, "missing or invalid bearer token")
            return
        try:
            handle = await visible(agent, name, principal)
        except (NotVisibleError, InvalidInputError) as exc:
            await deny(websocket, 404, str(exc))
            return
        await websocket.accept()
        conn = Connection(websocket, agent, name, principal, config.slow_consumer_timeout)
        # Out of live broadcasts until on_connect knows whether to offer a resume: a
        # chunk sent meanwhile would come before the offer (and out of the replay).
        conn.pending_resume = True
        conn.main = asyncio.current_task()
        hub.add(conn)
        writer = asyncio.ensure_future(conn.write_loop())
        try:
            conn.send({"type": IDENTITY, "name": name, "agent": agent})
            conn.send({"type": MCP_SERVERS, "mcp": _EMPTY_MCP})
            await on_connect(conn, handle)
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                text = message.get("text")
                if text is not None:
                    await dispatch(conn, text)
        except (WebSocketDisconnect, asyncio.CancelledError):
            pass
        finally:
            conn.closed = True
            hub.remove(conn)
            for task in list(conn.tasks):
                task.cancel()  # detach: the runs go on
            with contextlib.suppress(asyncio.QueueFull):
                conn.outbox.put_nowait(None)
            writer.cancel()
            with contextlib.suppress(Exception):
                code = CLOSE_TRY_AGAIN if conn.dropped else 1000
                await asyncio.wait_for(websocket.close(code=code), 1.0)

    app.add_api_websocket_route("/agents/{agent}/{name}", endpoint)

    async def on_connect(conn: Connection, handle: Any) -> None:
        if handle is not None and await agents.live(conn.slug, conn.name):
            run_id = await handle.active_run.remote()
            if run_id is not None:
                conn.pending_resume = True
                conn.send({"type": STREAM_RESUMING, "id": run_id})
                return
        conn.pending_resume = False
        conn.send({"type": CHAT_MESSAGES, "messages": await history(handle, None)})

    # -- frames ------------------------------------------------------------------------

    async def dispatch(conn: Connection, text: str) -> None:
        try:
            frame = json.loads(text)
        except ValueError:
            return  # not JSON: the package hands it to onMessage (a no-op)
        if not isinstance(frame, dict):
            return
        kind = frame.get("type")
        try:
            if kind == USE_CHAT_REQUEST:
                conn.spawn(chat_request(conn, frame))
            elif kind == CHAT_REQUEST_CANCEL:
                await cancel(conn, frame)
            elif kind == CHAT_CLEAR:
                await clear(conn)
            elif kind == STREAM_RESUME_REQUEST:
                await resume_request(conn, frame)
            elif kind == STREAM_RESUME_ACK:
                run_id = frame.get("id")
                if isinstance(run_id, str) and run_id not in conn.following:
                    conn.pending_resume = False
                    conn.spawn(follow(conn, run_id))
            elif kind == TOOL_APPROVAL:
                await tool_approval(conn, frame)
            elif kind == TOOL_RESULT:
                call_id = frame.get("toolCallId")
                if isinstance(call_id, str):
                    conn.send(
                        response(
                            call_id,
                            "thinkray runs every tool on the server: no client tool "
                            f"call {call_id!r} is waiting for a result",
                            done=True,
                            error=True,
                        )
                    )
            elif kind == RPC:
                rpc_id, method = frame.get("id"), frame.get("method")
                if isinstance(rpc_id, str):
                    conn.send(
                        {
                            "type": RPC,
                            "id": rpc_id,
                            "success": False,
                            "error": f"Method {method} is not callable",
                        }
                    )
            elif kind == STATE:
                conn.send({"type": STATE_ERROR, "error": "this agent has no client state"})
            # CHAT_MESSAGES (client-pushed transcripts) and unknown types: ignored.
        except Exception as exc:  # one bad frame must not end the connection
            log.warning("WebSocket frame %r failed: %s", kind, error_text(exc))

    async def chat_request(conn: Connection, frame: dict[str, Any]) -> None:
        request_id, init = frame.get("id"), frame.get("init")
        if not isinstance(request_id, str) or not isinstance(init, dict):
            return
        if init.get("method") != "POST":
            return  # the package handles POST requests only
        body_text = init.get("body")
        if not isinstance(body_text, str) or not body_text:
            return  # the package ignores an empty body
        try:
            if len(body_text.encode()) > config.max_body_bytes:
                raise HTTPError(413, f"body over {config.max_body_bytes} bytes", "too_large")
            if not REQUEST_ID.match(request_id):
                raise HTTPError(400, "a request id is 1-128 letters, digits, '_' or '-'")
            try:
                body = json.loads(body_text)
            except ValueError:
                return  # the package ignores a body that is not JSON
            if not isinstance(body, dict):
                raise HTTPError(400, "the request body must be a JSON object")
            stream = await start_turn(conn, request_id, body)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            conn.send(response(request_id, error_text(exc), done=True, error=True))
            return
        # The run belongs to the agent's connections, not to this one: it keeps
        # streaming to the others (and to nobody: it detaches) if this one goes.
        asyncio.ensure_future(pump(conn, request_id, stream))

    async def start_turn(conn: Connection, run_id: str, body: dict[str, Any]) -> Any:
        messages = body.get("messages")
        trigger = body.get("trigger", "submit-message")
        if not isinstance(messages, list):
            raise HTTPError(400, "'messages' must be a list of UI messages")
        if trigger not in ("submit-message", "regenerate-message"):
            raise HTTPError(400, f"unknown trigger {trigger!r}")
        message: dict[str, Any] | None = None
        if trigger == "submit-message":
            if not messages or not isinstance(messages[-1], dict):
                raise HTTPError(400, "submit-message needs the new message last in 'messages'")
            message = messages[-1]
            if message.get("role") != "user":
                raise HTTPError(400, "the message to submit must have role 'user'")
        # Only a valid submit may create the agent; a regenerate needs one already.
        claim = message is not None
        handle: Any = await agents.agent(conn.slug, conn.name, conn.principal, claim=claim)
        session_id = await handle.get_current_session_id.remote()
        if message is None:
            if session_id is None:
                raise HTTPError(400, "nothing to regenerate: no conversation yet")
            await rewind_for_regenerate(handle, session_id, body.get("messageId"))
        stream = handle.stream_chat.remote(message, session_id=session_id, run_id=run_id)
        await stream.start()  # busy, invalid: refused here, before any chunk
        return stream

    async def pump(origin: Connection, run_id: str, stream: Any) -> None:
        """Fan a run's chunks out to the agent's connections on this replica."""
        key = origin.key
        first = True
        try:
            async for chunk in stream:
                if first:
                    first = False
                    # The others learn of the new user message before its answer (the
                    # answer, which may be stored in part already, comes as chunks).
                    others = [c for c in hub.members(key) if c is not origin]
                    if others:
                        handle = await visible(origin.slug, origin.name, origin.principal)
                        stored = await history(handle, stream.session_id)
                        frame = {
                            "type": CHAT_MESSAGES,
                            "messages": [m for m in stored if m.get("id") != stream.message_id],
                        }
                        for c in others:
                            c.send(frame)
                targets = hub.live_targets(key, run_id)
                if not targets:
                    return  # nobody left to read it: detach (the run goes on)
                out = chunk_frame(run_id, chunk)
                for c in targets:
                    c.send(out)
        except ThinkrayError as exc:  # the actor died mid-run: say so in the protocol
            for c in hub.live_targets(key, run_id):
                c.send(response(run_id, str(exc), done=True, error=True))
            return
        except Exception:
            log.exception("WebSocket stream of run %s failed", run_id)
            for c in hub.live_targets(key, run_id):
                c.send(response(run_id, "internal error", done=True, error=True))
            return
        for c in hub.live_targets(key, run_id):
            c.send(response(run_id, done=True))
        await broadcast_messages(origin, stream.session_id)

    async def broadcast_messages(conn: Connection, session_id: str | None) -> None:
        """The stored messages, after a run, to every connection of the agent here."""
        try:
            handle = await visible(conn.slug, conn.name, conn.principal)
            frame = {"type": CHAT_MESSAGES, "messages": await history(handle, session_id)}
        except Exception as exc:
            log.warning("could not read the messages to broadcast: %s", error_text(exc))
            return
        hub.broadcast(conn.key, frame)

    async def cancel(conn: Connection, frame: dict[str, Any]) -> None:
        run_id = frame.get("id")
        if not isinstance(run_id, str):
            return
        handle = await existing(conn)
        if handle is not None:
            await handle.abort.remote(run_id=run_id, reason="cancelled by the client")

    async def clear(conn: Connection) -> None:
        handle = await visible(conn.slug, conn.name, conn.principal)
        if handle is not None:
            session_id = await handle.get_current_session_id.remote()
            if session_id is not None:
                await handle.clear_messages.remote(session_id)  # aborts a run in flight
        for other in hub.members(conn.key):
            other.pending_resume = False
        hub.broadcast(conn.key, {"type": CHAT_CLEAR}, exclude=(conn,))

    async def resume_request(conn: Connection, frame: dict[str, Any]) -> None:
        probe = frame.get("probeId")
        echo = {"probeId": probe} if isinstance(probe, str) and probe else {}
        handle = await existing(conn)
        run_id = await handle.active_run.remote() if handle is not None else None
        if run_id is None:
            conn.send({"type": STREAM_RESUME_NONE, "reason": "idle", **echo})
            return
        conn.pending_resume = True
        conn.send({"type": STREAM_RESUMING, "id": run_id, **echo})

    async def follow(conn: Connection, run_id: str) -> None:
        """After an ack: the run from chunk 0 (flagged ``replay``), ``replayComplete``,
        the live tail, ``done``; read through the session actor, so a run started
        through another replica resumes here."""
        conn.following.add(run_id)
        try:
            handle = await visible(conn.slug, conn.name, conn.principal)
            stream = None
            if handle is not None:
                stream = await handle.resume.remote(None, run_id).start()
            if stream is None or stream.run_id != run_id:
                conn.send(response(run_id, done=True, replay=True))  # nothing to replay
                return
            live = stream.live
            items: asyncio.Queue[Any] = asyncio.Queue()
            end = object()

            async def read() -> None:
                # A batch's items arrive here in one go: the first Ray batch is what
                # was stored when the ack came (the replay); later ones are live.
                try:
                    async for chunk in stream:
                        items.put_nowait((stream.batches, chunk))
                except Exception as exc:
                    items.put_nowait(exc)
                finally:
                    items.put_nowait(end)

            reader = asyncio.ensure_future(read())
            replaying = True
            try:
                while (item := await items.get()) is not end:
                    if isinstance(item, Exception):
                        conn.send(response(run_id, error_text(item), done=True, error=True))
                        return
                    batch, chunk = item
                    if replaying and live and batch > 1:
                        conn.send(response(run_id, replay=True, replayComplete=True))
                        replaying = False
                    conn.send(chunk_frame(run_id, chunk, replay=replaying))
                    if replaying and live and items.empty():
                        conn.send(response(run_id, replay=True, replayComplete=True))
                        replaying = False
            finally:
                reader.cancel()
            flags: dict[str, Any] = {"replay": True} if replaying else {}
            conn.send(response(run_id, done=True, **flags))
            if live:
                conn.send(
                    {"type": CHAT_MESSAGES, "messages": await history(handle, stream.session_id)}
                )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            conn.send(response(run_id, error_text(exc), done=True, error=True))
        finally:
            conn.following.discard(run_id)

    async def tool_approval(conn: Connection, frame: dict[str, Any]) -> None:
        call_id, approved = frame.get("toolCallId"), frame.get("approved")
        if not isinstance(call_id, str):
            return
        why = f"no pending approval for tool call {call_id!r}"
        handle = await existing(conn)
        if handle is not None and isinstance(approved, bool):
            try:
                pending = await handle.pending_approvals.remote()
            except Exception as exc:  # an agent class without approvals
                log.debug("pending_approvals failed: %s", exc)
                pending = []
                why = "this agent has no tool approvals"
            for ask in pending:
                # The row id is the model's call id, or ``<call id>~<run id>`` when an
                # earlier run used the same id.
                row = str(ask.get("tool_call_id", ask.get("toolCallId")))
                if row == call_id or row.startswith(f"{call_id}~"):
                    decision = "once" if approved else "deny"
                    try:
                        await handle.answer_approval.remote(
                            ask.get("approval_id"), decision, conn.principal.id
                        )
                        return
                    except Exception as exc:  # refused by may_approve, or decided meanwhile
                        why = error_text(exc)
                    break
        conn.send(response(call_id, why, done=True, error=True))
