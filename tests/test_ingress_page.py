"""The ingress's web chat page (issue 11, item 6) in a real browser: headless Chromium
(Debian's ``chromium`` package) driven by Playwright, against the ingress app on a
loopback port in front of real session actors. It sends, watches the answer stream
in, reloads mid-stream and sees the answer resume and complete, stops an answer, edits
and resends (a branch), rewinds and undoes it, renames and deletes a session,
approves and denies a tool call that asks, and saves screenshots to tests/artifacts/.

Needs ``/usr/bin/chromium`` and the ``playwright`` Python package (``.ci/browser``
installs both); without them the test fails, it is not skipped."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.ingress_support import ALICE

pytestmark = pytest.mark.ray

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
CHUNKS = 60  # at 0.1 s apiece: a 6 s answer, long enough to reload or stop mid-way
SHORT = {"chunks": 3}  # the tests of what the page does before and around a short answer
LAST = f"chunk{CHUNKS - 1}"
TIMEOUT = 30_000  # ms; the first turn also starts the agent's actor


@pytest.fixture(scope="module")
def browser() -> Any:
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"{CHROMIUM} is missing: this test needs Debian's chromium package "
            "(run .ci/browser, or apt-get install -y chromium)"
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(
            "the playwright Python package is missing (run .ci/browser, or pip install "
            "playwright; the browser is Debian's chromium, no `playwright install`)"
        )
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def stored(base: str, agent: str, sid: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{base}/agents/chat/{agent}/chat/{sid}/messages", headers=ALICE)
    assert r.status_code == 200, r.text
    return r.json()


def text_of(message: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for p in message["parts"] if p["type"] == "text")


def sessions(base: str, agent: str) -> dict[str, str]:
    r = httpx.get(f"{base}/agents/chat/{agent}/sessions", headers=ALICE)
    return {s["name"]: s["id"] for s in r.json()["sessions"]}


def test_the_chat_page_in_a_browser(ingress_apps, browser):
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT)
    agent = "alice-web"
    ARTIFACTS.mkdir(exist_ok=True)
    with ingress_apps(agent_kwargs={"chunks": CHUNKS, "delay": 0.1}) as base:
        context = browser.new_context(viewport={"width": 1200, "height": 860})
        page = context.new_page()
        problems: list[str] = []
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.on(
            "console",
            lambda m: (
                problems.append(f"console: {m.text}")
                if m.type == "error" and "Failed to load resource" not in m.text
                else None
            ),
        )
        page.on("dialog", lambda d: d.accept())  # the delete confirmation
        net = NetLog(page)
        try:
            run_the_page(page, expect, base, agent)
        except BaseException:
            _explain(page, net)
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / "ingress_page_failure.png"), full_page=True)
            raise
        finally:
            context.close()
        assert problems == []


def run_the_page(page: Any, expect: Any, base: str, agent: str) -> None:
    # A token in the page's URL is remembered and taken out of the address bar.
    page.goto(f"{base}/?token=token-alice&agent={agent}")
    assert "token" not in page.url
    assert page.evaluate("localStorage.getItem('thinkray.page.token')") == "token-alice"
    expect(page.locator("#settings")).to_be_hidden()
    status = page.locator("#status")
    box = page.get_by_label("Message", exact=True)
    send = page.get_by_role("button", name="Send", exact=True)
    assistants = page.locator("li.msg.assistant")
    users = page.locator("li.msg.user")

    # 1. Send: the answer streams in (partial first, busy meanwhile), then completes.
    box.fill("hello")
    send.click()
    first = assistants.nth(0)
    expect(first).to_contain_text("chunk0")
    assert LAST not in first.inner_text()  # seen while it was still streaming
    expect(first.locator(".body")).to_have_attribute("aria-live", "polite")
    expect(status).to_have_attribute("data-state", "busy")
    expect(first).to_contain_text(LAST)
    expect(first).to_have_attribute("data-state", "done")
    expect(status).to_have_attribute("data-state", "idle")
    sid = sessions(base, agent)["hello"]
    assert [text_of(m) for m in stored(base, agent, sid)][1].startswith("chunk0 chunk1")

    # 2. Reload mid-stream: the page resumes the run (still streaming) and completes it.
    box.fill("second")
    send.click()
    expect(assistants.nth(1)).to_contain_text("chunk3")
    page.reload()
    expect(assistants.nth(1)).to_have_attribute("data-state", "streaming")
    expect(assistants.nth(1)).to_contain_text(LAST)
    expect(assistants.nth(1)).to_have_attribute("data-state", "done")
    expect(assistants).to_have_count(2)
    expect(users).to_have_count(2)
    history = stored(base, agent, sid)
    assert text_of(history[3]) == "".join(f"chunk{i} " for i in range(CHUNKS))
    assert page.locator("li.msg.assistant .body").nth(1).inner_text().strip() == (
        text_of(history[3]).strip()
    )

    # 3. Stop: the answer ends where it was; the stored message is that partial answer.
    box.fill("third")
    send.click()
    third = assistants.nth(2)
    expect(third).to_contain_text("chunk2")
    page.get_by_role("button", name="Stop").click()
    expect(third.locator(".who")).to_contain_text("stopped")
    expect(third).to_have_attribute("data-state", "done")
    expect(status).to_have_attribute("data-state", "idle")
    partial = stored(base, agent, sid)[-1]
    assert partial["role"] == "assistant" and partial["metadata"]["status"] == "aborted"
    assert text_of(partial).startswith("chunk0") and LAST not in text_of(partial)
    assert third.locator(".body").inner_text().strip() == text_of(partial).strip()
    expect(page.get_by_role("button", name="Stop")).to_be_hidden()

    # 4. Edit and resend "second": a branch session with the edit, the original intact.
    users.nth(1).get_by_role("button", name="Edit and resend this message").click()
    page.get_by_label("Edited message").fill("second, edited")
    page.get_by_role("button", name="Send edit").click()
    expect(page.locator("#session-title")).to_have_text("hello (edit)")
    expect(users).to_have_count(2)
    expect(users.nth(1)).to_contain_text("second, edited")
    expect(assistants.nth(1)).to_contain_text(LAST)
    expect(assistants.nth(1)).to_have_attribute("data-state", "done")
    expect(page.locator("#sessions li")).to_have_count(2)
    named = sessions(base, agent)
    branch = named["hello (edit)"]
    original = stored(base, agent, named["hello"])
    assert [text_of(m) for m in original if m["role"] == "user"] == ["hello", "second", "third"]
    assert [text_of(m) for m in stored(base, agent, branch) if m["role"] == "user"] == [
        "hello",
        "second, edited",
    ]

    # 5. A tool call renders its name, input and output.
    box.fill("what is the weather in Paris")
    send.click()
    tool = page.locator("details.tool").first
    expect(tool).to_contain_text("get_weather")
    expect(tool).to_contain_text('"city": "Paris"')
    expect(tool).to_contain_text("light rain")
    expect(assistants.nth(2)).to_contain_text(LAST)
    expect(assistants.nth(2)).to_have_attribute("data-state", "done")
    expect(tool.locator(".badge")).to_have_text("done")
    page.screenshot(path=str(ARTIFACTS / "ingress_page.png"), full_page=True)

    # 6. Rewind in place: the message goes back into the box; "Undo rewind" restores.
    users.nth(2).get_by_role("button", name="Rewind to before this message").click()
    expect(users).to_have_count(2)
    expect(box).to_have_value("what is the weather in Paris")
    page.get_by_role("button", name="Undo rewind").click()
    expect(users).to_have_count(3)
    expect(page.get_by_role("button", name="Undo rewind")).to_be_hidden()
    box.fill("")

    # 7. Rename the branch, then delete it: the page falls back to the other session.
    page.get_by_role("button", name="Rename hello (edit)").click()
    page.get_by_label("New session name").fill("Paris branch")
    page.get_by_label("New session name").press("Enter")
    expect(page.locator("#session-title")).to_have_text("Paris branch")
    assert "Paris branch" in sessions(base, agent)
    page.get_by_role("button", name="Delete Paris branch").click()
    expect(page.locator("#sessions li")).to_have_count(1)
    expect(page.locator("#session-title")).to_have_text("hello")
    expect(users).to_have_count(3)
    expect(users.nth(1)).to_contain_text("second")
    assert list(sessions(base, agent)) == ["hello"]


def test_approving_and_denying_a_tool_call_on_the_page(ingress_apps, tmp_path, browser):
    """Issue 11 item 6 / issue 12 item 2: an ask shows Approve / Approve for session /
    Deny on its tool call; Approve runs the tool and the answer streams on; after a
    reload the ask still has its buttons, and Deny renders the call as denied."""
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT)
    agent = "alice-approve"
    marks, refused = tmp_path / "deployed", tmp_path / "refused"
    ARTIFACTS.mkdir(exist_ok=True)
    with ingress_apps(agent_cls="tests.agents:GuardedApprovalAgent", agent_kwargs={}) as base:
        context = browser.new_context(viewport={"width": 1200, "height": 860})
        page = context.new_page()
        problems: list[str] = []
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.on(
            "console",
            lambda m: (
                problems.append(f"console: {m.text}")
                if m.type == "error" and "Failed to load resource" not in m.text
                else None
            ),
        )
        net = NetLog(page)
        try:
            page.goto(f"{base}/?token=token-alice&agent={agent}")
            box = page.get_by_label("Message", exact=True)
            assistants = page.locator("li.msg.assistant")

            # 1. The ask: the tool call waits with its three buttons; nothing ran.
            box.fill(f"deploy {marks}")
            page.get_by_role("button", name="Send", exact=True).click()
            tool = assistants.nth(0).locator("details.tool")
            expect(tool.locator(".badge")).to_have_text("awaiting approval")
            approve = tool.get_by_role("button", name="Approve", exact=True)
            expect(approve).to_be_visible()
            expect(tool.get_by_role("button", name="Approve for session")).to_be_visible()
            expect(tool.get_by_role("button", name="Deny")).to_be_visible()
            page.screenshot(path=str(ARTIFACTS / "ingress_page_approval_ask.png"), full_page=True)
            assert not marks.exists()

            # 2. Approve: the tool runs once, its output renders, the answer completes.
            approve.click()
            expect(tool.locator(".badge")).to_have_text("done")
            expect(tool).to_contain_text("deployed")
            expect(assistants.nth(0)).to_contain_text("done: deployed")
            expect(assistants.nth(0)).to_have_attribute("data-state", "done")
            expect(tool.get_by_role("button", name="Approve", exact=True)).to_have_count(0)
            page.screenshot(path=str(ARTIFACTS / "ingress_page_approval.png"), full_page=True)
            assert marks.read_text() == "deployed\n"
            sid = sessions(base, agent)[f"deploy {marks}"[:40] + "\u2026"]
            [part] = [p for p in stored(base, agent, sid)[-1]["parts"] if "toolCallId" in p]
            assert part["state"] == "output-available"
            decided = httpx.get(
                f"{base}/agents/chat/{agent}/approvals/{part['approval']['id']}", headers=ALICE
            ).json()
            assert (decided["decision"], decided["answered_by"]) == ("once", "alice")

            # 3. A second ask survives a reload (its buttons come back), then Deny.
            box.fill(f"deploy {refused}")
            page.get_by_role("button", name="Send", exact=True).click()
            second = assistants.nth(1).locator("details.tool")
            expect(second.locator(".badge")).to_have_text("awaiting approval")
            page.reload()
            second = assistants.nth(1).locator("details.tool")
            deny = second.get_by_role("button", name="Deny")
            expect(deny).to_be_visible()
            deny.click()
            expect(second.locator(".badge")).to_have_text("denied")
            expect(second).to_contain_text("The call was denied.")
            expect(assistants.nth(1)).to_have_attribute("data-state", "done")
            expect(page.locator("#status")).to_have_attribute("data-state", "idle")
            assert not refused.exists()
            pending = httpx.get(f"{base}/agents/chat/{agent}/approvals", headers=ALICE).json()
            assert pending == {"approvals": []}
        except BaseException:
            _explain(page, net)
            with contextlib.suppress(Exception):
                page.screenshot(
                    path=str(ARTIFACTS / "ingress_page_approval_failure.png"), full_page=True
                )
            raise
        finally:
            context.close()
        assert problems == []


def test_a_wrong_token_disables_send_and_the_page_asks_for_nothing_missing(ingress_apps, browser):
    # Issue 26, item 16: after a refused token the page kept Send enabled, and it asked
    # for a favicon the ingress does not have (a 404 on every load).
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT)
    with ingress_apps(agent_kwargs=SHORT) as base:
        context = browser.new_context()
        page = context.new_page()
        missing: list[str] = []
        page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
        try:
            page.goto(f"{base}/?token=wrong-token&agent=alice-tok")
            expect(page.locator("#settings")).to_be_visible()  # asks for a token again
            expect(page.get_by_role("button", name="Send", exact=True)).to_be_disabled()
            page.get_by_label("Message", exact=True).fill("hello")
            expect(page.get_by_role("button", name="Send", exact=True)).to_be_disabled()
            # A good token enables it again.
            page.locator("#token").fill("token-alice")
            page.locator("#settings button[type=submit]").click()
            expect(page.get_by_role("button", name="Send", exact=True)).to_be_enabled()
        finally:
            context.close()
        assert missing == [], missing


def _page_state(page: Any) -> dict[str, Any]:
    """What the page shows besides the messages: its error and notice, status, session
    list and the state of its send button (for a failure's message)."""
    return page.evaluate(
        """() => ({
          error: document.getElementById("error").hidden ? null : document.getElementById("error-text").textContent,
          notice: document.getElementById("notice-text").textContent,
          status: document.getElementById("status-text").textContent,
          sessions: [...document.querySelectorAll("#sessions li")].map((li) => li.textContent),
          send_disabled: document.getElementById("send").disabled,
          input: document.querySelector("textarea, input[aria-label='Message']")?.value,
        })"""
    )


class NetLog:
    """The page's requests in order: when each was sent (seconds since the log began),
    its method and path, and how it ended (a status, "failed: ...", or pending): a
    failure's message says which request the page was still waiting for."""

    def __init__(self, page: Any) -> None:
        import time

        self._clock = time.monotonic
        self._began = self._clock()
        self.entries: list[dict[str, Any]] = []
        self._open: dict[int, dict[str, Any]] = {}
        page.on("request", self._sent)
        page.on("requestfinished", lambda r: self._ended(r, None))
        page.on("requestfailed", lambda r: self._ended(r, f"failed: {r.failure}"))

    def _sent(self, request: Any) -> None:
        from urllib.parse import urlsplit

        entry = {"at": round(self._clock() - self._began, 2), "request": request.method}
        entry["request"] += " " + urlsplit(request.url).path
        entry["ended"] = "pending"
        self._open[id(request)] = entry
        self.entries.append(entry)

    def _ended(self, request: Any, failure: str | None) -> None:
        entry = self._open.pop(id(request), None)
        if entry is None:
            return
        if failure is None:
            response = request.response()
            failure = str(response.status) if response is not None else "no response"
        entry["ended"] = f"{failure} after {self._clock() - self._began - entry['at']:.2f} s"


def _explain(page: Any, net: NetLog) -> None:
    """Print what the page showed and its requests (pytest shows a failed test's
    output): the page's own state, not only the locator that timed out."""
    with contextlib.suppress(Exception):
        print(f"page: {_page_state(page)}")
    for entry in net.entries:
        print(f"  {entry['at']:7.2f} s  {entry['request']}  -> {entry['ended']}")


def test_a_message_sent_before_the_first_session_list_arrives_stays_on_the_page(
    ingress_apps, browser
):
    """The page's first session list waits for the agent's wake; a message typed and
    sent meanwhile creates and opens its session. Found in a loaded suite run: when the
    first list came back after that, the page switched back to "New chat" with no
    sessions, detaching the answer's stream. Here the first list is held back until the
    sent message's session exists."""
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT)
    agent = "alice-race"
    with ingress_apps(agent_kwargs=SHORT) as base:
        context = browser.new_context()
        page = context.new_page()
        held: list[Any] = []

        def hold_first_list(route: Any) -> None:
            if route.request.method == "GET" and not held:
                # Asked before the send, so the server's answer is the empty list; it is
                # delivered below, late. (Playwright runs this handler when the test next
                # calls into it, which can be after the send: fetching the answer here
                # could already see the new session.)
                held.append(route)
            else:
                route.continue_()

        net = NetLog(page)
        page.route(f"**/agents/*/{agent}/sessions", hold_first_list)
        try:
            page.goto(f"{base}/?token=token-alice&agent={agent}")
            expect(page.locator("#status-text")).to_have_text("connecting\u2026")
            page.get_by_label("Message", exact=True).fill("hello early")
            page.get_by_role("button", name="Send", exact=True).click()
            try:
                expect(page.locator("li.msg.user")).to_have_count(1)
            except AssertionError:  # say what the page showed instead
                _explain(page, net)
                raise
            expect(page.locator("li.msg.assistant").first).to_have_attribute("data-state", "done")
            assert held, "the page never asked for its session list"
            assert len(sessions(base, agent)) == 1  # the message's session, made since
            held[0].fulfill(json={"sessions": []})  # the list from before the send, last
            page.wait_for_timeout(500)
            expect(page.locator("li.msg.user")).to_have_count(1)
            expect(page.locator("li.msg.user").first).to_contain_text("hello early")
            expect(page.locator("#sessions li.empty")).to_have_count(0)
        finally:
            context.close()


