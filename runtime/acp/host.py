"""``thinkray acp`` in-process: the agent runs in the editor's child process, no Ray.

The agent's file is where a namespace keeps it (``<root>/<namespace>/<name>.duckdb``),
so ``thinkray sessions ls`` and a later ``thinkray acp`` (or a namespace, once this
process has exited) see the same sessions. DuckDB lets one process hold a file: a
second ``thinkray acp`` on the same agent is refused at start with
:class:`~thinkray.storage.errors.DatabaseLockedError` (give it another ``--name``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import signal
from dataclasses import dataclass
from typing import Any

from thinkray.runtime.acp.server import AcpServer, LocalAgentPort
from thinkray.runtime.acp.stdio import serve_stdio
from thinkray.runtime.agents.context import AgentContext, constructing

__all__ = ["LocalHost", "open_agent", "package_version", "run_local"]


@dataclass(frozen=True)
class LocalHost:
    """Where the agent lives and who answers its approvals."""

    agent_cls: type
    storage_root: str
    namespace: str = "acp"
    name: str = "acp"
    principal: str | None = None
    agent_kwargs: dict[str, Any] | None = None


def package_version() -> str:
    """thinkray's installed version ("0" when not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("thinkray")
    except PackageNotFoundError:
        return "0"


def open_agent(host: LocalHost) -> Any:
    """Open the agent's file (created on first use) and construct the agent, as a
    session actor binds one (the constructor is the wake path: orphaned runs and tool
    calls of a process that died are finalized here).

    Raises:
        StorageRootError: the root is not a writable folder.
        DatabaseLockedError: another process holds the agent's file.
    """
    from thinkray.storage.layout import ensure_root, is_remote_root, session_path
    from thinkray.storage.session_store import DuckDBSessionStore

    if is_remote_root(host.storage_root):
        raise ValueError(
            "thinkray acp runs the agent in its own process on a local storage root; "
            f"{host.storage_root!r} is an object-store URI"
        )
    ensure_root(host.storage_root, host.namespace)
    store = DuckDBSessionStore(session_path(host.storage_root, host.namespace, host.name))
    context = AgentContext(name=host.name, namespace=host.namespace, storage_root=host.storage_root)
    try:
        with constructing(context):
            return host.agent_cls(store, **(host.agent_kwargs or {}))
    except BaseException:
        store.close()
        raise


async def run_local(host: LocalHost, *, in_fd: int = 0, out_fd: int | None = None) -> None:
    """Serve the agent over ACP on stdio until the input ends or SIGTERM/SIGINT; then
    close it as hibernation does (fibers stop unfinished, the file is closed)."""
    agent = open_agent(host)
    try:
        wake = getattr(agent, "on_wake", None)
        if wake is not None and inspect.isawaitable(result := wake()):
            await result
        server = AcpServer(
            LocalAgentPort(agent), principal=host.principal, version=package_version()
        )
        serving = asyncio.ensure_future(serve_stdio(server, in_fd=in_fd, out_fd=out_fd))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, serving.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await serving
    finally:
        with contextlib.suppress(Exception):
            close = getattr(agent, "aclose", None)
            if close is not None:
                await close()
        agent.close()
