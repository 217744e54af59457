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
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_MAX_FILE_BYTES",
    "DEFAULT_MAX_TOTAL_BYTES",
    "FIBER_STATUSES",
    "FINISHED_STATUSES",
    "INBOX_FINISHED",
    "INBOX_STATUSES",
    "JOB_FINISHED",
    "JOB_STATUSES",
    "SCHEDULE_KINDS",
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
