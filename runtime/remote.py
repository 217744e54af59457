"""Marking the methods an agent exposes through its actor: ``@remote``.

Only methods decorated with :func:`remote` (on the agent's class or any base class) can
be called through an actor handle; everything else on an agent — ``close``,
``persist_message``, the store — stays local to the actor that hosts it. A subclass
that overrides a remote method keeps it remote.

Inside the actor a remote method is an ordinary method: ``agent.branch(...)`` calls it
directly. Accessed on the *class*, it is the :class:`RemoteMethod` descriptor, whose
``remote(...)`` carries the method's own signature — that is what lets a type checker
check ``handle.branch.remote(session_id, message_id)`` (a handle is typed as
``AgentHandle[A] | type[A]``, the pattern of Ray's ``ActorProxy``). The Ray layer
provides the concrete :class:`Response` and :class:`ResponseStream`; this module
imports no Ray.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Iterator
from typing import (
    Any,
    Concatenate,
    Generic,
    Literal,
    ParamSpec,
    Protocol,
    Self,
    TypeVar,
    overload,
)

from thinkray.runtime.errors import InvalidTypeError, RemoteCallError

__all__ = [
    "Batch",
    "RemoteKind",
    "RemoteCallMethod",
    "RemoteMethod",
    "RemoteStreamMethod",
    "Response",
    "ResponseStream",
    "arguments_error",
    "check_arguments",
    "idempotent",
    "remote",
    "remote_methods",
]

P = ParamSpec("P")
S = TypeVar("S")
T = TypeVar("T")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

RemoteKind = Literal["call", "stream"]
"""``call``: one result (sync or async method). ``stream``: an async generator, whose
items a handle relays as they are produced."""


class Response(Protocol[R_co]):
    """What ``handle.method.remote(...)`` returns: one object for sync and async callers.

    ``await response`` in async code; ``response.result(timeout_s=...)`` in sync code
    (it refuses to block inside a running event loop and names ``await`` instead).
    Errors the method raised are raised again from either, with their type intact."""

    def result(self, timeout_s: float | None = None) -> R_co:
        """Block until the call finished; return its value or raise its error."""
        ...

    def __await__(self) -> Generator[Any, None, R_co]: ...


class ResponseStream(Protocol[R_co]):
    """What ``handle.stream_method.remote(...)`` returns: the method's items, in order,
    by ``for`` (sync) or ``async for``. Leaving early detaches; it never aborts.

    A chat stream's header (``run_id``, ``session_id``, ``message_id``, ``receiver``)
    is known once the stream opened: at once in sync code, after ``await
    stream.start()`` (or the first item) in async code."""

    def __iter__(self) -> Iterator[R_co]: ...

    def __aiter__(self) -> AsyncIterator[R_co]: ...

    async def start(self) -> ResponseStream[R_co]:
        """Open the stream now (async code) and return it, header known."""
        ...

    @property
    def header(self) -> dict[str, Any]:
        """What the agent sent first (empty until the stream opened)."""
        ...

    @property
    def run_id(self) -> str | None:
        """The run a chat or resume stream follows, else None."""
        ...

    @property
    def session_id(self) -> str | None:
        """The session of a chat stream's run, else None."""
        ...

    @property
    def message_id(self) -> str | None:
        """The assistant message id of a chat stream's run, else None."""
        ...

    @property
    def receiver(self) -> Any:
        """The run's serializable abort receiver (chat streams), else None."""
        ...

    @property
    def live(self) -> bool:
        """False when a resume replays a run that already finished."""
        ...

    def abort(self, reason: str = "aborted") -> bool:
        """Abort the run this stream follows; False if there is none or it ended."""
        ...


class RemoteMethod(Generic[S, P, T, R]):
    """A method marked remote-callable (see :func:`remote`): the marker the Ray layer
    reads (``kind``, ``signature``). Its ``remote(...)`` is typed by the subclass,
    :class:`RemoteCallMethod` or :class:`RemoteStreamMethod`.

    ``T`` is what a direct call returns (a coroutine for an async method), ``R`` what a
    remote caller gets once it resolves the :class:`Response`."""

    def __init__(self, fn: Callable[Concatenate[S, P], T], kind: RemoteKind) -> None:
        self.fn = fn
        self.kind: RemoteKind = kind
        # Set by @idempotent: a handle may re-send the call after the actor died mid-call.
        self.idempotent = False
        self.name = fn.__name__
        self.signature = inspect.signature(fn)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        self.__name__ = fn.__name__
        self.__qualname__ = getattr(fn, "__qualname__", fn.__name__)

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Self: ...

    @overload
    def __get__(self, obj: S, owner: type | None = None) -> Callable[P, T]: ...

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return types.MethodType(self.fn, obj)

    def __call__(self, obj: S, *args: P.args, **kwargs: P.kwargs) -> T:
        """Unbound call (``Think.branch(agent, ...)``), as for a plain function."""
        return self.fn(obj, *args, **kwargs)

    def _on_class(self) -> InvalidTypeError:
        return InvalidTypeError(
            f"{self.name}.remote() is called on an agent handle "
            f"(handle.{self.name}.remote(...)), not on the agent class"
        )


class RemoteCallMethod(RemoteMethod[S, P, T, R]):
    """A remote sync or coroutine method: ``remote(...)`` returns one
    :class:`Response`."""

    def remote(self, *args: P.args, **kwargs: P.kwargs) -> Response[R]:
        """Call through an actor handle. On the class itself this only types the call:
        reach it as ``handle.<method>.remote(...)``."""
        raise self._on_class()


