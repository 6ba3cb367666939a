"""A local zipkv stack in one command: router process(es), a local Ray with N worker replicas, a status tap.

Used by `zipkv up` and by the end-to-end tests. Start order: the status tap and the router(s) first
(seconds), then Ray and the Serve replicas (the slow part), so each replica's first report lands at once.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zipkv.stack.ray_head import start_local_ray
from zipkv.stack.status_tap import StatusTap

APP_NAME = "zipkv"
MAX_RESTARTS_PER_MIN = 5
STATE_DIR = Path(os.environ.get("ZIPKV_STATE_DIR", Path(tempfile.gettempdir()) / "zipkv"))


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


def _die_with_parent() -> None:
    """Linux: the router gets SIGTERM if this process dies without stopping it (e.g. SIGKILL)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


class LocalStack:
    def __init__(self, options: StackOptions, progress: Callable[[str], None] = print) -> None:
        self.options = options
        self.progress = progress
        self.report_token = secrets.token_hex(16)
        self.dispatch_token = secrets.token_hex(16)  # router -> worker (Generate, Abort)
        path = Path(options.model_path) if options.model_path else None
        self.model_name = options.model_name or (
            (path.stem if path.suffix == ".gguf" else path.name) if path else "zipkv-tiny"
        )
        self.grpc_ports = [free_port() for _ in range(options.routers)]
        self.routers: list[subprocess.Popen[bytes]] = []
        self.tap: StatusTap | None = None
        self.workdir = Path(tempfile.mkdtemp(prefix="zipkv-up-"))
        self._ray_started = False
        self._restarts: dict[int, list[float]] = {}
        self._t0 = time.monotonic()
        self.model_path = options.model_path  # a GGUF is replaced by its dequantized folder at start
        self.context_tokens = 0  # set at start, from the model's config (or the option) and the budget

    def prepare_model(self) -> None:
        """Before anything starts: a GGUF model becomes a Hugging Face folder (once, cached), and the
        context is resolved and checked against the KV budget (raises ValueError saying what to change)."""
        from zipkv.worker.checkpoint import model_shape, read_config
        from zipkv.worker.engine_factory import checked_context
        from zipkv.worker.engines.reference.gguf_import import resolve_model_path
        from zipkv.worker.engines.reference.model import tiny_config

        o = self.options
        if o.model_path:
            self.model_path = resolve_model_path(o.model_path, progress=self._say)
            shape = model_shape(read_config(self.model_path))
        else:
            shape = model_shape(tiny_config().to_dict())
        budget = int(o.kv_budget_mib * (1 << 20))
        self.context_tokens = checked_context(shape, o.max_context_tokens or 0, budget, o.compression)
        self._say(f"context {self.context_tokens} tokens (model {shape.context_tokens})")

    def _prepared(self) -> None:
        if not self.context_tokens:  # once; every router config and replica carries the same context
            self.prepare_model()

    @property
    def base_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{self.options.port + k}" for k in range(self.options.routers)]

    def _say(self, text: str) -> None:
        self.progress(f"[zipkv {time.monotonic() - self._t0:5.1f}s] {text}")

    # ---- start --------------------------------------------------------------------------------------
    def start(self, ready_timeout_s: float = 300.0) -> None:
        self._prepared()
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        self.tap = StatusTap(self.report_token, STATE_DIR / f"status-{self.options.port}.json")
        tap_address = self.tap.start()
        for k in range(self.options.routers):
            self._start_router(k)
        self._wait_routers(timeout_s=60.0)
        self._write_pids()
        # Every worker reports to every router: with one router gone the others still hear each worker,
        # and a restarted router (same ports) hears them again at the next report.
        self._start_workers([*(f"127.0.0.1:{p}" for p in self.grpc_ports), tap_address])
        self._wait_ready(timeout_s=ready_timeout_s)

    def _router_config(self, k: int) -> Path:
        self._prepared()
        o = self.options
        model: dict[str, Any] = {"name": self.model_name, "max_context_tokens": self.context_tokens}
        model["tokenizer"] = self.model_path if self.model_path else "byte"
        if o.chat_template:
            model["chat_template"] = o.chat_template
        config: dict[str, Any] = {
            "http": {"host": "127.0.0.1", "port": o.port + k},
            "grpc": {"host": "127.0.0.1", "port": self.grpc_ports[k]},
            "models": [model],
            "security": {"report_token": self.report_token, "dispatch_token": self.dispatch_token},
        }
        if o.redis_url:
            config["state"] = {"backend": "redis", "redis_url": o.redis_url}
        path = self.workdir / f"router-{k}.yaml"
        path.write_text(json.dumps(config, indent=2))  # JSON is YAML
        return path

    def supervise_routers(self) -> list[int]:
        """Restart every router process that exited (same config and ports, so workers and clients find
        it again); returns the restarted indices. At most `MAX_RESTARTS_PER_MIN` per router per minute:
        past that it is crash-looping, and RuntimeError says so (with its log)."""
        restarted = []
        now = time.monotonic()
        for k, proc in enumerate(self.routers):
            if proc.poll() is None:
                continue
            recent = [t for t in self._restarts.get(k, []) if now - t < 60.0]
            if len(recent) >= MAX_RESTARTS_PER_MIN:
                raise RuntimeError(
                    f"router {k} exited {len(recent) + 1} times within a minute "
                    f"(last code {proc.returncode}); giving up:\n{self.router_log(k)[-3000:]}"
                )
            self._say(f"router {k} exited (code {proc.returncode}); restarting it, the others keep serving")
            self._restarts[k] = [*recent, now]
            self.routers[k] = self._spawn_router(k)
            restarted.append(k)
        if restarted:
            self._write_pids()
        return restarted

    def _write_pids(self) -> None:
        """Router process ids, for fault drills (scripts/fault_suite.sh kills one by its id)."""
        pids = {"routers": [p.pid for p in self.routers], "base_urls": self.base_urls}
        (STATE_DIR / f"pids-{self.options.port}.json").write_text(json.dumps(pids))

    def _start_router(self, k: int) -> None:
        self.routers.append(self._spawn_router(k))

    def _spawn_router(self, k: int) -> subprocess.Popen[bytes]:
        path = self._router_config(k)
        self._say(f"starting router {k + 1}/{self.options.routers} on {self.base_urls[k]} (config {path})")
        env = {**os.environ, **otel_env(self.options.otlp_endpoint), **self.options.router_env}
        log = open(self.workdir / f"router-{k}.log", "ab")  # noqa: SIM115 (lives as long as the process)
        proc = subprocess.Popen(
            [sys.executable, "-m", "zipkv.controlplane", "--config", str(path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # Ctrl-C reaches us once; we stop the router ourselves
            preexec_fn=_die_with_parent,
        )
        return proc

    def router_log(self, k: int = 0) -> str:
        path = self.workdir / f"router-{k}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _wait_routers(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for k, url in enumerate(self.base_urls):
            while True:
                if self.routers[k].poll() is not None:
                    raise RuntimeError(
                        f"router {k} exited with code {self.routers[k].returncode}:\n"
                        + self.router_log(k)[-3000:]
                    )
                try:
                    if http_get(f"{url}/healthz", 1.0)[0] == 200:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"router {k} did not answer {url}/healthz within {timeout_s:.0f} s")
                time.sleep(0.2)
        self._say(f"router{'s' if self.options.routers > 1 else ''} up")

    def _start_workers(self, report_addresses: list[str]) -> None:
        from ray import serve

        from zipkv.worker.serve import app_builder

        o = self.options
        self._say(f"starting Ray (local, {o.ray_num_cpus} CPUs); this takes 10-30 s")
        self.start_ray()
        logging.getLogger("ray.serve").setLevel(logging.WARNING)  # our own progress lines say it
        serve.start(proxy_location="Disabled")
        args = {"engine": "reference", **self.replica_args(report_addresses, o.workers)}
        self._say(
            f"starting {o.workers} worker replica(s) (model {self.model_name}, compression "
            f"{'on' if o.compression else 'off'}, KV budget {o.kv_budget_mib:g} MiB each)"
        )
        serve.run(app_builder(args), name=APP_NAME, route_prefix=None, blocking=False)

    def start_ray(self, **init_kwargs: Any) -> None:
        """A local Ray head for the replicas (report token in their environment); `init_kwargs` go to
        `ray.init` (stack/ray_head.py: a patient start, and the GCS log when it fails)."""
        os.environ["ZIPKV_REPORT_TOKEN"] = self.report_token  # inherited by the replicas
        os.environ["ZIPKV_DISPATCH_TOKEN"] = self.dispatch_token
        replica_env = {
            "ZIPKV_REPORT_TOKEN": self.report_token,
            "ZIPKV_DISPATCH_TOKEN": self.dispatch_token,
            "OMP_NUM_THREADS": "1",
            **otel_env(self.options.otlp_endpoint),
        }
        start_local_ray(self.options.ray_num_cpus, replica_env, self._say, **init_kwargs)
        self._ray_started = True

    def replica_args(self, report_addresses: list[str], num_replicas: int) -> dict[str, Any]:
        """The `app_builder` arguments of the local worker replicas (loopback, reports every 150 ms)."""
        self._prepared()
        o = self.options
        return {
            "model": self.model_path or "",
            "max_context_tokens": self.context_tokens,
            "model_name": self.model_name,
            "router": ",".join(report_addresses),
            "num_replicas": num_replicas,
            "cpus_per_replica": o.cpus_per_replica,
            "kv_budget_mib": o.kv_budget_mib,
            "compression": o.compression,
            "device": o.device,
            "bind_host": "127.0.0.1",
            "report_interval_ms": 150,
            "metrics_port": o.metrics_port,
            "metrics_ports": o.workers,
        }

    def workers(self) -> list[dict[str, Any]]:
        """Live workers as the status tap sees them (latest reports, fresher than 2 s)."""
        assert self.tap is not None
        now = time.time()
        return [w for w in self.tap.snapshot() if now - w["received_s"] < 2.0]

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        reported = -1
        while True:
            live = self.workers()
            if len(live) != reported:
                reported = len(live)
                self._say(f"{reported}/{self.options.workers} workers reporting")
            if reported >= self.options.workers and self._models_listed():
                break
            for k, proc in enumerate(self.routers):
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"router {k} exited with code {proc.returncode}:\n{self.router_log(k)[-3000:]}"
                    )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"only {reported}/{self.options.workers} workers reported within {timeout_s:.0f} s: see "
                    "`ray` logs under /tmp/ray/session_latest/logs (serve/replica_*.log)"
                )
            time.sleep(0.3)
        self._say("ready")

    def _models_listed(self) -> bool:
        try:
            code, body = http_get(f"{self.base_urls[0]}/v1/models")
        except OSError:
            return False
        return code == 200 and self.model_name.encode() in body

    # ---- stop ---------------------------------------------------------------------------------------
    def stop(self) -> None:
        if self._ray_started:
            import ray
            from ray import serve

            self._say("draining workers")
            try:
                serve.delete(APP_NAME)  # graceful: each replica drains (its __del__) before it goes
            finally:
                ray.shutdown()
            self._ray_started = False
        for proc in self.routers:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.routers:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.tap is not None:
            self.tap.stop()
            self.tap.path.unlink(missing_ok=True)
            self.tap = None
        self._say("stopped")


def otel_env(otlp_endpoint: str | None) -> dict[str, str]:
    """The standard OTEL_* variables of this process for the router and the replicas, with
    OTEL_EXPORTER_OTLP_ENDPOINT set to `otlp_endpoint` when one is given."""
    env = {k: v for k, v in os.environ.items() if k.startswith("OTEL_")}
    if otlp_endpoint:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp_endpoint
    return env


def options_dict(options: StackOptions) -> dict[str, Any]:
    return dataclasses.asdict(options)
