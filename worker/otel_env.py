"""Whether trace export is on, from the standard OTEL_* variables alone.

Kept apart from worker/telemetry.py so that code running inside an engine's own processes (SGLang's
scheduler imports the zipkv backend, its allocator and their telemetry) asks this without importing
opentelemetry: an engine installed without it serves untraced instead of failing to start.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def otlp_endpoint(env: Mapping[str, str] | None = None) -> str | None:
    """Where traces go, from the standard variables; None when export is off."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    return env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None
