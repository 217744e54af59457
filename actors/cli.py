"""The ``thinkray`` command line.

``thinkray demo`` starts a local Ray (or joins ``RAY_ADDRESS``), streams a two-turn
chat with a tool call from a session actor to the terminal, hibernates the actor,
wakes it and shows the history rebuilt from its DuckDB file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _print_chunk(chunk: dict[str, Any]) -> None:
    t = chunk["type"]
    if t == "text-delta":
        sys.stdout.write(chunk["delta"])
    elif t == "tool-input-available":
        sys.stdout.write(f"\n  [tool call] {chunk['toolName']}({json.dumps(chunk['input'])})\n")
    elif t == "tool-output-available":
        sys.stdout.write(f"  [tool result] {json.dumps(chunk['output'])}\n  ")
    elif t in ("tool-output-error", "tool-input-error"):
        sys.stdout.write(f"\n  [tool error] {chunk['errorText']}\n")
    elif t == "error":
        sys.stdout.write(f"\n  [error] {chunk['errorText']}\n")
    sys.stdout.flush()


def _init_ray() -> None:
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
    else:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)


def demo(args: argparse.Namespace) -> int:
    from actors.namespace import AgentNamespace
    from runtime.demo import DemoAgent

    root = args.root or os.path.join(tempfile.gettempdir(), "thinkray-demo")
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
            stream = agent.stream_chat(prompt)
            for chunk in stream:
                _print_chunk(chunk)
            print()
        where = agent.where()
        print(f"\nSession {name!r} lives in actor pid {where['pid']}.")
        assert ns.hibernate(name), "hibernate refused"
        path = Path(root) / "demo" / f"{name}.duckdb"
        wal = path.with_name(path.name + ".wal")
        print(
            f"Hibernated: file closed ({path.stat().st_size // 1024} KiB, "
            f"wal left: {wal.exists()}); actor back in the warm pool."
        )
        t0 = time.perf_counter()
        history = agent.history()
        print(f"Woke it with a call ({(time.perf_counter() - t0) * 1000:.0f} ms): "
              f"now in pid {agent.where()['pid']}. History rebuilt from DuckDB:")
        for message in history:
            parts = []
            for p in message["parts"]:
                if p["type"] == "text":
                    parts.append(p["text"])
                elif p["type"] == "dynamic-tool":
                    parts.append(f"[{p['toolName']} → {p['state']}]")
            print(f"  {message['role']:>9}: {' '.join(parts)}")
        print(f"\nStatus: {agent.status()['state']}. Demo complete.")
    finally:
        ns.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="thinkray", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_demo = sub.add_parser("demo", help="stream a chat through a session actor, hibernate, wake")
    p_demo.add_argument("--root", help="storage root (default: a temp folder)")
    p_demo.set_defaults(func=demo)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
