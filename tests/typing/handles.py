"""Checked by mypy in tests/test_remote_api.py: the handle carries the agents' signatures.

Lines marked ``# E: <code>`` must be reported with that error code; no other line may be.
"""

from __future__ import annotations

from thinkray.actors import AgentNamespace
from thinkray.runtime import Agent, ChatResult
from thinkray.runtime.chunks import is_data_chunk
from thinkray.storage.types import SessionInfo


def typed(ns: AgentNamespace[Agent]) -> None:
    agent = ns.get("alice")
    info: SessionInfo = agent.branch.remote("session", "message").result()
    result: ChatResult = agent.chat.remote("hi", session_id=info.id).result()
    print(result.text)
    agent.branch.remote("session", 3)  # E: arg-type
    agent.rewind.remote("session")  # E: call-arg
    wrong: int = agent.get_history.remote().result()  # E: assignment
    print(wrong)


async def typed_async(ns: AgentNamespace[Agent]) -> None:
    agent = ns.get("bob")
    count: int = await agent.message_count.remote()
    print(count)


def typed_stream(ns: AgentNamespace[Agent]) -> None:
    agent = ns.get("carol")
    for chunk in agent.stream_chat.remote("hi"):  # a stream method's remote() iterates chunks
        print(chunk["type"])
    agent.stream_chat.remote("hi").result()  # E: attr-defined


def chunks_narrow(ns: AgentNamespace[Agent]) -> None:
    agent = ns.get("dave")
    for chunk in agent.stream_chat.remote("hi"):
        if is_data_chunk(chunk):  # data-<name> chunks first: their type is no literal
            print(chunk["data"])
        elif chunk["type"] == "text-delta":
            print(chunk["delta"].upper())  # narrowed to the text-delta chunk
        elif chunk["type"] == "error":
            print(chunk["errorText"])
            print(chunk["delta"])  # E: typeddict-item


def not_remote(ns: AgentNamespace[Agent]) -> None:
    agent = ns.get("erin")
    agent.close.remote()  # E: union-attr
