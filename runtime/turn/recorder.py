"""The recorder: the one consumer always attached to a run (seed 002).

It folds chunks into the assistant message and writes, in batches, the parts that
changed, the chunk log and the model steps' usage. A batch is flushed when its oldest
entry is ``flush_interval`` old — on the next chunk, or by a timer if the stream
stalls — and at the end of the run, so a chunk (or a step's usage) is stored within
about ``flush_interval`` of its emission while storage pays one transaction per batch,
not one per chunk. With many runs streaming in one process that interval stretches
(:attr:`Recorder.progress_interval`), so the batches' cost stays bounded by the
process, not multiplied by its runs. Those timed batches are progress: a store may
keep them from the disk's sync until its next durable write (a crash of the process keeps them; a power
loss may lose what followed the last durable point). Every batch a consumer or a side
effect waits on is durable: the gated chunks of a step's tool calls, a refused call's
result, the last batch. The last batch also prunes old chunk logs: the run's final
message, its usage and the pruning commit together.

The run's last chunk (``finish``, ``abort`` or ``error``) is written only by that last
batch, flagged final: a batch the timer flushes holds it back. So a log whose final
chunk is missing always belongs to a run whose final commit never happened (recovery
at wake closes it as interrupted), never to one a timer happened to flush early.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from thinkray.runtime.chunks import UIChunk
from thinkray.runtime.turn.builder import MessageBuilder
from thinkray.runtime.turn.persistence import PersistCache, enforce_row_size, sanitize_message
from thinkray.storage.protocols import SessionStore
from thinkray.storage.types import ChunkPrune, ChunkWrite, PartWrite, StreamFlush

DEFAULT_FLUSH_INTERVAL = 0.03

PROGRESS_INTERVAL_PER_RUN = 0.002
"""How much each recorder of the process with entries waiting stretches the progress
(timed) flushes' interval: ``max(flush_interval, such recorders x this)``. A progress
flush costs ~0.1-0.2 ms whatever it holds, and every streaming run pays one per
interval: with 250 runs on one event loop (an agent host) at 30 ms, progress flushes
alone took most of a core, and each turn 17-40 of them. Stretched, they stay under
~10% of a core (up to 15 runs nothing changes). The final, tool-call and other durable
batches are not timed and are never delayed."""

_WAITING: weakref.WeakSet[Recorder] = weakref.WeakSet()
"""The recorders of this process with entries not yet flushed: the runs streaming now
(weak: a recorder dropped without :meth:`Recorder.close` stops counting)."""

TERMINAL_CHUNKS = frozenset({"finish", "abort", "error"})
"""The chunk types that end a run's stream: written only with the run's final batch."""


class Deferred(Protocol):
    """Writes that wait for the recorder's next batch (the tool-call ledger's
    :class:`~thinkray.runtime.tools.durable.WriteBehind`): :meth:`drain` runs them
    inside the batch's transaction."""

    @property
    def pending(self) -> bool:
        """Whether writes wait."""
        ...

    def drain(self) -> None:
        """Run the waiting writes (joining the open transaction)."""
        ...


