"""The ingress under load (issue 11, item 8): many concurrent SSE chat streams through
the HTTP ingress on this machine (loopback only), beside the same turns called on the
session actors directly (``ns.get(name).stream_chat.remote``) on the same agents.

    python tests/bench/bench_ingress.py [--streams 200] [--rounds 2] [--turns 1] [--agents 8]
        [--chunks 20] [--delay 0.01] [--via serve|direct|uvicorn] [--replicas 1] [--quick]
        [--placement dedicated|hosts]

Issue 22's row (200 streams, 200 chunks over 1 s of model time each, as ``thinkray
serve`` runs): ``--chunks 200 --delay 0.005 --placement hosts`` (and ``dedicated``).

Each of ``--streams`` clients has its own chat (session) on one of ``--agents`` agents
and runs one warm-up turn, then ``--turns`` measured turns back to back, all clients at
once (every turn a POST answered by the UI message stream, read to ``[DONE]``). Then
the same clients run the same turns against the actors directly. Prints chunks/s
through the ingress, TTFC (to the first text chunk) and turn latency p50/p95 both ways,
what the ingress adds, and errors (non-200, error chunks, streams without ``[DONE]``,
exceptions, clients unfinished at ``--timeout``), which must be 0: the exit code is 1
otherwise; and the CPU the server spends per relayed text chunk (the machine's busy CPU
over each phase minus this process's, whose clients read the streams).

``--via serve`` (default) goes through Ray Serve's proxy and ``--replicas`` replicas, as
``thinkray serve`` does; ``--via direct`` runs ``thinkray serve --direct``'s server (the
app under uvicorn, no Serve) in a process of its own; ``--via uvicorn`` runs the app in
this process, beside the clients (lighter). Under Serve it then measures Serve's own
floor: the same burst of clients against an app that does nothing but stream (first
write, and the server's CPU per request), so what Serve costs and what thinkray adds
read apart. This machine has 2 cores and is noisy: read medians and p95, compare ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import line, pct  # noqa: E402

# Issue 22, for 200 streams of 200 chunks over 1 s of model time (--chunks 200 --delay
# 0.005): first chunk through the ingress, and the CPU the whole server spends per text
# chunk it relays (ingress, agents, Ray: the machine's busy time minus the clients').
TARGET_TTFC = (0.5, 1.5)
TARGET_CPU_PER_CHUNK_MS = 0.3

TOKEN = "bench-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


@dataclass
class Phase:
    """What one way of calling (HTTP or direct) measured."""

    ttfc: list[float] = field(default_factory=list)
    turn: list[float] = field(default_factory=list)
    chunks: int = 0
    errors: list[str] = field(default_factory=list)
    wall: float = 0.0
    all_chunks: int = 0  # warm-up turns too: they are in the wall time
    all_turns: int = 0
    server_cpu: float = 0.0  # busy CPU-s of the machine minus this process's (the clients)


def user_message(text: str, message_id: str) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=200, help="concurrent clients (200)")
    parser.add_argument("--turns", type=int, default=1, help="measured turns per round (1)")
    parser.add_argument(
        "--rounds", type=int, default=2, help="rounds, each way in turn, order alternating (2)"
    )
    parser.add_argument("--agents", type=int, default=8, help="agents the chats spread over (8)")
    parser.add_argument("--chunks", type=int, default=20, help="text chunks per answer (20)")
    parser.add_argument("--delay", type=float, default=0.01, help="model delay per chunk, s")
    parser.add_argument("--via", choices=("serve", "direct", "uvicorn"), default="serve")
    parser.add_argument("--replicas", type=int, default=1, help="Serve replicas (--via serve)")
    parser.add_argument("--timeout", type=float, default=150.0, help="bound per phase, s")
    parser.add_argument("--root", help="storage root (default: a temp folder)")
    parser.add_argument(
        "--placement",
        choices=("dedicated", "hosts"),
        default="dedicated",
        help="the agents' placement: an actor each, or agent hosts (dedicated)",
    )
    parser.add_argument("--quick", action="store_true", help="50 streams, 1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.streams, args.rounds = min(args.streams, 50), 1
    return args


def machine_busy() -> float:
    """Busy CPU seconds of the whole machine since boot (``/proc/stat``)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values[:8]) - idle) / os.sysconf("SC_CLK_TCK")


