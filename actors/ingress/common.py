"""What the HTTP routes and the WebSocket protocol share: errors and their answers,
JSON helpers, the validation of a chat turn's body (before anything is written), and
the regenerate rewind. A module of its own so ``routes`` and ``ws`` import it rather
than each other."""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from thinkray.actors.ingress.agents import NotVisibleError
from thinkray.runtime.agents.midturn import BUSY_POLICIES
from thinkray.runtime.errors import (
    AccessDeniedError,
    ApprovalNotFoundError,
    MessageIdConflictError,
    SessionBusyError,
)
from thinkray.runtime.messages import parse_message
from thinkray.storage.errors import NotFoundError, UserError
from thinkray.storage.types import InvalidInputError

log = logging.getLogger("thinkray.ingress")

TRIGGERS = ("submit-message", "regenerate-message")


class HTTPError(Exception):
    """An answer with a status and a message (``{"error": {"type", "message"}}``)."""

    def __init__(self, status: int, message: str, kind: str = "bad_request") -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


def error_status(exc: BaseException) -> tuple[int, str]:
    """The HTTP status and error type of an exception a call raised. Only thinkray's
    own typed errors are the caller's fault (4xx); a bare ``ValueError`` from some
    library is an internal error whose text is not the caller's to read."""
    if isinstance(exc, HTTPError):
        return exc.status, exc.kind
    if isinstance(exc, NotVisibleError | NotFoundError | ApprovalNotFoundError):
        return 404, "not_found"
    if isinstance(exc, AccessDeniedError):
        return 403, "forbidden"
    if isinstance(exc, SessionBusyError):
        return 409, "busy"
    if isinstance(exc, MessageIdConflictError):
        return 409, "message_id_conflict"
    if isinstance(exc, UserError | InvalidInputError):
        return 400, type(exc).__name__
    return 500, "internal"


def shown_error(exc: BaseException) -> BaseException:
    """The error to describe: an actor's error arrives wrapped (a ``RayTaskError``
    subclass whose text is the remote traceback); its ``cause`` is the original."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, Exception) else exc


def error_message(exc: BaseException) -> tuple[int, str, str]:
    """``(status, type, message)`` a client is told; internal errors are logged with
    their traceback and answered by their class name only."""
    shown = shown_error(exc)
    status, kind = error_status(shown)
    if status >= 500:
        log.error("ingress request failed", exc_info=exc)
        return status, kind, f"internal error ({type(shown).__name__})"
    return status, kind, str(shown)


def error_response(exc: BaseException) -> JSONResponse:
    """The JSON error answer for ``exc``."""
    status, kind, message = error_message(exc)
    response = JSONResponse({"error": {"type": kind, "message": message}}, status_code=status)
    if status == 401:
        response.headers["www-authenticate"] = "Bearer"
    return response


def error_text(exc: BaseException) -> str:
    """What a WebSocket client is told about a refused request."""
    return error_message(exc)[2]


def jsonable(value: Any) -> Any:
    """Session infos and results (dataclasses, pydantic models) as JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if hasattr(value, "model_dump"):
        return jsonable(value.model_dump())
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


async def read_json(request: Request, limit: int) -> Any:
    """The request body as JSON, at most ``limit`` bytes (413 beyond, 400 if not
    JSON)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPError(413, f"body over {limit} bytes", "too_large")
    body = bytearray()
    async for part in request.stream():
        body.extend(part)
        if len(body) > limit:
            raise HTTPError(413, f"body over {limit} bytes", "too_large")
    try:
        return loads_bounded(body or b"null")
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise HTTPError(400, f"malformed JSON: {exc}", "malformed_json") from exc


MAX_JSON_DEPTH = 64
"""How deeply a request's JSON may nest: far beyond any UI message, and shallow enough
that nothing downstream (validation, msgpack, the store) recurses near Python's limit."""


