"""The ``thinkray`` command line.

``thinkray demo`` starts a local Ray (or joins ``RAY_ADDRESS``), streams a two-turn
chat with a tool call from a session actor to the terminal, hibernates the actor,
wakes it and shows the history rebuilt from its DuckDB file. ``thinkray serve`` runs the
HTTP ingress (:mod:`thinkray.actors.ingress`) on Ray Serve, or with ``--direct`` under
uvicorn in its own process: the AI SDK chat stream, resume, sessions and the web chat
page, behind bearer tokens.
``thinkray sessions ls|show|export|rm`` and ``thinkray stats`` read the fleet index
(:mod:`thinkray.actors.fleet_cli`) without waking any agent. ``thinkray top`` shows the
live agents of a running cluster, refreshed (:mod:`thinkray.actors.top`). ``thinkray acp``
serves an agent to an editor over the Agent Client Protocol on stdio
(:mod:`thinkray.actors.acp_cli`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from thinkray.actors.ingress.config import IngressConfig
    from thinkray.runtime.chunks import UIChunk


def _print_chunk(chunk: UIChunk) -> None:
    from thinkray.runtime.chunks import is_data_chunk  # the CLI imports the runtime lazily

    if is_data_chunk(chunk):
        return
    if chunk["type"] == "text-delta":
        sys.stdout.write(chunk["delta"])
    elif chunk["type"] == "tool-input-available":
        sys.stdout.write(f"\n  [tool call] {chunk['toolName']}({json.dumps(chunk['input'])})\n")
    elif chunk["type"] == "tool-output-available":
        sys.stdout.write(f"  [tool result] {json.dumps(chunk['output'])}\n  ")
    elif chunk["type"] == "tool-output-error" or chunk["type"] == "tool-input-error":
        sys.stdout.write(f"\n  [tool error] {chunk['errorText']}\n")
    elif chunk["type"] == "error":
        sys.stdout.write(f"\n  [error] {chunk['errorText']}\n")
    sys.stdout.flush()


def _init_ray() -> None:
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
    else:
        # "local": a Ray of our own, never whichever other instance runs on the machine.
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)


def demo(args: argparse.Namespace) -> int:
    """``thinkray demo``: a two-turn chat streamed from a session actor, hibernate,
    wake, then a delegation to sub-agents. Storage goes to ``args.root``, else
    ``$THINKRAY_STORAGE_ROOT``, else this user's private data folder. Returns the exit code (0)."""
    from thinkray.actors.demo import DemoAgent
    from thinkray.actors.namespace import AgentNamespace
    from thinkray.storage.layout import default_storage_root

    root = args.root or os.environ.get("THINKRAY_STORAGE_ROOT") or str(default_storage_root("demo"))
    if os.environ.get("ANTHROPIC_API_KEY"):
        print("ANTHROPIC_API_KEY is set: the agent talks to Claude.")
    else:
        print("ANTHROPIC_API_KEY is not set: using the offline scripted model (no network).")
    print("Starting Ray ...", flush=True)
    started = time.perf_counter()
    _init_ray()
    ns = AgentNamespace("demo", DemoAgent, storage_root=root, pool_size=2, idle_timeout=None)
    print(f"Ray and a warm pool ready in {time.perf_counter() - started:.1f}s; storage: {root}")
    name = f"chat-{int(time.time())}"
    agent = ns.get(name)
    try:
        for prompt in ("What's the weather in Paris?", "Thanks! And what do you remember?"):
            print(f"\nuser> {prompt}\nassistant> ", end="", flush=True)
            stream = agent.stream_chat.remote(prompt)
            for chunk in stream:
                _print_chunk(chunk)
            print()
        where = ns.where(name) or {}
        print(f"\nSession {name!r} lives in actor pid {where.get('pid')}.")
        assert ns.hibernate(name), "hibernate refused"
        path = Path(root) / "demo" / f"{name}.duckdb"
        wal = path.with_name(path.name + ".wal")
        print(
            f"Hibernated: file closed ({path.stat().st_size // 1024} KiB, "
            f"wal left: {wal.exists()}); actor back in the warm pool."
        )
        t0 = time.perf_counter()
        history = agent.get_history.remote().result()
        print(
            f"Woke it with a call ({(time.perf_counter() - t0) * 1000:.0f} ms): "
            f"now in pid {(ns.where(name) or {}).get('pid')}. History rebuilt from DuckDB:"
        )
        for message in history:
            parts = []
            for p in message["parts"]:
                if p["type"] == "text":
                    parts.append(p["text"])
                elif p["type"] == "dynamic-tool":
                    parts.append(f"[{p['toolName']} → {p['state']}]")
            print(f"  {message['role']:>9}: {' '.join(parts)}")
        print(f"\nStatus: {agent.get_status.remote().result().state}.")
        _delegation_demo(root)
        print("\nDemo complete.")
    finally:
        ns.shutdown()
    return 0


