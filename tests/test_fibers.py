"""Durable fibers (seed 000): spawn, stash, cancel, retries, recovery (the fiber
store itself: ``thinkray.storage.testing.fiber_store_suite``)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from thinkray.runtime.abort import AbortError
from thinkray.runtime.agents.think import Think
from thinkray.runtime.durable.fibers import FiberContext, FiberManager, current_fiber
from thinkray.storage.db import Database
from thinkray.storage.fibers import DuckDBFiberStore
from thinkray.storage.types import InvalidInputError


async def until(cond: Any, timeout: float = 2.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


class Host:
    """A fiber host: the methods a manager may run."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, int]] = []
        self.fail_until = 0
        self.release = asyncio.Event()
        self.saw_abort: bool | None = None
        self.manager: FiberManager | None = None

    async def double(self, payload: Any, ctx: FiberContext) -> dict[str, Any]:
        self.calls.append(("double", payload, ctx.attempt))
        await asyncio.sleep(0)
        return {"doubled": payload["n"] * 2}

    def sync_work(self, payload: Any, ctx: FiberContext) -> str:
        return f"sync:{payload}"

    async def stepper(self, payload: Any, ctx: FiberContext) -> dict[str, Any]:
        ctx.stash({"step": 1})
        assert self.manager is not None
        await self._nested_stash()  # stash_fiber() from a helper: the contextvar
        await self.release.wait()
        return {"last": ctx.checkpoint}

    async def _nested_stash(self) -> None:
        assert self.manager is not None
        await asyncio.create_task(_stash_in_child(self.manager, {"step": 2}))

    async def waits_for_cancel(self, payload: Any, ctx: FiberContext) -> str:
        try:
            await asyncio.wait_for(ctx.signal.wait(), 5)
        finally:
            self.saw_abort = ctx.signal.aborted
        return "ignored after cancel"

    async def flaky(self, payload: Any, ctx: FiberContext) -> dict[str, Any]:
        self.calls.append(("flaky", ctx.checkpoint, ctx.attempt))
        ctx.stash({"tried": ctx.attempt})
        if ctx.attempt <= self.fail_until:
            raise RuntimeError(f"flaky failure {ctx.attempt}")
        return {"attempt": ctx.attempt}

    async def always_fails(self, payload: Any, ctx: FiberContext) -> None:
        self.calls.append(("always_fails", payload, ctx.attempt))
        raise ValueError("kaput")

    async def bad_result(self, payload: Any, ctx: FiberContext) -> object:
        return object()

    async def long_job(self, payload: Any, ctx: FiberContext) -> dict[str, Any]:
        """Stashes progress, then blocks until evicted. Resumed, it completes."""
        self.calls.append(("long_job", ctx.checkpoint, ctx.attempt))
        if ctx.checkpoint is None:
            ctx.stash({"progress": 50, "items": payload["items"][:1]})
            await asyncio.Event().wait()  # never set: the eviction cuts it short
        return {
            "done": True,
            "resumed_from": ctx.checkpoint,
            "attempt": ctx.attempt,
            "recovered": ctx.recovered,
        }


async def _stash_in_child(manager: FiberManager, data: Any) -> None:
    manager.stash_fiber(data)


@pytest.fixture
def db(tmp_path: Any) -> Any:
    database = Database(tmp_path / "agent.duckdb")
    yield database
    database.close()


def make(db: Database, host: Host | None = None, **kwargs: Any) -> tuple[Host, FiberManager]:
    host = host or Host()
    kwargs.setdefault("retry_backoff", 0.005)
    manager = FiberManager(DuckDBFiberStore(db), host, **kwargs)
    host.manager = manager
    return host, manager


async def test_spawn_completes_with_result(db: Database) -> None:
    host, manager = make(db)
    fid = manager.spawn_fiber("double", {"n": 21})
    assert manager.get_fiber(fid).status == "running"  # persisted before it runs
    record = await manager.wait(fid, timeout=2)
    assert record.status == "completed"
    assert record.result == {"doubled": 42}
    assert record.attempts == 1 and record.error is None
    assert record.payload == {"n": 21}
    assert host.calls == [("double", {"n": 21}, 1)]
    sid = manager.spawn_fiber("sync_work", "x")
    assert (await manager.wait(sid, 2)).result == "sync:x"
    assert [f.id for f in manager.list_fibers("completed")] == [fid, sid]
    assert manager.active_fibers() == []
    await manager.close()


