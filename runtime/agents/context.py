"""Who an agent is: its name, namespace and storage root, given at construction.

The host that builds an agent (a session actor binding a pooled actor to a name, a
test, a script) passes an :class:`AgentContext`; nothing is patched onto the agent
afterwards, so ``on_start`` and every method see the identity from the beginning.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

__all__ = ["AgentContext", "constructing", "context_being_constructed"]


@dataclass(frozen=True)
class AgentContext:
    """The identity of one agent instance.

    ``name``: the agent's name in its namespace (the Durable Object name).
    ``namespace``: the namespace (one agent class under one storage root).
    ``storage_root``: the directory holding the namespace folders, or None for an agent
    that lives in memory or in a file outside any namespace.
    ``make_durable``: awaited at the end of every turn, after its final persist and
    before its ``finish`` chunk goes out; it makes everything the agent's store has
    committed so far survive the loss of this process (an object-store root ships it).
    Raising fails the turn: the client gets an ``error``, not ``finish``. None: the
    store's own commit is durable (a local root)."""

    name: str = "local"
    namespace: str = "default"
    storage_root: str | None = None
    make_durable: Callable[[], Awaitable[None]] | None = None


_constructing: contextvars.ContextVar[AgentContext | None] = contextvars.ContextVar(
    "thinkray_agent_context", default=None
)


@contextlib.contextmanager
def constructing(context: AgentContext) -> Iterator[None]:
    """Hosts build agents inside this block: an agent constructed here without an
    explicit ``context=`` gets ``context``. It lets a host give the identity at
    construction to subclasses whose ``__init__`` does not forward ``context``."""
    token = _constructing.set(context)
    try:
        yield
    finally:
        _constructing.reset(token)


def context_being_constructed() -> AgentContext | None:
    """The context a host is constructing an agent with (see :func:`constructing`)."""
    return _constructing.get()
