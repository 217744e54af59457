"""The turn runner: one run per session, each with its own state (seed 000 §1–9).

A turn:

1. validate and idempotently append the user message, load the history into the
   run's own :class:`~thinkray.runtime.agents.runs.ChatOptions` (``options.history``);
2. give the run its own abort controller (chained to the caller's signal);
3. run the agent's ``prepare_turn`` hook (compaction, say), then ``on_chat_message`` —
   by default the agentic loop over ``assemble_context(options)``;
4. fold every chunk into the assistant message, write it in batches (recorder),
   append it to the run's replayable stream and deliver it to the callback;
5. on completion, abort or error persist what was produced (sanitized, row-capped,
   unchanged parts skipped), enforce ``max_persisted_messages``, and report.

Nothing of a turn is kept on the agent: the runner's maps only index runs in flight
by id and by session, so turns of different sessions on one agent run side by side.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from thinkray.runtime.abort import AbortController, AbortError, AbortSignal, abortable
from thinkray.runtime.agents import model_switch
from thinkray.runtime.agents.midturn import STEER_CHUNK, BusyPolicy, TurnQueue, check_policy, decide
from thinkray.runtime.agents.recovery import INTERRUPTED_ERROR, close_stream_of_stopped_run
from thinkray.runtime.agents.replay import Answered, answer_chunks, check_resent
from thinkray.runtime.agents.runs import ChatOptions, ChatResult, RunState, RunStatus
from thinkray.runtime.agents.runs import StreamCallback as StreamCallback
from thinkray.runtime.chunks import FinishChunk, UIChunk, is_data_chunk
from thinkray.runtime.errors import (
    DuplicateRunError as DuplicateRunError,
)
from thinkray.runtime.errors import (  # re-exported: the errors live in thinkray.runtime.errors
    NothingToAnswerError as NothingToAnswerError,
)
from thinkray.runtime.messages import Role, new_id, parse_message
from thinkray.runtime.models.base import ModelError
from thinkray.runtime.observability import logs, tracing
from thinkray.runtime.observability.metrics import metrics
from thinkray.runtime.observability.tracing import TurnTrace
from thinkray.runtime.status import SessionBusyError, SessionStatus, StatusBoard
from thinkray.runtime.tools.base import Tool
from thinkray.runtime.turn.loop import LoopHooks, LoopResult
from thinkray.runtime.turn.persistence import (
    PersistCache,
    check_message_size,
    enforce_row_size,
    prepare_message,
)
from thinkray.runtime.turn.recorder import TERMINAL_CHUNKS, Recorder
from thinkray.runtime.turn.stream import RunStream
from thinkray.runtime.usage import Usage
from thinkray.storage.journal import typical_sync_seconds
from thinkray.storage.types import ChunkPrune, PartWrite, StreamFlush

if TYPE_CHECKING:
    from thinkray.runtime.agents.think import Think

log = logging.getLogger("thinkray.think")
T = TypeVar("T")

OFF_LOOP_SYNC = 0.001
"""How long this process's journal syncs must have taken lately (seconds) for a turn
of an agent with ``syncs_off_loop`` to sync in a worker thread (``TurnRunner._durably``)."""

_live_turns = [0]
"""Turns running in this process (their tasks not done): every agent's, on the one loop
an agent host runs them on."""


def _turn_done(task: asyncio.Future[Any]) -> None:
    _live_turns[0] -= 1


SYNC_THREADS = 8
"""Threads that wait for the disk for turns syncing off their loop (per process)."""


@functools.cache
def _sync_pool() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(SYNC_THREADS, thread_name_prefix="thinkray-sync")


# How many chunk logs beyond keep_chunk_logs may wait for the next pruning.
PRUNE_SLACK = 2

ORPHAN_ERROR = "aborted by restart: the tool call did not complete before the agent restarted"

__all__ = ["ORPHAN_ERROR", "DuplicateRunError", "NothingToAnswerError", "TurnRunner"]


class TurnRunner:
    """Runs the turns of one agent and keeps the index of runs in flight.

    Takes the agent (its override points and hooks are called here) and the status
    board. Guarantees: at most one run per session (a second raises
    :class:`SessionBusyError`, never interleaves); a session held by
    :meth:`reserve` refuses turns; clearing or deleting a session aborts its run and
    discards the run's pending writes."""

    def __init__(self, agent: Think, status: StatusBoard) -> None:
        self.agent = agent
        self.status = status
        self.persist_cache = PersistCache()
        self.runs: dict[str, RunState] = {}
        self.session_runs: dict[str, str] = {}  # session id -> run id in flight
        self.reserved: dict[str, str] = {}  # session id -> operation (reserve)
        self.last_stream: dict[str, RunStream] = {}
        self.clear_generation: dict[str, int] = {}
        # Finished runs' results, newest last (bounded by the agent's recent_results).
        self.results: OrderedDict[str, ChatResult] = OrderedDict()
        # Messages sent while their session was busy (the busy policy; midturn).
        self.queue = TurnQueue(self)
        # A steered message's own run id -> the run it joined (abort reaches that run).
        self.aliases: dict[str, str] = {}

    # -- the index of runs ------------------------------------------------------------

    def active_run(self, session_id: str | None) -> str | None:
        """The run id in flight on ``session_id``, or None."""
        return self.session_runs.get(session_id) if session_id else None

    def ensure_idle(self, session_id: str) -> None:
        """Raise :class:`SessionBusyError` while ``session_id`` has a run in flight
        (status ``busy`` or ``retrying``; an ``error`` status is a finished run)."""
        run_id = self.session_runs.get(session_id)
        if run_id is not None or self.status.get(session_id).state in ("busy", "retrying"):
            raise SessionBusyError(session_id, run_id)

    def invalidate(self, session_id: str, reason: str) -> None:
        """The session was cleared or deleted: abort its run and make the run's
        pending writes stale (they are discarded, never land in the new state)."""
        self.clear_generation[session_id] = self.clear_generation.get(session_id, 0) + 1
        self.queue.cancel_session(session_id, reason)
        run_id = self.session_runs.get(session_id)
        if run_id is not None:
            self.runs[run_id].controller.abort(reason)

    def abort(self, session_id: str | None, run_id: str | None, reason: str) -> bool:
        """Abort the run in flight (by run id, else the session's). False if none. A
        waiting message's run id cancels that message (it never runs)."""
        if run_id is not None:
            if self.queue.cancel(run_id, reason):
                return True
            run_id = self.aliases.get(run_id, run_id)
        if run_id is None:
            run_id = self.session_runs.get(session_id) if session_id else None
        run = self.runs.get(run_id) if run_id else None
        if run is None:
            return False
        return run.controller.abort(reason)

    def abort_all(self, reason: str) -> None:
        """Abort every run in flight."""
        for run in list(self.runs.values()):
            run.controller.abort(reason)

    def interrupt_all(self) -> None:
        """The agent closes under its runs (a forced hibernation): each ends now as a
        crash would end it, with nothing more written after this. What it recorded is
        flushed; its tool calls' rows say what a wake would say (they die with it);
        its stream gets the chunks the wake's recovery will store for it, ending in
        the same ``error``, so a live consumer and a later replay see one ending."""
        self.queue.close()
        runs = list(self.runs.values())
        if not runs:
            return
        agent = self.agent
        for run in runs:
            recorder = run.recorder
            if recorder is not None and not recorder.closed:
                ended = bool(run.stream.chunks) and _is_terminal(run.stream.chunks[-1])
                recorder.flush(final=ended)  # a run past its last chunk completes
                recorder.close()
            for chunk in run.gated:  # flushed just now: the live stream gets them too
                run.stream.push(chunk)
            run.gated.clear()
        agent.tool_calls.recover(agent._tool_policies())
        agent.tool_calls.cancel_unreleased([r.run_id for r in runs], INTERRUPTED_ERROR)
        for run in runs:
            closing: list[UIChunk] = []
            if not (run.stream.chunks and _is_terminal(run.stream.chunks[-1])):
                closing = close_stream_of_stopped_run(
                    agent.store, run.session_id, run.run_id, agent._call_outcome
                )
            # Its task, cancelled, must write nothing more: its pending writes are stale.
            # Cancelled, not aborted: an abort is handled by writing (the abort chunk,
            # the calls' cancellations), and a crash does not abort sub-agents either.
            self.clear_generation[run.session_id] = self.clear_generation.get(run.session_id, 0) + 1
            if run.task is not None:
                run.task.cancel()
            for chunk in closing:
                run.stream.push(chunk)
            self._end_run(run, "interrupted", INTERRUPTED_ERROR if closing else None)

    @contextlib.contextmanager
    def reserve(self, session_id: str, operation: str = "reserved") -> Iterator[None]:
        """See :meth:`Think.reserve_session`."""
        holder = self.session_runs.get(session_id) or self.reserved.get(session_id)
        if holder is not None:
            raise SessionBusyError(session_id, holder)
        previous = self.status.get(session_id)
        self.reserved[session_id] = operation
        self.status.set(
            session_id,
            SessionStatus(state="busy", started_at=int(time.time() * 1000), message=operation),
        )
        try:
            yield
        finally:
            del self.reserved[session_id]
            self.status.set(session_id, previous)
            self._drain_soon(session_id)

    def _drain_soon(self, session_id: str) -> None:
        """The session is free: its next waiting message starts (on the next loop
        iteration, after whoever freed it finished its own step)."""
        if self.queue.closing or not self.queue.has_waiting(session_id):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a synchronous close): the next wake drains it
        loop.call_soon(self.queue.drain, session_id)

    def own_turn(self, session_id: str) -> RunState | None:
        """See :meth:`Think.own_turn`."""
        run = self.runs.get(self.session_runs.get(session_id, ""))
        if run is None or run.prepared or run.task is not asyncio.current_task():
            return None
        return run

    def run_stream(self, session_id: str) -> RunStream | None:
        """The session's current run's stream, else its last finished run's."""
        run_id = self.session_runs.get(session_id)
        if run_id is not None:
            return self.runs[run_id].stream
        return self.last_stream.get(session_id)

    def _check_new_run_id(self, run_id: str) -> None:
        """A caller-chosen run id must be new: a run in flight, a recent result or a
        stored chunk log under it would mix two runs' chunks (DuplicateRunError)."""
        if run_id in self.runs:
            raise DuplicateRunError(f"run id {run_id!r} is already in flight")
        if run_id in self.results or run_id in self.agent.store.chunk_generations():
            raise DuplicateRunError(f"run id {run_id!r} was used by an earlier run: pick a new one")

    def stream_of(self, run_id: str) -> RunStream | None:
        """The stream of a run in flight or of a session's last finished run."""
        run = self.runs.get(run_id)
        if run is not None:
            return run.stream
        for stream in self.last_stream.values():
            if stream.run_id == run_id:
                return stream
        return None

    # -- starting a turn --------------------------------------------------------------

    def start(
        self,
        message: str | dict[str, Any] | None,
        callback: StreamCallback | None,
        *,
        session_id: str | None,
        signal: AbortSignal | None,
        tools: dict[str, Tool] | None,
        run_id: str | None,
        role: Role,
        on_busy: BusyPolicy | None = None,
    ) -> RunState:
        """Validate, register and start a turn as a task; returns its RunState at once.
        A session that is busy applies ``on_busy`` (default: the agent's; see
        :mod:`~thinkray.runtime.agents.midturn`): the returned run may be waiting.

        Raises before anything is written: an invalid or oversized message
        (``MessageTooLargeError``), an unknown busy policy, an unknown session, a busy
        or reserved session (policy ``reject``), an empty session with no message, a
        run id in use."""
        agent = self.agent
        policy = check_policy(on_busy if on_busy is not None else agent.on_busy)
        user_msg = parse_message(message, role=role) if message is not None else None
        if user_msg is not None:
            check_message_size(user_msg, agent.max_user_message_bytes)
        if session_id is None and agent.sessions.current_id is None:
            # A new session is made durable with the user message's write (_prepare):
            # one sync for both, before the model is called.
            with agent.store.defer_syncs() if user_msg is not None else contextlib.nullcontext():
                session_id = agent.sessions.create().id
        sid = agent.sessions.resolve(session_id)
        agent.store.get_session(sid)  # unknown id: a clear error, never a silent create
        if user_msg is not None:
            known = self._known(sid, user_msg["id"], follow=policy != "reject")
            if known is not None:
                return known
        action = decide(
            policy,
            running=sid in self.session_runs,
            reserved=sid in self.reserved,
            waiting=len(self.queue.waiting.get(sid, ())),
            has_message=user_msg is not None,
        )
        if action == "reject":
            raise SessionBusyError(sid, self._holder(sid))
        if user_msg is None and not agent.store.message_count(sid):
            raise NothingToAnswerError(
                "nothing to answer: the session is empty and no message was given"
            )
        # A message id is the turn's idempotency key: a resent one replays its answer
        # (under the caller's run id too: a replay writes no chunk log to mix).
        answered = check_resent(agent.store, sid, user_msg["id"]) if user_msg else None
        message_id = (self._interrupted_reply(sid) if user_msg is None else None) or new_id("msg")
        if run_id is not None and (run_id in self.runs or run_id in self.queue.by_run):
            raise DuplicateRunError(f"run id {run_id!r} is already in flight")
        if answered is not None:
            return self._replay(sid, run_id or new_id("run"), answered, callback)
        if run_id is not None:
            self._check_new_run_id(run_id)
        if action != "run":
            assert user_msg is not None  # decide() rejects a rerun of a busy session
            return self.queue.enqueue(
                sid,
                user_msg,
                action,
                run_id=run_id,
                signal=signal,
                callback=callback,
                tools=tools or {},
            )
        run_id = run_id or new_id("run")
        controller = AbortController(parent=signal)
        run = RunState(run_id, sid, controller, RunStream(run_id, sid, message_id))
        self.launch(run, user_msg, callback, tools or {})
        return run

    def launch(
        self,
        run: RunState,
        user_msg: dict[str, Any] | None,
        callback: StreamCallback | None,
        tools: dict[str, Tool],
    ) -> None:
        """Register ``run`` as its session's run in flight and start its turn task."""
        sid = run.session_id
        run.user_message_id = user_msg["id"] if user_msg is not None else None
        self.runs[run.run_id] = run
        self.session_runs[sid] = run.run_id
        self.status.busy(sid, run.run_id)
        run.task = asyncio.ensure_future(self._turn(run, user_msg, callback, tools))
        _live_turns[0] += 1
        run.task.add_done_callback(_turn_done)

    def _holder(self, sid: str) -> str | None:
        """What holds a busy session: its run, its reservation, or its first waiting
        message's run."""
        held = self.session_runs.get(sid) or self.reserved.get(sid)
        if held is None and self.queue.waiting.get(sid):
            entries = self.queue.pending(sid)
            held = entries[0]["run_id"] if entries else None
        return held

    def _known(self, sid: str, message_id: str, *, follow: bool) -> RunState | None:
        """A message id already queued here, or (``follow``) in flight: the same turn
        again (a resend follows it, never starts a second), or a queued message's
        outcome. Under ``reject`` a resend of the run in flight stays refused as busy."""
        known = self.queue.existing(sid, message_id)
        if known is not None or not follow:
            return known
        run = self.runs.get(self.session_runs.get(sid, ""))
        if run is None or run.user_message_id != message_id or run.task is None:
            return None
        follower = RunState(run.run_id, sid, run.controller, run.stream)
        follower.task = asyncio.ensure_future(_shielded(run.task))
        return follower

    def replay_answer(self, sid: str, answered: Answered) -> RunState:
        """A run that replays ``answered`` (see :meth:`_replay`) under a new run id."""
        return self._replay(sid, new_id("run"), answered, None)

    def _replay(
        self, sid: str, run_id: str, answered: Answered, callback: StreamCallback | None
    ) -> RunState:
        """A run that runs nothing: its stream is the answer's chunks, already closed,
        and its result the stored answer (``replayed``). It never holds the session."""
        answer = answered.answer
        chunks = answer_chunks(self.agent.store, list(self.last_stream.values()), answer)
        metadata = answer.get("metadata") or {}
        status = metadata.get("status")
        ended = [c for c in chunks if c.get("type") == "error"]
        error = str(ended[-1].get("errorText") or "error") if ended else None
        stream = RunStream(run_id, sid, answer["id"])
        for chunk in chunks:
            stream.push(chunk)
        stream.close(error if status == "error" else None)
        run = RunState(run_id, sid, AbortController(), stream)
        result = ChatResult(
            run_id=run_id,
            session_id=sid,
            message_id=answer["id"],
            status=status if status in ("completed", "aborted", "error") else "completed",
            message=answer,
            error=error if status == "error" else None,
            finish_reason=metadata.get("finishReason"),
            usage=dict(metadata.get("usage") or {}),
            user_message_id=answered.message_id,
            replayed=True,
        )
        self.results[run_id] = result  # wait_run(run_id) answers like for any run
        while len(self.results) > max(self.agent.recent_results, 0):
            self.results.popitem(last=False)
        run.task = asyncio.ensure_future(_deliver(stream.chunks, callback, result))
        return run

    def _interrupted_reply(self, session_id: str) -> str | None:
        """The id of the session's last message when it is an assistant reply cut off
        by a crash (``status: interrupted``): a turn answering the history as it is
        (a resumed generation) continues that message, so one user message keeps one
        reply."""
        history = self.agent.store.get_history(session_id)
        last = history[-1] if history else None
        if last is None or last.get("role") != "assistant":
            return None
        status = (last.get("metadata") or {}).get("status")
        return str(last["id"]) if status == "interrupted" else None

    # -- the turn ---------------------------------------------------------------------

    async def _turn(
        self,
        run: RunState,
        user_msg: dict[str, Any] | None,
        callback: StreamCallback | None,
        tools: dict[str, Tool],
    ) -> ChatResult:
        t = _Turn(self, run, callback)
        # This task's records carry the turn's ids; its spans hang under invoke_agent.
        logs.enter_turn(t.agent_name, t.namespace, t.sid, run.run_id)
        if t.observed and tracing.enabled():
            t.trace = self._start_trace(run, t.agent_name, t.namespace)
        try:
            options, recorder = await self._prepare(t, user_msg, tools)
            await self._stream(t, options, recorder)
        except AbortError as exc:
            t.status = "aborted"
            self.agent.tool_calls.cancel_run(
                run.run_id, "cancelled-by-user", f"aborted: {exc.reason}"
            )
            if t.recorder is not None:
                await self._stop_stream(
                    t, t.recorder, f"aborted: {exc.reason}", {"type": "abort", "reason": exc.reason}
                )
        except asyncio.CancelledError:
            # The hosting task was cancelled (actor shutdown): persist what we have.
            self._end_cancelled(t)
            raise
        except Exception as exc:
            t.status = "error"
            replaced = await self.agent.on_chat_error(exc)
            t.error_text = error_text = str(replaced) or type(exc).__name__
            # An upstream failure ends the turn's open tool calls too.
            self.agent.tool_calls.cancel_run(
                run.run_id, "cancelled-by-error", f"error: {error_text}"
            )
            log.warning("run %s failed: %s", run.run_id, error_text)
            if t.recorder is not None:
                await self._stop_stream(
                    t,
                    t.recorder,
                    f"error: {error_text}",
                    {"type": "error", "errorText": error_text},
                )
        message = await self._persist(t)
        await self._end_turn(t)
        return self._keep_result(t, message)

    async def _prepare(
        self, t: _Turn, user_msg: dict[str, Any] | None, tools: dict[str, Tool]
    ) -> tuple[ChatOptions, Recorder]:
        """The turn up to its first chunk: the user message stored (once), the model
        chosen, the options built, ``prepare_turn`` run and the recorder opened."""
        agent, store, sid, run = self.agent, t.store, t.sid, t.run
        if user_msg is not None:
            user_msg = await agent.on_user_message(sid, user_msg)
            user_msg = prepare_message(user_msg)
            t.user_id = user_msg["id"]
        # This turn's model (seed 002 per-turn switch): resolved and fitted to its
        # context window before the message lands, so a refused switch writes nothing.
        run.model, run.model_selection = await model_switch.prepare_turn_model(agent, sid, user_msg)
        if user_msg is not None:
            # Durable before the model is called: the turn's exactly-once anchor.
            await self._durably(lambda: _store_user_message(store, sid, user_msg))
        history = store.get_history(sid)
        if self.finalize_orphaned_tool_calls(sid, history):
            history = store.get_history(sid)
        options = ChatOptions(
            session_id=sid,
            run_id=run.run_id,
            message_id=run.stream.message_id or new_id("msg"),
            signal=t.signal,
            tools=tools,
            hooks=t.loop_hooks(),
            result=t.result,
            request_options=agent.get_request_options(),
            model=run.model,
            model_selection=run.model_selection,
            user_message_id=t.user_id,
            history=history,
            emitter=run.emit,
        )
        t.options = options
        run.options = options
        if await agent.prepare_turn(options):
            options.history = store.get_history(sid)
        recorder = Recorder(
            store,
            sid,
            run.run_id,
            options.message_id,
            parent_id=options.history[-1]["id"] if options.history else None,
            cache=self.persist_cache,
            flush_interval=agent.flush_interval,
            is_stale=t.stale,
            deferred=agent.tool_calls.behind,
        )
        if options.history and options.history[-1]["id"] == options.message_id:
            recorder.continue_message(options.history[-1])  # see _interrupted_reply
        t.recorder = recorder
        run.recorder = recorder
        run.prepared = True
        return options, recorder

    async def _stream(self, t: _Turn, options: ChatOptions, recorder: Recorder) -> None:
        """Relay the agent's chunks (recorded, then sent); the turn ends with a
        ``finish`` carrying the stored metadata, held while the turn is not durable."""
        run, sid = t.run, t.sid
        async for chunk in abortable(self.agent.on_chat_message(options), t.signal):
            if t.first_chunk is None and chunk["type"] in CONTENT_CHUNKS:
                t.first_chunk = time.perf_counter()
            if self.status.get(sid).state == "retrying":
                self.status.busy(sid, run.run_id)
            if not is_data_chunk(chunk) and chunk["type"] == "finish":
                # The finish chunk carries the metadata that is stored (usage,
                # model, finish reason, status), as the AI SDK's messageMetadata.
                t.finish_reason = chunk.get("finishReason") or t.result.finish_reason
                t.final_metadata = self._final_metadata(
                    run, options, "completed", t.step_usage, t.finish_reason
                )
                chunk = _finish_chunk(chunk, t.final_metadata)
            t.callback = await self._emit(run, recorder, t.callback, chunk, t.held)
            if run.sink is None:
                await t.open_stream()
        if run.sink is None:
            await t.open_stream()
        if t.final_metadata is None:  # the turn yielded no finish: it ends with one
            t.finish_reason = t.result.finish_reason
            t.final_metadata = self._final_metadata(
                run, options, "completed", t.step_usage, t.finish_reason
            )
            t.callback = await self._emit(
                run,
                recorder,
                t.callback,
                _finish_chunk({"type": "finish"}, t.final_metadata),
                t.held,
            )

    async def _stop_stream(
        self, t: _Turn, recorder: Recorder, call_error: str, last: UIChunk
    ) -> None:
        """End the stream of a turn that was aborted or failed (``last``: its
        ``abort`` or ``error`` chunk), with its final metadata (status ``t.status``)."""
        if t.run.sink is None:
            await t.open_stream()
        t.final_metadata = self._final_metadata(t.run, t.options, t.status, t.step_usage, None)
        t.callback = await self._end_stream(
            t.run, recorder, t.callback, call_error, t.final_metadata, last
        )

    def _end_cancelled(self, t: _Turn) -> None:
        """A cancelled turn's ending: what it recorded is persisted, it reports
        ``aborted`` and its callback hears nothing more (the task is going away)."""
        if t.recorder is not None:
            metadata = self._final_metadata(t.run, t.options, "aborted", t.step_usage, None)
            self._finish_recorder(t.recorder, t.run, metadata, t.stale)
            t.recorder = None
        self._end_run(t.run, "aborted")
        if t.observed:
            self._observe("aborted", t.started, t.first_chunk)
        if t.trace is not None:
            t.trace.end("aborted", None, t.step_usage, t.result.steps, None)

    async def _persist(self, t: _Turn) -> dict[str, Any] | None:
        """The final persist of the assistant message (None without a recorder, or
        when the session was cleared under the turn)."""
        if t.recorder is None:
            return None
        if t.final_metadata is None:
            t.final_metadata = self._final_metadata(
                t.run, t.options, t.status, t.step_usage, t.finish_reason
            )
        # The final commit blocks this loop for a few ms: let relays send what is
        # buffered (the stream's last chunks) first.
        await t.run.stream.delivered()
        recorder, metadata = t.recorder, t.final_metadata
        return await self._durably(
            lambda: self._finish_recorder(recorder, t.run, metadata, t.stale)
        )

    async def _durably(self, write: Callable[[], T]) -> T:
        """``write()``, durable once this returns (with what earlier deferred writes
        owe). With ``syncs_off_loop``, another turn running in this process and a disk
        whose syncs take :data:`OFF_LOOP_SYNC` or more, the journal's sync runs in a
        worker thread, so the other agents on this loop go on meanwhile. Otherwise it
        syncs in place: the hop costs ~0.2 ms and more when the thread pool is busy (a
        lone in-process turn took 0.4 ms longer, a tenth; on this machine's ~0.3 ms
        syncs, W2's bound turns 40-90 ms longer at p95 with 100 of them at once)."""
        if not (
            self.agent.syncs_off_loop
            and _live_turns[0] > 1
            and typical_sync_seconds() >= OFF_LOOP_SYNC
        ):
            return write()
        with self.agent.store.defer_syncs():
            result = write()
        # A pool of its own: in the default one, a host's syncs queued behind its binds'
        # file opens and its blocking tools.
        await asyncio.get_running_loop().run_in_executor(
            _sync_pool(), self.agent.store.sync_deferred
        )
        return result

    async def _end_turn(self, t: _Turn) -> None:
        """After the final persist: made durable (the held finish released), the run
        ended, metrics and span closed, then the callback told."""
        if t.make_durable is not None and t.held is not None:
            t.status, t.error_text, t.callback = await self._acknowledge(
                t.run, t.callback, t.make_durable, t.held, t.status, t.error_text
            )
        self._end_run(t.run, t.status, t.error_text)
        if t.observed:
            self._observe(t.status, t.started, t.first_chunk)
        if t.trace is not None:
            t.trace.end(t.status, t.error_text, t.step_usage, t.result.steps, t.finish_reason)
        if t.callback is not None:
            if t.status == "error":
                await _call(t.callback, "on_error", t.error_text)
            else:
                await _call(t.callback, "on_done")

    def _keep_result(self, t: _Turn, message: dict[str, Any] | None) -> ChatResult:
        """The turn's result, kept among the recent ones (``wait_run``)."""
        run = t.run
        outcome = ChatResult(
            run_id=run.run_id,
            session_id=t.sid,
            message_id=run.stream.message_id or "",
            status=t.status,
            message=message,
            error=t.error_text,
            finish_reason=t.finish_reason,
            usage=t.step_usage.to_dict(),
            steps=t.result.steps,
            user_message_id=t.user_id,
        )
        self.results[run.run_id] = outcome
        while len(self.results) > max(self.agent.recent_results, 0):
            self.results.popitem(last=False)
        return outcome

    def _start_trace(self, run: RunState, agent_name: str, namespace: str) -> TurnTrace | None:
        """The turn's ``invoke_agent`` span (a child of whoever started the turn: the
        task copied the caller's context), made current for the rest of the task."""
        agent = self.agent
        try:
            extra = agent.span_attributes(run.session_id, run.run_id)
        except Exception:  # a hook's failure loses its attributes, not the turn
            log.exception("span_attributes of run %s failed", run.run_id)
            extra = None
        turn_trace = TurnTrace.start(
            agent_name=agent_name,
            agent_class=type(agent).__name__,
            session_id=run.session_id,
            run_id=run.run_id,
            namespace=namespace,
            extra=extra,
        )
        if turn_trace is not None:
            tracing.make_current(turn_trace.context)
        return turn_trace

    def _observe(self, status: RunStatus, started: float, first_chunk: float | None) -> None:
        """The turn's metrics, once it ended (turn count and latency by status, time to
        first chunk, aborts)."""
        sink = metrics()
        tags = {"namespace": self.agent.namespace or "-", "agent": type(self.agent).__name__}
        sink.count("thinkray_turns_total", 1, {**tags, "status": status})
        sink.observe(
            "thinkray_turn_seconds", time.perf_counter() - started, {**tags, "status": status}
        )
        if first_chunk is not None:
            sink.observe("thinkray_ttfc_seconds", first_chunk - started, tags)
        if status == "aborted":
            sink.count("thinkray_aborts_total", 1, tags)

    def _final_metadata(
        self,
        run: RunState,
        options: ChatOptions | None,
        status: RunStatus,
        usage: Usage,
        finish_reason: str | None,
    ) -> dict[str, Any]:
        """The assistant message's final metadata: the ``message_metadata`` hook's, then
        ``usage``, ``status``, ``finishReason`` and ``model`` (which win)."""
        metadata: dict[str, Any] = {}
        if options is not None:
            try:
                metadata.update(self.agent.message_metadata(options))
            except Exception:  # a hook's failure must not lose the turn's message
                log.exception("message_metadata of run %s failed", run.run_id)
        metadata.update(usage=usage.to_dict(), status=status)
        if finish_reason:
            metadata["finishReason"] = finish_reason
        model = model_switch.model_info(self.agent, run)
        if model:
            metadata["model"] = model
        return metadata

    async def _end_stream(
        self,
        run: RunState,
        recorder: Recorder,
        callback: StreamCallback | None,
        call_error: str,
        metadata: dict[str, Any],
        last: UIChunk,
    ) -> StreamCallback | None:
        """End a run's stream that stops early (``last`` is its ``abort`` or ``error``).

        Open text and reasoning blocks are closed and unfinished tool calls end in
        ``call_error`` (the stored turn is truthful and the next prompt carries no
        unresolved call), then the final metadata goes out: all before ``last``, so a
        client's final message is the stored one (``useChat`` reads nothing after an
        ``error`` chunk)."""
        ending: list[UIChunk] = [*recorder.builder.closing_chunks(call_error)]
        ending.append({"type": "message-metadata", "messageMetadata": metadata})
        ending.append(last)
        for chunk in ending:
            callback = await self._emit(run, recorder, callback, chunk)
        return callback

    def _finish_recorder(
        self,
        recorder: Recorder,
        run: RunState,
        metadata: dict[str, Any],
        stale: Callable[[], bool],
    ) -> dict[str, Any] | None:
        # Old chunk logs go a few at a time: one statement every PRUNE_SLACK + 1 runs.
        prune = ChunkPrune(
            keep=max(self.agent.keep_chunk_logs, 1), active=list(self.runs), slack=PRUNE_SLACK
        )
        try:
            message = recorder.finish(metadata, prune=prune)
        except Exception:
            log.exception("final persist of run %s failed", run.run_id)
            raise
        if stale():
            return None
        self._enforce_max_persisted(run.session_id)
        return message

    async def _acknowledge(
        self,
        run: RunState,
        callback: StreamCallback | None,
        make_durable: Callable[[], Awaitable[None]],
        held: list[UIChunk],
        status: RunStatus,
        error_text: str | None,
    ) -> tuple[RunStatus, str | None, StreamCallback | None]:
        """Make the turn durable (the host's ``make_durable``, after the final persist),
        then let its held ``finish`` out. A completed turn that cannot be made durable
        ends as an error instead: the client gets ``error``, never ``finish``."""
        # An aborted or failed turn already ended its stream (abort, error chunk).
        ending = held if status == "completed" else []
        try:
            await make_durable()
        except Exception as exc:
            if status != "completed":
                log.warning("run %s (%s) was not made durable: %s", run.run_id, status, exc)
            else:
                status, error_text = "error", f"the turn was not made durable: {exc}"
                log.error("run %s: %s", run.run_id, error_text)
                ending = [{"type": "error", "errorText": error_text}]
        for chunk in ending:
            callback = await self._deliver(run, callback, chunk)
        return status, error_text, callback

    async def _emit(
        self,
        run: RunState,
        recorder: Recorder,
        callback: StreamCallback | None,
        chunk: UIChunk,
        held: list[UIChunk] | None = None,
    ) -> StreamCallback | None:
        """:meth:`_emit_in_order` under the run's emit lock (see ``gate_opener``)."""
        async with run.emit_lock:
            return await self._emit_in_order(run, recorder, callback, chunk, held)

    def _arm_gate(self, run: RunState, delay: float) -> None:
        """Open the gate after ``delay`` if nothing else has by then."""
        opener = run.gate_opener
        if opener is None:
            return
        loop = asyncio.get_running_loop()

        def fire() -> None:
            if run.gated:
                task: asyncio.Task[None] = loop.create_task(opener())
                _GATE_TASKS.add(task)
                task.add_done_callback(_GATE_TASKS.discard)

        loop.call_later(delay, fire)

    async def _emit_in_order(
        self,
        run: RunState,
        recorder: Recorder,
        callback: StreamCallback | None,
        chunk: UIChunk,
        held: list[UIChunk] | None = None,
    ) -> StreamCallback | None:
        """Record ``chunk`` and send it; a ``finish`` goes to ``held`` instead (when
        given) until the turn is durable.

        A tool call's input chunks are gated: recorded now, sent once a batch holding
        them is durable (with the call's row, written in that batch). The gate opens
        at the next other chunk, when the step's calls are decided
        (:meth:`_release`), or once its oldest chunk is ``flush_interval`` old, so a
        step's calls cost one write however many there are."""
        recorder.record(chunk)
        kind = None if is_data_chunk(chunk) else chunk["type"]
        if kind in _GATED and not recorder.closed:
            now = time.monotonic()
            if run.gated_at is None:
                run.gated_at = now
                self._arm_gate(run, min(recorder.flush_interval, self.agent.tool_input_gate))
            run.gated.append(chunk)
            if now - run.gated_at >= recorder.flush_interval:
                callback = await self._release(run, recorder, callback)
            return callback
        if run.gated:
            callback = await self._release(run, recorder, callback)
        if kind in _DURABLE_BEFORE_RELEASE:
            self._before_release(run, recorder, chunk)
        elif is_data_chunk(chunk) and chunk["type"] == STEER_CHUNK:
            # The steered message is in the turn's message and its row says so, in one
            # transaction: a crash leaves it either waiting or in the message, never
            # both and never neither.
            with self.agent.store.transaction():
                recorder.flush()
                self.queue.steered(run, str(chunk.get("id")))
        if held is not None and kind == "finish":
            held.append(chunk)
            return callback
        return await self._deliver(run, callback, chunk)

    async def _release(
        self, run: RunState, recorder: Recorder, callback: StreamCallback | None
    ) -> StreamCallback | None:
        """Open the gate: commit what is recorded (the gated chunks, the calls' rows),
        then send the gated chunks."""
        if not run.gated:
            return callback
        if not recorder.closed:
            recorder.flush()
        gated, run.gated, run.gated_at = run.gated, [], None
        for chunk in gated:
            callback = await self._deliver(run, callback, chunk)
        return callback

    async def _deliver(
        self, run: RunState, callback: StreamCallback | None, chunk: UIChunk
    ) -> StreamCallback | None:
        run.stream.push(chunk)
        if callback is None:
            return None
        try:
            result = callback.on_event(chunk)
            if inspect.isawaitable(result):
                await result
            return callback
        except Exception as exc:  # the consumer went away: detach, never cancel
            log.info("run %s: callback detached (%s)", run.run_id, exc)
            return None

    def _before_release(self, run: RunState, recorder: Recorder, chunk: UIChunk) -> None:
        """A refused or failed call's result goes to no consumer before it is durable:
        its message part and chunk log are written now; a call the turn refused gets
        its row closed first."""
        if chunk["type"] in ("tool-output-error", "tool-output-denied") and (
            not run.controller.signal.aborted
        ):
            fields: dict[str, Any] = dict(chunk)
            reason = fields.get("errorText") or "denied by the user"
            self.agent.tool_calls.refuse(str(fields["toolCallId"]), run.run_id, str(reason))
        if not recorder.closed:
            recorder.flush()

    def _end_run(self, run: RunState, status: RunStatus, error: str | None = None) -> None:
        run.sink = _discard  # a straggler's late emit goes nowhere (the message is final)
        if self.runs.pop(run.run_id, None) is None:
            return
        self.session_runs.pop(run.session_id, None)
        run.stream.close(error)
        self.last_stream[run.session_id] = run.stream
        if status == "error":
            self.status.error(run.session_id, error or "error")
        else:
            self.status.idle(run.session_id)
        self._drain_soon(run.session_id)

    # -- storage upkeep ---------------------------------------------------------------

    def finalize_orphaned_tool_calls(
        self, session_id: str, history: list[dict[str, Any]] | None = None
    ) -> int:
        """A tool call left without output (a run that died with the process) becomes a
        tool error, so the next prompt never carries an unresolved call. Returns the
        number finalized. Calls belonging to a run in flight are left alone."""
        store = self.agent.store
        run = self.runs.get(self.session_runs.get(session_id, ""))
        active = run.stream.message_id if run is not None else None
        writes: list[PartWrite] = []
        if history is None:
            history = store.get_history(session_id)
        for message in history[-8:]:
            if message.get("role") != "assistant" or message["id"] == active:
                continue
            for idx, part in enumerate(message.get("parts", ())):
                if part.get("type") == "dynamic-tool" and part.get("state") in (
                    "input-streaming",
                    "input-available",
                    "approval-requested",  # the approval died with the process
                ):
                    fixed = dict(part, state="output-error", errorText=ORPHAN_ERROR)
                    writes.append(PartWrite(message["id"], idx, enforce_row_size(fixed)))
        if writes:
            store.flush_stream(StreamFlush(session_id=session_id, parts=writes))
            for w in writes:
                self.persist_cache.forget(w.message_id)
        return len(writes)

    def _enforce_max_persisted(self, session_id: str) -> None:
        limit = self.agent.max_persisted_messages
        if limit is None:
            return
        store = self.agent.store
        visible = [row for row in store.get_path(session_id) if not row.hidden]
        excess = len(visible) - limit
        if excess > 0:
            doomed = [row.id for row in visible[:excess]]
            store.delete_messages(session_id, doomed)
            for mid in doomed:
                self.persist_cache.forget(mid)