async def test_spawn_validates_before_writing(db: Database) -> None:
    _, manager = make(db)
    with pytest.raises(ValueError, match="no method 'nope'"):
        manager.spawn_fiber("nope")
    with pytest.raises(InvalidInputError, match="msgpack"):
        manager.spawn_fiber("double", {"n": object()})
    assert manager.list_fibers() == []
    await manager.close()


async def test_stash_checkpoints_persisted(db: Database) -> None:
    host, manager = make(db)
    fid = manager.spawn_fiber("stepper")
    await until(lambda: (manager.get_fiber(fid).checkpoint or {}).get("step") == 2)
    # Read back through a second store on the same connection: it is in the table.
    assert DuckDBFiberStore(db).get_fiber(fid).checkpoint == {"step": 2}
    assert manager.get_fiber(fid).status == "running"
    host.release.set()
    record = await manager.wait(fid, 2)
    assert record.status == "completed"
    assert record.checkpoint == {"step": 2}
    assert record.result == {"last": {"step": 2}}
    with pytest.raises(RuntimeError, match="outside a running fiber"):
        manager.stash_fiber({"nope": 1})
    assert current_fiber() is None
    await manager.close()


async def test_cancel_is_cooperative(db: Database) -> None:
    host, manager = make(db)
    fid = manager.spawn_fiber("waits_for_cancel")
    await asyncio.sleep(0.01)
    assert manager.cancel_fiber(fid) is True
    assert manager.get_fiber(fid).status == "cancelled"
    record = await manager.wait(fid, 2)
    assert host.saw_abort is True
    assert record.status == "cancelled"
    assert record.result is None  # what it returned after the cancel is dropped
    assert manager.cancel_fiber(fid) is False  # already finished
    assert manager.cancel_fiber("fbr_unknown") is False
    await manager.close()


async def test_failure_retries_then_completes(db: Database) -> None:
    host, manager = make(db)
    host.fail_until = 2
    fid = manager.spawn_fiber("flaky", max_retries=3)
    record = await manager.wait(fid, 2)
    assert record.status == "completed"
    assert record.result == {"attempt": 3}
    assert record.attempts == 3
    assert record.error is None
    # Each retry starts from the checkpoint the failed attempt stashed.
    assert host.calls == [
        ("flaky", None, 1),
        ("flaky", {"tried": 1}, 2),
        ("flaky", {"tried": 2}, 3),
    ]
    await manager.close()


async def test_failure_after_max_retries(db: Database) -> None:
    host, manager = make(db)
    fid = manager.spawn_fiber("always_fails", "p", max_retries=2)
    record = await manager.wait(fid, 2)
    assert record.status == "failed"
    assert record.error == "ValueError: kaput"
    assert record.attempts == 3  # the first run and two retries
    assert [c[2] for c in host.calls] == [1, 2, 3]
    no_retry = manager.spawn_fiber("always_fails", max_retries=0)
    assert (await manager.wait(no_retry, 2)).attempts == 1
    await manager.close()


async def test_unserializable_result_fails(db: Database) -> None:
    _, manager = make(db)
    fid = manager.spawn_fiber("bad_result")
    record = await manager.wait(fid, 2)
    assert record.status == "failed"
    assert "msgpack" in record.error
    await manager.close()


