"""Durability on an object-store root (issue 21, items 9, 10 and 15), by doing it:
tests/durability_check.py's scenarios run in tests/two_node_check.py's cluster of two
raylets over a moto S3 server on loopback: one SIGKILLs a node's processes
mid-conversation, the other SIGSTOPs an owner until another node takes its session over."""

from __future__ import annotations

import pytest

from tests.helpers import round_of

pytest.importorskip("pyarrow")
pytest.importorskip("boto3")
pytest.importorskip("moto.server")

from thinkray.runtime import Think
from thinkray.runtime.agents.context import AgentContext
from thinkray.runtime.models.testing import ScriptedModel, reply

CITIES = ["Lima", "Oslo", "Quito"]  # tests/durability_check.py's acknowledged turns
N_TURNS = len(CITIES)


# -- the end-of-turn hook (runtime, no Ray) ----------------------------------------------


async def test_finish_goes_out_only_after_the_turn_is_made_durable(store, collector):
    seen = {}

    async def make_durable():
        # by now the turn's final persist is done and its finish is still held back
        seen["stored"] = [m["role"] for m in agent.get_history()]
        seen["status"] = agent.get_history()[-1]["metadata"]["status"]
        seen["sent"] = collector.types()

    agent = Think(
        store, model=ScriptedModel([reply("hi")]), context=AgentContext(make_durable=make_durable)
    )
    result = await agent.chat("hello", collector)
    assert result.status == "completed"
    assert seen["stored"] == ["user", "assistant"] and seen["status"] == "completed"
    assert "finish" not in seen["sent"]
    assert collector.types()[-1] == "finish" and collector.done == 1


async def test_a_turn_that_cannot_be_made_durable_is_an_error(store, collector):
    async def make_durable():
        raise OSError("the store is unreachable")

    agent = Think(
        store, model=ScriptedModel([reply("hi")]), context=AgentContext(make_durable=make_durable)
    )
    result = await agent.chat("hello", collector)
    assert result.status == "error"
    assert "not made durable" in (result.error or "")
    assert "finish" not in collector.types()
    assert collector.types()[-1] == "error" and collector.errors
    assert agent.get_status().state != "busy"


# -- two nodes, real processes -----------------------------------------------------------


@pytest.mark.ray
@pytest.mark.xdist_group("two-nodes")  # one worker: one cluster (tests/two_node_check.py)
def test_acknowledged_turns_survive_a_node_crash_and_run_once(two_node_report):
    report = round_of(two_node_report[0], "crash")
    assert report["statuses"] == ["completed"] * N_TURNS
    assert report["owner_node"] != report["taker_node"]
    cities = CITIES
    # every acknowledged turn is there, answered, in order; the turn cut off by the
    # crash was never acknowledged and may or may not be
    assert report["users"][:N_TURNS] == [f"weather in {c}" for c in cities]
    assert report["users"][N_TURNS:] in ([], ["weather in Lateville"])
    assert all(report["assistant_after_each"][:N_TURNS])
    assert all(report["tool_runs"][c] == 1 for c in cities)  # no tool ran twice
    assert report["refused_while_lease_live"] >= 1  # the taker waited the lease out


@pytest.mark.ray
@pytest.mark.xdist_group("two-nodes")
def test_a_paused_owner_is_fenced_out_by_the_takeover(two_node_report):
    report = round_of(two_node_report[0], "fence")
    assert report["a_statuses"] == ["completed"] * 2
    assert report["b_statuses"] == ["completed"] * 2
    assert report["nodes"][0] != report["nodes"][1]
    # the resumed owner's turn cannot be made durable: an error, never finish
    assert "error" in report["zombie_chunks"]
    assert "finish" not in report["zombie_chunks"]
    assert "StaleOwnerError" in report["zombie_hibernate"]
    assert report["row_after_refusal"] is None  # the refused hibernation wrote no row
    assert report["row_after_b"] == 8
    assert report["users"] == ["a says 0", "a says 1", "b says 0", "b says 1"]
    assert report["messages"] == 8
