"""thinkray runtime: an agent turn without Ray (messages, chunks, models, loop, Think)."""

from runtime.abort import AbortController, AbortError, AbortSignal
from runtime.agent import Agent
from runtime.messages import InvalidMessageError, UIMessage, new_id, parse_message
from runtime.model import Model, ModelError, ModelRequest
from runtime.persistent import PersistentAgent
from runtime.status import SessionBusyError, SessionStatus
from runtime.think import ChatOptions, ChatResult, StreamCallback, Think
from runtime.tools import Tool, ToolContext, tool, tool_from_model
from runtime.usage import Usage
from runtime.worker import WorkerAgent

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
