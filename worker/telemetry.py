"""OpenTelemetry for a worker replica: a tracer provider configured by the standard OTEL_* variables, and
the W3C trace context that the router sends in the Generate call's gRPC metadata.

Export is on when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` is set (and not
`OTEL_SDK_DISABLED=true`); the OTLP/gRPC exporter reads the other OTEL_* variables (headers, insecure,
timeouts) itself, the provider reads the sampler (`OTEL_TRACES_SAMPLER`, default parent-based always-on,
so a request the router sampled is traced here too). `service.name` is `OTEL_SERVICE_NAME` or
zipkv-worker; `service.instance.id` is the worker id.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from zipkv.worker.otel_env import otlp_endpoint

log = logging.getLogger("zipkv.worker")
SERVICE_NAME = "zipkv-worker"
TRACER_NAME = "zipkv.worker"


def make_tracer_provider(worker_id: str, env: Mapping[str, str] | None = None) -> TracerProvider:
    env = os.environ if env is None else env
    attributes = {"service.instance.id": worker_id}
    if not env.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = SERVICE_NAME
    provider = TracerProvider(resource=Resource.create(attributes))
    endpoint = otlp_endpoint(env)
    if endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        log.info("otlp trace export on endpoint=%s worker_id=%s", endpoint, worker_id)
    return provider


def parent_context(metadata: Iterable[tuple[str, str | bytes]] | None) -> otel_context.Context:
    """The caller's trace context from gRPC metadata (`traceparent`, `tracestate`); empty when absent."""
    carrier = {k.lower(): v for k, v in (metadata or ()) if isinstance(v, str)}
    return extract(carrier)


def trace_headers(span: trace.Span) -> tuple[tuple[str, str], ...]:
    """`span`'s W3C trace context as header pairs, for an engine that traces inside itself."""
    carrier: dict[str, str] = {}
    inject(carrier, context=trace.set_span_in_context(span))
    return tuple(carrier.items())
