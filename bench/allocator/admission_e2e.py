"""Admission from compressed capacity: concurrent requests at a small KV budget, compression on vs off.

The reference engine (tiny model, CPU) gets the same burst of requests twice at the same KV budget,
once storing full pages compressed and once raw. Admission reserves each request's worst case at raw size
(`PagePool.headroom_pages()`, never optimistic), so compression can only admit more by really freeing
memory. Reported per budget: the most requests running at once, the mean, steps to drain the burst, and
that every request finished normally with identical tokens in both runs.

    python -m bench.allocator.admission_e2e --out bench/results/admission_e2e.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

from zipkv.worker.engine import EngineRequest, FinishReason, SamplingOptions
from zipkv.worker.engines.reference.engine import ReferenceEngine, ReferenceEngineConfig
from zipkv.worker.engines.reference.model import TINY_BOS, LoadedModel, load_model


def burst(n: int, prompt_tokens: int, max_new: int) -> list[EngineRequest]:
    out = []
    for i in range(n):
        g = torch.Generator().manual_seed(i)
        ids = (TINY_BOS, *torch.randint(0, 256, (prompt_tokens - 1,), generator=g).tolist())
        out.append(EngineRequest(f"r{i}", ids, SamplingOptions(max_new_tokens=max_new, ignore_eos=True)))
    return out


def run(
    tiny: LoadedModel, reqs: list[EngineRequest], budget: int, chunk: int, compression: bool
) -> dict[str, Any]:
    config = ReferenceEngineConfig(kv_budget_bytes=budget, chunk_bytes=chunk, compression=compression)
    engine = ReferenceEngine(tiny, config, "cpu")
    for r in reqs:
        engine.add_request(r)
    tokens: dict[str, list[int]] = {r.request_id: [] for r in reqs}
    finishes: dict[str, str] = {}
    running: list[int] = []
    ratio = 1.0
    start = time.perf_counter()
    while engine.has_work():
        for e in engine.step():
            tokens[e.request_id].extend(e.token_ids)
            if e.finish is not None:
                finishes[e.request_id] = e.finish.value
        running.append(engine.capacity().running_requests)
        ratio = min(ratio, engine.store.stats().compression_ratio)
    return {
        "compression": compression,
        "max_running": max(running),
        "mean_running": round(sum(running) / len(running), 2),
        "steps": engine.steps,
        "wall_s": round(time.perf_counter() - start, 2),
        "min_compression_ratio": round(ratio, 4),
        "all_finished_by_length": all(finishes.get(r.request_id) == FinishReason.LENGTH.value for r in reqs),
        "tokens": tokens,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budgets-mib", default="2,3,4")
    p.add_argument("--chunk-kib", type=int, default=64)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--max-new", default="32,96", help="comma-separated: one workload per value")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    tiny = load_model(None, "cpu")
    rows = []
    for max_new in (int(x) for x in args.max_new.split(",")):
        reqs = burst(args.requests, args.prompt_tokens, max_new)
        for mib in (float(x) for x in args.budgets_mib.split(",")):
            budget, chunk = int(mib * (1 << 20)), args.chunk_kib << 10
            on, off = run(tiny, reqs, budget, chunk, True), run(tiny, reqs, budget, chunk, False)
            rows.append(
                {
                    "kv_budget_mib": mib,
                    "max_new_tokens": max_new,
                    "identical_tokens": on.pop("tokens") == off.pop("tokens"),
                    "compressed": on,
                    "uncompressed": off,
                    "max_running_gain": round(on["max_running"] / off["max_running"], 3),
                }
            )
    result = {
        "benchmark": "admission at a small KV budget, compression on vs off (reference engine, tiny model)",
        "machine": f"{platform.machine()} CPU, {torch.get_num_threads()} torch thread(s)",
        "versions": {"torch": torch.__version__, "python": sys.version.split()[0]},
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "command": "python -m bench.allocator.admission_e2e "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "workload": {
            "requests": args.requests,
            "prompt_tokens": args.prompt_tokens,
            "chunk_kib": args.chunk_kib,
        },
        "rows": rows,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(
        "| KV budget | new tokens | max running on / off | mean running on / off | steps on / off | ratio "
        "| identical | none failed |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        on, off = r["compressed"], r["uncompressed"]
        print(
            f"| {r['kv_budget_mib']:g} MiB | {r['max_new_tokens']} | "
            f"{on['max_running']} / {off['max_running']} | "
            f"{on['mean_running']} / {off['mean_running']} | {on['steps']} / {off['steps']} | "
            f"{on['min_compression_ratio']} | {r['identical_tokens']} | "
            f"{on['all_finished_by_length'] and off['all_finished_by_length']} |"
        )
    ok = all(r["identical_tokens"] and r["compressed"]["all_finished_by_length"] for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
