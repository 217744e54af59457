"""The fleet index (issue 13, item 5): rows written at hibernation, the ``thinkray
sessions`` / ``thinkray stats`` commands on a generated fleet, ``rm`` refusing a live
agent, ``stats --deep`` skipping a locked file, and concurrent writers losing nothing."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from thinkray.actors.cli import main
from thinkray.storage import fleet_index as fi
from thinkray.storage.owners import OwnerRegistry
from thinkray.storage.session_store import DuckDBSessionStore

NS = "fleet"


def _make_agent(root: Path, name: str, *, messages: int = 2, model: str = "claude-x") -> Path:
    path = root / NS / f"{name}.duckdb"
    store = DuckDBSessionStore(path)
    try:
        sid = store.create_session("chat").id
        store.update_session(sid, model={"provider_id": "anthropic", "model_id": model})
        for i in range(messages):
            role = "user" if i % 2 == 0 else "assistant"
            store.append_message(
                sid,
                {
                    "id": f"m{i}",
                    "role": role,
                    "metadata": {},
                    "parts": [{"type": "text", "text": "x"}],
                },
            )
        store.add_usage(sid, {"input": 100, "output": 10, "cache_read": 5})
        assert fi.write_index_row(store, path) is not None
    finally:
        store.close()
    return path


@pytest.fixture
def fleet(tmp_path):
    root = tmp_path / "root"
    OwnerRegistry(root).claim(NS, "agent-0", "alice")  # the ingress claims before a wake
    for i in range(5):
        _make_agent(root, f"agent-{i}", messages=2 + 2 * i, model="claude-x" if i % 2 else "gpt-y")
    return root


def _json(capsys, argv: list[str]) -> object:
    capsys.readouterr()
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_rows_from_the_store_and_tokens_by_day(tmp_path):
    root = tmp_path / "root"
    path = _make_agent(root, "solo", messages=4)
    row = fi.FleetIndex(root, NS).get("solo")
    assert row is not None
    assert (row["sessions"], row["messages"]) == (1, 4)
    assert row["models"]["anthropic/claude-x"]["input"] == 100
    # the checkpointed size when the row was taken; the close may vacuum it smaller (a
    # hibernation puts its row after the close: test_hibernation_writes_the_index_row)
    assert row["bytes"] >= path.stat().st_size > 0
    # A later write adds only what grew to today's bucket.
    with DuckDBSessionStore(path) as store:
        sid = store.list_sessions()[0].id
        store.add_usage(sid, {"input": 7})
        row2 = fi.write_index_row(store, path)
    assert row2 is not None
    (day,) = row2["days"]
    assert row2["days"][day]["anthropic/claude-x"]["input"] == 107
    assert row2["models"]["anthropic/claude-x"]["input"] == 107


def test_cli_on_a_generated_fleet(fleet, capsys, tmp_path):
    rows = _json(capsys, ["sessions", "ls", "--root", str(fleet), "--json", "--sort", "name"])
    assert [r["name"] for r in rows] == [f"agent-{i}" for i in range(5)]
    assert [r["messages"] for r in rows] == [2, 4, 6, 8, 10]
    assert rows[0]["owner"] == "alice" and rows[1]["owner"] is None
    shown = _json(capsys, ["sessions", "show", "agent-3", "--root", str(fleet), "--json"])
    assert shown["namespace"] == NS and shown["live"] is False and shown["sessions"] == 1
    stats = _json(capsys, ["stats", "--root", str(fleet), "--json", "--top", "2"])
    assert stats["agents"] == 5 and stats["messages"] == 30
    by_model = {u["model"]: u for u in stats["by_model"]}
    assert by_model["anthropic/claude-x"]["input"] == 200
    assert by_model["anthropic/gpt-y"]["tokens"] == 3 * 115
    assert by_model["anthropic/gpt-y"]["cost_usd"] is None  # no price table
    assert sum(d["tokens"] for d in stats["by_day"]) == 5 * 115
    assert len(stats["biggest"]) == 2
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"anthropic/claude-x": {"input": 3.0, "output": 15.0}}))
    priced = _json(capsys, ["stats", "--root", str(fleet), "--json", "--prices", str(prices)])
    cost = {u["model"]: u["cost_usd"] for u in priced["by_model"]}
    assert cost["anthropic/claude-x"] == pytest.approx((200 * 3.0 + 20 * 15.0) / 1e6)
    # Tables for a terminal.
    capsys.readouterr()
    assert main(["sessions", "ls", "--root", str(fleet)]) == 0
    out = capsys.readouterr().out
    assert "agent-4" in out and "alice" in out
    assert main(["stats", "--root", str(fleet)]) == 0
    assert "usage by model" in capsys.readouterr().out
    # Export reads a copy: every session with its history.
    doc = _json(capsys, ["sessions", "export", "agent-2", "--root", str(fleet)])
    assert len(doc["sessions"]) == 1 and len(doc["sessions"][0]["messages"]) == 6
    # Compaction folds the row files; the listing is unchanged.
    assert fi.FleetIndex(fleet, NS).pending() == 5
    _json(capsys, ["sessions", "compact", "--root", str(fleet), "--json"])
    assert fi.FleetIndex(fleet, NS).pending() == 0
    again = _json(capsys, ["sessions", "ls", "--root", str(fleet), "--json", "--sort", "name"])
    assert again == rows
    # Deep stats read the files themselves and agree on what they count.
    deep = _json(capsys, ["stats", "--root", str(fleet), "--json", "--deep", "--quiet"])
    assert (deep["agents"], deep["messages"], deep["skipped_live"]) == (5, 30, [])


def _holder(path: Path) -> subprocess.Popen[str]:
    """Another process holding ``path`` open read-write, as a live agent does."""
    code = textwrap.dedent(
        f"""
        import sys, duckdb
        con = duckdb.connect({str(path)!r})
        print("ready", flush=True)
        sys.stdin.read()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_rm_refuses_a_live_agent_then_removes_everything(fleet, capsys):
    path = fleet / NS / "agent-0.duckdb"
    holder = _holder(path)
    try:
        assert main(["sessions", "rm", "agent-0", "--root", str(fleet)]) == 1
        assert "live" in capsys.readouterr().err
        assert path.exists() and fi.FleetIndex(fleet, NS).get("agent-0") is not None
    finally:
        holder.communicate("")
    assert main(["sessions", "rm", "agent-0", "--root", str(fleet)]) == 0
    assert not path.exists()
    assert fi.FleetIndex(fleet, NS).get("agent-0") is None
    assert OwnerRegistry(fleet).owner(NS, "agent-0") is None
    names = [r["name"] for r in _json(capsys, ["sessions", "ls", "--root", str(fleet), "--json"])]
    assert "agent-0" not in names and len(names) == 4
    fi.FleetIndex(fleet, NS).compact()  # the tombstone is dropped, the rest stays
    assert sorted(fi.FleetIndex(fleet, NS).rows()) == [f"agent-{i}" for i in range(1, 5)]


