"""Worker settings, validated at start-up (the engine they select is built by engine_factory.py)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Literal

from zipkv.controlplane.grpc_auth import TlsFiles

EngineKind = Literal["reference", "sglang"]
REPORT_TOKEN_ENV = "ZIPKV_REPORT_TOKEN"
# Secrets and certificate paths come from the environment inside the replica, never as Serve arguments.
CREDENTIAL_ENV = {
    "report_token": REPORT_TOKEN_ENV,
    "dispatch_token": "ZIPKV_DISPATCH_TOKEN",
    "worker_identity": "ZIPKV_WORKER_IDENTITY",
    "tls_cert_file": "ZIPKV_TLS_CERT",
    "tls_key_file": "ZIPKV_TLS_KEY",
    "tls_ca_file": "ZIPKV_TLS_CA",
    "tls_router_name": "ZIPKV_TLS_ROUTER_NAME",
}
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class WorkerSettings:
    engine: EngineKind = "reference"
    model_path: str | None = None  # a local checkpoint directory; None = the built-in tiny model
    model_name: str | None = None  # the name the router knows it by (default: the folder name / zipkv-tiny)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    kv_budget_bytes: int = 64 << 20
    compression: bool = True
    max_context_tokens: int = 0  # 0 = the model's (max_position_embeddings, capped at a sliding window)
    max_running_requests: int = 64
    # host:port of ControlPlane.ReportCapacity; a comma-separated list sends the same reports to each
    # (e.g. the router and `zipkv up`'s status tap); None = no reports.
    router_address: str | None = None
    report_token: str = ""
    # Bearer token the router must send with Generate/Abort. Without it (and without TLS) the worker
    # serves only on loopback: anything that reaches it could otherwise bypass the router's API keys.
    dispatch_token: str = ""
    # Reports name worker ids `<worker_identity>/<replica>`: the router binds them to a per-worker token
    # or to this worker's certificate common name.
    worker_identity: str = ""
    # Mutual TLS on both gRPC hops (all three files or none): this worker's certificate and key, and the
    # CA that signed the router's. `tls_router_name`: the name the router's certificate holds.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_ca_file: str = ""
    tls_router_name: str = "zipkv-router"
    report_interval_ms: int = 200
    bind_host: str = "127.0.0.1"
    advertise_host: str | None = None  # what the router dials; default bind_host
    port: int = 0  # 0 = any free port
    drain_timeout_s: float = 30.0
    # Requests in the engine and no token for this long (a hung GPU) mark the replica unhealthy: Ray Serve's
    # health check fails and it replaces the replica; meanwhile it reports draining, refuses Generate and
    # fails the calls it holds with UNAVAILABLE (EngineLoop.watch_stall), so routers move them at once.
    # 0 = never. Far above a step's length, a long prompt's whole prefill and a kernel's first compile.
    engine_stall_s: float = 300.0
    # Prometheus /metrics of this replica: the first free port of metrics_port .. metrics_port +
    # metrics_ports - 1 (replicas sharing a pod take one each); 0 = any free port; -1 = no endpoint.
    metrics_port: int = 0
    metrics_ports: int = 1
    torch_threads: int = 1
    # engine 'sglang' only: a JSON object of extra `sglang.Engine` keyword arguments, applied over zipkv's
    # own (e.g. '{"mem_fraction_static": 0.3, "log_level": "info"}'); docs/sglang.md lists zipkv's.
    sglang_args: str = ""
    # The GPUs this replica holds (Ray's num_gpus for it; 0 off Ray). With engine 'sglang', 2 or more run
    # SGLang at that tensor-parallel size: a replica given two GPUs uses both.
    gpus: float = 0.0

    def __post_init__(self) -> None:
        if self.engine not in ("reference", "sglang"):
            raise ValueError(f"engine must be 'reference' or 'sglang', got {self.engine!r}")
        if self.kv_budget_bytes <= 0:
            raise ValueError(f"kv_budget_bytes must be > 0, got {self.kv_budget_bytes}")
        if self.engine_stall_s < 0:
            raise ValueError(f"engine_stall_s must be >= 0 (0 = never), got {self.engine_stall_s}")
        if self.max_context_tokens < 0:
            raise ValueError(
                f"max_context_tokens must be >= 0 (0 = the model's), got {self.max_context_tokens}"
            )
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be within 0..65535, got {self.port}")
        if not -1 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port must be within -1..65535 (-1 = off), got {self.metrics_port}")
        if self.metrics_ports < 1 or self.metrics_port + self.metrics_ports - 1 > 65535:
            raise ValueError(
                f"metrics_ports must be >= 1 and end at port 65535 at most, got {self.metrics_ports} "
                f"from {self.metrics_port}"
            )
        self._check_tensor_parallel(self.sglang_kwargs())  # validates sglang_args too
        tls = (self.tls_cert_file, self.tls_key_file, self.tls_ca_file)
        if any(tls) and not all(tls):
            raise ValueError("TLS needs all of ZIPKV_TLS_CERT, ZIPKV_TLS_KEY and ZIPKV_TLS_CA (or none)")
        # The model path is checked where the model loads (the replica's machine), not here.

    def sglang_kwargs(self) -> dict[str, Any]:
        """`sglang_args` parsed; raises ValueError saying what is wrong."""
        if not self.sglang_args:
            return {}
        if self.engine != "sglang":
            raise ValueError(f"sglang_args applies to engine 'sglang' only; engine is {self.engine!r}")
        try:
            kwargs = json.loads(self.sglang_args)
        except json.JSONDecodeError as exc:
            raise ValueError(f"sglang_args must be a JSON object: {exc}") from None
        if not isinstance(kwargs, dict):
            raise ValueError(f"sglang_args must be a JSON object, got {type(kwargs).__name__}")
        if "model_path" in kwargs:
            raise ValueError("sglang_args must not set model_path: use the worker's model setting")
        return kwargs

    def tensor_parallel_size(self) -> int:
        """SGLang's tp_size for this replica: its whole GPUs (1 on a share of one, or off Ray)."""
        return int(self.gpus) if self.gpus > 1 else 1

    def _check_tensor_parallel(self, kwargs: dict[str, Any]) -> None:
        if self.gpus < 0:
            raise ValueError(f"gpus must be >= 0, got {self.gpus}")
        if self.engine == "sglang" and self.gpus > 1 and not float(self.gpus).is_integer():
            raise ValueError(
                "an SGLang replica holds a share of one GPU or whole GPUs (its tensor parallelism), "
                f"got {self.gpus}"
            )
        tp = kwargs.get("tp_size")
        if tp is not None and self.gpus and tp != self.tensor_parallel_size():
            raise ValueError(
                f"sglang_args tp_size={tp} but the replica holds {self.gpus:g} GPU(s): drop tp_size (the "
                f"replica runs tensor parallelism over the GPUs it holds) or give it {tp} GPUs"
            )

    def report_addresses(self) -> list[str]:
        return [a.strip() for a in (self.router_address or "").split(",") if a.strip()]

    @staticmethod
    def report_token_from_env() -> str:
        return os.environ.get(REPORT_TOKEN_ENV, "")

    @staticmethod
    def credentials_from_env() -> dict[str, str]:
        """The credential settings this process's environment sets (CREDENTIAL_ENV)."""
        return {key: os.environ[env] for key, env in CREDENTIAL_ENV.items() if os.environ.get(env)}

    def tls_files(self) -> TlsFiles | None:
        if not self.tls_cert_file:
            return None
        return TlsFiles(self.tls_cert_file, self.tls_key_file, self.tls_ca_file, self.tls_router_name)

    def check_serving_credentials(self) -> None:
        """Refuse to serve Generate unauthenticated beyond loopback (call before binding)."""
        if self.dispatch_token or self.tls_cert_file or self.bind_host in LOOPBACK_HOSTS:
            return
        raise ValueError(
            f"refusing to serve Worker.Generate on {self.bind_host} without credentials: anything that "
            "reaches it could bypass the router's API keys. Set ZIPKV_DISPATCH_TOKEN (the router's "
            "security.dispatch_token) and/or mutual TLS (ZIPKV_TLS_CERT, ZIPKV_TLS_KEY, ZIPKV_TLS_CA), "
            "or bind 127.0.0.1"
        )


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(
            f"device {device!r} asked for but no CUDA GPU is visible: use device 'cpu' or 'auto'"
        )
    return device
