"""What a capability needs from the agent it is attached to: small typed Protocols.

Capabilities (compaction, permissions, prompt assembly) are objects an agent composes,
not mixins: each gets its host at construction and reaches it only through these
Protocols. :class:`~thinkray.runtime.agents.agent.Agent` satisfies all three.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from thinkray.runtime.agents.runs import RunState
    from thinkray.runtime.agents.sessions import SessionManager
    from thinkray.runtime.agents.turns import TurnRunner
    from thinkray.runtime.capabilities.compaction import CompactionConfig
    from thinkray.runtime.capabilities.permissions import Action, PermissionRule
    from thinkray.runtime.models.base import Model
    from thinkray.runtime.status import StatusBoard
    from thinkray.runtime.tools.durable import ToolCallLedger
    from thinkray.storage.protocols import SessionStore

__all__ = ["AgentHost", "CompactionHost", "PermissionHost", "PromptHost"]


class AgentHost(Protocol):
    """The part of an agent every capability may use.

    ``store`` is the agent's session store; ``sessions.resolve(None)`` names the
    current session; ``turns.persist_cache`` must be told about messages a capability
    rewrites outside a turn. ``reserve_session`` holds a session busy (raises
    SessionBusyError if a run holds it); ``own_turn`` is the caller's own turn before its
    history is fixed, else None."""

    @property
    def store(self) -> SessionStore:
        """The agent's session store."""
        ...

    @property
    def status(self) -> StatusBoard:
        """The agent's session status board."""
        ...

    @property
    def sessions(self) -> SessionManager:
        """The agent's sessions (``resolve(None)``: the current one)."""
        ...

    @property
    def turns(self) -> TurnRunner:
        """The agent's turn runner (runs in flight, persist cache)."""
        ...

    @property
    def current_session_id(self) -> str | None:
        """The current session's id, or None."""
        ...

    def get_model(self) -> Model:
        """The agent's default model."""
        ...

    def reserve_session(
        self, session_id: str, operation: str = ...
    ) -> AbstractContextManager[None]:
        """Hold a session busy for a non-turn operation; raises SessionBusyError if held."""
        ...

    def own_turn(self, session_id: str) -> RunState | None:
        """The caller's own turn on the session, before its history is fixed; else None."""
        ...

    def active_run(self, session_id: str | None = ...) -> str | None:
        """The run id in flight on the session, or None."""
        ...


class CompactionHost(AgentHost, Protocol):
    """An agent that compacts: its default config, summarizer and per-turn model."""

    @property
    def compaction_config(self) -> CompactionConfig:
        """The agent's default compaction config."""
        ...

    def get_summary_model(self, config: CompactionConfig) -> Model:
        """The model that writes summaries under ``config``."""
        ...

    def model_for_turn(self, session_id: str, message: dict[str, Any] | None) -> Model:
        """The model the coming turn of the session will use."""
        ...


class PermissionHost(AgentHost, Protocol):
    """An agent with permission scopes: its manifest rules and ask settings."""

    @property
    def permission_rules(self) -> Sequence[PermissionRule | dict[str, Any]]:
        """The manifest scope's rules."""
        ...

    @property
    def permission_default(self) -> Action:
        """The action when no rule matches."""
        ...

    @property
    def approval_timeout(self) -> float | None:
        """Seconds an ask waits before the call is denied (None: no limit)."""
        ...

    @property
    def approval_history_size(self) -> int:
        """How many settled approvals are kept."""
        ...

    @property
    def tool_calls(self) -> ToolCallLedger:
        """The durable tool calls (an ask is stored as its call, ``awaiting-approval``)."""
        ...

    def may_approve(self, approval: dict[str, Any], answered_by: str | None) -> bool:
        """Whether ``answered_by`` may answer ``approval``."""
        ...


class PromptHost(AgentHost, Protocol):
    """An agent whose system prompt is assembled: the sections' sources."""

    @property
    def global_instructions(self) -> str:
        """Host-level instruction text, placed before the workspace's files."""
        ...

    @property
    def skills_dir(self) -> str:
        """The workspace folder skills are discovered in."""
        ...

    def get_workspace(self) -> Any:
        """The agent's workspace (None: none)."""
        ...

    def get_tools(self) -> Any:
        """The agent's tools by name (may be awaitable)."""
        ...

    def get_manifest_prompt(self) -> Any:
        """Section 1 of the prompt (may be awaitable)."""
        ...

    def get_working_directory(self) -> str:
        """Where the instruction-file walk ends."""
        ...

    def get_environment(self, model: Any, variant: str | None = None) -> dict[str, Any]:
        """The environment section's key/values for the turn's ``model`` and
        ``variant`` (None: the model's own)."""
        ...