class _Turn:
    """One turn's working state, shared by :meth:`TurnRunner._turn` and its steps, and
    the callbacks the loop (``LoopHooks``) and ``ChatOptions.emit`` call into it."""

    def __init__(self, runner: TurnRunner, run: RunState, callback: StreamCallback | None):
        agent = runner.agent
        self.runner = runner
        self.agent = agent
        self.store = agent.store
        self.run = run
        self.sid = run.session_id
        self.callback = callback
        run.gate_opener = self.open_gate
        # Under a host whose store is not durable by itself (an object-store root), the
        # turn's finish chunk waits until the turn is shipped (see _acknowledge).
        self.make_durable = agent.context.make_durable
        self.held: list[UIChunk] | None = [] if self.make_durable is not None else None
        self.signal = run.controller.signal
        self.generation = runner.clear_generation.get(self.sid, 0)
        self.recorder: Recorder | None = None
        self.options: ChatOptions | None = None
        self.status: RunStatus = "completed"
        self.error_text: str | None = None
        self.finish_reason: str | None = None
        # The message's final metadata, computed once: what the stream's last chunks
        # (``finish``, or ``message-metadata`` before ``abort``/``error``) carry is what
        # is stored.
        self.final_metadata: dict[str, Any] | None = None
        self.result = LoopResult()
        self.step_usage = Usage()
        self.user_id: str | None = None
        self.started = time.perf_counter()
        self.first_chunk: float | None = None
        self.namespace = agent.namespace or "-"
        self.agent_name = agent.agent_name or type(agent).__name__
        self.observed = agent.observe_turns
        self.trace: TurnTrace | None = None

    def stale(self) -> bool:
        """The session was cleared or deleted under the turn: its writes are discarded."""
        return self.runner.clear_generation.get(self.sid, 0) != self.generation

    def model_id(self) -> str:
        return str(getattr(self.run.model, "model_id", None) or "unknown")

    async def open_stream(self) -> None:
        # Chunks emitted before the stream started (prepare_turn's, say) wait in
        # run.pending and go out right after the first chunk ("start"); from then on
        # ChatOptions.emit writes through ``sink``, the path the model's chunks take.
        run = self.run
        run.sink = self.sink
        for pending in run.pending:
            await self.sink(pending)
        run.pending.clear()

    async def sink(self, chunk: UIChunk) -> None:  # ChatOptions.emit, once started
        assert self.recorder is not None
        self.callback = await self.runner._emit(self.run, self.recorder, self.callback, chunk)

    def loop_hooks(self) -> LoopHooks:
        return LoopHooks(
            on_step_finish=self.on_step_finish,
            on_retry=self.on_retry,
            check_permission=self.check_permission,
            execute_tool=self.execute_tool,
            on_model_call=self.on_model_call if self.observed else None,
            on_tool_outcome=self.on_tool_outcome if self.observed else None,
            trace=self.trace,
            record_call=self.record_call,
            calls_decided=self.calls_decided,
            take_steered=self.take_steered,
        )

    def take_steered(self) -> list[dict[str, Any]]:
        """The user messages that join this turn now (``steer``), for the next call."""
        if self.stale():
            return []
        return self.runner.queue.take_steers(self.run)

    def on_step_finish(self, step: int, usage: Usage, reason: str) -> None:
        self.step_usage = self.step_usage + usage
        self.run.usage = self.step_usage
        if self.observed:
            _count_tokens(self.namespace, self.model_id(), usage)
        if not self.stale():
            if self.recorder is not None:  # into the rollup with its next batch
                self.recorder.add_usage(usage.to_dict())
            else:
                self.store.add_usage(self.sid, usage.to_dict())
            self.agent.on_step_usage(self.sid, usage)

    def on_retry(self, attempt: int, exc: ModelError, delay: float) -> None:
        self.runner.status.retrying(self.sid, attempt, f"{exc} (retry {attempt} in {delay:.1f}s)")

    async def open_gate(self) -> None:
        """The gate's timer (``RunState.gate_opener``): commit and send what waits."""
        if self.recorder is None:
            return
        async with self.run.emit_lock:
            self.callback = await self.runner._release(self.run, self.recorder, self.callback)

    async def calls_decided(self) -> None:
        # The step's tool calls are durable in the message (and its chunk log), with
        # their rows, before any of them runs or waits: a generation cut off while a
        # call is out (with an executor, awaiting approval) can be resumed from it.
        if self.recorder is not None:
            self.callback = await self.runner._release(self.run, self.recorder, self.callback)

    def persist_step(self) -> None:
        # What calls_decided left gated (a chunk emitted since) is made durable; the
        # calls' tasks run beside each other, so its delivery waits for the stream.
        if self.run.gated and self.recorder is not None and not self.recorder.closed:
            self.recorder.flush()

    async def check_permission(self, name: str, value: Any, call_id: str) -> Any:
        self.persist_step()
        return await self.agent.check_tool_permission(name, value, call_id, self.options)

    async def execute_tool(self, t: Tool, value: Any, ctx: Any, raw: Any) -> Any:
        self.persist_step()
        return await self.agent.tool_calls.execute(t, value, ctx, raw)

    def on_model_call(self, outcome: str) -> None:
        tags = {"namespace": self.namespace, "model": self.model_id(), "outcome": outcome}
        metrics().count("thinkray_model_calls_total", 1, tags)

    def on_tool_outcome(self, tool_name: str, outcome: str) -> None:
        tags = {"namespace": self.namespace, "tool": tool_name, "outcome": outcome}
        metrics().count("thinkray_tool_calls_total", 1, tags)

    def record_call(self, t: Tool, call_id: str, raw: Any) -> None:
        if not self.stale():
            self.agent.tool_calls.record(
                t, call_id, self.run.run_id, self.sid, raw, claim=self.unchecked
            )

    @property
    def unchecked(self) -> bool:
        """Whether the agent checks no tool call (``check_tool_permission`` is Think's,
        which allows everything): an inline call's row is then written claimed, so
        running it costs no write of its own."""
        from thinkray.runtime.agents.think import Think

        # The bound method's function: an override on the class or on the instance
        # (assigned at run time, as tests and plugins do) both count as a check.
        check = getattr(self.agent.check_tool_permission, "__func__", None)
        return check is Think.check_tool_permission


