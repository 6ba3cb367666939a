"""The decode step's plan on the GPU: one Triton launch (split_plan_triton.py) against the torch ops
(split_plan.py), each recorded into a CUDA graph as SGLang records it, and replayed.

Per batch size: the plan's kernel launches (torch's profiler, one eager plan), and the replayed graph's time
(CUDA events around ``--reps`` replays, mean). Contexts are drawn like the Mooncake trace's running batches
(1k-20k tokens, one request of 87k). Both plans are checked integer for integer before they are timed.

    python -m bench.kernels.bench_split_plan --out bench/results/split_plan_h100.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
from typing import Any

import torch

from zipkv.kernels.attention.decode_plan import SPLIT_PLAN_ENV, DecodePlan, plan_decode
from zipkv.kernels.format.layout import PageFormat

FIELDS = ("num_splits", "split_tokens", "work", "pair_start")


def _batch(batch: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SGLang's padded page table (``width`` pages a request), its indptr, and the contexts."""
    rng = random.Random(seed)
    lens = [rng.randint(1024, 20000) for _ in range(batch)]
    lens[0] = min(87000, width * 16)
    ids = torch.arange(batch * width, dtype=torch.int32, device="cuda")
    indptr = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * width
    return ids, indptr, torch.tensor(lens, dtype=torch.int32, device="cuda")


def _plan(impl: str, args: tuple[torch.Tensor, ...], fmt: PageFormat) -> DecodePlan:
    os.environ[SPLIT_PLAN_ENV] = impl
    return plan_decode(*args, fmt, 32)


def _launches(impl: str, args: tuple[torch.Tensor, ...], fmt: PageFormat) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _plan(impl, args, fmt)
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def _graph_us(impl: str, args: tuple[torch.Tensor, ...], fmt: PageFormat, reps: int) -> tuple[float, Any]:
    _plan(impl, args, fmt)  # compile and lazy inits outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan = _plan(impl, args, fmt)
    for _ in range(10):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps, plan


def measure(batch: int, reps: int) -> dict[str, Any]:
    fmt = PageFormat(128, 8)
    args = _batch(batch, 87000 // 16 + 1, seed=batch)
    row: dict[str, Any] = {"batch": batch}
    plans = {}
    for impl in ("torch", "kernel"):
        us, plans[impl] = _graph_us(impl, args, fmt, reps)
        row[impl] = {"graph_replay_us": round(us, 2), "launches": _launches(impl, args, fmt)}
    torch_plan, kernel_plan = plans["torch"], plans["kernel"]
    row["identical"] = all(torch.equal(getattr(torch_plan, f), getattr(kernel_plan, f)) for f in FIELDS)
    row["speedup"] = round(row["torch"]["graph_replay_us"] / row["kernel"]["graph_replay_us"], 2)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,8,32,64,128,256")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    rows = []
    for batch in (int(b) for b in a.batches.split(",")):
        rows.append(measure(batch, a.reps))
        print("split_plan", json.dumps(rows[-1]), flush=True)
    record = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "command": f"python -m bench.kernels.bench_split_plan --batches {a.batches} --reps {a.reps}",
        "rows": rows,
        "ok": all(r["identical"] for r in rows),
    }
    if a.out:
        with open(a.out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
