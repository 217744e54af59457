"""Synced agent state at the ingress (issue 25, part 3), with the ``websockets`` client
and httpx against the app on a loopback port in front of real session actors: the
state first on connect, ``cf_agent_state`` frames to every other client of the agent
(not echoed to a sender whose state was stored as sent), ``cf_agent_state_error`` to
the sender only, changes made inside the agent's actor reaching the sockets and the
SSE stream, the state after a hibernation, and the HTTP routes."""

from __future__ import annotations

import pytest

from tests.ingress_support import ALICE
from tests.state_support import (
    STATE,
    STATE_ERROR,
    StateStream,
    board,
    get_state,
    greet,
    handle_of,
    hibernated_state_server,
    namespace_of,
    next_state,
    open_ws,
    ping,
    put_state,
    recv_types,
    send_state,
    shared_state_server,
)

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def _state_app(ray_local, tmp_path_factory):
    yield from shared_state_server(tmp_path_factory)


@pytest.fixture
def server(_state_app):
    yield from hibernated_state_server(_state_app)


def test_a_client_gets_the_state_first(server):
    base, _ = server
    with open_ws(base, "alice-s1", ALICE) as ws:
        identity, state, mcp, messages = greet(ws)
    # As the agents package does: the identity says a state follows, then the state.
    assert identity == {
        "type": "cf_agent_identity",
        "name": "alice-s1",
        "agent": "chat",
        "stateFollows": True,
    }
    assert state == {"type": STATE, "state": board(title="new board")}  # the initial state
    assert mcp["type"] == "cf_agent_mcp_servers"
    assert messages == {"type": "cf_agent_chat_messages", "messages": []}

    assert put_state(base, "alice-s1", {"state": board(5)}, ALICE).json() == {
        "state": board(5),
        "version": 1,
    }
    with open_ws(base, "alice-s1", ALICE) as ws:
        assert greet(ws)[1] == {"type": STATE, "state": board(5)}


def test_a_socket_waiting_on_a_name_hears_its_owners_http_change(server):
    base, _ = server
    with open_ws(base, "alice-s7", ALICE) as ws:
        assert greet(ws)[1] == {"type": STATE, "state": board(title="new board")}
        # The PUT claims the name for Alice: her socket, which waited on it, joins.
        assert put_state(base, "alice-s7", {"state": board(1)}, ALICE).status_code == 200
        assert next_state(ws) == {"type": STATE, "state": board(1)}


def test_a_class_without_state_sends_none_and_refuses_client_state(server):
    base, _ = server
    with open_ws(base, "alice-plain", ALICE, slug="plain") as ws:
        assert recv_types(ws, 3) == [
            "cf_agent_identity",
            "cf_agent_mcp_servers",
            "cf_agent_chat_messages",
        ]
        send_state(ws, {"count": 1})
        error = next_state(ws)
    assert error["type"] == STATE_ERROR and "has no synced state" in error["error"]
    assert get_state(base, "alice-plain", ALICE, slug="plain").status_code == 404


def test_two_clients_see_each_others_changes(server):
    base, _ = server
    put_state(base, "alice-s2", {"state": board(1)}, ALICE)  # Alice's agent now
    with open_ws(base, "alice-s2", ALICE) as a, open_ws(base, "alice-s2", ALICE) as b:
        assert greet(a)[1]["state"] == greet(b)[1]["state"] == board(1)

        send_state(a, board(2, "from a"))  # stored as sent: a is not told again
        assert next_state(b) == {"type": STATE, "state": board(2, "from a")}

        send_state(b, {"count": "3", "items": ["x"]})  # coerced and completed by the model
        assert next_state(a) == {"type": STATE, "state": board(3, "", ["x"])}
        # b sent something else than what was stored: it hears the stored state.
        assert next_state(b) == {"type": STATE, "state": board(3, "", ["x"])}

        # A change through HTTP: the next frame each socket gets is that one (so a
        # heard nothing of its own change before it).
        put_state(base, "alice-s2", {"state": board(4)}, ALICE)
        assert next_state(a) == next_state(b) == {"type": STATE, "state": board(4)}
    assert get_state(base, "alice-s2", ALICE).json() == {"state": board(4), "version": 4}


