"""Removing an agent with everything that is its, so that whoever claims the name next
inherits nothing.

What belongs to agent ``name`` of ``namespace`` under a root:

* its database file (``<ns>/<name>.duckdb``, its ``.wal``, its ``.journal`` and a
  vacuum's scratch copy; under an object-store root every generation, data object
  and lease under ``<ns>/<name>/``);
* its shared workspace, when it is an orchestrator (the bridge's file,
  ``<ns>/_shared/<name>.duckdb``; ``<ns>/.shared/<name>/`` in an object store);
* its sub-agents: the namespace ``<ns>.<name>.subs`` whole (their files, their
  shared workspaces, alarm files, index), after removing each sub-agent the same way
  (sub-agents of sub-agents live in namespaces of their own);
* its alarm file (``<ns>/.alarms/<name>``) and its fleet-index row;
* last, its owner file: until the owner is released nobody else can claim the name,
  so a crash midway leaves a half-removed agent to its owner, and running the removal
  again finishes it (every step is idempotent; the agent's own file goes after its
  sub-agents and workspace, so a re-run still finds the agent).

Nothing is removed while any part is live (a process holds a file, or a live lease):
the removal is refused first, whole.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from thinkray.storage.alarms import write_alarm
from thinkray.storage.errors import UserError
from thinkray.storage.journal import journal_path
from thinkray.storage.layout import (
    REMOTE_SHARED_FOLDER,
    SHARED_FOLDER,
    is_remote_root,
    list_names,
    session_path,
    subagents_namespace,
    validate_name,
)
from thinkray.storage.owners import OwnerRegistry
from thinkray.storage.vacuum import leftovers as vacuum_leftovers

__all__ = ["AgentInUseError", "Removal", "agent_exists", "agent_parts", "remove_agent"]


class AgentInUseError(UserError):
    """A part of the agent is live (a process holds its file or a lease on it): nothing
    was removed."""


@dataclass
class Removal:
    """What :func:`remove_agent` removed."""

    namespace: str
    name: str
    removed: list[str] = field(default_factory=list)
    agents: list[str] = field(default_factory=list)
    """Every agent removed, ``namespace/name``, sub-agents first."""
    owner_released: str | None = None


def agent_parts(root: str | os.PathLike[str], namespace: str, name: str) -> list[tuple[str, str]]:
    """``(namespace, name)`` of the agent and of all its sub-agents, recursively, the
    deepest first (the order they are removed in)."""
    validate_name(namespace, "namespace")
    validate_name(name, "agent name")
    out: list[tuple[str, str]] = []
    subs = subagents_namespace(namespace, name)
    with contextlib.suppress(ValueError):  # a namespace name too long: no sub-agents
        validate_name(subs, "namespace")
        for sub in list_names(root, subs):
            out.extend(agent_parts(root, subs, sub))
    out.append((namespace, name))
    return out


def _local_live(root: Path, namespace: str, name: str) -> list[str]:
    from thinkray.storage.fleet_index import is_locked

    files = (
        root / namespace / f"{name}.duckdb",
        root / namespace / SHARED_FOLDER / f"{name}.duckdb",
    )
    return [str(p) for p in files if is_locked(p)]


def _remote_live(root: str, namespace: str, name: str) -> list[str]:
    from thinkray.storage.objectstore import live_lease_owner

    out = []
    for ns in (namespace, f"{namespace}/{REMOTE_SHARED_FOLDER}"):
        holder = live_lease_owner(root, ns, name)
        if holder is not None:
            out.append(f"{ns}/{name} (lease of {holder})")
    return out


def _remove_local(root: Path, namespace: str, name: str, removed: list[str]) -> None:
    subs = root / subagents_namespace(namespace, name)
    if subs.is_dir():
        shutil.rmtree(subs)
        removed.append(str(subs))
    write_alarm(root, namespace, name, None)
    for base in (root / namespace / SHARED_FOLDER / name, root / namespace / name):
        duckdb_file = Path(f"{base}.duckdb")
        # and a vacuum's scratch copy a crash left behind (thinkray.storage.vacuum)
        leftovers = (
            Path(f"{base}.duckdb.wal"),
            journal_path(duckdb_file),
            *vacuum_leftovers(duckdb_file),
        )
        for path in (duckdb_file, *leftovers):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(str(path))


def _remove_remote(root: str, namespace: str, name: str, removed: list[str]) -> None:
    from thinkray.storage.objectstore import delete_prefix

    removed.extend(delete_prefix(root, subagents_namespace(namespace, name)))
    write_alarm(root, namespace, name, None)
    removed.extend(delete_prefix(root, f"{namespace}/{REMOTE_SHARED_FOLDER}/{name}"))
    removed.extend(delete_prefix(root, f"{namespace}/{name}"))


def remove_agent(root: str | os.PathLike[str], namespace: str, name: str) -> Removal:
    """Remove agent ``name`` of ``namespace`` and everything that is its (see the module
    docstring), then release its owner. Idempotent: a second call finishes what a
    crashed one left.

    Raises:
        AgentInUseError: a part is live (nothing was removed).
        InvalidInputError: an invalid namespace or name.
    """
    from thinkray.storage.fleet_index import FleetIndex

    remote = is_remote_root(root)
    parts = agent_parts(root, namespace, name)
    live = [
        held
        for ns, n in parts
        for held in (_remote_live(str(root), ns, n) if remote else _local_live(Path(root), ns, n))
    ]
    if live:
        raise AgentInUseError(
            f"agent {name!r} of {namespace!r} is live ({', '.join(live)}): hibernate it, its "
            "sub-agents and stop its shared workspace's bridge first; nothing was removed"
        )
    result = Removal(namespace, name)
    for ns, n in parts:
        if remote:
            _remove_remote(str(root), ns, n, result.removed)
        else:
            _remove_local(Path(root), ns, n, result.removed)
        FleetIndex(root, ns).delete(n)
        result.agents.append(f"{ns}/{n}")
    registry = OwnerRegistry(root)
    owner = registry.owner(namespace, name)
    if owner is not None and registry.release(namespace, name, owner):
        result.owner_released = owner
    return result


def agent_exists(root: str | os.PathLike[str], namespace: str, name: str) -> bool:
    """Whether anything of agent ``name`` is left: its file, index row or owner."""
    from thinkray.storage.fleet_index import FleetIndex

    return (
        session_path(root, namespace, name).exists()
        or FleetIndex(root, namespace).get(name) is not None
        or OwnerRegistry(root).owner(namespace, name) is not None
    )
