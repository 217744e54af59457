"""A small key/value table for actors that keep no sessions (e.g. a workspace bridge)."""

from __future__ import annotations

from typing import Any

from thinkray.storage.codec import pack, unpack
from thinkray.storage.db import MigratedStore, Migration
from thinkray.storage.protocols import KeyValueStore
from typing_extensions import override


def _create(con: Any) -> None:
    con.execute("CREATE TABLE kv (key VARCHAR, value BLOB)")


MIGRATIONS = [Migration(1, _create)]


class DuckDBKeyValueStore(MigratedStore, KeyValueStore):
    """:class:`~thinkray.storage.protocols.KeyValueStore` on a :class:`Database` (the
    contract is the protocol's). Get one from
    :meth:`~thinkray.storage.protocols.Stores.kv`."""

    component = "kv"
    migrations = MIGRATIONS

    @override
    def get(self, key: str, default: Any = None) -> Any:
        row = self.db.fetchone("SELECT value FROM kv WHERE key = ?", [key])
        return default if row is None else unpack(row[0])

    @override
    def set(self, key: str, value: Any) -> None:
        blob = pack(value, f"value of {key!r}")
        with self.db.transaction() as con:
            con.execute("DELETE FROM kv WHERE key = ?", [key])
            con.execute("INSERT INTO kv VALUES (?, ?)", [key, blob])

    @override
    def delete(self, key: str) -> None:
        self.db.execute("DELETE FROM kv WHERE key = ?", [key])

    @override
    def items(self, prefix: str = "") -> dict[str, Any]:
        rows = self.db.fetchall(
            "SELECT key, value FROM kv WHERE starts_with(key, ?) ORDER BY key", [prefix]
        )
        return {k: unpack(v) for k, v in rows}
