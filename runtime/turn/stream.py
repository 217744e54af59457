"""Live run streams: one log per run, any number of consumers, replay from index 0.

A consumer that attaches mid-run (or reconnects) gets every chunk from index 0 and
then the live tail, exactly once and contiguous (seed 002 "Resume across renderer
disconnect"). A consumer that goes away detaches; it never cancels the run.
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from collections.abc import AsyncIterator

from thinkray.runtime.chunks import UIChunk

# Chunks that carry content a reader waits for (the first of them is the time to first
# token): a relay never holds one back to gather more.
_CONTENT = frozenset(
    {"text-delta", "reasoning-delta", "tool-input-start", "tool-input-available", "error"}
)

_FOLLOWERS = itertools.count()


_RELAYING: weakref.WeakSet[Pacing] = weakref.WeakSet()
"""The paced relays following a run in this process now (see :class:`Pacing`)."""


class Pacing:
    """How long a relay gathers chunks into one batch: ``base`` while its consumer
    keeps up, longer as the consumer takes longer to come back for the next batch (a
    busy process or machine: each batch costs it a Ray item), or as more relays of the
    process stream at once (``per_stream`` each), up to ``limit``.

    The window is the largest of ``base``, ``factor`` times a moving average of those
    take times, and ``per_stream`` times the relays streaming in the process, so the
    cost of relaying falls as load rises instead of feeding it. A model streams a token
    every 10-30 ms: a window shorter than that sends each chunk as its own Ray item,
    which costs the agent's process and the caller's ~0.1-0.2 ms each (100 W2 streams:
    173 items per 200-chunk turn, ~40 ms of the caller's CPU per turn). With the
    process's streams counted, one process sends at most ~1 / ``per_stream`` items a
    second however many streams it relays; a lone stream keeps ``base``. The first
    content chunk of a stream is never held (see :meth:`RunStream.follow`)."""

    def __init__(
        self,
        base: float = 0.002,
        limit: float = 0.1,
        factor: float = 4.0,
        per_stream: float = 0.001,
    ) -> None:
        self.base = base
        self.limit = limit
        self.factor = factor
        self.per_stream = per_stream
        self.average = 0.0

    def window(self) -> float:
        """Seconds to gather the next batch."""
        crowd = self.per_stream * len(_RELAYING)
        return min(self.limit, max(self.base, self.factor * self.average, crowd))

    def took(self, seconds: float) -> None:
        """The consumer came back ``seconds`` after it was handed a batch."""
        self.average += 0.3 * (seconds - self.average)


class RunStream:
    """The chunk log of one run plus wake-ups for tailing consumers.

    Followers that coalesce (a relay across a process boundary) gather chunks for up
    to ``coalesce`` seconds per batch, except that the first content chunk (a text or
    reasoning delta, a tool call starting: what a reader waits for) ends its batch at
    once; :meth:`drain` ends every gathering early and :meth:`delivered` waits until
    the followers took everything, so a producer about to block (a storage commit)
    lets what is buffered go out first.
    """

    def __init__(self, run_id: str, session_id: str, message_id: str | None = None) -> None:
        self.run_id = run_id
        self.session_id = session_id
        self.message_id = message_id
        self.chunks: list[UIChunk] = []
        self.done = False
        self.error: str | None = None
        self._waiters: list[asyncio.Future[None]] = []
        self._gathering: list[asyncio.Future[None]] = []
        self._awaiting_content: list[asyncio.Future[None]] = []
        self._positions: dict[int, int] = {}  # follower -> chunks it has taken
        self._taken: asyncio.Event | None = None
        self._draining = False  # within delivered(): followers do not gather

    def push(self, chunk: UIChunk) -> None:
        """Append ``chunk`` to the log and wake the tailing consumers."""
        self.chunks.append(chunk)
        self._wake()
        if self._awaiting_content and chunk.get("type") in _CONTENT:
            waiting, self._awaiting_content = self._awaiting_content, []
            for fut in waiting:
                _resolve(fut)

    def close(self, error: str | None = None) -> None:
        """Mark the run done (``error``: why it failed) and wake the consumers."""
        self.done = True
        self.error = error
        self._wake()
        self.drain()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def drain(self) -> None:
        """Followers gathering a batch send it now."""
        gathering, self._gathering = self._gathering, []
        waiting, self._awaiting_content = self._awaiting_content, []
        for fut in (*gathering, *waiting):
            _resolve(fut)

    async def delivered(self, timeout: float = 0.002) -> None:
        """Drain, then wait (at most ``timeout``) until every follower has taken every
        chunk pushed so far. Returns at once when nobody follows."""
        self.drain()
        self._draining = True
        try:
            deadline = asyncio.get_running_loop().time() + timeout
            while any(pos < len(self.chunks) for pos in self._positions.values()):
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    return
                self._taken = self._taken or asyncio.Event()
                self._taken.clear()
                try:
                    await asyncio.wait_for(self._taken.wait(), remaining)
                except TimeoutError:
                    return
            # One more turn of the loop: the follower's consumer sends what it took.
            await asyncio.sleep(0)
        finally:
            self._draining = False

    async def wait_beyond(self, index: int) -> None:
        """Return once there are more than ``index`` chunks or the run is done."""
        while len(self.chunks) <= index and not self.done:
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            await fut

    async def _gather(self, seconds: float, until_content: bool) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._gathering.append(fut)
        if until_content:
            self._awaiting_content.append(fut)
        timer = asyncio.get_running_loop().call_later(seconds, _resolve, fut)
        try:
            await fut
        finally:
            timer.cancel()

    async def follow(
        self, start: int = 0, max_batch: int = 2048, coalesce: float | Pacing = 0.0
    ) -> AsyncIterator[list[UIChunk]]:
        """Batches of chunks from ``start``: whatever accumulated since the last batch.

        Batching is what lets a slow consumer (a Ray call per batch) keep up: the
        faster the producer, the larger each batch. ``coalesce`` waits up to that long
        before taking a batch, trading that much latency for fewer items across a
        process boundary; the first content chunk and :meth:`drain` end the wait (see
        the class). A :class:`Pacing` sets the window from how fast the consumer takes
        batches.
        """
        pacing = coalesce if isinstance(coalesce, Pacing) else None
        fixed = coalesce if not isinstance(coalesce, Pacing) else 0.0
        index = start
        key = next(_FOLLOWERS)
        self._positions[key] = index
        content_sent = False
        if pacing is not None:
            _RELAYING.add(pacing)
        try:
            while True:
                await self.wait_beyond(index)
                if (
                    coalesce
                    and not self.done
                    and not self._draining
                    and len(self.chunks) - index < max_batch
                    and not (
                        not content_sent
                        and any(c.get("type") in _CONTENT for c in self.chunks[index:])
                    )
                ):
                    window = pacing.window() if pacing is not None else fixed
                    await self._gather(window, until_content=not content_sent)
                if index < len(self.chunks):
                    batch = self.chunks[index : index + max_batch]
                    index += len(batch)
                    self._positions[key] = index
                    if self._taken is not None:
                        self._taken.set()
                    content_sent = content_sent or any(
                        chunk.get("type") in _CONTENT for chunk in batch
                    )
                    handed = asyncio.get_running_loop().time()
                    yield batch
                    if pacing is not None:
                        pacing.took(asyncio.get_running_loop().time() - handed)
                    continue
                if self.done:
                    return
        finally:
            if pacing is not None:
                _RELAYING.discard(pacing)
            self._positions.pop(key, None)
            if self._taken is not None:
                self._taken.set()

    async def __aiter__(self) -> AsyncIterator[UIChunk]:  # pragma: no cover - convenience
        async for batch in self.follow():
            for chunk in batch:
                yield chunk


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
