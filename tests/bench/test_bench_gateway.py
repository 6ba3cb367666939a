"""bench/router/bench_gateway.py's parts that run without the gateway's wheel: the stand-in SGLang server
streams what was asked and stamps arrivals; the load driver (router_traffic.drive_streams, shared with
zipkv's router bench) counts whole streams as good and anything else as errors."""

from __future__ import annotations

import asyncio

import httpx

from bench.router.bench_gateway import _body, _sequential_ms
from bench.router.router_traffic import drive_streams
from bench.router.standin_sglang import StandInSGLang


def test_the_standin_streams_the_tokens_asked_and_stamps_arrivals() -> None:
    with StandInSGLang() as worker:
        with httpx.stream("POST", worker.url + "/generate", json=_body(3), timeout=5) as resp:
            lines = [ln for ln in resp.iter_lines() if ln]
        assert resp.status_code == 200 and len(lines) == 4 and lines[-1] == "data: [DONE]"
        assert '"completion_tokens": 3' in lines[2] and len(worker.arrived_s) == 1
        assert len(_sequential_ms(worker.url, worker, 5)) == 5 and len(worker.arrived_s) == 56  # 50 warm-up


def test_the_driver_counts_whole_streams() -> None:
    with StandInSGLang() as worker:
        url = worker.url + "/generate"
        got = asyncio.run(drive_streams(url, _body(4), 5, 4, concurrency=2, duration_s=0.5))
        assert got["requests_ok"] > 0 and got["errors"] == 0
        assert got["requests_ok"] == len(worker.arrived_s)
        short = asyncio.run(drive_streams(url, _body(4), 6, 4, concurrency=1, duration_s=0.2))  # a line short
        assert short["requests_ok"] == 0 and short["errors"] > 0
        bad = asyncio.run(
            drive_streams(worker.url + "/nowhere", _body(4), 5, 4, concurrency=1, duration_s=0.2)
        )
        assert bad["requests_ok"] == 0 and bad["errors"] > 0
