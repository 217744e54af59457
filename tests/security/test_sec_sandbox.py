"""Attacks on the code sandbox (issue 21, item 7): model-written code must not reach the
host. Each attack runs twice where it matters:

- through :class:`CodeSandbox` (the OS sandbox with the audit hook inside), as the
  model's code would;
- at the kernel layer alone: the same bwrap command line and seccomp filter the sandbox
  uses, around a plain interpreter with no audit hook, driving raw syscalls through
  ctypes. That is what crafted bytecode or any audit-hook bypass would be left with.

Every test shows the target afterwards: the process alive, the file unchanged, the
secret unseen.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from thinkray.runtime.abort import AbortSignal
from thinkray.runtime.errors import SandboxUnavailableError, ToolExecutionError
from thinkray.runtime.tools import confine
from thinkray.runtime.tools.base import ToolContext
from thinkray.runtime.tools.extensions import ExtensionManager
from thinkray.runtime.tools.sandbox import CodeSandbox, execute_tool
from thinkray.runtime.tools.workspace import LocalWorkspace
from thinkray.storage.stores import open_stores

SLOW_MACHINE_TIMEOUT = 30
SECRET = "sk-ant-test-3f9c2e7a1b-do-not-leak"

# ctypes preamble of the kernel-layer attacks: raw libc calls that raise no audit event.
KERNEL_PREAMBLE = r"""
import ctypes, errno, json, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
def outcome(rc):
    return "ok" if rc == 0 else errno.errorcode.get(ctypes.get_errno(), "?")
results = {}
"""


def kernel_run(code: str, env: dict[str, str] | None = None) -> dict:
    """Run ``code`` under the sandbox's bwrap command line and seccomp filter, without
    the bootstrap (no audit hook, no rlimits): the kernel's part alone. The code
    prints one JSON object."""
    bwrap = confine.find_bwrap()
    sandbox = confine.OsSandbox(str(bwrap), confine.seccomp_program())
    with confine.program_fd(sandbox.seccomp) as fd:
        argv = sandbox.argv(
            [confine.interpreter(False), "-I", "-S", "-c", KERNEL_PREAMBLE + code],
            binds=confine.interpreter_binds(False),
            seccomp_fd=fd,
        )
        done = subprocess.run(
            argv,
            pass_fds=() if fd is None else (fd,),
            capture_output=True,
            text=True,
            timeout=120,
            env=env if env is not None else {"PATH": os.defpath},
        )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def target():
    """A host process of the same user for the sandbox to aim at (stands for the
    session actor or the raylet)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def parent_signals():
    """Signals this process (the sandbox's parent, standing for the actor) receives
    while a test runs: the attacks aim SIGUSR1 and SIGIO at it, so a regression is a
    failed assertion instead of a dead test run."""
    received: list[int] = []
    saved = {
        sig: signal.signal(sig, lambda signum, frame: received.append(signum))
        for sig in (signal.SIGUSR1, signal.SIGIO)
    }
    yield received
    time.sleep(0.2)  # a late signal still counts
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def assert_alive(proc: subprocess.Popen) -> None:
    time.sleep(0.2)  # a signal, had one landed, is delivered by now
    assert proc.poll() is None, f"the target died with {proc.returncode}"
    os.kill(proc.pid, 0)


def sandbox(ops=None, **kw) -> CodeSandbox:
    return CodeSandbox(ops, timeout=SLOW_MACHINE_TIMEOUT, **kw)


@pytest.fixture(scope="module", autouse=True)
def os_sandbox_works():
    import asyncio

    reason = asyncio.run(confine.probe(confine.find_bwrap()))
    assert reason is None, f"the OS sandbox must work on this machine: {reason}"


# -- signals, ptrace, /proc/<pid>/mem ----------------------------------------------------

