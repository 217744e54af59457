"""Client side: ``AgentNamespace`` (the Durable Object namespace binding) and
``AgentHandle`` (a stub addressed by name).

A handle caches the actor its agent is bound to and re-resolves through the directory
when that actor answers that it no longer hosts the agent (it hibernated) or died
(it crashed: the directory replaces it and the agent rebinds on the next call).
Handles are serializable: pass them to other actors.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Iterator
from typing import Any

import ray
from ray.actor import ActorHandle
from thinkray.actors.directory import NamespaceConfig, RemoteDirectory
from thinkray.actors.relay import AbortReceiver, NotBoundError
from thinkray.actors.session_actor import DEFAULT_PRELOAD
from thinkray.runtime.agents.think import Think
from thinkray.storage.layout import ensure_root, list_names, validate_name

RAY_NAMESPACE = "thinkray"
_RETRYABLE = (NotBoundError, ray.exceptions.RayActorError)
_ATTEMPTS = 5


def _directory_name(namespace: str) -> str:
    return f"thinkray-directory-{namespace}"


class AgentNamespace:
    """Agents of one class under one storage root, addressed by name.

    ``get(name)`` gets or creates; ``existing(name)`` refuses unknown names for
    read-only use. Two processes that construct the same namespace share one
    directory actor (the first one's settings win).
    """

    def __init__(
        self,
        name: str = "default",
        agent_cls: type[Think] = Think,
        *,
        storage_root: str,
        agent_kwargs: dict[str, Any] | None = None,
        pool_size: int = 2,
        max_live: int = 64,
        cap_wait: float = 5.0,
        idle_timeout: float | None = 300.0,
        recycle_after: int = 200,
        actor_options: dict[str, Any] | None = None,
        preload: tuple[str, ...] = DEFAULT_PRELOAD,
        detached: bool = False,
        start: bool = True,
    ) -> None:
        """``start=False`` skips the blocking wait for the pool (inside an async actor,
        use ``await ns.astart()`` instead)."""
        validate_name(name, "namespace")
        # Fail at start, with a clear message, on a root we cannot write.
        ensure_root(storage_root, name)
        self.name = name
        self.storage_root = str(storage_root)
        config = NamespaceConfig(
            namespace=name,
            storage_root=str(storage_root),
            agent_cls=agent_cls,
            agent_kwargs=dict(agent_kwargs or {}),
            pool_size=pool_size,
            max_live=max_live,
            cap_wait=cap_wait,
            idle_timeout=idle_timeout,
            recycle_after=recycle_after,
            actor_options=dict(actor_options or {}),
            preload=tuple(preload),
        )
        options: dict[str, Any] = {
            "name": _directory_name(name),
            "namespace": RAY_NAMESPACE,
            "get_if_exists": True,
            "num_cpus": 0,
            "max_concurrency": 1000,
        }
        if detached:
            options["lifetime"] = "detached"
        self.directory = RemoteDirectory.options(**options).remote(config)
        if start:
            ray.get(self.directory.start.remote())

    async def astart(self) -> AgentNamespace:
        await self.directory.start.remote()
        return self

    @classmethod
    def connect(cls, name: str = "default") -> AgentNamespace:
        """Attach to a namespace another process created."""
        self = cls.__new__(cls)
        self.name = name
        self.directory = ray.get_actor(_directory_name(name), namespace=RAY_NAMESPACE)
        stats = ray.get(self.directory.stats.remote())
        self.storage_root = stats.get("storage_root", "")
        return self

    def get(self, name: str) -> AgentHandle:
        return AgentHandle(self.name, validate_name(name), self.directory, create=True)

    def existing(self, name: str) -> AgentHandle:
        return AgentHandle(self.name, validate_name(name), self.directory, create=False)

    def names(self) -> list[str]:
        """Every agent that has a database file (live or hibernated)."""
        return list_names(self.storage_root, self.name)

    def hibernate(self, name: str, force: bool = False) -> bool:
        return ray.get(self.directory.hibernate.remote(validate_name(name), force))

    def hibernate_all(self, force: bool = False) -> int:
        return ray.get(self.directory.hibernate_all.remote(force))

    def stats(self) -> dict[str, Any]:
        return ray.get(self.directory.stats.remote())

    def shutdown(self) -> None:
        """Hibernate every agent and stop the pool and the directory."""
        try:
            ray.get(self.directory.shutdown.remote())
        finally:
            ray.kill(self.directory, no_restart=True)


class ChatStream:
    """Chunks of one run as they arrive (sync iteration). ``run_id`` and ``receiver``
    are known as soon as the stream exists; leaving early detaches, never aborts."""

    def __init__(self, header: dict[str, Any], refs: Any) -> None:
        self.run_id: str | None = header.get("run_id")
        self.message_id: str | None = header.get("message_id")
        self.session_id: str | None = header.get("session_id")
        self.receiver: AbortReceiver | None = header.get("receiver")
        self.live: bool = header.get("live", True)
        self._refs = refs
        self._buffer: deque[dict[str, Any]] = deque()
        self.batches = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        while not self._buffer:
            ref = next(self._refs)  # StopIteration ends the stream
            self._buffer.extend(ray.get(ref))
            self.batches += 1
        return self._buffer.popleft()

    def abort(self, reason: str = "aborted") -> bool:
        return bool(self.receiver and self.receiver.abort(reason))


class AsyncChatStream:
    def __init__(self, header: dict[str, Any], refs: Any) -> None:
        self.run_id = header.get("run_id")
        self.message_id = header.get("message_id")
        self.session_id = header.get("session_id")
        self.receiver: AbortReceiver | None = header.get("receiver")
        self.live = header.get("live", True)
        self._refs = refs

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        async for ref in self._refs:
            for chunk in await ref:
                yield chunk


class AgentHandle:
    """A stub for one named agent. Sync methods block (drivers); ``a``-prefixed ones
    are coroutines (use them inside async actors)."""

    def __init__(self, namespace: str, name: str, directory: ActorHandle, create: bool = True):
        self.namespace = namespace
        self.name = name
        self.directory = directory
        self.create = create
        self._actor: ActorHandle | None = None
        self._actor_id: str | None = None

    def __repr__(self) -> str:
        return f"AgentHandle({self.namespace}/{self.name})"

    # -- resolution ------------------------------------------------------------------

    def _resolve(self, stale: str | None = None, node_id: str | None = None) -> ActorHandle:
        self._actor, self._actor_id = ray.get(
            self.directory.resolve.remote(self.name, self.create, stale, node_id)
        )
        return self._actor

    async def _aresolve(self, stale: str | None = None) -> ActorHandle:
        self._actor, self._actor_id = await self.directory.resolve.remote(
            self.name, self.create, stale, None
        )
        return self._actor

    def wake(self, node_id: str | None = None) -> dict[str, Any]:
        """Bind now (optionally on a given node); returns where it lives."""
        self._resolve(node_id=node_id)
        return ray.get(self.directory.live_actor.remote(self.name))

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        stale = None
        for attempt in range(_ATTEMPTS):
            actor = (
                self._actor if self._actor is not None and stale is None else self._resolve(stale)
            )
            try:
                return ray.get(getattr(actor, method).remote(self.name, *args, **kwargs))
            except _RETRYABLE:
                if attempt == _ATTEMPTS - 1:
                    raise
                stale, self._actor = self._actor_id, None
        raise AssertionError("unreachable")

    async def acall(self, method: str, *args: Any, **kwargs: Any) -> Any:
        stale = None
        for attempt in range(_ATTEMPTS):
            if self._actor is None or stale is not None:
                actor = await self._aresolve(stale)
            else:
                actor = self._actor
            try:
                return await getattr(actor, method).remote(self.name, *args, **kwargs)
            except _RETRYABLE:
                if attempt == _ATTEMPTS - 1:
                    raise
                stale, self._actor = self._actor_id, None
                await asyncio.sleep(0)
        raise AssertionError("unreachable")

    def invoke(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call any public method of the hosted agent."""
        return self.call("invoke", method, *args, **kwargs)

    async def ainvoke(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await self.acall("invoke", method, *args, **kwargs)

    # -- chat ------------------------------------------------------------------------

    def chat(self, message: Any = None, callback: Any = None, **kw: Any) -> dict[str, Any]:
        """One turn. ``callback`` may be an actor handle (chunks are relayed to it in
        batches) or a local object with ``on_event``/``on_done``/``on_error``."""
        if callback is None or isinstance(callback, ActorHandle):
            return self.call("chat", message, callback, **kw)
        stream = self.stream_chat(message, **kw)
        for chunk in stream:
            callback.on_event(chunk)
        result = self.call("wait_run", stream.run_id) or self._last_result(stream)
        if result.get("status") == "error" and hasattr(callback, "on_error"):
            callback.on_error(result.get("error"))
        elif hasattr(callback, "on_done"):
            callback.on_done()
        return result

    def _last_result(self, stream: ChatStream) -> dict[str, Any]:
        return {"run_id": stream.run_id, "status": "completed"}

    async def achat(self, message: Any = None, callback: Any = None, **kw: Any) -> dict:
        return await self.acall("chat", message, callback, **kw)

    def start_chat(self, message: Any = None, callback: Any = None, **kw: Any) -> dict:
        """Start a turn; returns ``run_id`` and an abort ``receiver`` at once."""
        return self.call("start_chat", message, callback, **kw)

    async def astart_chat(self, message: Any = None, callback: Any = None, **kw: Any) -> dict:
        return await self.acall("start_chat", message, callback, **kw)

    def wait_run(self, run_id: str) -> dict[str, Any] | None:
        return self.call("wait_run", run_id)

    async def await_run(self, run_id: str) -> dict[str, Any] | None:
        return await self.acall("wait_run", run_id)

    def _open_stream(self, method: str, *args: Any, **kw: Any) -> tuple[dict[str, Any], Any]:
        stale = None
        for attempt in range(_ATTEMPTS):
            actor = (
                self._actor if self._actor is not None and stale is None else self._resolve(stale)
            )
            refs = getattr(actor, method).remote(self.name, *args, **kw)
            try:
                header = ray.get(next(refs))
                return header, refs
            except _RETRYABLE:
                if attempt == _ATTEMPTS - 1:
                    raise
                stale, self._actor = self._actor_id, None
        raise AssertionError("unreachable")

    def stream_chat(self, message: Any = None, **kw: Any) -> ChatStream:
        """Iterate the turn's chunks live (Ray streaming generator, batched)."""
        return ChatStream(*self._open_stream("chat_stream", message, **kw))

    async def _aopen_stream(self, method: str, *args: Any, **kw: Any) -> AsyncChatStream:
        stale = None
        for attempt in range(_ATTEMPTS):
            if self._actor is None or stale is not None:
                actor = await self._aresolve(stale)
            else:
                actor = self._actor
            refs = getattr(actor, method).remote(self.name, *args, **kw)
            try:
                header = await (await refs.__anext__())
                return AsyncChatStream(header, refs)
            except _RETRYABLE:
                if attempt == _ATTEMPTS - 1:
                    raise
                stale, self._actor = self._actor_id, None
        raise AssertionError("unreachable")

    async def astream_chat(self, message: Any = None, **kw: Any) -> AsyncChatStream:
        return await self._aopen_stream("chat_stream", message, **kw)

    def resume(self, session_id: str | None = None, run_id: str | None = None) -> ChatStream:
        """Replay the current or last run from chunk 0, then follow it live."""
        return ChatStream(*self._open_stream("resume", session_id, run_id))

    async def aresume(
        self, session_id: str | None = None, run_id: str | None = None
    ) -> AsyncChatStream:
        return await self._aopen_stream("resume", session_id, run_id)

    def abort(self, session_id: str | None = None, reason: str = "aborted") -> bool:
        return self.call("abort", session_id, reason)

    def status(self, session_id: str | None = None) -> dict[str, Any]:
        return self.call("status", session_id)

    # -- agent operations (all through invoke) ---------------------------------------

    def configure(self, config: dict[str, Any]) -> None:
        self.invoke("configure", config)

    def get_config(self) -> dict[str, Any] | None:
        return self.invoke("get_config")

    def history(self, session_id: str | None = None) -> list[dict[str, Any]]:
        return self.invoke("get_history", session_id)

    def create_session(self, name: str = "New Chat", **kw: Any) -> Any:
        return self.invoke("create_session", name, **kw)

    def sessions(self) -> list[Any]:
        return self.invoke("get_sessions")

    def hibernate(self, force: bool = False) -> bool:
        return ray.get(self.directory.hibernate.remote(self.name, force))

    async def ahibernate(self, force: bool = False) -> bool:
        return await self.directory.hibernate.remote(self.name, force)

    def stream(self, method: str, *args: Any, **kwargs: Any) -> ChatStream:
        """Iterate an async-generator method of the agent (it yields chunk lists)."""
        return ChatStream(*self._open_stream("invoke_stream", method, *args, **kwargs))

    async def astream(self, method: str, *args: Any, **kwargs: Any) -> AsyncChatStream:
        return await self._aopen_stream("invoke_stream", method, *args, **kwargs)

    def where(self) -> dict[str, Any] | None:
        """The live actor hosting this agent, or None if hibernated."""
        return ray.get(self.directory.live_actor.remote(self.name))