class Recorder:
    """Records one run's assistant message ``message_id`` and chunk log into
    ``session_id`` of ``store`` (see the module). ``cache`` skips unchanged parts;
    ``is_stale`` turns flushes into no-ops once the session was cleared;
    ``record_chunks=False`` keeps no chunk log."""

    def __init__(
        self,
        store: SessionStore,
        session_id: str,
        run_id: str,
        message_id: str,
        *,
        parent_id: str | None,
        cache: PersistCache,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        is_stale: Callable[[], bool] = lambda: False,
        record_chunks: bool = True,
        deferred: Deferred | None = None,
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.run_id = run_id
        self.builder = MessageBuilder(message_id)
        self.parent_id = parent_id
        self.cache = cache
        self.flush_interval = flush_interval
        self.is_stale = is_stale
        self.record_chunks = record_chunks
        self.deferred = deferred
        self._dirty: set[int] = set()
        self._pending_chunks: list[ChunkWrite] = []
        self._pending_usage: list[dict[str, Any]] = []
        self._oldest_pending: float | None = None
        self._chunk_index = 0
        self._inserted = False
        self._timer: asyncio.TimerHandle | None = None
        self.flushes = 0
        self.flush_seconds = 0.0
        self.closed = False

    @property
    def message(self) -> dict[str, Any]:
        """The assistant message as built so far (live, not a copy)."""
        return self.builder.message

    @property
    def chunk_count(self) -> int:
        """How many chunks were recorded (the next chunk's index)."""
        return self._chunk_index

    def continue_message(self, message: dict[str, Any]) -> None:
        """Record this run into ``message``, a stored reply it continues (one cut off
        by a crash), instead of a new one: its parts stay first, this run's follow, and
        its metadata gains ``resumed: True`` (the final metadata wins over the rest)."""
        self.builder.message["parts"] = [dict(p) for p in message.get("parts") or ()]
        self.builder.message["metadata"] = {**(message.get("metadata") or {}), "resumed": True}
        self.builder.metadata_dirty = True
        self.parent_id = None  # it is in the tree already
        self._inserted = True

    def record(self, chunk: UIChunk) -> None:
        """Fold ``chunk`` into the message and queue it for the chunk log; flushes when
        the oldest pending chunk is ``flush_interval`` old."""
        idx = self.builder.apply(chunk)
        if idx is not None:
            self._dirty.add(idx)
        if self.record_chunks:
            self._pending_chunks.append(ChunkWrite(self.run_id, self._chunk_index, chunk))
        self._chunk_index += 1
        self._pending()

    def add_usage(self, usage: dict[str, Any]) -> None:
        """Queue one model step's usage for the session's rollup (written with the
        next batch)."""
        self._pending_usage.append(usage)
        self._pending()

    @property
    def progress_interval(self) -> float:
        """How old the oldest pending entry gets before a progress flush: the
        ``flush_interval``, stretched by the runs streaming in this process (see
        :data:`PROGRESS_INTERVAL_PER_RUN`)."""
        return max(self.flush_interval, PROGRESS_INTERVAL_PER_RUN * len(_WAITING))

    def _pending(self) -> None:
        now = time.monotonic()
        if self._oldest_pending is None:
            self._oldest_pending = now
            _WAITING.add(self)
            self._arm_timer()
        elif now - self._oldest_pending >= self.progress_interval:
            self.flush(durable=False)

    def _nothing_waits(self) -> None:
        """Everything pending was written (or dropped): this run stops counting among
        the process's streaming runs until its next entry."""
        self._oldest_pending = None
        _WAITING.discard(self)

    def _arm_timer(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._timer is None:
            self._timer = loop.call_later(self.progress_interval, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if not self.closed and self._oldest_pending is not None:
            self.flush(durable=False)

    def flush(
        self,
        *,
        final: bool = False,
        parts_length: int | None = None,
        prune: ChunkPrune | None = None,
        durable: bool = True,
    ) -> None:
        """Write what accumulated, in one transaction (with ``prune``, pruning the
        chunk logs in it too). Discards if the session was cleared since the run
        started (the clear-during-stream guard). ``durable`` False: a progress flush
        (the timer's), which the store may make durable with its next durable write
        (see :class:`~thinkray.storage.types.StreamFlush`); the final flush, and one
        carrying the tool-call ledger's writes, are always durable."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.is_stale():
            if self.deferred is not None:
                self.deferred.drain()  # the ledger's writes are not the session's
            self._dirty.clear()
            self._pending_chunks.clear()
            self._pending_usage.clear()
            self._nothing_waits()
            return
        message_id = self.builder.message["id"]
        writes = []
        for idx in sorted(self._dirty):
            part = enforce_row_size(self.builder.part(idx))
            if self.cache.changed(message_id, idx, part):
                writes.append(PartWrite(message_id, idx, part))
        self._dirty.clear()
        held = self._hold_terminal(final)
        # A shrink (parts_length) names its message through the envelope.
        need_envelope = (
            not self._inserted or self.builder.metadata_dirty or parts_length is not None
        )
        if (
            not writes
            and not self._pending_chunks
            and not self._pending_usage
            and not need_envelope
            and parts_length is None
            and prune is None
            and not (self.deferred is not None and self.deferred.pending)
        ):
            self._pending_chunks = held
            self._nothing_waits()
            return
        envelope = None
        if need_envelope:
            m = self.builder.message
            envelope = {"id": m["id"], "role": m["role"], "metadata": m["metadata"], "parts": []}
        started = time.perf_counter()
        flush = StreamFlush(
            session_id=self.session_id,
            message=envelope,
            parent_id=self.parent_id,
            use_head=False,
            parts=writes,
            chunks=self._pending_chunks,
            parts_length=parts_length,
            usage=self._pending_usage,
            prune_chunks=prune,
            durable=durable or final or parts_length is not None or prune is not None,
        )
        if self.deferred is not None and self.deferred.pending:
            # One batch: the ledger's waiting writes and the stream's become durable
            # together (one journal append, or one commit).
            with self.store.batch():
                self.deferred.drain()
                self.store.flush_stream(flush)
        else:
            self.store.flush_stream(flush)
        self.flush_seconds += time.perf_counter() - started
        self.flushes += 1
        self._inserted = True
        self.builder.metadata_dirty = False
        self._pending_chunks = held
        self._pending_usage = []
        self._nothing_waits()

    def _hold_terminal(self, final: bool) -> list[ChunkWrite]:
        """Split off what this batch must not write: from the stream's ending chunk
        on, unless this is the final batch (which flags its last chunk final)."""
        chunks = self._pending_chunks
        if final:
            if chunks:
                chunks[-1].is_final = True
            return []
        for i, write in enumerate(chunks):
            if write.chunk.get("type") in TERMINAL_CHUNKS:
                self._pending_chunks = chunks[:i]
                return chunks[i:]
        return []

    def finish(
        self, metadata: dict[str, Any] | None = None, *, prune: ChunkPrune | None = None
    ) -> dict[str, Any]:
        """Final persist: sanitize, row-size, write what changed (and ``prune`` the
        chunk logs), in one transaction. Returns the message."""
        for idx in self.builder.finalize_streaming():
            self._dirty.add(idx)
        if metadata:
            current = self.builder.message["metadata"] or {}
            current.update(metadata)
            self.builder.message["metadata"] = current
            self.builder.metadata_dirty = True
        snapshot = self.builder.snapshot()
        clean = sanitize_message(snapshot)
        length = None
        if len(clean["parts"]) != len(snapshot["parts"]):
            # Sanitizing removed parts: rewrite the message's parts from scratch.
            self.builder.message["parts"] = clean["parts"]
            self.cache.forget(snapshot["id"])
            self._dirty = set(range(len(clean["parts"])))
            length = len(clean["parts"])
        else:
            for idx, (old, new) in enumerate(zip(snapshot["parts"], clean["parts"], strict=True)):
                if old != new:
                    self.builder.message["parts"][idx] = new
                    self._dirty.add(idx)
        self.flush(final=True, parts_length=length, prune=prune)
        self.close()
        return self.builder.message

    def close(self) -> None:
        """Stop the flush timer; nothing pending is written (call :meth:`finish` or
        :meth:`flush` first)."""
        self.closed = True
        _WAITING.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
