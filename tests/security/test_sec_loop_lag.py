"""No tool may hold an actor's event loop for more than 100 ms (issue 21, item 8).

Python's ``re`` backtracks: ``(a+)+$`` against 26 ``a`` and a ``b`` runs for many
seconds on this machine, all of it on the loop, where not even the sandbox's timeout can
fire. Workspace grep and globs use RE2 (linear time). The inputs below would block for
seconds with a backtracking engine, so the 100 ms bound has a wide margin either way.
"""

from __future__ import annotations

import pytest
from thinkray.runtime.abort import AbortSignal
from thinkray.runtime.tools import confine
from thinkray.runtime.tools.base import ToolContext, ToolExecutionError
from thinkray.runtime.tools.sandbox import CodeSandbox, execute_tool
from thinkray.runtime.tools.workspace import LocalWorkspace, workspace_tools
from thinkray.storage.stores import open_stores

from tests.looplag import assert_loop_free, measure_loop_lag

CATASTROPHIC = r"(a+)+$"
VICTIM_LINE = "a" * 26 + "b"  # 2**26 paths for a backtracking engine
GLOB_BOMB = "*a*a*a*a*a*a*b"  # polynomial backtracking against a long name of 'a's
SLOW_MACHINE_TIMEOUT = 30


@pytest.fixture
def ws():
    stores = open_stores(":memory:")
    workspace = LocalWorkspace(stores.workspace())
    workspace.write_file("victim.txt", f"first line\n{VICTIM_LINE}\naaa\n")
    workspace.write_file("a" * 70, "a file with a long name")
    yield workspace
    stores.close()


def ctx(name: str) -> ToolContext:
    return ToolContext(tool_call_id="c1", tool_name=name, signal=AbortSignal())


async def test_grep_with_a_catastrophic_pattern_does_not_block_the_loop(ws):
    grep = workspace_tools(ws)["grep"]
    found, lag = await measure_loop_lag(
        grep.execute(grep.validate({"pattern": CATASTROPHIC}), ctx("grep"))
    )
    assert_loop_free(lag, "grep (a+)+$")
    # Still a real search: the line of a's only matches without the trailing b.
    assert found["matches"] == ["victim.txt:3:aaa"]


async def test_glob_with_many_stars_does_not_block_the_loop(ws):
    find = workspace_tools(ws)["find_files"]
    found, lag = await measure_loop_lag(
        find.execute(find.validate({"pattern": GLOB_BOMB}), ctx("find_files"))
    )
    assert_loop_free(lag, f"find_files {GLOB_BOMB}")
    assert found["files"] == []


async def test_grep_from_sandboxed_code_does_not_block_the_loop(ws):
    # The parent serves the sandbox's workspace calls on its own loop: a backtracking
    # regex there would also stop the sandbox's timeout from firing.
    sandbox = CodeSandbox(ws, access="read", timeout=SLOW_MACHINE_TIMEOUT)
    out, lag = await measure_loop_lag(
        sandbox.run(f"[m['line'] for m in workspace.grep({CATASTROPHIC!r})['matches']]")
    )
    assert out.ok, out.error
    assert out.result == [3]
    assert_loop_free(lag, "grep through the sandbox channel")


async def test_cpu_heavy_sandboxed_code_does_not_block_the_loop():
    # 5 s: a loop that waited for the program synchronously would show a 5 s gap.
    tool = execute_tool(CodeSandbox(None, timeout=5.0))
    # The first run in a process compiles the seccomp filter (~65 ms of CPU, more on a
    # loaded machine): measured every time, not only when this test runs first.
    confine.seccomp_program.cache_clear()

    async def spin() -> None:
        with pytest.raises(ToolExecutionError, match="timed out"):
            await tool.execute(tool.validate({"code": "while True:\n    pass"}), ctx("execute"))

    _, lag = await measure_loop_lag(spin())
    assert_loop_free(lag, "a sandboxed program spinning until its timeout")


def test_grep_refuses_what_re2_cannot_run_in_linear_time(ws):
    grep = workspace_tools(ws)["grep"]
    for pattern in (r"(a)\1", r"(?=a)a"):
        with pytest.raises(ValueError, match="RE2 syntax"):
            grep.validate({"pattern": pattern})
        with pytest.raises(ValueError, match="RE2 syntax"):
            ws.grep(pattern)


async def test_the_lag_check_sees_a_blocked_loop():
    # The measure itself: CPU burnt on the loop fails the check; a synchronous wait
    # shows in the wall figure (recorded, not asserted: load can deschedule a process).
    import time

    async def spin(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    async def wait(seconds: float) -> None:
        time.sleep(seconds)

    _, lag = await measure_loop_lag(spin(0.5))
    assert lag.cpu >= 0.5
    with pytest.raises(AssertionError, match="of CPU on the event loop"):
        assert_loop_free(lag, "a busy loop")
    _, lag = await measure_loop_lag(wait(0.5))
    assert lag.wall >= 0.45 and lag.cpu < 0.1  # the ticker's own 5 ms sleep is not lag