_DURABLE_BEFORE_RELEASE = frozenset({"tool-output-error", "tool-output-denied"})
"""Tool-call results a consumer is given only once what they announce is stored."""

_GATE_TASKS: set[asyncio.Task[None]] = set()
"""Gate timers' tasks, referenced until done (the loop keeps only weak references)."""

_GATED = frozenset(
    {"tool-input-start", "tool-input-delta", "tool-input-available", "tool-input-error"}
)
"""A tool call's input chunks: a consumer is given them only once a batch holding them
(and the call's row) is durable (``TurnRunner._emit``)."""

CONTENT_CHUNKS = frozenset(
    {"text-delta", "reasoning-delta", "tool-input-start", "tool-input-available"}
)
"""Chunks that count as the turn's first content (time to first chunk)."""

TOKEN_KINDS = ("input", "output", "reasoning", "cache_read", "cache_write")


def _count_tokens(namespace: str, model: str, usage: Usage) -> None:
    sink = metrics()
    for kind in TOKEN_KINDS:
        n = getattr(usage, kind)
        if n:
            sink.count(
                "thinkray_tokens_total", n, {"namespace": namespace, "model": model, "kind": kind}
            )


def _finish_chunk(chunk: FinishChunk, metadata: dict[str, Any]) -> FinishChunk:
    """``chunk`` carrying the message's final ``metadata`` (merged over what it had)."""
    out: FinishChunk = {
        "type": "finish",
        "messageMetadata": {**(chunk.get("messageMetadata") or {}), **metadata},
    }
    reason = metadata.get("finishReason")
    if reason:
        out["finishReason"] = reason
    return out


