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


def test_the_demo_agent_keeps_one_claude_adapter_across_turns(monkeypatch):
    """Each turn asks get_model(): a new adapter per turn was a new HTTP client, SSL
    context and TLS connection per turn. A changed THINKRAY_MODEL gets its own."""
    from thinkray.actors.demo import DemoAgent
    from thinkray.runtime.models.anthropic import AnthropicModel

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-used")
    monkeypatch.delenv("THINKRAY_MODEL", raising=False)
    agent = DemoAgent()
    first = agent.get_model()
    assert isinstance(first, AnthropicModel) and first.model_id == "claude-sonnet-4-6"
    assert agent.get_model() is first
    monkeypatch.setenv("THINKRAY_MODEL", "claude-haiku-4-5")
    other = agent.get_model()
    assert other is not first and other.model_id == "claude-haiku-4-5"
    assert DemoAgent().get_model() is not other  # per agent, not per process
