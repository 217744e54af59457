"""Attack: another tenant reads or writes an agent's synced state (issue 25, part 3).
Bob tries Alice's state over HTTP (read, write, event stream) and over a WebSocket he
opened on her name before she claimed it (such a socket is accepted, but must hear
nothing of her agent and change nothing of it). Every state change goes through the
hub's fan-out, which reaches the owner's connections only."""

from __future__ import annotations

import httpx
import pytest

from tests.ingress_support import ALICE, BOB
from tests.state_support import (
    STATE,
    STATE_ERROR,
    StateStream,
    board,
    get_state,
    greet,
    hibernated_state_server,
    next_state,
    open_ws,
    ping,
    put_state,
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


def test_bob_can_neither_read_nor_write_nor_stream_alices_state(server):
    base, _ = server
    assert put_state(base, "alice-st1", {"state": board(1, "secret")}, ALICE).status_code == 200
    assert get_state(base, "alice-st1", BOB).status_code == 404
    written = put_state(base, "alice-st1", {"state": board(666, "bob was here")}, BOB)
    assert written.status_code == 404
    url = f"{base}/agents/chat/alice-st1/state/stream"
    with httpx.Client(timeout=60) as client, client.stream("GET", url, headers=BOB) as response:
        assert response.status_code == 404
        assert "secret" not in response.read().decode()
    # No credential at all: 401 before anything else.
    assert httpx.get(f"{base}/agents/chat/alice-st1/state", timeout=60).status_code == 401
    assert get_state(base, "alice-st1", ALICE).json() == {
        "state": board(1, "secret"),
        "version": 1,
    }


def test_a_socket_on_an_unclaimed_name_hears_nothing_of_the_owners_state(server):
    base, _ = server
    with open_ws(base, "alice-st2", BOB) as bob:
        # Accepted (nobody owns the name yet): the class's initial state, nothing else.
        assert greet(bob)[1] == {"type": STATE, "state": board(title="new board")}
        assert put_state(base, "alice-st2", {"state": board(1, "mine")}, ALICE).status_code == 200
        with (
            open_ws(base, "alice-st2", ALICE) as a1,
            open_ws(base, "alice-st2", ALICE) as a2,
            StateStream(base, "alice-st2", ALICE) as stream,
        ):
            assert greet(a1)[1] == {"type": STATE, "state": board(1, "mine")}
            greet(a2)
            assert stream.next()["version"] == 1
            send_state(a1, board(2, "my secret plans"))
            # a2 got it: the fan-out of that change is done, to every member at once.
            assert next_state(a2) == {"type": STATE, "state": board(2, "my secret plans")}
            assert stream.next()["state"] == board(2, "my secret plans")
            # Anything fanned out to Bob would be queued before the answer to his probe.
            assert ping(bob) == {
                "type": "cf_agent_stream_resume_none",
                "reason": "idle",
                "probeId": "ping",
            }


def test_the_waiting_socket_cannot_set_the_owners_state(server):
    base, _ = server
    with open_ws(base, "alice-st3", BOB) as bob:
        greet(bob)
        put_state(base, "alice-st3", {"state": board(1, "mine")}, ALICE)
        with open_ws(base, "alice-st3", ALICE) as alice:
            greet(alice)
            send_state(bob, board(666, "bob was here"))
            refused = next_state(bob)
            assert refused["type"] == STATE_ERROR
            assert "666" not in refused["error"] and "mine" not in refused["error"]
            # Alice heard nothing of it: her next frame is her own next change.
            put_state(base, "alice-st3", {"state": board(2, "still mine")}, ALICE)
            assert next_state(alice) == {"type": STATE, "state": board(2, "still mine")}
    assert get_state(base, "alice-st3", ALICE).json() == {
        "state": board(2, "still mine"),
        "version": 2,
    }


def test_a_name_claimed_by_a_state_change_is_its_senders(server):
    base, _ = server
    with open_ws(base, "bob-st4", BOB) as bob, open_ws(base, "bob-st4", ALICE) as alice:
        greet(bob)
        greet(alice)
        send_state(bob, board(7, "bob's"))  # claims the name for Bob
        # Frames are handled in order: once the probe is answered, the state is stored.
        assert ping(bob)["type"] == "cf_agent_stream_resume_none"
        with open_ws(base, "bob-st4", BOB) as bob2:
            assert greet(bob2)[1] == {"type": STATE, "state": board(7, "bob's")}
            send_state(bob2, board(8, "bob's too"))
            assert next_state(bob) == {"type": STATE, "state": board(8, "bob's too")}
        assert ping(alice)["type"] == "cf_agent_stream_resume_none"  # she heard nothing
        send_state(alice, board(9, "alice's"))
        assert next_state(alice)["type"] == STATE_ERROR
    assert get_state(base, "bob-st4", ALICE).status_code == 404
    assert get_state(base, "bob-st4", BOB).json()["state"] == board(8, "bob's too")
