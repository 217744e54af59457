"""``thinkray acp``: a thinkray agent as an Agent Client Protocol server on stdio, for
editors that speak ACP (Zed and others) to spawn.

By default the agent runs in this process (no Ray: what an editor spawning a child
needs), in its DuckDB file under the storage root (:mod:`thinkray.runtime.acp.host`).
With ``--ray`` it is agent NAME of a namespace already running in a Ray cluster
(:mod:`thinkray.actors.acp_port`). Nothing but the protocol goes to stdout; logs go to
stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import logging
import os
import sys
from typing import Any

DEFAULT_AGENT = "thinkray.actors.demo:DemoAgent"


def _principal(given: str | None) -> str:
    if given:
        return given
    try:
        return getpass.getuser()
    except Exception:  # no login name (a container without passwd entry)
        return f"uid-{os.getuid()}"


def run(args: argparse.Namespace) -> int:
    """Serve until the editor closes stdin. Returns 2 for bad options, an agent file
    another process holds or a namespace that does not run (the reason on stderr)."""
    from thinkray.actors.ingress.config import load_object
    from thinkray.runtime.acp.host import LocalHost, run_local
    from thinkray.runtime.acp.stdio import protocol_stdout
    from thinkray.storage.errors import DatabaseLockedError, StorageError
    from thinkray.storage.layout import default_storage_root, normalize_root

    # First of all: whatever the agent's module, Ray or DuckDB print from now on goes to
    # stderr, never into the protocol.
    out_fd = protocol_stdout()
    logging.basicConfig(
        stream=sys.stderr, level=args.log_level.upper(), format="thinkray acp: %(message)s"
    )
    try:
        kwargs: Any = json.loads(args.agent_kwargs) if args.agent_kwargs else None
        if kwargs is not None and not isinstance(kwargs, dict):
            raise ValueError("--agent-kwargs must be a JSON object")
        agent_cls = load_object(args.agent)
        if args.ray:
            from thinkray.actors.acp_port import run_ray

            principal = _principal(args.principal)
            asyncio.run(
                run_ray(
                    args.namespace,
                    args.name,
                    agent_cls=agent_cls,
                    principal=principal,
                    out_fd=out_fd,
                )
            )
            return 0
        root = (
            args.storage_root
            or os.environ.get("THINKRAY_STORAGE_ROOT")
            or str(default_storage_root("acp"))
        )
        host = LocalHost(
            agent_cls=agent_cls,
            storage_root=normalize_root(root),
            namespace=args.namespace,
            name=args.name,
            principal=_principal(args.principal),
            agent_kwargs=kwargs,
        )
        asyncio.run(run_local(host, out_fd=out_fd))
    except DatabaseLockedError as exc:
        print(
            f"thinkray acp: {exc}. Another thinkray acp (or a namespace) serves agent "
            f"{args.name!r}: give this one its own --name (each editor window its own "
            "agent), or attach to the namespace with --ray",
            file=sys.stderr,
        )
        return 2
    except (ValueError, StorageError) as exc:
        print(f"thinkray acp: {exc}", file=sys.stderr)
        return 2
    return 0


def add_command(sub: Any) -> None:
    """Register ``thinkray acp`` on the CLI's subparsers."""
    p = sub.add_parser(
        "acp",
        help="serve an agent over the Agent Client Protocol on stdio (for editors)",
        description=__doc__,
    )
    p.add_argument(
        "--agent",
        default=DEFAULT_AGENT,
        metavar="MODULE:CLASS",
        help=f"the agent class (default {DEFAULT_AGENT})",
    )
    p.add_argument("--agent-kwargs", metavar="JSON", help="keyword arguments for its constructor")
    p.add_argument(
        "--storage-root",
        help="where agents' files live (default: $THINKRAY_STORAGE_ROOT, else "
        "~/.local/share/thinkray/acp)",
    )
    p.add_argument("--namespace", default="acp", help="the agent's namespace (default acp)")
    p.add_argument(
        "--name",
        default="acp",
        help="the agent's name: its file is ROOT/NAMESPACE/NAME.duckdb, holding every "
        "ACP session of it (default acp)",
    )
    p.add_argument(
        "--principal",
        help="who answers tool approvals here, as recorded (default: the login name)",
    )
    p.add_argument(
        "--ray",
        action="store_true",
        help="drive agent NAME of the running namespace NAMESPACE through Ray "
        "($RAY_ADDRESS, else the local cluster) instead of in this process",
    )
    p.add_argument("--log-level", default="warning", help="stderr log level (default warning)")
    p.set_defaults(func=run)
