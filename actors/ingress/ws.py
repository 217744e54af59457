"""The ``cf_agent_*`` WebSocket protocol at ``/agents/{agent}/{name}``: what
Cloudflare's ``agents`` package speaks (``AgentClient`` from ``agents/client``,
``WebSocketChatTransport``/``useAgentChat`` from ``agents/chat``, the server side of
``@cloudflare/ai-chat``'s ``AIChatAgent`` and ``@cloudflare/think``'s ``Think``).

The frames, as read in github.com/cloudflare/agents (``packages/agents/src``:
``index.ts`` ``onConnect``/``onMessage``, ``types.ts``, ``chat/wire-types.ts``,
``chat/protocol.ts``, ``chat/parse-protocol.ts``, ``chat/resume-handshake.ts``,
``chat/resumable-stream.ts``, ``chat/ws-chat-transport.ts``, ``client.ts``;
``packages/think/src/think.ts``; ``packages/ai-chat/src/index.ts``):

Opening: ``GET /agents/{agent}/{name}`` upgraded, with the ``Authorization`` header
(or whatever the configured authenticator reads), or, from a browser (whose WebSocket
API sets no headers), ``?ticket=`` from ``POST /agents/{agent}/{name}/ws-ticket``
(:mod:`.tickets`: one agent, short-lived). An upgrade whose ``Origin`` is neither the
page's own nor in ``cors_origins`` is refused (403): a site the user visits cannot
open a socket with their cookies. A name nobody owns yet is accepted, but the socket
hears nothing of the agent (no broadcast, no run, no clear) until its principal owns
the name (its first chat claims it); another principal's name is 404 like a missing one.

On connect (server -> client)::

    {"type": "cf_agent_identity", "name": <name>, "agent": <slug>}
      (an agent class with synced state: also "stateFollows": true, then
       {"type": "cf_agent_state", "state": <the current state>})
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
no state a reconnect needs. A request id an earlier run of the agent used is refused
(its chunk log is that run's).

Broadcasts (the chunks of a run to the agent's other tabs, ``cf_agent_chat_messages``
and ``cf_agent_chat_clear``; not state changes, see below) reach the connections
*this replica* holds. Fanning them
out across replicas would take a subscription to the session actor per connection
(one more streaming call per open tab, all of them idle most of the time) for what is
a convenience: the session actor is the truth, and a tab on another replica gets it
at its next reconnect or resume probe, or from ``get-messages``. Deployments that want
live cross-tab updates pin an agent's connections to one replica (a session-affinity
load balancer).

Synced state (an agent class with ``state_model``; :mod:`.state`)::

    -> {"type": "cf_agent_state", "state": {...}}   (``AgentClient.setState``)
    <- {"type": "cf_agent_state_error", "error": "State update rejected: <why>"}
       to the sender only, when the class does not let clients set its state, the
       state does not fit its model or its hook refuses (nothing is stored)
    <- {"type": "cf_agent_state", "state": {...}}   to every member, on each change:
       a client's (not echoed to its sender when stored as sent), the agent's own, a
       Python handle's, an HTTP client's. The changes come from the session actor
       (``state_events``), so they reach the members on every replica. A first
       ``cf_agent_state`` claims a name nobody owns, as a chat does.

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
``cf_agent_state`` to a class without state is answered ``cf_agent_state_error``.
Nothing is written and the connection stays open.

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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocket, WebSocketDisconnect
from thinkray.actors.ingress.access import (
    Ingress,
    Upgrade,
    agent_of,
    ingress,
    may_open,
    ws_upgrade,
)
from thinkray.actors.ingress.agents import NotVisibleError
from thinkray.actors.ingress.auth import Principal
from thinkray.actors.ingress.common import (
    HTTPError,
    error_text,
    jsonable,
    loads_bounded,
    parse_turn,
    rewind_for_regenerate,
)
from thinkray.actors.ingress.state import (
    StateWatcher,
    follow_state,
    initial_snapshot,
    need_state_class,
    precheck_client_state,
    state_class,
)
from thinkray.storage.errors import NotFoundError, ThinkrayError

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

REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")  # fullmatch: "$" allows a final newline
"""Request ids become run ids (``nanoid`` ids and uuids fit)."""

_EMPTY_MCP: dict[str, Any] = {"prompts": [], "resources": [], "servers": {}, "tools": []}

Key = tuple[str, str]


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
    ing: Ingress | None = None
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
    state_version: int | None = None  # the agent state it has (None: not greeted yet)

    @property
    def key(self) -> Key:
        """The agent this connection talks to: (slug, name)."""
        return (self.slug, self.name)

    @property
    def state(self) -> Ingress:
        """The replica's shared state (set for every accepted connection)."""
        assert self.ing is not None
        return self.ing

    @property
    def hub(self) -> Hub:
        """The replica's connections."""
        hub: Hub = self.state.hub
        return hub

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
    """The connections this replica holds, by agent, and the runs it fans out.

    Only the owner's connections to an agent are its *members*, and every fan-out
    (a run's chunks, the stored messages, a clear) goes to members only. A connection
    opened on a name nobody owns yet *waits*: it joins when its principal owns the
    name (its own chat claimed it, or a member of the same principal fans out), never
    when another principal claims it."""

    def __init__(self) -> None:
        self.groups: dict[Key, dict[str, Connection]] = {}
        self.waiting: dict[Key, dict[str, Connection]] = {}
        self.owners: dict[Key, str] = {}
        self.pumps: dict[Key, set[asyncio.Task[Any]]] = {}
        # Synced state (.state): one feed per agent with clients here, the newest
        # change it brought, and the owner's state event streams.
        self.feeds: dict[Key, asyncio.Task[Any]] = {}
        self.latest: dict[Key, dict[str, Any]] = {}
        self.watchers: dict[Key, dict[str, StateWatcher]] = {}

    def add(self, conn: Connection, owned: bool) -> None:
        """Hold ``conn`` (accepted): a member if its principal owns the agent."""
        if owned:
            self.join(conn)
        else:
            self.waiting.setdefault(conn.key, {})[conn.id] = conn

    def join(self, conn: Connection) -> None:
        """``conn``'s principal owns its agent now (it was checked): it and that
        principal's other waiting connections become members."""
        owner = self.owners.setdefault(conn.key, conn.principal.id)
        if owner != conn.principal.id or conn.closed:
            return
        group = self.groups.setdefault(conn.key, {})
        waiting = self.waiting.get(conn.key, {})
        waiting.pop(conn.id, None)
        group[conn.id] = conn
        for other in [c for c in waiting.values() if c.principal.id == owner]:
            group[waiting.pop(other.id).id] = other
        if not waiting:
            self.waiting.pop(conn.key, None)
        if conn.ing is not None:
            self.feed(conn.key, conn.ing, conn.principal)

    def claimed(self, key: Key, who: Principal) -> None:
        """``who`` owns agent ``key`` now (an HTTP request claimed it): its sockets
        waiting on the name join (the others go on waiting, hearing nothing)."""
        for conn in list(self.waiting.get(key, {}).values()):
            if conn.principal.id == who.id:
                self.join(conn)  # takes the principal's other waiting sockets along
                return

    def joined(self, conn: Connection) -> bool:
        """Whether ``conn`` is a member (hears its agent's fan-out)."""
        return conn.id in self.groups.get(conn.key, {})

    def remove(self, conn: Connection) -> None:
        """Forget ``conn`` (closed). The last connection to an agent here takes the
        runs it fanned out with it (they detach; the runs go on in the actor)."""
        for table in (self.groups, self.waiting):
            group = table.get(conn.key, {})
            group.pop(conn.id, None)
            if not group:
                table.pop(conn.key, None)
        if conn.key not in self.groups and conn.key not in self.waiting:
            for task in self.pumps.pop(conn.key, set()):
                task.cancel()
        self.release(conn.key)

    def track(self, key: Key, task: asyncio.Task[Any]) -> None:
        """Keep a run's fan-out task referenced until it ends or is cancelled."""
        tasks = self.pumps.setdefault(key, set())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def members(self, key: Key) -> list[Connection]:
        """The owner's open connections to agent ``key``."""
        return [c for c in self.groups.get(key, {}).values() if not c.closed]

    def live_targets(self, key: Key, run_id: str) -> list[Connection]:
        """Who gets a run's live frames: not waiting on a resume ack, not reading the
        run on its own."""
        return [c for c in self.members(key) if not c.pending_resume and run_id not in c.following]

    def broadcast(self, key: Key, frame: dict[str, Any], exclude: Any = ()) -> None:
        """Send ``frame`` to agent ``key``'s members but ``exclude``."""
        for conn in self.members(key):
            if conn not in exclude:
                conn.send(frame)

    # -- synced state --

    def release(self, key: Key) -> None:
        """Forget what agent ``key`` no longer needs here: its state feed once no member
        or state stream is left, its owner once no connection or stream is."""
        if key not in self.groups and key not in self.watchers:
            feed = self.feeds.pop(key, None)
            if feed is not None:
                feed.cancel()
            self.latest.pop(key, None)
        if key not in self.groups and key not in self.waiting and key not in self.watchers:
            self.owners.pop(key, None)

    def feed(self, key: Key, ing: Ingress, who: Principal) -> None:
        """Make sure agent ``key``'s state changes reach its clients here (a class
        without state has none); ``who`` owns it (checked)."""
        if key in self.feeds or state_class(ing, key[0]) is None:
            return
        task = asyncio.ensure_future(follow_state(ing, key, who, self.publisher(key)))
        self.feeds[key] = task
        task.add_done_callback(
            lambda t: self.feeds.pop(key, None) if self.feeds.get(key) is t else None
        )

    def publisher(self, key: Key) -> Callable[[dict[str, Any]], None]:
        """What the feed of agent ``key`` calls with each change."""
        return lambda change: self.publish_state(key, change)

    def latest_state(self, key: Key) -> dict[str, Any] | None:
        """The newest state change of agent ``key`` heard here (None: none yet)."""
        return self.latest.get(key)

    def publish_state(self, key: Key, change: dict[str, Any]) -> None:
        """A state change of agent ``key``: a ``cf_agent_state`` frame to each member
        that has not seen it (not to the connection that sent it, if it was stored as
        sent), and to the owner's state streams."""
        version = change["version"]
        known = self.latest.get(key)
        if known is None or version > known["version"]:
            self.latest[key] = change
        frame = {"type": STATE, "state": change["state"]}
        for conn in self.members(key):
            if conn.state_version is None or version <= conn.state_version:
                continue  # not greeted yet (greet sends the newest), or it has this one
            conn.state_version = version
            if not (change.get("exact") and change.get("origin") == conn.id):
                conn.send(frame)
        for watcher in list(self.watchers.get(key, {}).values()):
            watcher.offer(change)

    def watch_state(self, key: Key, watcher: StateWatcher, ing: Ingress) -> None:
        """Add a state stream of agent ``key`` (its principal was found to own it).

        Raises:
            NotVisibleError: the hub knows another owner.
        """
        owner = self.owners.setdefault(key, watcher.principal.id)
        if owner != watcher.principal.id:
            raise NotVisibleError(f"no agent {key[1]!r} of class {key[0]!r}")
        self.watchers.setdefault(key, {})[watcher.id] = watcher
        self.feed(key, ing, watcher.principal)

    def unwatch_state(self, key: Key, watcher: StateWatcher) -> None:
        """A state stream ended."""
        table = self.watchers.get(key, {})
        table.pop(watcher.id, None)
        if not table:
            self.watchers.pop(key, None)
        self.release(key)