def test_a_message_typed_before_the_page_knows_its_agent_waits_in_the_box(ingress_apps, browser):
    """Found in a loaded suite run: Send was enabled before ``/page-config`` arrived, and
    a message sent then went to no agent (``/agents/undefined/...``); connecting cleared
    the error, and the text was gone, with no session. Until the page knows its agent
    and token, Send is disabled, Enter keeps the text in the box and nothing is asked
    of the agent; then the same text sends. Here ``/page-config`` is held back."""
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT)
    agent = "alice-cfg"
    with ingress_apps(agent_kwargs=SHORT) as base:
        context = browser.new_context()
        page = context.new_page()
        held: list[Any] = []
        net = NetLog(page)
        page.route("**/page-config", lambda route: held.append(route))
        try:
            page.goto(f"{base}/?token=token-alice&agent={agent}")
            for _ in range(600):  # the page's script asks for its config
                if held:
                    break
                page.wait_for_timeout(50)
            assert held, "the page never asked for /page-config"
            box = page.get_by_label("Message", exact=True)
            send = page.get_by_role("button", name="Send", exact=True)
            box.fill("hello early")
            expect(send).to_be_disabled()
            box.press("Enter")
            page.wait_for_timeout(300)
            expect(box).to_have_value("hello early")
            asked = [e["request"] for e in net.entries if "/agents/" in e["request"]]
            assert asked == [], asked
            held[0].continue_()
            expect(send).to_be_enabled()
            send.click()
            try:
                expect(page.locator("li.msg.user")).to_have_count(1)
            except AssertionError:
                _explain(page, net)
                raise
            expect(page.locator("li.msg.user").first).to_contain_text("hello early")
            expect(page.locator("li.msg.assistant").first).to_have_attribute("data-state", "done")
            assert not any("undefined" in e["request"] for e in net.entries), net.entries
        finally:
            context.close()
