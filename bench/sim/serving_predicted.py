"""What the cluster simulation predicts for the serving sweep on N workers, beside what the sweep measured.

    python -m bench.sim.serving_predicted --workers 2 --rates 1,2,4,6 \\
        --out bench/results/serving_predicted_two_gpu.json                      # before the GPU run
    python -m bench.sim.serving_predicted --workers 2 --measured bench/results/serving_goodput_two_gpu.json \\
        --out bench/results/serving_predicted_two_gpu.json                      # after it: side by side

The same trace window as the sweep (the measured file's `workload`, else --requests / --offset and the
sweep's 131,072-token context cap), its arrivals scaled to each rate, on N simulated workers of the same
KV budget, chunked prefill and running cap (bench/sim/sim_calibrate.py's worker, fitted to the one-GPU runs).
The sweep's systems map to the simulation's placement:
    zipkv                        zipkv's router (sim_zipkv_router.py: the router's own placement code)
    sglang_gateway_cache_aware   cache_aware (sglang-router 0.3.2's default, as sim_policies.py states it)
    sglang_gateway_power_of_two  least_requests: power_of_two draws two workers and takes the one with fewer
                                 requests in flight; with two workers it always compares both, so it is
                                 least requests (ties aside)
Rows per system, rate and SLO: goodput, attainment and TTFT / ITL p50 and p99 (serving_metrics.rate_row,
the code the sweep's table uses), with the measured row's values and simulated / measured - 1 next to them
where a measurement exists.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench.paths import RESULTS
from bench.serving.serving_metrics import SLOS, rate_row
from bench.serving.trace_workload import arrivals_s, load_trace
from bench.sim.cluster_sim import router_decode_ms_per_gib, router_prefill_ms_per_token
from bench.sim.sim_calibrate import calibrated_models, spec_for
from bench.sim.sim_cluster import simulate

SIM_POLICY = {
    "zipkv": "zipkv",
    "sglang_gateway_cache_aware": "cache_aware",
    "sglang_gateway_power_of_two": "least_requests",
}
STEP_SYSTEM = {"zipkv": "zipkv"}  # the worker model per system; every SGLang worker is SGLang's (FlashInfer)
COMPARED = ("goodput_rps", "attainment", "ttft_p50_s", "ttft_p99_s", "itl_p50_ms", "itl_p99_ms")
SWEEP_CONTEXT_TOKENS = 131072  # bench/run_serving_gpu.sh's CONTEXT on the GPU
SWEEP_CHUNK_TOKENS = 8192  # its SGLANG_ARGS' chunked_prefill_size
SWEEP_MAX_RUNNING = 64


def side_by_side(predicted: dict[str, Any], measured: dict[str, Any] | None) -> dict[str, Any]:
    """One quantity's simulated and measured values and the relative error (None without both)."""
    out: dict[str, Any] = {}
    for q in COMPARED:
        p, m = predicted.get(q), (measured or {}).get(q)
        err = round(float(p) / float(m) - 1.0, 4) if p is not None and m else None
        out[q] = {"simulated": p, "measured": m, "error": err}
    return out


def measured_rows(measured: dict[str, Any] | None) -> dict[tuple[str, float, str], dict[str, Any]]:
    rows = (measured or {}).get("rows", [])
    return {(r["system"], float(r["rate_rps"]), r["slo"]): r for r in rows}


def predict(
    workers: int,
    rates: list[float],
    requests: int,
    offset: int,
    context_tokens: int,
    measured: dict[str, Any] | None = None,
    systems: tuple[str, ...] = tuple(SIM_POLICY),
) -> dict[str, Any]:
    models, _ = calibrated_models()
    reqs = load_trace(context_tokens, requests, offset)
    have = measured_rows(measured)
    # The router's configured costs as bench/sim/cluster_sim.py sets them, so these rows are its predictions.
    prefill_ms_per_token = router_prefill_ms_per_token(models)
    decode_ms_per_gib = router_decode_ms_per_gib(models)
    rows: list[dict[str, Any]] = []
    for system in systems:
        step = STEP_SYSTEM.get(system, "sglang")
        spec = spec_for(step, models[step], chunk_tokens=SWEEP_CHUNK_TOKENS, max_running=SWEEP_MAX_RUNNING)
        for rate in rates:
            for slo in SLOS:  # zipkv's router sheds against the SLO it is given: one run per SLO
                res = simulate(
                    [spec] * workers,
                    SIM_POLICY[system],
                    reqs,
                    arrivals_s(reqs, rate),
                    slo,
                    prefill_ms_per_token,
                    decode_ms_per_gib=decode_ms_per_gib,
                )
                row = rate_row(res.outcomes, rate, res.duration_s, slo, res.gap_ms, res.gap_weights)
                got = have.get((system, float(rate), slo.name))
                rows.append(
                    {
                        "system": system,
                        "sim_policy": SIM_POLICY[system],
                        "rate_rps": rate,
                        "slo": slo.name,
                        "per_worker_requests": res.per_worker_requests,
                        **side_by_side(row, got),
                    }
                )
    return {
        "workers": workers,
        "workload": {"requests": requests, "offset": offset, "max_context_tokens": context_tokens},
        "measured_source": (measured or {}).get("date"),
        "measured_device": (measured or {}).get("device"),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.sim.serving_predicted", description=__doc__.split("\n")[0]
    )
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rates", default="", help="req/s, comma-separated (default: the measured file's)")
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument(
        "--measured",
        type=Path,
        default=None,
        help="bench/serving/serving_goodput.py's JSON of the same sweep",
    )
    p.add_argument("--out", type=Path, default=RESULTS / "serving_predicted_two_gpu.json")
    args = p.parse_args(argv)
    measured = json.loads(args.measured.read_text()) if args.measured else None
    requests, offset, context = args.requests, args.offset, SWEEP_CONTEXT_TOKENS
    if measured:
        w = measured["workload"]
        if "windows" in w:  # bench/serving/serving_windows.py pooled it
            p.error(
                f"{args.measured} pools {len(w['windows'])} trace windows: this predicts one "
                "(--requests, --offset)"
            )
        requests, offset, context = int(w["requests"]), int(w["offset"]), int(w["max_context_tokens"])
    rates = [float(x) for x in args.rates.split(",") if x]
    if not rates and measured:
        rates = sorted({float(r["rate_rps"]) for r in measured["rows"]})
    if not rates:
        p.error("--rates, or --measured to take the sweep's rates from")
    report = predict(args.workers, rates, requests, offset, context, measured)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for r in report["rows"]:
        shown = ("goodput_rps", "ttft_p99_s", "itl_p99_ms")
        cells = {q: (r[q]["simulated"], r[q]["measured"]) for q in shown}
        print(r["system"], r["rate_rps"], r["slo"], json.dumps(cells))
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
