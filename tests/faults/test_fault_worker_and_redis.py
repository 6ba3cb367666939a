"""Faults on real processes under load (CPU): a worker SIGKILLed mid-stream, Redis SIGKILLed and
restarted empty, a router killed and restarted while its peer keeps serving. Router processes, a real
redis-server, scripted worker processes (stand-ins for GPU workers) over real gRPC; a closed-loop load
client (8 concurrent, half streamed) classifies every request. docs/reliability.md quotes these runs."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from pathlib import Path

import httpx
import redis
from fault_harness import (
    TOKEN,
    failures,
    load,
    start_router,
    start_scripted_worker_process,
    stop,
    wait_http,
    write_router_config,
)
from router_harness import LoopThread
from servers import free_port, free_port_run, start_redis

from zipkv.testing.scripted_worker import ScriptedWorker, report_forever


def test_worker_sigkill_mid_stream_loses_nothing(tmp_path: Path) -> None:
    http, grpc_port = free_port(), free_port()
    router = start_router(write_router_config(tmp_path / "r.json", http, grpc_port), tmp_path / "router.log")
    workers: list[subprocess.Popen[str]] = []
    try:
        url = f"http://127.0.0.1:{http}"
        wait_http(url + "/healthz")
        for _ in range(2):
            workers.append(start_scripted_worker_process([f"127.0.0.1:{grpc_port}"], itl_ms=25)[0])
        wait_http(url + "/readyz")
        with load([url], concurrency=8, max_tokens=40) as running:
            time.sleep(1.5)
            workers[0].send_signal(signal.SIGKILL)  # mid-stream: each request streams for about 1 s
            before = sum(running.snapshot().values())
            time.sleep(3.0)
            outcomes = running.stop()
        after_kill = sum(outcomes.values()) - before
        print(f"worker SIGKILL: {dict(outcomes)}; {after_kill} requests after the kill")  # with -s
        # Nothing is lost: streams in flight on the dead worker go on from their tokens on the survivor
        # (no error event), its non-streamed requests start again there (no 502: nobody had seen their
        # text), and requests that had no token yet are retried there. Nothing hangs (the load client's
        # threads all joined) and the survivor keeps serving.
        assert failures(outcomes) == {}, outcomes
        assert after_kill >= 10, outcomes
        ready = httpx.get(url + "/readyz").json()
        assert ready["status"] in ("ok", "degraded") and ready["models"]["zipkv-tiny"]["ready"] >= 1
    finally:
        for proc in [*workers, router]:
            stop(proc)


def test_redis_killed_and_restarted_empty_under_load(tmp_path: Path) -> None:
    redis_port = free_port()
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    store = start_redis(tmp_path, redis_port)
    ports = [(free_port(), free_port()) for _ in range(2)]
    routers = [
        start_router(
            write_router_config(tmp_path / f"r{k}.json", h, g, redis_url), tmp_path / f"router{k}.log"
        )
        for k, (h, g) in enumerate(ports)
    ]
    urls = [f"http://127.0.0.1:{h}" for h, _ in ports]
    loop = LoopThread()
    workers = [ScriptedWorker(worker_id=f"w{i}") for i in range(2)]
    tasks = []
    try:
        for url in urls:
            wait_http(url + "/healthz")
        for w in workers:
            loop.run(w.start())
            for _, g in ports:  # every worker reports to every router, as `zipkv up` wires them
                tasks.append(
                    asyncio.run_coroutine_threadsafe(report_forever(w, f"127.0.0.1:{g}", TOKEN), loop.loop)
                )
        for url in urls:
            wait_http(url + "/readyz")
        with load(urls, concurrency=8) as running:
            time.sleep(1.0)
            store.send_signal(signal.SIGKILL)
            store.wait()
            deadline = time.monotonic() + 5
            while any(httpx.get(u + "/readyz").json()["status"] != "degraded" for u in urls):
                assert time.monotonic() < deadline, "routers did not notice Redis going away"
                time.sleep(0.05)
            for u in urls:  # serving from the snapshot: ready, and the state is named
                r = httpx.get(u + "/readyz")
                assert r.status_code == 200 and r.json()["reasons"][0].startswith("state_unreachable")
            time.sleep(2.0)
            store = start_redis(tmp_path, redis_port)  # back, empty (no persistence)
            client = redis.Redis(port=redis_port, decode_responses=True)
            deadline = time.monotonic() + 5
            while client.smembers("zipkv:workers") != {"w0", "w1"}:
                assert time.monotonic() < deadline, "Redis was not repopulated from the routers"
                time.sleep(0.05)
            while any(httpx.get(u + "/readyz").json()["status"] != "ok" for u in urls):
                assert time.monotonic() < deadline, "routers did not recover"
                time.sleep(0.05)
            time.sleep(2.0)
            outcomes = running.stop()
        print(f"redis SIGKILL + empty restart: {dict(outcomes)}")  # with -s
        assert failures(outcomes) == {}, outcomes  # main: 503 no_worker right after the restart
        assert sum(outcomes.values()) >= 50, outcomes
    finally:
        for t in tasks:
            t.cancel()
        for w in workers:
            loop.run(w.stop(0))
        loop.close()
        for proc in [*routers, store]:
            stop(proc)


def test_a_killed_router_is_restarted_while_its_peer_keeps_serving(
    tmp_path: Path, redis_server: tuple[str, subprocess.Popen[bytes]]
) -> None:
    from zipkv.stack.local_stack import LocalStack
    from zipkv.stack.options import StackOptions

    url, _ = redis_server
    stack = LocalStack(StackOptions(port=free_port_run(2), routers=2, redis_url=url), progress=lambda _: None)
    loop = LoopThread()
    worker = ScriptedWorker(worker_id="w-up")
    tasks = []
    try:
        for k in range(2):
            stack._start_router(k)
        stack._wait_routers(timeout_s=60)
        loop.run(worker.start())
        for g in stack.grpc_ports:
            tasks.append(
                asyncio.run_coroutine_threadsafe(
                    report_forever(worker, f"127.0.0.1:{g}", stack.report_token), loop.loop
                )
            )
        for u in stack.base_urls:
            wait_http(u + "/readyz")
        with load([stack.base_urls[0]], concurrency=4) as survivor:
            stack.routers[1].send_signal(signal.SIGKILL)
            stack.routers[1].wait()
            assert stack.supervise_routers() == [1]
            wait_http(stack.base_urls[1] + "/readyz", timeout_s=30)
            time.sleep(1.0)
            outcomes = survivor.stop()
        print(f"router SIGKILL + restart, the peer's clients: {dict(outcomes)}")  # with -s
        assert failures(outcomes) == {}, outcomes  # the peer never stopped serving
        body = {"model": "zipkv-tiny", "prompt": "x", "max_tokens": 2}
        assert httpx.post(stack.base_urls[1] + "/v1/completions", json=body).status_code == 200
    finally:
        for t in tasks:
            t.cancel()
        loop.run(worker.stop(0))
        loop.close()
        for proc in stack.routers:
            stop(proc)
