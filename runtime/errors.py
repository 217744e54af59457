"""Every exception the runtime raises on purpose, in one place."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from thinkray.storage.errors import *  # noqa: F403  # the storage errors a runtime user meets
from thinkray.storage.errors import ThinkrayError, UserError, WorkspaceError
from thinkray.storage.errors import __all__ as _storage_errors

if TYPE_CHECKING:
    from thinkray.runtime.usage import Usage

CONTEXT_SWITCH_ERROR = (
    "Switching to a model with a smaller context window would lose the conversation; "
    "consider branching with the new model."
)
"""Seed 002's message for a model switch that compaction cannot make fit."""

__all__ = [
    *_storage_errors,
    "AbortError",
    "AccessDeniedError",
    "AgentClosedError",
    "ApprovalExpiredError",
    "ApprovalNotFoundError",
    "BinaryFileError",
    "CallInterruptedError",
    "ClaimLostError",
    "CompactionError",
    "CompactionSpecLimitError",
    "DuplicateRunError",
    "DurableUnavailableError",
    "EditError",
    "ExtensionError",
    "InboxMessageFailedError",
    "InvalidAgentStateError",
    "InvalidArgumentError",
    "InvalidConfigError",
    "InvalidMessageError",
    "InvalidStateError",
    "MessageIdConflictError",
    "MessageTooLargeError",
    "ModelError",
    "ModelNotConfiguredError",
    "ModelSwitchError",
    "NoAgentStateError",
    "NoRunError",
    "NothingToAnswerError",
    "NothingToCompactError",
    "OperationTimeoutError",
    "RemoteCallError",
    "RunInterruptedError",
    "SandboxUnavailableError",
    "SessionBusyError",
    "StateChangeRefusedError",
    "SummarizerError",
    "ToolCallStateError",
    "ToolExecutionError",
    "ToolInputError",
    "ToolTimeoutError",
    "UnknownToolCallError",
    "UnknownJobError",
    "UnknownModelError",
    "UnknownRunError",
    "UnknownToolError",
    "UnsafePathError",
    "WorkerDepthError",
    "WorkerError",
    "WorkerInputError",
    "WorkerOutputError",
    "WorkerTimeoutError",
]


class RemoteCallError(UserError, AttributeError):
    """A call through an agent handle that the agent does not allow: the method is not
    remote-callable, or the arguments do not fit its signature. Nothing ran.

    ``method`` is the name called; ``allowed`` the remote-callable names."""

    def __init__(self, message: str, method: str = "", allowed: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.method = method
        self.allowed = tuple(allowed)

    def __reduce__(self) -> tuple[type, tuple[str, str, tuple[str, ...]]]:
        return type(self), (str(self), self.method, self.allowed)

    def __str__(self) -> str:  # AttributeError would repr a non-str argument
        return str(self.args[0]) if self.args else ""


class CallInterruptedError(ThinkrayError, RuntimeError):
    """The actor hosting the agent died while it ran a call that changes state. The
    call is not re-sent (it may have run in part); the agent wakes on the next call.

    ``method`` is the method called."""

    def __init__(self, message: str, method: str = "") -> None:
        super().__init__(message)
        self.method = method


class RunInterruptedError(CallInterruptedError):
    """A turn's actor died mid-turn. The turn is not re-run: what it wrote is kept and
    marked ``interrupted`` when the agent wakes (tool calls left open become errors).

    ``message_id`` is the user message the turn answered (re-sending a message with
    this id never stores it twice), ``run_id`` the turn, ``session_id`` its session
    when known."""

    def __init__(
        self,
        message: str,
        method: str = "chat",
        *,
        session_id: str | None = None,
        message_id: str | None = None,
        run_id: str | None = None,
    ) -> None:
        super().__init__(message, method)
        self.session_id = session_id
        self.message_id = message_id
        self.run_id = run_id


class UnknownRunError(UserError, LookupError):
    """No run with this id is in flight or among the recent results this agent keeps."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown run"


class InvalidMessageError(UserError, ValueError):
    """A message that is not a valid UIMessage. Raised before anything is written."""


class MessageTooLargeError(InvalidMessageError):
    """A message sent to an agent is larger than it accepts (``Think.max_user_message_bytes``,
    at most what one stored row holds). Refused whole, before anything is written: a
    message is never stored cut short without the sender knowing.

    ``size`` is the message's stored size in bytes (its parts and metadata, encoded as
    stored), ``limit`` the most the agent accepts."""

    def __init__(self, message: str, *, size: int | None = None, limit: int | None = None) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class WorkerError(ThinkrayError, RuntimeError):
    """Base class of worker failures (other than abort, which stays AbortError)."""


class WorkerInputError(WorkerError, UserError, ValueError):
    """The input does not match the worker's ``input_type``. Raised before any model call."""


