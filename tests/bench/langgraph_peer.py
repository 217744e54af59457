"""W1 and W2 on the peer: LangGraph 1.x with its SQLite checkpointer (issues 10, 22).

The program a LangGraph user would write for the workload: a ``StateGraph`` over
``MessagesState`` with a model node and the prebuilt ``ToolNode`` routed by
``tools_condition``, compiled with a checkpointer on a SQLite file; tokens are read
with ``stream_mode="messages"``. The fake chat model follows W1 exactly as
:mod:`tests.bench.workloads` does for thinkray: 200 text chunks a turn,
on every 5th turn a ``lookup`` tool call first (then the 200 chunks), and 50 chunks
after the tool result, with no delay between chunks. For W2 (:class:`W2ChatModel`) it
follows W2's timing as :func:`tests.bench.workloads.w2_model` does: the first chunk
``first`` seconds after the request, ``chunks`` chunks evenly over ``span`` seconds,
no tool.

- Sequential turns: the sync API (``graph.stream`` with ``SqliteSaver``) and the async
  one (``graph.astream`` with ``AsyncSqliteSaver``), one session (``thread_id``) per
  turn at a time.
- Concurrent sessions: asyncio, ``AsyncSqliteSaver`` (one aiosqlite connection, as
  ``from_conn_string`` makes it) shared by every session of one graph; each session
  takes its turns in order, all sessions at once (W2 is such a run with the W2
  model). ``SqliteSaver`` is documented as not meant for threads, so threads are not
  used.

Every session of a run shares one SQLite file (the idiomatic setup: one checkpointer,
a ``thread_id`` per conversation); the storage figures come from a run with a single
session in a file of its own.

This module imports nothing from thinkray: ``tests/bench/w1.py`` runs it in a child
process loaded from its file (``tests.bench.w1.PEER_LOADER``), so the peer's CPU
and memory figures are its own. ``main`` takes a JSON spec and prints a JSON result on
its last line.
"""

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    ToolMessage,
)
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

__all__ = [
    "W1ChatModel",
    "W2ChatModel",
    "build_graph",
    "lookup",
    "main",
    "run_async",
    "sequential_sync",
]


@tool
def lookup(query: str) -> dict:
    """A trivial tool: echoes the query with a fixed hit count."""
    return {"query": query, "hits": 3}


class W1ChatModel(BaseChatModel):
    """The W1 fake chat model: streams ``chunks`` text chunks a turn; every
    ``tool_every``-th turn (counted by human messages) a ``lookup`` call comes first;
    after a tool result, ``after_tool`` chunks. No delay between chunks."""

    chunks: int = 200
    after_tool: int = 50
    tool_every: int = 5

    @property
    def _llm_type(self) -> str:
        return "w1-fake"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> "W1ChatModel":
        """The script decides when to call ``lookup``: binding changes nothing."""
        return self

    def _plan(self, messages: list[BaseMessage]) -> list[AIMessageChunk]:
        if messages and isinstance(messages[-1], ToolMessage):
            return [AIMessageChunk(content=f"w{i} ") for i in range(self.after_tool)]
        turn = sum(1 for m in messages if isinstance(m, HumanMessage))
        out: list[AIMessageChunk] = []
        if turn % self.tool_every == 0:
            call = tool_call_chunk(
                name="lookup",
                args=json.dumps({"query": f"turn {turn}"}),
                id=f"call_{uuid.uuid4().hex[:12]}",
                index=0,
            )
            out.append(AIMessageChunk(content="", tool_call_chunks=[call]))
        out.extend(AIMessageChunk(content=f"w{i} ") for i in range(self.chunks))
        out.append(
            AIMessageChunk(
                content="",
                usage_metadata={"input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
            )
        )
        return out

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        merged = self._plan(messages)
        message = merged[0]
        for chunk in merged[1:]:
            message = message + chunk
        full = AIMessage(
            content=message.content,
            tool_calls=message.tool_calls,
            usage_metadata=message.usage_metadata,
        )
        return ChatResult(generations=[ChatGeneration(message=full)])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        for chunk in self._plan(messages):
            yield ChatGenerationChunk(message=chunk)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        for chunk in self._plan(messages):
            # Yield to the loop between chunks, as a real stream (and thinkray's) does.
            await asyncio.sleep(0)
            yield ChatGenerationChunk(message=chunk)


class W2ChatModel(BaseChatModel):
    """The W2 fake chat model: the first text chunk ``first`` seconds after the request,
    ``chunks`` text chunks evenly over ``span`` seconds (scheduled against the request,
    so a late loop does not stretch the stream), the step ending at ``first + span``.
    No tool calls."""

    first: float = 0.5
    span: float = 4.0
    chunks: int = 200

    @property
    def _llm_type(self) -> str:
        return "w2-fake"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> "W2ChatModel":
        """W2 never calls a tool: binding changes nothing."""
        return self

    def _offsets(self) -> list[float]:
        gap = self.span / self.chunks
        return [self.first + i * gap for i in range(self.chunks)]

    def _usage(self) -> AIMessageChunk:
        usage = {"input_tokens": 10, "output_tokens": self.chunks, "total_tokens": 10 + self.chunks}
        return AIMessageChunk(content="", usage_metadata=usage)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        time.sleep(self.first + self.span)
        text = "".join(f"w{i} " for i in range(self.chunks))
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text))])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        start = time.monotonic()
        for i, offset in enumerate(self._offsets()):
            time.sleep(max(0.0, start + offset - time.monotonic()))
            yield ChatGenerationChunk(message=AIMessageChunk(content=f"w{i} "))
        time.sleep(max(0.0, start + self.first + self.span - time.monotonic()))
        yield ChatGenerationChunk(message=self._usage())

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        start = time.monotonic()
        for i, offset in enumerate(self._offsets()):
            await asyncio.sleep(max(0.0, start + offset - time.monotonic()))
            yield ChatGenerationChunk(message=AIMessageChunk(content=f"w{i} "))
        await asyncio.sleep(max(0.0, start + self.first + self.span - time.monotonic()))
        yield ChatGenerationChunk(message=self._usage())


