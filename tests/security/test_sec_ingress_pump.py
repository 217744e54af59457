"""Crash-in-waiting: a WebSocket run's fan-out task was created without a kept
reference (issue 21, item 16), so the event loop could collect it mid-run, and
nothing stopped it when the agent's last socket closed. The hub now holds it and
cancels it when the last connection to the agent closes; the run itself goes on in
its actor (a detach, never an abort)."""

from __future__ import annotations

import httpx
import pytest
from thinkray.actors.ingress.app import build_app
from websockets.sync.client import connect

from tests.helpers import wait_until
from tests.ingress_support import ALICE, make_config, serve_built, ws_url
from tests.test_ingress_ws import chat_request, greeting, recv

pytestmark = pytest.mark.ray

CHUNKS = 200


def test_the_pump_is_kept_and_cancelled_when_the_last_socket_closes(ray_local, tmp_path):
    namespace = f"secpump-{tmp_path.name[-10:]}".replace("_", "-")
    config = make_config(
        str(tmp_path / "root"), namespace, agent_kwargs={"chunks": CHUNKS, "delay": 0.05}
    )
    app = build_app(config)
    hub = app.state.ws_hub
    key = ("chat", "alice-pump")
    with serve_built(app) as base:
        with connect(ws_url(base, *key), additional_headers=ALICE, open_timeout=30) as ws:
            greeting(ws)
            ws.send(chat_request("req1", "go", "u1"))
            while not recv(ws)["body"]:  # the first chunk: the pump runs
                pass
            (pump,) = hub.pumps[key]
            assert not pump.done()
        wait_until(pump.done, timeout=30)
        assert pump.cancelled()
        assert key not in hub.pumps
        # Detached, not aborted: the run completes in its actor.
        path = f"{base}/agents/chat/alice-pump/get-messages"

        def answered() -> bool:
            stored = httpx.get(path, headers=ALICE, timeout=30).json()
            return len(stored) == 2 and (stored[1]["metadata"] or {}).get("status") == "completed"

        wait_until(answered, timeout=120, interval=0.5)