# -- the two ways of running a turn ----------------------------------------------------


async def http_turn(client: Any, url: str, chat_id: str, message_id: str, out: Phase) -> None:
    """POST a chat turn and read its stream to ``[DONE]``; record it in ``out``."""
    body = {
        "id": chat_id,
        "messages": [user_message(f"turn {message_id}", message_id)],
        "trigger": "submit-message",
    }
    t0 = time.perf_counter()
    first: float | None = None
    chunks = 0
    done = False
    async with client.stream("POST", url, json=body, headers=AUTH) as r:
        if r.status_code != 200:
            out.errors.append(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
            return
        async for text in r.aiter_lines():
            if not text.startswith("data: "):
                continue
            data = text[6:]
            if data == "[DONE]":
                done = True
                continue
            chunk = json.loads(data)
            chunks += 1
            if chunk["type"] == "text-delta" and first is None:
                first = time.perf_counter()
            elif chunk["type"] == "error":
                out.errors.append(f"error chunk: {chunk.get('errorText')}")
    end = time.perf_counter()
    if not done or first is None:
        out.errors.append(f"stream of {chat_id} ended without [DONE] or text")
        return
    out.ttfc.append(first - t0)
    out.turn.append(end - t0)
    out.chunks += chunks


async def direct_turn(ns: Any, name: str, chat_id: str, message_id: str, out: Phase) -> None:
    """The same turn on the session actor: ``stream_chat.remote``, read to the end."""
    t0 = time.perf_counter()
    first: float | None = None
    chunks = 0
    stream = ns.get(name).stream_chat.remote(
        user_message(f"turn {message_id}", message_id), session_id=chat_id
    )
    async for chunk in stream:
        chunks += 1
        if chunk["type"] == "text-delta" and first is None:
            first = time.perf_counter()
        elif chunk["type"] == "error":
            out.errors.append(f"error chunk: {chunk.get('errorText')}")
    end = time.perf_counter()
    if first is None:
        out.errors.append(f"direct stream of {chat_id} had no text")
        return
    out.ttfc.append(first - t0)
    out.turn.append(end - t0)
    out.chunks += chunks


async def run_phase(
    args: argparse.Namespace,
    tag: str,
    turn: Any,
    out: Phase,
    round_: int,
    setup: Any = None,
) -> None:
    """``args.streams`` clients at once, each (in the first round: ``setup(name,
    chat_id)`` if given, and a warm-up turn, not measured) ``args.turns`` turns."""

    async def client(i: int) -> None:
        name, chat_id = f"agent-{i % args.agents}", f"{tag}-{i}"
        try:
            if round_ == 0:
                if setup is not None:
                    await setup(name, chat_id)
                await turn(name, chat_id, f"{chat_id}-w", warm)
            for t in range(args.turns):
                await turn(name, chat_id, f"{chat_id}-{round_}-{t}", measured)
        except Exception as exc:
            out.errors.append(f"{type(exc).__name__}: {exc}")

    warm, measured = Phase(), Phase()
    busy0, own0 = machine_busy(), time.process_time()
    tasks = [asyncio.create_task(client(i)) for i in range(args.streams)]
    t0 = time.perf_counter()
    done, pending = await asyncio.wait(tasks, timeout=args.timeout)
    out.wall += time.perf_counter() - t0
    out.server_cpu += (machine_busy() - busy0) - (time.process_time() - own0)
    for task in pending:
        task.cancel()
    if pending:
        out.errors.append(f"{len(pending)} clients unfinished after {args.timeout:.0f} s")
        await asyncio.gather(*pending, return_exceptions=True)
    out.ttfc += measured.ttfc
    out.turn += measured.turn
    out.chunks += measured.chunks
    out.all_chunks += warm.chunks + measured.chunks
    out.all_turns += len(warm.turn) + len(measured.turn)
    out.errors += warm.errors + measured.errors


# -- the ingress -----------------------------------------------------------------------


@contextlib.contextmanager
def ingress(args: argparse.Namespace, config: Any) -> Iterator[str]:
    """The ingress for ``config``, through Serve's proxy, served directly in a process of
    its own, or in-process uvicorn."""
    if args.via == "direct":
        with direct_ingress(config) as base:
            yield base
        return
    if args.via == "uvicorn":
        from tests.ingress_support import serve_app

        with serve_app(config) as base:
            yield base
        return
    from ray import serve
    from thinkray.actors.ingress.deploy import APP_NAME, ingress_app

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(ingress_app(config, args.replicas), name=APP_NAME, route_prefix="/")
        serve.run(floor_app(), name="floor", route_prefix="/floor")
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(Exception):
            serve.delete(APP_NAME)
        serve.shutdown()


@contextlib.contextmanager
def direct_ingress(config: Any) -> Iterator[str]:
    """``thinkray serve --direct``'s server (:func:`serve_direct`) in a process of its
    own joined to this Ray; stopped with SIGTERM, as the command is."""
    import multiprocessing

    import ray

    port = free_port()
    address = ray.get_runtime_context().gcs_address
    # spawn: a fork of a process connected to Ray is not safe
    process = multiprocessing.get_context("spawn").Process(
        target=_serve_direct, args=(address, config.model_dump_json(), port), daemon=True
    )
    process.start()
    try:
        deadline = time.monotonic() + 120
        while not _accepts(port):
            if not process.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the direct ingress did not start (exit {process.exitcode})")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.join(30)
        if process.is_alive():
            process.kill()


def _serve_direct(address: str, config_json: str, port: int) -> None:
    import ray
    from thinkray.actors.ingress.config import IngressConfig
    from thinkray.actors.ingress.deploy import serve_direct

    ray.init(address=address, log_to_driver=False)
    serve_direct(IngressConfig.model_validate_json(config_json), port=port)


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        return True
    return False


@contextlib.asynccontextmanager
async def browsers(args: argparse.Namespace) -> AsyncIterator[Callable[[str], Any]]:
    """A function giving each chat its own HTTP client (one connection), as each user's
    browser has its own: one shared client's pool of 200 connections cost its process
    a scan of the pool per request and response (httpcore), which saturated a core
    here and showed as the server's first-chunk latency."""
    import ssl

    import httpx

    clients: dict[str, Any] = {}
    tls = ssl.create_default_context()  # made once: httpx makes one per client otherwise

    def of(chat_id: str) -> Any:
        if chat_id not in clients:
            clients[chat_id] = httpx.AsyncClient(verify=tls, timeout=httpx.Timeout(args.timeout))
        return clients[chat_id]

    try:
        yield of
    finally:
        await asyncio.gather(*(c.aclose() for c in clients.values()), return_exceptions=True)


# Serve's own floor: the same burst against an app that does nothing but stream. Its
# writes: what a turn's stream made under this load (~20 a second: the actor's relay
# batches what the model produced while the previous write was out).
FLOOR_WRITES, FLOOR_PAUSE = 20, 0.05


def floor_app() -> Any:
    """A Serve app whose POST streams FLOOR_WRITES small SSE writes FLOOR_PAUSE apart."""
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse
    from ray import serve

    app = FastAPI()

    @serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1000)
    @serve.ingress(app)
    class Floor:
        @app.post("/", response_model=None)
        async def stream(self) -> Any:
            async def writes() -> AsyncIterator[str]:
                for i in range(FLOOR_WRITES):
                    yield f"data: {i}\n\n"
                    await asyncio.sleep(FLOOR_PAUSE)

            return StreamingResponse(writes(), media_type="text/event-stream")

    return Floor.bind()


