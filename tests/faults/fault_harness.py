"""Fault-suite helpers: router processes, scripted workers that report like real ones, and a load client
that classifies every request's outcome (nothing may hang: each request has a hard timeout)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

TOKEN = "fault-suite-report-token-0123"
MODEL = "zipkv-tiny"


def write_router_config(path: Path, http_port: int, grpc_port: int, redis_url: str | None = None) -> Path:
    config: dict[str, Any] = {
        "http": {"host": "127.0.0.1", "port": http_port},
        "grpc": {"host": "127.0.0.1", "port": grpc_port},
        "models": [{"name": MODEL, "tokenizer": "byte", "max_context_tokens": 1024}],
        "security": {"report_token": TOKEN},
        "telemetry": {"log_level": "WARNING"},
    }
    if redis_url:
        config["state"] = {
            "backend": "redis",
            "redis_url": redis_url,
            "refresh_ms": 50,
            "redis_timeout_ms": 200,
        }
    path.write_text(json.dumps(config))
    return path


def start_router(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "zipkv.controlplane", "--config", str(config)],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "GRPC_VERBOSITY": "ERROR"},
        )  # fmt: skip


def wait_http(url: str, timeout_s: float = 30.0, status: int = 200) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1.0).status_code == status:
                return
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer {status} within {timeout_s} s")


def start_scripted_worker_process(routers: list[str], itl_ms: float) -> tuple[subprocess.Popen[str], str]:
    """A scripted worker (stand-in for a GPU worker) as its own process, reporting to each router."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "zipkv.testing.scripted_worker", "--router", ",".join(routers),
         "--token", TOKEN, "--itl-ms", str(itl_ms)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Load:
    """Closed-loop load: `concurrency` threads, alternating streamed and non-streamed completions."""

    urls: list[str]
    concurrency: int = 8
    max_tokens: int = 24
    timeout_s: float = 15.0
    outcomes: Counter[str] = field(default_factory=Counter)
    latencies_s: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def one(self, client: httpx.Client, url: str, stream: bool) -> str:
        body = {"model": MODEL, "prompt": "fault", "max_tokens": self.max_tokens, "stream": stream}
        try:
            if not stream:
                r = client.post(url + "/v1/completions", json=body)
                if r.status_code == 200:
                    return "ok" if r.json()["usage"]["completion_tokens"] == self.max_tokens else "short"
                shaped = "error" in r.json()
                return (
                    f"clean_{r.status_code}" if shaped and r.status_code == 502 else f"http_{r.status_code}"
                )
            with client.stream("POST", url + "/v1/completions", json=body) as r:
                if r.status_code != 200:
                    return f"http_{r.status_code}"
                events = [line for line in r.iter_lines() if line]
            if events and events[-1] == "data: [DONE]":
                return "ok"
            if events and '"error"' in events[-1]:
                return "clean_stream_error"  # the worker died mid-stream: a last error event, no [DONE]
            return "truncated"
        except httpx.HTTPError as exc:
            return f"exc_{type(exc).__name__}"

    def _run(self, k: int) -> None:
        url = self.urls[k % len(self.urls)]
        with httpx.Client(timeout=self.timeout_s) as client:
            n = 0
            while not self._stop.is_set():
                t0 = time.monotonic()
                outcome = self.one(client, url, stream=(n + k) % 2 == 0)
                with self._lock:
                    self.outcomes[outcome] += 1
                    self.latencies_s.append(time.monotonic() - t0)
                n += 1

    def start(self) -> Load:
        self._threads = [
            threading.Thread(target=self._run, args=(k,), daemon=True) for k in range(self.concurrency)
        ]
        for t in self._threads:
            t.start()
        return self

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.outcomes)

    def stop(self) -> Counter[str]:
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout_s + 5)
            assert not t.is_alive(), "a request hung past its timeout"
        return self.snapshot()


@contextlib.contextmanager
def load(urls: list[str], **kw: Any) -> Iterator[Load]:
    running = Load(urls, **kw).start()
    try:
        yield running
    finally:
        running.stop()


def failures(outcomes: Counter[str], allowed: tuple[str, ...] = ()) -> dict[str, int]:
    return {k: v for k, v in outcomes.items() if k != "ok" and k not in allowed}
