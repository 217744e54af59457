"""Crossing actor boundaries: stream relays and abort receivers.

- :class:`ActorRelay` is the seed's ChunkRelay for a callback that is an actor handle:
  chunks are buffered and sent in batches with at most one Ray call in flight, so a
  consumer that lags receives several chunks per call instead of one call per token.
- :class:`AbortReceiver` is the serializable AbortReceiver: an actor handle plus a run
  id; ``abort()`` reaches the running turn from any process.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import ray
from ray.actor import ActorHandle
from thinkray.actors.errors import (  # re-exported: the errors live in thinkray.actors.errors
    ConsumerGone as ConsumerGone,
)
from thinkray.actors.errors import (
    NotBoundError as NotBoundError,
)
from thinkray.runtime.chunks import UIChunk

log = logging.getLogger("thinkray.relay")


def _has_method(handle: ActorHandle, name: str) -> bool:
    try:
        getattr(handle, name)
    except AttributeError:
        return False
    return True


class ActorRelay:
    """A StreamCallback that forwards to an actor with ``on_chunks(list)`` (preferred)
    or ``on_event(chunk)``, plus ``on_done()`` / ``on_error(str)``."""

    def __init__(self, handle: ActorHandle) -> None:
        self.handle = handle
        self._batched = _has_method(handle, "on_chunks")
        self._buffer: list[UIChunk] = []
        self._pump: asyncio.Task[None] | None = None
        self.failed: BaseException | None = None
        self.calls = 0
        self.sent = 0

    def on_event(self, chunk: UIChunk) -> None:
        """Buffer ``chunk`` and make sure a send is under way (one Ray call at a time).

        Raises:
            ConsumerGone: an earlier send failed: the consumer is gone, detach it.
        """
        if self.failed is not None:
            raise ConsumerGone(str(self.failed))
        self._buffer.append(chunk)
        if self._pump is None or self._pump.done():
            self._pump = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while self._buffer:
            batch, self._buffer = self._buffer, []
            try:
                if self._batched:
                    await self.handle.on_chunks.remote(batch)
                    self.calls += 1
                else:
                    for chunk in batch:
                        await self.handle.on_event.remote(chunk)
                        self.calls += 1
                self.sent += len(batch)
            except Exception as exc:  # consumer died: detach, keep the run going
                log.info("relay consumer failed: %s", exc)
                self.failed = exc
                self._buffer.clear()
                return

    async def drain(self) -> None:
        """Wait until every buffered chunk was sent (or the consumer failed)."""
        while self._pump is not None and not self._pump.done():
            await self._pump
        if self._buffer and self.failed is None:
            await self._run()

    async def on_done(self) -> None:
        """Send what is buffered, then the consumer's ``on_done()`` if it has one."""
        await self.drain()
        if self.failed is None and _has_method(self.handle, "on_done"):
            await self.handle.on_done.remote()

    async def on_error(self, error: str) -> None:
        """Send what is buffered, then the consumer's ``on_error(error)`` if it has one."""
        await self.drain()
        if self.failed is None and _has_method(self.handle, "on_error"):
            await self.handle.on_error.remote(error)


def as_callback(callback: Any) -> Any:
    """Wrap an actor handle in an :class:`ActorRelay`; pass other objects through."""
    if isinstance(callback, ActorHandle):
        return ActorRelay(callback)
    return callback


@dataclass(frozen=True)
class AbortReceiver:
    """Serializable: send it anywhere; ``abort()`` cancels that one run.

    Returns False when the run is unknown or already finished (including when the
    actor has since hibernated: no run survives a hibernation).
    """

    actor: ActorHandle
    agent: str
    run_id: str

    def abort(self, reason: str = "aborted") -> bool:
        """Abort the run with ``reason``, blocking until the actor answered (not for an
        event loop: use :meth:`abort_async` there). False if the run or actor is gone."""
        try:
            return bool(ray.get(self.actor.abort_run.remote(self.agent, self.run_id, reason)))
        except ray.exceptions.RayActorError:
            return False

    async def abort_async(self, reason: str = "aborted") -> bool:
        """:meth:`abort` for async code."""
        try:
            return bool(await self.actor.abort_run.remote(self.agent, self.run_id, reason))
        except ray.exceptions.RayActorError:
            return False