async def measure_floor(args: argparse.Namespace, url: str) -> Phase:
    """``args.streams`` clients at once against the floor app, ``args.rounds`` times."""
    out = Phase()
    async with browsers(args) as browser:

        async def one(i: int) -> None:
            t0, first = time.perf_counter(), None
            async with browser(f"floor-{i}").stream("POST", url) as r:
                async for text in r.aiter_lines():
                    if text and first is None:
                        first = time.perf_counter() - t0
            if first is None:
                out.errors.append(f"floor stream {i}: no write")
            else:
                out.ttfc.append(first)

        for _ in range(args.rounds):
            busy0, own0 = machine_busy(), time.process_time()
            t0 = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(args.streams)))
            out.wall += time.perf_counter() - t0
            out.server_cpu += (machine_busy() - busy0) - (time.process_time() - own0)
            out.all_turns += args.streams
    return out


def report_floor(floor: Phase) -> None:
    print(
        f"Serve alone (the same burst, an app that only streams {FLOOR_WRITES} writes "
        f"{FLOOR_PAUSE * 1000:.0f} ms apart):"
    )
    line(
        "first write p50 / p95",
        f"{pct(floor.ttfc, 0.5) * 1000:.1f} / {pct(floor.ttfc, 0.95) * 1000:.1f} ms",
    )
    line("server CPU per request", f"{floor.server_cpu / floor.all_turns * 1000:.1f} ms")


