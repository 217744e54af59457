"""thinkray runtime: an agent turn without Ray (messages, chunks, models, loop, Think)."""

from runtime.abort import AbortController, AbortError, AbortSignal
from runtime.messages import InvalidMessageError, UIMessage, new_id, parse_message
from runtime.model import Model, ModelError, ModelRequest
from runtime.status import SessionBusyError, SessionStatus
from runtime.think import ChatOptions, ChatResult, StreamCallback, Think
from runtime.tools import Tool, ToolContext, tool, tool_from_model
from runtime.usage import Usage

__all__ = [
    "AbortController",
    "AbortError",
    "AbortSignal",
    "ChatOptions",
    "ChatResult",
    "InvalidMessageError",
    "Model",
    "ModelError",
    "ModelRequest",
    "SessionBusyError",
    "SessionStatus",
    "StreamCallback",
    "Think",
    "Tool",
    "ToolContext",
    "UIMessage",
    "Usage",
    "new_id",
    "parse_message",
    "tool",
    "tool_from_model",
]
