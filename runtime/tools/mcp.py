"""An MCP client (seed 000's orchestrator "MCP Client"): connect to external MCP
servers over stdio or streamable HTTP with the official ``mcp`` package, list their
tools, call them, and turn them into thinkray :class:`~thinkray.runtime.tools.base.Tool`\\ s.

No Ray here: the Ray wiring (the orchestrator's servers, per-agent grants, the bridge
actor that holds the connections) is in :mod:`thinkray.actors.orchestrator` and
:mod:`thinkray.actors.bridge`.

What a caller can rely on:

- **Bounded.** Connecting (spawn + ``initialize`` + ``tools/list``) is bounded by
  ``connect_timeout``, every tool call by ``timeout``: a hanging server costs a
  :class:`McpTimeoutError`, never a hung turn; the connection stays up for later calls.
- **Reconnected.** A server whose connection ends (its process died, the HTTP endpoint
  went away) is noticed when its stream closes, and the next call connects again. A
  failed connect backs off exponentially (``backoff_initial`` doubling up to
  ``backoff_max``): calls inside the window fail at once with
  :class:`McpUnavailableError` saying when the next attempt is. A call in flight when
  the connection dies fails with :class:`McpConnectionError` and is *not* retried
  (the server may have run it).
- **Errors are values for the model.** An ``isError`` result, a JSON-RPC error, a
  timeout, a dead server, and data that is not MCP (a line on stdout that is not
  JSON-RPC, a result that does not fit the schema) each raise a subclass of
  :class:`McpError` with a message meant for the model; the turn loop turns it into
  the call's ``tool-output-error``. :func:`call_envelope`/:func:`raise_for_envelope`
  carry such an outcome across a process boundary as plain data.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import re
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, model_validator
from thinkray.runtime.errors import ToolExecutionError, ToolInputError, UserError
from thinkray.runtime.tools.base import Tool, ToolContext
from thinkray.runtime.typed_model import TypedModel

log = logging.getLogger("thinkray.mcp")

McpTransport = Literal["stdio", "http"]
"""``stdio``: spawn ``command args`` and speak JSON-RPC over its stdin/stdout;
``http``: the streamable HTTP transport at ``url``."""

McpErrorKind = Literal["tool", "timeout", "unavailable", "connection", "protocol"]
"""What went wrong, as :func:`call_envelope` reports it: ``tool`` (the server said the
call failed: an ``isError`` result or a JSON-RPC error), ``timeout``, ``unavailable``
(no connection and none could be made now), ``connection`` (lost while the call was in
flight), ``protocol`` (the server sent something that is not MCP)."""

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_TOOL_CHARS = re.compile(r"[^A-Za-z0-9_-]")
TOOL_PREFIX = "mcp__"
"""Model-facing MCP tool names are ``mcp__<server>__<tool>``."""


# -- errors ---------------------------------------------------------------------------


class McpError(ToolExecutionError):
    """An MCP tool call or connection failed; the message is meant for the model."""

    kind: McpErrorKind = "tool"


class McpToolError(McpError):
    """The server reported the call failed (an ``isError`` result or a JSON-RPC error)."""

    kind: McpErrorKind = "tool"


class McpTimeoutError(McpError):
    """The server did not answer within the timeout (the connection is kept). Not a
    ``TimeoutError``: the turn's own tool timeouts are those; this is the tool's
    failure, reported to the model like any other."""

    kind: McpErrorKind = "timeout"


class McpUnavailableError(McpError):
    """No connection to the server, and none could be made now (or it is backing off)."""

    kind: McpErrorKind = "unavailable"


class McpConnectionError(McpError):
    """The connection ended while the call was in flight (the next call reconnects)."""

    kind: McpErrorKind = "connection"


class McpProtocolError(McpError):
    """The server sent data that is not MCP: a line that is not JSON-RPC, or a result
    that does not fit the schema."""

    kind: McpErrorKind = "protocol"


class McpConfigError(UserError, ValueError):
    """An MCP server config is invalid, or names an unknown server."""


_KINDS: dict[str, type[McpError]] = {
    "tool": McpToolError,
    "timeout": McpTimeoutError,
    "unavailable": McpUnavailableError,
    "connection": McpConnectionError,
    "protocol": McpProtocolError,
}


# -- config and tool descriptions -----------------------------------------------------


class McpServerConfig(TypedModel):
    """How to reach one MCP server, and its limits. Stored as JSON (``model_dump``)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    transport: McpTransport = "stdio"
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] | None = None
    timeout: float = Field(30.0, gt=0)
    """Seconds one tool call may take."""
    connect_timeout: float = Field(15.0, gt=0)
    """Seconds to spawn or reach the server, ``initialize`` and list its tools."""
    backoff_initial: float = Field(0.5, ge=0)
    backoff_max: float = Field(30.0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> McpServerConfig:
        if not _NAME.match(self.name):
            raise ValueError(
                f"MCP server name {self.name!r}: 1-32 letters, digits, '_' or '-' "
                "(it becomes part of tool names)"
            )
        if self.transport == "stdio" and not self.command:
            raise ValueError("a stdio MCP server needs a 'command'")
        if self.transport == "http" and not (
            self.url and self.url.startswith(("http://", "https://"))
        ):
            raise ValueError("an http MCP server needs an http:// or https:// 'url'")
        return self

    @classmethod
    def parse(cls, name: str, config: dict[str, Any] | McpServerConfig) -> McpServerConfig:
        """``config`` (a dict, with or without ``name``) as a validated config named ``name``.

        Raises:
            McpConfigError: the config does not validate (each problem named).
        """
        data = config.model_dump() if isinstance(config, McpServerConfig) else dict(config)
        data["name"] = name
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}"
                for e in exc.errors()
            )
            raise McpConfigError(f"invalid MCP server config {name!r}: {problems}") from None


