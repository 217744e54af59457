"""Install real npm clients for the tests, once, under ``tests/.npm-cache/<folder>``
(git-ignored, reused by later sessions; delete a folder to pick up newer releases).
An unreachable registry fails the tests that need it, it does not skip them.

The same install-once-under-a-lock scheme as ``tests/test_ai_sdk_clients.py`` (whose
``_install`` is specific to one ``ai`` major), for any set of packages."""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

NPM_CACHE = Path(__file__).resolve().parent / ".npm-cache"
NPM_TIMEOUT = 300


def installed_version(project: Path, package: str) -> str | None:
    """The version of ``package`` installed in ``project`` (None if it is not)."""
    try:
        manifest = project / "node_modules" / package / "package.json"
        return str(json.loads(manifest.read_text())["version"])
    except (OSError, ValueError, KeyError):
        return None


def npm_project(folder: str, specs: dict[str, str]) -> Path:
    """``tests/.npm-cache/<folder>`` with ``specs`` (package -> version prefix the
    installed one must have, e.g. ``{"ai": "6."}``; ``""`` takes any) installed, each
    at its ``@<prefix without the dot>`` range. Two test sessions at once install once."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail(
            f"these tests run real npm packages ({', '.join(specs)}): install node (>= 20) "
            f"and npm (found node={node!r}, npm={npm!r})"
        )
    project = NPM_CACHE / folder
    project.mkdir(parents=True, exist_ok=True)

    def fresh() -> bool:
        return all(
            (v := installed_version(project, p)) is not None and v.startswith(prefix)
            for p, prefix in specs.items()
        )

    with open(NPM_CACHE / f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not fresh():
            (project / "package.json").write_text(
                json.dumps({"name": f"thinkray-{folder}-client", "private": True}) + "\n"
            )
            wanted = [f"{p}@{prefix.rstrip('.') or 'latest'}" for p, prefix in specs.items()]
            started = time.monotonic()
            # Optional peers (react, vite, ...) are not what the tests use: skip them.
            command = [npm, "install", "--no-audit", "--no-fund", "--loglevel=error"]
            command += ["--legacy-peer-deps", *wanted]
            try:
                proc = subprocess.run(
                    command, cwd=project, capture_output=True, text=True, timeout=NPM_TIMEOUT
                )
            except subprocess.TimeoutExpired:
                pytest.fail(
                    f"`npm install {' '.join(wanted)}` took over {NPM_TIMEOUT} s in {project}: "
                    "is the npm registry reachable from here?"
                )
            if proc.returncode != 0 or not fresh():
                pytest.fail(
                    f"`npm install {' '.join(wanted)}` failed (exit {proc.returncode}) in "
                    f"{project}: these tests need the npm registry (or that folder already "
                    f"installed). npm said:\n{proc.stderr[-2000:]}"
                )
            print(f"npm install {' '.join(wanted)} in {time.monotonic() - started:.1f} s")
    return project
