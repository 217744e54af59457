"""The throwaway agent a pooled actor or an agent host binds to warm its process up."""

from __future__ import annotations

from typing import Any

from thinkray.runtime.agents.think import Think


class WarmUpAgent(Think):
    """The throwaway agent of :meth:`SessionActor._warm_up`: a test model, no tools; its
    turn is neither traced nor measured."""

    observe_turns = False

    def get_model(self) -> Any:
        """A model that streams a short reply."""
        from thinkray.runtime.models.testing import FunctionModel, reply

        return FunctionModel(lambda request, step: reply("warm ", "up"), model_id="warm-up")
