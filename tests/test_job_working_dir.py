"""A Ray job whose working directory has its own ``runtime/``, ``storage/`` and ``actors/``
folders runs a session normally (issue 8, item 1).

thinkray installs only as ``thinkray.runtime``, ``thinkray.actors`` and
``thinkray.storage``, so a job's folders of those bare names are the job's own, in the
driver and in the Ray workers (``runtime_env={"working_dir": ...}`` puts them first on
the workers' path). Here the job's packages define names that clash with thinkray's and
lack its sub-packages, so thinkray resolving any import through them would fail.

The driver runs in a subprocess that joins the suite's running Ray as a job of its own
(as ``ray job submit`` runs one on a cluster: a driver with the job's runtime_env),
whose workers also find the repository's own ``runtime/``, ``storage/`` and
``actors/`` source folders on their path (the suite's Ray puts the repository there):
the job's must still come first. The test only reads what the driver printed.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import json_report

pytestmark = pytest.mark.ray

SHADOW = '''\
"""The job's own {name!r} package, not thinkray's."""

OWNER = "job"
# Names thinkray's packages export; anything importing them from here gets None.
Think = Agent = AgentNamespace = DuckDBSessionStore = SessionStore = None
'''

AGENTS = '''\
"""The job's agent: it imports the job's packages and thinkray side by side."""

import os

import actors
import runtime
import storage
import thinkray.runtime
from thinkray.runtime import Think, remote, tool
from thinkray.runtime.models.testing import FunctionModel, reply, tool_call


@tool
def owners() -> dict:
    """Who the bare package names belong to, where the tool runs."""
    return {
        "bare": [runtime.OWNER, storage.OWNER, actors.OWNER],
        "thinkray_runtime": os.path.dirname(thinkray.runtime.__file__),
    }


def step(request, index):
    if request.messages[-1].role == "user":
        return reply(tool_call("owners", {}))
    return reply("The job's folders and thinkray live side by side.")


class JobAgent(Think):
    def get_model(self):
        return FunctionModel(step)

    def get_tools(self):
        return {"owners": owners}

    @remote
    def where(self) -> dict:
        return {"cwd": os.getcwd(), "runtime": runtime.__file__}
'''

DRIVER = """\
import json
import os
import sys

import actors
import ray
import runtime
import storage
from job_agents import JobAgent
from thinkray.actors import AgentNamespace

assert (runtime.OWNER, storage.OWNER, actors.OWNER) == ("job",) * 3

ray.init(address=sys.argv[2], log_to_driver=False, runtime_env={"working_dir": os.getcwd()})
try:
    ns = AgentNamespace(f"job{os.getpid()}", JobAgent, storage_root=sys.argv[1], pool_size=1)
    try:
        agent = ns.get("session-1")
        result = agent.chat.remote("go").result(timeout_s=120)
        tool = [p for p in result.message["parts"] if p["type"] == "dynamic-tool"][0]
        where = agent.where.remote().result(timeout_s=60)
        hibernated = ns.hibernate("session-1")
        history = agent.get_history.remote().result(timeout_s=120)  # wakes it
        report = {
            "status": result.status,
            "text": result.text,
            "tool_state": tool["state"],
            "tool_output": tool.get("output"),
            "where": where,
            "hibernated": hibernated,
            "history": [m["role"] for m in history],
        }
    finally:
        ns.shutdown()
finally:
    ray.shutdown()
print(json.dumps(report))
"""


def test_a_job_with_its_own_runtime_storage_actors_folders_runs_a_session(ray_local, tmp_path):
    import thinkray.runtime

    job = tmp_path / "job"
    for name in ("runtime", "storage", "actors"):
        (job / name).mkdir(parents=True)
        (job / name / "__init__.py").write_text(SHADOW.format(name=name))
    (job / "job_agents.py").write_text(AGENTS)
    (job / "driver.py").write_text(DRIVER)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH")}
    env["PYTHONPATH"] = str(job)  # the job's folders first, as for `python driver.py`
    address = ray_local.get_runtime_context().gcs_address
    proc = subprocess.run(
        [sys.executable, "driver.py", str(tmp_path / "root"), address],
        cwd=job,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json_report(proc.stdout)
    assert report["status"] == "completed", report
    assert report["text"] == "The job's folders and thinkray live side by side."
    assert report["tool_state"] == "output-available"
    # In the worker: the bare names are the job's, thinkray is the installed package.
    assert report["tool_output"]["bare"] == ["job", "job", "job"]
    installed = os.path.dirname(thinkray.runtime.__file__)
    assert report["tool_output"]["thinkray_runtime"] == installed
    assert report["where"]["runtime"].endswith(os.path.join("runtime", "__init__.py"))
    assert not report["where"]["runtime"].startswith(installed)
    assert report["hibernated"] is True
    assert report["history"] == ["user", "assistant"]
