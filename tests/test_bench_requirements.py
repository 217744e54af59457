"""Every module the benchmark scripts import is the standard library's, the package's,
or declared in pyproject.toml (the package's dependencies or its ``bench`` extra): a
fresh clone runs them after ``pip install ".[bench]"`` (issue 9, item 20)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "tests" / "bench"
# import name -> distribution name, where they differ
DISTRIBUTION = {"yaml": "pyyaml"}


def _top_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.partition(".")[0])
    return names


def _declared() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"]) + list(project["optional-dependencies"]["bench"])
    return {re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0].lower() for spec in specs}


def test_benchmark_imports_are_declared():
    local = {p.stem for p in BENCH.glob("*.py")} | {"thinkray", "tests", "__future__"}
    declared = _declared()
    scripts = sorted(BENCH.glob("bench_*.py"))
    assert scripts
    for script in scripts:
        for name in _top_level_imports(script) - local:
            if name in sys.stdlib_module_names:
                continue
            assert DISTRIBUTION.get(name, name).lower() in declared, (
                f"{script.name} imports {name!r}, which neither the package nor the "
                "'bench' extra declares"
            )
