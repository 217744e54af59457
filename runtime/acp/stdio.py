"""ACP over stdin/stdout, as an editor spawns an agent: one JSON-RPC message per line.

The official SDK's stdio transport drops a line it cannot parse in silence and lets
a message of the wrong shape (a JSON array, a number, an id that is an object) reach
its dispatcher, whose receive loop then dies, and the process with it. Here every
frame is checked first and a bad one is answered as JSON-RPC 2.0 says (``-32700``
parse error, ``-32600`` invalid request, ``id: null`` when the id is unusable); the
connection goes on with the next line. An over-long line is skipped to its end and
answered the same way. Requests that parse reach the SDK, which answers an unknown
method ``-32601`` and bad params ``-32602``.

Stray writes to stdout (a ``print`` in an agent's tool, a library's banner) would
corrupt the protocol: :func:`protocol_stdout` moves the protocol to a private copy of
file descriptor 1 and points fd 1 (and ``sys.stdout``) at stderr.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from typing import Any

from acp.agent.connection import AgentSideConnection

log = logging.getLogger("thinkray.acp")

__all__ = ["MAX_FRAME_BYTES", "CheckedTransport", "protocol_stdout", "serve_stdio"]

MAX_FRAME_BYTES = 50 * 1024 * 1024
"""The longest line accepted (the SDK's own default buffer limit): prompts with
embedded files are large, but a line without end must not eat the memory."""

PARSE_ERROR, INVALID_REQUEST = -32700, -32600


def _error(id_: Any, code: int, message: str, details: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": id_,
        "error": {"code": code, "message": message, "data": {"details": details}},
    }


def _valid_id(value: Any) -> bool:
    return value is None or (isinstance(value, (str, int)) and not isinstance(value, bool))


def frame_problem(message: Any) -> tuple[Any, str] | None:
    """Why a parsed line is no JSON-RPC 2.0 message ACP takes, with the id to answer
    under (None when it has no usable one); None when it is fine."""
    if isinstance(message, list):
        return None, "batches are not part of ACP: send one message per line"
    if not isinstance(message, dict):
        return None, "a message is a JSON object"
    id_ = message.get("id")
    answer_id = id_ if _valid_id(id_) else None
    if message.get("jsonrpc") != "2.0":
        return answer_id, 'jsonrpc must be "2.0"'
    if not _valid_id(id_):
        return None, "id must be a string, an integer or null"
    if "method" in message:
        if not isinstance(message["method"], str):
            return answer_id, "method must be a string"
        params = message.get("params")
        if params is not None and not isinstance(params, (dict, list)):
            return answer_id, "params must be an object"
        return None
    if "id" in message and ("result" in message or "error" in message):
        return None  # a response to one of our requests
    return answer_id, "neither a request, a notification nor a response"


class CheckedTransport:
    """The SDK's message ``Transport`` over newline-delimited JSON, answering every
    frame it cannot pass on (see the module doc) instead of dropping or passing it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._lock = asyncio.Lock()

    async def send(self, message: dict[str, Any]) -> None:
        """Write one message as one line (in call order)."""
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode("utf-8")
        async with self._lock:
            self._writer.write(data)
            await self._writer.drain()

    async def receive(self) -> dict[str, Any] | None:
        """The next well-formed message; None at the end of input."""
        while True:
            line = await self._line()
            if line is None:
                return None
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError as exc:  # UnicodeDecodeError included
                await self.send(_error(None, PARSE_ERROR, "Parse error", str(exc)))
                continue
            problem = frame_problem(message)
            if problem is None:
                return dict(message)
            id_, details = problem
            log.info("bad frame: %s", details)
            await self.send(_error(id_, INVALID_REQUEST, "Invalid request", details))

    async def _line(self) -> bytes | None:
        """One line (b"" for an over-long one, answered here), None at the end."""
        try:
            return await self._reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            return exc.partial or None
        except asyncio.LimitOverrunError:
            while True:  # skip to the end of the line
                try:
                    await self._reader.readuntil(b"\n")
                    break
                except asyncio.LimitOverrunError as more:
                    await self._reader.readexactly(more.consumed)
                except asyncio.IncompleteReadError:
                    break
            details = f"a message is at most {MAX_FRAME_BYTES} bytes"
            await self.send(_error(None, INVALID_REQUEST, "Invalid request", details))
            return b""

    async def close(self) -> None:
        """Close the output."""
        self._writer.close()


def protocol_stdout() -> int:
    """A private copy of fd 1 for the protocol; fd 1 and ``sys.stdout`` then write to
    stderr, so nothing else the process prints can corrupt the protocol. Returns the
    copy's descriptor."""
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return fd


async def _streams(in_fd: int, out_fd: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_FRAME_BYTES)
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(in_fd, "rb", buffering=0)
    )
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(out_fd, "wb", buffering=0)
    )
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    return reader, writer


async def serve_stdio(server: Any, *, in_fd: int = 0, out_fd: int | None = None) -> None:
    """Serve ``server`` (an ``acp.Agent``) on ``in_fd``/``out_fd`` until the input
    ends (the editor closed it or exited). ``out_fd`` defaults to
    :func:`protocol_stdout`'s copy of fd 1."""
    if out_fd is None:
        out_fd = protocol_stdout()
    reader, writer = await _streams(in_fd, out_fd)
    transport = CheckedTransport(reader, writer)
    # use_unstable_protocol: the Python SDK still files session/resume and session/close
    # as unstable (the TypeScript SDK's v1 has them stable); without it they are -32601.
    # listening=False: listen() below is the one receive loop.
    conn = AgentSideConnection(server, transport, listening=False, use_unstable_protocol=True)
    try:
        await conn.listen()
    finally:
        await conn.close()
