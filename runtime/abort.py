"""Abort signals for one run (the seed's AbortController, for asyncio).

A signal is threaded through the model call and every tool's ``execute``. Aborting
is explicit; a consumer going away only detaches (see ``thinkray.runtime.agents.think``). Signals
can be chained: a sub-agent's signal follows its parent's, so aborting a parent run
aborts every run it started.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from thinkray.runtime.errors import (  # re-exported: the errors live in thinkray.runtime.errors
    AbortError as AbortError,
)

T = TypeVar("T")


class AbortSignal:
    """Read side. ``aborted`` flips once; listeners run once, in registration order."""

    def __init__(self) -> None:
        self._aborted = False
        self.reason: str | None = None
        self._listeners: list[Callable[[str], object]] = []
        self._events: list[asyncio.Event] = []

    @property
    def aborted(self) -> bool:
        """Whether the signal has fired (``reason`` says why)."""
        return self._aborted

    def throw_if_aborted(self) -> None:
        """Return if the signal has not fired.

        Raises:
            AbortError: it has, with ``reason`` as the message.
        """
        if self._aborted:
            raise AbortError(self.reason or "aborted")

    def add_listener(self, listener: Callable[[str], object]) -> Callable[[], None]:
        """Call ``listener(reason)`` on abort (at once if already aborted; what it returns
        is ignored). Returns remover."""
        if self._aborted:
            listener(self.reason or "aborted")
            return lambda: None
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove

    async def wait(self) -> str:
        """Wait until the signal fires (return at once if it has) and return the reason."""
        if self._aborted:
            return self.reason or "aborted"
        event = asyncio.Event()
        self._events.append(event)
        try:
            await event.wait()
        finally:
            if event in self._events:
                self._events.remove(event)
        return self.reason or "aborted"

    def _fire(self, reason: str) -> None:
        if self._aborted:
            return
        self._aborted = True
        self.reason = reason
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener(reason)
        for event in self._events:
            event.set()

    def follow(self, parent: AbortSignal | None, reason: str = "aborted by parent") -> None:
        """Abort this signal when ``parent`` aborts."""
        if parent is not None:
            parent.add_listener(lambda _r: self._fire(reason))


class AbortController:
    """Write side of one :class:`AbortSignal` (``signal``): :meth:`abort` fires it.
    With ``parent``, the signal also fires when the parent's does."""

    def __init__(self, parent: AbortSignal | None = None) -> None:
        self.signal = AbortSignal()
        self.signal.follow(parent)

    def abort(self, reason: str = "aborted") -> bool:
        """Abort; returns False if it was already aborted."""
        if self.signal.aborted:
            return False
        self.signal._fire(reason)
        return True


async def abortable(iterator: AsyncIterator[T], signal: AbortSignal) -> AsyncIterator[T]:
    """Iterate ``iterator`` until it ends or ``signal`` fires (then raise AbortError).

    A pending ``__anext__`` is interrupted at once (its task is cancelled while it
    waits on the iterator, so a model call's HTTP stream closes) instead of at the
    next chunk. No task is created per item: a listener cancels the current task only
    while it is waiting inside the iterator, and the cancel becomes an AbortError.
    """
    signal.throw_if_aborted()
    task = asyncio.current_task()
    waiting = False
    fired = False

    def on_abort(_reason: str) -> None:
        nonlocal fired
        fired = True
        # Nested abortables share the task: the first listener cancels, the others
        # see the request pending and leave it.
        if waiting and task is not None and not task.cancelling():
            task.cancel()

    remove = signal.add_listener(on_abort)
    try:
        while True:
            waiting = True
            try:
                item = await iterator.__anext__()
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                if fired and task is not None and task.cancelling():
                    task.uncancel()
                    raise AbortError(signal.reason or "aborted") from None
                raise
            finally:
                waiting = False
            if fired:
                raise AbortError(signal.reason or "aborted")
            yield item
    finally:
        remove()
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(RuntimeError, Exception):
                await aclose()
