"""The ingress's ``cf_agent_*`` WebSocket protocol (issue 11, item 3), with the
``websockets`` client against the app on a loopback port in front of real session
actors: identity on connect, chat frames, cancel, the resume handshake after a
reconnect, broadcasts to a second connection, clear, tokens and tenancy, bad frames,
and the bounded outbox of a slow consumer."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.ingress_support import ALICE, BOB, SLOW, agent_names, user_message

pytestmark = pytest.mark.ray

RESPONSE = "cf_agent_use_chat_response"


@pytest.fixture
def server(ingress_apps):
    """``server(**overrides)``: the module's app for that configuration (agents of each
    test's own names); ``server.fresh(...)``: an app of the test's own."""
    return ingress_apps


def open_ws(
    base: str, name: str, headers: dict[str, str] | None = ALICE, query: str = ""
) -> ClientConnection:
    url = "ws" + base[len("http") :] + f"/agents/chat/{name}" + query
    return connect(url, additional_headers=headers or {}, open_timeout=20)


def recv(ws: ClientConnection, timeout: float = 30) -> dict[str, Any]:
    return json.loads(ws.recv(timeout=timeout))


def read_until(ws: ClientConnection, stop: Any) -> list[dict[str, Any]]:
    """Frames up to and including the first for which ``stop(frame)``."""
    frames = []
    while True:
        frames.append(recv(ws))
        if stop(frames[-1]):
            return frames


def greeting(ws: ClientConnection) -> list[dict[str, Any]]:
    """The frames a connection gets first: identity, MCP servers, then the messages or
    a resume offer."""
    return [recv(ws), recv(ws), recv(ws)]


def chat_request(request_id: str, text: str, message_id: str, **body: Any) -> str:
    payload = {"messages": [user_message(text, message_id)], "trigger": "submit-message", **body}
    return json.dumps(
        {
            "type": "cf_agent_use_chat_request",
            "id": request_id,
            "init": {"method": "POST", "body": json.dumps(payload)},
        }
    )


def is_done(request_id: str) -> Any:
    return lambda f: f["type"] == RESPONSE and f["id"] == request_id and f["done"]


def chunks_of(frames: list[dict[str, Any]], request_id: str) -> list[dict[str, Any]]:
    return [
        json.loads(f["body"])
        for f in frames
        if f["type"] == RESPONSE and f["id"] == request_id and f["body"] and not f.get("error")
    ]


def text_of(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["delta"] for c in chunks if c["type"] == "text-delta")


def get_messages(base: str, name: str, headers: dict[str, str] = ALICE) -> Any:
    r = httpx.get(f"{base}/agents/chat/{name}/get-messages", headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def ping(ws: ClientConnection) -> dict[str, Any]:
    """The next frame after a resume probe: proves the connection answers, and that
    nothing else was sent to it before."""
    ws.send(json.dumps({"type": "cf_agent_stream_resume_request", "probeId": "ping"}))
    return recv(ws)


FULL = "".join(f"chunk{i} " for i in range(5))


def test_connect_identifies_the_agent_and_sends_its_messages(server):
    with server() as base, open_ws(base, "alice-1") as ws:
        identity, mcp, messages = greeting(ws)
        assert identity == {"type": "cf_agent_identity", "name": "alice-1", "agent": "chat"}
        assert mcp["type"] == "cf_agent_mcp_servers" and mcp["mcp"]["servers"] == {}
        assert messages == {"type": "cf_agent_chat_messages", "messages": []}


def test_a_chat_streams_one_chunk_per_frame_then_done_then_the_messages(server):
    with server() as base:
        with open_ws(base, "alice-2") as ws:
            greeting(ws)
            ws.send(chat_request("req1", "hi", "u1"))
            frames = read_until(ws, is_done("req1"))
            after = recv(ws)
        responses = [f for f in frames if f["type"] == RESPONSE]
        assert responses == frames  # nothing else in between
        assert all(f["id"] == "req1" and not f.get("error") for f in responses)
        assert responses[-1] == {"type": RESPONSE, "id": "req1", "body": "", "done": True}
        chunks = chunks_of(frames, "req1")
        assert len(chunks) == len(responses) - 1  # one chunk per frame
        assert chunks[0]["type"] == "start" and chunks[-1]["type"] == "finish"
        assert text_of(chunks) == FULL
        # After the run: the stored messages, which get-messages also answers.
        assert after["type"] == "cf_agent_chat_messages"
        stored = get_messages(base, "alice-2")
        assert after["messages"] == stored
        assert [m["role"] for m in stored] == ["user", "assistant"]
        assert stored[0]["id"] == "u1" and stored[1]["id"] == chunks[0]["messageId"]
        # A reconnect is offered no stream and gets the messages.
        with open_ws(base, "alice-2") as ws:
            assert greeting(ws)[2] == {"type": "cf_agent_chat_messages", "messages": stored}
            assert ping(ws) == {
                "type": "cf_agent_stream_resume_none",
                "reason": "idle",
                "probeId": "ping",
            }


def test_cancel_aborts_the_run_and_keeps_the_partial_answer(server):
    with server(agent_kwargs=SLOW) as base:
        with open_ws(base, "alice-3") as ws:
            greeting(ws)
            ws.send(chat_request("req1", "go", "u1"))
            read_until(ws, lambda f: f["type"] == RESPONSE and '"text-delta"' in f["body"])
            ws.send(json.dumps({"type": "cf_agent_chat_request_cancel", "id": "req1"}))
            frames = read_until(ws, is_done("req1"))
        chunks = chunks_of(frames, "req1")
        assert chunks[-1]["type"] == "abort"
        stored = get_messages(base, "alice-3")
        assert [m["role"] for m in stored] == ["user", "assistant"]
        assert stored[1]["metadata"]["status"] == "aborted"


def test_a_reconnect_mid_stream_resumes_with_replay_then_the_live_tail(server):
    with server(agent_kwargs=SLOW) as base:
        with open_ws(base, "alice-4") as ws:
            greeting(ws)
            ws.send(chat_request("req1", "go", "u1"))
            seen = read_until(ws, lambda f: len(chunks_of([f], "req1")) and "delta" in f["body"])
            seen_chunks = chunks_of(seen, "req1")
        # The first connection went away: the run goes on, and a new one is told of it.
        with open_ws(base, "alice-4") as ws:
            identity, _, offer = greeting(ws)
            assert identity["type"] == "cf_agent_identity"
            assert offer == {"type": "cf_agent_stream_resuming", "id": "req1"}
            ws.send(json.dumps({"type": "cf_agent_stream_resume_request", "probeId": "p1"}))
            assert recv(ws) == {"type": "cf_agent_stream_resuming", "id": "req1", "probeId": "p1"}
            ws.send(json.dumps({"type": "cf_agent_stream_resume_ack", "id": "req1"}))
            frames = read_until(ws, is_done("req1"))
            after = recv(ws)
        marks = [i for i, f in enumerate(frames) if f.get("replayComplete")]
        assert len(marks) == 1
        replayed, live = frames[: marks[0]], frames[marks[0] + 1 : -1]
        assert replayed and all(f.get("replay") is True for f in replayed)
        assert frames[marks[0]] == {
            "type": RESPONSE,
            "id": "req1",
            "body": "",
            "done": False,
            "replay": True,
            "replayComplete": True,
        }
        assert all("replay" not in f for f in live)
        chunks = chunks_of(frames, "req1")
        assert chunks[: len(seen_chunks)] == seen_chunks  # from chunk 0
        assert chunks[-1]["type"] == "finish"  # the disconnect did not abort it
        assert text_of(chunks) == "".join(f"chunk{i} " for i in range(SLOW["chunks"]))
        assert after["type"] == "cf_agent_chat_messages"
        assert [m["role"] for m in after["messages"]] == ["user", "assistant"]


def test_acking_a_finished_run_replays_it_and_an_unknown_one_is_done(server):
    with server() as base, open_ws(base, "alice-5") as ws:
        greeting(ws)
        ws.send(chat_request("req1", "hi", "u1"))
        live = chunks_of(read_until(ws, is_done("req1")), "req1")
        recv(ws)  # the messages
        ws.send(json.dumps({"type": "cf_agent_stream_resume_ack", "id": "req1"}))
        frames = read_until(ws, is_done("req1"))
        assert all(f["replay"] is True for f in frames)
        assert chunks_of(frames, "req1") == live
        ws.send(json.dumps({"type": "cf_agent_stream_resume_ack", "id": "nope"}))
        assert recv(ws) == {
            "type": RESPONSE,
            "id": "nope",
            "body": "",
            "done": True,
            "replay": True,
        }


def test_a_second_connection_sees_the_run_and_the_clear(server):
    with server() as base, open_ws(base, "alice-6") as one, open_ws(base, "alice-6") as two:
        greeting(one)
        greeting(two)
        one.send(chat_request("req1", "hi", "u1"))
        mine = read_until(one, is_done("req1"))
        theirs = read_until(two, is_done("req1"))
        # The other tab: the new user message first, then the same chunk frames.
        assert theirs[0]["type"] == "cf_agent_chat_messages"
        assert [m["id"] for m in theirs[0]["messages"]] == ["u1"]
        assert theirs[1:] == mine
        final = [recv(one), recv(two)]
        assert final[0] == final[1] and final[0]["type"] == "cf_agent_chat_messages"
        assert [m["role"] for m in final[0]["messages"]] == ["user", "assistant"]

        one.send(json.dumps({"type": "cf_agent_chat_clear"}))
        assert recv(two) == {"type": "cf_agent_chat_clear"}
        assert ping(one)["type"] == "cf_agent_stream_resume_none"  # no clear echoed back
        assert get_messages(base, "alice-6") == []


def test_tokens_on_the_upgrade(server):
    with server() as base:
        for headers in (None, {"authorization": "Bearer wrong"}):
            with pytest.raises(InvalidStatus) as refused:
                open_ws(base, "alice-7", headers=headers)
            assert refused.value.response.status_code == 401
        with pytest.raises(InvalidStatus) as refused:
            open_ws(base, "alice-7", headers=None, query="?token=wrong")
        assert refused.value.response.status_code == 401
        assert not list(server.root_of(base).rglob("alice-7*"))
        # A browser cannot set headers on a WebSocket: a short-lived ticket for this
        # agent, from an authenticated call, rides in the query string.
        ticket = httpx.post(f"{base}/agents/chat/alice-7/ws-ticket", headers=ALICE).json()
        with open_ws(base, "alice-7", headers=None, query=f"?ticket={ticket['ticket']}") as ws:
            assert greeting(ws)[0]["name"] == "alice-7"
            ws.send(chat_request("req1", "hi", "u1"))
            assert text_of(chunks_of(read_until(ws, is_done("req1")), "req1")) == FULL


def test_another_principals_agent_is_refused_like_a_missing_one(server):
    with server() as base:
        with open_ws(base, "alice-8") as ws:
            greeting(ws)
            ws.send(chat_request("req1", "mine", "u1"))
            read_until(ws, is_done("req1"))
        before = get_messages(base, "alice-8")
        for path_name, headers in (("alice-8", BOB), ("a..b", ALICE)):
            with pytest.raises(InvalidStatus) as refused:
                open_ws(base, path_name, headers=headers)
            assert refused.value.response.status_code == 404
        url = "ws" + base[len("http") :] + "/agents/nosuch/alice-8"
        with pytest.raises(InvalidStatus) as refused:
            connect(url, additional_headers=ALICE, open_timeout=20)
        assert refused.value.response.status_code == 404
        assert get_messages(base, "alice-8") == before
        # Bob's list names none of Alice's agents (the app's other tests made more).
        assert "alice-8" in agent_names(base, ALICE)
        assert not [name for name in agent_names(base, BOB) if name.startswith("alice")]


def test_bad_frames_are_ignored_or_refused_and_write_nothing(server):
    with server.fresh(max_body_bytes=4000) as base, open_ws(base, "alice-9") as ws:
        greeting(ws)
        for junk in (
            "not json",
            "[1, 2]",
            '"a string"',
            "{}",
            '{"type": "cf_agent_unknown"}',
            json.dumps({"type": "cf_agent_chat_messages", "messages": [user_message("x", "m")]}),
            json.dumps(
                {"type": "cf_agent_use_chat_request", "id": "r0", "init": {"method": "GET"}}
            ),
            json.dumps({"type": "cf_agent_use_chat_request", "id": "r0", "init": {}}),
            json.dumps(
                {
                    "type": "cf_agent_use_chat_request",
                    "id": "r0",
                    "init": {"method": "POST", "body": "{x"},
                }
            ),
            json.dumps({"type": "cf_agent_chat_request_cancel"}),
            json.dumps({"type": "cf_agent_stream_resume_ack"}),
        ):
            ws.send(junk)
        ws.send(b"\x00\x01binary")
        assert ping(ws)["type"] == "cf_agent_stream_resume_none"  # all of that: ignored

        refused = {
            "r1": {"messages": "nope"},
            "r2": {"messages": [user_message("x" * 5000, "u9")]},
            "r3": {"messages": [user_message("hi", "u9")], "trigger": "bogus"},
            "r4": {"messages": [{"role": "assistant", "parts": []}]},
        }
        for request_id, body in refused.items():
            init = {"method": "POST", "body": json.dumps(body)}
            ws.send(
                json.dumps({"type": "cf_agent_use_chat_request", "id": request_id, "init": init})
            )
            answer = recv(ws)
            assert answer["id"] == request_id and answer["error"] is True and answer["done"]
            assert answer["body"]
        bad_id = chat_request("not an id!", "hi", "u9")
        ws.send(bad_id)
        assert recv(ws)["error"] is True

        ws.send(json.dumps({"type": "rpc", "id": "c1", "method": "getState", "args": []}))
        assert recv(ws) == {
            "type": "rpc",
            "id": "c1",
            "success": False,
            "error": "Method getState is not callable",
        }
        ws.send(json.dumps({"type": "cf_agent_state", "state": {"x": 1}}))
        assert recv(ws)["type"] == "cf_agent_state_error"
        for frame in (
            {"type": "cf_agent_tool_result", "toolCallId": "call_1", "output": 1},
            {"type": "cf_agent_tool_approval", "toolCallId": "call_2", "approved": True},
        ):
            ws.send(json.dumps(frame))
            answer = recv(ws)
            assert answer["type"] == RESPONSE and answer["id"] == frame["toolCallId"]
            assert answer["error"] is True and answer["done"] is True
        assert not list(server.root_of(base).rglob("*.duckdb"))  # nothing written

        # The connection is still usable.
        ws.send(chat_request("req1", "hi", "u1"))
        assert text_of(chunks_of(read_until(ws, is_done("req1")), "req1")) == FULL
        assert [m["id"] for m in get_messages(base, "alice-9")][:1] == ["u1"]


def test_a_second_request_while_one_runs_is_refused(server):
    with (
        server(agent_kwargs=SLOW) as base,
        open_ws(base, "alice-10") as ws,
    ):
        greeting(ws)
        ws.send(chat_request("req1", "go", "u1"))
        read_until(ws, lambda f: f["type"] == RESPONSE)
        ws.send(chat_request("req2", "again", "u2"))
        refused = read_until(ws, lambda f: f["id"] == "req2")[-1]
        assert refused["error"] is True and refused["done"] is True
        assert (
            refused["body"].startswith("session ")
            and "already has a run in flight" in refused["body"]
        )
        ws.send(json.dumps({"type": "cf_agent_chat_request_cancel", "id": "req1"}))
        read_until(ws, is_done("req1"))
        stored = get_messages(base, "alice-10")
        assert [m["id"] for m in stored if m["role"] == "user"] == ["u1"]


# -- the slow consumer (no Ray) -------------------------------------------------------------


def test_a_consumer_that_takes_nothing_is_dropped_not_waited_for():
    from thinkray.actors.ingress.auth import Principal
    from thinkray.actors.ingress.ws import OUTBOX_FRAMES, Connection

    class Stuck:
        async def send_text(self, text: str) -> None:
            await asyncio.Event().wait()  # the client never reads

    async def scenario() -> tuple[bool, bool]:
        main = asyncio.ensure_future(asyncio.Event().wait())
        conn = Connection(Stuck(), "chat", "x", Principal("alice"), timeout=3600)  # type: ignore[arg-type]
        conn.main = main
        writer = asyncio.ensure_future(conn.write_loop())
        await asyncio.sleep(0)
        for i in range(OUTBOX_FRAMES + 2):
            conn.send({"n": i})  # never waits, however slow the consumer
        await asyncio.sleep(0)
        writer.cancel()
        return conn.dropped, main.cancelled()

    assert asyncio.run(scenario()) == (True, True)
