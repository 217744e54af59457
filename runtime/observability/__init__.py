"""Observability: traces (OpenTelemetry, GenAI conventions), metrics and logs.

No Ray here: :mod:`.metrics` is the seam the actor layer fills with ``ray.util.metrics``.
"""
