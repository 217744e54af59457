"""The busy policy through Ray: messages sent while a turn runs, from several processes
at once (drivers using the handle, HTTP clients), and across a SIGKILL of the agent's
actor process: none lost, none answered twice."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from thinkray.runtime.errors import RunInterruptedError

from tests.helpers import kill_agent_process, start_driver, wait_until

pytestmark = pytest.mark.ray

SENDER = """
import json, sys, threading
from thinkray.actors import AgentNamespace
from thinkray.runtime.errors import ThinkrayError

ns = AgentNamespace.connect(sys.argv[1])
agent = ns.get(sys.argv[2])
session, prefix, count = sys.argv[3], sys.argv[4], int(sys.argv[5])
policy = sys.argv[6] if len(sys.argv) > 6 and sys.argv[6] != "-" else None
out = {}

def send(i):
    mid = f"{prefix}-{i}"
    message = {"id": mid, "role": "user", "parts": [{"type": "text", "text": f"{prefix} #{i}"}]}
    kwargs = {"session_id": session}
    if policy:
        kwargs["on_busy"] = policy
    try:
        r = agent.chat.remote(message, **kwargs).result(timeout_s=240)
        out[mid] = {"status": r.status, "text": r.text, "run_id": r.run_id,
                    "superseded_by": r.superseded_by, "steered_into": r.steered_into}
    except ThinkrayError as exc:
        out[mid] = {"error": type(exc).__name__, "detail": str(exc)}

