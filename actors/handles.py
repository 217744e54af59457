"""A named actor's handle sent by name, resolved once per receiving process.

Ray rebuilds the metadata of every method of an actor's class each time it
deserializes a handle (``ActorHandle.__init__``): for the namespace directory (84
methods) that is about a millisecond of the receiver's CPU, and every bind sent one
to the agent host, on the event loop all its agents share (issue 22: a burst of new
sessions on a host spent more time deserializing the directory's handle than binding
the agents). :class:`NamedHandle` pickles as the actor's id and name instead; the
receiving process looks the name up once per actor id and keeps the handle.

Contract: what the receiver gets is a plain actor handle of the actor that holds the
name when it is first resolved there. A replacement actor under the same name (a new
directory after the old one was stopped) has another id, so it is looked up afresh;
the handle of a restarted actor (same id) keeps working, as Ray handles do. The
lookup is one blocking GCS call per process and actor.
"""

from __future__ import annotations

import threading
from typing import Any

import ray

_resolved: dict[str, Any] = {}
_lock = threading.Lock()


class NamedHandle:
    """``handle`` of the actor named ``name`` in Ray namespace ``ray_namespace``, to
    send: it arrives as the receiver's own cached handle of that actor."""

    def __init__(self, handle: Any, name: str, ray_namespace: str) -> None:
        self.handle = handle
        self.name = name
        self.ray_namespace = ray_namespace
        self.actor_id = handle._actor_id.hex()

    def __reduce__(self) -> tuple[Any, tuple[str, str, str]]:
        return _resolve, (self.actor_id, self.name, self.ray_namespace)


def _resolve(actor_id: str, name: str, ray_namespace: str) -> Any:
    with _lock:
        handle = _resolved.get(actor_id)
        if handle is None:
            handle = _resolved[actor_id] = ray.get_actor(name, namespace=ray_namespace)
        return handle
