"""A directory's binds to one agent host, coalesced into few Ray calls.

Under a burst of brand-new sessions the directory binds tens of agents on each host
at once. One ``bind`` Ray call per agent cost ~2.5 ms of the host's CPU and ~1 ms of
the directory's (on 2 cores, 100 binds took ~0.45 s of wall time for that alone),
against ~2.3 ms for the bind's own work. :class:`HostBinds` sends the binds that
meet while one call is in flight as one ``bind_many`` call instead: a lone bind goes
at once, as before; a burst costs a few calls per host.

Contract:

- **Order and concurrency.** Binds are sent in the order :meth:`HostBinds.bind` was
  called; at most ``in_flight`` calls are outstanding per host, each with at most
  ``batch`` binds. The host binds a call's agents concurrently, as it would separate
  calls.
- **Results.** Each bind gets its own outcome: ``bind``'s reply, or the exception the
  host's ``bind`` raised for that agent (another agent's failure in the same call does
  not touch it). A failure of the call itself (the host died:
  ``ray.exceptions.RayActorError``) is every bind's in that call.
- **Cancel.** Cancelling :meth:`HostBinds.bind` does not recall the bind: it may
  still happen on the host, exactly as a cancelled single call may, and the caller
  undoes it as before (the directory hibernates the agent once its bind ended).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

IN_FLIGHT = 2
"""``bind_many`` calls one host may have outstanding: the first binds of a burst go at
once, the rest gather behind them."""
BATCH = 32
"""Binds per ``bind_many`` call at most: a reply comes when all of its binds ended."""


class HostBinds:
    """Coalesces a directory's binds to one agent host (see the module)."""

    def __init__(
        self,
        handle: Any,
        in_flight: int = IN_FLIGHT,
        batch: int = BATCH,
        on_call: Callable[[int], None] | None = None,
    ) -> None:
        """``handle``: the host's actor handle; ``on_call``: told each call's size."""
        self._handle = handle
        self._on_call = on_call
        self._in_flight_max = max(1, in_flight)
        self._batch = max(1, batch)
        self._queue: list[tuple[Any, dict[str, str] | None, asyncio.Future[Any]]] = []
        self._in_flight = 0
        self._calls: set[asyncio.Task[None]] = set()  # in flight (a task must be held)

    @property
    def queued(self) -> int:
        """Binds waiting for a call (all ``in_flight`` calls are out)."""
        return len(self._queue)

    async def bind(self, spec: Any, trace: dict[str, str] | None = None) -> Any:
        """Bind ``spec`` on the host: its ``bind`` reply, or its error raised."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((spec, trace, future))
        self._send()
        return await future

    def _send(self) -> None:
        while self._queue and self._in_flight < self._in_flight_max:
            batch, self._queue = self._queue[: self._batch], self._queue[self._batch :]
            self._in_flight += 1
            if self._on_call is not None:
                self._on_call(len(batch))
            call = asyncio.ensure_future(self._call(batch))
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)

    async def _call(
        self, batch: list[tuple[Any, dict[str, str] | None, asyncio.Future[Any]]]
    ) -> None:
        try:
            outcomes = await self._handle.bind_many.remote([(s, t) for s, t, _ in batch])
        except BaseException as exc:  # the call failed: every bind in it did
            for _, _, future in batch:
                if future.done():
                    continue
                if isinstance(exc, asyncio.CancelledError):
                    future.cancel()
                else:
                    future.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        else:
            for (_, _, future), (ok, value) in zip(batch, outcomes, strict=True):
                if future.done():  # its caller was cancelled
                    continue
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)
        finally:
            self._in_flight -= 1
            self._send()
