"""Agent state synced to every client: Cloudflare agents' ``this.state`` /
``setState`` / ``cf_agent_state``, on a typed model.

An agent class declares ``state_model`` (a pydantic model) and, optionally,
``initial_state``; the state lives in the agent's own database (one versioned JSON
document, :class:`~thinkray.storage.protocols.AgentStateStore`), so it survives
hibernation and restarts. ``agent.set_state(...)`` replaces it (validated against the
model first: nothing invalid is ever stored); a client may too where the class allows
it (``client_can_set_state``, refined by the ``validate_state_change`` hook). Every
change goes to the subscribers of :class:`AgentState` (the session actor relays them
to the ingress, which fans them out to the agent's WebSocket and SSE clients).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from pydantic import BaseModel, ValidationError
from thinkray.runtime.errors import InvalidAgentStateError, NoAgentStateError
from thinkray.storage.errors import InvalidInputError
from thinkray.storage.protocols import AgentStateStore

__all__ = [
    "AgentState",
    "StateChange",
    "StateListener",
    "StateSource",
    "initial_state_of",
    "validate_state",
]

log = logging.getLogger("thinkray.state")

StateSource = Literal["server", "client"]
"""Who changes the state: ``server`` (the agent itself, or Python code through its
handle) or ``client`` (a WebSocket or HTTP client through the ingress)."""


@dataclass(frozen=True)
class StateChange:
    """The state as clients see it: its JSON ``state`` and ``version`` (0 for the
    initial state, never stored; one more per write). ``origin``: the client
    connection that wrote it (None for the server); ``exact``: what that client sent is
    what was stored, so it need not hear it back (the ``agents`` client applied it
    already)."""

    state: Any
    version: int
    origin: str | None = None
    exact: bool = False

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (what crosses the actor boundary)."""
        return asdict(self)


StateListener = Callable[[StateChange], None]


def _jsonable(value: Any) -> Any:
    """A model or a mapping as JSON-ready data (what the model validates)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", warnings=False)  # validated next
    if isinstance(value, Mapping):
        return dict(value)
    return value


def validate_state(model: type[BaseModel], value: Any) -> BaseModel:
    """``value`` (a model instance or its JSON data) as a fresh ``model`` instance.
    An instance is validated again from its data: one mutated in place after it was
    built is checked like any other input.

    Raises:
        InvalidAgentStateError: it does not fit ``model``.
    """
    try:
        return model.model_validate(_jsonable(value))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidAgentStateError(f"state does not fit {model.__name__}: {problems}") from None


def initial_state_of(cls: type) -> BaseModel | None:
    """The initial state of agent class ``cls``: ``initial_state`` validated against
    ``state_model`` (the model's defaults without one); None for a class without state.

    Raises:
        InvalidAgentStateError: ``initial_state`` does not fit the model.
    """
    model = getattr(cls, "state_model", None)
    if model is None:
        return None
    initial = getattr(cls, "initial_state", None)
    return validate_state(model, {} if initial is None else initial)


class AgentState:
    """One agent's synced state: its model, its store and its subscribers.

    Read lazily (a class whose stored state no longer fits its model still wakes; the
    read raises :class:`InvalidAgentStateError` until a valid state is set).
    ``max_bytes``: the largest state, as JSON, that may be stored."""

    def __init__(
        self,
        agent_cls: type,
        store: Callable[[], AgentStateStore],
        max_bytes: int,
    ) -> None:
        self.model: type[BaseModel] | None = getattr(agent_cls, "state_model", None)
        self._agent_cls = agent_cls
        self._store = store
        self._max_bytes = max_bytes
        self._current: StateChange | None = None
        self._listeners: list[StateListener] = []

    @property
    def enabled(self) -> bool:
        """Whether the agent's class declares a state."""
        return self.model is not None

    def _need_model(self) -> type[BaseModel]:
        if self.model is None:
            raise NoAgentStateError(
                f"{self._agent_cls.__name__} declares no state_model: it has no synced state"
            )
        return self.model

    def snapshot(self) -> StateChange:
        """The current state as JSON with its version (the initial state, version 0,
        until one is set).

        Raises:
            NoAgentStateError: the class declares no state.
            InvalidAgentStateError: the stored state no longer fits the model.
        """
        model = self._need_model()
        if self._current is None:
            record = self._store().get()
            if record is None:
                initial = initial_state_of(self._agent_cls)
                assert initial is not None
                self._current = StateChange(initial.model_dump(mode="json"), 0)
            else:
                validate_state(model, record.value)
                self._current = StateChange(record.value, record.version)
        return self._current

    def current(self) -> BaseModel:
        """The current state, a fresh model instance (changing it changes nothing:
        call :meth:`set` with it)."""
        return self._need_model().model_validate(self.snapshot().state)

    def check(self, value: Any) -> tuple[BaseModel, Any]:
        """``value`` validated, and its JSON data, within the size limit.

        Raises:
            InvalidAgentStateError: it does not fit the model, is not JSON or is too
                large.
        """
        state = validate_state(self._need_model(), value)
        data = state.model_dump(mode="json")
        size = len(_encoded(data))
        if size > self._max_bytes:
            raise InvalidAgentStateError(
                f"state is {size} bytes as JSON, over the {self._max_bytes}-byte limit"
            )
        return state, data

    def store(self, data: Any, *, origin: str | None = None, sent: Any = None) -> StateChange:
        """Store ``data`` (the JSON :meth:`check` returned: validate first, and run the
        hooks that may refuse) and tell every subscriber. ``origin``: the client
        connection that sent ``sent``."""
        try:
            record = self._store().put(data)
        except InvalidInputError as exc:  # the model dumped something that is not JSON
            raise InvalidAgentStateError(str(exc)) from None
        exact = bool(origin) and _jsonable(sent) == record.value
        self._current = StateChange(record.value, record.version, origin or None, exact)
        for listener in list(self._listeners):
            try:
                listener(self._current)
            except Exception:  # one broken subscriber must not undo a stored change
                log.exception("a state subscriber failed")
        return self._current

    def subscribe(self, listener: StateListener) -> Callable[[], None]:
        """Call ``listener(change)`` after every change; returns the remover."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None


def _encoded(data: Any) -> bytes:
    try:
        return json.dumps(data, allow_nan=False, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        raise InvalidAgentStateError(f"state is not JSON: {exc}") from None