def response(run_id: str, body: str = "", *, done: bool = False, **flags: Any) -> dict[str, Any]:
    """A ``cf_agent_use_chat_response`` frame."""
    return {"type": USE_CHAT_RESPONSE, "id": run_id, "body": body, "done": done, **flags}


def chunk_frame(run_id: str, chunk: dict[str, Any], replay: bool = False) -> dict[str, Any]:
    """One UI chunk as a frame; an ``error`` chunk is the protocol's error frame."""
    flags: dict[str, Any] = {"replay": True} if replay else {}
    if chunk.get("type") == "error":
        return response(run_id, str(chunk.get("errorText") or "error"), error=True, **flags)
    return response(run_id, json.dumps(chunk), **flags)


# -- the agent, as a connection's principal may see it --------------------------------------


async def own_agent(conn: Connection) -> Any | None:
    """The connection's agent if its principal owns it; None while nobody does, or
    once another principal does (the socket hears nothing of it). Goes through
    :func:`.access.agent_of`, the one ownership check."""
    if not conn.hub.joined(conn):
        try:
            if not await may_open(conn.state, conn.slug, conn.name, conn.principal):
                return None  # nobody owns the name yet
        except NotVisibleError:
            return None  # another principal's now: this socket sees nothing of it
        conn.hub.join(conn)  # it became this principal's meanwhile (an HTTP chat claimed it)
    return await agent_of(conn.state, conn.slug, conn.name, conn.principal, claim=False)


