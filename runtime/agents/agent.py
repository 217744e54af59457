"""``Agent``: ``Think`` plus the session model of seed 002, by composition.

``Think`` is the chat lifecycle of seed 000 (turn, persistence, sessions, branch,
rewind, threads, per-turn model switch, fibers). ``Agent`` attaches the three
capabilities that reshape every turn, each an object working against a small host
Protocol (:mod:`thinkray.runtime.capabilities.host`):

- ``agent.compaction`` (:class:`~thinkray.runtime.capabilities.compaction.Compaction`):
  automatic compaction before a turn would overflow the model's window, manual
  compaction and tool-output pruning;
- ``agent.permissions`` (:class:`~thinkray.runtime.capabilities.permissions.Permissions`):
  manifest / session / project rules evaluated at tool-call time, with ``ask``
  answered once / for the session / always;
- ``agent.prompts`` (:class:`~thinkray.runtime.capabilities.prompt.PromptAssembly`): the
  system prompt assembled in the normative order (manifest, project instructions,
  skills, environment, tool catalog) with its SHA-256 digest on every assistant message.

Configure them with the class attributes and override points below. Subclass
``Agent`` for the full session model (the demo agent, orchestrator and sub-agents
do); subclass ``Think`` for a lean chat agent. Methods marked ``@remote`` are
reachable through an actor handle.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar

from thinkray.runtime.agents.context import AgentContext
from thinkray.runtime.agents.runs import ChatOptions
from thinkray.runtime.agents.think import Think
from thinkray.runtime.capabilities.compaction import (
    Compaction,
    CompactionConfig,
    CompactionResult,
    PruneResult,
    compaction_view,
)
from thinkray.runtime.capabilities.permissions import (
    Action,
    ApprovalDecision,
    PermissionDecision,
    PermissionRule,
    Permissions,
    ProjectRules,
    RuleLike,
    as_rule,
)
from thinkray.runtime.capabilities.prompt import SKILLS_DIR, AssembledPrompt, PromptAssembly
from thinkray.runtime.models.base import Model
from thinkray.runtime.remote import idempotent, remote
from thinkray.runtime.tools.base import Tool
from thinkray.runtime.turn.loop import ToolDenial
from thinkray.storage.protocols import SessionStore

__all__ = ["Agent"]


class Agent(Think):
    """Think with compaction, permission scopes and system prompt assembly.

    Set ``manifest_prompt`` (not ``get_system_prompt``) to keep the assembled prompt;
    overriding ``get_system_prompt`` replaces the assembly altogether (and the
    assistant messages then carry no prompt digest)."""

    # -- compaction settings (agent.compaction) ---------------------------------------
    compaction_config: CompactionConfig = CompactionConfig()

    # -- permission settings (agent.permissions) --------------------------------------
    permission_rules: ClassVar[tuple[RuleLike, ...]] = ()  # the manifest scope, immutable
    permission_default: ClassVar[Action] = "allow"  # when no rule matches
    approval_timeout: ClassVar[float | None] = 300.0  # an unanswered ask is denied after
    approval_history_size: ClassVar[int] = 256  # settled approvals kept for get_approval

    def may_approve(self, approval: dict[str, Any], answered_by: str | None) -> bool:
        """Hook: whether ``answered_by`` may answer ``approval`` (a dict as
        ``pending_approvals`` lists them). Default: anyone who can call the agent."""
        return True

    # -- prompt settings (agent.prompts) ----------------------------------------------
    manifest_prompt: str = "You are a helpful assistant."
    global_instructions: str = ""  # host-level instructions before the workspace's files
    working_directory: str = ""  # where the instruction-file walk ends ("": the root)
    workspace_root: str = "/"  # how the root is named in the environment section
    skills_dir: str = SKILLS_DIR

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Validate the manifest when the class is defined, and freeze it.
        if "permission_rules" in cls.__dict__:
            cls.permission_rules = tuple(as_rule(r) for r in cls.__dict__["permission_rules"])

    def __init__(
        self,
        store: SessionStore | str | os.PathLike[str] | None = None,
        *,
        model: Model | None = None,
        context: AgentContext | None = None,
    ) -> None:
        super().__init__(store, model=model, context=context)
        self.compaction = Compaction(self)
        self.permissions = Permissions(self)
        self.prompts = PromptAssembly(self)

    # -- override points: compaction --------------------------------------------------

    def get_summary_model(self, config: CompactionConfig) -> Model:
        """The summarizer: ``config.summary_model`` (a model or a factory), else the
        agent's model."""
        candidate = config.summary_model
        if candidate is None:
            return self.get_model()
        if callable(candidate) and not hasattr(candidate, "stream"):
            built: Model = candidate()
            return built
        return candidate

    def model_for_turn(self, session_id: str, message: dict[str, Any] | None) -> Model:
        """The model the coming turn will use (the compaction threshold is per model,
        seed 002 "Per-turn model switch"): the message's ``metadata`` selection
        ``{provider_id, model_id, variant}``, else the session row's ``model``, through
        ``resolve_model``; else ``get_model()``."""
        meta = (message or {}).get("metadata") or {}
        selection = meta if isinstance(meta, dict) and meta.get("model_id") else None
        if selection is None:
            row = self.store.get_session(session_id).model
            selection = row if isinstance(row, dict) and row.get("model_id") else None
        if selection is not None:
            keys = ("provider_id", "model_id", "variant")
            try:
                return self.resolve_model({k: selection[k] for k in keys if k in selection})
            except Exception:  # the turn itself reports a bad selection
                pass
        return self.get_model()

    # -- override points: prompt ------------------------------------------------------

    def get_manifest_prompt(self) -> str:
        """Section 1 of the prompt (default: ``manifest_prompt``); may be async."""
        return self.manifest_prompt

    def get_working_directory(self) -> str:
        """Where the instruction-file walk ends (default: ``working_directory``)."""
        return self.working_directory

    def get_git_status(self) -> str | None:
        """The environment section's git status (None: omitted)."""
        return None

    def get_current_date(self) -> str:
        """The environment section's date (ISO, UTC)."""
        return datetime.now(UTC).date().isoformat()

    def get_model_variant(self, model: Any) -> str | None:
        """The environment section's model variant."""
        return getattr(model, "variant", None)

    def get_environment(self, model: Any, variant: str | None = None) -> dict[str, Any]:
        """The environment section's key/values (None values are omitted). ``model``
        and ``variant`` are the turn's (its per-turn selection); without a variant
        the model's own (``get_model_variant``)."""
        provider = getattr(model, "provider_id", None)
        model_id = getattr(model, "model_id", None)
        resolved = "/".join(str(x) for x in (provider, model_id) if x) or None
        return {
            "platform": sys.platform,
            "workspace root": self.workspace_root,
            "working directory": self.get_working_directory() or ".",
            "git status": self.get_git_status(),
            "date": self.get_current_date(),
            "model": resolved,
            "variant": variant if variant is not None else self.get_model_variant(model),
        }

    # -- Think hooks, answered by the capabilities ------------------------------------

    async def prepare_turn(self, options: ChatOptions) -> bool:
        """Think's hook, then auto-compaction when the session is over its threshold.
        Returns True if either changed the stored history."""
        changed = await super().prepare_turn(options)
        return await self.compaction.prepare_turn(options) or changed

    def context_view(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The compacted view (the latest summary plus the messages after it), then
        Think's hook on it. ``messages`` is not mutated."""
        return super().context_view(compaction_view(messages))

    async def check_tool_permission(
        self, tool_name: str, input: Any, call_id: str, options: ChatOptions | None = None
    ) -> str | ToolDenial | None:
        """The permission rules' verdict on the call (see
        :meth:`Permissions.check_tool_permission`): ``None`` to allow, else a reason or a
        :class:`ToolDenial`. An ``ask`` rule waits here for the answer."""
        return await self.permissions.check_tool_permission(tool_name, input, call_id, options)

    async def system_prompt_for(self, options: ChatOptions, tools: dict[str, Tool]) -> str:
        """The assembled system prompt (identity, environment, skills, tool guidance)
        for ``tools``; a subclass that overrides ``get_system_prompt`` gets its own
        prompt instead."""
        if type(self).get_system_prompt is not Think.get_system_prompt:
            # A subclass replaced the assembly altogether.
            return await super().system_prompt_for(options, tools)
        return await self.prompts.system_prompt_for(options, tools)

    def message_metadata(self, options: ChatOptions) -> dict[str, Any]:
        """Think's metadata plus the assembled prompt's ``system_prompt_digest``."""
        return {**super().message_metadata(options), **self.prompts.message_metadata(options)}

    # -- remote surface: compaction ---------------------------------------------------

    @idempotent
    @remote
    def get_compaction_config(self, session_id: str | None = None) -> CompactionConfig:
        """The session's effective compaction config (agent default + overrides)."""
        return self.compaction.get_compaction_config(session_id)

    @remote
    def set_compaction_config(
        self, session_id: str | None, overrides: dict[str, Any] | CompactionConfig | None
    ) -> CompactionConfig:
        """Store per-session overrides (validated first; None clears them)."""
        return self.compaction.set_compaction_config(session_id, overrides)

    @idempotent
    @remote
    def compaction_threshold(self, session_id: str | None = None, model: Any = None) -> int:
        """``usable = context_window - min(reserve_tokens, max_output_tokens)``."""
        return self.compaction.compaction_threshold(session_id, model)

    @idempotent
    @remote
    def needs_compaction(self, session_id: str | None = None, model: Any = None) -> bool:
        """``context_window_used >= usable`` for ``model`` (default ``get_model()``)."""
        return self.compaction.needs_compaction(session_id, model)

    @remote
    def prune_tool_outputs(
        self, session_id: str | None = None, *, target_tokens: int | None = None
    ) -> PruneResult:
        """Stub out old tool outputs until ``target_tokens`` are reclaimed."""
        return self.compaction.prune_tool_outputs(session_id, target_tokens=target_tokens)

    @remote
    async def compact(
        self,
        session_id: str | None = None,
        *,
        auto: bool = False,
        model: Any = None,
        fit_below: int | None = None,
    ) -> CompactionResult | None:
        """Compact now (see :meth:`Compaction.compact`)."""
        return await self.compaction.compact(
            session_id, auto=auto, model=model, fit_below=fit_below
        )

    @idempotent
    @remote
    def list_compactions(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """Every compaction on the session's current path, oldest first."""
        return self.compaction.list_compactions(session_id)

    # -- remote surface: permissions --------------------------------------------------

    @property
    def project_rules(self) -> ProjectRules:
        """The project scope (assign to inject the host's)."""
        return self.permissions.project_rules

    @project_rules.setter
    def project_rules(self, value: ProjectRules) -> None:
        self.permissions.project_rules = value

    def manifest_rules(self) -> tuple[PermissionRule, ...]:
        """The manifest scope, validated."""
        return self.permissions.manifest_rules()

    def evaluate_permission(
        self, tool_name: str, input: Any = None, session_id: str | None = None
    ) -> PermissionDecision:
        """The verdict for a tool call (most specific rule wins, manifest pins win)."""
        return self.permissions.evaluate_permission(tool_name, input, session_id)

    @remote
    def add_project_rule(self, rule: RuleLike) -> PermissionRule:
        """Add a rule to the project scope."""
        return self.permissions.add_project_rule(rule)

    @remote
    def remove_project_rule(self, rule: RuleLike) -> bool:
        """Remove a rule from the project scope; False if absent."""
        return self.permissions.remove_project_rule(rule)

    @idempotent
    @remote
    def session_rules(self, session_id: str | None = None) -> list[PermissionRule]:
        """The session scope's rules."""
        return self.permissions.session_rules(session_id)

    @remote
    def add_session_rule(self, rule: RuleLike, session_id: str | None = None) -> PermissionRule:
        """Add (or move to newest) a rule in the session scope."""
        return self.permissions.add_session_rule(rule, session_id)

    @remote
    def remove_session_rule(self, rule: RuleLike, session_id: str | None = None) -> bool:
        """Remove a rule from the session scope; False if absent."""
        return self.permissions.remove_session_rule(rule, session_id)

    @idempotent
    @remote
    def pending_approvals(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """Asks waiting for an answer, oldest first (JSON-ready dicts)."""
        return self.permissions.pending_approvals(session_id)

    @idempotent
    @remote
    def get_approval(self, approval_id: str) -> dict[str, Any] | None:
        """A pending or recently settled approval."""
        return self.permissions.get_approval(approval_id)

    @remote
    def answer_approval(
        self, approval_id: str, decision: ApprovalDecision, answered_by: str | None = None
    ) -> dict[str, Any]:
        """Answer an ask: deny, once, session or always."""
        return self.permissions.answer_approval(approval_id, decision, answered_by)

    # -- remote surface: prompt -------------------------------------------------------

    @idempotent
    @remote
    async def assemble_prompt(self, tools: Mapping[str, Any] | None = None) -> AssembledPrompt:
        """The assembled system prompt for ``tools`` (None: ``get_tools()``)."""
        return await self.prompts.assemble_prompt(tools)

    @property
    def last_prompt(self) -> AssembledPrompt | None:
        """The most recently assembled prompt."""
        return self.prompts.last_prompt
