"""thinkray actors: the Ray layer (session actors, namespace, orchestrator, CLI).

The only package that imports ray. A user writes::

    from thinkray.actors import AgentNamespace

    ns = AgentNamespace("chat", MyAgent, storage_root="/data/thinkray")
    result = ns.get("user-42").chat.remote("hi").result()
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from thinkray.actors.bridge import BridgeAccessError, BridgeClient
    from thinkray.actors.errors import (
        CallInterruptedError,
        RemoteCallError,
        RunInterruptedError,
        SyncInEventLoopError,
        ThinkrayError,
        UserError,
        WakeError,
    )
    from thinkray.actors.namespace import AgentHandle, AgentNamespace, Handle, HandleMethod
    from thinkray.actors.orchestrator import Orchestrator, SubAgent, TaskInfo
    from thinkray.actors.relay import AbortReceiver, NotBoundError
    from thinkray.actors.response import AgentResponse, AgentResponseStream

# Loaded on first use: a session actor imports thinkray.actors.session_actor, which
# runs this file, and needs none of the namespace, orchestrator or bridge.
_LAZY = {
    "AbortReceiver": "thinkray.actors.relay",
    "AgentHandle": "thinkray.actors.namespace",
    "AgentNamespace": "thinkray.actors.namespace",
    "AgentResponse": "thinkray.actors.response",
    "AgentResponseStream": "thinkray.actors.response",
    "BridgeAccessError": "thinkray.actors.bridge",
    "BridgeClient": "thinkray.actors.bridge",
    "CallInterruptedError": "thinkray.actors.errors",
    "Handle": "thinkray.actors.namespace",
    "HandleMethod": "thinkray.actors.namespace",
    "NotBoundError": "thinkray.actors.relay",
    "Orchestrator": "thinkray.actors.orchestrator",
    "RemoteCallError": "thinkray.actors.errors",
    "RunInterruptedError": "thinkray.actors.errors",
    "SubAgent": "thinkray.actors.orchestrator",
    "SyncInEventLoopError": "thinkray.actors.errors",
    "TaskInfo": "thinkray.actors.orchestrator",
    "ThinkrayError": "thinkray.actors.errors",
    "UserError": "thinkray.actors.errors",
    "WakeError": "thinkray.actors.errors",
}

__all__ = [
    "AbortReceiver",
    "AgentHandle",
    "AgentNamespace",
    "AgentResponse",
    "AgentResponseStream",
    "BridgeAccessError",
    "BridgeClient",
    "CallInterruptedError",
    "Handle",
    "HandleMethod",
    "NotBoundError",
    "Orchestrator",
    "RemoteCallError",
    "RunInterruptedError",
    "SubAgent",
    "SyncInEventLoopError",
    "TaskInfo",
    "ThinkrayError",
    "UserError",
    "WakeError",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'thinkray.actors' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