_FINDINGS = "# Findings\n- Paris: light rain, 14°C\n- Tokyo: clear skies, 22°C\n- Lima: fog, 17°C\n"
_RESEARCHER_SCRIPT = {
    "provider": "script",
    "delay": 0.03,
    "steps": [
        [
            {"text": "Collecting the forecasts for three cities."},
            {
                "tool": "shared_write_file",
                "input": {"path": "notes/findings.md", "content": _FINDINGS},
            },
        ],
        [{"text": "Saved three findings to notes/findings.md for the team."}],
    ],
}
_REVIEWER_SCRIPT = {
    "provider": "script",
    "delay": 0.03,
    "steps": [
        [
            {"text": "Waiting for the researcher's notes."},
            {"tool": "shared_wait_for_file", "input": {"path": "notes/findings.md"}},
        ],
        [{"tool": "shared_read_file", "input": {"path": "notes/findings.md"}}],
        [{"text": "Summary: rain in Paris, sun in Tokyo, fog in Lima. Pack an umbrella."}],
    ],
}


def _delegation_demo(root: str) -> None:
    """An orchestrator delegates two tasks in parallel; both stream live; one writes a
    file to the shared workspace that the other waits for and reads."""
    import threading

    import ray
    from thinkray.actors.namespace import AgentNamespace
    from thinkray.actors.orchestrator import Orchestrator
    from thinkray.runtime.chunks import is_data_chunk

    print("\n--- Orchestrator: two sub-agents in parallel, one shared workspace ---")
    live = bool(os.environ.get("ANTHROPIC_API_KEY"))
    model = {"provider": "anthropic"} if live else None
    ns = AgentNamespace(
        "demo-orch", Orchestrator, storage_root=root, pool_size=1, idle_timeout=None
    )
    boss_name = f"boss-{int(time.time())}"
    boss = ns.get(boss_name)
    try:
        boss.create_subagent.remote(
            "researcher",
            {
                "model": model or _RESEARCHER_SCRIPT,
                "instructions": "Write your findings to the shared workspace with shared_write_file.",
            },
        ).result()
        boss.create_subagent.remote(
            "reviewer",
            {
                "model": model or _REVIEWER_SCRIPT,
                "instructions": "First call shared_wait_for_file, then read the file and summarize.",
            },
            access="read",
        ).result()
        tasks = {
            "reviewer": boss.delegate.remote(
                "reviewer",
                "Wait for notes/findings.md, read it and summarize it.",
                wait=False,
            ).result(),
            "researcher": boss.delegate.remote(
                "researcher",
                "Write weather findings for Paris, Tokyo and Lima to notes/findings.md.",
                wait=False,
            ).result(),
        }
        lock = threading.Lock()

        def watch(agent: str, task_id: str) -> None:
            line: list[str] = []

            def emit(text: str) -> None:
                with lock:
                    print(f"  [{agent:>10}] {text}", flush=True)

            def show(chunk: UIChunk) -> None:
                if is_data_chunk(chunk):
                    return
                if chunk["type"] == "text-delta":
                    line.append(chunk["delta"])
                elif chunk["type"] == "text-end" and line:
                    emit("".join(line).strip())
                    line.clear()
                elif chunk["type"] == "tool-input-available":
                    emit(f"→ {chunk['toolName']}({json.dumps(chunk['input'])[:60]})")
                elif chunk["type"] == "tool-output-available":
                    emit(f"← {json.dumps(chunk['output'])[:70]}")
                elif chunk["type"] == "tool-output-error" or chunk["type"] == "error":
                    emit(f"✗ {chunk['errorText']}")

            for chunk in boss.view_task.remote(task_id):
                show(chunk)

        threads = [threading.Thread(target=watch, args=(a, t.task_id)) for a, t in tasks.items()]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        for agent in tasks:
            status = boss.wait_task.remote(tasks[agent].task_id, 120).result()
            print(f"  {agent}: {status.status}")
        client = boss.shared_workspace.remote().result()
        content = ray.get(client.read_file("notes/findings.md"))
        print("  shared workspace, notes/findings.md (read back through the bridge):")
        for row in content.splitlines():
            print(f"    {row}")
    finally:
        with contextlib.suppress(Exception):
            AgentNamespace.connect(f"demo-orch.{boss_name}.subs").shutdown()
        ns.shutdown()


