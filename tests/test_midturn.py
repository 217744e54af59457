"""The busy policy without Ray: what a message sent while its session's turn runs does
(reject, queue, latest, steer, interrupt), its durable queue, and exactly-once by id."""

from __future__ import annotations

import asyncio

import pytest
from thinkray.runtime import SessionBusyError, Think, tool
from thinkray.runtime.agents.midturn import decide
from thinkray.runtime.errors import InvalidArgumentError
from thinkray.runtime.messages import new_id
from thinkray.runtime.models.base import ModelRequest
from thinkray.runtime.models.testing import (
    FunctionModel,
    ScriptedModel,
    last_user_text,
    pause,
    reply,
    tool_call,
)
from thinkray.runtime.turn.context import to_model_messages


def user(text: str, message_id: str | None = None) -> dict:
    return {
        "id": message_id or new_id("msg"),
        "role": "user",
        "parts": [{"type": "text", "text": text}],
    }


class Gated:
    """A model whose every step waits until the test opens a gate for it; each step
    answers "re: <last user text>". ``started`` fires as a step begins."""

    def __init__(self) -> None:
        self.gates: list[asyncio.Event] = []
        self.started: asyncio.Queue[int] = asyncio.Queue()
        self.seen: list[str] = []
        self.script: dict[int, object] = {}
        self.model = FunctionModel(self._step)

    def gate(self, step: int) -> asyncio.Event:
        while len(self.gates) <= step:
            self.gates.append(asyncio.Event())
        return self.gates[step]

    async def _step(self, request: ModelRequest, step: int) -> object:
        self.seen.append(last_user_text(request))
        self.started.put_nowait(step)
        await self.gate(step).wait()
        return self.script.get(step) or reply(f"re: {last_user_text(request)}")

    async def step_started(self) -> int:
        return await asyncio.wait_for(self.started.get(), 10)

    def open(self, *steps: int) -> None:
        for step in steps:
            self.gate(step).set()

    def open_all(self, upto: int = 50) -> None:
        self.open(*range(upto))


def user_texts(history: list[dict]) -> list[str]:
    return [
        "".join(p.get("text", "") for p in m["parts"] if p["type"] == "text")
        for m in history
        if m["role"] == "user"
    ]


def finals_per_user_message(history: list[dict]) -> dict[str, int]:
    """For each user message, how many final (completed/aborted/error) answers follow."""
    counts: dict[str, int] = {}
    current = None
    for m in history:
        if m["role"] == "user":
            current = m["id"]
            counts[current] = 0
        elif m["role"] == "assistant" and current is not None and _final(m):
            counts[current] += 1
    return counts


def _final(message: dict) -> bool:
    return (message.get("metadata") or {}).get("status") in ("completed", "aborted", "error")


# -- the policy (pure) ------------------------------------------------------------------


def test_decide_is_the_policy():
    free = {"running": False, "reserved": False, "waiting": 0, "has_message": True}
    for policy in ("reject", "queue", "latest", "steer", "interrupt"):
        assert decide(policy, **free) == "run"  # type: ignore[arg-type]
    busy = dict(free, running=True)
    assert decide("reject", **busy) == "reject"
    assert decide("queue", **busy) == "queue"
    assert decide("latest", **busy) == "latest"
    assert decide("steer", **busy) == "steer"
    assert decide("interrupt", **busy) == "interrupt"
    # Messages waiting but no run (between two turns): nothing to steer or interrupt.
    waiting = dict(free, waiting=1)
    assert decide("steer", **waiting) == "queue"
    assert decide("interrupt", **waiting) == "queue"
    assert decide("reject", **waiting) == "reject"
    # A rerun of the history brings no message: nothing to queue.
    assert decide("queue", **dict(busy, has_message=False)) == "reject"


# -- reject -----------------------------------------------------------------------------


async def test_reject_is_the_default(store):
    gated = Gated()
    agent = Think(store, model=gated.model)
    first = agent.start_chat("one")
    await gated.step_started()
    with pytest.raises(SessionBusyError):
        agent.start_chat("two")
    gated.open_all()
    assert (await first.task).status == "completed"
    assert user_texts(agent.get_history()) == ["one"]


async def test_unknown_policy_is_refused_before_anything_is_written(store):
    gated = Gated()
    agent = Think(store, model=gated.model)
    first = agent.start_chat("one")
    await gated.step_started()
    with pytest.raises(InvalidArgumentError, match="busy policy"):
        agent.start_chat("two", on_busy="later")  # type: ignore[arg-type]
    gated.open_all()
    await first.task
    assert user_texts(agent.get_history()) == ["one"]

    class Bad(Think):
        on_busy = "sometimes"  # type: ignore[assignment]

    with pytest.raises(InvalidArgumentError):
        Bad(store)


