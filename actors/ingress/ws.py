"""The ``cf_agent_*`` WebSocket protocol at ``/agents/{agent}/{name}`` (seed 000, and
Cloudflare's ``agents`` package).

Work in progress: routes are added by :func:`add_websocket_routes`."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI


def add_websocket_routes(app: FastAPI, agents: Any, authenticator: Any, config: Any) -> None:
    """Add the WebSocket route(s) to ``app``."""
