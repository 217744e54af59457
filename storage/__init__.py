"""thinkray storage: DuckDB persistence, one file per actor. The only package that
imports duckdb.

The seams are the Protocols (:class:`SessionStore` and the :class:`Stores` it hands
out); the DuckDB implementations pass the conformance suites in ``thinkray.storage.testing``.
Records, errors and protocols import without DuckDB; the DuckDB classes load it on
first use (``from thinkray.storage import DuckDBSessionStore``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from thinkray.storage.errors import *  # noqa: F403  # every storage error, one import away
from thinkray.storage.errors import __all__ as _errors
from thinkray.storage.protocols import (
    HEAD,
    AgentStateStore,
    FiberStore,
    InboxStore,
    JobStore,
    KeyValueStore,
    RegistryStore,
    SessionStore,
    Stores,
    Thread,
    ToolCallStore,
    WorkspaceStore,
)
from thinkray.storage.records import (
    AgentStateRecord,
    EntryInfo,
    FiberRecord,
    InboxRow,
    JobRecord,
    ScheduleRecord,
    SubAgentRecord,
    ToolCallAudit,
    ToolCallRecord,
    WorkspaceLimits,
)
from thinkray.storage.types import (
    MessageRow,
    RewindInfo,
    SearchHit,
    SessionInfo,
    UnrewindInfo,
)

if TYPE_CHECKING:
    from thinkray.storage.session_store import DuckDBSessionStore
    from thinkray.storage.stores import DuckDBStores, open_stores

_LAZY = {
    "DuckDBSessionStore": "thinkray.storage.session_store",
    "DuckDBStores": "thinkray.storage.stores",
    "open_stores": "thinkray.storage.stores",
}

__all__ = [
    *_errors,
    "HEAD",
    "AgentStateRecord",
    "AgentStateStore",
    "DuckDBSessionStore",
    "DuckDBStores",
    "EntryInfo",
    "FiberRecord",
    "FiberStore",
    "InboxRow",
    "InboxStore",
    "JobRecord",
    "JobStore",
    "KeyValueStore",
    "MessageRow",
    "RegistryStore",
    "RewindInfo",
    "ScheduleRecord",
    "SearchHit",
    "SessionInfo",
    "SessionStore",
    "Stores",
    "SubAgentRecord",
    "Thread",
    "ToolCallAudit",
    "ToolCallRecord",
    "ToolCallStore",
    "UnrewindInfo",
    "WorkspaceLimits",
    "WorkspaceStore",
    "open_stores",
]


def __getattr__(name: str) -> Any:
    # DuckDB (~180 ms to import) loads only when a DuckDB class is asked for.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'thinkray.storage' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
