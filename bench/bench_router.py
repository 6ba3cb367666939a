"""Router benchmark: placement decision time, added latency, streamed requests per second.

    python bench/bench_router.py --out bench/results/router.json

1. Placement: `place()` over a snapshot of 100 workers (mixed fresh state), p50/p99 of single calls;
   also the full decision as the router makes it (snapshot + span + metric: `Dispatcher.decide`).
2. Added latency: HTTP request sent to the router -> Generate arriving at a scripted worker (one
   process: the client's send and the worker's arrival share a clock). It includes the client's own
   HTTP send, so it is an upper bound on the router's share. Sequential requests, after a warm-up.
   Baseline in the same run: the same scripted worker called directly over gRPC (client -> arrival).
3. Throughput: one router process (`python -m zipkv.controlplane`) against one scripted worker
   process, driven by an asyncio client with N concurrent streamed requests of T tokens for D seconds;
   requests/s, streamed tokens/s and errors (any non-200, missing [DONE] or short stream is an error).

The scripted worker is a stand-in for a GPU worker (no model): this measures the router alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOKEN = "bench-token"
MODEL = "zipkv-tiny"


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def bench_placement(n_workers: int, iters: int) -> dict[str, Any]:
    from opentelemetry.sdk.trace import TracerProvider

    from zipkv.controlplane.config import RouterConfig
    from zipkv.controlplane.dispatch import Dispatcher
    from zipkv.controlplane.metrics import RouterMetrics
    from zipkv.controlplane.placement import RequestShape, place
    from zipkv.controlplane.state import MemoryStore, WorkerView

    now = time.time()
    base = WorkerView(
        "w",
        "127.0.0.1:1",
        MODEL,
        1,
        1,
        now,
        now,
        0,
        0,
        200_000,
        0.7,
        0,
        0,
        0,
        20.0,
        15.0,
        False,
        8192,
        131_072,
    )
    views = [
        replace(
            base,
            worker_id=f"w{i:03d}",
            free_tokens=20_000 + 1_500 * i,
            queued_requests=i % 5,
            itl_ms=8.0 + (i % 13),
            queued_prefill_tokens=100 * (i % 7),
            received_s=now - 0.01 * (i % 20),
        )
        for i in range(n_workers)
    ]
    from zipkv.controlplane.state import Snapshot

    snap = Snapshot(tuple(views), now)
    cfg = RouterConfig.model_validate({"models": [{"name": MODEL}]})
    shape = RequestShape(MODEL, 512, 256, 2000.0, 100.0, 0.05)
    for _ in range(500):
        place(snap, shape, cfg.placement, now)
    pure, pure_cpu = [], []
    for _ in range(iters):
        c0, t0 = time.thread_time_ns(), time.perf_counter()
        place(snap, shape, cfg.placement, now, top_k=9)
        pure.append((time.perf_counter() - t0) * 1e3)
        pure_cpu.append((time.thread_time_ns() - c0) / 1e6)
    store = MemoryStore(cfg.placement.expire_after_ms, cfg.placement.reservation_ttl_s, clock=lambda: now)
    for v in views:
        store.put_report_sync(v)
    disp = Dispatcher(cfg, store, RouterMetrics(), TracerProvider().get_tracer("bench"), clock=lambda: now)
    full, full_cpu = [], []
    for _ in range(iters // 4):
        c0, t0 = time.thread_time_ns(), time.perf_counter()
        d = disp.decide(shape)
        full.append((time.perf_counter() - t0) * 1e3)
        full_cpu.append((time.thread_time_ns() - c0) / 1e6)
    assert d.ranked and not d.filtered  # every worker was a candidate and scored
    return {
        "workers": n_workers,
        "iterations": iters,
        "place_p50_ms": _pct(pure, 0.5),
        "place_p99_ms": _pct(pure, 0.99),
        "place_cpu_p50_ms": _pct(pure_cpu, 0.5),
        "place_cpu_p99_ms": _pct(pure_cpu, 0.99),
        "decide_p50_ms": _pct(full, 0.5),
        "decide_p99_ms": _pct(full, 0.99),
        "decide_cpu_p50_ms": _pct(full_cpu, 0.5),
        "decide_cpu_p99_ms": _pct(full_cpu, 0.99),
        "load_average_1m": os.getloadavg()[0],
    }


def _router_config(tmp: Path, http_port: int, grpc_port: int) -> Path:
    path = tmp / "router.yaml"
    path.write_text(
        f"http: {{host: 127.0.0.1, port: {http_port}}}\ngrpc: {{host: 127.0.0.1, port: {grpc_port}}}\n"
        f"models: [{{name: {MODEL}, tokenizer: byte, max_context_tokens: 4096}}]\n"
        f"security: {{report_token: {TOKEN}}}\ntelemetry: {{log_level: WARNING}}\n"
    )
    return path


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _wait_ready(url: str, workers: int = 1, timeout_s: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient() as c:
        while time.monotonic() < deadline:
            try:
                if (await c.get(url + "/readyz")).json().get("workers", 0) >= workers:
                    return
            except (httpx.HTTPError, ValueError):
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"router at {url} not ready with {workers} worker(s) in {timeout_s} s")


class _Stamp:
    """ASGI middleware: the time each API request enters the router's application."""

    def __init__(self, app: Any, stamps: list[float]) -> None:
        self.app, self.stamps = app, stamps

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            self.stamps.append(time.perf_counter())
        await self.app(scope, receive, send)