async def live_agent(conn: Connection) -> Any | None:
    """:func:`own_agent` if it is live now (never wakes a hibernated one: it runs
    nothing), else None."""
    handle = await own_agent(conn)
    if handle is None or not await conn.state.agents.live(conn.slug, conn.name):
        return None
    return handle


async def history(handle: Any, session_id: str | None) -> list[Any]:
    """A session's stored messages (the current session's without ``session_id``)."""
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


# -- connect -----------------------------------------------------------------------------

ws_routes = APIRouter()


async def deny(ws: WebSocket, status: int, message: str) -> None:
    """Refuse an upgrade before accept: an HTTP answer where the server can send one,
    else a close before accept (which servers answer with 403)."""
    if "websocket.http.response" in ws.scope.get("extensions", {}):
        kind = {401: "unauthorized", 403: "forbidden"}.get(status, "not_found")
        headers = {"www-authenticate": "Bearer"} if status == 401 else None
        body = {"error": {"type": kind, "message": message}}
        await ws.send_denial_response(JSONResponse(body, status_code=status, headers=headers))
    else:
        await ws.close(code=1008)


@ws_routes.websocket("/agents/{agent}/{name}")
async def endpoint(
    websocket: WebSocket,
    agent: str,
    name: str,
    upgrade: Annotated[Upgrade, Depends(ws_upgrade)],
    ing: Annotated[Ingress, Depends(ingress)],
) -> None:
    """Serve one connection: greet, then its frames until it closes."""
    if upgrade.principal is None:
        await deny(websocket, upgrade.status, upgrade.message)
        return
    await websocket.accept()
    timeout = ing.config.slow_consumer_timeout
    conn = Connection(websocket, agent, name, upgrade.principal, timeout, ing=ing)
    # Out of live broadcasts until greet knows whether to offer a resume: a chunk
    # sent meanwhile would come before the offer (and out of the replay).
    conn.pending_resume = True
    conn.main = asyncio.current_task()
    ing.hub.add(conn, upgrade.owned)
    writer = asyncio.ensure_future(conn.write_loop())
    try:
        await greet(conn)
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
        await close(conn, writer)


