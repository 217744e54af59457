"""``search_history``: a model tool over the agent's own stored messages.

Give it to an agent in ``get_tools``::

    def get_tools(self):
        return {"search_history": search_history_tool(self)}

The model then finds what it said or was told in any session of the agent, including
what a compaction took out of its context, by words: ranked hits with the session,
the message id, the role and a snippet. The search is the agent's own
(``Think.search``, i.e. ``SessionStore.search_messages``): what was rewound away or
deleted is never found.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import ConfigDict, Field
from thinkray.runtime.tools.base import ModelTool, ToolContext, tool_from_model
from thinkray.runtime.typed_model import TypedModel
from thinkray.storage.types import SearchHit

__all__ = ["SearchHistoryInput", "search_history_tool"]

MAX_RESULTS = 20  # a tool result the model reads: a few kilobytes at most

DESCRIPTION = (
    "Search the stored messages of every conversation you have had (this one included, "
    "and what was summarized out of your context) by words. Returns the best matches "
    "first, each with its session_id, message_id, role and a snippet of the text. "
    "Use it to recall something said earlier that you no longer see."
)


class SearchHistoryInput(TypedModel):
    """The words to look for, how many hits, and optionally one session."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=1000, description="Words to look for (any order).")
    limit: int = Field(default=5, ge=1, le=MAX_RESULTS, description="Most hits to return.")
    session_id: str | None = Field(
        default=None,
        description="Only this session (omit to search every session; 'current' for this one).",
    )


class _Searcher(Protocol):
    def search(
        self, query: str, limit: int = 10, session_id: str | None = None
    ) -> list[SearchHit]: ...


def search_history_tool(agent: _Searcher, *, name: str = "search_history") -> ModelTool:
    """The ``search_history`` tool over ``agent.search`` (a ``Think``). Bad input (an
    empty query, no word in it, an unknown session) goes back to the model as the
    tool's error, with the reason."""

    async def run(input: SearchHistoryInput, ctx: ToolContext) -> dict[str, Any]:
        session_id = input.session_id
        if session_id == "current":
            session_id = ctx.session_id
        hits = agent.search(input.query, limit=input.limit, session_id=session_id)
        return {
            "query": input.query,
            "hits": [
                {
                    "session_id": h.session_id,
                    "message_id": h.message_id,
                    "role": h.role,
                    "snippet": h.snippet,
                    "score": round(h.score, 3),
                }
                for h in hits
            ],
        }

    return tool_from_model(name, SearchHistoryInput, run, DESCRIPTION)