def tool_name(server: str, tool: str) -> str:
    """The model-facing name of ``server``'s ``tool``: ``mcp__<server>__<tool>``, with
    characters a model API refuses replaced by ``_`` and at most 64 characters (a long
    name keeps a hash of the original so two tools never collide)."""
    name = f"{TOOL_PREFIX}{server}__{_TOOL_CHARS.sub('_', tool)}"
    if len(name) > 64:
        digest = hashlib.sha1(tool.encode()).hexdigest()[:8]
        name = f"{name[:55]}_{digest}"
    return name


@dataclass(frozen=True)
class McpToolInfo:
    """One tool a server lists: ``tool`` as the server names it, ``name`` as the model
    sees it (:func:`tool_name`). Plain data: it travels between actors and is stored
    in agents' configs (:meth:`to_dict`/:meth:`from_dict`)."""

    server: str
    tool: str
    name: str
    description: str
    input_schema: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> McpToolInfo:
        """The info :meth:`to_dict` made."""
        return cls(
            server=data["server"],
            tool=data["tool"],
            name=data["name"],
            description=data.get("description", ""),
            input_schema=dict(data.get("input_schema") or {"type": "object"}),
        )


def _info(server: str, tool: Any) -> McpToolInfo:
    schema = dict(getattr(tool, "input_schema", None) or {})
    schema.setdefault("type", "object")
    description = getattr(tool, "description", None) or getattr(tool, "title", None) or ""
    return McpToolInfo(
        server=server,
        tool=tool.name,
        name=tool_name(server, tool.name),
        description=f"[MCP server {server}] {description}".strip(),
        input_schema=schema,
    )


def result_output(result: Any) -> Any:
    """A ``CallToolResult``'s content as the model's tool output: the text when every
    block is text (joined by newlines), the structured content when there is no
    content, else the blocks as JSON-ready dicts.

    Raises:
        McpToolError: the result is an ``isError`` one (its text is the message).
    """
    blocks = list(getattr(result, "content", None) or [])
    texts = [getattr(b, "text", None) for b in blocks]
    if getattr(result, "is_error", False):
        message = "\n".join(t for t in texts if isinstance(t, str)) or "the tool reported an error"
        raise McpToolError(message)
    if blocks and all(isinstance(t, str) for t in texts):
        return "\n".join(t for t in texts if t is not None)
    if not blocks:
        return getattr(result, "structured_content", None)
    return [b.model_dump(mode="json", by_alias=True, exclude_none=True) for b in blocks]