class RemoteStreamMethod(RemoteMethod[S, P, T, R]):
    """A remote async-generator method: ``remote(...)`` returns a
    :class:`ResponseStream` of its items."""

    def remote(self, *args: P.args, **kwargs: P.kwargs) -> ResponseStream[R]:
        """Call through an actor handle; returns the stream of items."""
        raise self._on_class()


def _marker(fn: Callable[..., Any], kind: RemoteKind) -> RemoteMethod[Any, Any, Any, Any]:
    if kind == "stream":
        return RemoteStreamMethod(fn, kind)
    return RemoteCallMethod(fn, kind)


@overload
def remote(
    fn: Callable[Concatenate[S, P], Coroutine[Any, Any, R]],
) -> RemoteCallMethod[S, P, Coroutine[Any, Any, R], R]: ...


@overload
def remote(  # type: ignore[overload-overlap]  # an async generator fits the catch-all below too; the first match wins
    fn: Callable[Concatenate[S, P], AsyncIterator[R]],
) -> RemoteStreamMethod[S, P, AsyncIterator[R], R]: ...


@overload
def remote(fn: Callable[Concatenate[S, P], R]) -> RemoteCallMethod[S, P, R, R]: ...


def remote(fn: Callable[..., Any]) -> Any:
    """Mark an agent method as callable through an actor handle.

    Works on sync methods, coroutine methods and async generators (streamed to the
    caller item by item). Takes the function; returns a :class:`RemoteMethod`
    descriptor. Raises ``TypeError`` on something that is not a function."""
    if isinstance(fn, RemoteMethod):
        return fn
    if not inspect.isfunction(fn):
        raise InvalidTypeError(f"@remote decorates a function defined in a class, not {fn!r}")
    return _marker(fn, "stream" if inspect.isasyncgenfunction(fn) else "call")


M = TypeVar("M", bound=RemoteMethod[Any, Any, Any, Any])


def idempotent(method: M) -> M:
    """Mark a ``@remote`` method safe to run twice (a read, or a write whose repeat
    changes nothing): when its actor dies mid-call, a handle re-sends it to the woken
    agent. Place it above ``@remote``.

    Any other remote method is never re-sent once it may have started: the caller gets
    :class:`~thinkray.runtime.errors.CallInterruptedError` (for a turn,
    :class:`~thinkray.runtime.errors.RunInterruptedError`) instead.

    Raises:
        InvalidTypeError: ``method`` is not a ``@remote`` method (the order is wrong).
    """
    if not isinstance(method, RemoteMethod):
        raise InvalidTypeError("@idempotent goes above @remote (it marks a remote method)")
    method.idempotent = True
    return method


_REGISTRY_CACHE: dict[type, dict[str, RemoteMethod[Any, Any, Any, Any]]] = {}


def remote_methods(cls: type) -> dict[str, RemoteMethod[Any, Any, Any, Any]]:
    """Every remote-callable method of ``cls``: name -> the most derived
    :class:`RemoteMethod` marking it (a plain override of a remote method stays remote
    and is described by the base's marker). Cached per class."""
    cached = _REGISTRY_CACHE.get(cls)
    if cached is not None:
        return cached
    found: dict[str, RemoteMethod[Any, Any, Any, Any]] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, RemoteMethod):
                found[name] = value
            elif name in found and callable(value):
                # A plain override keeps the method remote; its own signature governs.
                marker = _marker(value, found[name].kind)
                marker.name = name
                found[name] = marker
            elif name in found:
                del found[name]  # overridden by a non-callable: no longer a method
    _REGISTRY_CACHE[cls] = found
    return found


class Batch(list[T]):
    """Several items of a remote stream method sent as one: an async-generator method
    may yield a ``Batch`` of items (a run's chunks that accumulated, say); a remote
    caller still receives them one by one, in order."""


def check_arguments(
    marker: RemoteMethod[Any, Any, Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """Raise :class:`~thinkray.runtime.errors.RemoteCallError` unless ``args`` and
    ``kwargs`` fit the remote method's signature (``self`` excluded)."""
    try:
        marker.signature.bind(None, *args, **kwargs)
    except TypeError as exc:
        raise arguments_error(marker, exc) from None


def arguments_error(marker: RemoteMethod[Any, Any, Any, Any], exc: TypeError) -> RemoteCallError:
    """The :class:`~thinkray.runtime.errors.RemoteCallError` for arguments that do not
    fit the remote method (``exc``: what binding them to its signature raised)."""
    return RemoteCallError(f"{describe(marker)}: {exc}", marker.name)


def describe(marker: RemoteMethod[Any, Any, Any, Any]) -> str:
    """``name(param: type, ...)`` of a remote method, for error messages."""
    shown = []
    for param in list(marker.signature.parameters.values())[1:]:
        text = param.name
        if param.kind is param.VAR_POSITIONAL:
            text = "*" + text
        elif param.kind is param.VAR_KEYWORD:
            text = "**" + text
        if param.annotation is not param.empty:
            annotation = param.annotation
            text += f": {annotation if isinstance(annotation, str) else annotation.__name__}"
        if param.default is not param.empty:
            text += f" = {param.default!r}"
        shown.append(text)
    return f"{marker.name}({', '.join(shown)})"