class WorkerOutputError(WorkerError):
    """No valid output within ``max_steps``: the last validation problem is included."""


class WorkerTimeoutError(WorkerError, TimeoutError):
    """The run exceeded the worker's ``timeout``; it was aborted."""


class WorkerDepthError(WorkerError):
    """Workers calling workers nested deeper than ``max_depth``."""


class NoRunError(ThinkrayError, RuntimeError):
    """Something that needs a run in flight was used outside one."""


class NothingToAnswerError(UserError, ValueError):
    """A turn without a message was asked of an empty session."""


class DuplicateRunError(UserError, ValueError):
    """A run id that is already in flight was given to a new turn."""


class MessageIdConflictError(UserError, ValueError):
    """A turn's message id is taken by a message it cannot be: one of another session
    (message ids are unique per agent file), or one of this session that a rewind hid
    or later turns moved past. Nothing was written and no turn ran; send the message
    under a new id (the AI SDK's ``useChat`` makes a fresh one per message).

    ``message_id`` is the id, ``session_id`` the session the turn was for."""

    def __init__(self, message: str, message_id: str = "", session_id: str = "") -> None:
        super().__init__(message)
        self.message_id = message_id
        self.session_id = session_id


class ModelSwitchError(ThinkrayError, RuntimeError):
    """The selected model cannot hold the conversation, even after compaction."""

    def __init__(self, message: str = CONTEXT_SWITCH_ERROR, **details: Any) -> None:
        super().__init__(message)
        self.details = details


class ModelNotConfiguredError(UserError, NotImplementedError):
    """An agent has no model: none was passed, none is in its config, and ``get_model``
    is not overridden. Nothing falls back to a default model silently."""


class UnknownModelError(UserError, ValueError):
    """A model selection that ``resolve_model`` cannot map to a model."""


class InvalidConfigError(UserError, TypeError):
    """``configure`` was given something that is not a dict."""


class InboxMessageFailedError(ThinkrayError, RuntimeError):
    """The message was processed and its generation cycle failed (or was aborted)."""

    def __init__(self, message_id: str, error: str | None) -> None:
        super().__init__(f"message {message_id!r} failed: {error or 'unknown error'}")
        self.message_id = message_id
        self.error = error


class AgentClosedError(ThinkrayError, RuntimeError):
    """The agent closed (hibernation, dispose) while a caller waited for a reply. The
    message is kept and will be answered after the next wake."""


class CompactionError(ThinkrayError, RuntimeError):
    """Compaction could not run. Nothing was written."""


class NothingToCompactError(CompactionError, UserError):
    """The session is empty, or nothing lies before the tail."""


class CompactionSpecLimitError(CompactionError):
    """The history exceeds the summarizer's input and no recovery rung is enabled."""


class SummarizerError(CompactionError):
    """The summarizer failed (``transient``: worth a retry)."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class ApprovalNotFoundError(UserError, LookupError):
    """No approval with this id is waiting (unknown, already answered, or expired)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "approval not found"


class DurableUnavailableError(ThinkrayError, RuntimeError):
    """Fibers or schedules were used on an agent whose store has no database."""


class ModelError(ThinkrayError):
    """A model call failed. ``transient`` errors are retried by the loop with backoff
    (only while the step has emitted nothing, so no output is ever duplicated).

    ``usage`` is what the provider reported before the call broke (a stream cut after
    its first event was still billed for its input); the loop records it as the step's
    usage when the error ends the turn."""

    def __init__(
        self,
        message: str,
        *,
        transient: bool = False,
        status_code: int | None = None,
        retry_after: float | None = None,
        usage: Usage | None = None,
    ) -> None:
        super().__init__(message)
        self.transient = transient
        self.status_code = status_code
        self.retry_after = retry_after
        self.usage = usage