# -- queue ------------------------------------------------------------------------------


async def test_queue_runs_each_message_as_its_own_turn_in_order(store):
    gated = Gated()
    agent = Think(store, model=gated.model)
    first = agent.start_chat("one")
    await gated.step_started()
    second = agent.start_chat("two", on_busy="queue")
    third = agent.start_chat("three", on_busy="queue")
    status = agent.get_status()
    assert status.state == "busy"
    assert [e["run_id"] for e in status.queue] == [second.run_id, third.run_id]
    assert agent.queued_messages() == status.queue
    gated.open_all()
    results = [await first.task, await second.task, await third.task]
    assert [r.status for r in results] == ["completed"] * 3
    assert [r.text for r in results] == ["re: one", "re: two", "re: three"]
    assert gated.seen == ["one", "two", "three"]  # each its own turn, FIFO
    assert len({r.run_id for r in results}) == 3
    assert user_texts(agent.get_history()) == ["one", "two", "three"]
    assert agent.get_status().queue == []
    assert agent.queued_message(results[1].user_message_id)["status"] == "answered"


async def test_a_queued_stream_fills_once_its_turn_runs(store):
    gated = Gated()
    agent = Think(store, model=gated.model)
    first = agent.start_chat("one")
    await gated.step_started()
    second = agent.start_chat("two", on_busy="queue")
    assert second.stream.chunks == []  # waiting: nothing streamed yet
    gated.open_all()
    await second.task
    chunks = second.stream.chunks
    assert chunks[0] == {"type": "start", "messageId": second.stream.message_id}
    assert chunks[-1]["type"] == "finish"
    assert "".join(c.get("delta", "") for c in chunks) == "re: two"
    await first.task


async def test_a_resent_queued_message_is_answered_once(store):
    gated = Gated()
    agent = Think(store, model=gated.model)
    first = agent.start_chat("one")
    await gated.step_started()
    message = user("two")
    queued = agent.start_chat(message, on_busy="queue")
    again = agent.start_chat(message, on_busy="queue")  # the sender retries
    assert again.run_id == queued.run_id
    assert len(agent.queued_messages()) == 1
    gated.open_all()
    a, b = await queued.task, await again.task
    assert a.message_id == b.message_id and a.status == b.status == "completed"
    await first.task
    replayed = await agent.chat(message, on_busy="queue")  # answered: replayed, not run
    assert replayed.replayed and replayed.message_id == a.message_id
    assert gated.seen == ["one", "two"]
    assert finals_per_user_message(agent.get_history()) == {
        m["id"]: 1 for m in agent.get_history() if m["role"] == "user"
    }


async def test_resending_the_running_message_follows_its_turn(store):
    gated = Gated()
    agent = Think(store, model=gated.model)
    message = user("one")
    first = agent.start_chat(message)
    await gated.step_started()
    with pytest.raises(SessionBusyError):  # reject: as before
        agent.start_chat(message)
    follower = agent.start_chat(message, on_busy="queue")
    assert follower.run_id == first.run_id and agent.queued_messages() == []
    gated.open_all()
    assert (await follower.task).message_id == (await first.task).message_id
    assert gated.seen == ["one"]


async def test_abort_by_run_id_cancels_a_waiting_message(store):
    gated = Gated()
    agent = Think(store, model=gated.model)
    first = agent.start_chat("one")
    await gated.step_started()
    second = agent.start_chat("two", on_busy="queue")
    third = agent.start_chat("three", on_busy="queue")
    assert agent.abort(run_id=second.run_id, reason="never mind")
    cancelled = await second.task
    assert cancelled.status == "aborted" and cancelled.message is None
    assert [e["run_id"] for e in agent.get_status().queue] == [third.run_id]
    gated.open_all()
    await first.task
    assert (await third.task).text == "re: three"
    assert gated.seen == ["one", "three"]
    assert agent.queued_message(cancelled.user_message_id)["status"] == "cancelled"


async def test_clearing_the_session_cancels_what_waits(store):
    gated = Gated()
    agent = Think(store, model=gated.model)
    first = agent.start_chat("one")
    await gated.step_started()
    second = agent.start_chat("two", on_busy="queue")
    agent.clear_messages()
    assert (await second.task).status == "aborted"
    gated.open_all()
    await first.task
    assert gated.seen == ["one"]
    assert agent.get_status().queue == []