DEFAULT_AGENT = "chat=thinkray.actors.demo:DemoAgent"
"""``thinkray serve``'s agent class without ``--agent``: the demo's agent (Claude when
``ANTHROPIC_API_KEY`` is set, else an offline scripted model, so it runs anywhere)."""


def _pairs(values: list[str], what: str) -> list[tuple[str, str]]:
    """``key=value`` options as pairs (ValueError naming ``what`` for a bad one)."""
    out = []
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key.strip() or not rest.strip():
            raise ValueError(f"--{what} wants {what.upper()}=VALUE, got {value!r}")
        out.append((key.strip(), rest.strip()))
    return out


def serve_tokens(args: argparse.Namespace) -> tuple[dict[str, str], str | None]:
    """``thinkray serve``'s bearer tokens (token -> principal): ``--token-file``'s, else
    ``$THINKRAY_TOKENS``'s, else one generated for principal ``user`` (returned second,
    to print). Never from the command line, where ``ps`` shows it to every user of the
    machine: ``--token`` is refused. Raises ValueError."""
    import secrets

    from thinkray.actors.ingress.config import TOKENS_ENV, parse_token_pairs, read_tokens_file

    if getattr(args, "token", None):
        raise ValueError(
            "--token would show the token to anyone who can list processes (ps): put "
            f"PRINCIPAL=TOKEN lines in a file for --token-file, or set ${TOKENS_ENV}"
        )
    token_file = getattr(args, "token_file", None)
    if token_file:
        tokens = read_tokens_file(token_file)
        if not tokens:
            raise ValueError(f"--token-file {token_file!r} holds no PRINCIPAL=TOKEN line")
        return tokens, None
    tokens = parse_token_pairs(os.environ.get(TOKENS_ENV, ""), f"${TOKENS_ENV}")
    if tokens:
        return tokens, None
    generated = secrets.token_urlsafe(24)
    return {generated: "user"}, generated


def serve_config(args: argparse.Namespace) -> tuple[IngressConfig, str | None]:
    """The :class:`IngressConfig` of ``thinkray serve``'s options, and the token it
    generated (None when a file or the environment gave some). Raises ValueError for
    bad options."""
    from thinkray.actors.ingress.config import AgentRoute, IngressConfig
    from thinkray.storage.layout import default_storage_root

    root = (
        args.storage_root
        or os.environ.get("THINKRAY_STORAGE_ROOT")
        or str(default_storage_root("serve"))
    )
    agents = {}
    for slug, cls in _pairs(args.agent or [DEFAULT_AGENT], "agent"):
        if slug in agents:
            raise ValueError(f"--agent {slug!r} given twice")
        # The slug names the namespace too: a later `thinkray serve` finds its agents.
        agents[slug] = AgentRoute(agent_cls=cls, namespace=slug)
    tokens, generated = serve_tokens(args)
    from thinkray.storage.layout import normalize_root

    config = IngressConfig(
        # A local root made absolute (replicas open files from their own working
        # directory); an object-store URI (s3://bucket/prefix?...) kept as given.
        storage_root=normalize_root(root),
        agents=agents,
        tokens=tokens,
        cors_origins=list(args.cors_origin or []),
    )
    for route in config.agents.values():
        route.load_class()  # a clear error now rather than in a replica
    return config, generated


