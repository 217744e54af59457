"""What a call through an agent handle returns: one object for sync and async callers.

Modelled on Ray Serve's ``DeploymentHandle``: ``handle.method.remote(...)`` sends the
call at once and returns an :class:`AgentResponse`; async code ``await``\\ s it, sync
code calls ``.result(timeout_s=...)``. A stream method returns an
:class:`AgentResponseStream`, iterable with ``for`` and ``async for``.

Exactly once from the caller's side:

- The actor answered that it no longer hosts the agent (``NotBoundError``: it
  hibernated): the call never ran, so it is re-sent after the handle re-resolved the
  name (the directory binds a pooled actor and the agent wakes from its file).
- The actor died mid-call (``RayActorError``; for a stream on the caller's node, its
  lane's connection closed: :class:`~thinkray.actors.lane.LaneLost`): an
  ``@idempotent`` method is re-sent to the woken agent. A turn (``chat``/``stream_chat``)
  carries a user message id the handle assigned before sending: if the woken agent has
  no message with that id, the turn never started and is re-sent; nor when the message
  is in the agent's queue of messages sent while a turn ran (the woken agent answers it
  once: the resend follows that answer, see :mod:`thinkray.runtime.agents.midturn`);
  otherwise it raises
  :class:`~thinkray.runtime.errors.RunInterruptedError` (the agent marks the partial
  answer ``interrupted`` when it wakes). Any other call raises
  :class:`~thinkray.runtime.errors.CallInterruptedError`: it is never re-run silently.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import ray
from thinkray.actors.errors import CallInterruptedError, RunInterruptedError, SyncInEventLoopError
from thinkray.actors.lane import StreamCall
from thinkray.actors.relay import AbortReceiver, NotBoundError
from thinkray.runtime.errors import ThinkrayError

if TYPE_CHECKING:
    from thinkray.actors.namespace import AgentHandle

__all__ = ["AgentResponse", "AgentResponseStream", "CrashPolicy", "TurnKeys"]

R = TypeVar("R")
T = TypeVar("T")

RETRYABLE = (NotBoundError, ray.exceptions.RayActorError)
ATTEMPTS = 5


@dataclass(frozen=True)
class TurnKeys:
    """The ids a handle gives a turn before sending it: the user message's (None when
    the turn answers the history as it is), the run's, and the session if named."""

    message_id: str | None
    run_id: str
    session_id: str | None


@dataclass(frozen=True)
class CrashPolicy:
    """What a response may do when the actor dies mid-call (see the module doc)."""

    method: str
    idempotent: bool = False
    turn: TurnKeys | None = None

    def interrupted(self, during: str) -> CallInterruptedError:
        """The error for a call that may have run in part: not re-sent."""
        if self.turn is not None:
            turn = self.turn
            return RunInterruptedError(
                f"{self.method}: the agent's actor died {during}; the turn is not re-run "
                f"(run {turn.run_id}, user message {turn.message_id}). What it wrote is kept "
                "and marked interrupted; send the message again (same id) to answer it anew",
                self.method,
                session_id=turn.session_id,
                message_id=turn.message_id,
                run_id=turn.run_id,
            )
        return CallInterruptedError(
            f"{self.method}: the agent's actor died {during}; the call changes state and "
            "may have run in part, so it is not re-sent (the agent wakes on the next call)",
            self.method,
        )