# -- one server's connection ----------------------------------------------------------


class _Link:
    """One live connection: the task that owns the transport and session contexts
    (anyio requires they be left in the task that entered them), the session, and a
    fault future in-flight calls race against."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.session: Any = None
        self.task: asyncio.Task[None] | None = None
        self.stop = asyncio.Event()
        self.alive = False
        self.error: str | None = None
        self.fault: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.errlog: Any = None  # the server's stderr (a temporary file), closed with the link

    def poison(self, error: McpError, *, dead: bool) -> None:
        """Fail the calls in flight with ``error``; ``dead``: the link is gone."""
        if dead:
            self.alive = False
            self.error = self.error or str(error)
            self.stop.set()
        if not self.fault.done():
            self.fault.set_exception(error)
            self.fault.exception()  # retrieved: no "never retrieved" warning
        if not dead:
            self.fault = asyncio.get_running_loop().create_future()


class McpServerConnection:
    """A connection to one MCP server that reconnects, with timeouts and backoff.

    Use from one event loop. Calls may run concurrently; connecting is serialized.
    """

    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self._link: _Link | None = None
        self._lock: asyncio.Lock | None = None
        self._tools: list[McpToolInfo] | None = None
        self._failures = 0
        self._retry_at = 0.0
        self.last_error: str | None = None
        self.connects = 0
        self.pid: int | None = None

    @property
    def name(self) -> str:
        """The server's name."""
        return self.config.name

    @property
    def connected(self) -> bool:
        """True while a live connection is up."""
        return self._link is not None and self._link.alive

    def status(self) -> dict[str, Any]:
        """JSON-ready: name, transport, connected, connects (how many times it
        connected), last_error, the tool names last listed, and seconds until the next
        connect attempt while backing off."""
        return {
            "name": self.name,
            "transport": self.config.transport,
            "connected": self.connected,
            "connects": self.connects,
            "last_error": self.last_error,
            "tools": [t.tool for t in self._tools or []],
            "retry_in": max(0.0, round(self._retry_at - time.monotonic(), 3)),
        }

    async def connect(self) -> None:
        """Connect (and list tools) unless connected.

        Raises:
            McpUnavailableError: backing off after a failed connect, or this attempt
                failed (it starts the next backoff window).
            McpProtocolError: the server answered with something that is not MCP.
        """
        await self._ensure()

    async def list_tools(self, *, refresh: bool = False) -> list[McpToolInfo]:
        """The server's tools: as listed when it last connected (connecting first if it
        never did), or listed again now with ``refresh``. Same errors as :meth:`connect`."""
        link = await self._ensure()
        if refresh or self._tools is None:
            self._tools = await self._bounded(link, self._list(link), self.config.timeout)
        return list(self._tools)

    async def call_tool(
        self, tool: str, arguments: dict[str, Any] | None = None, timeout: float | None = None
    ) -> Any:
        """Call ``tool`` and return its output (:func:`result_output`), reconnecting
        first if the connection is gone.

        Raises:
            McpToolError: the server reported the call failed.
            McpTimeoutError: no answer within ``timeout`` (default the config's).
            McpConnectionError: the connection ended while the call was in flight.
            McpUnavailableError: no connection could be made (see :meth:`connect`).
            McpProtocolError: the server sent something that is not MCP.
        """
        link = await self._ensure()
        limit = self.config.timeout if timeout is None else timeout
        result = await self._bounded(
            link, link.session.call_tool(tool, arguments or {}), limit, what=f"tool {tool!r}"
        )
        return result_output(result)

    async def close(self) -> None:
        """Close the connection (a stdio server's process is stopped)."""
        link, self._link = self._link, None
        if link is not None:
            await self._close_link(link)

    # -- internals ------------------------------------------------------------------

    async def _ensure(self) -> _Link:
        link = self._link
        if link is not None and link.alive:
            return link
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            link = self._link
            if link is not None and link.alive:
                return link
            if link is not None:  # dead: collect it before a new one
                self._link = None
                await self._close_link(link)
            wait = self._retry_at - time.monotonic()
            if wait > 0:
                raise McpUnavailableError(
                    f"MCP server {self.name!r} is unavailable ({self.last_error}); "
                    f"next reconnect attempt in {wait:.1f}s"
                )
            try:
                link = await self._open()
            except McpError as exc:
                self._failures += 1
                delay = min(
                    self.config.backoff_max,
                    self.config.backoff_initial * (2 ** (self._failures - 1)),
                )
                self._retry_at = time.monotonic() + delay
                self.last_error = str(exc)
                raise
            self._failures = 0
            self._retry_at = 0.0
            self.connects += 1
            self._link = link
            return link

    async def _open(self) -> _Link:
        link = _Link(self.name)
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # the server's stderr, closed with the link (see _close_link)
        errlog = link.errlog = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
        link.task = asyncio.ensure_future(self._own(link, ready, errlog))
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.config.connect_timeout)
        except McpError as exc:
            tail = _tail(errlog)
            await self._close_link(link)
            if isinstance(exc, McpProtocolError):
                raise McpProtocolError(f"{exc}{tail}") from None
            raise McpUnavailableError(f"{exc}{tail}") from None
        except TimeoutError:
            tail = _tail(errlog)
            await self._close_link(link)
            raise McpUnavailableError(
                f"MCP server {self.name!r} did not connect within "
                f"{self.config.connect_timeout:g}s{tail}"
            ) from None
        return link

    async def _own(self, link: _Link, ready: asyncio.Future[None], errlog: Any) -> None:
        """The link's owner task: enter the transport and session, connect, list the
        tools, then hold the contexts open until told to stop or the stream ends."""
        import anyio
        from mcp import ClientSession

        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport(errlog))
                # A pump between the transport and the session: it sees the stream end
                # (the server died) and lines that are not JSON-RPC, which the session
                # would only log while the call waits for its timeout.
                send, receive = anyio.create_memory_object_stream[Any](math.inf)
                tasks = await stack.enter_async_context(anyio.create_task_group())
                tasks.start_soon(self._pump, link, read, send)
                session = await stack.enter_async_context(ClientSession(receive, write))
                link.session = session
                await self._raced(link, session.initialize())
                link.alive = True
                self._tools = await self._raced(link, self._list(link))
                self.last_error = None
                ready.set_result(None)
                await link.stop.wait()
                tasks.cancel_scope.cancel()
        except BaseException as exc:  # noqa: BLE001 (the owner task must always end cleanly)
            inner = _first_mcp_error(exc)
            if inner is not None:
                error: McpError = inner
            elif isinstance(exc, asyncio.CancelledError):
                error = McpConnectionError(f"MCP server {self.name!r}: connection closed")
            else:
                error = McpUnavailableError(
                    f"MCP server {self.name!r}: connection failed: {_describe(exc)}"
                )
            link.poison(error, dead=True)
            if not ready.done():
                ready.set_exception(error)
                ready.exception()
            if not isinstance(exc, Exception | asyncio.CancelledError):
                raise
        finally:
            link.alive = False
            link.poison(
                McpConnectionError(f"MCP server {self.name!r}: connection closed"), dead=True
            )
            if not ready.done():
                ready.set_exception(McpUnavailableError(f"MCP server {self.name!r}: closed"))
                ready.exception()

    def _transport(self, errlog: Any) -> contextlib.AbstractAsyncContextManager[Any]:
        config = self.config
        if config.transport == "stdio":
            from mcp import StdioServerParameters
            from mcp.client.stdio import stdio_client

            params = StdioServerParameters(
                command=config.command or "",
                args=list(config.args),
                env=config.env,
                cwd=config.cwd,
            )
            return stdio_client(params, errlog=errlog)
        from mcp.client.streamable_http import streamable_http_client

        client = None
        if config.headers:
            from mcp.shared._httpx_utils import create_mcp_http_client

            client = create_mcp_http_client(headers=dict(config.headers))
        return _http(streamable_http_client, config.url or "", client)

    async def _pump(self, link: _Link, read: Any, send: Any) -> None:
        try:
            async with send:
                async for item in read:
                    if isinstance(item, Exception):
                        link.poison(
                            McpProtocolError(
                                f"MCP server {self.name!r} sent data that is not MCP "
                                f"(JSON-RPC): {_offending(item)}"
                            ),
                            dead=False,
                        )
                        continue
                    await send.send(item)
        except Exception as exc:
            log.debug("MCP server %r: read failed: %s", self.name, exc)
        link.poison(
            McpConnectionError(f"MCP server {self.name!r} closed the connection"), dead=True
        )

    async def _list(self, link: _Link) -> list[McpToolInfo]:
        tools: list[McpToolInfo] = []
        cursor: str | None = None
        for _ in range(100):  # pages; a server that pages forever is cut off
            if cursor is None:
                listed = await link.session.list_tools()
            else:
                from mcp.types import PaginatedRequestParams

                listed = await link.session.list_tools(params=PaginatedRequestParams(cursor=cursor))
            tools.extend(_info(self.name, t) for t in listed.tools)
            cursor = getattr(listed, "next_cursor", None)
            if not cursor:
                break
        return tools

    async def _raced(self, link: _Link, awaitable: Awaitable[Any]) -> Any:
        """``awaitable``'s result, unless the link faults first (then its error)."""
        task = asyncio.ensure_future(awaitable)
        fault = link.fault
        try:
            await asyncio.wait({task, fault}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if not task.done():
            task.cancel()
            fault.result()  # raises the fault's error
        return _unwrap(self.name, task)

    async def _bounded(
        self, link: _Link, awaitable: Awaitable[Any], timeout: float, what: str = "request"
    ) -> Any:
        try:
            return await asyncio.wait_for(self._raced(link, awaitable), timeout)
        except TimeoutError:
            raise McpTimeoutError(
                f"MCP server {self.name!r}: {what} timed out after {timeout:g}s"
            ) from None

    async def _close_link(self, link: _Link) -> None:
        link.stop.set()
        task = link.task
        if task is not None and not task.done() and not link.alive:
            task.cancel()  # still connecting: it would not see the stop event
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), 10.0)
            except BaseException:  # noqa: BLE001 (closing never raises)
                task.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(task, 2.0)
        if link.errlog is not None:
            link.errlog.close()


