"""Rows and errors shared by every store implementation.

Storage deals in plain JSON-compatible dicts for message content: a message is the
AI SDK UIMessage shape ``{"id", "role", "metadata", "parts": [...]}`` with camelCase
keys. ``runtime`` owns the typed models and validates at its boundary; storage only
reads ``type``, ``state`` and ``toolCallId`` of a part to fill its index columns.
This keeps ``storage`` free of ``runtime`` imports and the history path free of
per-message model validation (10,000 messages must load in ≤ 30 ms).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from thinkray.storage.errors import (
    InvalidInputError as InvalidInputError,
)
from thinkray.storage.errors import (
    MessageNotFoundError as MessageNotFoundError,
)
from thinkray.storage.errors import (
    NotFoundError as NotFoundError,
)
from thinkray.storage.errors import (
    NotOnPathError as NotOnPathError,
)
from thinkray.storage.errors import (
    SessionNotFoundError as SessionNotFoundError,
)
from thinkray.storage.errors import (  # re-exported: the errors live in thinkray.storage.errors
    StorageError as StorageError,
)
from thinkray.storage.errors import (
    ThreadExistsError as ThreadExistsError,
)
from thinkray.storage.errors import (
    ThreadNotFoundError as ThreadNotFoundError,
)

Message = dict[str, Any]
Part = dict[str, Any]

USAGE_KEYS = (
    "prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cache_read",
    "cache_write",
    "total_tokens",
)


def empty_rollup() -> dict[str, Any]:
    """A fresh usage rollup: every :data:`USAGE_KEYS` counter at 0, ``cost_usd`` None."""
    rollup: dict[str, Any] = dict.fromkeys(USAGE_KEYS, 0)
    rollup["cost_usd"] = None  # only set when a writer supplies a cost
    return rollup


@dataclass
class SessionInfo:
    """One row of ``sessions``. Threads (seed 001) and branches (seed 002) are sessions."""

    id: str
    name: str
    created_at: float
    updated_at: float
    parent_session_id: str | None = None
    parent_message_id: str | None = None
    thread_key: str | None = None
    head_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] | None = None
    permissions: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=empty_rollup)
    settings: dict[str, Any] = field(default_factory=dict)
    # What the next request carries, as the last model call reported it (see
    # context_window_used); None until a step reports usage or after set_usage.
    context_tokens: int | None = None

    @property
    def ephemeral(self) -> bool:
        """Whether ``metadata["ephemeral"]`` is set: such sessions are left out of
        ``list_sessions`` unless asked for."""
        return bool(self.metadata.get("ephemeral"))

    @property
    def context_window_used(self) -> int:
        """The tokens the session's next request will carry (seed 002: prompt +
        completion + reasoning + cache_read + cache_write, compared against the model's
        context window).

        Those are the last model call's counts (:attr:`context_tokens`, which
        ``add_usage`` sets from each step): the rollups in :attr:`usage` add up every
        step and so count each re-read of the conversation again, which is what was
        billed, not what the window holds. Rollups replaced with ``set_usage`` (a
        compaction, a branch) have no last call: then their sum is the number.
        """
        if self.context_tokens is not None:
            return self.context_tokens
        u = self.usage
        return int(
            u.get("prompt_tokens", 0)
            + u.get("completion_tokens", 0)
            + u.get("reasoning_tokens", 0)
            + u.get("cache_read", 0)
            + u.get("cache_write", 0)
        )

    def to_dict(self) -> dict[str, Any]:
        """Every field as a JSON-ready dict, plus ``context_window_used``."""
        return {
            "id": self.id,
            "name": self.name,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "parent_session_id": self.parent_session_id,
            "parent_message_id": self.parent_message_id,
            "thread_key": self.thread_key,
            "head_id": self.head_id,
            "metadata": self.metadata,
            "model": self.model,
            "permissions": self.permissions,
            "usage": self.usage,
            "settings": self.settings,
            "context_tokens": self.context_tokens,
            "context_window_used": self.context_window_used,
        }


@dataclass
class MessageRow:
    """A message with its tree position and visibility, for lifecycle operations."""

    id: str
    session_id: str
    parent_id: str | None
    role: str
    seq: int
    created_at: float
    hidden_at: float | None
    message: Message

    @property
    def hidden(self) -> bool:
        """Whether the message is soft-hidden (``hidden_at`` is set)."""
        return self.hidden_at is not None


@dataclass
class PartWrite:
    """One part of an in-flight message, by position. Upserted on ``(message_id, index)``."""

    message_id: str
    index: int
    part: Part


@dataclass
class ChunkWrite:
    """One UI stream chunk of a run (``generation_id``), in emit order. ``chunk`` is a
    JSON-ready dict (typed by the runtime as one of its chunk TypedDicts)."""

    generation_id: str
    index: int
    chunk: Mapping[str, Any]
    is_final: bool = False


@dataclass
class StreamFlush:
    """Everything a recorder accumulated since its last flush; written in one transaction.

    ``message`` is the in-flight message's envelope (``id``, ``role``, ``metadata``;
    ``parts`` ignored). It is inserted on first flush with ``parent_id`` (or the
    session head when ``parent_id`` is None and ``use_head`` is True) and its
    metadata updated on later ones. ``parts_length``, when set, drops parts at or
    beyond that index (a message can only shrink when a part was removed by
    sanitization).

    ``usage`` holds model steps' usage (what ``add_usage`` takes), added to the
    session's rollup in order, in the same transaction. ``prune_chunks``, when set,
    then deletes the chunk logs of all but the newest ``keep`` generations, never one
    named in ``active`` (runs still in flight): the end of a run writes its last
    parts, its usage and the pruning atomically.

    ``durable`` False marks a progress flush in the middle of a stream: the store may
    return before it is durable (written through to the OS, so a crash of the process
    keeps it; a power loss may lose it), and makes it durable with the next durable
    write, in order. Every flush that a consumer or a side effect waits on (the user
    message, a step's tool calls, the end of a run) is durable.
    """

    session_id: str
    message: Message | None = None
    parent_id: str | None = None
    use_head: bool = True
    parts: list[PartWrite] = field(default_factory=list)
    chunks: list[ChunkWrite] = field(default_factory=list)
    parts_length: int | None = None
    usage: list[dict[str, Any]] = field(default_factory=list)
    prune_chunks: ChunkPrune | None = None
    durable: bool = True


@dataclass
class ChunkPrune:
    """Keep the chunk logs of the newest ``keep`` generations (by first write) and of
    those in ``active``; delete the others (see :class:`StreamFlush`) — but only once
    there are more than ``keep + slack``, so that pruning costs a statement every
    ``slack + 1`` runs rather than every run."""

    keep: int
    active: list[str] = field(default_factory=list)
    slack: int = 0


# -- threads, branches, rewind (seeds 001 and 002) -----------------------------------

THREAD_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
"""A thread key is a safe identifier: it can go into a file name, a URL or a log line."""

DEFAULT_THREAD_KEY = "default"
"""The thread ``store.thread()`` (no key) names. Sessions created without a key (every
caller of the session-id API) are not threads and are untouched by the thread API."""

DEFAULT_SETTINGS_KEY = "sessions.default_settings"
"""Config key of the store-wide default session settings (e.g. ``{"compaction": {...}}``)
that a thread's or session's own ``settings`` override (see ``get_effective_settings``)."""


@dataclass
class RewindInfo:
    """What :meth:`~thinkray.storage.protocols.SessionStore.rewind_session` did.

    ``hidden_ids`` were soft-hidden by this rewind (in path order); ``unhidden_ids``
    were summarized by a compaction the rewind moved back over, and are visible again.
    ``head_before``/``head_id`` are the head before and after; hidden rows stay
    inspectable through ``get_path(session_id, leaf_id=head_before)``.
    """

    session_id: str
    target: MessageRow
    hidden_ids: list[str]
    unhidden_ids: list[str]
    head_before: str | None
    head_id: str | None
    hidden_at: float
    include_target: bool = False


@dataclass
class UnrewindInfo:
    """What :meth:`~thinkray.storage.protocols.SessionStore.unrewind_session` did.

    ``unhidden_ids`` were hidden by the rewind and are visible again;
    ``rehidden_ids`` had been un-hidden from a compaction's summary and are hidden
    again; ``detached_ids`` are messages appended after the rewind: they stay, intact
    and visible, on their own branch of the tree (reachable through ``children`` and
    ``get_history(leaf_id=...)``), but are no longer on the current path.
    """

    session_id: str
    head_id: str | None
    unhidden_ids: list[str]
    rehidden_ids: list[str]
    detached_ids: list[str]


@dataclass
class SearchHit:
    """One message found by :meth:`~thinkray.storage.protocols.SessionStore.search_messages`.

    ``score`` is its BM25 score (higher is better; comparable within one search only);
    ``snippet`` about 160 characters of the matching text part (``part_index``), with
    ``…`` where it was cut, and ``highlights`` the ``[start, end)`` offsets of the
    query's words in it; ``created_at`` when the message was stored (epoch seconds)."""

    session_id: str
    message_id: str
    role: str
    score: float
    snippet: str
    highlights: list[list[int]]
    part_index: int
    created_at: float
