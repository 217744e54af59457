"""Seed 002 "System prompt assembly": normative section order, the instructions walk,
skills index, environment, tool catalog, and the digest on every assistant message."""

from __future__ import annotations

import hashlib
import re

import pytest
from thinkray.runtime import tool
from thinkray.runtime.agents.agent import Agent as _Agent
from thinkray.runtime.capabilities.prompt import (
    SECTION_TITLES,
    assemble_system_prompt,
    digest_of,
    find_project_instructions,
    parse_front_matter,
)
from thinkray.runtime.models.testing import ScriptedModel, reply
from thinkray.runtime.tools.workspace import LocalWorkspace


@tool
def search(query: str, limit: int = 5) -> str:
    """Search the web."""
    return query


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


class Agent(_Agent):
    manifest_prompt = "You are Ray, a careful coding agent."
    working_directory = "pkg/app"

    def get_workspace(self):
        return self._ws

    def get_tools(self):
        return {"search": search}

    def get_current_date(self):
        return "2025-01-02"


@pytest.fixture
def ws(store):
    workspace = LocalWorkspace(store.stores().workspace())
    workspace.write_file("AGENTS.md", "root agents")
    workspace.write_file("CONTEXT.md", "root context")
    workspace.write_file("pkg/CLAUDE.md", "pkg claude")
    workspace.write_file("pkg/app/AGENTS.md", "app agents")
    workspace.write_file("pkg/app/CLAUDE.md", "app claude")
    workspace.write_file("other/AGENTS.md", "not on the way")
    workspace.write_file(
        "skills/pdf/SKILL.md",
        "---\nname: pdf\ndescription: Fill and read PDF forms.\n---\nBODY-PDF",
    )
    workspace.write_file("skills/deploy/SKILL.md", "---\ndescription: 'Ship it'\n---\nBODY-DEPLOY")
    workspace.write_file("skills/notes.txt", "not a skill")
    return workspace


def make(store, ws, model=None, **attrs):
    agent = Agent(store, model=model or ScriptedModel([reply("ok")], model_id="m-1"))
    agent._ws = ws
    for key, value in attrs.items():
        setattr(agent, key, value)
    return agent


def headings(text: str) -> list[str]:
    return re.findall(r"^# (.+)$", text, flags=re.M)


async def test_sections_in_normative_order(store, ws):
    agent = make(store, ws)
    prompt = await agent.assemble_prompt()
    assert headings(prompt.text) == list(SECTION_TITLES)
    text = prompt.text
    order = [
        "You are Ray",
        "root agents",
        "app claude",
        "- deploy: Ship it",
        "- platform:",
        "## search",
    ]
    positions = [text.index(s) for s in order]
    assert positions == sorted(positions)
    assert text.startswith("# Agent\n\nYou are Ray, a careful coding agent.")


async def test_instructions_walk_outermost_to_innermost(store, ws):
    files = await find_project_instructions(ws, "pkg/app")
    assert [f.path for f in files] == [
        "AGENTS.md",
        "CONTEXT.md",
        "pkg/CLAUDE.md",
        "pkg/app/AGENTS.md",
        "pkg/app/CLAUDE.md",
    ]
    assert "not on the way" not in [f.content for f in files]
    # From the root only the root's files count.
    assert [f.path for f in await find_project_instructions(ws, "")] == ["AGENTS.md", "CONTEXT.md"]
    agent = make(store, ws, global_instructions="host rules")
    text = (await agent.assemble_prompt()).text
    section = text.split("# Project instructions")[1].split("# Skills")[0]
    assert [
        section.index(s) for s in ("host rules", "root agents", "pkg claude", "app agents")
    ] == (
        sorted(section.index(s) for s in ("host rules", "root agents", "pkg claude", "app agents"))
    )


async def test_missing_files_and_workspace_are_fine(store):
    bare = LocalWorkspace(store.stores().workspace("empty"))
    assert await find_project_instructions(bare, "no/such/dir") == []
    assert await find_project_instructions(None, "x") == []
    agent = make(store, None)
    prompt = await agent.assemble_prompt()
    assert headings(prompt.text) == ["Agent", "Environment", "Tools"]


async def test_skill_index_has_names_and_descriptions_not_bodies(store, ws):
    text = (await make(store, ws).assemble_prompt()).text
    skills = text.split("# Skills")[1].split("# Environment")[0]
    assert "- deploy: Ship it (skills/deploy/SKILL.md)" in skills
    assert "- pdf: Fill and read PDF forms. (skills/pdf/SKILL.md)" in skills
    assert "BODY" not in text and "notes" not in skills
    assert parse_front_matter("no front matter") == {}
    assert parse_front_matter("---\na: 1\nunclosed") == {}


