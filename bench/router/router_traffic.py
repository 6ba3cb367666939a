"""Router bench, part 2: the router serving HTTP traffic in front of a scripted worker (no model).

- Added latency (`bench_latency`): router and worker in this process, so the client's send and the
  worker's Generate arrival share a clock. Sequential streamed requests after a warm-up, measured from
  the router's HTTP entry and from the client's send (an upper bound on the router's share), against
  the same worker called directly over gRPC in the same run.
- Throughput (`bench_throughput`): one router process (`python -m zipkv.controlplane`) and one scripted
  worker process, driven by an asyncio client with N concurrent streamed requests of T tokens for D
  seconds; requests/s, streamed tokens/s, errors (any non-200, missing [DONE] or short stream), and the
  router process's CPU seconds.
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.router.router_placement import MODEL, pct

if TYPE_CHECKING:
    import httpx

    from zipkv.controlplane.config import RouterConfig
    from zipkv.testing.scripted_worker import ScriptedWorker

TOKEN = "bench-report-token-0123456789"
# Untimed requests before the latency samples: connection setup and first-request costs are not the
# router's steady-state share.
LATENCY_WARMUP_REQUESTS = 50
THROUGHPUT_WARMUP_S = 2.0


def _router_config(tmp: Path, http_port: int, grpc_port: int) -> Path:
    path = tmp / "router.yaml"
    path.write_text(
        f"http: {{host: 127.0.0.1, port: {http_port}}}\ngrpc: {{host: 127.0.0.1, port: {grpc_port}}}\n"
        f"models: [{{name: {MODEL}, tokenizer: byte, max_context_tokens: 4096}}]\n"
        f"security: {{report_token: {TOKEN}}}\ntelemetry: {{log_level: WARNING}}\n"
    )
    return path


def free_port() -> int:
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


def _latency_config() -> RouterConfig:
    from zipkv.controlplane.config import RouterConfig

    # Stale/expire far beyond the run: the worker reports once, and must stay placeable throughout.
    return RouterConfig.model_validate(
        {
            "http": {"host": "127.0.0.1", "port": 0},
            "grpc": {"host": "127.0.0.1", "port": 0},
            "models": [{"name": MODEL}],
            "security": {"report_token": TOKEN},
            "placement": {"stale_after_ms": 600_000, "expire_after_ms": 600_000},
        }
    )


async def _via_router(
    c: httpx.AsyncClient, url: str, worker: ScriptedWorker, stamps: list[float], n: int
) -> tuple[list[float], list[float]]:
    """(client send -> worker arrival ms, router HTTP entry -> worker arrival ms) per request."""
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 1, "stream": True}
    send_ms: list[float] = []
    http_in_ms: list[float] = []
    for i in range(n + LATENCY_WARMUP_REQUESTS):
        t0 = time.perf_counter()
        async with c.stream("POST", url + "/v1/completions", json=body) as resp:
            async for _ in resp.aiter_lines():
                pass
        if i >= LATENCY_WARMUP_REQUESTS:
            send_ms.append((worker.seen.arrived_s[-1] - t0) * 1e3)
            http_in_ms.append((worker.seen.arrived_s[-1] - stamps[-1]) * 1e3)
    return send_ms, http_in_ms


async def _direct_grpc(worker: ScriptedWorker, n: int) -> list[float]:
    """Client send -> worker arrival ms of Generate called on the worker itself: the no-router baseline."""
    import grpc

    from zipkv.protos import zipkv_pb2 as pb
    from zipkv.protos import zipkv_pb2_grpc as pb_grpc

    direct_ms: list[float] = []
    async with grpc.aio.insecure_channel(worker.address) as ch:
        stub = pb_grpc.WorkerStub(ch)
        req = pb.GenerateRequest(
            request_id="d",
            model=MODEL,
            prompt_token_ids=[256, 104],
            sampling=pb.SamplingParams(max_new_tokens=1),
        )
        for i in range(n + LATENCY_WARMUP_REQUESTS):
            t0 = time.perf_counter()
            async for _ in stub.Generate(req):
                pass
            if i >= LATENCY_WARMUP_REQUESTS:
                direct_ms.append((worker.seen.arrived_s[-1] - t0) * 1e3)
    return direct_ms


async def bench_latency(n: int) -> dict[str, Any]:
    """Router and worker in this process (shared clock); sequential streamed requests."""
    import httpx

    from zipkv.controlplane.app import build_app
    from zipkv.controlplane.server import running_router
    from zipkv.testing.scripted_worker import ScriptedWorker, send_report

    cfg = _latency_config()
    worker = ScriptedWorker(total_tokens=10_000_000)
    await worker.start()
    stamps: list[float] = []
    app = build_app(cfg)
    app.add_middleware(_Stamp, stamps=stamps)  # outermost app code: the request's "HTTP in"
    async with running_router(cfg, app) as r:
        await send_report(r.report_address, worker.report(), TOKEN)
        async with httpx.AsyncClient() as c:
            via_router_ms, http_in_ms = await _via_router(c, r.http_url, worker, stamps, n)
        direct_ms = await _direct_grpc(worker, n)
    await worker.stop(0)
    p50_r, p50_d = statistics.median(via_router_ms), statistics.median(direct_ms)
    return {
        "requests": n,
        "http_in_to_worker_p50_ms": statistics.median(http_in_ms),
        "http_in_to_worker_p99_ms": pct(http_in_ms, 0.99),
        "client_send_to_worker_p50_ms": p50_r,
        "client_send_to_worker_p99_ms": pct(via_router_ms, 0.99),
        "direct_grpc_to_worker_p50_ms": p50_d,
        "direct_grpc_to_worker_p99_ms": pct(direct_ms, 0.99),
        "added_by_router_p50_ms": p50_r - p50_d,
    }


async def drive_streams(
    url: str, body: dict[str, Any], good_lines: int, tokens: int, concurrency: int, duration_s: float
) -> dict[str, Any]:
    """`concurrency` clients POST `body` to `url` back to back for `duration_s`, each stream read whole: a
    request is good when it answers 200 with `good_lines` non-empty lines, the last `data: [DONE]`; any other
    answer, or a transport error, is an error. Shared by zipkv's router and SGLang's gateway benches."""
    import httpx

    ok = errors = 0
    stop_at = time.monotonic() + duration_s
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def one_client(c: httpx.AsyncClient) -> None:
        nonlocal ok, errors
        while time.monotonic() < stop_at:
            try:
                async with c.stream("POST", url, json=body) as resp:
                    lines = [ln async for ln in resp.aiter_lines() if ln]
                good = resp.status_code == 200 and lines[-1:] == ["data: [DONE]"] and len(lines) == good_lines
                ok, errors = ok + good, errors + (not good)
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
        "streamed_tokens_per_s": ok * tokens / wall,
    }


async def measured_streams(
    url: str, body: dict[str, Any], good_lines: int, tokens: int, concurrency: int, duration_s: float,
    pid: int, label: str,
) -> dict[str, Any]:  # fmt: skip
    """`drive_streams` after a warm-up, with the CPU seconds process `pid` (the `label`: router, gateway)
    spent. The machine is shared: requests per CPU-second of that process does not depend on how much of a
    core the other tenants left it."""
    await drive_streams(url, body, good_lines, tokens, concurrency, THROUGHPUT_WARMUP_S)
    cpu0_s = cpu_s(pid)
    out = await drive_streams(url, body, good_lines, tokens, concurrency, duration_s)
    used_s = cpu_s(pid) - cpu0_s
    out[f"{label}_cpu_s"] = used_s
    out[f"{label}_cpu_share"] = used_s / out["seconds"]
    out[f"requests_per_{label}_cpu_s"] = out["requests_ok"] / used_s if used_s else None
    return out


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start_processes(http_port: int, grpc_port: int) -> tuple[subprocess.Popen[Any], subprocess.Popen[Any]]:
    """The router process and a scripted worker process that reports to it."""
    cfg = _router_config(Path(tempfile.mkdtemp()), http_port, grpc_port)
    router = subprocess.Popen([sys.executable, "-m", "zipkv.controlplane", "--config", str(cfg)])
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "zipkv.testing.scripted_worker",
            "--router",
            f"127.0.0.1:{grpc_port}",
            "--token",
            TOKEN,
        ],
        stdout=subprocess.PIPE,
    )
    return router, worker


async def bench_throughput(concurrency: int, tokens: int, duration_s: float) -> dict[str, Any]:
    http_port, grpc_port = free_port(), free_port()
    router, worker = _start_processes(http_port, grpc_port)
    try:
        url = f"http://127.0.0.1:{http_port}"
        await _wait_ready(url)
        # the OpenAI stream: one chunk per token, the finish chunk, then [DONE]
        body = {"model": MODEL, "prompt": "hello", "max_tokens": tokens, "stream": True}
        out = await measured_streams(url + "/v1/completions", body, tokens + 2, tokens, concurrency,
                                     duration_s, router.pid, "router")  # fmt: skip
        return out
    finally:
        for p in (router, worker):
            p.terminate()
        for p in (router, worker):
            p.wait(10)
