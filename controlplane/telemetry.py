"""OpenTelemetry for the router: a tracer (OTLP export when configured) and W3C context propagation.

Export is on when `telemetry.otlp_endpoint` is set or any standard `OTEL_EXPORTER_OTLP_ENDPOINT` /
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` variable is; the exporter reads the other OTEL_* variables itself.
Spans follow the GenAI conventions: gen_ai.operation.name, gen_ai.request.model, gen_ai.usage.*.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.propagate import inject
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from zipkv.controlplane.config import TelemetryConfig

log = logging.getLogger("zipkv.controlplane")


def make_tracer_provider(cfg: TelemetryConfig, env: Mapping[str, str] | None = None) -> TracerProvider:
    env = os.environ if env is None else env
    provider = TracerProvider(resource=Resource.create({"service.name": cfg.service_name}))
    endpoint = (
        cfg.otlp_endpoint
        or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )
    if endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=cfg.otlp_endpoint) if cfg.otlp_endpoint else OTLPSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(exporter))
        log.info("otlp trace export on", extra={"endpoint": endpoint})
    return provider


def trace_metadata() -> list[tuple[str, str]]:
    """The current span's W3C trace context (`traceparent`, `tracestate`) as gRPC metadata."""
    carrier: dict[str, str] = {}
    inject(carrier)
    return list(carrier.items())


def tracer(provider: trace.TracerProvider) -> trace.Tracer:
    return provider.get_tracer("zipkv.controlplane")