class AbortError(ThinkrayError):
    """Raised inside a run when its signal fires."""

    def __init__(self, reason: str = "aborted") -> None:
        super().__init__(reason)
        self.reason = reason


class UnsafePathError(UserError, ValueError):
    """A path that could escape the workspace or be misread by some layer.

    ``path`` is the offending input, ``reason`` a short human-readable cause.
    """

    def __init__(self, path: object, reason: str) -> None:
        self.path = path
        self.reason = reason
        shown = repr(path)
        if len(shown) > 120:
            shown = shown[:117] + "..."
        super().__init__(f"unsafe path {shown}: {reason}")


class ExtensionError(UserError, ValueError):
    """An extension could not be loaded, found or run. The message is for the model."""


class ToolInputError(UserError, ValueError):
    """The model's arguments did not validate. Sent back to the model as a tool error."""


class ToolExecutionError(ThinkrayError, RuntimeError):
    """A tool failed. Its message is sent back to the model as a tool error."""


class SandboxUnavailableError(ToolExecutionError):
    """Code was not run: the OS sandbox (bubblewrap) cannot start here and the agent has
    not opted into the weaker audit-hook-only mode (``allow_weak_sandbox``). The
    message says why it cannot start."""


class EditError(WorkspaceError, UserError, ValueError):
    """``edit_file`` could not apply: ``old_string`` not found, ambiguous, or no-op."""


class BinaryFileError(WorkspaceError, UserError, ValueError):
    """``read_file`` on content that is not UTF-8 text."""


class SessionBusyError(ThinkrayError, RuntimeError):
    """A run is already in flight for this session (one run per session at a time)."""

    def __init__(self, session_id: str, run_id: str | None = None) -> None:
        super().__init__(
            f"session {session_id!r} already has a run in flight"
            + (f" ({run_id})" if run_id else "")
            + "; wait for it to finish or abort it"
        )
        self.session_id = session_id
        self.run_id = run_id


class InvalidArgumentError(UserError, ValueError):
    """An argument with a value the call cannot take (the message says which and why)."""


class InvalidStateError(ThinkrayError, RuntimeError):
    """The object cannot do that now: it is closed, detached, or used outside the run
    or fiber the call needs."""


class OperationTimeoutError(ThinkrayError, TimeoutError):
    """A wait ran out of time before the thing waited for finished (it goes on)."""


class AccessDeniedError(UserError, PermissionError):
    """The caller's grant does not allow that operation."""


class InvalidAgentStateError(UserError, ValueError):
    """A state that does not fit the agent's ``state_model`` (or is not JSON, or is
    over ``max_state_bytes``); nothing was stored."""


class StateChangeRefusedError(AccessDeniedError):
    """The agent refused a state change: its clients may not set its state
    (``client_can_set_state``), or its ``validate_state_change`` hook said no; nothing
    was stored."""


class NoAgentStateError(UserError, LookupError):
    """The agent's class declares no ``state_model``: it has no synced state."""


class UnknownJobError(UserError, KeyError):
    """No background job has that id."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else "unknown job"


class UnknownToolError(UserError, LookupError):
    """No tool has that name."""


class UnknownToolCallError(UserError, LookupError):
    """No tool call has that id (in this agent's database)."""


class ToolCallStateError(UserError, ValueError):
    """A tool call is not in a state that allows the request: a result for a call that
    finished, or that another executor holds; a decision on a call that is not awaiting
    one. Nothing was changed."""


class ToolTimeoutError(ThinkrayError, TimeoutError):
    """A tool call ran past its tool's timeout (it is ``cancelled-by-timeout``)."""


class ClaimLostError(ToolCallStateError):
    """An executor reported on (or renewed) a tool call it no longer holds: its claim
    lapsed (no renewal within the lease) and the call went back to ``pending``, or
    another executor claimed it since. Nothing was changed; stop working on the call."""


class ApprovalExpiredError(ApprovalNotFoundError):
    """An answer came after the approval's ``expires_at``: the ask is
    ``cancelled-by-timeout`` (whatever happened to the process meanwhile) and the answer
    is refused; the tool never runs on it."""
