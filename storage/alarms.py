"""The pending alarms of a namespace's agents, kept beside their files so that a
replaced directory knows them: one small file per agent with a pending alarm,
``root/<namespace>/.alarms/<name>``, holding its due time (epoch seconds, as text).

The namespace directory writes the file whenever its in-memory alarm of an agent
changes (an agent hibernates with a schedule due, a live agent reports its next due
time) and removes it when the agent has no alarm left (woken, or nothing scheduled);
a directory that starts reads the files of its names back (see
:mod:`thinkray.actors.directory`). A write replaces the file atomically (a temporary
file renamed over it), so a reader sees the old due time or the new one, never half
of one.

Under an object-store root the same keys live in the store (``<root>/<namespace>/
.alarms/<name>``, written whole by one PUT) through :mod:`thinkray.storage.objectstore`.
"""

from __future__ import annotations

import contextlib
import math
import os
import uuid
from collections.abc import Callable
from pathlib import Path

from thinkray.storage.layout import is_remote_root, validate_name

ALARMS_DIR = ".alarms"


def alarms_dir(root: str | os.PathLike[str], namespace: str) -> Path:
    """The folder of ``namespace``'s alarm files under a local ``root``."""
    return Path(root) / validate_name(namespace, "namespace") / ALARMS_DIR


def _parse(text: str | bytes) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None  # foreign or torn (never written by write_alarm): ignored
    return value if math.isfinite(value) else None


def write_alarm(
    root: str | os.PathLike[str], namespace: str, name: str, due_at: float | None
) -> None:
    """Record that ``name`` is due at ``due_at`` (epoch seconds); None removes the
    record. Atomic: the file holds the previous due time or the new one."""
    validate_name(namespace, "namespace")
    validate_name(name)
    if is_remote_root(root):
        from thinkray.storage.objectstore import _backend

        backend = _backend(str(root))
        key = f"{namespace}/{ALARMS_DIR}/{name}"
        if due_at is None:
            backend.delete(key)
        else:
            backend.write(key, repr(float(due_at)).encode())
        return
    path = alarms_dir(root, namespace) / name
    if due_at is None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        tmp.write_text(repr(float(due_at)), encoding="utf-8")
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def read_alarms(
    root: str | os.PathLike[str],
    namespace: str,
    keep: Callable[[str], bool] | None = None,
) -> dict[str, float]:
    """The recorded alarms of ``namespace`` (name -> due time), only of the names
    ``keep`` accepts when given (checked before a file is read). Files that are not
    an alarm record (temporaries, foreign names, unparsable contents) are skipped."""
    validate_name(namespace, "namespace")
    out: dict[str, float] = {}
    if is_remote_root(root):
        from thinkray.storage.objectstore import _backend

        backend = _backend(str(root))
        prefix = f"{namespace}/{ALARMS_DIR}"
        for base, is_dir in backend.children(prefix):
            if is_dir or not _is_alarm_name(base) or (keep is not None and not keep(base)):
                continue
            data = backend.read(f"{prefix}/{base}")
            due = _parse(data) if data is not None else None
            if due is not None:
                out[base] = due
        return out
    folder = alarms_dir(root, namespace)
    try:
        with os.scandir(folder) as it:
            names = [e.name for e in it if _is_alarm_name(e.name)]
    except FileNotFoundError:
        return out
    for name in names:
        if keep is not None and not keep(name):
            continue
        try:
            due = _parse((folder / name).read_text(encoding="utf-8"))
        except OSError:
            continue  # removed meanwhile
        if due is not None:
            out[name] = due
    return out


def _is_alarm_name(base: str) -> bool:
    try:
        validate_name(base)
    except Exception:
        return False
    return True