def _store_user_message(store: Any, sid: str, message: dict[str, Any]) -> None:
    """Append the turn's user message. Stored already: by this session (a turn that
    answers it anew), fine; by another session since ``start`` checked, refused
    (:class:`MessageIdConflictError`), never dropped."""
    if not store.append_message(sid, message):
        check_resent(store, sid, message["id"])


async def _deliver(
    chunks: list[UIChunk], callback: StreamCallback | None, result: ChatResult
) -> ChatResult:
    """A replayed run's task: the chunks to the callback (as a live run would send
    them; a failing callback detaches), then its result."""
    for chunk in chunks if callback is not None else ():
        try:
            sent = callback.on_event(chunk)  # type: ignore[union-attr]
            if inspect.isawaitable(sent):
                await sent
        except Exception as exc:
            log.info("replay of run %s: callback detached (%s)", result.run_id, exc)
            return result
    if callback is not None:
        if result.status == "error":
            await _call(callback, "on_error", result.error)
        else:
            await _call(callback, "on_done")
    return result


def _is_terminal(chunk: UIChunk) -> bool:
    return not is_data_chunk(chunk) and chunk["type"] in TERMINAL_CHUNKS


async def _shielded(task: asyncio.Future[ChatResult]) -> ChatResult:
    """Another caller's wait on a run: its cancellation must not cancel the run."""
    return await asyncio.shield(task)


async def _discard(chunk: UIChunk) -> None:
    """The emit sink of a finished run."""


async def _call(callback: Any, name: str, *args: Any) -> None:
    fn: Callable[..., Any] | None = getattr(callback, name, None)
    if fn is None:
        return
    try:
        result = fn(*args)
        if isinstance(result, Awaitable) or inspect.isawaitable(result):
            await result
    except Exception as exc:
        log.info("callback %s failed: %s", name, exc)