async def test_recovery_after_eviction(tmp_path: Any) -> None:
    path = tmp_path / "agent.duckdb"
    db1 = Database(path)
    host1, manager1 = make(db1)
    fid = manager1.spawn_fiber("long_job", {"items": ["a", "b"]})
    await until(lambda: manager1.get_fiber(fid).checkpoint is not None)
    # Eviction: the manager stops its tasks but leaves the rows alone, the file closes.
    await manager1.close()
    assert manager1.get_fiber(fid).status == "running"
    db1.close()
    with pytest.raises(RuntimeError, match="closed"):
        manager1.spawn_fiber("long_job")

    db2 = Database(path)
    host2, manager2 = make(db2)  # the wake: construction recovers
    record = await manager2.wait(fid, timeout=2)
    assert record.status == "completed"
    assert record.result == {
        "done": True,
        "resumed_from": {"progress": 50, "items": ["a"]},
        "attempt": 2,
        "recovered": True,
    }
    assert record.attempts == 2
    assert host1.calls == [("long_job", None, 1)]
    assert host2.calls == [("long_job", {"progress": 50, "items": ["a"]}, 2)]
    await manager2.close()
    db2.close()


def test_recovery_deferred_until_a_loop_runs(tmp_path: Any) -> None:
    """A Ray actor's constructor has no running loop: orphans are marked interrupted
    at once, and restarted by ``start()``."""
    db = Database(tmp_path / "agent.duckdb")
    store = DuckDBFiberStore(db)
    orphan = store.insert_fiber("long_job", {"items": ["z"]})
    store.set_checkpoint(orphan.id, {"progress": 10})
    host, manager = make(db)
    assert store.get_fiber(orphan.id).status == "interrupted"
    assert manager.has_work

    async def main() -> Any:
        restarted = await manager.start()
        record = await manager.wait(orphan.id, 2)
        await manager.close()
        return restarted, record

    restarted, record = asyncio.run(main())
    assert restarted == [orphan.id]
    assert record.status == "completed"
    assert record.result["resumed_from"] == {"progress": 10}
    db.close()


async def test_recovery_fails_when_method_vanished(db: Database) -> None:
    store = DuckDBFiberStore(db)
    orphan = store.insert_fiber("renamed_in_new_deploy", {"x": 1})
    _, manager = make(db)
    record = await manager.wait(orphan.id, 2)
    assert record.status == "failed"
    assert record.error == "recovery failed: Host has no method 'renamed_in_new_deploy' any more"
    await manager.close()


async def test_recovery_fails_when_retries_exhausted(db: Database) -> None:
    store = DuckDBFiberStore(db)
    orphan = store.insert_fiber("long_job", {"items": []}, max_retries=1)
    store.update_fiber(orphan.id, attempts=2)
    _, manager = make(db)
    record = await manager.wait(orphan.id, 2)
    assert record.status == "failed"
    assert "max_retries=1 is exhausted" in record.error
    await manager.close()


class HookHost(Host):
    def __init__(self, handled: bool) -> None:
        super().__init__()
        self.handled = handled
        self.recovered: list[str] = []

    async def on_fiber_recovered(self, fiber: Any) -> bool:
        assert fiber.status == "interrupted"
        self.recovered.append(fiber.id)
        return self.handled


async def test_recovery_hook_can_take_over(db: Database) -> None:
    store = DuckDBFiberStore(db)
    a = store.insert_fiber("renamed_in_new_deploy")
    host, manager = make(db, HookHost(handled=True))
    await manager.start()
    record = await manager.wait(a.id, 2)
    assert host.recovered == [a.id]
    assert record.status == "interrupted" and record.recovery_handled
    await manager.close()
    # Handled fibers are not offered again on the next wake.
    host2, manager2 = make(db, HookHost(handled=True))
    await manager2.start()
    assert host2.recovered == []
    await manager2.close()


async def test_recovery_hook_falsy_means_default(db: Database) -> None:
    store = DuckDBFiberStore(db)
    orphan = store.insert_fiber("long_job", {"items": []})
    store.set_checkpoint(orphan.id, {"progress": 90})
    host, manager = make(db, HookHost(handled=False))
    record = await manager.wait(orphan.id, 2)
    assert host.recovered == [orphan.id]
    assert record.status == "completed"
    assert record.result["resumed_from"] == {"progress": 90}
    await manager.close()


