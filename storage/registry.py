"""The orchestrator's registry of sub-agents (seed 000 "Agent registry")."""

from __future__ import annotations

from typing import Any

from thinkray.storage.codec import pack, unpack
from thinkray.storage.db import MigratedStore, Migration
from thinkray.storage.errors import (  # re-exported: the errors live in thinkray.storage.errors
    SubAgentNotFoundError as SubAgentNotFoundError,
)
from thinkray.storage.protocols import RegistryStore
from thinkray.storage.records import SubAgentRecord
from thinkray.storage.types import InvalidInputError
from typing_extensions import override


def _create(con: Any) -> None:
    # name is the lookup key; everything else is read whole, so it lives in one blob.
    con.execute("CREATE TABLE subagents (name VARCHAR, info BLOB)")


MIGRATIONS = [Migration(1, _create)]


class DuckDBRegistryStore(MigratedStore, RegistryStore):
    """:class:`~thinkray.storage.protocols.RegistryStore` on a :class:`Database` (the
    contract is the protocol's). Get one from
    :meth:`~thinkray.storage.protocols.Stores.registry`."""

    component = "registry"
    migrations = MIGRATIONS

    def _encode(self, record: SubAgentRecord) -> bytes:
        return pack(record.to_dict(), "sub-agent record")

    @override
    def add(self, record: SubAgentRecord) -> SubAgentRecord:
        with self.db.transaction() as con:
            if con.execute("SELECT 1 FROM subagents WHERE name = ?", [record.name]).fetchone():
                raise InvalidInputError(f"sub-agent {record.name!r} already exists")
            con.execute("INSERT INTO subagents VALUES (?, ?)", [record.name, self._encode(record)])
        return record

    @override
    def get(self, name: str) -> SubAgentRecord:
        row = self.db.fetchone("SELECT info FROM subagents WHERE name = ?", [name])
        if row is None:
            raise SubAgentNotFoundError(f"unknown sub-agent {name!r}")
        return SubAgentRecord(**unpack(row[0]))

    @override
    def has(self, name: str) -> bool:
        return self.db.fetchone("SELECT 1 FROM subagents WHERE name = ?", [name]) is not None

    @override
    def update(self, name: str, **fields: Any) -> SubAgentRecord:
        record = self.get(name)
        for key, value in fields.items():
            if not hasattr(record, key):
                raise InvalidInputError(f"unknown registry field {key!r}")
            setattr(record, key, value)
        self.db.execute(
            "UPDATE subagents SET info = ? WHERE name = ?", [self._encode(record), name]
        )
        return record

    @override
    def list(self) -> list[SubAgentRecord]:
        rows = self.db.fetchall("SELECT info FROM subagents ORDER BY name")
        return [SubAgentRecord(**unpack(r[0])) for r in rows]

    @override
    def remove(self, name: str) -> None:
        self.get(name)
        self.db.execute("DELETE FROM subagents WHERE name = ?", [name])
