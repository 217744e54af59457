"""The plain records the store protocols take and return (:mod:`thinkray.storage.protocols`).

They carry no database: every implementation of a store builds and returns these, so
code written against the protocols (and the conformance suites) imports them from here
or from the protocols module, never from a back-end's module.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = [
    "AgentStateRecord",
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_MAX_FILE_BYTES",
    "DEFAULT_MAX_TOTAL_BYTES",
    "FIBER_STATUSES",
    "FINISHED_STATUSES",
    "INBOX_FINISHED",
    "INBOX_STATUSES",
    "JOB_FINISHED",
    "QUEUE_STATUSES",
    "QUEUE_WAITING",
    "QueuedTurn",
    "JOB_STATUSES",
    "SCHEDULE_KINDS",
    "TOOL_CALL_FINISHED",
    "TOOL_CALL_STATUSES",
    "TOOL_CALL_TRANSITIONS",
    "ToolCallAudit",
    "ToolCallRecord",
    "EntryInfo",
    "EntryKind",
    "FiberRecord",
    "FiberStatus",
    "InboxRow",
    "InboxStatus",
    "JobRecord",
    "JobStatus",
    "ScheduleKind",
    "ScheduleRecord",
    "SubAgentRecord",
    "SubAgentStatus",
    "WorkspaceLimits",
]

# -- fibers and schedules --------------------------------------------------------------

FiberStatus = Literal["running", "completed", "failed", "cancelled", "interrupted"]
"""``running`` until it ends; ``interrupted`` when a new incarnation found it orphaned
(it is then restarted, failed, or left ``interrupted`` if the host handled it)."""

FIBER_STATUSES: tuple[str, ...] = ("running", "completed", "failed", "cancelled", "interrupted")
FINISHED_STATUSES: tuple[str, ...] = ("completed", "failed", "cancelled")

ScheduleKind = Literal["once", "interval", "cron"]
"""``once`` runs at ``next_run_at`` and is then disabled; ``interval`` every
``interval_seconds`` (phase kept, missed runs coalesced into one); ``cron`` on a
5-field cron expression, in UTC."""

SCHEDULE_KINDS: tuple[str, ...] = ("once", "interval", "cron")


@dataclass
class FiberRecord:
    """One fiber. ``attempts`` counts attempts started (the first run is 1); a fiber is
    retried while ``attempts <= max_retries``."""

    id: str
    method: str
    status: str
    payload: Any = None
    checkpoint: Any = None
    attempts: int = 1
    max_retries: int = 3
    error: str | None = None
    result: Any = None
    created_at: float = 0.0
    updated_at: float = 0.0
    recovery_handled: bool = False

    @property
    def finished(self) -> bool:
        """Whether the fiber is completed, failed or cancelled (it will not run again)."""
        return self.status in FINISHED_STATUSES

    def to_dict(self) -> dict[str, Any]:
        """Every field, as a dict (values as stored: msgpack-serializable)."""
        return {
            "id": self.id,
            "method": self.method,
            "status": self.status,
            "payload": self.payload,
            "checkpoint": self.checkpoint,
            "attempts": self.attempts,
            "max_retries": self.max_retries,
            "error": self.error,
            "result": self.result,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "recovery_handled": self.recovery_handled,
        }


@dataclass
class ScheduleRecord:
    """One schedule. ``next_run_at is None`` means disabled (a once-task that ran)."""

    id: str
    method: str
    kind: str
    next_run_at: float | None
    payload: Any = None
    interval_seconds: float | None = None
    cron: str | None = None
    created_at: float = 0.0
    last_run_at: float | None = None
    runs: int = 0
    failures: int = 0
    last_error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        """Whether the schedule will run again (``next_run_at`` is set)."""
        return self.next_run_at is not None

    def to_dict(self) -> dict[str, Any]:
        """The fields and ``enabled``, as a dict (``extra`` left out)."""
        return {
            "id": self.id,
            "method": self.method,
            "kind": self.kind,
            "next_run_at": self.next_run_at,
            "enabled": self.enabled,
            "payload": self.payload,
            "interval_seconds": self.interval_seconds,
            "cron": self.cron,
            "created_at": self.created_at,
            "last_run_at": self.last_run_at,
            "runs": self.runs,
            "failures": self.failures,
            "last_error": self.last_error,
        }


# -- jobs ------------------------------------------------------------------------------

JobStatus = Literal["running", "completed", "failed", "cancelled", "interrupted"]
JOB_STATUSES: tuple[str, ...] = ("running", "completed", "failed", "cancelled", "interrupted")
JOB_FINISHED: tuple[str, ...] = ("completed", "failed", "cancelled", "interrupted")


@dataclass
class JobRecord:
    """One background job (an async tool's work). Everything but ``id`` and ``status``
    is opaque to the store; values must be msgpack-serializable."""

    id: str
    status: str
    kind: str = ""
    input: Any = None
    result: Any = None
    error: str | None = None
    parent: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    updated_at: float = 0.0
    # The last progress report of the running job (seed 003 §4.2): a fraction in
    # [0, 1] or a dict, and a short text; kept once the job ends.
    progress: Any = None
    message: str | None = None
    # A result (or error) the work produced after the job was cancelled, kept only under
    # the agent's ``late_tool_results = "store"`` policy: ``{"result", "error", "at"}``.
    late: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        """Whether the job is no longer ``running`` (completed, failed, cancelled or
        interrupted)."""
        return self.status in JOB_FINISHED

    def to_dict(self) -> dict[str, Any]:
        """Every field, as a dict; the id is under ``job_id``."""
        return {
            "job_id": self.id,
            "status": self.status,
            "kind": self.kind,
            "input": self.input,
            "result": self.result,
            "error": self.error,
            "parent": self.parent,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "progress": self.progress,
            "message": self.message,
            "late": self.late,
        }


# -- inbox -----------------------------------------------------------------------------

InboxStatus = Literal["pending", "processing", "done", "failed"]
"""``pending`` until the loop claims it, ``processing`` during its generation cycle,
then ``done`` (the reply is on the row) or ``failed`` (the error is)."""

INBOX_STATUSES: tuple[str, ...] = ("pending", "processing", "done", "failed")
INBOX_FINISHED: tuple[str, ...] = ("done", "failed")


@dataclass
class InboxRow:
    """One inbox message. ``content`` is what was sent (a string or a list of UIMessage
    parts); ``reply`` the answer written back; ``attempts`` counts the generation
    cycles that claimed the row (a crash mid-cycle leaves it ``processing``)."""

    id: str
    sender: str | None
    status: str
    created_at: float
    content: Any = None
    reply: str | None = None
    error: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    attempts: int = 0
    updated_at: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        """Whether the row is ``done`` or ``failed``."""
        return self.status in INBOX_FINISHED

    def to_dict(self) -> dict[str, Any]:
        """Every field, as a dict (``extra`` only when it is not empty)."""
        return {
            "id": self.id,
            "sender": self.sender,
            "status": self.status,
            "created_at": self.created_at,
            "content": self.content,
            "reply": self.reply,
            "error": self.error,
            "metadata": self.metadata,
            "attempts": self.attempts,
            "updated_at": self.updated_at,
            **({"extra": self.extra} if self.extra else {}),
        }


# -- messages sent while a turn runs (thinkray.storage.turn_queue) ----------------------

QUEUE_STATUSES: tuple[str, ...] = (
    "queued",
    "running",
    "answered",
    "steered",
    "superseded",
    "cancelled",
    "failed",
)
QUEUE_WAITING: tuple[str, ...] = ("queued",)


@dataclass
class QueuedTurn:
    """A user message that waits for (or got) its turn. ``message`` is the UIMessage
    as sent; ``mode`` the busy policy it came under; ``run_id`` and ``assistant_id``
    the ids its turn will use (fixed when it is queued, so a waiter can follow it);
    ``target_run`` the run a ``steer`` joins; ``outcome`` what became of it
    (``status``, ``run_id``, ``superseded_by``, ``error``)."""

    id: str
    session_id: str
    status: str = "queued"
    seq: float = 0.0
    message: dict[str, Any] = field(default_factory=dict)
    mode: str = "queue"
    run_id: str = ""
    assistant_id: str = ""
    attempts: int = 0
    created_at: float = 0.0
    updated_at: float = 0.0
    target_run: str | None = None
    outcome: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Every field, as a dict."""
        return asdict(self)


# -- sub-agent registry ----------------------------------------------------------------

SubAgentStatus = Literal["idle", "busy", "error"]


@dataclass
class SubAgentRecord:
    """One sub-agent of an orchestrator, keyed by ``name``."""

    name: str
    id: str
    config: dict[str, Any] = field(default_factory=dict)
    access: str = "read-write"
    status: SubAgentStatus = "idle"
    last_task: str | None = None
    last_error: str | None = None
    message_count: int = 0
    created_at: float = field(default_factory=time.time)
    last_active: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Every field, as a dict (what the registry stores)."""
        return asdict(self)


# -- workspace -------------------------------------------------------------------------

EntryKind = Literal["file", "dir"]

DEFAULT_MAX_FILE_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_TOTAL_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_ENTRIES = 10_000


@dataclass(frozen=True)
class WorkspaceLimits:
    """``None`` disables a limit."""

    max_file_bytes: int | None = DEFAULT_MAX_FILE_BYTES
    max_total_bytes: int | None = DEFAULT_MAX_TOTAL_BYTES
    max_entries: int | None = DEFAULT_MAX_ENTRIES


@dataclass(frozen=True)
class EntryInfo:
    """Metadata of one file or directory. ``created``/``modified`` are epoch seconds."""

    path: str
    kind: EntryKind
    size: int
    mime_type: str | None
    created: float
    modified: float

    @property
    def name(self) -> str:
        """The last segment of ``path`` (``""`` for the root)."""
        return self.path.rpartition("/")[2]

    @property
    def is_dir(self) -> bool:
        """Whether the entry is a directory."""
        return self.kind == "dir"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{path, name, type: "file"|"directory", size, mime_type,
        created, modified}``."""
        return {
            "path": self.path,
            "name": self.name,
            "type": "directory" if self.kind == "dir" else "file",
            "size": self.size,
            "mime_type": self.mime_type,
            "created": self.created,
            "modified": self.modified,
        }


# -- durable tool calls (seed 003 §1.1-1.7) ---------------------------------------------

TOOL_CALL_STATUSES: tuple[str, ...] = (
    "pending",
    "awaiting-approval",
    "executing",
    "completed",
    "failed",
    "denied",
    "cancelled-by-user",
    "cancelled-by-timeout",
    "cancelled-by-error",
)
"""Every status a tool call can have. ``pending`` (written before anything runs),
``awaiting-approval`` and ``executing`` are open; the rest are final."""

TOOL_CALL_FINISHED: frozenset[str] = frozenset(
    {
        "completed",
        "failed",
        "denied",
        "cancelled-by-user",
        "cancelled-by-timeout",
        "cancelled-by-error",
    }
)
"""Final statuses: a call in one of them never changes status again."""

_CANCELLED = ("cancelled-by-user", "cancelled-by-timeout", "cancelled-by-error")
TOOL_CALL_TRANSITIONS: dict[str, frozenset[str]] = {
    "pending": frozenset({"executing", "awaiting-approval", "failed", "denied", *_CANCELLED}),
    "awaiting-approval": frozenset({"pending", "denied", *_CANCELLED}),
    # executing -> pending: the executor died and the tool may be retried (recovery).
    "executing": frozenset({"completed", "failed", "pending", *_CANCELLED}),
    **{final: frozenset() for final in TOOL_CALL_FINISHED},
}
"""The allowed moves: ``pending → executing → completed | failed``; an approval moves
``pending → awaiting-approval → pending | denied``; a call whose executor died goes
back ``executing → pending`` when its tool may be retried; any open call may be
cancelled (by the user, a timeout or an upstream error) or fail."""


@dataclass
class ToolCallRecord:
    """One tool call of a generation, as stored before it runs and updated as it
    moves (:data:`TOOL_CALL_TRANSITIONS`). ``executor`` names who claimed it;
    ``attempts`` counts claims; ``durable``: executed by a decoupled executor, not
    inline in the turn. ``late_result``/``late_error``: what an executor reported
    after the call was cancelled, kept when the agent's policy is ``store``
    (``late_at`` says when). ``approval``: the last decision (``decision``, ``by``,
    ``reason``, ``at``); the full history is the audit table. ``lease_until``: while
    ``executing`` by a decoupled executor, when its claim lapses unless renewed (the
    visibility timeout; None: no lease). ``deadline_at``: when the open call is
    ``cancelled-by-timeout`` (None: no deadline). Both are epoch seconds. Values must be
    msgpack-serializable."""

    id: str
    tool_name: str
    status: str = "pending"
    run_id: str | None = None
    session_id: str | None = None
    input: Any = None
    result: Any = None
    error: str | None = None
    executor: str | None = None
    attempts: int = 0
    durable: bool = False
    approval: dict[str, Any] | None = None
    late_result: Any = None
    late_error: str | None = None
    late_at: float | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    lease_until: float | None = None
    deadline_at: float | None = None

    @property
    def finished(self) -> bool:
        """Whether the status is final."""
        return self.status in TOOL_CALL_FINISHED

    @property
    def cancelled(self) -> bool:
        """Whether the call was cancelled (by the user, a timeout or an error)."""
        return self.status.startswith("cancelled-")

    def to_dict(self) -> dict[str, Any]:
        """Every field, as a dict; the id is under ``tool_call_id``."""
        out = asdict(self)
        out["tool_call_id"] = out.pop("id")
        return out


@dataclass
class ToolCallAudit:
    """One approval decision, append-only: who (``by``), when (``at``), what
    (``decision``: ``approved`` | ``denied`` | ``timeout`` | ``cancelled``), why."""

    seq: int
    tool_call_id: str
    decision: str
    by: str | None
    reason: str | None
    at: float


@dataclass(frozen=True)
class AgentStateRecord:
    """An agent's synced state as stored (:class:`~thinkray.storage.protocols.AgentStateStore`):
    its JSON ``value``, its ``version`` (1 for the first write, one more for each
    write after) and when it was written (``updated_at``, epoch seconds)."""

    value: Any
    version: int
    updated_at: float
