"""The per-turn model switch (seed 002 "Per-turn model switch").

A user message's ``metadata`` may carry ``{provider_id, model_id, variant}``. The
selection (else the session row's ``model``, else the agent default) is resolved by
``Think.resolve_model``. The model (provider and id) of a selection is written to the
row and carries forward; its **variant** (reasoning mode, JSON mode, thinking depth)
is the turn's only: "a reasoning-mode toggle that lasts the session is a bug" (seed
002), so a turn that selects nothing runs the row's model without a variant. A turn
without a new message (a regenerate) runs with the selection of the user message it
answers, variant included: it is that turn again.

Before a switched turn, if the new model cannot hold ``context_window_used`` plus
its reserve, ``Think.compact_for_model`` runs with ``fit_below`` (the new model's
usable tokens): a compaction is written only if what it leaves fits. If the
conversation still does not fit, the turn fails before the model is called and with
nothing written (no compaction, no rollup change, no user message), with
:data:`CONTEXT_SWITCH_ERROR`.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from thinkray.runtime.errors import (
    CONTEXT_SWITCH_ERROR as CONTEXT_SWITCH_ERROR,
)
from thinkray.runtime.errors import (  # re-exported: the errors live in thinkray.runtime.errors
    ModelSwitchError as ModelSwitchError,
)
from thinkray.runtime.errors import (
    UnknownModelError as UnknownModelError,
)
from thinkray.runtime.models.base import Model
from thinkray.storage.types import DEFAULT_SETTINGS_KEY

if TYPE_CHECKING:
    from thinkray.runtime.agents.runs import RunState
    from thinkray.runtime.agents.think import Think


DEFAULT_RESERVE_TOKENS = 20_000
"""Seed 002: reserve = min(20k tokens, model.max_output) unless configured."""

MODEL_SELECTION_KEYS = ("provider_id", "model_id", "variant")

__all__ = [
    "CONTEXT_SWITCH_ERROR",
    "DEFAULT_RESERVE_TOKENS",
    "DEFAULT_SETTINGS_KEY",
    "ModelSwitchError",
    "UnknownModelError",
    "fits_context",
    "model_selection",
    "prepare_turn_model",
    "reserve_tokens",
    "resolve_model",
    "model_info",
    "compact_for_model",
    "usable_tokens",
    "answered_selection",
]


# -- per-turn model --------------------------------------------------------------------


def model_selection(metadata: Any) -> dict[str, Any] | None:
    """The ``{provider_id, model_id, variant}`` a message's metadata selects, or None.

    A selection names ``model_id`` (a non-empty string); ``provider_id`` and
    ``variant`` are optional strings. Anything else is a clear ``ValueError``.
    """
    if not isinstance(metadata, dict) or not any(k in metadata for k in MODEL_SELECTION_KEYS):
        return None
    model_id = metadata.get("model_id")
    if not isinstance(model_id, str) or not model_id:
        raise UnknownModelError(f"a model selection needs a non-empty 'model_id', got {model_id!r}")
    for key in ("provider_id", "variant"):
        value = metadata.get(key)
        if value is not None and not isinstance(value, str):
            raise UnknownModelError(f"model selection {key!r} must be a string, got {value!r}")
    return {key: metadata.get(key) for key in MODEL_SELECTION_KEYS}


def row_selection(model: Any) -> dict[str, Any] | None:
    """The selection stored on a session row (``None`` if the row names no model)."""
    try:
        return model_selection(model)
    except UnknownModelError:
        return None  # a row written by something else: treat as unset


def resolve_model(agent: Think, selection: dict[str, Any] | None) -> Model:
    """Default ``Think.resolve_model``: ``None`` is ``get_model()``; otherwise the
    agent's registry ``models`` (``model_id -> Model``), then ``get_model()`` when its
    ``model_id`` (and ``provider_id``, when both are given) match."""
    if selection is None:
        return agent.get_model()
    model_id = selection["model_id"]
    registry = getattr(agent, "models", None) or {}
    if model_id in registry:
        return registry[model_id]
    try:
        default = agent.get_model()
    except NotImplementedError:
        default = None
    provider = selection.get("provider_id")
    if (
        default is not None
        and getattr(default, "model_id", None) == model_id
        and (provider is None or getattr(default, "provider_id", None) in (None, provider))
    ):
        return default
    known = sorted(registry) + ([default.model_id] if default is not None else [])
    raise UnknownModelError(f"unknown model {model_id!r} (known: {known})")


def reserve_tokens(model: Model, settings: dict[str, Any] | None = None) -> int:
    """Headroom kept for the next turn: ``compaction.reserve_tokens`` (default 20k),
    capped at the model's ``max_output_tokens``."""
    compaction = (settings or {}).get("compaction")
    configured = compaction.get("reserve_tokens") if isinstance(compaction, dict) else None
    reserve = configured if isinstance(configured, int) and configured >= 0 else None
    if reserve is None:
        reserve = DEFAULT_RESERVE_TOKENS
    max_output = getattr(model, "max_output_tokens", None)
    if isinstance(max_output, int) and max_output > 0:
        reserve = min(reserve, max_output)
    return reserve


