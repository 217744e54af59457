"""An agent class in a module of its own, which only the processes that run the agent
import (tests/test_actors.py checks that its namespace's directory never does)."""

from __future__ import annotations

from tests.agents import ScriptAgent


class LazyAgent(ScriptAgent):
    """The script agent, defined here so that importing this module is observable."""