threads = [threading.Thread(target=send, args=(i,)) for i in range(count)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("RESULT " + json.dumps(out))
"""


def _results(proc: Any) -> dict[str, Any]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    line = [x for x in out.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def _model_log(log: Path) -> list[str]:
    if not log.exists():
        return []
    return [line.split("\t", 2)[2] for line in log.read_text().splitlines()]


def _finals(history: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    current = None
    for m in history:
        if m["role"] == "user":
            current = m["id"]
            counts[current] = 0
        elif m["role"] == "assistant" and current is not None:
            status = (m.get("metadata") or {}).get("status")
            if status in ("completed", "aborted", "error"):
                counts[current] += 1
    return counts


def _reply_to(agent: Any, session: str, user_id: str) -> dict[str, Any] | None:
    """The stored assistant message answering ``user_id`` (None: none written yet)."""
    history = agent.get_history.remote(session).result()
    ids = [m["id"] for m in history]
    if user_id not in ids:
        return None
    after = history[ids.index(user_id) + 1 :]
    return after[0] if after and after[0]["role"] == "assistant" else None


def _reply_text(agent: Any, session: str, user_id: str) -> list[str]:
    """The text parts of the stored reply to ``user_id`` (none: no reply yet)."""
    reply = _reply_to(agent, session, user_id) or {"parts": []}
    return [p.get("text") for p in reply["parts"] if p["type"] == "text"]


def _setup(namespace_factory: Any, tmp_path: Path, cls: str) -> tuple[Any, Any, str, Path, Path]:
    from tests import midturn_agents

    gate, log = tmp_path / "gate", tmp_path / "model.log"
    ns = namespace_factory(
        getattr(midturn_agents, cls),
        agent_kwargs={"gate": str(gate), "log": str(log)},
        idle_timeout=None,
    )
    agent = ns.get("busy")
    session = agent.create_session.remote("s").result().id
    return ns, agent, session, gate, log


def _hold(agent: Any, session: str, log: Path) -> tuple[threading.Thread, dict[str, Any]]:
    """Start a turn that waits on the gate; return once the model is inside it."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = agent.chat.remote("hold on", session_id=session).result()
        except BaseException as exc:  # the test inspects it
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    wait_until(lambda: "hold on" in _model_log(log), timeout=60)
    return thread, outcome


def _senders(ray: Any, ns: Any, session: str, count: int, policy: str = "-") -> list[Any]:
    return [
        start_driver(ray, SENDER, ns.name, "busy", session, f"p{i}", str(count), policy)
        for i in range(3)
    ]


def _queue_len(agent: Any, session: str) -> int:
    return len(agent.get_status.remote(session).result().queue)


@pytest.mark.parametrize("cls", ["GateAgent"])
def test_queue_from_several_processes_answers_each_once_in_its_own_turn(
    namespace_factory, tmp_path, ray_local, cls
):
    ns, agent, session, gate, log = _setup(namespace_factory, tmp_path, cls)
    holder, held = _hold(agent, session, log)
    procs = _senders(ray_local, ns, session, 3)
    wait_until(lambda: _queue_len(agent, session) == 9, timeout=120)
    status = agent.get_status.remote(session).result()
    assert status.state == "busy" and len(status.queue) == 9
    gate.touch()
    results = {k: v for p in procs for k, v in _results(p).items()}
    holder.join(60)
    assert held["result"].status == "completed"
    assert len(results) == 9
    assert all(r["status"] == "completed" for r in results.values()), results
    assert all(r["text"] == f"re: {mid.replace('-', ' #')}" for mid, r in results.items())
    assert len({r["run_id"] for r in results.values()}) == 9  # each its own turn
    history = agent.get_history.remote(session).result()
    counts = _finals(history)
    assert all(counts[mid] == 1 for mid in results)
    seen = _model_log(log)
    assert sorted(seen) == sorted(["hold on", *(m.replace("-", " #") for m in results)])
    assert agent.get_status.remote(session).result().queue == []


def test_latest_from_several_processes_answers_only_the_newest(
    namespace_factory, tmp_path, ray_local
):
    ns, agent, session, gate, log = _setup(namespace_factory, tmp_path, "LatestAgent")
    holder, _ = _hold(agent, session, log)
    procs = _senders(ray_local, ns, session, 2)
    # Each arrival supersedes the one waiting before it: one waits at the end.
    wait_until(
        lambda: (
            sum(1 for m in agent.get_history.remote(session).result() if m["role"] == "user") == 1
            and _queue_len(agent, session) == 1
            and _superseded(agent) == 5
        ),
        timeout=120,
    )
    gate.touch()
    results = {k: v for p in procs for k, v in _results(p).items()}
    holder.join(60)
    answered = [m for m, r in results.items() if r["status"] == "completed"]
    dropped = {m: r for m, r in results.items() if r["status"] == "superseded"}
    assert len(answered) == 1 and len(dropped) == 5, results
    assert all(r["superseded_by"] in results for r in dropped.values())
    seen = _model_log(log)
    assert seen == ["hold on", answered[0].replace("-", " #")]  # the dropped never ran
    users = [m["id"] for m in agent.get_history.remote(session).result() if m["role"] == "user"]
    assert users[1:] == answered


def _superseded(agent: Any) -> int:
    rows = [agent.queued_message.remote(f"p{i}-{j}").result() for i in range(3) for j in range(2)]
    return sum(1 for r in rows if r is not None and r["status"] == "superseded")


def test_steer_from_several_processes_joins_the_running_turn(
    namespace_factory, tmp_path, ray_local
):
    ns, agent, session, gate, log = _setup(namespace_factory, tmp_path, "SteerAgent")
    holder, held = _hold(agent, session, log)
    procs = _senders(ray_local, ns, session, 2)
    wait_until(lambda: _queue_len(agent, session) == 6, timeout=120)
    gate.touch()
    results = {k: v for p in procs for k, v in _results(p).items()}
    holder.join(60)
    run = held["result"]
    assert run.status == "completed"
    assert all(r["steered_into"] == run.run_id for r in results.values()), results
    # One turn: the model's second call read all six, after its first step.
    seen = _model_log(log)
    assert seen[0] == "hold on" and len(seen) == 2
    answer = run.message
    steers = [p["data"]["message"]["id"] for p in answer["parts"] if p["type"] == "data-steer"]
    assert sorted(steers) == sorted(results)
    history = agent.get_history.remote(session).result()
    assert [m["role"] for m in history] == ["user", "assistant"]


def test_interrupt_from_several_processes_aborts_and_answers_each_once(
    namespace_factory, tmp_path, ray_local
):
    ns, agent, session, gate, log = _setup(namespace_factory, tmp_path, "InterruptAgent")
    holder, held = _hold(agent, session, log)
    procs = _senders(ray_local, ns, session, 1)
    results = {k: v for p in procs for k, v in _results(p).items()}
    holder.join(60)
    aborted = held["result"]
    assert aborted.status == "aborted" and aborted.text.startswith("partial ")
    # An interrupt aborts whatever runs when it arrives (another interrupt's turn too):
    # each message ends once, answered or aborted, and the last one is answered.
    assert all(r["status"] in ("completed", "aborted") for r in results.values()), results
    assert any(r["status"] == "completed" for r in results.values())
    history = agent.get_history.remote(session).result()
    counts = _finals(history)
    assert all(counts[mid] == 1 for mid in results)
    kept = [m for m in history if m["id"] == aborted.message_id][0]
    assert kept["metadata"]["status"] == "aborted"
    assert "".join(p.get("text", "") for p in kept["parts"]) == "partial "


HTTP_SENDER = """
import json, sys, threading
import httpx

base, path, chat_id, prefix, count = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
out = {}

def send(i):
    mid = f"{prefix}-{i}"
    body = {"id": chat_id, "trigger": "submit-message", "onBusy": "queue",
            "messages": [{"id": mid, "role": "user", "parts": [{"type": "text", "text": f"{prefix} #{i}"}]}]}
    chunks = []
    with httpx.stream("POST", base + path, json=body, timeout=240,
                      headers={"authorization": "Bearer token-alice"}) as r:
        if r.status_code != 200:
            out[mid] = {"http": r.status_code, "body": r.read().decode()}
            return
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[6:]
                chunks.append(data if data == "[DONE]" else json.loads(data))
    text = "".join(c.get("delta", "") for c in chunks if isinstance(c, dict) and c["type"] == "text-delta")
    out[mid] = {"http": 200, "text": text, "done": chunks[-1] == "[DONE]",
                "finish": any(isinstance(c, dict) and c["type"] == "finish" for c in chunks)}

threads = [threading.Thread(target=send, args=(i,)) for i in range(count)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("RESULT " + json.dumps(out))
"""


def test_queue_over_http_from_several_client_processes(ray_local, tmp_path):
    import httpx

    from tests.ingress_support import ALICE, chat_body, make_config, post_chat, serve_app

    gate, log = tmp_path / "gate", tmp_path / "model.log"
    config = make_config(
        str(tmp_path / "root"),
        f"mt-http-{tmp_path.name[-8:]}".replace("_", "-"),
        agent_cls="tests.midturn_agents:GateAgent",
        agent_kwargs={"gate": str(gate), "log": str(log)},
    )
    with serve_app(config) as base:
        path = "/agents/chat/alice-q/chat"
        # A bad policy is a 400 before anything is written.
        bad = httpx.post(
            f"{base}{path}", json={**chat_body("c1", "x", "bad"), "onBusy": "soon"}, headers=ALICE
        )
        assert bad.status_code == 400
        holder = threading.Thread(
            target=post_chat, args=(base, path, chat_body("c1", "hold on", "u-hold"), ALICE)
        )
        holder.start()
        wait_until(lambda: "hold on" in _model_log(log), timeout=60)
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    textwrap.dedent(HTTP_SENDER),
                    base,
                    path,
                    "c1",
                    f"h{i}",
                    "2",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(3)
        ]
        wait_until(lambda: _http_queue(base) == 6, timeout=120)
        gate.touch()
        results = {k: v for p in procs for k, v in _results(p).items()}
        holder.join(60)
        assert len(results) == 6
        for mid, r in results.items():
            assert r["http"] == 200 and r["done"] and r["finish"], r
            assert r["text"] == f"re: {mid.replace('-', ' #')}"
        stored = httpx.get(f"{base}{path}/c1/messages", headers=ALICE).json()
        counts = _finals(stored)
        assert all(counts[mid] == 1 for mid in results) and counts["u-hold"] == 1
        assert sorted(_model_log(log)) == sorted(
            ["hold on", *(m.replace("-", " #") for m in results)]
        )