async def close(conn: Connection, writer: asyncio.Task[Any]) -> None:
    """Detach a closed connection: its tasks end, the runs go on."""
    conn.closed = True
    conn.hub.remove(conn)
    for task in list(conn.tasks):
        task.cancel()
    with contextlib.suppress(asyncio.QueueFull):
        conn.outbox.put_nowait(None)
    writer.cancel()
    with contextlib.suppress(Exception):
        code = CLOSE_TRY_AGAIN if conn.dropped else 1000
        await asyncio.wait_for(conn.ws.close(code=code), 1.0)


async def state_on_connect(conn: Connection) -> dict[str, Any] | None:
    """The agent's state for a connection's greeting (None for a class without state):
    the owner's agent's, the class's initial state while nobody owns the name."""
    cls = state_class(conn.state, conn.slug)
    if cls is None:
        return None
    try:
        handle = await own_agent(conn)
        if handle is None:
            return initial_snapshot(cls)
        snapshot: dict[str, Any] = await handle.state_snapshot.remote()
    except Exception as exc:  # e.g. a stored state that no longer fits the model
        log.warning("no state for %s/%s on connect: %s", conn.slug, conn.name, error_text(exc))
        return None
    # A change the feed brought while the snapshot was read is newer: the greeting
    # has it (after this point, nothing is awaited: the feed sends what comes next).
    latest = conn.hub.latest_state(conn.key)
    if conn.hub.joined(conn) and latest is not None and latest["version"] > snapshot["version"]:
        snapshot = latest
    return snapshot


