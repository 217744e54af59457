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

from thinkray.runtime.abort import AbortController, AbortError, AbortSignal
from thinkray.runtime.agents.agent import Agent
from thinkray.runtime.agents.context import AgentContext
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
from thinkray.runtime.remote import idempotent, remote
from thinkray.runtime.status import SessionBusyError, SessionStatus
from thinkray.runtime.tools.base import Tool, ToolContext, tool, tool_from_model
from thinkray.runtime.usage import Usage

__all__ = [
    "AbortController",
    "AbortError",
    "AbortSignal",
    "Agent",
    "AgentContext",
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
