"""MCP benchmark (issue 12, item 6): an MCP tool call through the orchestrator's bridge
actor (what a sub-agent's ``mcp__<server>__<tool>`` does) beside the same call made
directly by an MCP client in this process, which is the server's own time plus its
transport. Prints p50/p95 of both and what the bridge adds. Needs ``.[mcp]``.

python tests/bench/bench_mcp.py [--calls N] [--work SECONDS]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import line, pct  # noqa: E402

SERVER = str(REPO / "tests" / "mcp_server.py")


async def direct(calls: int, tool: str, args: dict) -> list[float]:
    from thinkray.runtime.tools.mcp import McpServerConfig, McpServerConnection

    conn = McpServerConnection(
        McpServerConfig.parse("direct", {"command": sys.executable, "args": [SERVER]})
    )
    try:
        await conn.connect()
        for _ in range(20):
            await conn.call_tool(tool, args)
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            await conn.call_tool(tool, args)
            times.append((time.perf_counter() - t0) * 1000)
        return times
    finally:
        await conn.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--work", type=float, default=0.0, help="server-side sleep per call")
    opts = parser.parse_args()
    import ray
    from thinkray.actors.bridge import BridgeClient, bridge_name
    from thinkray.actors.namespace import AgentNamespace
    from thinkray.actors.orchestrator import Orchestrator
    from thinkray.runtime.tools.mcp import raise_for_envelope

    tool, args = ("hang", {"seconds": opts.work}) if opts.work else ("echo", {"text": "x" * 64})
    from tests.bench._ray import start_local_ray

    start_local_ray()
    root = tempfile.mkdtemp(prefix="thinkray-bench-mcp-")
    ns = AgentNamespace("bm", Orchestrator, storage_root=root, pool_size=1, idle_timeout=None)
    bridge = None
    try:
        boss = ns.get("boss")
        status = boss.add_mcp_server.remote(
            "bench", {"command": sys.executable, "args": [SERVER]}
        ).result()
        assert status["connected"], status
        name = bridge_name("bm", "boss")
        bridge = ray.get_actor(name, namespace="thinkray")
        token = ray.get(bridge.grant.remote("bench-client", "none", {"bench": None}))
        client = BridgeClient(name, token, "none")
        for _ in range(20):
            raise_for_envelope(ray.get(client.call_mcp("bench", tool, args)))
        bridged = []
        for _ in range(opts.calls):
            t0 = time.perf_counter()
            raise_for_envelope(ray.get(client.call_mcp("bench", tool, args)))
            bridged.append((time.perf_counter() - t0) * 1000)
        own = asyncio.run(direct(opts.calls, tool, args))
        added = statistics.median(bridged) - statistics.median(own)
        print(f"thinkray MCP benchmark ({opts.calls} calls of {tool!r}, stdio server)")
        line(
            "direct MCP client p50 / p95 (server's own time)",
            f"{statistics.median(own):.2f} / {pct(own, 0.95):.2f} ms",
        )
        line(
            "through the bridge actor p50 / p95",
            f"{statistics.median(bridged):.2f} / {pct(bridged, 0.95):.2f} ms",
        )
        line("bridge adds (p50)", f"{added:.2f} ms", "<= 10 ms", added <= 10)
        return 0 if added <= 10 else 1
    finally:
        if bridge is not None:
            with contextlib.suppress(Exception):
                ray.get(bridge.close.remote(), timeout=30)
        with contextlib.suppress(Exception):
            ns.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
