"""The tests' orchestrator classes (a module of their own: see tests/agents.py)."""

from __future__ import annotations

from thinkray.actors.orchestrator import Orchestrator


class LeanOrchestrator(Orchestrator):
    """The product's Orchestrator whose sub-agents' namespace keeps no warm spare and
    starts none for demand (a test's handful of sub-agents start on demand, cold): each
    spare is a process that imports Ray, DuckDB and thinkray and runs a warm-up turn,
    and a test rarely used the two a sub-agent namespace keeps by default, or the one
    its first bind's miss asked for. Everything else is the Orchestrator's."""

    subagent_pool_size = 0
    subagent_grow_pool = False
    subagent_warm_up = False
