"""Attack: a WebSocket opened on an agent name nobody owns yet listens in on its
future owner (issue 21, item 1). Bob connects to ``alice-future`` before Alice's first
message; Alice then claims it and chats over her own socket on the same replica (one
app: one replica). Bob must hear nothing of her chat: not the stored messages, not
the live chunks, not her clear; and his socket can neither clear nor chat on her agent.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from websockets.sync.client import connect

from tests.ingress_support import ALICE, BOB, ws_url
from tests.test_ingress_ws import (
    chat_request,
    chunks_of,
    get_messages,
    greeting,
    is_done,
    ping,
    read_until,
    recv,
)

pytestmark = pytest.mark.ray


@pytest.fixture
def base(ingress_apps):
    """The module's app (the tests use agents of their own names)."""
    with ingress_apps(agent_kwargs={"chunks": 20}) as url:
        yield url


def open_ws(base: str, name: str, headers: dict[str, str]) -> Any:
    return connect(ws_url(base, "chat", name), additional_headers=headers, open_timeout=30)


def test_a_socket_on_an_unclaimed_name_hears_nothing_of_the_future_owner(base):
    with open_ws(base, "alice-future", BOB) as bob, open_ws(base, "alice-future", ALICE) as alice:
        assert greeting(bob)[2] == {"type": "cf_agent_chat_messages", "messages": []}
        greeting(alice)
        alice.send(chat_request("req1", "my secret plans", "u1"))
        mine = read_until(alice, is_done("req1"))
        assert chunks_of(mine, "req1")  # Alice's own socket streams her run
        assert recv(alice)["type"] == "cf_agent_chat_messages"
        alice.send(json.dumps({"type": "cf_agent_chat_clear"}))
        # Frames are handled in order: once this answers, the clear was fanned out.
        assert ping(alice)["type"] == "cf_agent_stream_resume_none"

        # Anything fanned out to Bob would be queued before the answer to his probe.
        assert ping(bob) == {
            "type": "cf_agent_stream_resume_none",
            "reason": "idle",
            "probeId": "ping",
        }


def test_the_waiting_socket_cannot_clear_or_chat_on_the_owners_agent(base):
    with open_ws(base, "alice-later", BOB) as bob, open_ws(base, "alice-later", ALICE) as alice:
        greeting(bob)
        greeting(alice)
        alice.send(chat_request("req1", "mine", "u1"))
        read_until(alice, is_done("req1"))
        assert recv(alice)["type"] == "cf_agent_chat_messages"
        stored = get_messages(base, "alice-later")
        assert [m["role"] for m in stored] == ["user", "assistant"]

        bob.send(json.dumps({"type": "cf_agent_chat_clear"}))
        bob.send(chat_request("req2", "let me in", "u2"))
        refused = read_until(bob, is_done("req2"))
        assert refused[-1]["error"] is True
        assert "req2" not in json.dumps(get_messages(base, "alice-later"))
        assert ping(alice)["type"] == "cf_agent_stream_resume_none"  # no clear reached her
        assert get_messages(base, "alice-later") == stored  # nothing cleared, nothing added


def test_the_owners_second_socket_opened_early_does_hear_her_chat(base):
    """The fix keeps what a user expects: her own two tabs, both opened before the name
    was hers, share the run."""
    with open_ws(base, "alice-tabs", ALICE) as one, open_ws(base, "alice-tabs", ALICE) as two:
        greeting(one)
        greeting(two)
        one.send(chat_request("req1", "hi", "u1"))
        mine = read_until(one, is_done("req1"))
        theirs = read_until(two, is_done("req1"))
        assert theirs[1:] == mine