SIGNAL_ROUTES = r"""
for pid, sig in PIDS.items():
    r = results.setdefault(str(pid), {})
    r["kill"] = outcome(libc.kill(pid, sig))
    r["killpg"] = outcome(libc.killpg(pid, sig))
    r["tgkill"] = outcome(libc.tgkill(pid, pid, sig))
    r["sigqueue"] = outcome(libc.sigqueue(pid, sig, 0))
    try:
        fd = os.pidfd_open(pid)
        signal.pidfd_send_signal(fd, sig)
        r["pidfd"] = "ok"
    except OSError as exc:
        r["pidfd"] = errno.errorcode.get(exc.errno, str(exc))
    # SIGIO to the owner of a file descriptor (its default action kills the target).
    import fcntl
    rfd, wfd = os.pipe()
    try:
        fcntl.fcntl(rfd, fcntl.F_SETOWN, pid)
        fcntl.fcntl(rfd, fcntl.F_SETFL, os.O_ASYNC)
        os.write(wfd, b"x")
        r["sigio"] = "attempted"
    except OSError as exc:
        r["sigio"] = errno.errorcode.get(exc.errno, str(exc))
    r["ptrace"] = outcome(libc.ptrace(16, pid, 0, 0))  # PTRACE_ATTACH
    buf = ctypes.create_string_buffer(8)
    iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)
    rc = libc.process_vm_readv(pid, iov, 1, iov, 1, 0)
    r["process_vm_readv"] = "ok" if rc >= 0 else errno.errorcode.get(ctypes.get_errno())
    try:
        open(f"/proc/{pid}/mem", "r+b").write(b"x")
        r["proc_mem"] = "ok"
    except OSError as exc:
        r["proc_mem"] = type(exc).__name__
results["kill_all"] = outcome(libc.kill(-1, signal.SIGKILL))
results["visible"] = sorted(p for p in os.listdir("/proc") if p.isdigit())
print(json.dumps(results))
"""


def test_kernel_keeps_signals_ptrace_and_proc_mem_off_host_processes(target, parent_signals):
    me = os.getpid()
    code = f"PIDS = {{{target.pid}: 9, {me}: {int(signal.SIGUSR1)}, os.getppid(): {int(signal.SIGUSR1)}}}\n"
    code += SIGNAL_ROUTES
    results = kernel_run(code)
    for pid in (str(target.pid), str(me)):
        # Host pids do not exist in the sandbox's pid namespace.
        assert set(results[pid].values()) <= {
            "ESRCH",
            "EPERM",
            "FileNotFoundError",
            "attempted",  # F_SETOWN to a pid this namespace lacks: no owner, no signal
        }, results
        assert results[pid]["proc_mem"] == "FileNotFoundError"
    # seccomp refuses these outright, whatever the pid (the sandbox's own parent too).
    for pid in results:
        if pid.isdigit():
            assert results[pid]["ptrace"] == "EPERM"
            assert results[pid]["pidfd"] == "EPERM"
            assert results[pid]["process_vm_readv"] == "EPERM"
    assert results["visible"] == ["1", "2"]  # bwrap's init and the code: nothing else
    assert_alive(target)
    assert parent_signals == []


async def test_sandboxed_code_cannot_signal_or_trace_host_processes(target, parent_signals):
    me = os.getpid()
    code = f"""
import fcntl, os, signal

def sigio(pid):
    # SIGIO to the owner of a descriptor: its default action kills the target.
    rfd, wfd = os.pipe()
    fcntl.fcntl(rfd, fcntl.F_SETOWN, pid)
    fcntl.fcntl(rfd, fcntl.F_SETFL, os.O_ASYNC)
    os.write(wfd, b"x")

pids = {{{target.pid}: 9, {me}: {int(signal.SIGUSR1)}, os.getppid(): {int(signal.SIGUSR1)}}}
attempts = {{}}
for pid, sig in pids.items():
    try:
        sigio(pid)
    except OSError:
        pass
    for name, attempt in {{
        "kill": lambda: os.kill(pid, sig),
        "killpg": lambda: os.killpg(pid, sig),
        "pidfd": lambda: signal.pidfd_send_signal(os.pidfd_open(pid), sig),
        "proc_mem": lambda: open(f"/proc/{{pid}}/mem", "r+b").write(b"x"),
    }}.items():
        try:
            attempt()
            attempts[f"{{name}} {{pid}}"] = "ALLOWED"
        except OSError as exc:
            attempts[f"{{name}} {{pid}}"] = f"{{type(exc).__name__}}: {{exc}}"
attempts
"""
    out = await sandbox().run(code)
    assert out.ok, out.error
    assert "ALLOWED" not in out.result.values(), out.result
    assert out.isolation == "os" and out.warning is None
    # pidfd_open raises no audit event: the kernel (seccomp) is what refuses it.
    assert out.result[f"pidfd {target.pid}"].startswith("PermissionError")
    assert out.result[f"kill {me}"].startswith("PermissionError: sandbox:")  # the hook
    assert_alive(target)
    assert parent_signals == []


