"""Search over HTTP (issue 25, part 4): ``GET /agents/{agent}/{name}/search`` goes
through the same ownership dependency as every agent route, so another tenant's agent
is a 404 (never its hits), an unclaimed name is a 404 that claims nothing, and a bad
query is a 400 that changes nothing."""

from __future__ import annotations

import httpx
import pytest

from tests.ingress_support import ALICE, BOB, chat_body, make_config, post_chat, serve_app

pytestmark = pytest.mark.ray

_ids = iter(range(100_000))


@pytest.fixture
def base(ray_local, tmp_path):
    namespace = f"secsearch{next(_ids)}-{tmp_path.name[-10:]}".replace("_", "-")
    with serve_app(make_config(str(tmp_path / "root"), namespace)) as url:
        yield url


def start(base: str, name: str, headers: dict[str, str]) -> None:
    """Claim the agent and wake it, with time for a first actor on a loaded machine
    (``post_chat`` waits 30 s)."""
    r = httpx.post(
        f"{base}/agents/chat/{name}/sessions", json={"name": "first"}, headers=headers, timeout=300
    )
    assert r.status_code == 201, r.text


def search(base: str, name: str, headers: dict[str, str], **params: str) -> httpx.Response:
    return httpx.get(
        f"{base}/agents/chat/{name}/search", params=params, headers=headers, timeout=60
    )


def test_the_owner_finds_her_messages_across_sessions(base):
    start(base, "alice-s", ALICE)
    post_chat(base, "/agents/chat/alice-s/chat", chat_body("c1", "the zebra crossing", "u1"), ALICE)
    post_chat(base, "/agents/chat/alice-s/chat", chat_body("c2", "a zebra at the zoo", "u2"), ALICE)
    post_chat(base, "/agents/chat/alice-s/chat", chat_body("c2", "and a giraffe", "u3"), ALICE)
    r = search(base, "alice-s", ALICE, q="zebra")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["query"] == "zebra"
    hits = {h["message_id"]: h for h in body["hits"]}
    assert set(hits) == {"u1", "u2"}
    assert hits["u1"]["session_id"] == "c1" and hits["u2"]["session_id"] == "c2"
    assert hits["u1"]["role"] == "user" and "zebra" in hits["u1"]["snippet"]
    first, last = hits["u1"]["highlights"][0]
    assert hits["u1"]["snippet"][first:last] == "zebra"
    only = search(base, "alice-s", ALICE, q="zebra", session="c2", limit="5").json()
    assert [h["message_id"] for h in only["hits"]] == ["u2"]


def test_another_tenant_gets_404_and_never_the_hits(base, tmp_path):
    start(base, "alice-p", ALICE)
    start(base, "bob-p", BOB)
    post_chat(base, "/agents/chat/alice-p/chat", chat_body("c1", "private password", "u1"), ALICE)
    post_chat(base, "/agents/chat/bob-p/chat", chat_body("b1", "bob's own note", "v1"), BOB)
    for params in ({"q": "password"}, {"q": "password", "session": "c1"}):
        r = search(base, "alice-p", BOB, **params)
        assert r.status_code == 404, r.text
        assert "password" not in r.text and "u1" not in r.text
    # Bob's own agent holds nothing of Alice's, and Alice's session id is unknown there.
    assert search(base, "bob-p", BOB, q="password").json()["hits"] == []
    assert search(base, "bob-p", BOB, q="password", session="c1").status_code == 404
    # No credential: 401; an unclaimed name: 404, and searching it claims nothing.
    assert search(base, "alice-p", {}, q="password").status_code == 401
    assert search(base, "nobody-yet", BOB, q="password").status_code == 404
    assert not list((tmp_path / "root").rglob("nobody-yet*"))
    agents = httpx.get(f"{base}/agents/chat", headers=BOB, timeout=30).json()["agents"]
    assert "nobody-yet" not in str(agents)
    start(base, "nobody-yet", ALICE)  # the name was still free to claim


@pytest.fixture(scope="module")
def one_message(ray_local, tmp_path_factory):
    """An ingress whose agent ``alice-b`` holds one message, for every bad query (each
    then checks that the message is still the one hit: a bad query changed nothing,
    after all the queries before it too)."""
    root = tmp_path_factory.mktemp("bad-queries")
    namespace = f"secsearch{next(_ids)}-{root.name[-10:]}".replace("_", "-")
    with serve_app(make_config(str(root / "root"), namespace)) as url:
        start(url, "alice-b", ALICE)
        post_chat(url, "/agents/chat/alice-b/chat", chat_body("c1", "ok then", "u1"), ALICE)
        yield url


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({}, 400),
        ({"q": "   "}, 400),
        ({"q": "?!"}, 400),
        ({"q": "x" * 1001}, 400),
        ({"q": "ok", "limit": "abc"}, 400),
        ({"q": "ok", "limit": "0"}, 400),
        ({"q": "ok", "limit": "101"}, 400),
        ({"q": "ok", "session": "no-such-session"}, 404),
    ],
)
def test_bad_queries_are_clear_errors_and_change_nothing(one_message, params, status):
    base = one_message
    r = search(base, "alice-b", ALICE, **params)
    assert r.status_code == status, r.text
    assert r.json()["error"]["message"]
    assert [h["message_id"] for h in search(base, "alice-b", ALICE, q="ok").json()["hits"]] == [
        "u1"
    ]
