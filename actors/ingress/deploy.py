"""The ingress as a Ray Serve application.

- ``thinkray serve``: :func:`serve_local` starts a local Ray (or joins one), Serve's
  HTTP proxy on a port, and the app.
- On a cluster: ``serve run`` / ``serve deploy`` with a config file whose application
  has ``import_path: thinkray.actors.ingress.deploy:app_builder`` and the
  :class:`IngressConfig` fields (plus ``replicas``) as ``args`` (README, "Serving").
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from thinkray.actors.ingress.app import build_app, ticket_key
from thinkray.actors.ingress.config import TOKENS_ENV, IngressConfig

DEPLOYMENT = "thinkray-ingress"
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