async def bench_latency(n: int) -> dict[str, Any]:
    """Router and worker in this process (shared clock); sequential streamed requests."""
    import grpc
    import httpx

    from zipkv.controlplane.app import build_app
    from zipkv.controlplane.config import RouterConfig
    from zipkv.controlplane.scripted_worker import ScriptedWorker, send_report
    from zipkv.controlplane.server import running_router
    from zipkv.protos import zipkv_pb2 as pb
    from zipkv.protos import zipkv_pb2_grpc as pb_grpc

    cfg = RouterConfig.model_validate(
        {
            "http": {"host": "127.0.0.1", "port": 0},
            "grpc": {"host": "127.0.0.1", "port": 0},
            "models": [{"name": MODEL}],
            "security": {"report_token": TOKEN},
            "placement": {"stale_after_ms": 600_000, "expire_after_ms": 600_000},
        }
    )
    worker = ScriptedWorker(total_tokens=10_000_000)
    await worker.start()
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 1, "stream": True}
    via_router: list[float] = []
    asgi_in: list[float] = []
    direct: list[float] = []
    stamps: list[float] = []
    app = build_app(cfg)
    app.add_middleware(_Stamp, stamps=stamps)  # outermost app code: the request's "HTTP in"
    async with running_router(cfg, app) as r:
        await send_report(r.report_address, worker.report(), TOKEN)
        async with httpx.AsyncClient() as c:
            for i in range(n + 50):
                t0 = time.perf_counter()
                async with c.stream("POST", r.http_url + "/v1/completions", json=body) as resp:
                    async for _ in resp.aiter_lines():
                        pass
                if i >= 50:
                    via_router.append((worker.seen.arrived_s[-1] - t0) * 1e3)
                    asgi_in.append((worker.seen.arrived_s[-1] - stamps[-1]) * 1e3)
        async with grpc.aio.insecure_channel(worker.address) as ch:
            stub = pb_grpc.WorkerStub(ch)
            req = pb.GenerateRequest(
                request_id="d",
                model=MODEL,
                prompt_token_ids=[256, 104],
                sampling=pb.SamplingParams(max_new_tokens=1),
            )
            for i in range(n + 50):
                t0 = time.perf_counter()
                async for _ in stub.Generate(req):
                    pass
                if i >= 50:
                    direct.append((worker.seen.arrived_s[-1] - t0) * 1e3)
    await worker.stop(0)
    p50_r, p50_d = statistics.median(via_router), statistics.median(direct)
    return {
        "requests": n,
        "http_in_to_worker_p50_ms": statistics.median(asgi_in),
        "http_in_to_worker_p99_ms": _pct(asgi_in, 0.99),
        "client_send_to_worker_p50_ms": p50_r,
        "client_send_to_worker_p99_ms": _pct(via_router, 0.99),
        "direct_grpc_to_worker_p50_ms": p50_d,
        "direct_grpc_to_worker_p99_ms": _pct(direct, 0.99),
        "added_by_router_p50_ms": p50_r - p50_d,
    }