# -- mount, unshare, new processes -------------------------------------------------------


def test_kernel_refuses_mount_unshare_and_new_processes():
    results = kernel_run(r"""
MS_REMOUNT, MS_BIND = 32, 4096
results["mount_tmpfs"] = outcome(libc.mount(b"none", b"/usr", b"tmpfs", 0, None))
results["remount_rw"] = outcome(libc.mount(None, b"/usr", None, MS_REMOUNT | MS_BIND, None))
results["unshare_user"] = outcome(libc.unshare(0x10000000))           # CLONE_NEWUSER
results["unshare_mount"] = outcome(libc.unshare(0x00020000))          # CLONE_NEWNS
results["chroot"] = outcome(libc.chroot(b"/tmp"))
results["fork"] = "ok" if libc.fork() >= 0 else errno.errorcode.get(ctypes.get_errno())
try:
    open("/usr/planted", "w")
    results["write_usr"] = "ok"
except OSError as exc:
    results["write_usr"] = errno.errorcode.get(exc.errno)
try:
    open("/tmp/scratch", "w").write("private tmp is writable")
    results["write_tmp"] = open("/tmp/scratch").read()
except OSError as exc:
    results["write_tmp"] = str(exc)
results["uid"] = os.getuid()
results["cap_eff"] = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0]
print(json.dumps(results))
""")
    for name in ("mount_tmpfs", "remount_rw", "unshare_user", "unshare_mount", "chroot", "fork"):
        assert results[name] == "EPERM", (name, results)
    assert results["write_usr"] == "EROFS"
    assert results["write_tmp"] == "private tmp is writable"
    assert results["uid"] == confine.SANDBOX_UID
    assert int(results["cap_eff"], 16) == 0
    assert not os.path.exists("/usr/planted")


async def test_sandboxed_code_cannot_start_processes_or_use_ctypes():
    code = """
import os
attempts = {}
for name, attempt in {
    "ctypes": lambda: __import__("ctypes"),
    "_ctypes": lambda: __import__("_ctypes"),
    "fork": lambda: os.fork(),
    "posix_spawn": lambda: os.posix_spawn("/usr/bin/true", ["true"], {}),
}.items():
    try:
        attempt()
        attempts[name] = "ALLOWED"
    except (OSError, ImportError) as exc:
        attempts[name] = f"{type(exc).__name__}: {exc}"
attempts
"""
    out = await sandbox().run(code)
    assert out.ok, out.error
    assert "ALLOWED" not in out.result.values(), out.result
    assert out.result["ctypes"].startswith("PermissionError: sandbox:")


# -- crafted bytecode --------------------------------------------------------------------


async def test_code_objects_cannot_be_built():
    code = """
import types
attempts = {}
template = (lambda: 0).__code__
for name, attempt in {
    "code.replace": lambda: template.replace(co_consts=()),
    "CodeType": lambda: types.CodeType(*[getattr(template, a) for a in (
        "co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_nlocals",
        "co_stacksize", "co_flags", "co_code", "co_consts", "co_names", "co_varnames",
        "co_filename", "co_name", "co_qualname", "co_firstlineno", "co_linetable",
        "co_exceptiontable")]),
}.items():
    try:
        attempt()
        attempts[name] = "ALLOWED"
    except PermissionError as exc:
        attempts[name] = str(exc)
attempts
"""
    out = await sandbox().run(code)
    assert out.ok, out.error
    for name, message in out.result.items():
        assert message == "sandbox: building code objects is not allowed", (name, message)


