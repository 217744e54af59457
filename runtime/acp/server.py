"""The Agent Client Protocol's agent side for a thinkray agent (seed 002, "ACP
integration — the outward wire").

:class:`AcpServer` implements the official SDK's ``acp.Agent`` methods over an
:class:`AgentPort` (what it needs of an agent: sessions, history, a turn's chunk stream,
abort, approvals). :class:`LocalAgentPort` is the port of a ``Think`` in this process
(no Ray). The mapping, as seed 002 fixes it:

- the ACP session id IS the thinkray session id; ``session/new`` creates one
  (``metadata.acp.cwd`` keeps the editor's folder);
- ``session/load`` replays the session's stored history as ``session/update``
  notifications, from the database, so it works in a process started after the one
  that wrote it; ``session/resume`` rejoins without replay; ``session/close`` aborts a
  turn in flight and forgets the session on this connection (its data stays);
- ``session/prompt`` runs one turn and streams it (text, reasoning, tool calls with
  their status); ``session/cancel`` aborts it: the partial answer is kept, as on every
  path, and the prompt answers ``cancelled``;
- a tool call that needs approval becomes ``session/request_permission``; the answer
  is recorded through ``answer_approval``, the same durable approval (audit row with
  who answered) the HTTP and WebSocket paths record, answered by this server's
  principal.

Only sessions opened on this connection (new, load or resume) take prompts: a client
that reconnects after a restart says which it wants, with or without the replay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, Protocol

from acp import PROTOCOL_VERSION, RequestError
from acp.schema import (
    AgentCapabilities,
    CloseSessionResponse,
    Implementation,
    InitializeResponse,
    ListSessionsResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PromptCapabilities,
    PromptResponse,
    ResumeSessionResponse,
    SessionCapabilities,
    SessionCloseCapabilities,
    SessionListCapabilities,
    SessionResumeCapabilities,
    ToolCallProgress,
    ToolKind,
)
from acp.schema import SessionInfo as AcpSessionInfo
from thinkray.runtime.acp.mapping import (
    PERMISSION_OPTIONS,
    PromptContentError,
    SessionUpdate,
    TurnTranslator,
    decision_of,
    history_updates,
    stop_reason,
    tool_content,
    user_message,
)
from thinkray.runtime.chunks import UIChunk
from thinkray.runtime.errors import (
    AccessDeniedError,
    ApprovalNotFoundError,
    SessionBusyError,
    UserError,
)
from thinkray.storage.errors import SessionNotFoundError
from thinkray.storage.types import SessionInfo

log = logging.getLogger("thinkray.acp")

__all__ = ["AcpServer", "AgentPort", "LocalAgentPort"]

SESSION_NOT_FOUND = -32002  # ACP's "Resource not found"


class AgentPort(Protocol):
    """What the ACP server needs of an agent. Every method may raise the agent's own
    errors (:class:`SessionNotFoundError`, :class:`SessionBusyError`, ``UserError``):
    the server turns them into JSON-RPC errors."""

    async def create_session(self, name: str, metadata: dict[str, Any]) -> SessionInfo:
        """A new session."""
        ...

    async def get_session(self, session_id: str) -> SessionInfo:
        """One session (SessionNotFoundError if unknown)."""
        ...

    async def list_sessions(self) -> list[SessionInfo]:
        """Every session, most recently updated first."""
        ...

    async def history(self, session_id: str) -> list[dict[str, Any]]:
        """The session's visible history, oldest first."""
        ...

    def turn(self, session_id: str, message: dict[str, Any]) -> AsyncIterator[UIChunk]:
        """Run one turn; its chunks from ``start`` to ``finish`` | ``abort`` |
        ``error``. Raises before the first chunk for a busy or unknown session or an
        invalid message. Leaving early detaches (the turn goes on)."""
        ...

    async def abort(self, session_id: str) -> bool:
        """Abort the session's turn in flight (False: none)."""
        ...

    async def answer_approval(
        self, approval_id: str, decision: str, answered_by: str | None
    ) -> dict[str, Any]:
        """Answer an ask (``Agent.answer_approval``)."""
        ...

    def tool_kinds(self) -> dict[str, ToolKind]:
        """ACP ``ToolKind`` per tool name (the agent's ``acp_tool_kinds``)."""
        ...


