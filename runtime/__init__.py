"""thinkray runtime: an agent turn without Ray (messages, chunks, models, loop, agents).

The public surface for building agents::

    from thinkray.runtime import Agent, tool, remote
    from thinkray.runtime.models.testing import ScriptedModel, reply

Sub-packages show the architecture: ``agents`` (Think and its parts: sessions, turns,
runs; Agent, worker and persistent agents), ``capabilities`` (compaction, permissions,
prompt assembly, attached by composition), ``durable`` (fibers, schedules), ``models``
(the Model seam, Anthropic, test models), ``tools`` (tool declaration, workspace,
sandbox, extensions) and ``turn`` (the agentic loop, recorder, run streams).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# Eager: ``remote`` is also the name of a submodule, whose import would otherwise leave
# the module where the decorator belongs.
from thinkray.runtime.remote import idempotent, remote

if TYPE_CHECKING:
    from thinkray.runtime.abort import AbortController, AbortError, AbortSignal
    from thinkray.runtime.agents.agent import Agent
    from thinkray.runtime.agents.context import AgentContext
    from thinkray.runtime.agents.midturn import BUSY_POLICIES, BusyPolicy
    from thinkray.runtime.agents.persistent import PersistentAgent
    from thinkray.runtime.agents.runs import ChatOptions, ChatResult, RunState, StreamCallback
    from thinkray.runtime.agents.sessions import RewindResult, UnrewindResult
    from thinkray.runtime.agents.think import Think
    from thinkray.runtime.agents.worker import WorkerAgent
    from thinkray.runtime.capabilities.compaction import CompactionConfig, CompactionResult
    from thinkray.runtime.capabilities.permissions import PermissionRule
    from thinkray.runtime.chunks import UIChunk, is_data_chunk
    from thinkray.runtime.errors import ThinkrayError, UserError
    from thinkray.runtime.messages import InvalidMessageError, UIMessage, new_id, parse_message
    from thinkray.runtime.models.base import Model, ModelError, ModelRequest
    from thinkray.runtime.status import SessionBusyError, SessionStatus
    from thinkray.runtime.tools.base import Tool, ToolContext, tool, tool_from_model
    from thinkray.runtime.usage import Usage

# Loaded on first use: a session actor imports only the parts of the runtime that Think
# needs (not the worker and persistent agents, compaction or tool helpers it never uses).
_LAZY = {
    "AbortController": "thinkray.runtime.abort",
    "AbortError": "thinkray.runtime.abort",
    "AbortSignal": "thinkray.runtime.abort",
    "Agent": "thinkray.runtime.agents.agent",
    "AgentContext": "thinkray.runtime.agents.context",
    "BUSY_POLICIES": "thinkray.runtime.agents.midturn",
    "BusyPolicy": "thinkray.runtime.agents.midturn",
    "ChatOptions": "thinkray.runtime.agents.runs",
    "ChatResult": "thinkray.runtime.agents.runs",
    "CompactionConfig": "thinkray.runtime.capabilities.compaction",
    "CompactionResult": "thinkray.runtime.capabilities.compaction",
    "InvalidMessageError": "thinkray.runtime.messages",
    "Model": "thinkray.runtime.models.base",
    "ModelError": "thinkray.runtime.models.base",
    "ModelRequest": "thinkray.runtime.models.base",
    "PermissionRule": "thinkray.runtime.capabilities.permissions",
    "PersistentAgent": "thinkray.runtime.agents.persistent",
    "RewindResult": "thinkray.runtime.agents.sessions",
    "RunState": "thinkray.runtime.agents.runs",
    "SessionBusyError": "thinkray.runtime.status",
    "SessionStatus": "thinkray.runtime.status",
    "StreamCallback": "thinkray.runtime.agents.runs",
    "Think": "thinkray.runtime.agents.think",
    "ThinkrayError": "thinkray.runtime.errors",
    "Tool": "thinkray.runtime.tools.base",
    "ToolContext": "thinkray.runtime.tools.base",
    "UIChunk": "thinkray.runtime.chunks",
    "UIMessage": "thinkray.runtime.messages",
    "UnrewindResult": "thinkray.runtime.agents.sessions",
    "Usage": "thinkray.runtime.usage",
    "UserError": "thinkray.runtime.errors",
    "WorkerAgent": "thinkray.runtime.agents.worker",
    "is_data_chunk": "thinkray.runtime.chunks",
    "new_id": "thinkray.runtime.messages",
    "parse_message": "thinkray.runtime.messages",
    "tool": "thinkray.runtime.tools.base",
    "tool_from_model": "thinkray.runtime.tools.base",
}

__all__ = [
    "AbortController",
    "AbortError",
    "AbortSignal",
    "Agent",
    "AgentContext",
    "BUSY_POLICIES",
    "BusyPolicy",
    "ChatOptions",
    "ChatResult",
    "CompactionConfig",
    "CompactionResult",
    "InvalidMessageError",
    "Model",
    "ModelError",
    "ModelRequest",
    "PermissionRule",
    "PersistentAgent",
    "RewindResult",
    "RunState",
    "SessionBusyError",
    "SessionStatus",
    "StreamCallback",
    "Think",
    "ThinkrayError",
    "Tool",
    "ToolContext",
    "UIChunk",
    "UIMessage",
    "UnrewindResult",
    "Usage",
    "UserError",
    "WorkerAgent",
    "idempotent",
    "is_data_chunk",
    "new_id",
    "parse_message",
    "remote",
    "tool",
    "tool_from_model",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'thinkray.runtime' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
