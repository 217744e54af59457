"""Tools: declared from typed Python functions or pydantic models.

Arguments are validated against the declared types before a tool runs; input that
fails validation never reaches the tool and goes back to the model as a tool error.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_type_hints, runtime_checkable

from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from thinkray.runtime.abort import AbortSignal
from thinkray.runtime.errors import InvalidArgumentError, InvalidTypeError
from thinkray.runtime.errors import (
    ToolExecutionError as ToolExecutionError,
)
from thinkray.runtime.errors import (  # re-exported: the errors live in thinkray.runtime.errors
    ToolInputError as ToolInputError,
)
from thinkray.runtime.models.base import ToolSpec

Executor = Literal["inline", "local", "external"]

DEFAULT_EXTERNAL_TIMEOUT = 900.0
"""Seconds an ``external`` call may take, from the moment it is written, when its
policy names no ``timeout``: a dead or absent executor never leaves a turn waiting,
its session busy and its agent unable to hibernate."""

DEFAULT_LEASE = 30.0
"""Seconds an external executor's claim holds without a renewal (SQS's default
visibility timeout)."""


@dataclass(frozen=True)
class ToolPolicy:
    """How a tool's calls run: ``executor`` (:mod:`thinkray.runtime.tools.durable`:
    ``inline`` in the turn, ``local`` by a decoupled executor in the agent, ``external``
    by another actor or process through the agent's remote API), ``timeout`` seconds
    before a call is ``cancelled-by-timeout`` (None: none for inline and local calls,
    :data:`DEFAULT_EXTERNAL_TIMEOUT` for external ones; ``math.inf``: none at all), and
    what happens to a call found ``executing`` after a crash: ``on_crash="fail"`` (the
    default: the tool may have had effects) or ``"retry"`` (the tool is idempotent).

    ``lease``: an external executor's claim lapses this many seconds after it was made
    or last renewed (``renew_tool_call``; :class:`~thinkray.runtime.tools.worker.ToolCallWorker`
    renews on its own while it runs the tool); the call then goes back to ``pending``
    for another executor. Such a call can so run more than once when an executor dies:
    its id is the idempotency key, and ``attempts`` > 1 says it was claimed before."""

    executor: Executor = "inline"
    timeout: float | None = None
    on_crash: Literal["fail", "retry"] = "fail"
    lease: float = DEFAULT_LEASE

    def __post_init__(self) -> None:
        if self.timeout is not None and not _positive(self.timeout, allow_inf=True):
            raise InvalidArgumentError(
                f"timeout must be a positive number or None, not {self.timeout!r}"
            )
        if not _positive(self.lease, allow_inf=False):
            raise InvalidArgumentError(
                f"lease must be a positive finite number, not {self.lease!r}"
            )

    @property
    def decoupled(self) -> bool:
        """Whether the turn waits for another executor rather than running the tool."""
        return self.executor != "inline"

    @property
    def deadline(self) -> float | None:
        """Seconds a call may take before it is ``cancelled-by-timeout`` (None: no
        limit): ``timeout``, or the external default."""
        if self.timeout is None:
            return DEFAULT_EXTERNAL_TIMEOUT if self.executor == "external" else None
        return None if self.timeout == float("inf") else float(self.timeout)


def _positive(value: object, *, allow_inf: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return False
    return value > 0 and (allow_inf or value != float("inf"))


@dataclass
class ToolContext:
    """What a running tool may know about its call.

    ``signal`` fires on abort: long-running tools should watch it (or await with it);
    tools that do not are left to finish naturally (seed 002 "Interruption").
    """

    tool_call_id: str
    tool_name: str
    signal: AbortSignal
    session_id: str | None = None
    run_id: str | None = None
    agent: Any = None
    extras: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Tool(Protocol):
    """A tool the model can call.

    Contract: ``validate`` raises :class:`ToolInputError` and has no side effects;
    ``execute`` receives validated input, returns a JSON-serializable result or
    raises (any exception becomes a tool error for the model); on abort the loop
    stops waiting for it and finalizes the call as an error.
    """

    name: str
    description: str

    @property
    def input_schema(self) -> dict[str, Any]:
        """The JSON schema of the input (an ``object``), as the model sees it."""
        ...

    def validate(self, raw_input: Any) -> Any:
        """Turn the model's raw input (a dict, or JSON text) into what :meth:`execute`
        takes.

        Raises:
            ToolInputError: the input does not fit the schema; the model reads why.
        """
        ...

    async def execute(self, input: Any, ctx: ToolContext) -> Any:
        """Run the tool on validated ``input``; return a JSON-serializable result.
        Any exception becomes a tool error for the model."""
        ...


def tool_spec(t: Tool) -> ToolSpec:
    """The :class:`ToolSpec` (name, description, input schema) a model is given for ``t``."""
    return ToolSpec(name=t.name, description=t.description, input_schema=t.input_schema)


class ModelTool:
    """A tool whose input is a pydantic model, executed by ``fn(input_model[, ctx])``."""

    def __init__(
        self,
        name: str,
        input_model: type[BaseModel],
        fn: Callable[..., Any],
        description: str = "",
        *,
        wants_context: bool | None = None,
        spread: bool = False,
        policy: ToolPolicy | None = None,
    ) -> None:
        self.name = name
        self.policy = policy or ToolPolicy()
        self.description = description
        self.input_model = input_model
        self.fn = fn
        self._spread = spread
        if wants_context is None:
            wants_context = "ctx" in inspect.signature(fn).parameters
        self._wants_context = wants_context
        self._blocking = not (
            inspect.iscoroutinefunction(fn)
            or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004
        )
        self._schema = _schema_of(input_model)

    @property
    def input_schema(self) -> dict[str, Any]:
        """``input_model``'s JSON schema, without pydantic's titles."""
        return self._schema

    def validate(self, raw_input: Any) -> BaseModel:
        """Parse ``raw_input`` (a dict, JSON text, or ``None``/``""`` for no
        arguments) into an ``input_model`` instance.

        Raises:
            ToolInputError: invalid JSON, or fields that do not validate (each named).
        """
        if isinstance(raw_input, str):
            try:
                raw_input = json.loads(raw_input) if raw_input.strip() else {}
            except json.JSONDecodeError as exc:
                raise ToolInputError(f"input is not valid JSON: {exc}") from exc
        if raw_input is None:
            raw_input = {}
        try:
            return self.input_model.model_validate(raw_input)
        except ValidationError as exc:
            raise ToolInputError(_format_validation(self.name, exc)) from exc

    async def execute(self, input: Any, ctx: ToolContext) -> Any:
        """Call ``fn`` with the validated model (or its fields as keywords, for a
        ``@tool`` function) and ``ctx`` when it takes one; await the result if it is
        awaitable. A pydantic result is dumped to JSON-ready data."""
        kwargs: dict[str, Any] = {}
        if self._wants_context:
            kwargs["ctx"] = ctx
        if self._spread:
            call = functools.partial(
                self.fn, **{k: getattr(input, k) for k in type(input).model_fields}, **kwargs
            )
        else:
            call = functools.partial(self.fn, input, **kwargs)
        if self._blocking:
            # A plain function may block (file or network I/O, a sleep, heavy work): it
            # runs in a thread so that the event loop it would stall keeps serving the
            # agent's control calls and, on an agent host, its sibling agents. An
            # abort stops the wait, not the thread (as for any tool that ignores
            # ``ctx.signal``).
            result = await asyncio.to_thread(call)
        else:
            result = call()
        if inspect.isawaitable(result):
            result = await result
        if isinstance(result, BaseModel):
            result = result.model_dump(mode="json")
        return result


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    policy: ToolPolicy | None = None,
) -> Any:
    """Declare a tool from a typed function; parameters become the input schema.

    ``@tool`` or ``@tool(name=..., description=..., policy=...)``. A parameter named
    ``ctx`` receives the :class:`ToolContext` and is not part of the schema. The
    description defaults to the docstring. ``policy`` (:class:`ToolPolicy`): who
    executes its calls, their timeout, and what a crash mid-call means.
    """

    def build(f: Callable[..., Any]) -> ModelTool:
        sig = inspect.signature(f)
        return ModelTool(
            name or f.__name__,
            _input_model(f, sig),
            f,
            (description or inspect.getdoc(f) or "").strip(),
            wants_context="ctx" in sig.parameters,
            spread=True,
            policy=policy,
        )

    if fn is not None:
        return build(fn)
    return build


# Input models by the function's code and signature: an agent's get_tools() builds its
# tools at every wake (often as closures, a new function each time), and a pydantic
# model and its schema cost ~2 ms to build. Bounded: cleared when full.
_MODELS: dict[tuple[Any, ...], type[BaseModel]] = {}
_MAX_MODELS = 1024


def _input_model(f: Callable[..., Any], sig: inspect.Signature) -> type[BaseModel]:
    """The pydantic model of ``f``'s parameters (``ctx`` excluded)."""
    hints = get_type_hints(f)
    fields: dict[str, Any] = {}
    for pname, param in sig.parameters.items():
        if pname == "ctx":
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise InvalidTypeError(f"tool {f.__name__}: *args/**kwargs are not supported")
        annotation = hints.get(pname, Any)
        default = param.default if param.default is not param.empty else ...
        fields[pname] = (annotation, default)
    key = (getattr(f, "__code__", None), f.__name__, *fields.items())
    try:
        cached = _MODELS.get(key)
    except TypeError:  # an unhashable annotation or default: build it every time
        key, cached = (), None
    if cached is not None:
        return cached
    model = create_model(
        f"{f.__name__}_input", __config__=ConfigDict(extra="forbid", defer_build=True), **fields
    )
    if key and key[0] is not None:
        if len(_MODELS) >= _MAX_MODELS:
            _MODELS.clear()
        _MODELS[key] = model
    return model


