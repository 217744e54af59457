"""Session lifecycle on a :class:`~thinkray.runtime.agents.think.Think` agent (seeds 001 and 002).

``Think`` keeps thin methods (``branch``, ``rewind``, ``unrewind``, ``resend``,
``resolve_model``, ``compact_for_model``) that call the functions here; the data work
is in the store (:meth:`~thinkray.storage.protocols.SessionStore.branch_session`,
:meth:`~thinkray.storage.protocols.SessionStore.rewind_session`, ...). What this module adds on
top of the store is what needs the runtime: the one-run-per-session rule, the
``message.user`` snapshot contract, and the per-turn model.

Branch (seed 002 "Branching")
    Rejected with :class:`~thinkray.runtime.status.SessionBusyError` while the parent has a run
    in flight (status ``busy`` or ``retrying``; an ``error`` status is a finished run,
    so branching a failed session is allowed). The branch is a new session and does not
    become the current one: a sidecar must not steal the main conversation.

Rewind and un-rewind (seed 002 "Rewinding")
    ``rewind(session, user_message_id)`` soft-hides everything after the user message
    on the current path; the next turn appends after it (``chat(None)`` regenerates the
    answer). ``include_target=True`` also hides the message itself, so an edited
    message is sent in its place (``resend``). ``RewindResult.snapshot_id`` is what a
    host's ``on_user_message`` hook tagged onto the target (world rewind is the host's).
    ``unrewind`` undoes the latest rewind; turns taken since stay, intact, on their own
    branch of the tree (``UnrewindResult.detached_ids``); it is refused only when a
    compaction since hid part of the conversation it would restore.

Per-turn model switch (seed 002 "Per-turn model switch")
    A user message's ``metadata`` may carry ``{provider_id, model_id, variant}``. The
    selection (else the session row's ``model``, else the agent default) is resolved by
    ``Think.resolve_model``; a new selection is written to the row and carries forward.
    Before a switched turn, if the new model cannot hold ``context_window_used`` plus
    its reserve, ``Think.compact_for_model`` runs; if it still does not fit, the turn
    fails before the model is called and before anything is written, with
    :data:`CONTEXT_SWITCH_ERROR`.
"""

from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from thinkray.runtime.models.base import Model
from thinkray.runtime.status import SessionBusyError
from thinkray.storage.types import DEFAULT_SETTINGS_KEY, SessionInfo

if TYPE_CHECKING:
    from thinkray.runtime.agents.think import RunState, Think

CONTEXT_SWITCH_ERROR = (
    "Switching to a model with a smaller context window would lose the conversation; "
    "consider branching with the new model."
)
"""Seed 002's message for a model switch that compaction cannot make fit."""

DEFAULT_RESERVE_TOKENS = 20_000
"""Seed 002: reserve = min(20k tokens, model.max_output) unless configured."""

MODEL_SELECTION_KEYS = ("provider_id", "model_id", "variant")

__all__ = [
    "CONTEXT_SWITCH_ERROR",
    "DEFAULT_RESERVE_TOKENS",
    "DEFAULT_SETTINGS_KEY",
    "ModelSwitchError",
    "RewindResult",
    "UnknownModelError",
    "UnrewindResult",
    "branch",
    "clone_thread",
    "delete_thread",
    "ensure_idle",
    "fits_context",
    "model_selection",
    "prepare_turn_model",
    "reserve_tokens",
    "resolve_model",
    "rewind",
    "thread",
    "unrewind",
]


class ModelSwitchError(RuntimeError):
    """The selected model cannot hold the conversation, even after compaction."""

    def __init__(self, message: str = CONTEXT_SWITCH_ERROR, **details: Any) -> None:
        super().__init__(message)
        self.details = details


class UnknownModelError(ValueError):
    """A model selection that ``resolve_model`` cannot map to a model."""


@dataclass
class RewindResult:
    """What ``Think.rewind`` did. ``target`` is the user message (its body goes back
    into the editor); ``snapshot_id`` is the host's world snapshot tagged on it."""

    session_id: str
    target: dict[str, Any]
    hidden_ids: list[str]
    snapshot_id: str | None
    head_id: str | None
    previous_head_id: str | None
    unhidden_ids: list[str] = field(default_factory=list)
    include_target: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class UnrewindResult:
    """What ``Think.unrewind`` did (see :class:`~thinkray.storage.types.UnrewindInfo`)."""

    session_id: str
    head_id: str | None
    unhidden_ids: list[str]
    rehidden_ids: list[str]
    detached_ids: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- one run per session ---------------------------------------------------------------


def ensure_idle(agent: Think, session_id: str) -> None:
    """Raise :class:`SessionBusyError` while ``session_id`` has a run in flight."""
    run_id = agent._session_runs.get(session_id)
    if run_id is not None or agent.status.get(session_id).state in ("busy", "retrying"):
        raise SessionBusyError(session_id, run_id)


def _refresh(agent: Think, session_id: str) -> None:
    if agent.current_session_id == session_id:
        agent.messages = agent.store.get_history(session_id)


# -- branch, rewind, un-rewind ---------------------------------------------------------


