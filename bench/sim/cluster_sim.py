"""Placement at cluster scale: the Mooncake trace on N simulated H200 workers under each policy.

    python -m bench.sim.cluster_sim --jobs 2             # -> bench/results/cluster_sim.json + cluster_sim.png
    python -m bench.sim.cluster_sim --workers 8 --hetero-workers 8 --requests 1000 --jobs 2   # smaller
    python -m bench.sim.cluster_sim --workers 8,32 --pools zipkv,mixed_ratio,mixed_budget \
        --policies zipkv_affinity --merge --jobs 2   # add rows to the results, keep the others

The trace is sampled: requests --offset .. --offset + --requests (4,000 of 12,031 by default, the first
1,302 s of the hour), so that the whole sweep runs in about half an hour on two cores; the JSON's `trace`
says which. Each simulation prints a progress line (done / total, elapsed, an estimate of what is left).

Pools (each N workers, the mixed ones only at the --hetero-workers sizes; Llama-3.1-8B, the measured KV
budget of 388,608 raw tokens per worker unless said):
    zipkv         zipkv workers, KV compressed at the measured ratio (0.7618 of raw bytes)
    sglang        SGLang's own FlashInfer workers, uncompressed
    mixed_ratio   half zipkv (0.7618), half zipkv with compression off (1.0): a fleet mid-rollout
    mixed_budget  zipkv workers, half with the budget, half with twice it (more of the GPU left for KV);
                  their decode steps are extrapolated past the largest measured KV read (63 GB)
Every policy of sim_policies.py and zipkv's router (sim_zipkv_router.py) places the same requests at the
same times; zipkv's router is given each SLO as the client's SLO headers would, so it runs once per SLO.
Step times: step_model.py + sim_calibrate.py (fit, residuals and the replay of the measured runs go into
the JSON). Metrics: bench/serving/serving_metrics.py, the same code as the GPU serving sweep.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import platform
import sys
import time
from pathlib import Path
from typing import Any

from bench.paths import RESULTS
from bench.serving.serving_metrics import SLOS, rate_row
from bench.serving.trace_workload import LLAMA3_CONTEXT_TOKENS, arrivals_s, load_trace, summary
from bench.sim.sim_calibrate import compression_ratio, spec_for
from bench.sim.sim_cluster import ZIPKV_POLICIES, simulate, zipkv_config
from bench.sim.sim_policies import BASELINES
from bench.sim.sim_report import build_report
from bench.sim.sim_worker import WorkerSpec
from bench.sim.step_model import GIB_PER_GB, StepModel

POOLS = ("zipkv", "sglang", "mixed_ratio", "mixed_budget")
HETERO_POOLS = ("mixed_ratio", "mixed_budget")
POLICIES = (*BASELINES, *ZIPKV_POLICIES)
PER_WORKER_RPS = (0.25, 0.5, 0.75, 0.875, 1.0, 1.125, 1.25, 1.5, 2.0)


def pool_specs(pool: str, n: int, models: dict[str, StepModel]) -> list[WorkerSpec]:
    zipkv, plain = (
        spec_for("zipkv", models["zipkv"]),
        spec_for("zipkv_uncompressed", models["zipkv_uncompressed"]),
    )
    if pool == "zipkv":
        return [zipkv] * n
    if pool == "sglang":
        return [spec_for("sglang", models["sglang"])] * n
    if pool == "mixed_ratio":
        return [zipkv if i % 2 == 0 else plain for i in range(n)]
    if pool == "mixed_budget":
        big = WorkerSpec(
            name="zipkv-2x-budget",
            system="zipkv",
            step=zipkv.step,
            budget_tokens=2 * zipkv.budget_tokens,
            compression_ratio=zipkv.compression_ratio,
            max_running=128,
        )
        return [zipkv if i % 2 == 0 else big for i in range(n)]
    raise ValueError(f"unknown pool {pool!r}: one of {', '.join(POOLS)}")


def router_prefill_ms_per_token(models: dict[str, StepModel]) -> float:
    """What an operator configures as models[].prefill_ms_per_token: zipkv's measured prefill rate."""
    return 1000.0 / models["zipkv"].prefill_tokens_per_s


def router_decode_ms_per_gib(models: dict[str, StepModel]) -> float:
    """placement.decode_ms_per_gib as configured for an H200: zipkv's fitted read cost per stored GiB."""
    return models["zipkv"].ms_per_kv_gb / compression_ratio("zipkv") * GIB_PER_GB


