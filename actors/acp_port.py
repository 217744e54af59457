"""``thinkray acp --ray``: the ACP server in front of an agent of a running namespace.

The agent lives in its session actor (it hibernates and wakes as any other); this
process is only the editor's stdio end. Approvals asked here are answered through the
same ``answer_approval`` the HTTP and WebSocket paths call, and any of them may answer
an ask of the agent (the first answer wins).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

from acp.schema import ToolKind
from thinkray.runtime.acp.host import package_version
from thinkray.runtime.acp.server import AcpServer
from thinkray.runtime.acp.stdio import serve_stdio
from thinkray.runtime.chunks import UIChunk
from thinkray.storage.types import SessionInfo

__all__ = ["RayAgentPort", "run_ray"]


class RayAgentPort:
    """The :class:`~thinkray.runtime.acp.server.AgentPort` of an agent behind a namespace
    handle (``agent_cls``: the namespace's class, for its ``acp_tool_kinds``)."""

    def __init__(self, handle: Any, agent_cls: type | None = None) -> None:
        self.handle = handle
        self.agent_cls = agent_cls

    async def create_session(self, name: str, metadata: dict[str, Any]) -> SessionInfo:
        """``Think.create_session`` on the actor."""
        info: SessionInfo = await self.handle.create_session.remote(name, metadata=metadata)
        return info

    async def get_session(self, session_id: str) -> SessionInfo:
        """``Think.get_session`` on the actor."""
        info: SessionInfo = await self.handle.get_session.remote(session_id)
        return info

    async def list_sessions(self) -> list[SessionInfo]:
        """``Think.get_sessions`` on the actor."""
        return list(await self.handle.get_sessions.remote())

    async def history(self, session_id: str) -> list[dict[str, Any]]:
        """``Think.get_history`` on the actor."""
        return list(await self.handle.get_history.remote(session_id))

    async def turn(self, session_id: str, message: dict[str, Any]) -> AsyncIterator[UIChunk]:
        """``Think.stream_chat`` through the handle (its stream)."""
        async for chunk in self.handle.stream_chat.remote(message, session_id=session_id):
            yield chunk

    async def abort(self, session_id: str) -> bool:
        """``Think.abort`` on the actor."""
        return bool(
            await self.handle.abort.remote(session_id, reason="cancelled by the ACP client")
        )

    async def answer_approval(
        self, approval_id: str, decision: str, answered_by: str | None
    ) -> dict[str, Any]:
        """``Agent.answer_approval`` on the actor."""
        result: dict[str, Any] = await self.handle.answer_approval.remote(
            approval_id, decision, answered_by
        )
        return result

    def tool_kinds(self) -> dict[str, ToolKind]:
        """The class's ``acp_tool_kinds``, if any."""
        return dict(getattr(self.agent_cls, "acp_tool_kinds", None) or {})


async def run_ray(
    namespace: str,
    name: str,
    *,
    agent_cls: type | None,
    principal: str | None,
    out_fd: int | None = None,
) -> None:
    """Join the Ray cluster (``$RAY_ADDRESS``, else the one running on this machine),
    attach to ``namespace`` and serve agent ``name`` over ACP on stdio.

    Raises:
        ValueError: no namespace of that name runs in the cluster.
    """
    import ray
    from thinkray.actors.namespace import AgentNamespace

    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS") or "auto", log_to_driver=False)
    try:
        ns = AgentNamespace.connect(namespace)
    except ValueError as exc:
        raise ValueError(f"no namespace {namespace!r} runs in this Ray cluster ({exc})") from exc
    port = RayAgentPort(ns.get(name), agent_cls)
    server = AcpServer(port, principal=principal, version=package_version())
    serving = asyncio.ensure_future(serve_stdio(server, out_fd=out_fd))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, serving.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await serving
