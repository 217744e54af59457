"""The session actor: a pooled Ray actor that hosts one agent (``Think``) at a time.

An actor starts generic (imports done, nothing bound) and waits in the namespace's
warm pool. ``bind`` opens the agent's DuckDB file and builds a fresh ``Think`` from it
(the Durable Object constructor path: nothing is carried over from an earlier
binding); ``hibernate`` refuses while anything is in flight, otherwise closes the
file (checkpoint, no ``.wal``) and makes the actor generic again.

Every RPC names the agent it is meant for. An actor that does not host that agent
raises :class:`~thinkray.actors.relay.NotBoundError`, and the caller's handle re-resolves.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from thinkray.actors.relay import AbortReceiver, NotBoundError, as_callback
from thinkray.runtime.agents.context import AgentContext, constructing
from thinkray.runtime.agents.think import Think
from thinkray.storage.session_store import DuckDBSessionStore
from thinkray.storage.types import SessionNotFoundError

log = logging.getLogger("thinkray.actor")

DEFAULT_PRELOAD = (
    "thinkray.runtime.agents.think",
    "thinkray.runtime.turn.loop",
    "thinkray.storage.session_store",
)
# Relay batches wait this long to gather chunks: ~2 ms of latency for far fewer Ray
# items per turn (each costs the actor and the consumer ~0.1-0.3 ms).
RELAY_COALESCE = 0.002


@dataclass
class BindSpec:
    namespace: str
    name: str
    path: str
    agent_cls: type[Think]
    agent_kwargs: dict[str, Any] = field(default_factory=dict)
    create: bool = True
    directory: Any = None  # the namespace directory's actor handle
    idle_timeout: float | None = None


class SessionActor:
    """Generic host. Use through :class:`thinkray.actors.namespace.AgentNamespace` handles."""

    def __init__(self, preload: tuple[str, ...] = DEFAULT_PRELOAD) -> None:
        for module in preload:
            importlib.import_module(module)
        ctx = ray.get_runtime_context()
        self.actor_id = ctx.get_actor_id()
        self.node_id = ctx.get_node_id()
        self.agent: Think | None = None
        self.name: str | None = None
        self.spec: BindSpec | None = None
        self.bindings = 0
        self.inflight = 0
        self.last_activity = time.monotonic()
        self._watcher: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------

    async def ready(self) -> dict[str, Any]:
        return self._info()

    def _info(self) -> dict[str, Any]:
        return {
            "actor_id": self.actor_id,
            "node_id": self.node_id,
            "pid": os.getpid(),
            "bindings": self.bindings,
            "bound": self.name,
        }

    async def bind(self, spec: BindSpec) -> dict[str, Any]:
        if self.agent is not None:
            raise RuntimeError(f"actor already hosts {self.name!r}")
        started = time.perf_counter()
        path = Path(spec.path)
        if not spec.create and not path.exists():
            raise SessionNotFoundError(
                f"agent {spec.name!r} does not exist in namespace {spec.namespace!r}"
            )
        store = DuckDBSessionStore(path)
        context = AgentContext(
            name=spec.name, namespace=spec.namespace, storage_root=str(path.parent.parent)
        )
        try:
            with constructing(context):
                agent = spec.agent_cls(store, **spec.agent_kwargs)
        except BaseException:
            store.close()
            raise
        self.agent, self.name, self.spec = agent, spec.name, spec
        self.bindings += 1
        self.last_activity = time.monotonic()
        await _maybe_await(getattr(agent, "on_wake", None))
        if spec.idle_timeout and spec.directory is not None:
            self._watcher = asyncio.ensure_future(self._watch_idle(spec.idle_timeout))
        info = self._info()
        info["bind_ms"] = (time.perf_counter() - started) * 1000
        return info

    def busy(self) -> bool:
        agent = self.agent
        if agent is None:
            return False
        return self.inflight > 0 or bool(agent.turns.runs) or _has_pending_work(agent)

    async def hibernate(self, name: str, force: bool = False) -> dict[str, Any]:
        """Close the agent and become generic. Refused (``ok: False``) while busy."""
        if self.agent is None or self.name != name:
            return {"ok": True, "was_bound": False}
        if self.busy() and not force:
            return {"ok": False, "reason": "busy"}
        agent = self.agent
        next_due = None
        try:
            next_due = await _maybe_await(getattr(agent, "next_alarm_at", None))
            await _maybe_await(getattr(agent, "on_hibernate", None))
        finally:
            self.agent, self.name, self.spec = None, None, None
            if self._watcher is not None:
                self._watcher.cancel()
                self._watcher = None
            await _maybe_await(getattr(agent, "aclose", None))
            agent.close()
        return {"ok": True, "was_bound": True, "next_due_at": next_due}

    async def _watch_idle(self, idle_timeout: float) -> None:
        period = max(0.05, min(idle_timeout / 4, 5.0))
        while self.agent is not None:
            await asyncio.sleep(period)
            if self.agent is None or self.spec is None:
                return
            if self.busy():
                self.last_activity = time.monotonic()
                continue
            if time.monotonic() - self.last_activity >= idle_timeout:
                name = self.name
                try:
                    await self.spec.directory.request_hibernate.remote(name, self.actor_id)
                except Exception as exc:  # the directory is gone: stay bound
                    log.warning("idle hibernate of %s failed: %s", name, exc)
                return

    async def activity(self, name: str) -> dict[str, Any]:
        return {
            "bound": self.name == name,
            "busy": self.busy(),
            "idle_for": time.monotonic() - self.last_activity,
        }

    # -- calls -------------------------------------------------------------------------

    @contextmanager
    def _call(self, name: str) -> Iterator[Think]:
        if self.agent is None or self.name != name:
            raise NotBoundError(name, self.name)
        self.inflight += 1
        self.last_activity = time.monotonic()
        try:
            yield self.agent
        finally:
            self.inflight -= 1
            self.last_activity = time.monotonic()

    async def invoke(self, name: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call a public method of the hosted agent (awaited if it is a coroutine)."""
        if method.startswith("_"):
            raise AttributeError(f"{method!r} is private")
        with self._call(name) as agent:
            fn = getattr(agent, method)
            return await _maybe_await(fn(*args, **kwargs))

    async def invoke_stream(
        self, name: str, method: str, *args: Any, **kwargs: Any
    ) -> AsyncIterator[Any]:
        """Stream from an async-generator method of the hosted agent: a header, then
        its items (lists of chunks, for the viewers of an orchestrator)."""
        if method.startswith("_"):
            raise AttributeError(f"{method!r} is private")
        with self._call(name) as agent:
            yield {"method": method}
            async for item in getattr(agent, method)(*args, **kwargs):
                yield item

    async def chat(self, name: str, message: Any = None, callback: Any = None, **kw: Any) -> dict:
        with self._call(name) as agent:
            result = await agent.chat(message, as_callback(callback), **kw)
            return result.to_dict()

    async def start_chat(
        self, name: str, message: Any = None, callback: Any = None, **kw: Any
    ) -> dict[str, Any]:
        """Start a turn and return at once with its run id and an abort receiver."""
        with self._call(name) as agent:
            run = agent.start_chat(message, as_callback(callback), **kw)
            return self._run_header(name, run)

    def _run_header(self, name: str, run: Any) -> dict[str, Any]:
        handle = ray.get_runtime_context().current_actor
        return {
            "run_id": run.run_id,
            "session_id": run.session_id,
            "message_id": run.stream.message_id,
            "receiver": AbortReceiver(handle, name, run.run_id),
        }

    async def wait_run(self, name: str, run_id: str) -> dict[str, Any] | None:
        with self._call(name) as agent:
            run = agent.turns.runs.get(run_id)
            if run is None or run.task is None:
                return None
            return (await asyncio.shield(run.task)).to_dict()

    async def chat_stream(self, name: str, message: Any = None, **kw: Any) -> AsyncIterator[Any]:
        """Streaming generator: a header dict, then lists of chunks (batched: the more
        the consumer lags, the more chunks per item)."""
        with self._call(name) as agent:
            run = agent.start_chat(message, None, **kw)
            yield self._run_header(name, run)
            async for batch in run.stream.follow(coalesce=RELAY_COALESCE):
                yield batch

    async def resume(
        self, name: str, session_id: str | None = None, run_id: str | None = None
    ) -> AsyncIterator[Any]:
        """Replay the current (else the last) run's chunks from index 0, then the live
        tail — exactly once, contiguous. After a wake the in-memory stream is gone and
        the last run is replayed from the chunk log in the database."""
        with self._call(name) as agent:
            stream = agent.stream_of(run_id) if run_id else agent.run_stream(session_id)
            if stream is not None:
                yield {"run_id": stream.run_id, "live": not stream.done}
                async for batch in stream.follow(coalesce=RELAY_COALESCE):
                    yield batch
                return
            generations = agent.store.chunk_generations()
            wanted = run_id or (generations[-1] if generations else None)
            if wanted is None or wanted not in generations:
                yield {"run_id": None, "live": False}
                return
            yield {"run_id": wanted, "live": False}
            chunks = agent.store.get_chunks(wanted)
            if chunks:
                yield chunks

    async def abort_run(self, name: str, run_id: str, reason: str = "aborted") -> bool:
        if self.agent is None or self.name != name:
            return False  # not hosted here any more: that run cannot be live
        return self.agent.abort(run_id=run_id, reason=reason)

    async def abort(
        self, name: str, session_id: str | None = None, reason: str = "aborted"
    ) -> bool:
        with self._call(name) as agent:
            return agent.abort(session_id, reason=reason)

    async def status(self, name: str, session_id: str | None = None) -> dict[str, Any]:
        with self._call(name) as agent:
            try:
                return agent.get_status(session_id).model_dump(exclude_none=True)
            except SessionNotFoundError:
                return {"state": "idle"}

    async def shutdown(self) -> None:
        if self.name is not None:
            await self.hibernate(self.name, force=True)


def _has_pending_work(agent: Think) -> bool:
    pending = getattr(agent, "has_pending_work", None)
    return bool(pending()) if callable(pending) else False


async def _maybe_await(fn: Any) -> Any:
    if fn is None:
        return None
    result = fn() if callable(fn) else fn
    if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
        return await result
    return result


RemoteSessionActor = ray.remote(SessionActor)