async def greet(conn: Connection) -> None:
    """Identity, the agent's state (a class with state; the identity then says
    ``stateFollows``, so the ``agents`` client is ready once it has the state), MCP
    servers, then a resume offer for a run in flight, else the current session's
    messages."""
    snapshot = await state_on_connect(conn)
    identity = {"type": IDENTITY, "name": conn.name, "agent": conn.slug}
    if snapshot is None:
        conn.send(identity)
    else:
        conn.send({**identity, "stateFollows": True})
        conn.state_version = snapshot["version"]
        conn.send({"type": STATE, "state": snapshot["state"]})
    conn.send({"type": MCP_SERVERS, "mcp": _EMPTY_MCP})
    handle = await live_agent(conn)
    if handle is not None:
        run_id = await handle.active_run.remote()
        if run_id is not None:
            conn.pending_resume = True
            conn.send({"type": STREAM_RESUMING, "id": run_id})
            return
    conn.pending_resume = False
    conn.send({"type": CHAT_MESSAGES, "messages": await history(await own_agent(conn), None)})


# -- frames ------------------------------------------------------------------------------

FrameHandler = Callable[[Connection, dict[str, Any]], Awaitable[None]]


async def dispatch(conn: Connection, text: str) -> None:
    """Handle one text frame; bad frames are ignored, as the package does."""
    try:
        frame = loads_bounded(text)
    except ValueError:
        return  # not JSON (or absurdly nested): the package hands it to onMessage (a no-op)
    if not isinstance(frame, dict):
        return
    kind = frame.get("type")
    # CHAT_MESSAGES (client-pushed transcripts) and unknown types: ignored.
    handler = HANDLERS.get(kind) if isinstance(kind, str) else None
    if handler is None:
        return
    try:
        await handler(conn, frame)
    except Exception as exc:  # one bad frame must not end the connection
        log.warning("WebSocket frame %r failed: %s", kind, error_text(exc))


async def on_chat_request(conn: Connection, frame: dict[str, Any]) -> None:
    """Start the turn in the background (it awaits the actor)."""
    conn.spawn(chat_request(conn, frame))


