"""thinkray actors: the Ray layer (session actors, namespace, orchestrator, CLI).

The only package that imports ray. A user writes::

    from thinkray.actors import AgentNamespace

    ns = AgentNamespace("chat", MyAgent, storage_root="/data/thinkray")
    result = ns.get("user-42").chat.remote("hi").result()
"""

from thinkray.actors.bridge import BridgeAccessError, BridgeClient
from thinkray.actors.errors import (
    CallInterruptedError,
    RemoteCallError,
    RunInterruptedError,
    SyncInEventLoopError,
    ThinkrayError,
    UserError,
)
from thinkray.actors.namespace import AgentHandle, AgentNamespace, Handle, HandleMethod
from thinkray.actors.orchestrator import Orchestrator, SubAgent, TaskInfo
from thinkray.actors.relay import AbortReceiver, NotBoundError
from thinkray.actors.response import AgentResponse, AgentResponseStream

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
]