def _http_queue(base: str) -> int:
    import httpx

    from tests.ingress_support import ALICE

    with httpx.stream(
        "GET", f"{base}/agents/chat/alice-q/sessions/c1/status", headers=ALICE, timeout=30
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                return len(json.loads(line[6:]).get("queue") or [])
    return -1


# -- across a SIGKILL of the agent's process ------------------------------------------------


def test_messages_queued_when_the_actor_is_killed_run_once_after_the_wake(
    namespace_factory, tmp_path, ray_local
):
    ns, agent, session, gate, log = _setup(namespace_factory, tmp_path, "GateAgent")
    holder, held = _hold(agent, session, log)
    procs = _senders(ray_local, ns, session, 2)
    wait_until(lambda: _queue_len(agent, session) == 6, timeout=120)
    old_pid = kill_agent_process(ns, "busy")
    holder.join(120)
    assert isinstance(held.get("error"), RunInterruptedError)  # the direct turn: as before
    # The senders' handles saw the actor die; each resends its message (same id) to
    # the woken agent, which follows or replays the queued message's one turn.
    results = {k: v for p in procs for k, v in _results(p).items()}
    assert ns.where("busy")["pid"] != old_pid
    assert len(results) == 6
    assert all(r.get("status") == "completed" for r in results.values()), results
    history = agent.get_history.remote(session).result()
    counts = _finals(history)
    assert all(counts[mid] == 1 for mid in results)
    seen = _model_log(log)
    for mid in results:  # none lost, none answered twice
        assert seen.count(mid.replace("-", " #")) == 1, seen
    assert agent.queued_messages.remote().result() == []


def test_a_queued_message_cut_off_mid_turn_is_run_again_and_answered_once(
    namespace_factory, tmp_path, ray_local
):
    ns, agent, session, gate, log = _setup(namespace_factory, tmp_path, "GateAgent")
    holder, _ = _hold(agent, session, log)
    second = {"id": "m-hold", "role": "user", "parts": [{"type": "text", "text": "hold two"}]}
    later = {"id": "m-later", "role": "user", "parts": [{"type": "text", "text": "later"}]}
    # Queued (the agent's policy), sent from this process one after the other: the queue
    # is FIFO by arrival, and two calls in flight at once may arrive in either order.
    refs = [agent.chat.remote(second, session_id=session)]
    wait_until(lambda: _queue_len(agent, session) == 1, timeout=60)
    refs.append(agent.chat.remote(later, session_id=session))
    wait_until(lambda: _queue_len(agent, session) == 2, timeout=60)
    agent.abort.remote(session).result()  # the first turn ends; "hold two" starts
    holder.join(60)
    wait_until(lambda: "hold two" in _model_log(log), timeout=60)
    assert agent.queued_message.remote("m-hold").result()["status"] == "running"
    # Kill once the reply's first words are durable, so that the crash cuts a partial
    # (the reply's row can be durable before its words: its text part starts empty).
    wait_until(lambda: _reply_text(agent, session, "m-hold") == ["partial "], timeout=60)
    old_pid = kill_agent_process(ns, "busy")
    # Nobody calls: the namespace wakes the agent by itself because messages were
    # queued, and the wake runs what the crash left: "hold two" again (it waits on
    # the gate), then "later".
    wait_until(lambda: _model_log(log).count("hold two") == 2, timeout=120)
    # The wake's own turn can reach the model before the directory records the bind
    # that started it: wait for that record, then compare processes.
    wait_until(lambda: ns.where("busy") is not None, timeout=60)
    assert ns.where("busy")["pid"] != old_pid
    gate.touch()
    outcomes = []
    for ref in refs:
        try:
            outcomes.append(ref.result(timeout_s=120).status)
        except RunInterruptedError:
            outcomes.append("interrupted")  # its turn had started: resend to follow it
    for message, outcome in zip((second, later), outcomes, strict=True):
        if outcome == "interrupted":
            assert agent.chat.remote(message, session_id=session).result().status == "completed"
    wait_until(lambda: not agent.queued_messages.remote().result(), timeout=60)
    history = agent.get_history.remote(session).result()
    counts = _finals(history)
    assert counts["m-hold"] == 1 and counts["m-later"] == 1
    statuses = [
        (m.get("metadata") or {}).get("status") for m in history if m["role"] == "assistant"
    ]
    # The first turn's partial was aborted; the partial the crash cut is kept and
    # marked, then the run again answers with a reply of its own.
    assert statuses == ["aborted", "interrupted", "completed", "completed"]
    cut = _reply_to(agent, session, "m-hold")
    assert cut is not None and cut["metadata"]["status"] == "interrupted"
    assert _reply_text(agent, session, "m-hold") == ["partial "]
    assert _model_log(log).count("later") == 1
    assert agent.queued_message.remote("m-hold").result()["status"] == "answered"


def test_queue_over_websocket_and_a_bad_policy_refused(ray_local, tmp_path):
    from tests.ingress_support import make_config, serve_app
    from tests.test_ingress_ws import (
        RESPONSE,
        chat_request,
        chunks_of,
        greeting,
        is_done,
        open_ws,
        read_until,
        text_of,
    )

    gate, log = tmp_path / "gate", tmp_path / "model.log"
    config = make_config(
        str(tmp_path / "root"),
        f"mt-ws-{tmp_path.name[-8:]}".replace("_", "-"),
        agent_cls="tests.midturn_agents:GateAgent",
        agent_kwargs={"gate": str(gate), "log": str(log)},
    )
    with serve_app(config) as base, open_ws(base, "alice-w") as ws:
        greeting(ws)
        ws.send(chat_request("r1", "hold on", "w1", onBusy="reject"))
        wait_until(lambda: "hold on" in _model_log(log), timeout=60)
        ws.send(chat_request("r2", "again", "w2", onBusy="reject"))
        seen = read_until(ws, is_done("r2"))
        refused = seen[-1]
        assert refused["error"] and "already has a run" in refused["body"]
        ws.send(chat_request("r3", "bogus", "w3", onBusy="someday"))
        seen += read_until(ws, is_done("r3"))
        bad = seen[-1]
        assert bad["error"] and "onBusy" in bad["body"]
        ws.send(chat_request("r4", "queued one", "w4", onBusy="queue"))
        gate.touch()
        frames = seen + read_until(ws, is_done("r4"))
        frames += [] if any(is_done("r1")(f) for f in frames) else read_until(ws, is_done("r1"))
        assert text_of(chunks_of(frames, "r1")) == "partial re: hold on"
        assert text_of(chunks_of(frames, "r4")) == "re: queued one"
        errors = [f["id"] for f in frames if f["type"] == RESPONSE and f.get("error")]
        assert errors == ["r2", "r3"]
    assert _model_log(log) == ["hold on", "queued one"]