def test_invalid_state_goes_back_to_the_sender_only(server):
    base, _ = server
    put_state(base, "alice-s3", {"state": board(1)}, ALICE)
    with open_ws(base, "alice-s3", ALICE) as a, open_ws(base, "alice-s3", ALICE) as b:
        greet(a)
        greet(b)
        send_state(a, {"count": "many"})
        error = next_state(a)
        assert error["type"] == STATE_ERROR
        assert error["error"].startswith("State update rejected: state does not fit Board")
        send_state(a, {"count": -1})  # fits the model, refused by the agent's hook
        refused = next_state(a)
        assert refused["type"] == STATE_ERROR and "below zero" in refused["error"]
        send_state(a, "not an object")
        assert next_state(a)["type"] == STATE_ERROR
        # The other client heard none of it: its next frame is the next valid change.
        put_state(base, "alice-s3", {"state": board(2)}, ALICE)
        assert next_state(b) == {"type": STATE, "state": board(2)}
        assert next_state(a) == {"type": STATE, "state": board(2)}
    assert get_state(base, "alice-s3", ALICE).json() == {"state": board(2), "version": 2}


def test_a_class_that_keeps_its_state_to_itself(server):
    base, app = server
    with open_ws(base, "alice-lock", ALICE, slug="locked") as ws:
        greet(ws)
        send_state(ws, board(9))
        error = next_state(ws)
        assert error["type"] == STATE_ERROR and "client_can_set_state" in error["error"]
        refused = put_state(base, "alice-lock", {"state": board(9)}, ALICE, slug="locked")
        assert refused.status_code == 403
        assert refused.json()["error"]["type"] == "forbidden"
        # Nothing was claimed or stored by the refusals: the name is nobody's yet.
        assert get_state(base, "alice-lock", ALICE, slug="locked").status_code == 404


def test_changes_made_inside_the_agent_reach_the_sockets_and_the_sse_stream(server):
    base, app = server
    put_state(base, "alice-s4", {"state": board(1)}, ALICE)
    with (
        open_ws(base, "alice-s4", ALICE) as ws,
        StateStream(base, "alice-s4", ALICE) as stream,
    ):
        greet(ws)
        assert stream.next() == {"state": board(1), "version": 1}  # the current state first
        agent = handle_of(app, "alice-s4")
        assert agent.bump.remote(5).result() == 6  # in the agent's own actor
        assert next_state(ws) == {"type": STATE, "state": board(6)}
        assert stream.next() == {"state": board(6), "version": 2}
        send_state(ws, board(7))  # a socket's change reaches the SSE client too
        assert stream.next() == {"state": board(7), "version": 3}
        put_state(base, "alice-s4", {"state": board(8)}, ALICE)
        assert stream.next() == {"state": board(8), "version": 4}
        assert next_state(ws) == {"type": STATE, "state": board(8)}


def test_state_after_hibernation_reaches_a_connected_client(server):
    base, app = server
    put_state(base, "alice-s5", {"state": board(1, "before")}, ALICE)
    with open_ws(base, "alice-s5", ALICE) as ws, StateStream(base, "alice-s5", ALICE) as stream:
        greet(ws)
        assert stream.next()["version"] == 1
        assert namespace_of(app).hibernate("alice-s5")
        assert ping(ws)["type"] == "cf_agent_stream_resume_none"  # the socket stays open
        # A handle's call wakes the agent; the feed finds it again and carries it on.
        handle_of(app, "alice-s5").set_state.remote(board(2, "after")).result()
        assert next_state(ws) == {"type": STATE, "state": board(2, "after")}
        assert stream.next() == {"state": board(2, "after"), "version": 2}
    # A new client gets the state the file kept.
    assert namespace_of(app).hibernate("alice-s5")
    with open_ws(base, "alice-s5", ALICE) as ws:
        assert greet(ws)[1] == {"type": STATE, "state": board(2, "after")}


def test_the_state_routes_check_before_they_claim(server):
    base, _ = server
    missing = put_state(base, "alice-s6", {"nostate": 1}, ALICE)
    assert missing.status_code == 400
    invalid = put_state(base, "alice-s6", {"state": {"count": "many"}}, ALICE)
    assert invalid.status_code == 400
    assert invalid.json()["error"]["type"] == "InvalidAgentStateError"
    # Nothing claimed: the name is still nobody's (the owned routes answer 404).
    assert get_state(base, "alice-s6", ALICE).status_code == 404
    ok = put_state(base, "alice-s6", {"state": board(1)}, ALICE)
    assert ok.status_code == 200
    refused = put_state(base, "alice-s6", {"state": board(-1)}, ALICE)  # the hook says no
    assert refused.status_code == 403
    assert get_state(base, "alice-s6", ALICE).json() == {"state": board(1), "version": 1}
