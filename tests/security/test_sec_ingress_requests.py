"""Attacks with malformed requests (issue 21, items 4 and 16):

- a chat request that is refused (400) must write nothing: before, the chat route
  claimed the name and created the session before checking the message, so a 400
  still made the name the caller's (and made a session);
- a plain ``ValueError``'s text (a path, an import error, a library's internals) is
  not answered to the client, over HTTP or the WebSocket;
- a client-chosen run id that reuses a finished run's is refused: its chunk log is
  the old run's, and a resume of it must replay that run only.
"""

from __future__ import annotations

import json

import httpx
import pytest
from websockets.sync.client import connect

from tests.ingress_support import ALICE, BOB, chat_body, make_config, serve_app, ws_url
from tests.test_ingress_ws import chat_request, chunks_of, greeting, is_done, read_until, recv

pytestmark = pytest.mark.ray

_ids = iter(range(100_000))


@pytest.fixture
def start(ray_local, tmp_path):
    def run(**overrides):
        namespace = f"secreq{next(_ids)}-{tmp_path.name[-10:]}".replace("_", "-")
        return serve_app(make_config(str(tmp_path / "root"), namespace, **overrides))

    return run


def test_a_refused_chat_writes_nothing(start, tmp_path):
    with start() as base:
        url = f"{base}/agents/chat/alice-400/chat"
        assistant = {"id": "a1", "role": "assistant", "parts": [{"type": "text", "text": "x"}]}
        bad_part = {"id": "u1", "role": "user", "parts": [{"type": "no-such-part"}]}
        no_parts = {"id": "u1", "role": "user", "parts": []}
        for message in (assistant, bad_part, no_parts, "just text"):
            body = {"id": "c1", "messages": [message], "trigger": "submit-message"}
            r = httpx.post(url, json=body, headers=ALICE, timeout=30)
            assert r.status_code == 400, (message, r.text)
        regenerate = {"id": "c1", "messages": [], "trigger": "regenerate-message"}
        assert httpx.post(url, json=regenerate, headers=ALICE, timeout=30).status_code == 404
        # No owner claimed: the name is nobody's, and Bob may still take it.
        assert httpx.get(f"{base}/agents/chat", headers=ALICE, timeout=30).json() == {"agents": []}
        assert not list((tmp_path / "root").rglob("*.duckdb"))  # no agent, no session
        r = httpx.post(url, json=chat_body("c1", "hi", "u1"), headers=BOB, timeout=30)
        assert r.status_code == 200


def test_a_value_errors_text_is_not_echoed(start):
    # A misconfigured agent class: loading it raises ValueError naming the module path
    # and Python's import error, which are the operator's business, not the caller's.
    with start(agent_cls="tests.no_such_module_xyz:Missing") as base:
        agent = f"{base}/agents/chat/alice-ve"
        for r in (
            httpx.get(f"{agent}/approvals", headers=ALICE, timeout=30),
            httpx.post(f"{agent}/chat", json=chat_body("c1", "hi", "u1"), headers=ALICE),
        ):
            assert r.status_code == 500, r.text
            assert r.json()["error"]["message"] == "internal error (ValueError)"
            assert "no_such_module_xyz" not in r.text
        with connect(ws_url(base, "chat", "alice-ve"), additional_headers=ALICE) as ws:
            greeting(ws)
            ws.send(chat_request("req1", "hi", "u1"))
            refused = read_until(ws, is_done("req1"))[-1]
            assert refused["error"] is True and "no_such_module_xyz" not in refused["body"]


def test_a_reused_finished_run_id_is_refused_and_logs_never_mix(start):
    with (
        start() as base,
        connect(ws_url(base, "chat", "alice-run"), additional_headers=ALICE) as ws,
    ):
        greeting(ws)
        ws.send(chat_request("run1", "first", "u1"))
        first = chunks_of(read_until(ws, is_done("run1")), "run1")
        assert recv(ws)["type"] == "cf_agent_chat_messages"
        ws.send(chat_request("run1", "second", "u2"))
        refused = read_until(ws, is_done("run1"))
        assert refused[-1]["error"] is True and "run1" in refused[-1]["body"]
        # The run's chunk log is still the first run's alone.
        ws.send(json.dumps({"type": "cf_agent_stream_resume_ack", "id": "run1"}))
        replay = read_until(ws, is_done("run1"))
        assert chunks_of(replay, "run1") == first
        r = httpx.get(f"{base}/agents/chat/alice-run/get-messages", headers=ALICE, timeout=30)
        assert [m["id"] for m in r.json() if m["role"] == "user"] == ["u1"]
