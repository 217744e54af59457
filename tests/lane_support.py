"""A LaneServer on an event loop in a thread, serving a fake ``invoke_stream``
(tests/test_lane.py, tests/security/test_sec_lane.py)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

from thinkray.actors import lane
from thinkray.actors.errors import NotBoundError
from thinkray.runtime.errors import SessionBusyError

TYPED: list[Any] = [[("a", 1)], [{1, 2}], [{"nested": ("t",)}]]
"""Items msgpack would change (a tuple) or refuse (a set): served for ``typed=True``."""


class Served:
    """A fake ``invoke_stream``: yields what the request's args say, records calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.closed = threading.Event()
        self.release = asyncio.Event()

    async def __call__(
        self, name: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], trace: Any
    ) -> AsyncIterator[Any]:
        self.calls.append((name, method, args, kwargs, trace))
        try:
            for item in TYPED if kwargs.get("typed") else kwargs.get("items", []):
                yield item
            raising = kwargs.get("raise")
            if raising == "busy":
                raise SessionBusyError("session s1 is busy")
            if raising == "value":
                raise ValueError("a plain bug")
            if raising == "unbound":
                raise NotBoundError(name, None)
            if kwargs.get("hold"):
                await self.release.wait()
                yield "after"
        finally:
            self.closed.set()


def request_for(server: lane.LaneServer, **kwargs: Any) -> bytes:
    """A request frame for the fake's ``count`` stream of agent-a, with ``kwargs``."""
    request = lane.request_bytes(server.address, "agent-a", "count", (1,), kwargs, None)
    assert request is not None
    return request


def read_all(stream: Any) -> list[Any]:
    """A blocking lane stream's items, read to its end."""
    out = []
    while True:
        try:
            out.append(stream.next_item())
        except StopIteration:
            return out


async def read_all_async(server: lane.LaneServer, request: bytes) -> list[Any]:
    """Open a stream with ``request`` from the running loop; its items, to its end."""
    stream = await lane.AsyncLaneStream.open(server.path, request)
    out = []
    while True:
        try:
            out.append(await stream.anext_item())
        except StopAsyncIteration:
            return out


async def _shut(server: lane.LaneServer) -> None:
    """Close ``server`` and let its connections' tasks see their connections closed
    (kept ones wait for a next request)."""
    server.close()
    for _ in range(10):
        await asyncio.sleep(0.01)
        if not server.serving_connections:
            return


@contextlib.contextmanager
def serving() -> Iterator[tuple[lane.LaneServer, Served, asyncio.AbstractEventLoop]]:
    """A started LaneServer, its fake, and the loop it runs on (closed after)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    serve = Served()
    server = lane.LaneServer(serve, "node-1")
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    yield server, serve, loop
    asyncio.run_coroutine_threadsafe(_shut(server), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()