async def test_queued_messages_survive_hibernation_and_run_at_the_wake(tmp_path):
    path = tmp_path / "agent.duckdb"
    gated = Gated()
    agent = Think(path, model=gated.model)
    first = agent.start_chat("one")
    await gated.step_started()
    second = agent.start_chat(user("two", "msg-two"), on_busy="queue")
    third = agent.start_chat(user("three", "msg-three"), on_busy="queue")
    assert agent.has_pending_work()  # a host must not hibernate it idle
    agent.close()  # a forced hibernation: the turn in flight ends interrupted
    for run in (second, third):
        with pytest.raises(asyncio.CancelledError):
            await run.task
    with pytest.raises(asyncio.CancelledError):
        await first.task

    woken_model = Gated()
    woken_model.open_all()
    woken = Think(path, model=woken_model.model)
    assert [e["message_id"] for e in woken.queued_messages()] == ["msg-two", "msg-three"]
    assert woken.next_alarm_at() is not None  # a waker brings it back at once
    await woken.on_wake()
    # The sender resends after the wake (same id): it follows the queued turn.
    again = woken.start_chat(user("two", "msg-two"), on_busy="queue")
    result = await again.task
    assert result.text == "re: two"
    while woken.turns.runs or woken.queued_messages():
        await asyncio.sleep(0.01)
    assert woken_model.seen == ["two", "three"]
    history = woken.get_history()
    assert user_texts(history) == ["one", "two", "three"]
    counts = finals_per_user_message(history)
    assert counts["msg-two"] == counts["msg-three"] == 1
    woken.close()


# -- latest -----------------------------------------------------------------------------


async def test_latest_keeps_only_the_newest_waiting_message(store):
    gated = Gated()
    agent = Think(store, model=gated.model)
    agent.on_busy = "latest"
    first = agent.start_chat("one")
    await gated.step_started()
    b = agent.start_chat(user("blue", "msg-b"))
    c = agent.start_chat(user("green", "msg-c"))
    d = agent.start_chat(user("red", "msg-d"))
    assert [e["message_id"] for e in agent.get_status().queue] == ["msg-d"]
    for dropped, by in ((b, "msg-c"), (c, "msg-d")):
        result = await dropped.task
        assert result.status == "superseded" and result.superseded_by == by
        assert result.message is None
        assert dropped.stream.done
        assert dropped.stream.chunks[-1]["type"] == "data-superseded"
    gated.open_all()
    await first.task
    assert (await d.task).text == "re: red"
    assert gated.seen == ["one", "red"]  # the model never saw blue or green
    assert user_texts(agent.get_history()) == ["one", "red"]
    assert agent.queued_message("msg-b")["status"] == "superseded"
    # A resend of a superseded message is the same answer: never run.
    again = await agent.chat(user("blue", "msg-b"))
    assert again.status == "superseded" and again.superseded_by == "msg-c"
    assert gated.seen == ["one", "red"]


# -- steer ------------------------------------------------------------------------------


@tool
def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


class WithTool(Think):
    def get_tools(self):
        return {"lookup": lookup}


async def test_steer_reaches_the_model_before_its_next_call(store):
    gated = Gated()
    gated.script[0] = reply(tool_call("lookup", {"city": "Rome"}), finish_reason="tool-calls")
    agent = WithTool(store, model=gated.model)
    first = agent.start_chat("weather?")
    assert await gated.step_started() == 0
    steer = agent.start_chat(user("in Fahrenheit please", "msg-steer"), on_busy="steer")
    gated.open_all()
    result = await first.task
    steered = await steer.task
    assert result.status == "completed"
    assert steered.steered_into == first.run_id and steered.user_message_id == "msg-steer"
    assert steered.message_id == result.message_id
    second_request = gated.model.requests[1]
    assert last_user_text(second_request) == "in Fahrenheit please"
    # After the step's tool result, before the model's next call.
    roles = [m.role for m in second_request.messages]
    assert roles[-3:] == ["assistant", "tool", "user"]
    answer = result.message
    kinds = [p["type"] for p in answer["parts"]]
    assert "data-steer" in kinds
    assert kinds.index("data-steer") < len(kinds) - 1
    assert agent.queued_message("msg-steer")["status"] == "steered"
    # The stored history gives the model the same view on the next turn.
    history = agent.get_history()
    model_view = to_model_messages(history)
    assert any(m.role == "user" and m.content[0].text == "in Fahrenheit please" for m in model_view)
    # The steerer's stream follows the turn from its message on.
    assert steer.stream.chunks[0]["type"] == "data-steer"
    assert steer.stream.chunks[-1]["type"] == "finish"
    # Sent again (any policy, the session idle): that turn's answer, never a new turn.
    calls = len(gated.model.requests)
    again = await agent.chat(user("in Fahrenheit please", "msg-steer"))
    assert again.replayed and again.message_id == result.message_id
    assert len(gated.model.requests) == calls
    assert user_texts(agent.get_history()) == ["weather?"]


