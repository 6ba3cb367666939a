"""Router bench, part 1: what one placement decision costs, in process, with no network.

`place()` over a snapshot of N workers in mixed fresh state (p50/p99 of single calls, wall and thread CPU
time), and the full decision as the router makes it (snapshot + span + metric: `Dispatcher.decide`).
Also holds the model name and the percentile that the served-router part (`router_traffic`) shares, so
that both report over one definition.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zipkv.controlplane.config import RouterConfig
    from zipkv.controlplane.placement import RequestShape
    from zipkv.controlplane.state import Snapshot, WorkerView

MODEL = "zipkv-tiny"
# Untimed calls before measuring, so the samples are steady-state calls, not first-call costs.
WARMUP_CALLS = 500
# (wall ms, thread CPU ms), one pair per timed call
_Samples = tuple[list[float], list[float]]


def pct(xs: list[float], q: float) -> float:
    """The q-quantile as the sample at rank floor(q * n) (no interpolation)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _worker_views(n_workers: int, now_s: float) -> list[WorkerView]:
    """N workers whose free tokens, queues, ITL and report age all differ, so scoring has work to do."""
    from zipkv.controlplane.state import WorkerView
    from zipkv.protos.capacity import Capacity

    cap = Capacity(0, 0, 200_000, 0.7, 0, 0, 0, 20.0, 15.0, 8192, 131_072)
    base = WorkerView("w", "127.0.0.1:1", MODEL, 1, 1, now_s, now_s, False, cap)
    return [
        replace(
            base,
            worker_id=f"w{i:03d}",
            received_s=now_s - 0.01 * (i % 20),
            capacity=replace(
                cap,
                headroom_tokens=20_000 + 1_500 * i,
                queued_requests=i % 5,
                itl_ms=8.0 + (i % 13),
                queued_prefill_tokens=100 * (i % 7),
            ),
        )
        for i in range(n_workers)
    ]


def _time_place(snap: Snapshot, shape: RequestShape, cfg: RouterConfig, now_s: float, iters: int) -> _Samples:
    """Wall and thread CPU ms of single `place()` calls, after an untimed warm-up."""
    from zipkv.controlplane.placement import place

    for _ in range(WARMUP_CALLS):
        place(snap, shape, cfg.placement, now_s)
    # The timed loop stays inline (no helper taking a callable): an extra call per sample would be
    # measured with the sub-0.1 ms decision.
    wall_ms, cpu_ms = [], []
    for _ in range(iters):
        c0, t0 = time.thread_time_ns(), time.perf_counter()
        place(snap, shape, cfg.placement, now_s, top_k=9)
        wall_ms.append((time.perf_counter() - t0) * 1e3)
        cpu_ms.append((time.thread_time_ns() - c0) / 1e6)
    return wall_ms, cpu_ms


def _time_decide(
    views: list[WorkerView], shape: RequestShape, cfg: RouterConfig, now_s: float, iters: int
) -> _Samples:
    """Wall and thread CPU ms of `Dispatcher.decide`: snapshot, placement, span and metric together."""
    from opentelemetry.sdk.trace import TracerProvider

    from zipkv.controlplane.dispatch import Dispatcher
    from zipkv.controlplane.metrics import RouterMetrics
    from zipkv.controlplane.state import MemoryStore

    store = MemoryStore(cfg.placement.expire_after_ms, cfg.placement.reservation_ttl_s, clock=lambda: now_s)
    for v in views:
        store.put_report_sync(v)
    disp = Dispatcher(cfg, store, RouterMetrics(), TracerProvider().get_tracer("bench"), clock=lambda: now_s)
    wall_ms, cpu_ms = [], []
    for _ in range(iters):
        c0, t0 = time.thread_time_ns(), time.perf_counter()
        d = disp.decide(shape)
        wall_ms.append((time.perf_counter() - t0) * 1e3)
        cpu_ms.append((time.thread_time_ns() - c0) / 1e6)
    assert d.ranked and not d.filtered  # every worker was a candidate and scored
    return wall_ms, cpu_ms


def bench_placement(n_workers: int, iters: int) -> dict[str, Any]:
    from zipkv.controlplane.config import RouterConfig
    from zipkv.controlplane.placement import RequestShape
    from zipkv.controlplane.state import Snapshot

    now = time.time()
    views = _worker_views(n_workers, now)
    cfg = RouterConfig.model_validate({"models": [{"name": MODEL}]})
    shape = RequestShape(MODEL, 512, 256, 2000.0, 100.0, 0.05)
    pure_ms, pure_cpu_ms = _time_place(Snapshot(tuple(views), now), shape, cfg, now, iters)
    full_ms, full_cpu_ms = _time_decide(views, shape, cfg, now, iters // 4)
    return {
        "workers": n_workers,
        "iterations": iters,
        "place_p50_ms": pct(pure_ms, 0.5),
        "place_p99_ms": pct(pure_ms, 0.99),
        "place_cpu_p50_ms": pct(pure_cpu_ms, 0.5),
        "place_cpu_p99_ms": pct(pure_cpu_ms, 0.99),
        "decide_p50_ms": pct(full_ms, 0.5),
        "decide_p99_ms": pct(full_ms, 0.99),
        "decide_cpu_p50_ms": pct(full_cpu_ms, 0.5),
        "decide_cpu_p99_ms": pct(full_cpu_ms, 0.99),
        "load_average_1m": os.getloadavg()[0],
    }
