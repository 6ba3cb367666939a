"""What the tensor-parallel ranks' headroom agreement costs: the gloo all-reduce it runs once per scheduler
pass (and once per allocation that needs new pages), timed between real processes on this machine.

    python -m bench.allocator.rank_agreement_cost --ranks 2 --calls 2000 \
        --out bench/results/rank_agreement_cost.json

Each rank is a process in a gloo group, as SGLang's ranks are in its CPU group; each calls
`rank_agreement.gloo_reduce_min` ``--calls`` times back to back (after ``--warmup``) and records each
call's wall time. Reported: the per-call median and p99 over every rank's calls, in microseconds.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any


def _rank(rank: int, ranks: int, rendezvous: str, calls: int, warmup: int, out: Any) -> None:
    import torch.distributed as dist

    from zipkv.worker.engines.sglang.rank_agreement import gloo_reduce_min

    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=ranks)
    try:
        reduce_min = gloo_reduce_min(None)
        times_us = []
        for i in range(warmup + calls):
            t0 = time.perf_counter()
            agreed = reduce_min([1000 - rank - i % 7])
            dt = time.perf_counter() - t0
            if agreed != [1000 - (ranks - 1) - i % 7]:
                raise RuntimeError(f"rank {rank}: the reduce gave {agreed} at call {i}")
            if i >= warmup:
                times_us.append(dt * 1e6)
        out.put((rank, times_us))
    finally:
        dist.destroy_process_group()


def measure(ranks: int, calls: int, warmup: int, workdir: Path) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    rendezvous = f"file://{workdir / f'rendezvous-{os.getpid()}-{time.monotonic_ns()}'}"
    procs = [ctx.Process(target=_rank, args=(r, ranks, rendezvous, calls, warmup, out)) for r in range(ranks)]
    for p in procs:
        p.start()
    per_rank = dict(out.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(60)
    every = sorted(t for ts in per_rank.values() for t in ts)
    return {
        "ranks": ranks,
        "calls_per_rank": calls,
        "median_us": round(statistics.median(every), 1),
        "p99_us": round(every[int(0.99 * (len(every) - 1))], 1),
        "max_us": round(every[-1], 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.allocator.rank_agreement_cost", description=__doc__.split("\n")[0]
    )
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--workdir", type=Path, default=Path("/tmp"))
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    print(f"[rank_agreement_cost] {a.ranks} processes, {a.calls} all-reduces each", flush=True)
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs ({platform.node()})",
        "command": "python -m bench.allocator.rank_agreement_cost "
        f"--ranks {a.ranks} --calls {a.calls} --warmup {a.warmup}",
        **measure(a.ranks, a.calls, a.warmup, a.workdir),
    }
    print(json.dumps(result), flush=True)
    if a.out:
        a.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
