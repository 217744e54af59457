"""Short-lived WebSocket tickets: a browser's WebSocket API cannot set headers, so a
page (or the ``agents`` client's ``query``) first asks ``POST
/agents/{agent}/{name}/ws-ticket`` with its real credential, then opens the socket
with ``?ticket=...``. A ticket names one principal and one agent, expires after
``ticket_ttl`` seconds and is signed (HMAC-SHA256) with a key every replica of the
application shares, so any replica accepts a ticket another issued; a bearer token
never travels in a URL (where proxies and access logs keep it)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time

from thinkray.actors.ingress.auth import Principal

TICKET_KEY_ENV = "THINKRAY_TICKET_KEY"
"""Names the environment variable with a key to sign tickets with (at least 32
characters), for deployments whose replicas are started apart; by default the
application generates one when it is built and its replicas share it."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def new_key() -> bytes:
    """A fresh signing key."""
    return secrets.token_bytes(32)


class Tickets:
    """Issues and checks tickets signed with ``key``."""

    def __init__(self, key: bytes, ttl: float) -> None:
        if len(key) < 16:
            raise ValueError("a ticket key needs at least 16 bytes")
        self._key, self.ttl = key, ttl

    def _sign(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode(), hashlib.sha256).digest())

    def issue(self, principal: Principal, slug: str, name: str) -> tuple[str, float]:
        """A ticket for ``principal`` to open agent ``slug``/``name``; and when it expires
        (epoch seconds)."""
        expires = time.time() + self.ttl
        claims = {"p": principal.id, "a": slug, "n": name, "e": expires, "r": _b64(new_key())}
        payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
        return f"{payload}.{self._sign(payload)}", expires

    def check(self, ticket: str, slug: str, name: str) -> Principal | None:
        """The principal of a valid, unexpired ticket for exactly ``slug``/``name``;
        None for anything else (forged, expired, for another agent, malformed)."""
        payload, dot, signature = ticket.partition(".")
        if not dot or not hmac.compare_digest(self._sign(payload), signature):
            return None
        try:
            claims = json.loads(_unb64(payload))
            principal, scope = str(claims["p"]), (claims["a"], claims["n"])
            expires = float(claims["e"])
        except (ValueError, KeyError, TypeError):
            return None
        if scope != (slug, name) or time.time() >= expires:
            return None
        return Principal(principal)