def report(args: argparse.Namespace, http: Phase, direct: Phase) -> int:
    turns = args.streams * args.turns * args.rounds
    print(
        f"\n{args.streams} concurrent streams x {args.rounds} rounds x {args.turns} turns "
        f"(+1 warm-up each; {turns} measured turns per way, "
        f"{args.chunks} text chunks each, model delay {args.delay * 1000:.0f} ms/chunk), "
        f"{args.agents} agents ({args.placement}), via {args.via}"
        + (f" ({args.replicas} replica{'s' * (args.replicas > 1)})" if args.via == "serve" else "")
    )
    for label, phase in (("through the ingress (HTTP/SSE)", http), ("direct (actor)", direct)):
        print(f"{label}:")
        rate = phase.all_chunks / phase.wall if phase.wall else 0.0
        line("chunks/s", f"{rate:,.0f} ({phase.all_chunks:,} chunks in {phase.wall:.1f} s)")
        line("turns/s", f"{phase.all_turns / phase.wall if phase.wall else 0:.1f}")
        if phase.ttfc:
            p50, p95 = pct(phase.ttfc, 0.5), pct(phase.ttfc, 0.95)
            line(
                "TTFC p50 / p95",
                f"{p50 * 1000:.1f} / {p95 * 1000:.1f} ms",
                f"<= {TARGET_TTFC[0]} / {TARGET_TTFC[1]} s" if phase is http else "",
                (p50 <= TARGET_TTFC[0] and p95 <= TARGET_TTFC[1]) if phase is http else None,
            )
            line(
                "turn latency p50 / p95",
                f"{pct(phase.turn, 0.5) * 1000:.1f} / {pct(phase.turn, 0.95) * 1000:.1f} ms",
            )
        texts = phase.all_turns * args.chunks
        if texts:
            per_chunk = phase.server_cpu / texts * 1000
            line(
                "CPU per relayed text chunk (machine minus clients)",
                f"{per_chunk:.3f} ms ({phase.server_cpu:.1f} CPU-s / {texts:,})",
                f"<= {TARGET_CPU_PER_CHUNK_MS} ms" if phase is http else "",
                per_chunk <= TARGET_CPU_PER_CHUNK_MS if phase is http else None,
            )
        line("errors", str(len(phase.errors)), "0", not phase.errors)
        for error in phase.errors[:5]:
            print(f"    {error}")
    if http.ttfc and direct.ttfc:
        print("added by the ingress (HTTP minus direct):")
        for name, a, b in (
            ("TTFC", http.ttfc, direct.ttfc),
            ("turn latency", http.turn, direct.turn),
        ):
            line(
                f"{name} p50 / p95",
                f"{(pct(a, 0.5) - pct(b, 0.5)) * 1000:+.1f} / "
                f"{(pct(a, 0.95) - pct(b, 0.95)) * 1000:+.1f} ms",
            )
        ratio = (http.all_chunks / http.wall) / (direct.all_chunks / direct.wall)
        line("chunks/s, ingress / direct", f"{ratio:.2f}")
    return 1 if http.errors or direct.errors else 0