def fits_context(used: int, model: Model, settings: dict[str, Any] | None = None) -> bool:
    """Seed 002: compaction fires when ``context_window_used >= usable``, where
    ``usable = context_window - reserve``; so the conversation fits below that."""
    window = getattr(model, "context_window", None)
    if not isinstance(window, int) or window <= 0:
        return True  # a model that states no limit
    return used < window - reserve_tokens(model, settings)


def usable_tokens(model: Model, settings: dict[str, Any] | None = None) -> int | None:
    """``context_window - reserve`` of ``model`` (None: the model states no limit): a
    conversation fits while ``context_window_used`` is below it."""
    window = getattr(model, "context_window", None)
    if not isinstance(window, int) or window <= 0:
        return None
    return window - reserve_tokens(model, settings)


def _accepts(fn: Any, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


async def compact_for_model(
    agent: Think, session_id: str, model: Model, *, fit_below: int | None = None
) -> None:
    """Default ``Think.compact_for_model``: the agent's ``compact(session_id,
    auto=True)`` when it has one, passing ``model=`` and ``fit_below=`` when it
    accepts them (``fit_below``: write the compaction only if the context it leaves
    is below that many tokens; an agent's ``compact`` without it cannot promise that
    a refused switch writes nothing)."""
    compact = getattr(agent, "compact", None)
    if compact is None:
        return
    kwargs: dict[str, Any] = {"auto": True}
    if _accepts(compact, "model"):
        kwargs["model"] = model
    if fit_below is not None and _accepts(compact, "fit_below"):
        kwargs["fit_below"] = fit_below
    result = compact(session_id, **kwargs)
    if inspect.isawaitable(result):
        await result


async def prepare_turn_model(
    agent: Think, session_id: str, user_msg: dict[str, Any] | None
) -> tuple[Model | None, dict[str, Any] | None]:
    """Resolve this turn's model and make sure the conversation fits it.

    The selection is the user message's (without one, a regenerate's: the user
    message it answers); else the row's model, without a variant (a variant is per
    turn). Runs before the user message lands, so a refused switch writes nothing.
    Returns ``(model, selection)``; the model of a new selection has been written to
    the session row (``variant`` None: it does not carry forward).
    """
    if user_msg is not None:
        selection = model_selection(user_msg.get("metadata"))
    else:
        selection = answered_selection(agent, session_id)
    info = agent.store.get_session(session_id)
    current = row_selection(info.model)
    carried = {**current, "variant": None} if current is not None else None
    chosen = selection if selection is not None else carried
    try:
        model = agent.resolve_model(chosen)
    except NotImplementedError:
        if chosen is not None:
            raise
        return None, None  # an agent with its own on_chat_message and no model
    if selection is None:
        return model, chosen
    if _model_key(selection) != _model_key(current):
        settings = agent.store.get_effective_settings(session_id)
        configured = getattr(agent, "get_compaction_config", None)
        if callable(configured):
            # An agent with compaction knows its reserve (session > store > agent default).
            compaction = dict(settings.get("compaction") or {})
            compaction["reserve_tokens"] = configured(session_id).reserve_tokens
            settings = {**settings, "compaction": compaction}
        if not fits_context(info.context_window_used, model, settings):
            limit = usable_tokens(model, settings)
            if _accepts(agent.compact_for_model, "fit_below"):
                await agent.compact_for_model(session_id, model, fit_below=limit)
            else:  # an override of the old shape
                await agent.compact_for_model(session_id, model)
            info = agent.store.get_session(session_id)
            if not fits_context(info.context_window_used, model, settings):
                raise ModelSwitchError(
                    used=info.context_window_used,
                    context_window=getattr(model, "context_window", None),
                    reserve=reserve_tokens(model, settings),
                )
    row = {**selection, "variant": None}
    if row != info.model:
        agent.store.update_session(session_id, model=row)
    return model, chosen


def _model_key(selection: dict[str, Any] | None) -> tuple[Any, Any] | None:
    """What names a model in a selection (its variant aside)."""
    if selection is None:
        return None
    return selection.get("provider_id"), selection.get("model_id")


def answered_selection(agent: Think, session_id: str) -> dict[str, Any] | None:
    """The selection of the last user message in the session's history: what a turn
    without a new message (a regenerate) answers. None when it selects nothing (or
    its metadata is not a valid selection)."""
    for message in reversed(agent.store.get_history(session_id)):
        if message.get("role") == "user":
            try:
                return model_selection(message.get("metadata"))
            except UnknownModelError:
                return None
    return None


def model_info(agent: Think, run: RunState | None = None) -> dict[str, Any] | None:
    """``metadata.model`` of an assistant message: the model that produced it."""
    model = getattr(run, "model", None)
    if model is None:
        try:
            model = agent.get_model()
        except Exception:
            return None
    info: dict[str, Any] = {
        "provider_id": getattr(model, "provider_id", None),
        "model_id": getattr(model, "model_id", None),
    }
    selection = getattr(run, "model_selection", None)
    if selection and selection.get("variant") is not None:
        info["variant"] = selection["variant"]
    return info