def run_job(job: dict[str, Any]) -> list[dict[str, object]]:
    """One simulated run; a row per SLO it answers for (a baseline: both; zipkv: the one it was given)."""
    models: dict[str, StepModel] = job["models"]
    reqs = load_trace(LLAMA3_CONTEXT_TOKENS, job["requests"], job["offset"])
    pool = pool_specs(job["pool"], job["workers"], models)
    rate = job["per_worker_rps"] * job["workers"]
    slos = [s for s in SLOS if s.name == job["slo"]] if job["slo"] else list(SLOS)
    t0 = time.monotonic()
    res = simulate(
        pool,
        job["policy"],
        reqs,
        arrivals_s(reqs, rate),
        slos[0],
        router_prefill_ms_per_token(models),
        decode_ms_per_gib=router_decode_ms_per_gib(models),
        affinity_weight=job["affinity_weight"],
    )
    head = {"pool": job["pool"], "workers": job["workers"], "policy": job["policy"]}
    rows = []
    for slo in slos:
        row = rate_row(res.outcomes, rate, res.duration_s, slo, res.gap_ms, res.gap_weights)
        rows.append(
            {
                **head,
                **row,
                "per_worker_rps": job["per_worker_rps"],
                "peak_running": res.peak_running,
                "prefix_hit_fraction": round(res.prefix_hit_fraction, 4),
                **({"router": res.router} if res.router is not None else {}),
            }
        )
    print(
        f"[cluster_sim] {job['pool']:12s} N={job['workers']:2d} {job['policy']:14s} {rate:6.2f} rps "
        f"{'/'.join(str(r['attainment']) for r in rows)} attained, {time.monotonic() - t0:.0f} s",
        flush=True,
    )
    return rows


def run_all(todo: list[dict[str, Any]], n_jobs: int) -> list[dict[str, object]]:
    """Every job's rows, in the order of `todo`; a progress line per finished simulation."""
    t0 = time.monotonic()
    parts: list[list[dict[str, object]]] = [[] for _ in todo]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(n_jobs) if n_jobs > 1 else _Inline() as pool:
        for k, (i, part) in enumerate(pool.imap_unordered(_indexed, list(enumerate(todo))), 1):
            parts[i] = part
            el_s = time.monotonic() - t0
            left_s = el_s / k * (len(todo) - k)
            print(f"[cluster_sim] {k}/{len(todo)} done, {el_s:.0f} s in, ~{left_s:.0f} s left", flush=True)
    return [r for part in parts for r in part]


def _indexed(item: tuple[int, dict[str, Any]]) -> tuple[int, list[dict[str, object]]]:
    return item[0], run_job(item[1])


class _Inline:
    """multiprocessing.Pool's imap_unordered in this process (--jobs 1)."""

    def __enter__(self) -> _Inline:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def imap_unordered(self, fn: Any, items: list[Any]) -> Any:
        return map(fn, items)


