"""Every public exception: one root, the right built-in mix-ins, and intact after pickle
and after a trip through a Ray actor call (Ray carries errors by pickle)."""

from __future__ import annotations

import inspect
import pickle
from typing import Any

import pytest
import thinkray.actors
import thinkray.actors.errors as actor_errors
import thinkray.runtime
import thinkray.runtime.errors as runtime_errors
import thinkray.storage
import thinkray.storage.errors as storage_errors
from thinkray.storage.errors import ThinkrayError, UserError

from tests.helpers import Raiser

# Constructors that take more than a message, with arguments that exercise every field.
SAMPLES: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "RemoteCallError": (("no method 'x'", "x", ("chat", "abort")), {}),
    "ModelSwitchError": ((), {"needed": 120_000, "window": 8_000}),
    "InboxMessageFailedError": (("msg-1", "the model failed"), {}),
    "SummarizerError": (("rate limited",), {"transient": True}),
    "ModelError": (("overloaded",), {"transient": True, "status_code": 529, "retry_after": 2.5}),
    "AbortError": (("aborted by parent",), {}),
    "UnsafePathError": (("../etc/passwd", "escapes the workspace"), {}),
    "SessionBusyError": (("s-1", "run-9"), {}),
    "NotBoundError": (("agent-a", "agent-b"), {}),
    "ActorBusyError": (("binding", "agent-a"), {}),
    "WakeError": (("agent-a", "RuntimeError: the hook broke"), {"clean": False}),
    "CallInterruptedError": (("the actor died", "configure"), {}),
    "RunInterruptedError": (
        ("the actor died mid-turn", "chat"),
        {"session_id": "s-1", "message_id": "msg-1", "run_id": "run-1"},
    ),
}


def _public_exceptions() -> list[type[BaseException]]:
    seen: dict[type, None] = {}
    for module in (storage_errors, runtime_errors, actor_errors):
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, type) and issubclass(value, BaseException):
                seen[value] = None
    return list(seen)


ALL = _public_exceptions()


def make(cls: type[BaseException]) -> BaseException:
    args, kwargs = SAMPLES.get(cls.__name__, ((f"{cls.__name__} happened",), {}))
    return cls(*args, **kwargs)


def fields(error: BaseException) -> dict[str, Any]:
    return {"type": type(error), "str": str(error), "args": error.args, **vars(error)}


def test_the_walk_covers_every_layer() -> None:
    names = {cls.__name__ for cls in ALL}
    # one from each layer, and the ones whose constructors used to break unpickling
    assert {"DatabaseLockedError", "SessionBusyError", "NotBoundError"} <= names
    assert {"InboxMessageFailedError", "BridgeAccessError", "RemoteCallError"} <= names
    assert len(ALL) >= 60


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_one_root(cls: type[BaseException]) -> None:
    assert issubclass(cls, ThinkrayError), f"{cls.__name__} is not a ThinkrayError"


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_survives_pickle_with_message_and_fields(cls: type[BaseException]) -> None:
    error = make(cls)
    copy = pickle.loads(pickle.dumps(error))
    assert fields(copy) == fields(error)
    # a custom __str__ must not leak quotes or reprs into the message
    assert not str(copy).startswith(("'", '"'))


@pytest.mark.parametrize("cls", [c for c in ALL if c.__name__ in SAMPLES], ids=lambda c: c.__name__)
def test_custom_fields_survive(cls: type[BaseException]) -> None:
    error = make(cls)
    extra = vars(error)
    assert extra, f"{cls.__name__} is in SAMPLES but carries no fields"
    assert vars(pickle.loads(pickle.dumps(error))) == extra


def test_message_is_formatted_once() -> None:
    # SessionBusyError and NotBoundError format their message from their fields; a
    # naive pickle calls __init__ with the formatted message and formats it again.
    for error in (runtime_errors.SessionBusyError("s-1", "r-1"), actor_errors.NotBoundError("a")):
        copy = pickle.loads(pickle.dumps(error))
        assert str(copy) == str(error)
        assert str(copy).count("s-1" if "s-1" in str(error) else "'a'") == 1


def test_user_errors_are_caller_mistakes_with_builtin_mixins() -> None:
    assert issubclass(storage_errors.NotFoundError, KeyError)
    assert issubclass(storage_errors.InvalidInputError, ValueError)
    assert issubclass(runtime_errors.InvalidArgumentError, UserError)
    assert issubclass(runtime_errors.RemoteCallError, UserError)
    assert issubclass(actor_errors.BridgeAccessError, PermissionError)
    assert issubclass(runtime_errors.OperationTimeoutError, TimeoutError)
    assert not issubclass(runtime_errors.ModelError, UserError)
    # KeyError's repr-quoting is undone: the message reads as written
    assert str(storage_errors.SessionNotFoundError("session 's' not found")) == (
        "session 's' not found"
    )


def test_each_layer_exports_its_errors_and_the_roots() -> None:
    for package in (thinkray.storage, thinkray.runtime, thinkray.actors):
        assert "ThinkrayError" in package.__all__ and "UserError" in package.__all__
    # an error module re-exports the layer below, so one import finds them all
    assert set(storage_errors.__all__) <= set(runtime_errors.__all__)
    assert set(runtime_errors.__all__) <= set(actor_errors.__all__)
    for module in (storage_errors, runtime_errors, actor_errors):
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isclass(value):
                assert value.__doc__, f"{name} has no docstring"


@pytest.mark.ray
def test_every_exception_crosses_a_ray_actor_call(ray_local: Any) -> None:
    ray = ray_local
    actor = ray.remote(num_cpus=0)(Raiser).remote()
    try:
        for cls in ALL:
            error = make(cls)
            # as a value, both ways
            assert fields(ray.get(actor.echo.remote(error))) == fields(error)
            # raised inside the actor: Ray's wrapper is still an instance of the class,
            # and the cause it carries has the message and fields intact
            with pytest.raises(cls) as caught:
                ray.get(actor.raise_it.remote(error))
            cause = caught.value.cause if hasattr(caught.value, "cause") else caught.value
            assert fields(cause) == fields(error), cls.__name__
    finally:
        ray.kill(actor)
