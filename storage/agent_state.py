"""The agent's synced state (:class:`~thinkray.storage.protocols.AgentStateStore`): one
JSON document per agent database, versioned, replaced whole on each write."""

from __future__ import annotations

import json
import time
from typing import Any

from thinkray.storage.db import MigratedStore, Migration
from thinkray.storage.protocols import AgentStateStore
from thinkray.storage.records import AgentStateRecord
from thinkray.storage.types import InvalidInputError
from typing_extensions import override


def _create(con: Any) -> None:
    # JSON text, not msgpack: the state is what clients read as JSON, and a reader
    # with nothing but DuckDB (or another language) can inspect it as it is.
    con.execute(
        "CREATE TABLE agent_state (version BIGINT NOT NULL, value VARCHAR NOT NULL, "
        "updated_at DOUBLE NOT NULL)"
    )


MIGRATIONS = [Migration(1, _create)]


def encode(value: Any) -> str:
    """``value`` as compact JSON text.

    Raises:
        InvalidInputError: ``value`` is not JSON (a non-str key, NaN, an object).
    """
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"agent state is not JSON: {exc}") from exc


class DuckDBAgentStateStore(MigratedStore, AgentStateStore):
    """:class:`~thinkray.storage.protocols.AgentStateStore` on a :class:`Database` (the
    contract is the protocol's). Get one from
    :meth:`~thinkray.storage.protocols.Stores.agent_state`."""

    component = "agent_state"
    migrations = MIGRATIONS

    @override
    def get(self) -> AgentStateRecord | None:
        row = self.db.fetchone("SELECT value, version, updated_at FROM agent_state")
        return None if row is None else AgentStateRecord(json.loads(row[0]), row[1], row[2])

    @override
    def put(self, value: Any, *, now: float | None = None) -> AgentStateRecord:
        text = encode(value)
        at = time.time() if now is None else now
        with self.db.transaction() as con:
            row = con.execute("SELECT max(version) FROM agent_state").fetchone()
            version = int(row[0] or 0) + 1 if row is not None else 1
            con.execute("DELETE FROM agent_state")
            con.execute("INSERT INTO agent_state VALUES (?, ?, ?)", [version, text, at])
        return AgentStateRecord(json.loads(text), version, at)