async def measure(args: argparse.Namespace, base: str, ns: Any) -> tuple[Phase, Phase]:
    http, direct = Phase(), Phase()
    async with browsers(args) as browser:

        async def via_http(name: str, chat_id: str, message_id: str, out: Phase) -> None:
            url = f"{base}/agents/chat/{name}/chat"
            await http_turn(browser(chat_id), url, chat_id, message_id, out)

        async def via_actor(name: str, chat_id: str, message_id: str, out: Phase) -> None:
            await direct_turn(ns, name, chat_id, message_id, out)

        async def new_session(name: str, chat_id: str) -> None:
            # What the ingress does on a chat's first message (ensure_session).
            await ns.get(name).create_session.remote("New Chat", session_id=chat_id)

        # One turn per agent first: the agents are live before anything is measured.
        await asyncio.gather(
            *(via_http(f"agent-{a}", "start", f"start-{a}", Phase()) for a in range(args.agents))
        )
        print(f"{args.agents} agents live", flush=True)
        for r in range(args.rounds):
            ways = [
                ("HTTP", "h", via_http, http, None),
                ("direct", "d", via_actor, direct, new_session),
            ]
            for label, tag, turn, out, setup in ways if r % 2 == 0 else ways[::-1]:
                print(f"round {r + 1}: {args.streams} clients, {label} ...", flush=True)
                await run_phase(args, tag, turn, out, r, setup)
    return http, direct


def run(args: argparse.Namespace) -> int:
    """The benchmark on the Ray this process is connected to (started if needed)."""
    from thinkray.actors.ingress.config import AgentRoute, IngressConfig
    from thinkray.actors.namespace import AgentNamespace

    from tests.agents import ScriptAgent
    from tests.bench._ray import start_local_ray

    start_local_ray()  # unless one runs (a test's)
    root = args.root or tempfile.mkdtemp(prefix="thinkray-bench-ingress-")
    name = f"bench-ingress-{os.getpid()}"
    options: dict[str, Any] = {
        "pool_size": 2,
        "max_live": max(64, args.agents + 4),
        "idle_timeout": None,
        "placement": args.placement,
    }
    kwargs = {"chunks": args.chunks, "delay": args.delay}
    # This process makes the namespace; the ingress attaches to it (the same agents).
    ns = AgentNamespace(
        name, ScriptAgent, storage_root=root, agent_kwargs=kwargs, detached=True, **options
    )
    config = IngressConfig(
        storage_root=root,
        agents={
            "chat": AgentRoute(
                agent_cls="tests.agents:ScriptAgent",
                namespace=name,
                agent_kwargs=kwargs,
                namespace_options=options,
            )
        },
        tokens={TOKEN: "bench"},
        slow_consumer_timeout=args.timeout,
    )
    print(f"thinkray ingress benchmark (storage root {root}, via {args.via})", flush=True)
    floor: Phase | None = None
    try:
        with ingress(args, config) as base:
            http, direct = asyncio.run(measure(args, base, ns))
            if args.via == "serve":
                floor = asyncio.run(measure_floor(args, f"{base}/floor/"))
    finally:
        with contextlib.suppress(Exception):  # the in-process ingress may have stopped it
            ns.shutdown()
    code = report(args, http, direct)
    if floor is not None:
        report_floor(floor)
    return code or (1 if floor is not None and floor.errors else 0)


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    raise SystemExit(main())
