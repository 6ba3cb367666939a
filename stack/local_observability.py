"""Where `zipkv up`'s logs, metrics and traces are: found on the running stack, printed when it is ready."""

from __future__ import annotations

import re
from pathlib import Path

from zipkv.stack.local_http import http_get
from zipkv.stack.local_stack import LocalStack, otel_env
from zipkv.stack.ray_head import RAY_SESSION_LOGS

_WORKER_LABEL = re.compile(r'^zipkv_worker_headroom_tokens\{[^}]*worker="([^"]+)"', re.MULTILINE)


def worker_metrics_urls(first_port: int, ports: int, host: str = "127.0.0.1") -> dict[str, str]:
    """Worker id -> its /metrics URL, read from each port of the range the replicas take ports from."""
    found: dict[str, str] = {}
    for port in range(first_port, first_port + ports):
        url = f"http://{host}:{port}/metrics"
        try:
            code, body = http_get(url, 1.0)
        except OSError:
            continue
        match = _WORKER_LABEL.search(body.decode(errors="replace")) if code == 200 else None
        if match:
            found[match.group(1)] = url
    return found


def ray_logs_dir() -> Path:
    """This process's Ray session's logs (several sessions can share /tmp/ray); the latest otherwise."""
    try:
        import ray

        node = ray._private.worker._global_node  # the driver's node: no public accessor for its session
        return (
            Path(node.get_logs_dir_path()) if ray.is_initialized() and node is not None else RAY_SESSION_LOGS
        )
    except (ImportError, AttributeError):
        return RAY_SESSION_LOGS


def where_to_look(stack: LocalStack) -> list[str]:
    """The lines `zipkv up` prints under "where to look" once the stack is ready."""
    o = stack.options
    routers = ", ".join(str(stack.workdir / f"router-{k}.log") for k in range(o.routers))
    lines = [
        f"  logs     routers (JSON lines): {routers}",
        f"           workers: {ray_logs_dir() / 'serve'}/replica_*.log",
        f"  metrics  routers: {', '.join(u + '/metrics' for u in stack.base_urls)}",
    ]
    if o.metrics_port >= 0:
        urls = worker_metrics_urls(o.metrics_port, o.workers)
        lines.append(f"           workers: {', '.join(sorted(urls.values())) or 'none answering yet'}")
    env = otel_env(o.otlp_endpoint)
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if endpoint and env.get("OTEL_SDK_DISABLED", "").lower() != "true":
        lines.append(f"  traces   OTLP/gRPC to {endpoint} (router and workers; one trace per request)")
    else:
        lines.append("  traces   off: restart with --otlp http://HOST:4317 (an OTLP/gRPC collector)")
    return lines