def build_graph(model: BaseChatModel, checkpointer: Any, *, is_async: bool) -> Any:
    """The W1 agent graph: model node, ``ToolNode``, ``tools_condition`` routing, compiled
    with ``checkpointer`` (an async model node for the async API)."""
    tools = [lookup]
    llm = model.bind_tools(tools)

    def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [llm.invoke(state["messages"])]}

    async def acall_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", acall_model if is_async else call_model)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=checkpointer)


def _expected(spec: dict[str, Any], turn: int) -> int:
    if spec.get("model") == "w2":
        return int(spec["w2_chunks"])
    extra = spec["after_tool"] if turn % spec["tool_every"] == 0 else 0
    return int(spec["chunks"]) + int(extra)


def _model(spec: dict[str, Any]) -> BaseChatModel:
    if spec.get("model") == "w2":
        return W2ChatModel(first=spec["w2_first"], span=spec["w2_span"], chunks=spec["w2_chunks"])
    return W1ChatModel(
        chunks=spec["chunks"], after_tool=spec["after_tool"], tool_every=spec["tool_every"]
    )


def _is_text(message: Any) -> bool:
    return (
        isinstance(message, AIMessageChunk)
        and isinstance(message.content, str)
        and bool(message.content)
    )


def _file_bytes(path: str) -> int:
    return sum(os.path.getsize(p) for p in (path, f"{path}-wal") if os.path.exists(p))


def _memory_kib() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for row in f:
            if row.startswith(("VmRSS:", "VmHWM:")):
                out[row.split(":")[0]] = int(row.split()[1])
    return out


def _check(spec: dict[str, Any], turn: int, texts: int, first: float | None) -> None:
    if first is None or texts != _expected(spec, turn):
        raise RuntimeError(
            f"LangGraph {spec.get('model', 'w1').upper()} turn {turn} streamed {texts} text chunks, "
            f"expected {_expected(spec, turn)}"
        )


