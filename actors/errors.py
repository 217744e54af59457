"""Every exception the Ray layer raises on purpose, in one place."""

from __future__ import annotations

from thinkray.runtime.errors import *  # noqa: F403  # the runtime errors an actor caller meets
from thinkray.runtime.errors import InvalidStateError, ThinkrayError, UserError
from thinkray.runtime.errors import __all__ as _runtime_errors

__all__ = [
    *_runtime_errors,
    "ActorBusyError",
    "BridgeAccessError",
    "ConsumerGone",
    "NotBoundError",
    "SyncInEventLoopError",
    "WakeError",
]


class SyncInEventLoopError(UserError, RuntimeError):
    """``response.result()`` was called inside a running event loop (it would block
    the loop): ``await response`` there instead."""


class ConsumerGone(ThinkrayError, RuntimeError):
    """The relay's consumer failed; the run detaches it and goes on."""


class NotBoundError(ThinkrayError, RuntimeError):
    """This actor does not host that agent (any more): resolve the name again."""

    def __init__(self, name: str = "", bound: str | None = None) -> None:
        super().__init__(
            f"actor does not host {name!r}" + (f" (it hosts {bound!r})" if bound else "")
        )
        self.name = name
        self.bound = bound


class BridgeAccessError(UserError, PermissionError):
    """The caller's grant does not allow this operation."""


class ActorBusyError(InvalidStateError):
    """A session actor was asked to bind an agent while it is not generic: it hosts
    one (``state`` ``bound``) or a bind or hibernation is in flight on it (``binding``,
    ``hibernating``), or it is ``broken``. ``session`` is the agent it hosts, binds or
    hibernates. Nothing was changed: the actor is not a spare."""

    def __init__(self, state: str = "", session: str | None = None) -> None:
        if state == "broken":
            message = "actor is broken: a failed wake left a database open in its process"
        else:
            what = {
                "bound": "already hosts",
                "binding": "is binding",
                "busy": "is busy with a turn or call of",
            }.get(state, f"is {state}")
            message = f"actor {what} {session!r}"
        super().__init__(message)
        self.state = state
        self.session = session


class WakeError(ThinkrayError, RuntimeError):
    """Agent ``name`` failed to wake: its ``on_wake`` hook raised (``reason``, as
    ``Type: message``; not ``cause``, which Ray's wrapper of a remote error uses). The wake was undone: the agent's database is closed and its
    file and lease are released, so a later wake can bind it (once the hook works).
    ``clean``: whether the actor that tried could be made generic again (if not, the
    directory retires it)."""

    def __init__(self, name: str = "", reason: str = "", clean: bool = True) -> None:
        super().__init__(f"agent {name!r} failed to wake: on_wake raised {reason}")
        self.name = name
        self.reason = reason
        self.clean = clean
