"""Live run streams: one log per run, any number of consumers, replay from index 0.

A consumer that attaches mid-run (or reconnects) gets every chunk from index 0 and
then the live tail, exactly once and contiguous (seed 002 "Resume across renderer
disconnect"). A consumer that goes away detaches; it never cancels the run.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from thinkray.runtime.chunks import UIChunk


class RunStream:
    """The chunk log of one run plus wake-ups for tailing consumers."""

    def __init__(self, run_id: str, session_id: str, message_id: str | None = None) -> None:
        self.run_id = run_id
        self.session_id = session_id
        self.message_id = message_id
        self.chunks: list[UIChunk] = []
        self.done = False
        self.error: str | None = None
        self._waiters: list[asyncio.Future[None]] = []

    def push(self, chunk: UIChunk) -> None:
        """Append ``chunk`` to the log and wake the tailing consumers."""
        self.chunks.append(chunk)
        self._wake()

    def close(self, error: str | None = None) -> None:
        """Mark the run done (``error``: why it failed) and wake the consumers."""
        self.done = True
        self.error = error
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def wait_beyond(self, index: int) -> None:
        """Return once there are more than ``index`` chunks or the run is done."""
        while len(self.chunks) <= index and not self.done:
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            await fut

    async def follow(
        self, start: int = 0, max_batch: int = 2048, coalesce: float = 0.0
    ) -> AsyncIterator[list[UIChunk]]:
        """Batches of chunks from ``start``: whatever accumulated since the last batch.

        Batching is what lets a slow consumer (a Ray call per batch) keep up: the
        faster the producer, the larger each batch. ``coalesce`` waits that long after
        a batch before taking the next, trading that much latency for fewer items
        across a process boundary.
        """
        index = start
        while True:
            await self.wait_beyond(index)
            # The first batch goes at once (time to first chunk); later ones gather.
            if (
                coalesce
                and index > start
                and not self.done
                and len(self.chunks) - index < max_batch
            ):
                await asyncio.sleep(coalesce)
            if index < len(self.chunks):
                batch = self.chunks[index : index + max_batch]
                index += len(batch)
                yield batch
                continue
            if self.done:
                return

    async def __aiter__(self) -> AsyncIterator[UIChunk]:  # pragma: no cover - convenience
        async for batch in self.follow():
            for chunk in batch:
                yield chunk
