"""The worker as a Ray Serve deployment: one engine per replica, each serving the Worker gRPC service.

Ray Serve places the replicas (CPU or GPU), restarts one whose health check fails, and scales them.
Requests do not pass through Serve's proxy: each replica serves gRPC on its own address and reports it,
with its capacity, to the router. On shutdown (`__del__`, Serve's graceful shutdown) the replica drains.

Import path for `serve run` / KubeRay: ``zipkv.worker.serve:app_builder`` with string arguments::

    serve run zipkv.worker.serve:app_builder engine=reference model=/models/llama router=router:50051 \
        num_replicas=2 gpus_per_replica=1

Credentials come from the replica's environment, never from arguments: ZIPKV_REPORT_TOKEN,
ZIPKV_DISPATCH_TOKEN (the router's security.dispatch_token), ZIPKV_WORKER_IDENTITY, and for mutual TLS
ZIPKV_TLS_CERT, ZIPKV_TLS_KEY, ZIPKV_TLS_CA (ZIPKV_TLS_ROUTER_NAME: the router certificate's name). Each
replica serves Prometheus /metrics on the first free port of ``metrics_port`` .. ``metrics_port +
metrics_ports - 1`` (0: any free port, -1: none) and exports spans as the standard OTEL_* variables say
(worker/telemetry.py).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from ray import serve

from zipkv.worker.engine_factory import build_engine
from zipkv.worker.runtime import WorkerRuntime
from zipkv.worker.settings import CREDENTIAL_ENV, WorkerSettings

log = logging.getLogger("zipkv.worker")
DEPLOYMENT_NAME = "zipkv-worker"
LOG_LEVEL_ENV = "ZIPKV_LOG_LEVEL"


@serve.deployment(
    name=DEPLOYMENT_NAME,
    health_check_period_s=1.0,
    health_check_timeout_s=10.0,
    graceful_shutdown_timeout_s=40.0,
    graceful_shutdown_wait_loop_s=0.5,
    max_ongoing_requests=100,
)
class WorkerDeployment:
    def __init__(self, settings: dict[str, Any]) -> None:
        import ray

        route_logs_to_serve()
        ctx = serve.get_replica_context()
        if not settings.get("advertise_host") and settings.get("bind_host") in (None, "0.0.0.0"):
            settings = {**settings, "advertise_host": ray.util.get_node_ip_address()}
        settings = {**settings, **WorkerSettings.credentials_from_env()}
        self.settings = WorkerSettings(**settings)
        # Under a per-worker token or certificate the router accepts only ids `<identity>/<replica>`.
        identity = self.settings.worker_identity
        worker_id = f"{identity}/{ctx.replica_tag}" if identity else f"{ctx.deployment}-{ctx.replica_tag}"
        engine = build_engine(self.settings)
        self.runtime = WorkerRuntime(engine, self.settings, worker_id=worker_id)
        self.runtime.start()

    def check_health(self) -> None:
        if not self.runtime.healthy():
            why = self.runtime.engine_loop.trouble() or "stopped"
            raise RuntimeError(f"worker {self.runtime.worker_id} is unhealthy: {why}")

    def info(self) -> dict[str, Any]:
        cap = self.runtime.engine_loop.capacity()
        return {
            "worker_id": self.runtime.worker_id,
            "pid": os.getpid(),  # the replica process: what a fault drill signals, what ps shows
            "address": self.runtime.address,
            "metrics_address": self.runtime.metrics_address,
            "model": self.runtime.engine.model_name,
            "draining": self.runtime.service.draining,
            "compression": self.settings.compression,
            "capacity": dataclasses.asdict(cap),
            "reports_sent": sum(r.sent for r in self.runtime.reporters),
            "reports_accepted": sum(r.accepted for r in self.runtime.reporters),
        }

    async def __call__(self, *args: Any) -> dict[str, Any]:
        return self.info()

    def __del__(self) -> None:
        runtime = getattr(self, "runtime", None)
        if runtime is not None:
            runtime.drain()


def route_logs_to_serve(level: str | None = None) -> None:
    """The worker's own log lines (logger "zipkv", INFO unless ZIPKV_LOG_LEVEL says otherwise) go where
    Ray Serve writes the replica's: serve/replica_<app>_<deployment>_<id>.log in the Ray session's logs,
    and the replica's stderr. Without this only warnings would show, in the worker process's stderr."""
    serve_logger = logging.getLogger("ray.serve")
    ours = logging.getLogger("zipkv")
    ours.setLevel((level or os.environ.get(LOG_LEVEL_ENV, "INFO")).upper())
    for handler in serve_logger.handlers:
        if handler not in ours.handlers:
            ours.addHandler(handler)
    ours.propagate = not serve_logger.handlers


def _flag(value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true/false, got {value!r}")


def settings_from_args(args: dict[str, Any]) -> tuple[WorkerSettings, int, float, float]:
    """Parse `serve run` arguments; returns (settings, num_replicas, gpus_per_replica, cpus_per_replica)."""
    known = {
        "engine", "model", "model_name", "router", "num_replicas", "gpus_per_replica", "cpus_per_replica",
        "kv_budget_mib", "compression", "device", "bind_host", "advertise_host", "max_running_requests",
        "report_interval_ms", "drain_timeout_s", "sglang_args", "max_context_tokens", "metrics_port",
        "metrics_ports", "engine_stall_s",
    }  # fmt: skip
    unknown = sorted(set(args) - known)
    if unknown:
        raise ValueError(f"unknown worker arguments {unknown}; accepted: {sorted(known)}")
    gpus = float(args.get("gpus_per_replica", 0))
    settings = WorkerSettings(
        engine=args.get("engine", "reference"),
        model_path=args.get("model") or None,
        model_name=args.get("model_name") or None,
        device=args.get("device", "cuda" if gpus > 0 else "auto"),
        kv_budget_bytes=int(float(args.get("kv_budget_mib", 64)) * (1 << 20)),
        compression=_flag(args.get("compression", True)),
        max_context_tokens=int(args.get("max_context_tokens", 0)),
        max_running_requests=int(args.get("max_running_requests", 64)),
        router_address=args.get("router") or None,
        report_interval_ms=int(args.get("report_interval_ms", 200)),
        bind_host=args.get("bind_host", "0.0.0.0"),
        advertise_host=args.get("advertise_host") or None,
        drain_timeout_s=float(args.get("drain_timeout_s", 30)),
        engine_stall_s=float(args.get("engine_stall_s", 300)),
        sglang_args=args.get("sglang_args", ""),
        metrics_port=int(args.get("metrics_port", 0)),
        metrics_ports=int(args.get("metrics_ports", 1)),
        gpus=gpus,
    )
    replicas = int(args.get("num_replicas", 1))
    if replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {replicas}")
    return settings, replicas, gpus, float(args.get("cpus_per_replica", 1))


def app_builder(args: dict[str, Any]) -> serve.Application:
    """The Ray Serve application (`serve run zipkv.worker.serve:app_builder key=value ...`)."""
    settings, replicas, gpus, cpus = settings_from_args(args)
    fields = dataclasses.asdict(settings)
    for key in CREDENTIAL_ENV:  # read from the environment inside the replica, never shipped as an arg
        fields[key] = WorkerSettings.__dataclass_fields__[key].default
    return WorkerDeployment.options(  # type: ignore[attr-defined]
        num_replicas=replicas,
        ray_actor_options={"num_cpus": cpus, "num_gpus": gpus},
    ).bind(fields)