def jobs(args: argparse.Namespace, models: dict[str, StepModel]) -> list[dict[str, Any]]:
    out = []
    for n in args.workers:
        for pool in args.pools:
            if pool in HETERO_POOLS and n not in args.hetero_workers:
                continue
            for policy in args.policies:
                for slo in [s.name for s in SLOS] if policy in ZIPKV_POLICIES else [None]:
                    for per in args.per_worker_rps:
                        out.append(
                            {
                                "models": models,
                                "pool": pool,
                                "workers": n,
                                "policy": policy,
                                "slo": slo,
                                "per_worker_rps": per,
                                "requests": args.requests,
                                "offset": args.offset,
                                "affinity_weight": args.affinity_weight,
                            }
                        )
    return out


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.sim.cluster_sim", description=__doc__.split("\n")[0])
    floats = lambda s: tuple(float(x) for x in s.split(","))
    ints = lambda s: tuple(int(x) for x in s.split(","))
    p.add_argument("--workers", type=ints, default=(4, 8, 16, 32))
    p.add_argument("--hetero-workers", type=ints, default=(8, 32), help="sizes of the mixed pools")
    p.add_argument("--pools", type=lambda s: tuple(s.split(",")), default=POOLS)
    p.add_argument("--policies", type=lambda s: tuple(s.split(",")), default=POLICIES)
    p.add_argument("--per-worker-rps", type=floats, default=PER_WORKER_RPS, help="offered load per worker")
    p.add_argument("--requests", type=int, default=4000, help="trace requests from --offset")
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1, help="simulations run in parallel (processes)")
    p.add_argument(
        "--affinity-weight",
        type=float,
        default=None,
        help="placement.weight_prefix_affinity of zipkv_affinity (default: the router's default)",
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="keep --out's rows and replace only those this run simulates (same pool, workers, policy, "
        "SLO and rate); the run is listed under `additions`",
    )
    p.add_argument("--out", type=Path, default=RESULTS / "cluster_sim.json")
    p.add_argument("--plot", type=Path, default=RESULTS / "cluster_sim.png")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from bench.sim.sim_calibrate import calibrated_models, replay_table

    args = _parse(argv)
    t0 = time.monotonic()
    models, decode_table = calibrated_models()
    todo = jobs(args, models)
    print(f"[cluster_sim] {len(todo)} simulations, {args.jobs} at a time", flush=True)
    rows = run_all(todo, args.jobs)
    reqs = load_trace(LLAMA3_CONTEXT_TOKENS, args.requests, args.offset)
    meta = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "python -m bench.sim.cluster_sim " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": f"{platform.machine()} CPU, Python {platform.python_version()}",
        "versions": _versions(),
        "wall_s": round(time.monotonic() - t0, 1),
        "trace": {
            "sampled": f"requests {args.offset}..{args.offset + len(reqs) - 1} of the trace's 12,031",
            "offset": args.offset,
            **summary(reqs),
            "cap": f"context {LLAMA3_CONTEXT_TOKENS} tokens (none capped at Llama-3.1-8B's context)",
        },
        "slos": [{"name": s.name, "ttft_s": s.ttft_s, "mean_itl_ms": s.mean_itl_ms} for s in SLOS],
        "pools": {p: [s.name for s in pool_specs(p, 2, models)] for p in args.pools},
        "router_config": {
            "prefill_ms_per_token": round(router_prefill_ms_per_token(models), 5),
            "decode_ms_per_gib": round(router_decode_ms_per_gib(models), 4),
            "shed_wait_over_ttft": {n: v.shed_wait_over_ttft for n, v in ZIPKV_POLICIES.items()},
            "weight_prefix_affinity": {
                n: zipkv_config(n, affinity_weight=args.affinity_weight).weight_prefix_affinity
                for n in ZIPKV_POLICIES
            },
            "report_interval_ms": 200,
        },
    }
    if args.merge and args.out.is_file():
        meta, rows = merged(json.loads(args.out.read_text()), meta, rows)
    report = build_report(meta, models, decode_table, replay_table(models), rows)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    from bench.serving.serving_plots import plot_cluster

    plot_cluster(report["rows"], args.plot, workers=[n for n in (8, 32) if n in args.workers] or args.workers)
    for line in report["summary"]:
        print(json.dumps(line))
    print(f"[cluster_sim] wrote {args.out} and {args.plot} in {time.monotonic() - t0:.0f} s")
    return 0


ROW_KEY = ("pool", "workers", "policy", "slo", "per_worker_rps")
META_KEYS = ("date", "command", "machine", "versions", "wall_s", "trace", "slos", "pools", "router_config")


def merged(
    old: dict[str, Any], meta: dict[str, Any], rows: list[dict[str, object]]
) -> tuple[dict[str, Any], list[dict[str, object]]]:
    """The earlier report's rows with this run's in place of the ones it re-simulated; the earlier run's
    description stays, this run's goes under `additions`. Knees are recomputed over all rows."""
    if old["trace"]["sampled"] != meta["trace"]["sampled"]:
        raise SystemExit(f"--merge: {old['trace']['sampled']!r} there, {meta['trace']['sampled']!r} here")
    new_keys = {tuple(r[k] for k in ROW_KEY) for r in rows}
    computed = ("knee_rps", "goodput_at_knee_rps", "sustained_rps")
    kept = [
        {k: v for k, v in r.items() if k not in computed}
        for r in old["rows"]
        if tuple(r[k] for k in ROW_KEY) not in new_keys
    ]
    addition = {k: meta[k] for k in ("date", "command", "wall_s")}
    addition["router_config"] = meta["router_config"]
    addition["rows"] = len(rows)
    out = {k: old[k] for k in META_KEYS}
    out["additions"] = [*old.get("additions", []), addition]
    return out, kept + rows


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    return {k: md.version(k) for k in ("simpy", "numpy", "matplotlib")}


if __name__ == "__main__":
    raise SystemExit(main())