@contextlib.contextmanager
def _own_errors() -> Iterator[None]:
    """thinkray's own error raised in the actor, as itself: Ray hands it over wrapped
    in a ``RayTaskError`` whose text is the remote traceback banner. The class is kept
    (``except SessionBusyError`` works) and its message is the clean sentence; the
    wrapper, with the remote traceback, stays reachable as ``__cause__``."""
    try:
        yield
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause
        if isinstance(cause, ThinkrayError):
            raise cause from exc
        raise


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class AgentResponse(Generic[R]):
    """The result of one remote call, awaited (async) or ``.result()``-ed (sync).

    Created by ``handle.<method>.remote(...)``; the call is already on its way. Await
    it or take its result once."""

    def __init__(
        self, handle: AgentHandle[Any], send: Callable[[Any], Any], policy: CrashPolicy
    ) -> None:
        self._handle = handle
        self._send = send  # actor handle -> ObjectRef
        self._policy = policy
        self._ref: Any = None
        self._started: asyncio.Task[Any] | None = None
        if not _in_event_loop():
            self._ref = send(handle._actor_sync())
        elif handle._cached_actor() is not None:
            self._ref = send(handle._cached_actor())
        else:  # async caller, name not resolved yet: resolve and send in the background
            self._started = asyncio.ensure_future(self._result_async())

    def result(self, timeout_s: float | None = None) -> R:
        """Block until the call finished and return its value (or raise its error;
        ``GetTimeoutError`` after ``timeout_s``). Raises :class:`SyncInEventLoopError`
        inside a running event loop (use ``await`` there), and
        :class:`~thinkray.runtime.errors.CallInterruptedError` when the actor died
        during a call that must not run twice."""
        if _in_event_loop():
            raise SyncInEventLoopError(
                "response.result() would block the running event loop; "
                "use `await handle.method.remote(...)` in async code"
            )
        stale = False
        for attempt in range(ATTEMPTS):
            if self._ref is None or stale:
                self._ref = self._send(self._handle._actor_sync(stale=stale))
            try:
                with _own_errors():
                    value: R = ray.get(self._ref, timeout=timeout_s)
                return value
            except RETRYABLE as exc:
                if attempt == ATTEMPTS - 1:
                    raise
                self._ref = None
                # The check may already have re-resolved the name: then the handle's
                # actor is the fresh one, which must not be reported stale again.
                stale = not (
                    isinstance(exc, ray.exceptions.RayActorError)
                    and _may_resend_sync(self._handle, self._policy, "during the call")
                )
        raise AssertionError("unreachable")

    async def _result_async(self) -> R:
        stale = False
        for attempt in range(ATTEMPTS):
            if self._ref is None or stale:
                self._ref = self._send(await self._handle._actor_async(stale=stale))
            try:
                with _own_errors():
                    value: R = await self._ref
                return value
            except RETRYABLE as exc:
                if attempt == ATTEMPTS - 1:
                    raise
                self._ref = None
                stale = not (
                    isinstance(exc, ray.exceptions.RayActorError)
                    and await _may_resend_async(self._handle, self._policy, "during the call")
                )
                await asyncio.sleep(0)
        raise AssertionError("unreachable")

    def __await__(self) -> Generator[Any, None, R]:
        if self._started is not None:
            return self._started.__await__()
        return self._result_async().__await__()


def _may_resend_sync(handle: AgentHandle[Any], policy: CrashPolicy, during: str) -> bool:
    """Return when the call may be sent again after its actor died; raise otherwise.
    True when the check already re-resolved the name (the handle holds the fresh actor)."""
    if policy.idempotent:
        return False
    turn = policy.turn
    if turn is None or turn.message_id is None:
        handle._forget_actor()
        raise policy.interrupted(during)
    try:
        actor = handle._actor_sync(stale=True)  # wakes the agent on a fresh actor
        found: Any = ray.get(
            actor.invoke.remote(handle.name, "get_message", (turn.message_id,), {})
        )
        queued = found is not None and ray.get(
            actor.invoke.remote(handle.name, "queued_message", (turn.message_id,), {})
        )
    except Exception:  # cannot tell whether the turn started: it may have
        handle._forget_actor()
        raise policy.interrupted(during) from None
    if found is not None and not queued:
        raise policy.interrupted(during)
    return True


async def _may_resend_async(handle: AgentHandle[Any], policy: CrashPolicy, during: str) -> bool:
    """:func:`_may_resend_sync` for async callers."""
    if policy.idempotent:
        return False
    turn = policy.turn
    if turn is None or turn.message_id is None:
        handle._forget_actor()
        raise policy.interrupted(during)
    try:
        actor = await handle._actor_async(stale=True)
        found = await actor.invoke.remote(handle.name, "get_message", (turn.message_id,), {})
        queued = found is not None and await actor.invoke.remote(
            handle.name, "queued_message", (turn.message_id,), {}
        )
    except Exception:
        handle._forget_actor()
        raise policy.interrupted(during) from None
    if found is not None and not queued:
        raise policy.interrupted(during)
    return True