async def test_steer_on_the_last_step_makes_the_turn_go_on(store):
    gated = Gated()
    agent = Think(store, model=gated.model)
    first = agent.start_chat("tell me a story")
    await gated.step_started()
    steer = agent.start_chat("make it short", on_busy="steer")
    gated.open_all()
    result = await first.task
    assert (await steer.task).steered_into == first.run_id
    assert gated.seen == ["tell me a story", "make it short"]
    assert result.steps == 2 and result.text.endswith("re: make it short")


async def test_steer_that_finds_no_step_boundary_gets_its_own_turn(store):
    release = asyncio.Event()

    class Custom(Think):
        async def on_chat_message(self, options):
            yield {"type": "start"}
            await release.wait()
            yield {"type": "text-start", "id": "t"}
            yield {"type": "text-delta", "id": "t", "delta": "custom"}
            yield {"type": "text-end", "id": "t"}
            yield {"type": "finish"}

    agent = Custom(store)
    first = agent.start_chat("one")
    await asyncio.sleep(0)
    steer = agent.start_chat("two", on_busy="steer")
    release.set()
    await first.task
    result = await steer.task
    assert result.steered_into is None and result.status == "completed"
    assert result.run_id == steer.run_id
    assert user_texts(agent.get_history()) == ["one", "two"]


# -- interrupt --------------------------------------------------------------------------


async def wait_for(predicate, what: str) -> None:
    for _ in range(2000):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never happened: {what}")


async def test_interrupt_aborts_the_turn_keeps_its_partial_and_answers_next(store):
    model = ScriptedModel(
        [reply("partial ", pause(120), "never sent"), reply("re: urgent"), reply("re: queued")]
    )
    agent = Think(store, model=model)
    first = agent.start_chat("one")
    await wait_for(
        lambda: any(c["type"] == "text-delta" for c in first.stream.chunks), "a partial answer"
    )
    waiting = agent.start_chat("queued", on_busy="queue")
    urgent = agent.start_chat("urgent", on_busy="interrupt")
    aborted = await first.task
    assert aborted.status == "aborted"
    assert aborted.text == "partial "  # the partial is kept
    assert (await urgent.task).text == "re: urgent"
    assert (await waiting.task).text == "re: queued"
    assert [last_user_text(r) for r in model.requests] == ["one", "urgent", "queued"]
    history = agent.get_history()
    assert user_texts(history) == ["one", "urgent", "queued"]
    kept = [m for m in history if m["id"] == aborted.message_id][0]
    assert kept["metadata"]["status"] == "aborted"


# -- the store ---------------------------------------------------------------------------


def test_the_turn_queue_store_orders_claims_once_and_survives_a_reopen(tmp_path):
    from thinkray.storage.records import QueuedTurn
    from thinkray.storage.session_store import DuckDBSessionStore

    path = tmp_path / "q.duckdb"
    store = DuckDBSessionStore(path)
    assert store.stores().turn_queue(create=False) is None  # reading adds no table
    queue = store.stores().turn_queue()
    for mid, first in (("a", False), ("b", False), ("i1", True), ("c", False), ("i2", True)):
        row, created = queue.add(
            QueuedTurn(id=mid, session_id="s", message={"id": mid}), first=first
        )
        assert created
    again, created = queue.add(QueuedTurn(id="a", session_id="s", message={"id": "x"}))
    assert not created and again.message == {"id": "a"}  # the first write wins
    assert [r.id for r in queue.waiting("s")] == ["i1", "i2", "a", "b", "c"]
    assert [r.id for r in queue.move(["i1"], "running", attempts=1)] == ["i1"]
    assert queue.move(["i1"], "running", attempts=1) == []  # claimed once
    store.close()

    store = DuckDBSessionStore(path)
    queue = store.stores().turn_queue(create=False)
    assert queue is not None
    requeued, failed = queue.requeue_running(max_attempts=3)
    assert [r.id for r in requeued] == ["i1"] and failed == []
    queue.add(QueuedTurn(id="d", session_id="s", message={"id": "d"}))
    queue.add(QueuedTurn(id="i3", session_id="s", message={"id": "i3"}), first=True)
    assert [r.id for r in queue.waiting("s")] == ["i1", "i2", "i3", "a", "b", "c", "d"]
    for _ in range(3):
        queue.move(["b"], "running", only_from=("queued", "running"), attempts=1)
    requeued, failed = queue.requeue_running(max_attempts=3)
    assert [r.id for r in failed] == ["b"] and failed[0].outcome["status"] == "error"
    store.close()
