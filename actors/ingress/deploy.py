"""The ingress as a Ray Serve application, or served directly.

- ``thinkray serve``: :func:`serve_local` starts a local Ray (or joins one), Serve's
  HTTP proxy on a port, and the app.
- ``thinkray serve --direct``: :func:`serve_direct` runs the app under uvicorn in the
  command's own process, connected to Ray: no proxy and no replica between a client and
  its agent (one process, one node's worth of clients).
- On a cluster: ``serve run`` / ``serve deploy`` with a config file whose application
  has ``import_path: thinkray.actors.ingress.deploy:app_builder`` and the
  :class:`IngressConfig` fields (plus ``replicas``) as ``args`` (README, "Serving").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from typing import Any

from thinkray.actors.ingress.app import build_app, ticket_key
from thinkray.actors.ingress.config import TOKENS_ENV, IngressConfig

DEPLOYMENT = "thinkray-ingress"
GRACE = 10  # seconds open streams get to end when a direct ingress stops
APP_NAME = "thinkray"


class IngressReplica:
    """One Serve replica: the FastAPI app of :func:`build_app` (built on the replica),
    no state of its own."""


def ingress_app(config: IngressConfig, replicas: int = 1) -> Any:
    """The Serve application (``serve.run`` it, or return it from a builder)."""
    from ray import serve

    # One ticket key for the application: a WebSocket ticket one replica issued opens
    # a socket on any other. It travels in the deployment's code, never in its args.
    key = ticket_key(None)

    # A plain function: Serve calls a builder only if ``inspect.isfunction`` says so
    # (a ``functools.partial`` would be taken for the ASGI app itself). It travels to
    # the replicas with ``config`` and runs there.
    def build() -> Any:
        return build_app(config, key)

    asgi = serve.ingress(build)(IngressReplica)
    deployment = serve.deployment(
        name=DEPLOYMENT,
        num_replicas=replicas,
        # Replicas only relay bytes between clients and session actors: they must not
        # hold CPUs the session actors and the pool need.
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=1000,
    )(asgi)
    return deployment.bind()


def app_builder(args: dict[str, Any]) -> Any:
    """Serve's application builder: ``args`` are :class:`IngressConfig`'s fields and
    optionally ``replicas``. Tokens are refused here: Serve shows an application's args
    to whoever reads its REST config; name a ``tokens_file`` or set ``$THINKRAY_TOKENS``
    on the cluster."""
    args = dict(args)
    if args.get("tokens"):
        raise ValueError(
            "bearer tokens in a Serve config's args are readable through Serve's REST "
            f"API: use tokens_file (PRINCIPAL=TOKEN lines) or ${TOKENS_ENV} instead"
        )
    replicas = int(args.pop("replicas", 1))
    return ingress_app(IngressConfig.model_validate(args), replicas)


def serve_local(
    config: IngressConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    replicas: int = 1,
    blocking: bool = True,
) -> str:
    """Start Serve's proxy on ``host:port`` and run the ingress; returns its URL.
    ``blocking``: serve until interrupted (Ctrl-C), then stop the app."""
    import ray
    from ray import serve

    if not ray.is_initialized():
        ray.init(
            address=os.environ.get("RAY_ADDRESS") or "local",
            include_dashboard=False,
            log_to_driver=False,
        )
    serve.start(http_options={"host": host, "port": port})
    serve.run(ingress_app(config, replicas), name=APP_NAME, route_prefix="/")
    url = f"http://{host}:{port}"
    if blocking:
        print(f"thinkray ingress on {url} (Ctrl-C stops it)", flush=True)

        def interrupt(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGTERM, interrupt)  # `kill <pid>` stops it too
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            serve.delete(APP_NAME)
        finally:
            signal.signal(signal.SIGTERM, previous)
    return url


def serve_direct(config: IngressConfig, *, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve the ingress app under uvicorn in this process (connected to Ray) until
    SIGINT or SIGTERM, without Serve.

    Through Serve a request crosses two processes before the app sees it (the proxy,
    then a replica) and each streamed write crosses them back: ~15 ms of CPU per
    streamed turn here, more than the turn itself. Served directly the app relays the
    agent's stream straight to the socket. What it gives up: one process (no replicas,
    no autoscaling, no Serve config on a cluster); a restart drops the open streams
    (they resume from the agent's replay, as through a new replica). The agents are
    Ray actors either way; a WebSocket ticket this process issued opens only here.

    Raises:
        OSError: it could not listen on ``host:port`` (taken, or not this machine's).
    """
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(
            build_app(config),
            host=host,
            port=port,
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=GRACE,
        )
    )

    async def announce() -> None:
        while not server.started:
            await asyncio.sleep(0.05)
        url = f"http://{host}:{port}"
        print(f"thinkray ingress on {url} (direct, no Serve; Ctrl-C stops it)", flush=True)

    async def run(listener: socket.socket) -> None:
        announcing = asyncio.ensure_future(announce())
        try:
            await server.serve(sockets=[listener])
        finally:
            announcing.cancel()

    # uvicorn shuts down gracefully on SIGINT/SIGTERM (open streams get up to
    # GRACE seconds to end; a client resumes a cut one from the agent's replay), then
    # raises the signal again for the handler it found: here both end as a
    # KeyboardInterrupt, a clean stop (Ray's own SIGTERM handler exits with status 15).
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    # Bound here, not by uvicorn: a port in use is then a plain OSError for the caller
    # to report (uvicorn logs it and calls sys.exit from inside the event loop).
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    listener = socket.create_server((host, port), family=family)
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(run(listener))
    finally:
        signal.signal(signal.SIGTERM, previous)
        listener.close()