async def test_the_audit_hook_cannot_be_rewritten_through_gc():
    code = """
import gc, types
names = ("in_tmp", "sandbox_audit_hook")
found = [f for f in gc.get_objects() if type(f) is types.FunctionType and f.__name__ in names]
out = {}
for f in found:
    for attr, value in (("__code__", (lambda *a: True).__code__), ("__defaults__", None)):
        try:
            setattr(f, attr, value)
            out[f"{f.__name__}.{attr}"] = "REWRITTEN"
        except PermissionError as exc:
            out[f"{f.__name__}.{attr}"] = str(exc)
out
"""
    out = await sandbox().run(code)
    assert out.ok, out.error
    assert len(out.result) == 4, out.result  # both functions were found, both refused
    assert set(out.result.values()) == {"sandbox: the sandbox's audit hook cannot be changed"}


# -- the agent's DuckDB file and storage root --------------------------------------------


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def test_agent_database_and_storage_root_are_out_of_reach(tmp_path):
    root = tmp_path / "storage-root"
    db = root / "agent.duckdb"
    stores = open_stores(db)
    try:
        ws = LocalWorkspace(stores.workspace())
        ws.write_file("notes.txt", "keep me")
        before = _digest(db)
        code = f"""
import os
attempts = {{}}
for name, attempt in {{
    "exists": lambda: os.path.exists({str(db)!r}) and "VISIBLE",
    "read": lambda: open({str(db)!r}, "rb").read(16),
    "write": lambda: open({str(db)!r}, "r+b").write(b"corrupt"),
    "os.open": lambda: os.open({str(db)!r}, os.O_WRONLY | os.O_TRUNC),
    "plant": lambda: open({str(root / "planted")!r}, "w").write("x"),
    "list": lambda: os.listdir({str(root)!r}),
}}.items():
    try:
        attempts[name] = repr(attempt())
    except OSError as exc:
        attempts[name] = f"{{type(exc).__name__}}: {{exc}}"
attempts
"""
        out = await sandbox(ws).run(code)
        assert out.ok, out.error
        assert out.result["exists"] == "False"
        for name in ("read", "write", "os.open", "plant", "list"):
            assert out.result[name].startswith(("FileNotFoundError", "PermissionError")), out.result

        kernel = kernel_run(f"""
O_RDWR, O_CREAT = 2, 64
results["open_db"] = "ok" if libc.open({str(db).encode()!r}, O_RDWR) >= 0 else errno.errorcode.get(ctypes.get_errno())
results["plant"] = "ok" if libc.open({str(root / "planted").encode()!r}, O_RDWR | O_CREAT, 0o644) >= 0 else errno.errorcode.get(ctypes.get_errno())
print(json.dumps(results))
""")
        assert kernel == {"open_db": "ENOENT", "plant": "ENOENT"}
        assert _digest(db) == before
        assert not (root / "planted").exists()
        assert ws.read_file("notes.txt") == "keep me"
    finally:
        stores.close()


# -- secrets in the environment ----------------------------------------------------------