async def _drive(url: str, concurrency: int, tokens: int, duration_s: float) -> dict[str, Any]:
    import httpx

    body = {"model": MODEL, "prompt": "hello", "max_tokens": tokens, "stream": True}
    ok = errors = streamed = 0
    stop_at = time.monotonic() + duration_s
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def one_client(c: httpx.AsyncClient) -> None:
        nonlocal ok, errors, streamed
        while time.monotonic() < stop_at:
            try:
                async with c.stream("POST", url + "/v1/completions", json=body) as resp:
                    lines = [ln async for ln in resp.aiter_lines() if ln]
                n_tok = len(lines) - 2  # minus the finish chunk and [DONE]
                if resp.status_code == 200 and lines[-1] == "data: [DONE]" and n_tok == tokens:
                    ok += 1
                    streamed += n_tok
                else:
                    errors += 1
            except httpx.HTTPError:
                errors += 1

    async with httpx.AsyncClient(limits=limits, timeout=30) as c:
        t0 = time.monotonic()
        await asyncio.gather(*(one_client(c) for _ in range(concurrency)))
        wall = time.monotonic() - t0
    return {
        "concurrency": concurrency,
        "tokens_per_request": tokens,
        "seconds": wall,
        "requests_ok": ok,
        "errors": errors,
        "requests_per_s": ok / wall,
        "streamed_tokens_per_s": streamed / wall,
    }


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def bench_throughput(concurrency: int, tokens: int, duration_s: float) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp())
    http_port, grpc_port = _free_port(), _free_port()
    cfg = _router_config(tmp, http_port, grpc_port)
    router = subprocess.Popen([sys.executable, "-m", "zipkv.controlplane", "--config", str(cfg)])
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "zipkv.controlplane.scripted_worker",
            "--router",
            f"127.0.0.1:{grpc_port}",
            "--token",
            TOKEN,
        ],
        stdout=subprocess.PIPE,
    )
    try:
        url = f"http://127.0.0.1:{http_port}"
        await _wait_ready(url)
        await _drive(url, concurrency, tokens, 2.0)  # warm-up
        cpu0 = _cpu_s(router.pid)
        out = await _drive(url, concurrency, tokens, duration_s)
        cpu = _cpu_s(router.pid) - cpu0
        # The machine is shared: requests per CPU-second of the router process does not depend on how
        # much of a core the other tenants left it.
        out.update(
            router_cpu_s=cpu,
            router_cpu_share=cpu / out["seconds"],
            requests_per_router_cpu_s=out["requests_ok"] / cpu,
        )
        return out
    finally:
        for p in (router, worker):
            p.terminate()
        for p in (router, worker):
            p.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=str(ROOT / "bench/results/router.json"))
    parser.add_argument("--workers", type=int, default=100)
    parser.add_argument("--iters", type=int, default=20_000)
    parser.add_argument("--latency-requests", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    placement = bench_placement(args.workers, args.iters)
    latency = asyncio.run(bench_latency(args.latency_requests))
    throughput = asyncio.run(bench_throughput(args.concurrency, args.tokens, args.seconds))
    result: dict[str, Any] = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "note": "shared development machine, other work running",
        },
        "versions": {
            p: version(p) for p in ("grpcio", "fastapi", "uvicorn", "starlette", "httpx", "protobuf")
        },
        "command": "python bench/bench_router.py " + " ".join(sys.argv[1:]),
        "placement": placement,
        "latency": latency,
        "throughput": throughput,
        "targets": {
            "placement_p50_le_0.2ms": placement["place_p50_ms"] <= 0.2,
            # Wall-clock p99 on a shared 2-core machine measures the other tenants; CPU time is the cost.
            "placement_p99_le_1ms_cpu": placement["place_cpu_p99_ms"] <= 1.0,
            "placement_p99_le_1ms_wall": placement["place_p99_ms"] <= 1.0,
            "http_in_to_worker_p50_le_2ms": latency["http_in_to_worker_p50_ms"] <= 2.0,
            "throughput_zero_errors": throughput["errors"] == 0,
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print("| measure | value |\n|---|---|")
    rows = [
        (
            "place() p50 / p99, 100 workers, wall (ms)",
            f"{placement['place_p50_ms']:.3f} / {placement['place_p99_ms']:.3f}",
        ),
        (
            "place() p50 / p99, 100 workers, thread CPU (ms)",
            f"{placement['place_cpu_p50_ms']:.3f} / {placement['place_cpu_p99_ms']:.3f}",
        ),
        (
            "decide() p50 / p99 incl. snapshot, span, metric (ms)",
            f"{placement['decide_p50_ms']:.3f} / {placement['decide_p99_ms']:.3f}",
        ),
        (
            "HTTP in -> worker p50 / p99 (ms)",
            f"{latency['http_in_to_worker_p50_ms']:.2f} / {latency['http_in_to_worker_p99_ms']:.2f}",
        ),
        (
            "client send -> worker p50 / p99 (ms)",
            f"{latency['client_send_to_worker_p50_ms']:.2f} / {latency['client_send_to_worker_p99_ms']:.2f}",
        ),
        ("direct gRPC -> worker p50 (ms)", f"{latency['direct_grpc_to_worker_p50_ms']:.2f}"),
        ("streamed requests/s (one router process)", f"{throughput['requests_per_s']:.0f}"),
        ("streamed tokens/s", f"{throughput['streamed_tokens_per_s']:.0f}"),
        (
            "router CPU share of one core / requests per router CPU-second",
            f"{throughput['router_cpu_share']:.2f} / {throughput['requests_per_router_cpu_s']:.0f}",
        ),
        ("errors", str(throughput["errors"])),
    ]
    for name, value in rows:
        print(f"| {name} | {value} |")
    return 0 if all(result["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
