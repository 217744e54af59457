"""Turning tracing on in a process: from the environment, the same in every actor.

A Ray application is many processes — the driver, each session actor, the bridges,
the ingress replicas — and each needs its own tracer provider. thinkray's actors call
:func:`configure_from_env` as they start, so one set of environment variables (given
to ``ray.init(runtime_env={"env_vars": {...}})`` or the cluster's ``runtime_env``)
turns tracing on everywhere:

``THINKRAY_OTEL_SETUP=package.module:function``
    Call that function (no arguments) to install a provider of your own (an in-memory
    exporter in a test, Logfire, a vendor SDK). Wins over the rest.
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
    Send spans over OTLP/HTTP (protobuf) to a collector, e.g. ``http://collector:4318``
    (the other standard ``OTEL_EXPORTER_OTLP_*`` and ``OTEL_SERVICE_NAME`` /
    ``OTEL_RESOURCE_ATTRIBUTES`` variables apply). Needs ``pip install
    "thinkray[otel]"``. Spans go through a :class:`BoundedSpanProcessor`: an
    unreachable collector drops spans (counted), it never slows a turn.
``OTEL_TRACES_EXPORTER=none`` or ``THINKRAY_TRACING=0``
    Off, whatever else is set.
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``
    Record message contents (off by default).

Nothing is set up when a provider is already installed (the application's own).
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider

__all__ = ["SETUP_ENV", "configure_from_env", "configure_otlp"]

log = logging.getLogger("thinkray.tracing")

SETUP_ENV = "THINKRAY_OTEL_SETUP"
processor_in_use: Any = None
"""The BoundedSpanProcessor :func:`configure_otlp` installed in this process (its
``dropped`` and ``exported`` counts), or None."""
_lock = threading.Lock()
_done = False


def _provider_installed() -> bool:
    return not isinstance(trace.get_tracer_provider(), ProxyTracerProvider | NoOpTracerProvider)


def configure_from_env() -> str | None:
    """Set this process's tracing up from the environment (see the module); idempotent.
    Returns what was done: ``"hook"``, ``"otlp"``, or None (nothing to do, off, or a
    provider already installed). A broken setting is logged, never raised: tracing
    must not keep an actor from starting."""
    global _done
    with _lock:
        if _done:
            return None
        _done = True
        env = os.environ
        if env.get("THINKRAY_TRACING", "").lower() in ("0", "false", "off"):
            return None
        if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
            return None
        try:
            hook = env.get(SETUP_ENV, "").strip()
            if hook:
                module, _, attr = hook.partition(":")
                getattr(importlib.import_module(module), attr or "setup")()
                return "hook"
            if _provider_installed():
                return None
            if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
                "OTEL_EXPORTER_OTLP_ENDPOINT"
            ):
                configure_otlp()
                return "otlp"
        except Exception as exc:
            log.warning("tracing setup from the environment failed: %s", exc)
        return None


def _number(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name) or default)
    except ValueError:
        log.warning("%s=%r is not a number; using %s", name, os.environ.get(name), default)
        return default


def configure_otlp(
    endpoint: str | None = None,
    *,
    service_name: str | None = None,
    max_queue: int | None = None,
    timeout: float | None = None,
) -> Any:
    """Install a tracer provider exporting over OTLP/HTTP to ``endpoint`` (default: the
    ``OTEL_EXPORTER_OTLP_*`` variables; ``.../v1/traces`` is the traces path) through a
    :class:`BoundedSpanProcessor` (sized by the standard ``OTEL_BSP_MAX_QUEUE_SIZE``,
    ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` and ``OTEL_BSP_SCHEDULE_DELAY`` variables; each
    export waits at most ``OTEL_EXPORTER_OTLP_TIMEOUT`` seconds, default 5). Returns
    the processor (its ``dropped`` count).

    Raises:
        ImportError: the OpenTelemetry SDK or its OTLP exporter is not installed
            (``pip install "thinkray[otel]"``).
    """
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from thinkray.runtime.observability.exporter import BoundedSpanProcessor

    resource = Resource.create(
        {SERVICE_NAME: service_name or os.environ.get("OTEL_SERVICE_NAME") or "thinkray"}
    )
    provider = TracerProvider(resource=resource)
    exporter = OTLPSpanExporter(
        endpoint=endpoint,
        timeout=timeout if timeout is not None else _number("OTEL_EXPORTER_OTLP_TIMEOUT", 5.0),
    )
    processor = BoundedSpanProcessor(
        exporter,
        max_queue=max_queue or int(_number("OTEL_BSP_MAX_QUEUE_SIZE", 2048)),
        max_batch=int(_number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)),
        interval=_number("OTEL_BSP_SCHEDULE_DELAY", 1000) / 1000,
    )
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    global processor_in_use
    processor_in_use = processor
    return processor