def tool_from_model(
    name: str,
    input_model: type[BaseModel],
    fn: Callable[[Any], Any] | Callable[[Any, ToolContext], Awaitable[Any]],
    description: str | None = None,
) -> ModelTool:
    """A tool whose input is ``input_model``; ``fn(input[, ctx=...])``."""
    return ModelTool(name, input_model, fn, description or (input_model.__doc__ or "").strip())


_SCHEMAS: weakref.WeakKeyDictionary[type[BaseModel], dict[str, Any]] = weakref.WeakKeyDictionary()


def _schema_of(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s cleaned JSON schema, built once per model (see ``_MODELS``)."""
    schema = _SCHEMAS.get(model)
    if schema is None:
        schema = _SCHEMAS[model] = _clean_schema(model.model_json_schema())
    return schema


def _clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    schema = dict(schema)
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    schema.setdefault("type", "object")
    return schema


def _format_validation(tool_name: str, exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ())) or "input"
        problems.append(f"{loc}: {err.get('msg')}")
    return f"invalid input for tool {tool_name!r}: " + "; ".join(problems)


async def run_tool(t: Tool, input: Any, ctx: ToolContext) -> Any:
    """Execute with abort: when ``ctx.signal`` fires, stop waiting and raise."""
    from thinkray.runtime.abort import AbortError

    task = asyncio.ensure_future(t.execute(input, ctx))
    if ctx.signal.aborted:
        task.cancel()
        raise AbortError(ctx.signal.reason or "aborted")
    abort_wait = asyncio.ensure_future(ctx.signal.wait())
    try:
        done, _ = await asyncio.wait({task, abort_wait}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        raise AbortError(ctx.signal.reason or "aborted")
    finally:
        abort_wait.cancel()
