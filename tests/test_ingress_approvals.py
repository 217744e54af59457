"""Tool approvals through the ingress (issue 12, item 2; issue 11, item 6): list the
asks of a session, approve or deny over HTTP and with the ``cf_agent_tool_approval``
frame, the waiting run's stream going on (the tool's output, or
``tool-output-denied``); the answerer is the authenticated principal (never a body
field), the agent's ``may_approve`` hook may refuse it (403), and another tenant's,
an unknown or a decided approval is 404 with nothing written. The app runs on a
loopback port in front of real session actors of ``tests.agents:GuardedApprovalAgent``
(``deploy <path>`` asks; a path containing ``locked`` may not be approved)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from tests.ingress_support import ALICE, BOB, chat_body, sse_events

pytestmark = pytest.mark.ray

AGENT = "tests.agents:GuardedApprovalAgent"
RESPONSE = "cf_agent_use_chat_response"


@pytest.fixture
def server(ingress_apps):
    """The module's app for a configuration (GuardedApprovalAgent unless the test says
    otherwise); the tests use agents of their own names."""

    def start(**overrides: Any):
        overrides.setdefault("agent_cls", AGENT)
        overrides.setdefault("agent_kwargs", {})
        return ingress_apps(**overrides)

    return start


class Chat:
    """A chat stream read a chunk at a time (the run waits on an approval meanwhile)."""

    def __init__(self, base: str, agent: str, chat_id: str, text: str, message_id: str) -> None:
        self.client = httpx.Client(timeout=60)
        self.cm = self.client.stream(
            "POST",
            f"{base}/agents/chat/{agent}/chat",
            json=chat_body(chat_id, text, message_id),
            headers=ALICE,
        )
        response = self.cm.__enter__()
        assert response.status_code == 200, response.read()
        self.events: Iterator[Any] = sse_events(response.iter_lines())
        self.seen: list[Any] = []

    def until(self, kind: str) -> dict[str, Any]:
        for chunk in self.events:
            self.seen.append(chunk)
            if isinstance(chunk, dict) and chunk["type"] == kind:
                return chunk
        raise AssertionError(f"no {kind} chunk in {self.seen}")

    def rest(self) -> list[Any]:
        self.seen.extend(self.events)
        self.close()
        return self.seen

    def close(self) -> None:
        self.cm.__exit__(None, None, None)
        self.client.close()


def approvals(base: str, agent: str, session: str | None = None, headers: Any = ALICE) -> Any:
    query = f"?session={session}" if session else ""
    return httpx.get(f"{base}/agents/chat/{agent}/approvals{query}", headers=headers, timeout=30)


def answer(base: str, agent: str, approval_id: str, body: Any, headers: Any = ALICE) -> Any:
    url = f"{base}/agents/chat/{agent}/approvals/{approval_id}"
    return httpx.post(url, json=body, headers=headers, timeout=30)


def approval(base: str, agent: str, approval_id: str) -> dict[str, Any]:
    r = httpx.get(f"{base}/agents/chat/{agent}/approvals/{approval_id}", headers=ALICE, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def text_of(chunks: list[Any]) -> str:
    return "".join(c["delta"] for c in chunks if isinstance(c, dict) and c["type"] == "text-delta")


def test_approve_over_http_and_the_stream_goes_on_with_the_tool_output(server, tmp_path):
    marks = tmp_path / "deployed"
    with server() as base:
        chat = Chat(base, "alice-1", "c1", f"deploy {marks}", "u1")
        try:
            ask = chat.until("tool-approval-request")
            listed = approvals(base, "alice-1", "c1")
            assert listed.status_code == 200, listed.text
            [pending] = listed.json()["approvals"]
            assert pending["approval_id"] == ask["approvalId"]
            assert pending["tool_name"] == "deploy" and pending["input"] == {"path": str(marks)}
            assert pending["status"] == "pending" and pending["session_id"] == "c1"
            assert approvals(base, "alice-1", "other").json() == {"approvals": []}
            assert [a["approval_id"] for a in approvals(base, "alice-1").json()["approvals"]] == [
                ask["approvalId"]
            ]
            assert not marks.exists()  # nothing runs before the answer
            # The answerer is the token's principal, whatever the body claims.
            r = answer(base, "alice-1", ask["approvalId"], {"decision": "once", "answered_by": "x"})
            assert r.status_code == 200, r.text
            assert r.json()["status"] == "approved" and r.json()["answered_by"] == "alice"
            rest = chat.rest()
        finally:
            chat.close()
        output = [c for c in rest if isinstance(c, dict) and c["type"] == "tool-output-available"]
        assert [(c["toolCallId"], c["output"]) for c in output] == [(ask["toolCallId"], "deployed")]
        assert text_of(rest) == "done: deployed" and rest[-1] == "[DONE]"
        assert marks.read_text() == "deployed\n"  # ran once
        decided = approval(base, "alice-1", ask["approvalId"])
        assert (decided["decision"], decided["answered_by"]) == ("once", "alice")
        assert decided["call_status"] == "completed"
        assert approvals(base, "alice-1", "c1").json() == {"approvals": []}
        # Already decided: 404, and the decision stands.
        again = answer(base, "alice-1", ask["approvalId"], {"decision": "deny"})
        assert again.status_code == 404 and again.json()["error"]["type"] == "not_found"
        assert approval(base, "alice-1", ask["approvalId"])["decision"] == "once"
        stored = httpx.get(f"{base}/agents/chat/alice-1/chat/c1/messages", headers=ALICE).json()
        [tool] = [p for p in stored[-1]["parts"] if p.get("toolCallId") == ask["toolCallId"]]
        assert tool["state"] == "output-available" and tool["output"] == "deployed"


def test_deny_over_http_reports_tool_output_denied(server, tmp_path):
    marks = tmp_path / "deployed"
    with server() as base:
        chat = Chat(base, "alice-2", "c1", f"deploy {marks}", "u1")
        try:
            ask = chat.until("tool-approval-request")
            r = answer(base, "alice-2", ask["approvalId"], {"decision": "deny"})
            assert r.status_code == 200, r.text
            assert r.json()["status"] == "denied" and r.json()["answered_by"] == "alice"
            rest = chat.rest()
        finally:
            chat.close()
        denied = [c for c in rest if isinstance(c, dict) and c["type"] == "tool-output-denied"]
        assert [c["toolCallId"] for c in denied] == [ask["toolCallId"]]
        assert not any(isinstance(c, dict) and c["type"] == "tool-output-available" for c in rest)
        assert rest[-1] == "[DONE]" and not marks.exists()
        decided = approval(base, "alice-2", ask["approvalId"])
        assert (decided["status"], decided["answered_by"]) == ("denied", "alice")
        stored = httpx.get(f"{base}/agents/chat/alice-2/chat/c1/messages", headers=ALICE).json()
        [tool] = [p for p in stored[-1]["parts"] if p.get("toolCallId") == ask["toolCallId"]]
        assert tool["state"] == "output-denied"


def test_refused_answers_write_nothing(server, tmp_path):
    locked = tmp_path / "locked-target"
    with server() as base:
        chat = Chat(base, "alice-3", "c1", f"deploy {locked}", "u1")
        try:
            ask = chat.until("tool-approval-request")
            apr = ask["approvalId"]
            # Another tenant: alice's agent is not found for bob, list or answer.
            assert approvals(base, "alice-3", "c1", headers=BOB).status_code == 404
            r = answer(base, "alice-3", apr, {"decision": "once"}, headers=BOB)
            assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
            # ... nor through his own agent: it has no such approval.
            created = httpx.post(f"{base}/agents/chat/bob-1/sessions", json={}, headers=BOB)
            assert created.status_code == 201, created.text
            assert approvals(base, "bob-1", headers=BOB).json() == {"approvals": []}
            assert answer(base, "bob-1", apr, {"decision": "once"}, headers=BOB).status_code == 404
            # Bad decisions and bodies: 400.
            for body in ({"decision": "maybe"}, {}, {"decision": None}, ["once"]):
                r = answer(base, "alice-3", apr, body)
                assert r.status_code == 400, (body, r.text)
            bad = httpx.post(
                f"{base}/agents/chat/alice-3/approvals/{apr}",
                content=b"{not json",
                headers={**ALICE, "content-type": "application/json"},
            )
            assert bad.status_code == 400
            # Unknown approval: 404.
            assert answer(base, "alice-3", "apr_nope", {"decision": "once"}).status_code == 404
            r = httpx.get(f"{base}/agents/chat/alice-3/approvals/apr_nope", headers=ALICE)
            assert r.status_code == 404
            # The agent's may_approve refuses a deploy to a locked path: 403.
            r = answer(base, "alice-3", apr, {"decision": "once"})
            assert r.status_code == 403 and r.json()["error"]["type"] == "forbidden"
            assert "may not answer" in r.json()["error"]["message"]
            # Nothing of that was written: still pending, unanswered, not run.
            still = approval(base, "alice-3", apr)
            assert (still["status"], still["answered_by"], still["decision"]) == (
                "pending",
                None,
                None,
            )
            assert [
                a["approval_id"] for a in approvals(base, "alice-3", "c1").json()["approvals"]
            ] == [apr]
            assert not locked.exists()
            abort = httpx.post(f"{base}/agents/chat/alice-3/chat/c1/abort", headers=ALICE)
            assert abort.json() == {"aborted": True}
            rest = chat.rest()
        finally:
            chat.close()
        assert rest[-1] == "[DONE]" and not locked.exists()
        assert approval(base, "alice-3", apr)["status"] == "aborted"


def test_an_agent_class_without_approvals_answers_404(server):
    with server(agent_cls="tests.agents:ScriptAgent", agent_kwargs={"chunks": 2}) as base:
        httpx.post(f"{base}/agents/chat/alice-4/sessions", json={}, headers=ALICE)
        r = approvals(base, "alice-4")
        assert r.status_code == 404 and "has no tool approvals" in r.json()["error"]["message"]
        r = answer(base, "alice-4", "apr_x", {"decision": "once"})
        assert r.status_code == 404 and "has no tool approvals" in r.json()["error"]["message"]


def test_the_websocket_approval_frame_answers_as_the_principal(server, tmp_path):
    marks = tmp_path / "deployed"
    locked = tmp_path / "locked-target"
    with server() as base:
        url = "ws" + base[len("http") :] + "/agents/chat/alice-5"
        with connect(url, additional_headers=ALICE, open_timeout=20) as ws:

            def recv() -> dict[str, Any]:
                return json.loads(ws.recv(timeout=30))

            def chat(request_id: str, text: str, message_id: str) -> dict[str, Any]:
                payload = chat_body("ignored", text, message_id)
                init = {"method": "POST", "body": json.dumps(payload)}
                ws.send(
                    json.dumps(
                        {"type": "cf_agent_use_chat_request", "id": request_id, "init": init}
                    )
                )
                while True:  # up to the ask
                    frame = recv()
                    if frame["type"] == RESPONSE and frame["id"] == request_id and frame["body"]:
                        chunk = json.loads(frame["body"])
                        if chunk["type"] == "tool-approval-request":
                            return chunk

            def rest(request_id: str) -> list[dict[str, Any]]:
                chunks = []
                while True:
                    frame = recv()
                    if frame["type"] != RESPONSE or frame["id"] != request_id:
                        continue
                    if frame["body"] and not frame.get("error"):
                        chunks.append(json.loads(frame["body"]))
                    if frame["done"]:
                        return chunks

            for _ in range(3):  # identity, MCP servers, messages
                recv()
            # The hook refuses an anonymous answerer: this answer passes only because
            # the frame is answered as the connection's principal.
            ask = chat("req1", f"deploy {marks}", "u1")
            ws.send(
                json.dumps(
                    {
                        "type": "cf_agent_tool_approval",
                        "toolCallId": ask["toolCallId"],
                        "approved": True,
                    }
                )
            )
            chunks = rest("req1")
            assert [c["output"] for c in chunks if c["type"] == "tool-output-available"] == [
                "deployed"
            ]
            assert marks.read_text() == "deployed\n"
            decided = approval(base, "alice-5", ask["approvalId"])
            assert (decided["decision"], decided["answered_by"]) == ("once", "alice")

            # Refused by may_approve: the protocol's error frame, nothing written.
            ask = chat("req2", f"deploy {locked}", "u2")
            frame = {"type": "cf_agent_tool_approval", "toolCallId": ask["toolCallId"]}
            ws.send(json.dumps({**frame, "approved": True}))
            while True:
                refused = recv()
                if refused["type"] == RESPONSE and refused["id"] == ask["toolCallId"]:
                    break
            assert refused["error"] is True and "may not answer" in refused["body"]
            assert approval(base, "alice-5", ask["approvalId"])["status"] == "pending"
            # The hook refuses any answer to a locked deploy, a denial too: cancel it.
            r = answer(base, "alice-5", ask["approvalId"], {"decision": "deny"})
            assert r.status_code == 403
            ws.send(json.dumps({"type": "cf_agent_chat_request_cancel", "id": "req2"}))
            rest("req2")
            assert not locked.exists()
            assert Path(marks).read_text() == "deployed\n"