async def test_recover_false_marks_but_does_not_restart(db: Database) -> None:
    store = DuckDBFiberStore(db)
    orphan = store.insert_fiber("long_job", {"items": []})
    store.set_checkpoint(orphan.id, {"progress": 1})
    host, manager = make(db, recover=False)
    await asyncio.sleep(0.02)
    assert manager.get_fiber(orphan.id).status == "interrupted"
    assert host.calls == []
    assert manager.recover() == []  # nothing newly orphaned, but restarts the interrupted
    assert (await manager.wait(orphan.id, 2)).status == "completed"
    await manager.close()


async def test_cancel_interrupted_fiber(db: Database) -> None:
    store = DuckDBFiberStore(db)
    orphan = store.insert_fiber("long_job", {"items": []})
    host, manager = make(db, recover=False)
    assert manager.cancel_fiber(orphan.id) is True
    manager.recover()
    record = await manager.wait(orphan.id, 2)
    assert record.status == "cancelled"
    assert host.calls == []
    await manager.close()


async def test_wait_timeout_leaves_fiber_running(db: Database) -> None:
    host, manager = make(db)
    fid = manager.spawn_fiber("stepper")
    with pytest.raises(TimeoutError):
        await manager.wait(fid, timeout=0.02)
    assert manager.get_fiber(fid).status == "running"
    host.release.set()
    assert (await manager.wait(fid, 2)).status == "completed"
    await manager.close()


async def test_abort_error_without_cancel_is_a_failure(db: Database) -> None:
    class Raiser(Host):
        async def raiser(self, payload: Any, ctx: FiberContext) -> None:
            raise AbortError("model stream aborted")

    _, manager = make(db, Raiser())
    fid = manager.spawn_fiber("raiser", max_retries=0)
    record = await manager.wait(fid, 2)
    assert record.status == "failed"
    assert record.error == "aborted: model stream aborted"
    await manager.close()


class FiberAgent(Think):
    """The integration recipe: fibers live next to the sessions in the agent's file."""

    def on_start(self) -> None:
        self.fibers = FiberManager(self.store.stores().fibers(), self, retry_backoff=0.005)

    async def summarize(self, payload: Any, ctx: FiberContext) -> dict[str, Any]:
        if ctx.checkpoint is None:
            self.fibers.stash_fiber({"half": payload["text"][:3]})
            await asyncio.Event().wait()  # evicted here
        return {"summary": ctx.checkpoint["half"], "attempt": ctx.attempt}

    async def hibernate(self) -> None:
        await self.fibers.close()  # first the tasks (rows stay running), then the file
        self.close()


async def test_think_host_recovers_fiber_on_wake(tmp_path: Any) -> None:
    path = tmp_path / "think.duckdb"
    agent = FiberAgent(path)
    fid = agent.fibers.spawn_fiber("summarize", {"text": "abcdef"})
    await until(lambda: agent.fibers.get_fiber(fid).checkpoint is not None)
    await agent.hibernate()

    woken = FiberAgent(path)  # on_start → recovery
    record = await woken.fibers.wait(fid, 2)
    assert record.status == "completed"
    assert record.result == {"summary": "abc", "attempt": 2}
    await woken.hibernate()


async def test_closing_an_agent_right_after_opening_it_logs_no_error(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 9 item 18: an agent opened and closed at once inside a running loop (a
    script, a test, a health check) with an interrupted fiber waiting in its file. The
    recovery pass its constructor started must not run against the closed database,
    and the fiber must still be there for the next wake."""
    path = tmp_path / "think.duckdb"
    agent = FiberAgent(path)
    fid = agent.fibers.spawn_fiber("summarize", {"text": "abcdef"})
    await until(lambda: agent.fibers.get_fiber(fid).checkpoint is not None)
    await agent.hibernate()  # evicted: the fiber's row stays running

    with caplog.at_level(logging.WARNING):
        Think(path).close()  # the base class: its own fiber manager
        FiberAgent(path).close()  # a subclass that replaces the manager in on_start
        await asyncio.sleep(0.1)  # give any stray task the chance to run
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []

    woken = FiberAgent(path)
    record = await woken.fibers.wait(fid, 2)
    assert record.status == "completed" and record.result == {"summary": "abc", "attempt": 2}
    await woken.hibernate()
