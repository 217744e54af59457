"""Attack: a credential in a WebSocket URL (issue 21, item 3). URLs end up in proxies'
and servers' logs and the browser's history, so the query string never carries a
bearer token; a browser opens its socket with a ticket from ``POST .../ws-ticket``
(an authenticated call). A ticket opens one agent of one principal, expires, and
cannot be turned into another agent, another class, or a forged principal."""

from __future__ import annotations

import base64
import json
import time

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.ingress_support import ALICE, BOB, ws_ticket, ws_url

pytestmark = pytest.mark.ray


@pytest.fixture
def start(ingress_apps):
    """``start(**overrides)``: the module's app for that configuration (the tests use
    agents of their own names)."""
    return ingress_apps


def status_of(url: str) -> int:
    """The upgrade's answer: 101 when it opens, else the refusal's status."""
    try:
        with connect(url, open_timeout=30) as ws:
            ws.recv(timeout=30)
            return 101
    except InvalidStatus as refused:
        return refused.response.status_code


def test_a_bearer_token_in_the_query_string_opens_nothing(start):
    with start() as base:
        assert status_of(ws_url(base, "chat", "alice-q", "?token=token-alice")) == 401
        r = httpx.get(f"{base}/agents/chat/alice-q/get-messages?token=token-alice", timeout=30)
        assert r.status_code == 401


def test_a_ticket_opens_one_agent_only(start):
    with start() as base:
        ticket = ws_ticket(base, "chat", "alice-t1", ALICE)
        assert status_of(ws_url(base, "chat", "alice-t1", f"?ticket={ticket}")) == 101
        assert status_of(ws_url(base, "chat", "alice-t2", f"?ticket={ticket}")) == 401
        assert status_of(ws_url(base, "other", "alice-t1", f"?ticket={ticket}")) == 401
        # Nor does it read another agent's messages.
        r = httpx.get(f"{base}/agents/chat/alice-t2/get-messages?ticket={ticket}", timeout=30)
        assert r.status_code == 401


def test_a_forged_ticket_is_refused(start):
    with start() as base:
        ticket = ws_ticket(base, "chat", "bob-1", BOB)
        payload, _, signature = ticket.partition(".")
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        claims["p"] = "alice"  # the same ticket, claiming to be Alice's
        forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
        assert status_of(ws_url(base, "chat", "bob-1", f"?ticket={forged}.{signature}")) == 401
        assert status_of(ws_url(base, "chat", "bob-1", "?ticket=garbage")) == 401


def test_no_ticket_for_another_principals_agent(start):
    with start() as base:
        httpx.post(f"{base}/agents/chat/alice-own/sessions", json={}, headers=ALICE, timeout=30)
        r = httpx.post(f"{base}/agents/chat/alice-own/ws-ticket", headers=BOB, timeout=30)
        assert r.status_code == 404
        assert httpx.post(f"{base}/agents/chat/alice-own/ws-ticket", timeout=30).status_code == 401


def test_a_ticket_expires(start):
    with start(ticket_ttl=1.0) as base:
        r = httpx.post(f"{base}/agents/chat/alice-exp/ws-ticket", headers=ALICE, timeout=30)
        ticket, expires = r.json()["ticket"], r.json()["expiresAt"]
        while time.time() <= expires:  # past its expiry, whatever the load
            time.sleep(0.2)
        assert status_of(ws_url(base, "chat", "alice-exp", f"?ticket={ticket}")) == 401