def serve(args: argparse.Namespace) -> int:
    """``thinkray serve``: the ingress on ``args.host:args.port`` through Ray Serve's
    proxy (``--direct``: under uvicorn in this process), until Ctrl-C or SIGTERM.
    Returns the exit code (2 for bad options, 1 when ``--direct`` cannot listen)."""
    import ray
    from pydantic import ValidationError
    from thinkray.actors.ingress.deploy import serve_direct, serve_local

    try:
        config, generated = serve_config(args)
    except (ValueError, ValidationError) as exc:
        print(f"thinkray serve: {exc}", file=sys.stderr)
        return 2
    if args.replicas < 1:
        print("thinkray serve: --replicas must be at least 1", file=sys.stderr)
        return 2
    if args.direct and args.replicas != 1:
        print("thinkray serve: --direct serves from this one process: no --replicas", file=sys.stderr)  # fmt: skip
        return 2
    if not os.environ.get("RAY_ADDRESS") and not ray.is_initialized():
        # Workers import `--agent module:Class` from here, as this process does. Through
        # the environment the raylet inherits, not a runtime_env: with one, Ray starts
        # every worker through a second Python (setup_worker.py) that imports half of
        # Ray first: +0.3-0.5 CPU-s on each actor's start here (bench_worker_start.py).
        path = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)
        os.environ["PYTHONPATH"] = path
        ray.init(
            address="local",  # our own Ray, never another instance on the machine
            include_dashboard=False,
            log_to_driver=False,
        )
    else:
        _init_ray()
    print(f"storage: {config.storage_root}")
    for slug, route in config.agents.items():
        print(f"agent class {slug!r}: {route.agent_cls} at /agents/{slug}/<name>/chat")
    if generated:
        print(f"no token configured: principal 'user' has bearer token {generated}")
    if args.direct:
        try:
            serve_direct(config, host=args.host, port=args.port)
        except OSError as exc:
            print(f"thinkray serve: {exc}", file=sys.stderr)
            return 1
    else:
        serve_local(config, host=args.host, port=args.port, replicas=args.replicas, blocking=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """The ``thinkray`` entry point: parse ``argv`` (default: ``sys.argv[1:]``), run the
    subcommand and return its exit code (argparse exits with 2 on a bad command line)."""
    parser = argparse.ArgumentParser(prog="thinkray", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_demo = sub.add_parser("demo", help="stream a chat through a session actor, hibernate, wake")
    p_demo.add_argument(
        "--root",
        help="storage root (default: $THINKRAY_STORAGE_ROOT, else ~/.local/share/thinkray/...)",
    )
    p_demo.set_defaults(func=demo)
    p_serve = sub.add_parser(
        "serve",
        help="the HTTP ingress (AI SDK chat stream, sessions, web page) on Ray Serve or --direct",
    )
    p_serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p_serve.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    p_serve.add_argument(
        "--storage-root",
        help="where agents' files live (default: $THINKRAY_STORAGE_ROOT, else ~/.local/share/thinkray/...)",
    )
    p_serve.add_argument(
        "--agent",
        action="append",
        metavar="SLUG=MODULE:CLASS",
        help=f"an agent class served at /agents/SLUG/<name> (repeatable; default {DEFAULT_AGENT})",
    )
    p_serve.add_argument(
        "--token-file",
        metavar="PATH",
        help="a file of PRINCIPAL=TOKEN lines (default: $THINKRAY_TOKENS, else one token "
        "generated and printed); tokens are never taken from the command line",
    )
    # Refused with a pointer to --token-file: argv is visible to every user (ps).
    p_serve.add_argument("--token", action="append", help=argparse.SUPPRESS)
    p_serve.add_argument("--replicas", type=int, default=1, help="ingress replicas (default 1)")
    p_serve.add_argument(
        "--direct",
        action="store_true",
        help="serve from this process under uvicorn, without Ray Serve's proxy and "
        "replicas: less CPU and latency per stream, one process (README, 'Serving')",
    )
    p_serve.add_argument(
        "--cors-origin",
        action="append",
        metavar="ORIGIN",
        help="a browser origin allowed to call it (repeatable; default: none)",
    )
    p_serve.set_defaults(func=serve)
    from thinkray.actors import fleet_cli

    fleet_cli.add_commands(sub)  # sessions ls|show|export|rm|compact, stats
    from thinkray.actors import top

    top.add_command(sub)  # top: the live view
    from thinkray.actors import acp_cli

    acp_cli.add_command(sub)  # acp: the Agent Client Protocol on stdio, for editors
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
