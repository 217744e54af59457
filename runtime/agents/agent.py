"""``Agent``: ``Think`` plus the session model of seed 002.

``Think`` is the chat lifecycle of seed 000 (turn, persistence, sessions, branch,
rewind, threads, per-turn model switch, fibers). ``Agent`` composes the three
capabilities that reshape every turn:

- :class:`~thinkray.runtime.capabilities.compaction.CompactionMixin` — automatic compaction before a turn
  would overflow the model's window, manual compaction and tool-output pruning;
- :class:`~thinkray.runtime.capabilities.permissions.PermissionMixin` — manifest / session / project rules
  evaluated at tool-call time, with ``ask`` answered once / for the session / always;
- :class:`~thinkray.runtime.capabilities.prompt.PromptMixin` — the system prompt assembled in the normative
  order (manifest, project instructions, skills, environment, tool catalog) with its
  SHA-256 digest on every assistant message.

Subclass ``Agent`` for the full session model (the shipped demo agent, orchestrator
and sub-agents do); subclass ``Think`` for a lean chat agent. Everything public on
either is reachable on a session actor through ``AgentHandle.invoke``.
"""

from __future__ import annotations

from thinkray.runtime.agents.think import Think
from thinkray.runtime.capabilities.compaction import CompactionMixin
from thinkray.runtime.capabilities.permissions import PermissionMixin
from thinkray.runtime.capabilities.prompt import PromptMixin


class Agent(CompactionMixin, PermissionMixin, PromptMixin, Think):
    """Think with compaction, permission scopes and system prompt assembly.

    Set ``manifest_prompt`` (not ``get_system_prompt``) to keep the assembled prompt;
    overriding ``get_system_prompt`` replaces the assembly altogether."""