@contextlib.asynccontextmanager
async def _http(factory: Any, url: str, client: Any) -> Any:
    if client is None:
        async with factory(url) as streams:
            yield streams[0], streams[1]
    else:
        async with client, factory(url, http_client=client) as streams:
            yield streams[0], streams[1]


def _unwrap(server: str, task: asyncio.Future[Any]) -> Any:
    """The finished request's result, with its failure translated to an McpError."""
    try:
        return task.result()
    except McpError:
        raise
    except asyncio.CancelledError:
        raise McpConnectionError(f"MCP server {server!r}: request cancelled") from None
    except ValidationError as exc:
        raise McpProtocolError(
            f"MCP server {server!r} sent a result that does not fit the MCP schema: "
            f"{_describe(exc)}"
        ) from None
    except Exception as exc:
        from mcp.shared.exceptions import MCPError
        from mcp.types import CONNECTION_CLOSED

        if not isinstance(exc, MCPError):
            raise McpConnectionError(f"MCP server {server!r}: {_describe(exc)}") from None
        if exc.code == CONNECTION_CLOSED:
            raise McpConnectionError(
                f"MCP server {server!r}: connection closed ({exc.message})"
            ) from None
        raise McpToolError(f"MCP server {server!r} error {exc.code}: {exc.message}") from None


