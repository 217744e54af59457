"""thinkray runtime: an agent turn without Ray (messages, chunks, models, loop, Think)."""

from thinkray.runtime.abort import AbortController, AbortError, AbortSignal
from thinkray.runtime.agents.agent import Agent
from thinkray.runtime.agents.persistent import PersistentAgent
from thinkray.runtime.agents.think import ChatOptions, ChatResult, StreamCallback, Think
from thinkray.runtime.agents.worker import WorkerAgent
from thinkray.runtime.messages import InvalidMessageError, UIMessage, new_id, parse_message
from thinkray.runtime.models.base import Model, ModelError, ModelRequest
from thinkray.runtime.status import SessionBusyError, SessionStatus
from thinkray.runtime.tools.base import Tool, ToolContext, tool, tool_from_model
from thinkray.runtime.usage import Usage

__all__ = [
    "AbortController",
    "AbortError",
    "AbortSignal",
    "Agent",
    "ChatOptions",
    "ChatResult",
    "InvalidMessageError",
    "Model",
    "ModelError",
    "ModelRequest",
    "PersistentAgent",
    "SessionBusyError",
    "SessionStatus",
    "StreamCallback",
    "Think",
    "Tool",
    "ToolContext",
    "UIMessage",
    "Usage",
    "WorkerAgent",
    "new_id",
    "parse_message",
    "tool",
    "tool_from_model",
]