def loads_bounded(data: str | bytes | bytearray) -> Any:
    """``json.loads``, refusing JSON nested deeper than :data:`MAX_JSON_DEPTH` with a
    ``ValueError`` (a body of ``[`` x 100,000 makes the parser itself recurse too deep)."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:  # iterative: the check itself must not recurse
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return value


def need_dict(value: Any, what: str = "body") -> dict[str, Any]:
    """``value`` if it is a JSON object, else a 400."""
    if not isinstance(value, dict):
        raise HTTPError(400, f"the {what} must be a JSON object")
    return value


def need_id(value: Any, what: str = "chat id") -> str:
    """A chat or session id from a body or a path: 1-256 printable characters."""
    if not isinstance(value, str) or not 0 < len(value) <= 256 or not value.isprintable():
        raise HTTPError(400, f"invalid {what} {str(value)[:80]!r}: use 1-256 printable characters")
    return value


def need_str(body: dict[str, Any], key: str, optional: bool = False) -> Any:
    """``body[key]`` as a non-empty string (None if absent and ``optional``), else a 400."""
    value = body.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise HTTPError(400, f"{key!r} must be a non-empty string")
    return value


@dataclass(frozen=True)
class Turn:
    """A chat request's body, validated: the user message to submit (None for a
    regenerate) and the assistant message a regenerate answers again."""

    message: dict[str, Any] | None
    regenerate_id: str | None = None
    # The body's ``onBusy``: what the message does if its session is busy (None: the
    # agent's policy; see thinkray.runtime.agents.midturn).
    on_busy: str | None = None

    @property
    def claims(self) -> bool:
        """Only a submit may create the agent; a regenerate needs one already."""
        return self.message is not None


def parse_turn(body: dict[str, Any]) -> Turn:
    """Validate a chat body (``messages``, ``trigger``, ``messageId``) completely, so a
    refused request writes nothing: no owner claimed, no session created."""
    messages = body.get("messages")
    trigger = body.get("trigger", "submit-message")
    on_busy = body.get("onBusy")
    if on_busy is not None and on_busy not in BUSY_POLICIES:
        raise HTTPError(
            400, f"'onBusy' must be one of {', '.join(BUSY_POLICIES)}", "invalid_busy_policy"
        )
    if not isinstance(messages, list):
        raise HTTPError(400, "'messages' must be a list of UI messages")
    if trigger not in TRIGGERS:
        raise HTTPError(400, f"unknown trigger {str(trigger)[:80]!r}")
    if trigger == "regenerate-message":
        message_id = body.get("messageId")
        if message_id is not None and not isinstance(message_id, str):
            raise HTTPError(400, "'messageId' must be a string")
        return Turn(None, message_id, on_busy)
    if not messages or not isinstance(messages[-1], dict):
        raise HTTPError(400, "submit-message needs the new message last in 'messages'")
    message = messages[-1]
    if message.get("role") != "user":
        raise HTTPError(400, "the message to submit must have role 'user'")
    parse_message(message)  # InvalidMessageError (400) before any write
    return Turn(message, on_busy=on_busy)


async def start_turn(handle: Any, chat_id: str, turn: Turn) -> Any:
    """``turn``'s stream on session ``chat_id``, started (the actor's checks raise here,
    before any byte). The AI SDK's chat id names the session: a chat's first message
    finds none (the actor writes nothing then) and creates it. So a turn costs the
    actor one call, not a lookup first."""

    def send() -> Any:
        return handle.stream_chat.remote(turn.message, session_id=chat_id, on_busy=turn.on_busy)

    stream = send()
    try:
        await stream.start()
    except NotFoundError:
        if turn.message is None:  # a regenerate needs the chat's history: none here
            raise
        await create_chat_session(handle, chat_id)
        stream = send()
        await stream.start()
    return stream


async def create_chat_session(handle: Any, chat_id: str) -> None:
    """Create session ``chat_id`` (created meanwhile by another request: fine)."""
    try:
        await handle.create_session.remote("New Chat", session_id=chat_id)
    except UserError:
        await handle.get_session.remote(chat_id)


def regenerate_target(history: list[dict[str, Any]], message_id: str | None) -> str:
    """The id of the user message a regenerate answers again: the one before the
    assistant message ``message_id`` (default: the last assistant message)."""
    index = None
    for i, message in enumerate(history):
        wanted = message.get("role") == "assistant" if message_id is None else None
        if wanted or (message_id is not None and message.get("id") == message_id):
            index = i
    if index is None:
        raise HTTPError(404, f"no message {message_id!r} to regenerate", "not_found")
    users = [m for m in history[: index + 1] if m.get("role") == "user"]
    if not users:
        raise HTTPError(400, "nothing to regenerate: no user message before it")
    return str(users[-1]["id"])


async def rewind_for_regenerate(handle: Any, chat_id: str, message_id: Any) -> None:
    """``regenerate-message``: hide the assistant message (``messageId``, default the
    last one) and what follows, so the next turn answers its user message again."""
    if message_id is not None and not isinstance(message_id, str):
        raise HTTPError(400, "'messageId' must be a string")
    history = await handle.get_history.remote(chat_id)
    await handle.rewind.remote(chat_id, regenerate_target(history, message_id))