async def test_environment_secrets_are_not_visible(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    monkeypatch.setenv("GITHUB_TOKEN", SECRET)
    me = os.getpid()
    code = f"""
import os
seen = {{"environ": dict(os.environ)}}
for path in ("/proc/self/environ", "/proc/1/environ", "/proc/{me}/environ"):
    try:
        seen[path] = open(path, "rb").read().decode("utf-8", "replace")
    except OSError as exc:
        seen[path] = type(exc).__name__
print(seen)
seen
"""
    out = await sandbox().run(code)
    assert out.ok, out.error
    assert "ANTHROPIC_API_KEY" not in out.result["environ"]
    assert SECRET not in json.dumps(out.result) + out.stdout + out.stderr
    assert out.result[f"/proc/{me}/environ"] in ("FileNotFoundError", "PermissionError")

    # Even if the parent handed its environment to bwrap, the sandbox starts clean.
    kernel = kernel_run(
        r"""
results["environ"] = dict(os.environ)
results["init"] = open("/proc/1/environ", "rb").read().decode("utf-8", "replace") if os.access("/proc/1/environ", os.R_OK) else "unreadable"
print(json.dumps(results))
""",
        env=dict(os.environ),
    )
    assert SECRET not in json.dumps(kernel["environ"])
    assert "ANTHROPIC_API_KEY" not in kernel["environ"]


def test_kernel_has_no_network():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.setblocking(False)
    port = server.getsockname()[1]
    try:
        results = kernel_run(f"""
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2)
    results["connect"] = "ok"
except OSError as exc:
    results["connect"] = type(exc).__name__
results["interfaces"] = [name for _, name in socket.if_nameindex()]
print(json.dumps(results))
""")
        assert results["connect"] != "ok"
        assert results["interfaces"] == ["lo"]  # only the namespace's own, down, loopback
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()


# -- no OS sandbox: refuse, unless the agent opted in, loudly ----------------------------


async def test_without_the_os_sandbox_code_is_refused(tmp_path):
    missing = str(tmp_path / "no-such-bwrap")
    strict = sandbox(bwrap=missing)
    with pytest.raises(SandboxUnavailableError, match="OS sandbox cannot start") as info:
        await strict.run("1 + 1")
    assert missing in str(info.value) and "allow_weak_sandbox" in str(info.value)

    # A binary that is there but is not bubblewrap fails the probe the same way.
    with pytest.raises(SandboxUnavailableError, match="bwrap failed"):
        await sandbox(bwrap="/bin/false").run("1 + 1")

    # The model sees a tool error, not a crash.
    ctx = ToolContext(tool_call_id="c1", tool_name="execute", signal=AbortSignal())
    tool = execute_tool(strict)
    with pytest.raises(ToolExecutionError, match="OS sandbox cannot start"):
        await tool.execute(tool.validate({"code": "1 + 1"}), ctx)

    # Extensions are refused too, and nothing is stored.
    stores = open_stores(":memory:")
    try:
        manager = ExtensionManager(stores, bwrap=missing, timeout=SLOW_MACHINE_TIMEOUT)
        source = "manifest = {'name': 'x'}\n@extension_tool\ndef f() -> int:\n    return 1\n"
        with pytest.raises(SandboxUnavailableError):
            await manager.load(source)
        assert manager.list() == []
    finally:
        stores.close()


async def test_weak_mode_is_explicit_and_loud(tmp_path, caplog):
    weak = sandbox(bwrap=str(tmp_path / "no-such-bwrap"), allow_weak_sandbox=True)
    with caplog.at_level(logging.WARNING, logger="thinkray.sandbox"):
        out = await weak.run("6 * 7")
    assert out.ok and out.result == 42
    assert out.isolation == "audit-only"
    assert out.warning and "WITHOUT the OS sandbox" in out.warning
    assert any("WITHOUT the OS sandbox" in r.getMessage() for r in caplog.records)

    ctx = ToolContext(tool_call_id="c1", tool_name="execute", signal=AbortSignal())
    tool = execute_tool(weak)
    shown = await tool.execute(tool.validate({"code": "6 * 7"}), ctx)
    assert shown["result"] == 42 and "WITHOUT the OS sandbox" in shown["warning"]

    # Under the OS sandbox no result carries the warning.
    strong = await sandbox().run("6 * 7")
    assert strong.isolation == "os" and strong.warning is None


def test_weak_mode_is_off_by_default():
    from thinkray.actors.orchestrator import SubAgent

    assert CodeSandbox().allow_weak_sandbox is False
    assert SubAgent.allow_weak_sandbox is False
