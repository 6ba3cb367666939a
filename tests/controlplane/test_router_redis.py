"""Shared state in a real redis-server: two router processes never over-commit one worker; reports
expire by TTL; a Redis outage degrades the router (still serving) and it recovers by itself."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from router_harness import MODEL, TOKEN, LoopThread, stack
from servers import free_port, start_redis

from zipkv.testing.scripted_worker import Script, ScriptedWorker, report_forever


def _router_process(tmp: Path, redis_url: str, name: str) -> tuple[subprocess.Popen[bytes], str, str]:
    http, grpc_port = free_port(), free_port()
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(
        f"models: [{{name: {MODEL}, tokenizer: byte, max_context_tokens: 4096}}]\n"
        f"http: {{host: 127.0.0.1, port: {http}}}\ngrpc: {{host: 127.0.0.1, port: {grpc_port}}}\n"
        f"state: {{backend: redis, redis_url: '{redis_url}', refresh_ms: 20, redis_timeout_ms: 2000}}\n"
        "placement: {stale_after_ms: 2000, expire_after_ms: 5000}\n"
    )
    env = {**os.environ, "ZIPKV_SECURITY__REPORT_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [sys.executable, "-m", "zipkv.controlplane", "--config", str(cfg)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(tmp / f"{name}.log").open("wb"),
    )
    return proc, f"http://127.0.0.1:{http}", f"127.0.0.1:{grpc_port}"


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "router process exited during start-up"
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError(f"router at {url} did not start")


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.close()


def test_two_router_processes_never_over_commit_one_worker(
    redis_server: tuple[str, subprocess.Popen[bytes]], tmp_path: Path, loop: LoopThread
) -> None:
    url, _ = redis_server
    routers = [_router_process(tmp_path, url, n) for n in ("a", "b")]
    worker = ScriptedWorker(script=Script(itl_s=0.01), total_tokens=1000)
    try:
        for proc, http, _ in routers:
            _wait_http(http, proc)
        loop.run(worker.start())
        # The worker reports only to router "a"; router "b" learns about it through Redis.
        loop.loop.call_soon_threadsafe(
            lambda: loop.loop.create_task(report_forever(worker, routers[0][2], TOKEN, period_s=0.05))
        )
        deadline = time.monotonic() + 10
        while httpx.get(routers[1][1] + "/readyz").json()["workers"] != 1:
            assert time.monotonic() < deadline, "router b never saw the worker through Redis"
            time.sleep(0.05)

        # Each request needs 2 prompt tokens (BOS + "x") + 98 new = 100 tokens: at most 10 fit in 1000.
        def one(i: int) -> int:
            body = {"model": MODEL, "prompt": "x", "max_tokens": 98, "stream": True}
            with httpx.stream("POST", routers[i % 2][1] + "/v1/completions", json=body, timeout=30) as r:
                for _ in r.iter_lines():
                    pass
                return r.status_code

        with ThreadPoolExecutor(32) as pool:
            codes = list(pool.map(one, range(32)))
        served = codes.count(200)
        assert set(codes) <= {200, 503}
        assert worker.peak_committed_tokens <= worker.total_tokens, "two routers over-committed the worker"
        assert served >= 5, f"too few served: {codes}"
        assert codes.count(503) > 0  # 32 x 100 tokens cannot all fit: the limit was exercised
        for _, http, _ in routers:
            assert "zipkv_router_placements_total" in httpx.get(http + "/metrics").text
    finally:
        for proc, _, _ in routers:
            proc.terminate()
        for proc, _, _ in routers:
            proc.wait(10)
        loop.run(worker.stop(0))


def test_reports_expire_in_redis(redis_server: tuple[str, subprocess.Popen[bytes]]) -> None:
    url, _ = redis_server
    with stack(
        state={"backend": "redis", "redis_url": url, "refresh_ms": 20},
        placement={"stale_after_ms": 200, "expire_after_ms": 400},
    ) as s:
        s.add_worker()
        time.sleep(0.1)
        assert len(s.router.router.store.snapshot().workers) == 1
        time.sleep(0.6)  # no more reports: the hash's TTL ends it
        assert s.router.router.store.snapshot().workers == ()
        r = httpx.post(s.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2})
        assert r.status_code == 503


def test_redis_outage_degrades_and_recovers(
    redis_server: tuple[str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    url, proc = redis_server
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
    with stack(state={"backend": "redis", "redis_url": url, "refresh_ms": 20}) as s:
        w = s.add_worker()
        time.sleep(0.1)
        assert httpx.post(s.url + "/v1/completions", json=body).status_code == 200
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 5
        while httpx.get(s.url + "/readyz").json()["status"] != "degraded":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert "zipkv_router_degraded 1.0" in httpx.get(s.url + "/metrics").text
        # Still serving from the last snapshot plus its own reports, with local reservations.
        assert httpx.post(s.url + "/v1/completions", json=body).status_code == 200
        assert s.report(w).accepted
        assert httpx.post(s.url + "/v1/completions", json=body).status_code == 200
        restarted = start_redis(tmp_path, port)
        try:
            deadline = time.monotonic() + 5
            while httpx.get(s.url + "/readyz").json()["status"] != "ok":
                assert time.monotonic() < deadline, "router did not recover"
                time.sleep(0.05)
            assert "zipkv_router_degraded 0.0" in httpx.get(s.url + "/metrics").text
            # The reports it kept while degraded went back into Redis.
            assert len(s.router.router.store.snapshot().workers) == 1
            assert httpx.post(s.url + "/v1/completions", json=body).status_code == 200
        finally:
            restarted.kill()
            restarted.wait()
