"""`thinkray demo`, the main job, run the way a user runs it: a fresh process that starts
its own Ray, offline (no API key), to the end."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.ray


def test_thinkray_demo_runs_to_the_end_offline(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "RAY_ADDRESS")}
    env["THINKRAY_STORAGE_ROOT"] = str(tmp_path / "root")
    run = subprocess.run(
        [sys.executable, "-c", "import sys; from thinkray.actors.cli import main; sys.exit(main())",
         "demo"],
        capture_output=True, text=True, env=env, timeout=240, cwd=tmp_path,
    )  # fmt: skip
    out = run.stdout
    assert run.returncode == 0, out[-3000:] + run.stderr[-3000:]
    assert "using the offline scripted model" in out
    assert f"storage: {tmp_path / 'root'}" in out  # THINKRAY_STORAGE_ROOT is the root
    assert "[tool call] get_weather" in out and "light rain" in out
    assert "wal left: False" in out  # hibernation checkpointed and closed the file
    assert "History rebuilt from DuckDB" in out and "Status: idle." in out
    assert "researcher: completed" in out and "reviewer: completed" in out
    assert "notes/findings.md (read back through the bridge)" in out
    assert out.rstrip().endswith("Demo complete.")
    assert (tmp_path / "root" / "demo").is_dir()
