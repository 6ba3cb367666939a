"""What `zipkv up` is asked for (the local stack's options), validated at construction: a bad value fails
with the flag to change before anything starts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# The worker's kernel and page-format choices (kernels/, worker/engines/sglang/), read by each replica
KERNEL_CHOICE_ENV = (
    "ZIPKV_PREFILL_KERNEL", "ZIPKV_EXTEND_KERNEL", "ZIPKV_DECODE_KERNEL", "ZIPKV_DECODE_IMPL",
    "ZIPKV_PAGE_FORMAT", "ZIPKV_HOPPER_WARP_SOFTMAX", "ZIPKV_HOPPER_LAZY_RESCALE", "ZIPKV_HOPPER_LEAN",
    "ZIPKV_HOPPER_SPLIT_CAP", "ZIPKV_HOPPER_EVEN_SHARES", "ZIPKV_HOPPER_PRODUCER", "ZIPKV_POOL_PACK",
    "ZIPKV_SPLIT_PLAN",
)  # fmt: skip


def kernel_choices(env: Mapping[str, str]) -> dict[str, str]:
    """The kernel choices set in `env`, for the replicas' environment and a benchmark's record."""
    return {name: env[name] for name in KERNEL_CHOICE_ENV if name in env}


@dataclass(frozen=True)
class StackOptions:
    port: int = 8000  # HTTP of the (first) router; router k listens on port + k
    workers: int = 2
    routers: int = 1
    redis_url: str | None = None  # shared state across routers; None = in memory (one router only)
    model_path: str | None = None
    model_name: str | None = None
    kv_budget_mib: float = 64.0
    compression: bool = True
    device: str = "auto"
    cpus_per_replica: float = 0.5
    ray_num_cpus: int = 4
    max_context_tokens: int | None = None  # None = the model's (config.json), checked against the KV budget
    chat_template: str = ""  # the router's models[].chat_template ("" = the model's own)
    router_env: dict[str, str] = field(default_factory=dict)  # extra ZIPKV_* overrides for the router
    otlp_endpoint: str | None = None  # OTLP/gRPC collector for the router's and workers' spans
    metrics_port: int = 9400  # worker k serves /metrics on the first free port from here (-1: none)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")
        if self.routers < 1:
            raise ValueError(f"--routers must be >= 1, got {self.routers}")
        if not -1 <= self.metrics_port <= 65535 - self.workers:
            raise ValueError(
                f"--metrics-port must be within -1..{65535 - self.workers}, got {self.metrics_port}"
            )
        if self.routers > 1 and not self.redis_url:
            raise ValueError("--routers > 1 needs shared state: add --redis redis://HOST:6379/0")