def _first_mcp_error(exc: BaseException) -> McpError | None:
    """``exc``, or the first McpError inside an exception group (anyio wraps them)."""
    if isinstance(exc, McpError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _first_mcp_error(inner)
            if found is not None:
                return found
    return None


def _offending(exc: Exception) -> str:
    """What the server sent that did not parse (the input of a pydantic error), else
    the error in one line."""
    if isinstance(exc, ValidationError):
        with contextlib.suppress(Exception):
            value = exc.errors()[0].get("input")
            if value is not None:
                return f"{str(value)[:200]!r}"
    return _describe(exc)


def _describe(exc: BaseException) -> str:
    """One line for an exception, through exception groups, at most 300 characters."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:300]


def _tail(errlog: Any, limit: int = 600) -> str:
    """The last lines the server wrote on stderr, to append to an error message (read
    with ``pread``: the server's process shares the file's offset)."""
    with contextlib.suppress(Exception):
        fd = errlog.fileno()
        size = os.fstat(fd).st_size
        text = os.pread(fd, limit, max(0, size - limit)).decode("utf-8", "replace").strip()
        if text:
            return f"; its stderr ends: {text}"
    return ""


# -- many servers ---------------------------------------------------------------------


class McpClient:
    """The connections to a set of MCP servers, by name (one event loop)."""

    def __init__(self) -> None:
        self._servers: dict[str, McpServerConnection] = {}

    def names(self) -> list[str]:
        """The servers' names, sorted."""
        return sorted(self._servers)

    def configs(self) -> dict[str, McpServerConfig]:
        """Each server's config, by name."""
        return {n: c.config for n, c in self._servers.items()}

    def server(self, name: str) -> McpServerConnection:
        """Server ``name``'s connection.

        Raises:
            McpConfigError: no such server.
        """
        try:
            return self._servers[name]
        except KeyError:
            raise McpConfigError(
                f"unknown MCP server {name!r}; known: {self.names() or 'none'}"
            ) from None

    async def add(self, config: McpServerConfig, *, connect: bool = True) -> dict[str, Any]:
        """Add (or replace, closing the old connection) a server; with ``connect``, try
        to connect and list its tools now. Returns its status (a failed connect is in
        ``last_error``; it is retried on first use)."""
        old = self._servers.get(config.name)
        if old is not None:
            if old.config == config:
                connect = connect and not old.connected
                if connect:
                    with contextlib.suppress(McpError):
                        await old.connect()
                return old.status()
            await old.close()
        connection = McpServerConnection(config)
        self._servers[config.name] = connection
        if connect:
            with contextlib.suppress(McpError):
                await connection.connect()
        return connection.status()

    async def remove(self, name: str) -> bool:
        """Close and forget server ``name``; False if there was none."""
        connection = self._servers.pop(name, None)
        if connection is None:
            return False
        await connection.close()
        return True

    async def sync(self, configs: list[McpServerConfig]) -> None:
        """Make the set of servers ``configs`` (added, replaced, removed; none connected
        here: each connects on first use)."""
        wanted = {c.name: c for c in configs}
        for name in [n for n in self._servers if n not in wanted]:
            await self.remove(name)
        for config in wanted.values():
            await self.add(config, connect=False)

    async def list_tools(self, name: str, *, refresh: bool = False) -> list[McpToolInfo]:
        """Server ``name``'s tools (see :meth:`McpServerConnection.list_tools`)."""
        return await self.server(name).list_tools(refresh=refresh)

    async def call(self, name: str, tool: str, arguments: dict[str, Any] | None = None) -> Any:
        """Call ``tool`` on server ``name`` (see :meth:`McpServerConnection.call_tool`)."""
        return await self.server(name).call_tool(tool, arguments)

    def status(self) -> list[dict[str, Any]]:
        """Every server's status, by name."""
        return [self._servers[n].status() for n in self.names()]

    async def close(self) -> None:
        """Close every connection."""
        for name in self.names():
            await self.remove(name)


async def call_envelope(call: Awaitable[Any]) -> dict[str, Any]:
    """Await an MCP call and report its outcome as plain data that crosses any
    boundary: ``{"ok": True, "output": ...}`` or ``{"ok": False, "kind": ..., "error":
    ...}`` (:data:`McpErrorKind`). Only :class:`McpError`\\ s and config errors become
    envelopes; anything else propagates."""
    try:
        return {"ok": True, "output": await call}
    except McpError as exc:
        return {"ok": False, "kind": exc.kind, "error": str(exc)}
    except McpConfigError as exc:
        return {"ok": False, "kind": "unavailable", "error": str(exc)}


def raise_for_envelope(envelope: Any) -> Any:
    """The output of a :func:`call_envelope` envelope, or its error raised again as the
    matching :class:`McpError`.

    Raises:
        McpProtocolError: ``envelope`` is not an envelope.
    """
    if not isinstance(envelope, dict) or "ok" not in envelope:
        raise McpProtocolError(f"not an MCP call outcome: {str(envelope)[:200]}")
    if envelope["ok"]:
        return envelope.get("output")
    error_cls = _KINDS.get(str(envelope.get("kind")), McpError)
    raise error_cls(str(envelope.get("error") or "MCP call failed"))


# -- MCP tools as thinkray tools ------------------------------------------------------

McpCall = Callable[[McpToolInfo, dict[str, Any]], Awaitable[Any]]
"""How an :class:`McpTool` reaches its server: ``call(info, arguments)`` returns the
output or raises an :class:`McpError` (an :class:`McpClient` in process, or a bridge
actor)."""


class McpTool:
    """An MCP server's tool as a thinkray :class:`~thinkray.runtime.tools.base.Tool`.

    Input is checked against the tool's JSON schema (with ``jsonschema`` when it is
    installed, else the object shape and required keys) before the call; the call goes
    through ``call`` and its errors reach the model as the call's output error.
    """

    def __init__(self, info: McpToolInfo, call: McpCall) -> None:
        self.info = info
        self.name = info.name
        self.description = info.description
        self._call = call
        self._validator: Any = None

    @property
    def input_schema(self) -> dict[str, Any]:
        """The server's input schema for the tool (an ``object``)."""
        return self.info.input_schema

    def validate(self, raw_input: Any) -> dict[str, Any]:
        """The arguments as a dict.

        Raises:
            ToolInputError: not a JSON object, or it does not fit the schema.
        """
        if isinstance(raw_input, str):
            try:
                raw_input = json.loads(raw_input) if raw_input.strip() else {}
            except json.JSONDecodeError as exc:
                raise ToolInputError(f"input is not valid JSON: {exc}") from exc
        if raw_input is None:
            raw_input = {}
        if not isinstance(raw_input, dict):
            raise ToolInputError(f"input for tool {self.name!r} must be a JSON object")
        problem = self._check(raw_input)
        if problem:
            raise ToolInputError(f"invalid input for tool {self.name!r}: {problem}")
        return raw_input

    def _check(self, value: dict[str, Any]) -> str | None:
        schema = self.info.input_schema
        try:
            import jsonschema  # type: ignore[import-untyped]
        except ImportError:  # pragma: no cover (mcp brings jsonschema)
            missing = [k for k in schema.get("required", []) if k not in value]
            return f"missing {', '.join(missing)}" if missing else None
        if self._validator is None:
            try:
                cls = jsonschema.validators.validator_for(schema)
                self._validator = cls(schema)
            except Exception:  # a schema the validator cannot read: the server judges
                return None
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(value))
        if error is None:
            return None
        where = ".".join(str(p) for p in error.absolute_path) or "input"
        return f"{where}: {error.message}"

    async def execute(self, input: Any, ctx: ToolContext) -> Any:
        """Call the server's tool with ``input``; its output, or an McpError."""
        return await self._call(self.info, dict(input))


def mcp_tools(infos: list[McpToolInfo], call: McpCall) -> dict[str, Tool]:
    """``infos`` as tools by model-facing name, each calling through ``call``."""
    return {info.name: McpTool(info, call) for info in infos}


def client_call(client: McpClient) -> McpCall:
    """An :data:`McpCall` that calls through ``client`` in this process."""

    async def call(info: McpToolInfo, arguments: dict[str, Any]) -> Any:
        return await client.call(info.server, info.tool, arguments)

    return call