async def test_environment_and_tool_catalog(store, ws):
    model = ScriptedModel([reply("ok")], model_id="m-1")
    model.variant = "thinking"
    agent = make(store, ws, model=model)
    text = (await agent.assemble_prompt({"search": search, "add": add})).text
    env = text.split("# Environment")[1].split("# Tools")[0]
    for line in (
        "- platform: ",
        "- workspace root: /",
        "- working directory: pkg/app",
        "- date: 2025-01-02",
        "- model: test/m-1",
        "- variant: thinking",
    ):
        assert line in env
    tools = text.split("# Tools")[1]
    assert tools.index("## add") < tools.index("## search")  # by name
    assert '"properties":{"a":{"type":"integer"},"b":{"type":"integer"}}' in tools
    assert "Search the web." in tools


def test_digest_stable_and_sensitive_to_every_section():
    base = dict(
        manifest="m",
        instructions=[],
        skills=[],
        environment={"date": "2025-01-01"},
        tools={"search": search},
    )
    one = assemble_system_prompt(**base)
    assert one.digest == assemble_system_prompt(**base).digest
    assert one.digest == hashlib.sha256(one.text.encode()).hexdigest() == digest_of(one.text)
    from thinkray.runtime.capabilities.prompt import InstructionFile, Skill

    variants = [
        dict(base, manifest="m2"),
        dict(base, instructions=[InstructionFile("AGENTS.md", "x")]),
        dict(base, skills=[Skill("s", "d", "skills/s/SKILL.md")]),
        dict(base, environment={"date": "2025-01-02"}),
        dict(base, tools={"search": search, "add": add}),
    ]
    digests = {assemble_system_prompt(**v).digest for v in variants}
    assert len(digests) == len(variants) and one.digest not in digests


async def test_digest_changes_when_a_workspace_file_changes(store, ws):
    agent = make(store, ws)
    first = (await agent.assemble_prompt()).digest
    assert (await agent.assemble_prompt()).digest == first
    ws.write_file("pkg/app/AGENTS.md", "app agents, edited")
    assert (await agent.assemble_prompt()).digest != first


async def test_each_assistant_message_stores_the_digest(store, ws):
    model = ScriptedModel([reply("one"), reply("two")], model_id="m-1")
    agent = make(store, ws, model=model)
    first = await agent.chat("hi")
    sent = model.requests[0].system
    assert sent == agent.last_prompt.text
    assert first.message["metadata"]["system_prompt_digest"] == digest_of(sent)
    # Turn-level tools passed to chat() are part of the catalog.
    second = await agent.chat("again", tools={"add": add})
    assert "## add" in model.requests[1].system
    assert second.message["metadata"]["system_prompt_digest"] == digest_of(model.requests[1].system)
    stored = agent.get_history()
    assert [m["metadata"]["system_prompt_digest"] for m in stored if m["role"] == "assistant"] == [
        digest_of(model.requests[0].system),
        digest_of(model.requests[1].system),
    ]
    assert stored[1]["metadata"]["usage"]  # the turn's own metadata is kept alongside


async def test_a_switched_turn_names_its_own_model_and_variant(store, ws):
    """Issue 9 item 13: the user picks another model with a thinking variant for one
    turn. The prompt that turn sends names that model and variant (not the agent's
    default), the digest on its answer is of that prompt, and the next turn, with the
    model carried forward but no variant, says so too."""
    default = ScriptedModel([reply("from default")], model_id="m-1", loop=True)
    big = ScriptedModel([reply("from big")], model_id="big", loop=True)
    agent = make(store, ws, model=default, models={"big": big})
    selection = {"provider_id": "test", "model_id": "big", "variant": "thinking"}
    switched = await agent.chat(
        {
            "id": "u-switch",
            "role": "user",
            "metadata": selection,
            "parts": [{"type": "text", "text": "think hard"}],
        }
    )
    assert switched.text == "from big" and default.requests == []
    sent = big.requests[0].system
    env = sent.split("# Environment")[1].split("# Tools")[0]
    assert "- model: test/big" in env and "- variant: thinking" in env
    assert "m-1" not in env
    assert switched.message["metadata"]["system_prompt_digest"] == digest_of(sent)

    plain = await agent.chat("and now plainly")
    again = big.requests[1].system
    env = again.split("# Environment")[1].split("# Tools")[0]
    assert "- model: test/big" in env and "variant" not in env
    assert plain.message["metadata"]["system_prompt_digest"] == digest_of(again) != digest_of(sent)
