"""SGLang's gateway (sglang-router 0.3.2) as a command line: how the serving sweep starts it in front of
SGLang servers (bench/serving/) and how bench/router/bench_gateway.py starts it in front of a stand-in."""

from __future__ import annotations

import sys

GATEWAY_CHOICES = ("random", "round_robin", "cache_aware", "power_of_two", "manual")  # sglang-router 0.3.2


def gateway_cmd(policy: str, worker_urls: list[str], port: int, metrics_port: int) -> list[str]:
    """sglang-router 0.3.2 in front of the servers; its retries and circuit breaker stay at their defaults
    (what a deployment of the gateway gets); its Prometheus metrics on `metrics_port`."""
    if policy not in GATEWAY_CHOICES:
        raise ValueError(f"sglang-router 0.3.2 has no policy {policy!r} (it has {GATEWAY_CHOICES})")
    if not worker_urls:
        raise ValueError("the gateway needs at least one worker URL")
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)]
    return [*cmd, "--policy", policy, "--worker-urls", *worker_urls]