def test_deep_stats_skip_a_locked_file(fleet, capsys):
    holder = _holder(fleet / NS / "agent-1.duckdb")
    try:
        deep = _json(capsys, ["stats", "--root", str(fleet), "--json", "--deep"])
        err = capsys.readouterr().err
    finally:
        holder.communicate("")
    assert deep["skipped_live"] == [f"{NS}/agent-1"]
    assert deep["agents"] == 4
    assert "scanning" in err or err == ""


def _writer(root: str, worker: int, count: int) -> None:
    index = fi.FleetIndex(root, NS)
    for i in range(count):
        index.put({"name": f"w{worker}-a{i}", "messages": i, "sessions": 1})
        if i % 25 == 0:
            index.put({"name": "shared", "messages": worker, "sessions": 1})
            index.compact()


def test_concurrent_writers_lose_nothing(tmp_path):
    root = str(tmp_path / "root")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(root, w, 120)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    index = fi.FleetIndex(root, NS)
    rows = index.rows()
    assert len(rows) == 4 * 120 + 1
    assert all(rows[f"w{w}-a{i}"]["messages"] == i for w in range(4) for i in range(120))
    index.compact()
    assert index.rows() == rows and index.pending() == 0


def test_refresh_if_due_writes_live_rows_at_most_every_interval(tmp_path):
    path = tmp_path / "root" / NS / "live1.duckdb"
    with DuckDBSessionStore(path) as store:
        store.create_session("chat")
        assert not fi.refresh_if_due(store, path, every=3600)  # starts the clock
        assert fi.FleetIndex(tmp_path / "root", NS).get("live1") is None
        assert fi.refresh_if_due(store, path, every=0)
        assert not fi.refresh_if_due(store, path, every=3600)
    row = fi.FleetIndex(tmp_path / "root", NS).get("live1")
    assert row is not None and row["live"] is True and row["sessions"] == 1


def test_hibernation_writes_the_index_row(namespace_factory):
    ns = namespace_factory(pool_size=1)
    agent = ns.get("indexed")
    agent.chat.remote("hello").result()
    assert fi.FleetIndex(ns.storage_root, ns.name).get("indexed") is None
    assert ns.hibernate("indexed")
    row = fi.FleetIndex(ns.storage_root, ns.name).get("indexed")
    assert row is not None
    assert (row["sessions"], row["messages"], row["live"]) == (1, 2, False)
    path = Path(ns.storage_root) / ns.name / "indexed.duckdb"
    assert row["bytes"] == path.stat().st_size