def branch(
    agent: Think,
    parent_session_id: str,
    from_message_id: str,
    metadata: dict[str, Any] | None = None,
    *,
    name: str | None = None,
) -> SessionInfo:
    agent.store.get_session(parent_session_id)  # unknown: not found, before busy
    ensure_idle(agent, parent_session_id)
    return agent.store.branch_session(
        parent_session_id, from_message_id, metadata=metadata, name=name
    )


def thread(agent: Think, key: str | None) -> SessionInfo:
    return agent.store.get_session(agent.store.thread(key).id)


def clone_thread(
    agent: Think, src_key: str, dst_key: str, from_message_id: str | None = None
) -> SessionInfo:
    """A clone is a branch: it cannot fork a running turn either."""
    ensure_idle(agent, agent.store.get_thread(src_key).id)
    return agent.store.get_session(agent.store.clone_thread(src_key, dst_key, from_message_id).id)


def delete_thread(agent: Think, key: str) -> None:
    # Through Think.delete_session: a run in flight is aborted, the current session reset.
    agent.delete_session(agent.store.get_thread(key).id)


def rewind(
    agent: Think, session_id: str, user_message_id: str, *, include_target: bool = False
) -> RewindResult:
    agent.store.get_session(session_id)
    ensure_idle(agent, session_id)
    info = agent.store.rewind_session(session_id, user_message_id, include_target=include_target)
    _refresh(agent, session_id)
    target = info.target.message
    metadata = target.get("metadata") or {}
    snapshot = metadata.get("snapshot_id") if isinstance(metadata, dict) else None
    return RewindResult(
        session_id=session_id,
        target=target,
        hidden_ids=info.hidden_ids,
        snapshot_id=snapshot if isinstance(snapshot, str) else None,
        head_id=info.head_id,
        previous_head_id=info.head_before,
        unhidden_ids=info.unhidden_ids,
        include_target=info.include_target,
    )


def unrewind(agent: Think, session_id: str) -> UnrewindResult:
    agent.store.get_session(session_id)
    ensure_idle(agent, session_id)
    info = agent.store.unrewind_session(session_id)
    _refresh(agent, session_id)
    return UnrewindResult(
        session_id=session_id,
        head_id=info.head_id,
        unhidden_ids=info.unhidden_ids,
        rehidden_ids=info.rehidden_ids,
        detached_ids=info.detached_ids,
    )


def resend_message(result: RewindResult, message: str | dict[str, Any] | None) -> Any:
    """The message ``Think.resend`` sends after rewinding with ``include_target``: the
    edited text or message, or a copy of the original under a new id (the original id
    is taken: appending it again would be an idempotent no-op). The target's metadata
    (model selection, snapshot id) carries over unless the new message has its own."""
    from thinkray.runtime.messages import new_id

    original = result.target
    if message is None:
        return {
            **{k: v for k, v in original.items() if k != "id"},
            "id": new_id("msg"),
        }
    if isinstance(message, str):
        return {
            "id": new_id("msg"),
            "role": "user",
            "metadata": original.get("metadata"),
            "parts": [{"type": "text", "text": message}],
        }
    return message


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


async def compact_for_model(agent: Think, session_id: str, model: Model) -> None:
    """Default ``Think.compact_for_model``: the agent's ``compact(session_id,
    auto=True)`` when it has one (passing ``model=`` when it accepts it)."""
    compact = getattr(agent, "compact", None)
    if compact is None:
        return
    kwargs: dict[str, Any] = {"auto": True}
    try:
        if "model" in inspect.signature(compact).parameters:
            kwargs["model"] = model
    except (TypeError, ValueError):
        pass
    result = compact(session_id, **kwargs)
    if inspect.isawaitable(result):
        await result


async def prepare_turn_model(
    agent: Think, session_id: str, user_msg: dict[str, Any] | None
) -> tuple[Model | None, dict[str, Any] | None]:
    """Resolve this turn's model and make sure the conversation fits it.

    Runs before the user message lands, so a refused switch writes nothing. Returns
    ``(model, selection)``; a new selection has been written to the session row.
    """
    selection = model_selection(user_msg.get("metadata")) if user_msg is not None else None
    info = agent.store.get_session(session_id)
    current = row_selection(info.model)
    chosen = selection if selection is not None else current
    try:
        model = agent.resolve_model(chosen)
    except NotImplementedError:
        if chosen is not None:
            raise
        return None, None  # an agent with its own on_chat_message and no model
    if selection is not None and selection != current:
        settings = agent.store.get_effective_settings(session_id)
        configured = getattr(agent, "get_compaction_config", None)
        if callable(configured):
            # An agent with compaction knows its reserve (session > store > agent default).
            compaction = dict(settings.get("compaction") or {})
            compaction["reserve_tokens"] = configured(session_id).reserve_tokens
            settings = {**settings, "compaction": compaction}
        if not fits_context(info.context_window_used, model, settings):
            await agent.compact_for_model(session_id, model)
            info = agent.store.get_session(session_id)
            if not fits_context(info.context_window_used, model, settings):
                raise ModelSwitchError(
                    used=info.context_window_used,
                    context_window=getattr(model, "context_window", None),
                    reserve=reserve_tokens(model, settings),
                )
        agent.store.update_session(session_id, model=selection)
    return model, chosen


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