class LocalAgentPort:
    """The port of an agent in this process (a ``Think``; approvals need an ``Agent``)."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent

    async def create_session(self, name: str, metadata: dict[str, Any]) -> SessionInfo:
        """A new session (made current, as ``Think.create_session`` does)."""
        info: SessionInfo = self.agent.create_session(name, metadata=metadata)
        return info

    async def get_session(self, session_id: str) -> SessionInfo:
        """One session."""
        info: SessionInfo = self.agent.store.get_session(session_id)
        return info

    async def list_sessions(self) -> list[SessionInfo]:
        """Every session."""
        return list(self.agent.get_sessions())

    async def history(self, session_id: str) -> list[dict[str, Any]]:
        """The visible history."""
        return list(self.agent.get_history(session_id))

    async def turn(self, session_id: str, message: dict[str, Any]) -> AsyncIterator[UIChunk]:
        """``Think.stream_chat``."""
        async for chunk in self.agent.stream_chat(message, session_id=session_id):
            yield chunk

    async def abort(self, session_id: str) -> bool:
        """``Think.abort``."""
        return bool(self.agent.abort(session_id, reason="cancelled by the ACP client"))

    async def answer_approval(
        self, approval_id: str, decision: str, answered_by: str | None
    ) -> dict[str, Any]:
        """``Agent.answer_approval`` (ApprovalNotFoundError for an agent without)."""
        answer = getattr(self.agent, "answer_approval", None)
        if answer is None:
            raise ApprovalNotFoundError(f"{type(self.agent).__name__} has no tool approvals")
        result: dict[str, Any] = answer(approval_id, decision, answered_by)
        return result

    def tool_kinds(self) -> dict[str, ToolKind]:
        """The agent class's ``acp_tool_kinds`` (tool name -> ACP kind), if any."""
        return dict(getattr(self.agent, "acp_tool_kinds", None) or {})


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


