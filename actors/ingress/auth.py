"""Who is calling: a pluggable :class:`Authenticator` applied to every HTTP request
and to the WebSocket upgrade. The default maps bearer tokens from the configuration
to principals; a deployment plugs in its own (JWT, session cookies, an API gateway's
header) with ``IngressConfig.authenticator``."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from starlette.requests import HTTPConnection


@dataclass(frozen=True)
class Principal:
    """An authenticated caller. Every agent name belongs to one principal (``id``)."""

    id: str


@runtime_checkable
class Authenticator(Protocol):
    """Decides who a request is.

    Contract: return the :class:`Principal` for a valid credential and None for a
    missing or invalid one (the ingress answers 401 and writes nothing). Called once
    per HTTP request and once per WebSocket upgrade, before anything is read or
    written; it must not block the event loop for long (it may be async)."""

    async def authenticate(self, conn: HTTPConnection) -> Principal | None:
        """The caller of ``conn`` (an HTTP request or a WebSocket upgrade), or None."""
        ...


def bearer_token(conn: HTTPConnection) -> str | None:
    """The request's ``Authorization: Bearer`` token. Never one from the query string
    (URLs end up in proxies' and servers' logs): a browser's WebSocket, which cannot set
    headers, opens with a short-lived ticket instead (:mod:`.tickets`)."""
    header = conn.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return None


class BearerTokens:
    """The default authenticator: a fixed map of tokens to principals."""

    def __init__(self, tokens: dict[str, str]) -> None:
        self._tokens = dict(tokens)

    async def authenticate(self, conn: HTTPConnection) -> Principal | None:
        """The principal of the request's bearer token, or None."""
        token = bearer_token(conn)
        if token is None:
            return None
        for known, principal in self._tokens.items():
            # Constant-time comparison: a token is not guessable byte by byte.
            if hmac.compare_digest(known.encode(), token.encode()):
                return Principal(principal)
        return None