def chat_body(conn: Connection, frame: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """A chat request's id and body; None for what the package ignores (not a POST, an
    empty or non-JSON body); HTTPError for what it refuses."""
    request_id, init = frame.get("id"), frame.get("init")
    if not isinstance(request_id, str) or not isinstance(init, dict):
        return None
    body_text = init.get("body")
    if init.get("method") != "POST" or not isinstance(body_text, str) or not body_text:
        return None
    limit = conn.state.config.max_body_bytes
    if len(body_text.encode()) > limit:
        raise HTTPError(413, f"body over {limit} bytes", "too_large")
    if not REQUEST_ID.fullmatch(request_id):
        raise HTTPError(400, "a request id is 1-128 letters, digits, '_' or '-'")
    try:
        body = loads_bounded(body_text)
    except ValueError:
        return None
    if not isinstance(body, dict):
        raise HTTPError(400, "the request body must be a JSON object")
    return request_id, body


async def chat_request(conn: Connection, frame: dict[str, Any]) -> None:
    """Validate and start a turn, then fan its chunks out."""
    try:
        parsed = chat_body(conn, frame)
        if parsed is None:
            return
        request_id, body = parsed
        stream = await start_turn(conn, request_id, body)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        conn.send(response(str(frame.get("id")), error_text(exc), done=True, error=True))
        return
    # The run belongs to the agent's connections, not to this one: it keeps
    # streaming to the others if this one goes (the hub holds it until they all do).
    conn.hub.track(conn.key, asyncio.ensure_future(pump(conn, request_id, stream)))


async def start_turn(conn: Connection, run_id: str, body: dict[str, Any]) -> Any:
    """Claim (a submit) or find (a regenerate) the agent, join its fan-out, start."""
    turn = parse_turn(body)  # all of it checked before anything is claimed or written
    handle = await agent_of(conn.state, conn.slug, conn.name, conn.principal, claim=turn.claims)
    conn.hub.join(conn)  # its principal owns the name now
    session_id = None  # a submit runs in the agent's current session (made if none)
    if turn.message is None:
        session_id = await handle.get_current_session_id.remote()
        if session_id is None:
            raise HTTPError(400, "nothing to regenerate: no conversation yet")
        await rewind_for_regenerate(handle, session_id, turn.regenerate_id)
    stream = handle.stream_chat.remote(
        turn.message, session_id=session_id, run_id=run_id, on_busy=turn.on_busy
    )
    await stream.start()  # busy, invalid, a reused run id: refused here, before any chunk
    return stream


async def announce(origin: Connection, stream: Any) -> None:
    """The other tabs learn of the new user message before its answer (the answer,
    which may be stored in part already, comes as chunks)."""
    others = [c for c in origin.hub.members(origin.key) if c is not origin]
    if not others:
        return
    stored = await history(await own_agent(origin), stream.session_id)
    frame = {
        "type": CHAT_MESSAGES,
        "messages": [m for m in stored if m.get("id") != stream.message_id],
    }
    for c in others:
        c.send(frame)


async def pump(origin: Connection, run_id: str, stream: Any) -> None:
    """Fan a run's chunks out to the agent's members on this replica."""
    hub, key = origin.hub, origin.key
    first = True
    try:
        async for chunk in stream:
            if first:
                first = False
                await announce(origin, stream)
            targets = hub.live_targets(key, run_id)
            if not targets:
                return  # nobody left to read it: detach (the run goes on)
            out = chunk_frame(run_id, chunk)
            for c in targets:
                c.send(out)
    except ThinkrayError as exc:  # the actor died mid-run: say so in the protocol
        end_run(hub, key, run_id, str(exc))
        return
    except Exception:
        log.exception("WebSocket stream of run %s failed", run_id)
        end_run(hub, key, run_id, "internal error")
        return
    for c in hub.live_targets(key, run_id):
        c.send(response(run_id, done=True))
    await broadcast_messages(origin, stream.session_id)


def end_run(hub: Hub, key: Key, run_id: str, why: str) -> None:
    """A run that failed mid-stream, as the protocol's error frame."""
    for c in hub.live_targets(key, run_id):
        c.send(response(run_id, why, done=True, error=True))


async def broadcast_messages(conn: Connection, session_id: str | None) -> None:
    """The stored messages, after a run, to every member of the agent here."""
    try:
        handle = await own_agent(conn)
        frame = {"type": CHAT_MESSAGES, "messages": await history(handle, session_id)}
    except Exception as exc:
        log.warning("could not read the messages to broadcast: %s", error_text(exc))
        return
    conn.hub.broadcast(conn.key, frame)


async def cancel(conn: Connection, frame: dict[str, Any]) -> None:
    """``cf_agent_chat_request_cancel``: abort that run."""
    run_id = frame.get("id")
    if not isinstance(run_id, str):
        return
    handle = await live_agent(conn)
    if handle is not None:
        await handle.abort.remote(run_id=run_id, reason="cancelled by the client")


async def clear(conn: Connection, frame: dict[str, Any]) -> None:
    """``cf_agent_chat_clear``: empty the current session; the other members hear it.
    A connection that is not a member (nobody owns the name yet) clears nothing."""
    handle = await own_agent(conn)
    if handle is None:
        return
    session_id = await handle.get_current_session_id.remote()
    if session_id is not None:
        await handle.clear_messages.remote(session_id)  # aborts a run in flight
    for other in conn.hub.members(conn.key):
        other.pending_resume = False
    conn.hub.broadcast(conn.key, {"type": CHAT_CLEAR}, exclude=(conn,))


async def resume_request(conn: Connection, frame: dict[str, Any]) -> None:
    """``cf_agent_stream_resume_request``: offer the run in flight, or say idle."""
    probe = frame.get("probeId")
    echo = {"probeId": probe} if isinstance(probe, str) and probe else {}
    handle = await live_agent(conn)
    run_id = await handle.active_run.remote() if handle is not None else None
    if run_id is None:
        conn.send({"type": STREAM_RESUME_NONE, "reason": "idle", **echo})
        return
    conn.pending_resume = True
    conn.send({"type": STREAM_RESUMING, "id": run_id, **echo})


async def resume_ack(conn: Connection, frame: dict[str, Any]) -> None:
    """``cf_agent_stream_resume_ack``: replay the run, then its live tail."""
    run_id = frame.get("id")
    if isinstance(run_id, str) and run_id not in conn.following:
        conn.pending_resume = False
        conn.spawn(follow(conn, run_id))


async def follow(conn: Connection, run_id: str) -> None:
    """After an ack: the run from chunk 0 (flagged ``replay``), ``replayComplete``,
    the live tail, ``done``; read through the session actor, so a run started
    through another replica resumes here."""
    conn.following.add(run_id)
    try:
        handle = await own_agent(conn)
        stream = None
        if handle is not None:
            stream = await handle.resume.remote(None, run_id).start()
        if stream is None or stream.run_id != run_id:
            conn.send(response(run_id, done=True, replay=True))  # nothing to replay
            return
        replaying = await relay(conn, run_id, stream)
        if replaying is None:
            return
        flags: dict[str, Any] = {"replay": True} if replaying else {}
        conn.send(response(run_id, done=True, **flags))
        if stream.live:
            messages = await history(handle, stream.session_id)
            conn.send({"type": CHAT_MESSAGES, "messages": messages})
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        conn.send(response(run_id, error_text(exc), done=True, error=True))
    finally:
        conn.following.discard(run_id)


async def read_batches(stream: Any, items: asyncio.Queue[Any], end: object) -> None:
    """Queue a resumed stream's chunks with the number of the Ray batch each came in:
    the first batch is what was stored when the ack came (the replay); later ones are
    live."""
    try:
        async for chunk in stream:
            items.put_nowait((stream.batches, chunk))
    except Exception as exc:
        items.put_nowait(exc)
    finally:
        items.put_nowait(end)


async def relay(conn: Connection, run_id: str, stream: Any) -> bool | None:
    """Send a resumed run's chunks, the replay flagged, ``replayComplete`` between
    replay and live tail. Returns whether it ended still replaying; None after an
    error frame."""
    items: asyncio.Queue[Any] = asyncio.Queue()
    end = object()
    reader = asyncio.ensure_future(read_batches(stream, items, end))
    replaying = True
    try:
        while (item := await items.get()) is not end:
            if isinstance(item, Exception):
                conn.send(response(run_id, error_text(item), done=True, error=True))
                return None
            batch, chunk = item
            if replaying and stream.live and batch > 1:
                conn.send(response(run_id, replay=True, replayComplete=True))
                replaying = False
            conn.send(chunk_frame(run_id, chunk, replay=replaying))
            if replaying and stream.live and items.empty():
                conn.send(response(run_id, replay=True, replayComplete=True))
                replaying = False
    finally:
        reader.cancel()
    return replaying


def matching_ask(pending: list[dict[str, Any]], call_id: str) -> dict[str, Any] | None:
    """The pending ask for tool call ``call_id``: its row id is the model's call id, or
    ``<call id>~<run id>`` when an earlier run used the same id."""
    for ask in pending:
        row = str(ask.get("tool_call_id", ask.get("toolCallId")))
        if row == call_id or row.startswith(f"{call_id}~"):
            return ask
    return None


async def answer_ask(conn: Connection, call_id: str, approved: Any) -> str | None:
    """Answer the pending ask of ``call_id``; None when answered, else why not."""
    handle = await live_agent(conn)
    if handle is None or not isinstance(approved, bool):
        return f"no pending approval for tool call {call_id!r}"
    try:
        pending = await handle.pending_approvals.remote()
    except Exception as exc:  # an agent class without approvals
        log.debug("pending_approvals failed: %s", exc)
        return "this agent has no tool approvals"
    ask = matching_ask(pending, call_id)
    if ask is None:
        return f"no pending approval for tool call {call_id!r}"
    decision = "once" if approved else "deny"
    try:
        await handle.answer_approval.remote(ask.get("approval_id"), decision, conn.principal.id)
    except Exception as exc:  # refused by may_approve, or decided meanwhile
        return error_text(exc)
    return None


async def tool_approval(conn: Connection, frame: dict[str, Any]) -> None:
    """``cf_agent_tool_approval``: answer a pending ask (as the connection's
    principal); refused ones get the error frame addressed by the call id."""
    call_id = frame.get("toolCallId")
    if not isinstance(call_id, str):
        return
    why = await answer_ask(conn, call_id, frame.get("approved"))
    if why is not None:
        conn.send(response(call_id, why, done=True, error=True))


async def tool_result(conn: Connection, frame: dict[str, Any]) -> None:
    """``cf_agent_tool_result``: no client tool call is ever waiting."""
    call_id = frame.get("toolCallId")
    if isinstance(call_id, str):
        why = (
            "thinkray runs every tool on the server: no client tool "
            f"call {call_id!r} is waiting for a result"
        )
        conn.send(response(call_id, why, done=True, error=True))


async def rpc(conn: Connection, frame: dict[str, Any]) -> None:
    """``rpc``: no method is callable here."""
    rpc_id, method = frame.get("id"), frame.get("method")
    if isinstance(rpc_id, str):
        error = f"Method {method} is not callable"
        conn.send({"type": RPC, "id": rpc_id, "success": False, "error": error})


async def set_client_state(conn: Connection, value: Any) -> None:
    """Check a client's state (before anything is claimed or woken), claim the name
    if nobody owns it, and hand it to the agent, which stores it and reports it to
    every feed (this connection is not sent its own change back)."""
    precheck_client_state(need_state_class(conn.state, conn.slug), value)
    handle = await agent_of(conn.state, conn.slug, conn.name, conn.principal, claim=True)
    conn.hub.join(conn)  # its principal owns the name now
    await handle.set_client_state.remote(value, origin=conn.id)


async def state(conn: Connection, frame: dict[str, Any]) -> None:
    """``cf_agent_state`` from a client (``AgentClient.setState``): stored and sent to
    the agent's other clients, or refused with ``cf_agent_state_error`` to this
    connection only (nothing stored)."""
    if "state" not in frame:
        return  # not a state frame: the package hands it to onMessage (a no-op)
    try:
        await set_client_state(conn, frame["state"])
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        conn.send({"type": STATE_ERROR, "error": f"State update rejected: {error_text(exc)}"})


HANDLERS: dict[str, FrameHandler] = {
    USE_CHAT_REQUEST: on_chat_request,
    CHAT_REQUEST_CANCEL: cancel,
    CHAT_CLEAR: clear,
    STREAM_RESUME_REQUEST: resume_request,
    STREAM_RESUME_ACK: resume_ack,
    TOOL_APPROVAL: tool_approval,
    TOOL_RESULT: tool_result,
    RPC: rpc,
    STATE: state,
}
