"""SGLang's gateway alone and zipkv's router alone, side by side on this machine, each in front of a stand-in
worker (no model): what either adds to a request, and how many streamed requests per second one process
carries. The one-GPU serving sweep measured SGLang's server without its gateway (one worker, nothing to
route), so the gateway's own cost is measured here (docs/benchmarks.md, "Serving under SLO ... three
systems").

    ZIPKV_SGLANG_ROUTER_SITE=/tmp/routersite python -m bench.router.bench_gateway \
        --out bench/results/gateway_overhead.json

The site: `python -m pip install --no-deps --target /tmp/routersite sglang-router==0.3.2 setproctitle orjson`.
- Gateway: sglang-router 0.3.2 (`cache_aware`, its default policy) in front of one stand-in SGLang server
  (bench/router/standin_sglang.py), streamed /generate requests of token ids (what the sweep sends it).
  Added latency: sequential requests, client send -> the stand-in's arrival (one process, one clock), less
  the same requests sent to the stand-in directly. Throughput: the stand-in in its own process, N
  concurrent streams of T tokens for D seconds; requests/s and requests per CPU-second of the gateway.
- zipkv's router: the same two measurements as bench/router/bench_router.py (its scripted gRPC worker).
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
import time
from pathlib import Path
from typing import Any

from bench.paths import RESULTS
from bench.router.router_placement import pct
from bench.router.router_traffic import bench_latency, bench_throughput, free_port, measured_streams
from bench.router.sglang_gateway import gateway_cmd
from bench.router.standin_sglang import StandInSGLang

SITE_ENV = "ZIPKV_SGLANG_ROUTER_SITE"
WARMUP_REQUESTS = 50
POLICY = "cache_aware"


def _site_version(site: str) -> str:
    """The installed sglang-router's version, from its dist-info folder in the site."""
    found = sorted(Path(site).glob("sglang_router-*.dist-info"))
    return found[-1].name.removeprefix("sglang_router-").removesuffix(".dist-info") if found else "unknown"


def _body(tokens: int) -> dict[str, Any]:
    return {"input_ids": [11, 12, 13, 14], "sampling_params": {"max_new_tokens": tokens}, "stream": True}


def _start_gateway(site: str, worker_urls: list[str]) -> tuple[subprocess.Popen[Any], str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([site, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(gateway_cmd(POLICY, worker_urls, port, free_port()), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)  # fmt: skip
    return proc, f"http://127.0.0.1:{port}"


def _wait_healthy(proc: subprocess.Popen[Any], url: str, timeout_s: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the gateway exited ({proc.returncode}): is sglang-router 0.3.2 in the site?")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the gateway did not answer {url}/health in {timeout_s:.0f} s")
        time.sleep(0.3)


def _sequential_ms(url: str, worker: StandInSGLang, n: int) -> list[float]:
    """Client send -> the stand-in's arrival, ms, for n sequential streamed requests after a warm-up."""
    import httpx

    out = []
    with httpx.Client(timeout=10) as c:
        for i in range(n + WARMUP_REQUESTS):
            t0 = time.perf_counter()
            with c.stream("POST", url + "/generate", json=_body(1)) as resp:
                for _ in resp.iter_lines():
                    pass
            if i >= WARMUP_REQUESTS:
                out.append((worker.arrived_s[-1] - t0) * 1e3)
    return out


def gateway_latency(site: str, n: int) -> dict[str, Any]:
    with StandInSGLang() as worker:
        proc, url = _start_gateway(site, [worker.url])
        try:
            _wait_healthy(proc, url)
            via = _sequential_ms(url, worker, n)
        finally:
            proc.terminate()
            proc.wait(10)
        direct = _sequential_ms(worker.url, worker, n)
    p50_v, p50_d = statistics.median(via), statistics.median(direct)
    return {"requests": n,
            "client_send_to_worker_p50_ms": p50_v, "client_send_to_worker_p99_ms": pct(via, 0.99),
            "direct_http_to_worker_p50_ms": p50_d, "direct_http_to_worker_p99_ms": pct(direct, 0.99),
            "added_by_gateway_p50_ms": p50_v - p50_d}  # fmt: skip


def gateway_throughput(site: str, concurrency: int, tokens: int, duration_s: float) -> dict[str, Any]:
    port = free_port()
    worker = subprocess.Popen([sys.executable, "-m", "bench.router.standin_sglang", "--port", str(port)])
    proc, url = _start_gateway(site, [f"http://127.0.0.1:{port}"])
    try:
        _wait_healthy(proc, url)
        # SGLang's /generate stream: one chunk per token, then [DONE]
        return asyncio.run(measured_streams(url + "/generate", _body(tokens), tokens + 1, tokens, concurrency,
                                            duration_s, proc.pid, "gateway"))  # fmt: skip
    finally:
        for p in (proc, worker):
            p.terminate()
            p.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=RESULTS / "gateway_overhead.json")
    ap.add_argument("--latency-requests", type=int, default=500)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=15.0)
    a = ap.parse_args()
    site = os.environ.get(SITE_ENV, "")
    if not (Path(site) / "sglang_router").is_dir():
        ap.error(f"set {SITE_ENV} to a folder holding sglang-router 0.3.2 (the install line is in --help)")
    record: dict[str, Any] = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "gateway": f"sglang-router {_site_version(site)} ({POLICY})",
        "command": f"{SITE_ENV}=... python -m bench.router.bench_gateway --concurrency {a.concurrency} "
        f"--tokens {a.tokens} --seconds {a.seconds:g}",
    }
    print("[bench_gateway] added latency: sglang-router, then zipkv's router", flush=True)
    record["gateway_latency"] = gateway_latency(site, a.latency_requests)
    record["zipkv_router_latency"] = asyncio.run(bench_latency(a.latency_requests))
    print("[bench_gateway] throughput: sglang-router, then zipkv's router", flush=True)
    record["gateway_throughput"] = gateway_throughput(site, a.concurrency, a.tokens, a.seconds)
    record["zipkv_router_throughput"] = asyncio.run(bench_throughput(a.concurrency, a.tokens, a.seconds))
    a.out.write_text(json.dumps(record, indent=1) + "\n")
    for key in ("gateway_latency", "zipkv_router_latency", "gateway_throughput", "zipkv_router_throughput"):
        print(f"[bench_gateway] {key}: {json.dumps(record[key])}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
