"""A small MCP server for the MCP client's tests and benchmark, built on the `mcp`
package's FastMCP (``MCPServer`` since mcp 2).

    python tests/mcp_server.py                 # stdio
    python tests/mcp_server.py --http PORT     # streamable HTTP on 127.0.0.1:PORT/mcp

Tools: ``add`` (a sum), ``echo`` (text back), ``fail`` (an ``isError`` result),
``hang`` (sleeps ``seconds``), ``pid`` (the server's process id, so a test can kill
it), ``garbage`` (writes a line that is not JSON-RPC on stdout, then never answers).
"""

from __future__ import annotations

import asyncio
import os
import sys

try:  # mcp >= 2
    from mcp.server.mcpserver import MCPServer as FastMCP
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP  # type: ignore[no-redef]
    from mcp.server.fastmcp.exceptions import ToolError  # type: ignore[no-redef]

server = FastMCP("thinkray-test")
# The protocol channel, kept before the SDK points fd 1 away from it (the garbage tool
# writes here)
_WIRE = os.dup(1)


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def fail(reason: str = "it broke") -> str:
    """Always fails (the server reports an isError result)."""
    raise ToolError(reason)


@server.tool()
async def hang(seconds: float = 3600.0) -> str:
    """Sleep ``seconds`` before answering."""
    await asyncio.sleep(seconds)
    return "woke up"


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool()
async def garbage() -> str:
    """Write a line that is not JSON-RPC on the protocol channel, then never answer."""
    os.write(_WIRE, b"this is not JSON-RPC {{{\n")
    await asyncio.sleep(3600)
    return "unreachable"


def main(argv: list[str]) -> None:
    """Serve over stdio, or over streamable HTTP with ``--http PORT``."""
    if len(argv) >= 2 and argv[0] == "--http":
        port = int(argv[1])
        try:
            server.run("streamable-http", host="127.0.0.1", port=port)  # type: ignore[call-overload]
        except TypeError:  # mcp 1.x: host and port are settings
            server.settings.host = "127.0.0.1"  # type: ignore[attr-defined]
            server.settings.port = port  # type: ignore[attr-defined]
            server.run("streamable-http")
    else:
        server.run()


if __name__ == "__main__":
    main(sys.argv[1:])
