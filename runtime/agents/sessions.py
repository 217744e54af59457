"""Sessions of one agent: create, switch, list, delete, clear, branch, threads, rewind.

The data work is in the store (:meth:`~thinkray.storage.protocols.SessionStore.branch_session`,
:meth:`~thinkray.storage.protocols.SessionStore.rewind_session`, ...). What the
:class:`SessionManager` adds is what needs the runtime: the current session (persisted
in the store's config), the one-run-per-session rule (branch, clone and rewind are
refused while the session has a run in flight; clear and delete abort it) and the
``message.user`` snapshot contract of rewind.

Branch (seed 002 "Branching")
    The branch is a new session and does not become the current one: a sidecar must not
    steal the main conversation. Branching a failed session (status ``error``) is allowed.
Rewind and un-rewind (seed 002 "Rewinding")
    ``rewind(session, user_message_id)`` soft-hides everything after the user message
    on the current path; the next turn appends after it (``chat(None)`` regenerates the
    answer). ``include_target=True`` also hides the message itself, so an edited
    message is sent in its place (``resend``). ``RewindResult.snapshot_id`` is what a
    host's ``on_user_message`` hook tagged onto the target (world rewind is the host's).
    ``unrewind`` undoes the latest rewind; turns taken since stay, intact, on their own
    branch of the tree (``UnrewindResult.detached_ids``); it is refused only when a
    compaction since hid part of the conversation it would restore.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from thinkray.runtime.messages import new_id
from thinkray.storage.protocols import SessionStore
from thinkray.storage.types import MessageRow, SessionInfo, SessionNotFoundError

if TYPE_CHECKING:
    from thinkray.runtime.agents.turns import TurnRunner

CURRENT_SESSION_KEY = "think.current_session"

__all__ = [
    "CURRENT_SESSION_KEY",
    "RewindResult",
    "SessionManager",
    "UnrewindResult",
    "branch_view",
]


@dataclass
class RewindResult:
    """What ``Think.rewind`` did. ``target`` is the user message (its body goes back
    into the editor); ``snapshot_id`` is the host's world snapshot tagged on it."""

    session_id: str
    target: dict[str, Any]
    hidden_ids: list[str]
    snapshot_id: str | None
    head_id: str | None
    previous_head_id: str | None
    unhidden_ids: list[str] = field(default_factory=list)
    include_target: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Every field, as a dict."""
        return asdict(self)


@dataclass
class UnrewindResult:
    """What ``Think.unrewind`` did (see :class:`~thinkray.storage.types.UnrewindInfo`)."""

    session_id: str
    head_id: str | None
    unhidden_ids: list[str]
    rehidden_ids: list[str]
    detached_ids: list[str]

    def to_dict(self) -> dict[str, Any]:
        """Every field, as a dict."""
        return asdict(self)


class SessionManager:
    """The sessions of one agent's store, and which one is current.

    Takes the store and the agent's :class:`~thinkray.runtime.agents.turns.TurnRunner`
    (for the one-run-per-session rule). Unknown ids raise
    :class:`~thinkray.storage.types.SessionNotFoundError`, never create."""

    def __init__(self, store: SessionStore, runner: TurnRunner) -> None:
        self.store = store
        self.runner = runner
        current = store.get_config(CURRENT_SESSION_KEY)
        self.current_id: str | None = current if current and store.has_session(current) else None

    # -- the current session ----------------------------------------------------------

    def resolve(self, session_id: str | None) -> str:
        """``session_id``, else the current session's id; raises
        :class:`SessionNotFoundError` when neither is set."""
        sid = session_id or self.current_id
        if sid is None:
            raise SessionNotFoundError("no session selected: create or switch to one first")
        return sid

    def set_current(self, session_id: str | None) -> None:
        """Make ``session_id`` current (persisted; None: no current session)."""
        if session_id != self.current_id:
            self.current_id = session_id
            if session_id is None:
                self.store.delete_config(CURRENT_SESSION_KEY)
            else:
                self.store.set_config(CURRENT_SESSION_KEY, session_id)

    # -- sessions ---------------------------------------------------------------------

    def create(self, name: str = "New Chat", **kwargs: Any) -> SessionInfo:
        """A new session, made current, durable together (one journal append or one
        commit: a new agent's first turn makes its session this way)."""
        previous = self.current_id
        try:
            with self.store.batch():
                info = self.store.create_session(name, **kwargs)
                self.set_current(info.id)
        except BaseException:
            self.current_id = previous  # the batch dropped the new current id with the rest
            raise
        return info

    def switch(self, session_id: str) -> list[dict[str, Any]]:
        """Make an existing session current; returns its visible history."""
        self.store.get_session(session_id)  # not found is an error, never a create
        self.set_current(session_id)
        return self.store.get_history(session_id)

    def history(self, session_id: str, leaf_id: str | None = None) -> list[dict[str, Any]]:
        """The session's visible history; with ``leaf_id``, the branch that ends there
        as it read at that leaf (seed 000: an edit "creates a new branch without losing
        the old one"): every message from the root to the leaf, the ones a rewind or an
        edit hid since included, except those a compaction on that path summarized
        (its summary stands for them)."""
        if leaf_id is None:
            return self.store.get_history(session_id)
        return branch_view(self.store.get_path(session_id, leaf_id=leaf_id))

    def delete(self, session_id: str) -> None:
        """Delete a session; its run in flight is aborted, its writes discarded."""
        self.store.get_session(session_id)
        self.runner.invalidate(session_id, "session deleted")
        self.store.delete_session(session_id)
        self.runner.last_stream.pop(session_id, None)
        if self.current_id == session_id:
            self.set_current(None)

    def clear(self, session_id: str | None) -> None:
        """Clear a session's messages; its run in flight is aborted and its pending
        writes discarded (the clear-during-stream guard)."""
        sid = self.resolve(session_id)
        self.store.get_session(sid)
        self.runner.invalidate(sid, "session cleared")
        self.store.clear_messages(sid)
        self.runner.persist_cache.forget()

    # -- branch, threads, rewind ------------------------------------------------------

    def branch(
        self,
        parent_session_id: str,
        from_message_id: str,
        metadata: dict[str, Any] | None = None,
        *,
        name: str | None = None,
    ) -> SessionInfo:
        """Fork the parent's visible history up to ``from_message_id`` into a new
        session (not made current). Refused while the parent has a run in flight."""
        self.store.get_session(parent_session_id)  # unknown: not found, before busy
        self.runner.ensure_idle(parent_session_id)
        return self.store.branch_session(
            parent_session_id, from_message_id, metadata=metadata, name=name
        )

    def thread(self, key: str | None) -> SessionInfo:
        """Create or get the thread ``key`` (None: "default")."""
        return self.store.get_session(self.store.thread(key).id)

    def clone_thread(
        self, src_key: str, dst_key: str, from_message_id: str | None = None
    ) -> SessionInfo:
        """Copy a thread's visible history into a new thread. A clone is a branch: it
        cannot fork a running turn either."""
        self.runner.ensure_idle(self.store.get_thread(src_key).id)
        return self.store.get_session(self.store.clone_thread(src_key, dst_key, from_message_id).id)

    def delete_thread(self, key: str) -> None:
        """Delete a thread like a session (its run aborted, current reset)."""
        self.delete(self.store.get_thread(key).id)

    def rewind(
        self, session_id: str, user_message_id: str, *, include_target: bool = False
    ) -> RewindResult:
        """Soft-hide everything after a user message (and it, with ``include_target``)."""
        self.store.get_session(session_id)
        self.runner.ensure_idle(session_id)
        info = self.store.rewind_session(session_id, user_message_id, include_target=include_target)
        target = info.target.message
        metadata = target.get("metadata") or {}
        snapshot = metadata.get("snapshot_id") if isinstance(metadata, dict) else None
        return RewindResult(
            session_id=session_id,
            target=target,
            hidden_ids=info.hidden_ids,
            snapshot_id=snapshot if isinstance(snapshot, str) else None,
            head_id=info.head_id,
            previous_head_id=info.head_before,
            unhidden_ids=info.unhidden_ids,
            include_target=info.include_target,
        )

    def unrewind(self, session_id: str) -> UnrewindResult:
        """Undo the latest rewind of ``session_id``."""
        self.store.get_session(session_id)
        self.runner.ensure_idle(session_id)
        info = self.store.unrewind_session(session_id)
        return UnrewindResult(
            session_id=session_id,
            head_id=info.head_id,
            unhidden_ids=info.unhidden_ids,
            rehidden_ids=info.rehidden_ids,
            detached_ids=info.detached_ids,
        )


def resend_message(result: RewindResult, message: str | dict[str, Any] | None) -> Any:
    """The message ``Think.resend`` sends after rewinding with ``include_target``: the
    edited text or message, or a copy of the original under a new id (the original id
    is taken: appending it again would be an idempotent no-op). The target's metadata
    (model selection, snapshot id) carries over unless the new message has its own."""
    original = result.target
    if message is None:
        return {**{k: v for k, v in original.items() if k != "id"}, "id": new_id("msg")}
    if isinstance(message, str):
        return {
            "id": new_id("msg"),
            "role": "user",
            "metadata": original.get("metadata"),
            "parts": [{"type": "text", "text": message}],
        }
    return message


def branch_view(rows: list[MessageRow]) -> list[dict[str, Any]]:
    """The messages of a path (root first, hidden ones included: ``get_path``) as its
    leaf saw them: all of them but those summarized by a compaction on the path,
    which are the messages its ``data.covers`` names (a ``{first_id, last_id}`` range
    on the path, or a list of ids). Hidden-ness itself is not the test: what a rewind
    or an edit hid later is part of the branch, and a rewind past a compaction un-hides
    what it summarized although the branch beyond it still reads the summary."""
    position = {row.id: i for i, row in enumerate(rows)}
    summarized: set[int] = set()
    for row in rows:
        for part in row.message.get("parts", ()) if row.role == "assistant" else ():
            data = part.get("data") if part.get("type") == "data-compaction" else None
            covers = data.get("covers") if isinstance(data, dict) else None
            if isinstance(covers, dict):
                first = position.get(covers.get("first_id"))  # type: ignore[arg-type]
                last = position.get(covers.get("last_id"))  # type: ignore[arg-type]
                if first is not None and last is not None:
                    summarized.update(range(min(first, last), max(first, last) + 1))
            elif isinstance(covers, list):
                summarized.update(position[c] for c in covers if c in position)
    return [row.message for i, row in enumerate(rows) if i not in summarized]
