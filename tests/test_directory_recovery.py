"""A directory shard whose process is SIGKILLed (a real crash, not ``ray.kill``): Ray
restarts it, and with nobody calling it the replacement adopts the agent still live
(same process, never bound a second time) and, from the alarm files under the storage
root, wakes a hibernated agent whose alarm falls due after the crash."""

from __future__ import annotations

import os
import signal
import time

import pytest
from thinkray.actors.directory import shard_of
from thinkray.storage.alarms import read_alarms, write_alarm

from tests.helpers import wait_until

pytestmark = pytest.mark.ray

NAMES = [f"agent-{i}" for i in range(12)]
DELAY = 9.0  # the hibernated agent's alarm, from its scheduling


def test_alarm_files_round_trip(tmp_path):
    root = tmp_path / "root"
    assert read_alarms(root, "ns") == {}
    write_alarm(root, "ns", "a", 12.5)
    write_alarm(root, "ns", "b", 20.0)
    write_alarm(root, "ns", "a", 13.25)  # replaced whole
    (root / "ns" / ".alarms" / ".a.x.tmp").write_text("99")  # a temporary: ignored
    (root / "ns" / ".alarms" / "junk").write_text("not a time")
    assert read_alarms(root, "ns") == {"a": 13.25, "b": 20.0}
    assert read_alarms(root, "ns", lambda n: n == "b") == {"b": 20.0}
    write_alarm(root, "ns", "a", None)
    write_alarm(root, "ns", "never", None)  # nothing to remove
    assert read_alarms(root, "ns") == {"b": 20.0}


def _directory_process(ns, shard: int) -> tuple[int, int]:
    """A shard's ``(pid, restarts)`` as the GCS knows them (calling the directory would
    wake a restarted one, which the test means to leave alone; Ray's state API needs
    the dashboard, which the test cluster does not run)."""
    from ray._private import state

    info = state.actors(ns._router.handles[shard]._actor_id.hex())
    if info.get("State") != "ALIVE":
        return 0, int(info.get("NumRestarts", 0))
    return int(info.get("Pid") or 0), int(info.get("NumRestarts", 0))


def _fired_without_waking(ns, name: str) -> list | None:
    """The alarms an agent recorded, read from its file only once it is live again
    (reading a hibernated agent through its handle would wake it: the test must see
    the directory's own wake)."""
    if ns.where(name) is None:
        return None
    return ns.get(name).alarms_fired.remote().result()


def test_a_sigkilled_shard_adopts_live_agents_and_wakes_hibernated_ones(
    namespace_factory,
):
    import ray

    from tests.agents import AlarmAgent

    ns = namespace_factory(AlarmAgent, directories=2, pool_size=1, idle_timeout=None)
    live, sleeper = [n for n in NAMES if shard_of(n, 2) == 1][:2]
    assert ns.get(live).chat.remote("before").result().status == "completed"
    agent = ns.get(sleeper)
    agent.schedule.remote(DELAY, "note_alarm", "ding").result()
    due = time.time() + DELAY
    assert ns.hibernate(sleeper)
    # the alarm of the hibernated agent is recorded beside its file
    recorded = wait_until(lambda: read_alarms(ns.storage_root, ns.name).get(sleeper), timeout=5)
    assert recorded == pytest.approx(due, abs=0.5)
    before = ns.where(live)

    pid = ray.get(ns._router.handles[1].stats.remote())["pid"]
    assert _directory_process(ns, 1) == (pid, 0)
    os.kill(pid, signal.SIGKILL)
    # Nobody calls the directory: Ray restarts its process, which wakes the agent
    # when the alarm is due.
    new_pid, restarts = wait_until(
        lambda: (p := _directory_process(ns, 1))[0] not in (0, pid) and p, timeout=30
    )
    assert restarts == 1
    # The alarm fires with nobody calling the directory: the restarted one loaded it
    # from its file (whether it restarted before the alarm fell due or after). How
    # late is not asserted (this machine is shared); only that it fired, once.
    fired = wait_until(lambda: _fired_without_waking(ns, sleeper) or None, timeout=60, interval=0.5)
    assert [payload for payload, _ in fired] == ["ding"]
    assert fired[0][1] >= due - 0.5  # not before it was due

    stats = ray.get(ns._router.handles[1].stats.remote())
    assert stats["pid"] == new_pid
    assert stats["counters"].get("alarms_loaded") == 1
    assert stats["counters"].get("alarm_wakes") == 1
    # the live agent was adopted: same actor and process, never bound again
    assert stats["counters"].get("adopted") == 1
    assert stats["counters"].get("binds") == 1  # the sleeper's alarm wake only
    assert ns.where(live) == before
    assert ns.get(live).message_count.remote().result() == 2
    assert ray.get(ns._router.handles[1].stats.remote())["counters"]["binds"] == 1
    # the alarm fired: its record is gone, and it fires exactly once
    wait_until(lambda: sleeper not in read_alarms(ns.storage_root, ns.name), timeout=5)
    assert len(agent.alarms_fired.remote().result()) == 1