def test_an_object_store_root_keeps_its_index_in_the_store(uri_root, tmp_path, monkeypatch, capsys):
    """Under a URI root (file:// and S3 on moto) the rows land in the store, under
    ``<root>/<ns>/.index/``, and ``sessions ls``/``stats``/``compact`` read them there."""
    from thinkray.storage.objectstore import list_objects, session_uri

    def index_objects() -> list[str]:
        return sorted(rel for rel, _ in list_objects(uri_root, f"{NS}/.index", recursive=True))

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    local = tmp_path / "cache" / "agent.duckdb"  # the node-local copy of a live agent
    uri = session_uri(uri_root, NS, "agent")
    OwnerRegistry(uri_root).claim(NS, "agent", "alice")
    with DuckDBSessionStore(local) as store:
        sid = store.create_session("chat").id
        store.add_usage(sid, {"input": 100, "output": 10})
        row = fi.write_index_row(store, uri)
        assert row is not None and row["owner"] == "alice" and row["bytes"] > 0
        first = index_objects()
        assert len(first) == 1 and first[0].startswith("rows/agent/"), first
        assert fi.refresh_if_due(store, uri, every=0)  # a live refresh replaces it
        second = index_objects()
        assert len(second) == 1 and second != first
    assert list(cwd.iterdir()) == []  # no node-local folder named after the scheme
    index = fi.FleetIndex(uri_root, NS)
    assert isinstance(index, fi.ObjectStoreIndex) and index.pending() == 1
    got = index.get("agent")
    assert got is not None and got["live"] is True and got["sessions"] == 1
    rows = _json(capsys, ["sessions", "ls", "--root", uri_root, "--json"])
    assert [(r["namespace"], r["name"], r["owner"]) for r in rows] == [(NS, "agent", "alice")]
    stats = _json(capsys, ["stats", "--root", uri_root, "--json"])
    assert stats["agents"] == 1 and stats["by_model"][0]["input"] == 100
    assert _json(capsys, ["sessions", "compact", "--root", uri_root, "--json"]) == {NS: 1}
    assert index_objects() == ["snapshot.msgpack"] and index.pending() == 0
    assert list(fi.FleetIndex(uri_root, NS).rows()) == ["agent"]
    assert index.size_bytes() > 0
    index.put({"name": "other", "sessions": 2})
    assert sorted(index.rows()) == ["agent", "other"]
    index.delete("agent")
    assert sorted(index.rows()) == ["other"] and index.get("agent") is None
    assert index.compact() == 2 and sorted(index.rows()) == ["other"]
    # rm works on an object-store root too (issue 21, item 5)
    assert main(["sessions", "rm", "other", "--root", uri_root]) == 0
    assert fi.FleetIndex(uri_root, NS).get("other") is None
    assert main(["sessions", "rm", "other", "--root", uri_root]) == 1  # nothing left: not found


def _random_row(rng, name: str) -> dict:
    def kinds() -> dict:
        out = {k: rng.choice([0, rng.randrange(1000)]) for k in fi.KINDS}
        out["cost_usd"] = rng.choice([None, rng.random() / 7])
        return out

    return {
        "name": name,
        "namespace": NS,
        "owner": rng.choice([None, "alice", "bob"]),
        "sessions": rng.randrange(4),
        "messages": rng.randrange(20),
        "bytes": rng.choice([100, 2048, rng.randrange(10**7)]),
        "last_active": rng.choice([None, 1.7e9 + rng.randrange(100) * 86400.0]),
        "models": {m: kinds() for m in rng.sample(["a/x", "b/y", "c/z"], rng.randrange(3))},
        "days": {
            d: {m: kinds() for m in rng.sample(["a/x", "b/y"], rng.randrange(3))}
            for d in rng.sample(["2026-01-01", "2026-01-02"], rng.randrange(3))
        },
        "written_at": rng.random() * 100,
    }


def test_columnar_stats_and_merge_match_the_row_by_row_ones(tmp_path):
    import random

    from thinkray.storage.codec import pack

    rng = random.Random(13)
    rows = [_random_row(rng, f"a{i}") for i in range(300)]
    for prices in (None, {"a/x": {"input": 3.0, "output": 15.0}}):
        kw = {"prices": prices, "top": 5, "idle_days": 30.0, "now": 1.7e9 + 50 * 86400}
        table = fi.rows_table(rows, NS, fi.STATS_COLUMNS)
        assert fi.fleet_stats_table(table, **kw) == fi.fleet_stats(rows, **kw)
    # A former (msgpack) snapshot is read; row files go over it as a dict merge would.
    index = fi.FleetIndex(tmp_path, NS)
    index.dir.mkdir(parents=True)
    index.legacy_snapshot.write_bytes(pack({"v": 1, "rows": rows}))
    expected = {r["name"]: r for r in rows}
    for i in (5, 7, 400):
        row = _random_row(rng, f"a{i}")
        index.put(row)
        expected[row["name"]] = row
    index.delete("a9")
    del expected["a9"]
    index.merging_dir.mkdir()
    older = dict(_random_row(rng, "a11"), written_at=-1.0)  # the snapshot's is newer
    (index.merging_dir / "a11.json").write_text(json.dumps(older))
    assert list(index.rows()) == list(expected) and index.rows() == expected
    assert index.get("a11") == expected["a11"] and index.get("a9") is None
    assert index.compact() == 5
    assert not index.legacy_snapshot.exists() and index.snapshot.exists()
    assert index.rows() == expected and index.pending() == 0
