"""A local zipkv stack in one command: router process(es), a local Ray with N worker replicas, a status tap.
The routers' process plumbing (spawn, wait, restart limit) is router_processes.py, the model it serves
(name, GGUF import, context) model_prep.py.

Used by `zipkv up` and by the end-to-end tests. Start order: the status tap and the router(s) first
(seconds), then Ray and the Serve replicas (the slow part), so each replica's first report lands at once.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zipkv.stack.local_http import free_port, http_get
from zipkv.stack.model_prep import prepare_model, served_name
from zipkv.stack.options import StackOptions, kernel_choices
from zipkv.stack.ray_head import start_local_ray, stop_local_ray
from zipkv.stack.router_processes import (
    RestartBudget,
    exited_error,
    router_config,
    spawn_router,
    stop_routers,
    wait_answering,
    write_pids,
)
from zipkv.stack.status_tap import StatusTap

APP_NAME = "zipkv"
STATE_DIR = Path(os.environ.get("ZIPKV_STATE_DIR", Path(tempfile.gettempdir()) / "zipkv"))


class LocalStack:
    def __init__(self, options: StackOptions, progress: Callable[[str], None] = print) -> None:
        self.options = options
        self.progress = progress
        self.report_token = secrets.token_hex(16)
        self.dispatch_token = secrets.token_hex(16)  # router -> worker (Generate, Abort)
        self.model_name = served_name(options.model_name, options.model_path)
        self.grpc_ports = [free_port() for _ in range(options.routers)]
        self.routers: list[subprocess.Popen[bytes]] = []
        self.tap: StatusTap | None = None
        self.workdir = Path(tempfile.mkdtemp(prefix="zipkv-up-"))
        self._ray_started = False
        self._restarts = RestartBudget()
        self._t0 = time.monotonic()
        self.model_path = options.model_path  # a GGUF is replaced by its dequantized folder at start
        self.context_tokens = 0  # set at start, from the model's config (or the option) and the budget

    def prepare_model(self) -> None:
        """Before anything starts: a GGUF model becomes a Hugging Face folder (once, cached), and the
        context is resolved and checked against the KV budget (raises ValueError saying what to change)."""
        o = self.options
        self.model_path, self.context_tokens = prepare_model(
            o.model_path, o.max_context_tokens, o.kv_budget_mib, o.compression, self._say
        )

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
        config = router_config(
            o.port + k, self.grpc_ports[k], model, self.report_token, self.dispatch_token, o.redis_url
        )
        path = self.workdir / f"router-{k}.yaml"
        path.write_text(json.dumps(config, indent=2))  # JSON is YAML
        return path

    def supervise_routers(self) -> list[int]:
        """Restart every router process that exited (same config and ports, so workers and clients find
        it again); returns the restarted indices. At most `MAX_RESTARTS_PER_MIN` per router per minute:
        past that it is crash-looping, and RuntimeError says so (with its log; router_processes.py)."""
        restarted = []
        now = time.monotonic()
        for k, proc in enumerate(self.routers):
            if proc.poll() is None:
                continue
            self._restarts.spend(k, proc, now, lambda k=k: self.router_log(k))
            self._say(f"router {k} exited (code {proc.returncode}); restarting it, the others keep serving")
            self.routers[k] = self._spawn_router(k)
            restarted.append(k)
        if restarted:
            self._write_pids()
        return restarted

    def _write_pids(self) -> None:
        write_pids(STATE_DIR / f"pids-{self.options.port}.json", self.routers, self.base_urls)

    def _start_router(self, k: int) -> None:
        self.routers.append(self._spawn_router(k))

    def _spawn_router(self, k: int) -> subprocess.Popen[bytes]:
        path = self._router_config(k)
        self._say(f"starting router {k + 1}/{self.options.routers} on {self.base_urls[k]} (config {path})")
        env = {**os.environ, **otel_env(self.options.otlp_endpoint), **self.options.router_env}
        return spawn_router(path, self.workdir / f"router-{k}.log", env)

    def router_log(self, k: int = 0) -> str:
        path = self.workdir / f"router-{k}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _wait_routers(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for k, url in enumerate(self.base_urls):
            wait_answering(
                k,
                self.routers[k],
                lambda url=url: http_get(f"{url}/healthz", 1.0)[0] == 200,
                lambda k=k: self.router_log(k),
                deadline,
                f"{url}/healthz within {timeout_s:.0f} s",
            )
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
            # the kernel choices set where the stack starts reach every replica, said rather than inherited
            **kernel_choices(os.environ),
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
                    raise exited_error(k, proc, self.router_log(k))
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
            self._say("draining workers")
            stop_local_ray(APP_NAME)
            self._ray_started = False
        stop_routers(self.routers)
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