def sequential_sync(spec: dict[str, Any], path: str) -> dict[str, Any]:
    """``sessions`` threads × ``turns`` turns, one turn at a time (round-robin), with the
    sync API; the first session's file size after each turn count in ``sizes_at``."""
    ttfc: list[float] = []
    latency: list[float] = []
    sizes: dict[int, int] = {}
    with SqliteSaver.from_conn_string(path) as saver:
        graph = build_graph(_model(spec), saver, is_async=False)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for turn in range(1, spec["turns"] + 1):
            for session in range(spec["sessions"]):
                config = {"configurable": {"thread_id": f"s{session}"}}
                inputs = {"messages": [HumanMessage(f"turn {turn}")]}
                first, texts = None, 0
                t0 = time.perf_counter()
                for message, _meta in graph.stream(inputs, config, stream_mode="messages"):
                    if _is_text(message):
                        if first is None:
                            first = time.perf_counter()
                        texts += 1
                t1 = time.perf_counter()
                _check(spec, turn, texts, first)
                assert first is not None
                ttfc.append(first - t0)
                latency.append(t1 - t0)
                if session == 0 and turn in spec.get("sizes_at", ()):
                    sizes[turn] = _file_bytes(path)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {"ttfc": ttfc, "latency": latency, "cpu": cpu, "wall": wall, "sizes": sizes}


async def _session(
    graph: Any,
    spec: dict[str, Any],
    session: str,
    ttfc: list[float],
    latency: list[float],
    first_ttfc: list[float],
    turn_of: list[int],
) -> None:
    config = {"configurable": {"thread_id": session}}
    for turn in range(1, spec["turns"] + 1):
        inputs = {"messages": [HumanMessage(f"turn {turn}")]}
        first, texts = None, 0
        t0 = time.perf_counter()
        async for message, _meta in graph.astream(inputs, config, stream_mode="messages"):
            if _is_text(message):
                if first is None:
                    first = time.perf_counter()
                texts += 1
        t1 = time.perf_counter()
        _check(spec, turn, texts, first)
        assert first is not None
        ttfc.append(first - t0)
        latency.append(t1 - t0)
        turn_of.append(turn)
        if turn == 1:
            first_ttfc.append(first - t0)


async def run_async(spec: dict[str, Any], path: str, *, concurrent: bool) -> dict[str, Any]:
    """The async API (``astream``, ``AsyncSqliteSaver``): ``sessions`` threads all at once
    (``concurrent``), else one session's turns after another."""
    ttfc: list[float] = []
    latency: list[float] = []
    first_ttfc: list[float] = []
    turn_of: list[int] = []
    async with AsyncSqliteSaver.from_conn_string(path) as saver:
        graph = build_graph(_model(spec), saver, is_async=True)
        names = [f"s{i}" for i in range(spec["sessions"])]
        cpu0, wall0 = time.process_time(), time.perf_counter()
        if concurrent:
            await asyncio.gather(
                *(_session(graph, spec, n, ttfc, latency, first_ttfc, turn_of) for n in names)
            )
        else:
            for n in names:
                await _session(graph, spec, n, ttfc, latency, first_ttfc, turn_of)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {
        "ttfc": ttfc,
        "latency": latency,
        "first_ttfc": first_ttfc,
        "turns": turn_of,
        "cpu": cpu,
        "wall": wall,
        "sizes": {},
    }


def main(argv: list[str]) -> int:
    """Run the phases of a JSON spec and print the results as JSON on the last line.

    The spec: ``root`` (a folder), W1's ``chunks``, ``after_tool`` and ``tool_every``,
    and ``phases``, each ``{"phase": "sync" | "async" | "concurrent", "sessions": n,
    "turns": n, "sizes_at": [turn, ...]}``; a phase with ``"model": "w2"`` (and
    ``w2_first``, ``w2_span``, ``w2_chunks``) runs W2's model instead of W1's. Each
    phase writes a SQLite file of its own; its result has per-turn ``ttfc`` and
    ``latency`` (and, for the async phases, ``first_ttfc``, each session's first turn,
    and ``turns``, the turn number of each figure), ``cpu`` and ``wall`` seconds,
    ``sizes`` (bytes by turn) and ``closed_bytes`` (the file after the saver closed).
    The process's ``VmRSS``/``VmHWM`` (KiB) come last, as ``memory_kib``."""
    spec = json.loads(argv[0])
    results = []
    for phase in spec["phases"]:
        run = {**spec, **phase}
        path = os.path.join(run["root"], f"langgraph-{run['phase']}-{uuid.uuid4().hex[:8]}.sqlite")
        if run["phase"] == "sync":
            result = sequential_sync(run, path)
        else:
            result = asyncio.run(run_async(run, path, concurrent=run["phase"] == "concurrent"))
        result["closed_bytes"] = _file_bytes(path)
        results.append(result)
    sys.stdout.write(json.dumps({"results": results, "memory_kib": _memory_kib()}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