class AgentResponseStream(Generic[T]):
    """The items of a remote stream method, as they are produced: ``for item in s``
    (sync) or ``async for item in s`` (async). ``header`` is what the actor said first
    (for a chat turn: ``run_id``, ``session_id``, ``message_id``, ``receiver``;
    for a resume: ``run_id`` and ``live``). Leaving early detaches, never aborts;
    :meth:`abort` stops the run a chat stream belongs to. When the actor dies after
    the stream opened, iteration raises
    :class:`~thinkray.runtime.errors.CallInterruptedError` (for a turn
    :class:`~thinkray.runtime.errors.RunInterruptedError`)."""

    def __init__(self, handle: AgentHandle[Any], call: StreamCall, policy: CrashPolicy) -> None:
        self._handle = handle
        self._call = call  # opens the stream on an actor (over its lane, or Ray)
        self._policy = policy
        self._refs: Any = None  # the open stream's items (SyncLaneStream, RayItems...)
        self._header: dict[str, Any] | None = None
        self._buffer: deque[T] = deque()
        self.batches = 0  # batches received (Ray items or lane frames)
        if not _in_event_loop():
            self._open_sync()

    # -- the header ---------------------------------------------------------------

    def _open_sync(self) -> None:
        stale = False
        for attempt in range(ATTEMPTS):
            actor = self._handle._actor_sync(stale=stale)
            refs = self._call.open_sync(actor)
            try:
                with _own_errors():
                    self._take_header(refs.next_item(), actor)
                self._refs = refs
                return
            except RETRYABLE as exc:
                if attempt == ATTEMPTS - 1:
                    raise
                stale = not (
                    isinstance(exc, ray.exceptions.RayActorError)
                    and _may_resend_sync(self._handle, self._policy, "as the stream opened")
                )

    async def _open_async(self) -> None:
        stale = False
        for attempt in range(ATTEMPTS):
            actor = await self._handle._actor_async(stale=stale)
            refs = await self._call.open_async(actor)
            try:
                with _own_errors():
                    self._take_header(await refs.anext_item(), actor)
                self._refs = refs
                return
            except RETRYABLE as exc:
                if attempt == ATTEMPTS - 1:
                    raise
                stale = not (
                    isinstance(exc, ray.exceptions.RayActorError)
                    and await _may_resend_async(self._handle, self._policy, "as the stream opened")
                )

    def _take_header(self, header: dict[str, Any], actor: Any) -> None:
        """The stream's first item: the header, which may carry the first batch of
        items (``items``). A chat stream's abort receiver is made here, from the handle
        of the actor the stream came from: the actor sending one would build and
        serialize its own handle per turn, and this process deserialize it."""
        items = header.pop("items", None)
        if "message_id" in header and "receiver" not in header:
            header["receiver"] = AbortReceiver(actor, self._handle.name, header["run_id"])
        self._header = header
        if items:
            self._buffer.extend(items)
            self.batches += 1

    def _died(self) -> CallInterruptedError:
        """The error for an actor that died after the stream opened (the handle then
        resolves the name again on its next call)."""
        self._handle._forget_actor()
        policy = self._policy
        if policy.turn is not None:
            header = self._header or {}
            policy = CrashPolicy(
                policy.method,
                policy.idempotent,
                TurnKeys(
                    policy.turn.message_id,
                    header.get("run_id") or policy.turn.run_id,
                    header.get("session_id") or policy.turn.session_id,
                ),
            )
        return policy.interrupted("while streaming")

    async def start(self) -> AgentResponseStream[T]:
        """Open the stream now and return it (async code: the header is then known, as
        it is at once in sync code)."""
        if self._refs is None:
            await self._open_async()
        return self

    @property
    def header(self) -> dict[str, Any]:
        """The stream's header (empty until an async stream started iterating)."""
        return dict(self._header or {})

    @property
    def run_id(self) -> str | None:
        """The run this stream follows (chat and resume streams), else None."""
        return (self._header or {}).get("run_id")

    @property
    def session_id(self) -> str | None:
        """The session of the run (chat streams), else None."""
        return (self._header or {}).get("session_id")

    @property
    def message_id(self) -> str | None:
        """The assistant message's id (chat streams), else None."""
        return (self._header or {}).get("message_id")

    @property
    def receiver(self) -> AbortReceiver | None:
        """The run's serializable abort receiver (chat streams), else None."""
        return (self._header or {}).get("receiver")

    @property
    def live(self) -> bool:
        """False when a resume replays a finished run (nothing more will come)."""
        return bool((self._header or {}).get("live", True))

    def abort(self, reason: str = "aborted") -> bool:
        """Abort the run this stream follows; False if there is none or it ended."""
        receiver = self.receiver
        return bool(receiver is not None and receiver.abort(reason))

    # -- the items ----------------------------------------------------------------

    def __iter__(self) -> Iterator[T]:
        if _in_event_loop():
            raise SyncInEventLoopError(
                "iterating a stream with `for` would block the running event loop; "
                "use `async for` in async code"
            )
        if self._refs is None:
            self._open_sync()
        return self

    def __next__(self) -> T:
        while not self._buffer:
            try:
                with _own_errors():  # StopIteration ends the stream
                    self._buffer.extend(self._refs.next_item())
            except ray.exceptions.RayActorError:
                raise self._died() from None
            self.batches += 1
        return self._buffer.popleft()

    async def item_batches(self) -> AsyncIterator[list[T]]:
        """The items as they arrive, a list per batch (a Ray item or a lane frame: the
        actor's relay batches what the run produced meanwhile): for a relay that
        forwards them onward (an HTTP stream) and pays per write, not per item. Same
        errors as iterating."""
        if self._refs is None:
            await self._open_async()
        if self._buffer:
            first = list(self._buffer)
            self._buffer.clear()
            yield first
        try:
            while True:
                try:
                    with _own_errors():
                        batch = await self._refs.anext_item()
                except StopAsyncIteration:
                    return
                except ray.exceptions.RayActorError:
                    raise self._died() from None
                self.batches += 1
                if batch:
                    yield list(batch)
        finally:  # left early: a lane's connection closes (the run goes on)
            self._refs.close()

    def close(self) -> None:
        """Stop following the stream (the run goes on: detach, never abort)."""
        if self._refs is not None:
            self._refs.close()

    async def __aiter__(self) -> AsyncIterator[T]:
        async for batch in self.item_batches():
            for item in batch:
                yield item
