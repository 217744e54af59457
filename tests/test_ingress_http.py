"""The ingress over HTTP (issue 11, items 2, 4 and 5, and its bad input): the AI SDK
chat stream, resume, stored messages, session operations, live status, tokens and
tenancy. The app runs on a loopback port (uvicorn) in front of real session actors."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import httpx
import pytest

from tests.helpers import wait_until
from tests.ingress_support import (
    ALICE,
    BOB,
    SLOW,
    agent_names,
    chat_body,
    post_chat,
    sse_events,
    ws_ticket,
)

pytestmark = pytest.mark.ray


@pytest.fixture
def server(ingress_apps):
    """``server(**overrides)``: the module's app for that configuration (agents of each
    test's own names); ``server.fresh(...)``: an app of the test's own."""
    return ingress_apps


def text_of(chunks: list[Any]) -> str:
    return "".join(c["delta"] for c in chunks if isinstance(c, dict) and c["type"] == "text-delta")


def test_a_chat_streams_the_ui_message_stream_and_stores_the_message(server):
    with server() as base:
        chunks = post_chat(base, "/agents/chat/alice-1/chat", chat_body("c1", "hi", "u1"), ALICE)
        assert chunks[-1] == "[DONE]"
        assert chunks[0]["type"] == "start" and chunks[-2]["type"] == "finish"
        assert text_of(chunks) == "".join(f"chunk{i} " for i in range(5))
        stored = httpx.get(f"{base}/agents/chat/alice-1/chat/c1/messages", headers=ALICE).json()
        assert [m["role"] for m in stored] == ["user", "assistant"]
        assert stored[0]["id"] == "u1"
        assert stored[1]["id"] == chunks[0]["messageId"]
        assert "".join(p.get("text", "") for p in stored[1]["parts"]) == text_of(chunks)
        # The same message id again is not a second user message (idempotency key).
        post_chat(base, "/agents/chat/alice-1/chat", chat_body("c1", "hi", "u1"), ALICE)
        again = httpx.get(f"{base}/agents/chat/alice-1/chat/c1/messages", headers=ALICE).json()
        assert [m["id"] for m in again if m["role"] == "user"] == ["u1"]


def test_a_chat_turn_asks_the_actor_for_the_turn_only(server):
    """A chat's first message finds no session and creates it; every later turn is one
    call to the actor (no session lookup before each turn: a round trip per turn)."""
    with server() as base:
        path = "/agents/chat/alice-calls/chat"
        for i in range(3):
            assert post_chat(base, path, chat_body("c1", "hi", f"u{i}"), ALICE)[-1] == "[DONE]"
        handle = server.namespace_of(base).get("alice-calls")
        assert handle.session_calls.remote().result() == {"get_session": 0, "create_session": 1}
        stored = httpx.get(f"{base}{path}/c1/messages", headers=ALICE).json()
        assert [m["id"] for m in stored if m["role"] == "user"] == ["u0", "u1", "u2"]


def test_regenerate_replaces_the_last_answer(server):
    with server() as base:
        path = "/agents/chat/alice-2/chat"
        first = post_chat(base, path, chat_body("c1", "hi", "u1"), ALICE)
        body = {
            "id": "c1",
            "messages": [],
            "trigger": "regenerate-message",
            "messageId": first[0]["messageId"],
        }
        second = post_chat(base, path, body, ALICE)
        assert second[0]["messageId"] != first[0]["messageId"]
        stored = httpx.get(f"{base}{path}/c1/messages", headers=ALICE).json()
        assert [m["id"] for m in stored] == ["u1", second[0]["messageId"]]


def test_a_client_that_disconnects_detaches_and_resume_replays_from_chunk_zero(server):
    with server(agent_kwargs=SLOW) as base:
        path = "/agents/chat/alice-3/chat"
        body = chat_body("c1", "go", "u1")
        seen: list[Any] = []
        with (
            httpx.Client(timeout=30) as client,
            client.stream("POST", base + path, json=body, headers=ALICE) as r,
        ):
            for event in sse_events(r.iter_lines()):
                seen.append(event)
                if len(seen) >= 6:
                    break  # the client goes away mid-stream
        with (
            httpx.Client(timeout=30) as client,
            client.stream("GET", f"{base}{path}/c1/stream", headers=ALICE) as r,
        ):
            assert r.status_code == 200
            replay = list(sse_events(r.iter_lines()))
        assert replay[-1] == "[DONE]" and replay[-2]["type"] == "finish"  # not aborted
        assert replay[: len(seen)] == seen  # from chunk 0: what the first client saw
        assert text_of(replay) == "".join(f"chunk{i} " for i in range(SLOW["chunks"]))
        # Nothing active any more: 204, for this chat and for one that never existed.
        assert httpx.get(f"{base}{path}/c1/stream", headers=ALICE).status_code == 204
        assert httpx.get(f"{base}{path}/nope/stream", headers=ALICE).status_code == 204


def test_abort_is_its_own_request_and_a_second_abort_has_no_effect(server):
    with server(agent_kwargs=SLOW) as base:
        path = "/agents/chat/alice-4/chat"
        events: list[Any] = []

        def read() -> None:
            events.extend(post_chat(base, path, chat_body("c1", "go", "u1"), ALICE))

        reader = threading.Thread(target=read)
        reader.start()
        wait_until(lambda: len(events) > 0 or _active(base, path), timeout=20)
        aborted = httpx.post(f"{base}{path}/c1/abort", headers=ALICE).json()
        reader.join(30)
        assert aborted == {"aborted": True}
        assert any(e != "[DONE]" and e["type"] == "abort" for e in events)
        assert httpx.post(f"{base}{path}/c1/abort", headers=ALICE).json() == {"aborted": False}
        stored = httpx.get(f"{base}{path}/c1/messages", headers=ALICE).json()
        assert [m["role"] for m in stored] == ["user", "assistant"]  # partial answer kept


def _active(base: str, path: str) -> bool:
    with (
        httpx.Client(timeout=10) as client,
        client.stream("GET", f"{base}{path}/c1/stream", headers=ALICE) as r,
    ):
        return r.status_code == 200


def test_session_operations(server):
    with server() as base:
        agent = f"{base}/agents/chat/alice-5"
        assert httpx.get(f"{agent}/sessions", headers=ALICE).json()["sessions"] == []
        created = httpx.post(f"{agent}/sessions", json={"name": "Plans"}, headers=ALICE)
        assert created.status_code == 201
        sid = created.json()["id"]
        renamed = httpx.patch(f"{agent}/sessions/{sid}", json={"name": "Trips"}, headers=ALICE)
        assert renamed.json()["name"] == "Trips"
        post_chat(base, "/agents/chat/alice-5/chat", chat_body(sid, "one", "u1"), ALICE)
        post_chat(base, "/agents/chat/alice-5/chat", chat_body(sid, "two", "u2"), ALICE)
        history = httpx.get(f"{agent}/chat/{sid}/messages", headers=ALICE).json()
        assert [m["id"] for m in history][::2] == ["u1", "u2"]

        branch = httpx.post(
            f"{agent}/sessions/{sid}/branch",
            json={"messageId": history[1]["id"], "name": "alt"},
            headers=ALICE,
        )
        assert branch.status_code == 201
        forked = httpx.get(f"{agent}/chat/{branch.json()['id']}/messages", headers=ALICE).json()
        # The branch holds copies of the first exchange (ids of its own).
        assert [m["parts"] for m in forked] == [m["parts"] for m in history[:2]]

        rewound = httpx.post(
            f"{agent}/sessions/{sid}/rewind", json={"messageId": "u2"}, headers=ALICE
        )
        assert rewound.status_code == 200, rewound.text
        after = httpx.get(f"{agent}/chat/{sid}/messages", headers=ALICE).json()
        assert [m["id"] for m in after][-1] == "u2"
        assert httpx.post(f"{agent}/sessions/{sid}/unrewind", headers=ALICE).status_code == 200
        restored = httpx.get(f"{agent}/chat/{sid}/messages", headers=ALICE).json()
        assert [m["id"] for m in restored] == [m["id"] for m in history]

        listed = httpx.get(f"{agent}/sessions", headers=ALICE).json()["sessions"]
        assert {s["name"] for s in listed} >= {"Trips", "alt"}
        assert httpx.delete(f"{agent}/sessions/{sid}", headers=ALICE).status_code == 204
        assert httpx.get(f"{agent}/chat/{sid}/messages", headers=ALICE).status_code == 404
        assert httpx.delete(f"{agent}/sessions/{sid}", headers=ALICE).status_code == 404
        assert "alice-5" in agent_names(base, ALICE)


def test_status_is_an_event_stream(server):
    with server(agent_kwargs=SLOW) as base:
        agent = f"{base}/agents/chat/alice-6"
        sid = httpx.post(f"{agent}/sessions", json={"name": "s"}, headers=ALICE).json()["id"]
        states: list[str] = []

        def watch() -> None:
            with (
                httpx.Client(timeout=30) as client,
                client.stream("GET", f"{agent}/sessions/{sid}/status", headers=ALICE) as r,
            ):
                for status in sse_events(r.iter_lines()):
                    states.append(status["state"])
                    if states[-2:] == ["busy", "idle"]:
                        return

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        wait_until(lambda: states, timeout=20)  # the current status comes first
        post_chat(base, "/agents/chat/alice-6/chat", chat_body(sid, "go", "u1"), ALICE)
        watcher.join(20)
        assert states[0] == "idle" and states[-2:] == ["busy", "idle"]


# -- authentication and tenancy ---------------------------------------------------------


def test_no_token_or_a_wrong_token_is_401_and_writes_nothing(server):
    with server() as base:
        body = chat_body("c1", "hi", "u1")
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Basic x"}):
            r = httpx.post(f"{base}/agents/chat/alice-7/chat", json=body, headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        # A token in the query string is for the WebSocket upgrade only.
        r = httpx.post(f"{base}/agents/chat/alice-7/chat?token=token-alice", json=body)
        assert r.status_code == 401
        # ... and so is the agent's WebSocket ticket, which the `agents` package's
        # get-messages fetch also sends (the socket's query string).
        post_chat(base, "/agents/chat/alice-7b/chat", body, ALICE)
        ticket = ws_ticket(base, "chat", "alice-7b", ALICE)
        r = httpx.get(f"{base}/agents/chat/alice-7b/get-messages?ticket={ticket}")
        assert r.status_code == 200 and [m["id"] for m in r.json()][0] == "u1"
        r = httpx.get(f"{base}/agents/chat/alice-7b/chat/c1/messages?ticket={ticket}")
        assert r.status_code == 401
        written = [p.name for p in server.root_of(base).rglob("*")]
        assert "alice-7" not in written and "alice-7.duckdb" not in written


def test_another_principals_agent_is_not_found_and_untouched(server):
    with server() as base:
        post_chat(base, "/agents/chat/alice-8/chat", chat_body("c1", "mine", "u1"), ALICE)
        path = f"{base}/agents/chat/alice-8"
        attempts = [
            httpx.post(f"{path}/chat", json=chat_body("c1", "theirs", "b1"), headers=BOB),
            httpx.get(f"{path}/chat/c1/messages", headers=BOB),
            httpx.get(f"{path}/get-messages", headers=BOB),
            httpx.post(f"{path}/sessions", json={"name": "x"}, headers=BOB),
            httpx.delete(f"{path}/sessions/c1", headers=BOB),
            httpx.post(f"{path}/chat/c1/abort", headers=BOB),
        ]
        assert [r.status_code for r in attempts] == [404] * len(attempts)
        assert all("alice" not in r.text or "alice-8" in r.text for r in attempts)
        assert httpx.get(f"{path}/chat/c1/stream", headers=BOB).status_code == 204
        stored = httpx.get(f"{path}/chat/c1/messages", headers=ALICE).json()
        assert [m["id"] for m in stored if m["role"] == "user"] == ["u1"]
        # Bob's list names none of Alice's agents (the app's other tests made more).
        assert "alice-8" in agent_names(base, ALICE)
        assert not [name for name in agent_names(base, BOB) if name.startswith("alice")]


def test_cors_is_closed_by_default_and_open_to_configured_origins(server):
    preflight = {
        "origin": "http://ui.example",
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization,content-type",
    }
    with server() as base:
        r = httpx.options(f"{base}/agents/chat/x/chat", headers=preflight)
        assert "access-control-allow-origin" not in r.headers
    with server(cors_origins=["http://ui.example"]) as base:
        r = httpx.options(f"{base}/agents/chat/x/chat", headers=preflight)
        assert r.headers["access-control-allow-origin"] == "http://ui.example"


# -- bad input ----------------------------------------------------------------------------


def test_bad_input_gets_a_clear_4xx_and_writes_nothing(server):
    with server.fresh(max_body_bytes=2000) as base:
        url = f"{base}/agents/chat/alice-9/chat"
        cases = [
            (b"{not json", 400, "malformed_json"),
            (json.dumps({"id": "c1", "messages": "nope"}).encode(), 400, None),
            (json.dumps({"messages": []}).encode(), 400, None),
            (json.dumps(chat_body("c1", "x" * 5000, "u1")).encode(), 413, "too_large"),
            (json.dumps({**chat_body("c1", "hi", "u1"), "trigger": "bogus"}).encode(), 400, None),
            (json.dumps(chat_body("c\x00bad", "hi", "u1")).encode(), 400, None),
            (json.dumps(chat_body("x" * 300, "hi", "u1")).encode(), 400, None),
        ]
        for raw, status, kind in cases:
            r = httpx.post(url, content=raw, headers={**ALICE, "content-type": "application/json"})
            assert r.status_code == status, (raw[:40], r.text)
            assert r.json()["error"]["message"]
            if kind:
                assert r.json()["error"]["type"] == kind
        assert (
            httpx.post(
                f"{base}/agents/nosuch/alice-9/chat",
                json=chat_body("c1", "hi", "u1"),
                headers=ALICE,
            ).status_code
            == 404
        )
        bad_name = httpx.post(
            f"{base}/agents/chat/..%2Fescape/chat", json=chat_body("c1", "hi", "u1"), headers=ALICE
        )
        assert bad_name.status_code in (400, 404)
        assert not list(server.root_of(base).rglob("*.duckdb"))
        # The agent stays usable after all that.
        assert (
            post_chat(base, "/agents/chat/alice-9/chat", chat_body("c1", "hi", "u1"), ALICE)[-1]
            == "[DONE]"
        )


def test_a_busy_session_refuses_a_second_chat_with_409(server):
    with server(agent_kwargs=SLOW) as base:
        path = "/agents/chat/alice-10/chat"
        reader = threading.Thread(
            target=post_chat, args=(base, path, chat_body("c1", "go", "u1"), ALICE)
        )
        reader.start()
        wait_until(lambda: _active(base, path), timeout=20)
        second = httpx.post(f"{base}{path}", json=chat_body("c1", "again", "u2"), headers=ALICE)
        assert second.status_code == 409 and second.json()["error"]["type"] == "busy"
        reader.join(30)
        time.sleep(0.1)
        stored = httpx.get(f"{base}{path}/c1/messages", headers=ALICE).json()
        assert [m["id"] for m in stored if m["role"] == "user"] == ["u1"]


def test_two_first_messages_of_one_new_chat_at_once_make_one_session(server):
    """Both find no session and both create it: one creation wins, the other request
    finds the session made meanwhile and sends its turn (answered, or 409 while the
    first runs). Nothing fails, and the chat is one session."""
    with server(agent_kwargs=SLOW) as base:
        path = "/agents/chat/alice-race/chat"
        start = threading.Barrier(2)
        codes: list[int] = []

        def send(message_id: str) -> None:
            start.wait()
            body = chat_body("c1", "go", message_id)
            with (
                httpx.Client(timeout=30) as client,
                client.stream("POST", f"{base}{path}", json=body, headers=ALICE) as r,
            ):
                codes.append(r.status_code)
                r.read()

        senders = [threading.Thread(target=send, args=(f"u{i}",)) for i in range(2)]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(60)
        assert 200 in codes and set(codes) <= {200, 409}, codes
        listed = httpx.get(f"{base}/agents/chat/alice-race/sessions", headers=ALICE).json()
        assert [s["id"] for s in listed["sessions"]] == ["c1"]
        stored = httpx.get(f"{base}{path}/c1/messages", headers=ALICE).json()
        assert len([m for m in stored if m["role"] == "user"]) == codes.count(200)


def test_a_client_that_stops_reading_is_dropped_and_the_run_completes(server, caplog):
    import socket

    # 200 chunks of 32 KiB: far more than loopback's socket buffers hold, so a client
    # that never reads blocks the replica's sends, which give up after the bound.
    kwargs = {"chunks": 160, "reply_text": "x" * 32768}
    caplog.set_level(logging.INFO, logger="thinkray.ingress")
    with server(agent_kwargs=kwargs, slow_consumer_timeout=0.5) as base:
        host, port = base.removeprefix("http://").split(":")
        body = json.dumps(chat_body("c1", "go", "u1")).encode()
        request = (
            f"POST /agents/chat/alice-11/chat HTTP/1.1\r\nhost: {host}\r\n"
            "authorization: Bearer token-alice\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode() + body
        sock = socket.create_connection((host, int(port)))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(request)
        path = f"{base}/agents/chat/alice-11/chat/c1"

        def finished() -> bool:
            sessions = httpx.get(f"{base}/agents/chat/alice-11/sessions", headers=ALICE)
            if sessions.status_code != 200 or not sessions.json()["sessions"]:
                return False
            if httpx.get(f"{path}/stream", headers=ALICE).status_code != 204:
                return False  # still running
            return len(httpx.get(f"{path}/messages", headers=ALICE).json()) == 2

        wait_until(finished, timeout=120, interval=0.5)  # it ends although nobody reads
        stored = httpx.get(f"{path}/messages", headers=ALICE).json()
        assert stored[1]["role"] == "assistant"
        assert "".join(p.get("text", "") for p in stored[1]["parts"]).startswith("x" * 32768)
        # The replica gave up on the client rather than hold the stream for it.
        wait_until(lambda: "dropped a slow SSE consumer" in caplog.text, timeout=30)
        sock.close()