class AcpServer:
    """The ACP agent: pass it to the SDK's ``AgentSideConnection`` (``use_unstable_protocol``
    on: the Python SDK still files ``session/resume`` and ``session/close`` there).

    ``principal`` is who answers the approvals asked on this connection (recorded in
    each approval's ``answered_by``): the person at the editor that started the process.
    """

    def __init__(self, port: AgentPort, *, principal: str | None, version: str = "0") -> None:
        self.port = port
        self.principal = principal
        self.version = version
        self.client: Any = None  # the SDK's connection to the client (on_connect)
        self.open: set[str] = set()  # sessions opened on this connection
        self._cancelled: set[str] = set()  # sessions whose turn the client cancelled

    def on_connect(self, conn: Any) -> None:
        """The SDK hands over the client side of the connection."""
        self.client = conn

    # -- set-up ------------------------------------------------------------------------

    async def initialize(
        self,
        protocol_version: int,
        client_capabilities: Any = None,
        client_info: Any = None,
        **kwargs: Any,
    ) -> InitializeResponse:
        """Our capabilities: load, resume, close and list sessions; text prompts with
        resource links and embedded text resources."""
        return InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(
                load_session=True,
                prompt_capabilities=PromptCapabilities(embedded_context=True),
                session_capabilities=SessionCapabilities(
                    resume=SessionResumeCapabilities(),
                    close=SessionCloseCapabilities(),
                    list=SessionListCapabilities(),
                ),
            ),
            agent_info=Implementation(name="thinkray", version=self.version),
        )

    async def authenticate(self, method_id: str, **kwargs: Any) -> None:
        """No authentication: whoever started the process is the user."""
        return None

    # -- sessions ------------------------------------------------------------------------

    async def new_session(
        self, cwd: str, mcp_servers: Any = None, **kwargs: Any
    ) -> NewSessionResponse:
        """Create a thinkray session; its id is the ACP session id."""
        name = f"ACP: {os.path.basename(cwd.rstrip('/')) or cwd}"
        info = await self._call(self.port.create_session(name, {"acp": {"cwd": cwd}}))
        self.open.add(info.id)
        return NewSessionResponse(session_id=info.id)

    async def load_session(
        self, cwd: str, session_id: str, mcp_servers: Any = None, **kwargs: Any
    ) -> LoadSessionResponse:
        """Replay every stored message of the session, then answer."""
        await self._known(session_id)
        messages = await self._call(self.port.history(session_id))
        for update in history_updates(messages, self.port.tool_kinds()):
            await self._send(session_id, update)
        self.open.add(session_id)
        return LoadSessionResponse()

    async def resume_session(
        self, cwd: str, session_id: str, **kwargs: Any
    ) -> ResumeSessionResponse:
        """Rejoin a stored session without replaying it."""
        await self._known(session_id)
        self.open.add(session_id)
        return ResumeSessionResponse()

    async def close_session(self, session_id: str, **kwargs: Any) -> CloseSessionResponse:
        """Cancel the session's turn in flight (as ``session/cancel``) and forget the
        session on this connection; its stored data stays (load or resume reopen it)."""
        self._opened(session_id)
        await self._call(self.port.abort(session_id))
        self.open.discard(session_id)
        return CloseSessionResponse()

    async def list_sessions(
        self, cwd: str | None = None, cursor: str | None = None, **kwargs: Any
    ) -> ListSessionsResponse:
        """The agent's sessions (those started from ``cwd`` when given), newest first."""
        out = []
        for info in await self._call(self.port.list_sessions()):
            where = (info.metadata.get("acp") or {}).get("cwd") if info.metadata else None
            if cwd is not None and where != cwd:
                continue
            out.append(
                AcpSessionInfo(
                    session_id=info.id,
                    cwd=str(where or "/"),
                    title=info.name,
                    updated_at=_iso(info.updated_at),
                )
            )
        return ListSessionsResponse(sessions=out)

    # -- the turn ----------------------------------------------------------------------------

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        """Run one turn, streaming it as ``session/update``; asks become
        ``session/request_permission``. Answers with the stop reason, or a JSON-RPC
        error for a turn that failed (its partial answer is stored)."""
        self._opened(session_id)
        try:
            message = user_message(prompt)
        except PromptContentError as exc:
            raise RequestError.invalid_params({"details": str(exc)}) from exc
        turn = TurnTranslator(self.port.tool_kinds())
        last: dict[str, Any] | None = None
        asks: set[asyncio.Task[None]] = set()
        self._cancelled.discard(session_id)
        try:
            async for chunk in self._chunks(session_id, message):
                last = dict(chunk)
                for update in turn.updates(last):
                    await self._send(session_id, update)
                if last["type"] == "tool-approval-request":
                    task = asyncio.ensure_future(self._ask(session_id, last, turn))
                    asks.add(task)
                    task.add_done_callback(asks.discard)
        finally:
            for task in list(asks):
                task.cancel()  # the turn is over: an unanswered ask no longer matters
        end = last or {}
        if session_id in self._cancelled and end.get("type") != "finish":
            # ACP: a cancelled turn answers "cancelled", whatever the cancel broke.
            return PromptResponse(stop_reason="cancelled")
        if end.get("type") == "error":
            raise RequestError.internal_error(
                {"details": end.get("errorText"), "partial": "the partial answer is stored"}
            )
        return PromptResponse(stop_reason=stop_reason(last))

    async def _chunks(self, session_id: str, message: dict[str, Any]) -> AsyncIterator[UIChunk]:
        stream = self.port.turn(session_id, message)
        try:
            first = await anext(stream)
        except StopAsyncIteration:
            return
        except Exception as exc:
            raise _request_error(exc) from exc
        yield first
        async for chunk in stream:
            yield chunk

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        """Abort the session's turn in flight; its ``session/prompt`` answers
        ``cancelled``."""
        self._cancelled.add(session_id)
        with contextlib.suppress(Exception):
            await self.port.abort(session_id)

    async def _ask(self, session_id: str, chunk: dict[str, Any], turn: TurnTranslator) -> None:
        """One ask: the editor's answer, recorded as the approval's decision."""
        call_id, approval_id = chunk["toolCallId"], chunk["approvalId"]
        try:
            answer = await self.client.request_permission(
                session_id=session_id,
                tool_call=turn.permission_call(call_id),
                options=PERMISSION_OPTIONS,
            )
            outcome = answer.outcome
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # no usable answer: refuse, never run unapproved
            log.warning("permission request for %s failed (%s): denying it", call_id, exc)
            outcome = None
        if outcome is not None and outcome.outcome == "cancelled":
            # ACP: a client answers "cancelled" when it cancels the turn.
            await self.cancel(session_id)
            return
        decision = decision_of(getattr(outcome, "option_id", None))
        if decision != "deny":
            # Before the answer: the tool cannot finish (and be shown completed)
            # before its approval is recorded, so this never overtakes the result.
            await self._send(session_id, _progress(call_id, status="in_progress"))
        try:
            await self.port.answer_approval(approval_id, decision, self.principal)
        except ApprovalNotFoundError as exc:  # decided meanwhile, expired, aborted
            log.info("approval %s not recorded: %s", approval_id, exc)
        except AccessDeniedError as exc:  # the agent's may_approve said no
            await self._send(session_id, _progress(call_id, status="pending", note=str(exc)))
        except Exception:  # the ask stays pending: its timeout ends it
            log.exception("could not record the answer to approval %s", approval_id)

    # -- helpers ----------------------------------------------------------------------------

    async def _send(self, session_id: str, update: SessionUpdate) -> None:
        await self.client.session_update(session_id=session_id, update=update)

    async def _known(self, session_id: str) -> SessionInfo:
        return await self._call(self.port.get_session(session_id))

    def _opened(self, session_id: str) -> None:
        if session_id not in self.open:
            raise RequestError(
                SESSION_NOT_FOUND,
                "Resource not found",
                {
                    "sessionId": session_id,
                    "details": "no such session open on this connection: session/new, "
                    "session/load or session/resume first",
                },
            )

    async def _call(self, awaitable: Any) -> Any:
        try:
            return await awaitable
        except RequestError:
            raise
        except Exception as exc:
            raise _request_error(exc) from exc


def _progress(call_id: str, status: Any, note: str | None = None) -> ToolCallProgress:
    return ToolCallProgress(
        session_update="tool_call_update",
        tool_call_id=call_id,
        status=status,
        content=tool_content(note) if note else None,
    )


def _request_error(exc: Exception) -> Exception:
    """The JSON-RPC error for an agent's error: unknown session -32002, busy session or
    a caller's mistake -32602 (invalid params) with the agent's message; anything else
    stays as is (the SDK answers it -32603)."""
    if isinstance(exc, SessionNotFoundError):
        return RequestError(SESSION_NOT_FOUND, "Resource not found", {"details": str(exc)})
    if isinstance(exc, SessionBusyError):
        return RequestError.invalid_request({"details": str(exc)})
    if isinstance(exc, UserError):
        return RequestError.invalid_params({"details": str(exc), "error": type(exc).__name__})
    return exc
