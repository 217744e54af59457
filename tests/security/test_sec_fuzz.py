"""Fuzzing the ingress (issue 21, item 17; issue 26, items 12 and 13): the HTTP API from
its own OpenAPI schema with Schemathesis, the WebSocket with random and malformed frames
(Hypothesis), and the bodies built to break a parser. The server must answer no 5xx,
never hang, write nothing for a refused request and keep serving.

Bounded for CI: ``THINKRAY_FUZZ_EXAMPLES`` (default 12 per operation, 60 frames) sets the
size; ``python tests/fuzz_ingress.py`` runs the same tests longer."""

from __future__ import annotations

import json
import os
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from tests.ingress_support import ALICE, BOB, chat_body, make_config, post_chat, serve_app

pytestmark = pytest.mark.ray

EXAMPLES = int(os.environ.get("THINKRAY_FUZZ_EXAMPLES", "12"))
NAMES = ("fz-a", "fz-b")  # agents the fuzzer may bind: a few actors, not one per example

# Schemathesis and Hypothesis are imported by the tests that use them, not at collection:
# every xdist worker collects every module, and both packages are rewritten by pytest's
# assertion hook on import (their distributions are pytest plugins), ~2 s per worker.


def fuzz_settings(examples: int = EXAMPLES) -> Any:
    from hypothesis import HealthCheck, settings

    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


@pytest.fixture(scope="module")
def served(ray_local, tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    with serve_app(make_config(str(root / "root"), "fuzz-ns")) as base:
        yield base


def owned(base: str, headers: dict[str, str]) -> list[str]:
    r = httpx.get(f"{base}/agents/chat", headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    return sorted(r.json()["agents"])


def still_serves(base: str, name: str) -> None:
    events = post_chat(
        base, f"/agents/chat/{name}/chat", chat_body("after", "hello", os.urandom(6).hex()), ALICE
    )
    assert events[-1] == "[DONE]" and events[-2]["type"] == "finish", events[-3:]


def test_every_route_is_in_the_schema(served):
    paths = httpx.get(f"{served}/openapi.json", timeout=30).json()["paths"]
    assert "/agents/{agent}/{name}/chat" in paths
    assert "requestBody" in paths["/agents/{agent}/{name}/chat"]["post"]
    assert len(paths) >= 15


def test_the_http_api_fuzzed_from_its_schema_never_fails_or_writes_when_refusing(served):
    import schemathesis
    from hypothesis import given

    schema = schemathesis.openapi.from_url(f"{served}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15
    seen: list[str] = []

    for operation in operations:

        @fuzz_settings()
        @given(case=operation.as_strategy())
        def attack(case: Any) -> None:
            params = case.path_parameters or {}
            if "agent" in params:
                params["agent"] = "chat"
            if "name" in params:
                params["name"] = NAMES[len(json.dumps(case.body, default=str)) % 2]
            before = owned(served, ALICE)
            response = case.call(base_url=served, headers=ALICE, timeout=60)
            seen.append(f"{case.method} {response.status_code}")
            assert response.status_code < 500, (case.method, case.formatted_path, response.text)
            if response.status_code >= 400:  # refused: nothing claimed
                assert owned(served, ALICE) == before, (case.method, case.formatted_path)

        attack()
    assert any(s.endswith(" 400") or s.endswith(" 422") for s in seen)
    assert owned(served, BOB) == []  # nothing of alice's ever reached bob
    still_serves(served, NAMES[0])


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000,  # the parser itself recursed too deep: was a 500 (RecursionError)
        json.dumps(
            {"id": "c", "messages": [{"id": "m", "role": "user", "parts": [{"x": [[[[[]]]]]}]}]}
        )
        .replace("[[[[[]]]]]", "[" * 80 + "]" * 80)
        .encode(),
    ],
    ids=["brackets", "deep-part"],
)
def test_a_deeply_nested_body_is_a_400_and_writes_nothing(served, body):
    before = owned(served, ALICE)
    r = httpx.post(
        f"{served}/agents/chat/fz-deep/chat",
        content=body,
        headers={**ALICE, "content-type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "malformed_json"
    assert owned(served, ALICE) == before


def test_a_session_id_no_route_could_name_again_is_refused_before_any_claim(served):
    before = owned(served, ALICE)
    r = httpx.post(
        f"{served}/agents/chat/fz-nul/sessions", json={"id": "a\x00b"}, headers=ALICE, timeout=60
    )
    assert r.status_code == 400, r.text
    assert owned(served, ALICE) == before


def test_a_name_ending_in_a_newline_is_refused_over_http(served):
    before = owned(served, ALICE)
    r = httpx.post(
        f"{served}/agents/chat/nl-1%0A/chat",
        json=chat_body("c", "hi", "m-nl"),
        headers=ALICE,
        timeout=60,
    )
    assert r.status_code == 400, r.text
    assert owned(served, ALICE) == before


def frames() -> Any:
    """Text, bytes, random JSON, protocol-shaped frames and a parser bomb."""
    from hypothesis import strategies as st

    return st.one_of(
        st.text(max_size=200),
        st.binary(max_size=200),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=20),
            lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
            max_leaves=20,
        ).map(json.dumps),
        st.fixed_dictionaries(
            {
                "type": st.sampled_from(
                    [
                        "cf_agent_use_chat_request",
                        "cf_agent_chat_clear",
                        "cf_agent_chat_request_cancel",
                        "cf_agent_stream_resume_request",
                        "cf_agent_stream_resume_ack",
                        "cf_agent_chat_messages",
                    ]
                ),
                "id": st.text(max_size=10),
                "init": st.one_of(
                    st.none(),
                    st.fixed_dictionaries(
                        {"method": st.sampled_from(["POST", "GET"]), "body": st.text(max_size=60)}
                    ),
                ),
            }
        ).map(json.dumps),
        st.just("[" * 100_000),
    )


def test_random_and_malformed_frames_never_end_the_socket(served):
    url = "ws" + served[len("http") :] + f"/agents/chat/{NAMES[1]}"
    still_serves(served, NAMES[1])  # owned by alice, so the socket joins its fan-out
    from hypothesis import given

    with connect(url, additional_headers=ALICE, open_timeout=30, max_size=None) as ws:

        @fuzz_settings(EXAMPLES * 5)
        @given(frame=frames())
        def attack(frame: Any) -> None:
            ws.send(frame)

        attack()
        request = {
            "type": "cf_agent_use_chat_request",
            "id": "after-fuzz",
            "init": {
                "method": "POST",
                "body": json.dumps(
                    {
                        "messages": [
                            {
                                "id": os.urandom(6).hex(),
                                "role": "user",
                                "parts": [{"type": "text", "text": "still there?"}],
                            }
                        ],
                        "trigger": "submit-message",
                    }
                ),
            },
        }
        ws.send(json.dumps(request))
        while True:  # the socket still answers a good request to its end
            frame = json.loads(ws.recv(timeout=60))
            if frame.get("id") == "after-fuzz" and frame.get("done"):
                assert not frame.get("error"), frame
                break
    assert owned(served, BOB) == []
