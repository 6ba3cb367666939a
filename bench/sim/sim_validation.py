"""The cluster simulation against the GPU serving sweep: the same workload on one simulated worker.

    python -m bench.sim.sim_validation      # reads bench/results/serving_goodput.json -> sim_validation.json

For each system of the GPU sweep (zipkv and zipkv_uncompressed through zipkv's router, so with its
admission; sglang_gateway as SGLang's FlashInfer worker) and each of its first three rates, the simulation
replays the sweep's trace window (its offset, request count and context cap, from the file's `workload`)
at that rate and compares TTFT and ITL p50 / p99 with the measured ones: error = simulated / measured - 1,
`within_15pct` per quantity. Until the GPU sweep has run there is no file and this says so.
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
from bench.sim.sim_calibrate import calibrated_models, spec_for
from bench.sim.sim_cluster import simulate

STEP_SYSTEM = {"zipkv": "zipkv", "zipkv_uncompressed": "zipkv_uncompressed", "sglang_gateway": "sglang"}
QUANTITIES = ("ttft_p50_s", "ttft_p99_s", "itl_p50_ms", "itl_p99_ms")
TOLERANCE = 0.15


def _predicted(system: str, rate: float, measured: dict[str, Any], models: dict[str, Any]) -> dict[str, Any]:
    w = measured["workload"]
    reqs = load_trace(int(w["max_context_tokens"]), int(w["requests"]), int(w["offset"]))
    opts = measured["systems"].get(system, {}).get("options", {})
    step = STEP_SYSTEM[system]
    chunk = int(opts.get("sglang_args", {}).get("chunked_prefill_size", 8192))
    spec = spec_for(step, models[step], chunk_tokens=chunk, max_running=int(opts.get("max_running", 64)))
    policy = "zipkv" if system.startswith("zipkv") else "round_robin"
    res = simulate(
        [spec], policy, reqs, arrivals_s(reqs, rate), SLOS[0], 1000.0 / models["zipkv"].prefill_tokens_per_s
    )
    return rate_row(res.outcomes, rate, res.duration_s, SLOS[0], res.gap_ms, res.gap_weights)


def compare(measured: dict[str, Any], rates_per_system: int = 3) -> dict[str, Any]:
    models, _ = calibrated_models()
    rows = []
    for system in sorted({r["system"] for r in measured["rows"]}):
        mine = sorted((r for r in measured["rows"] if r["system"] == system and r["slo"] == "strict"),
                      key=lambda r: r["rate_rps"])[:rates_per_system]  # fmt: skip
        for m in mine:
            p = _predicted(system, float(m["rate_rps"]), measured, models)
            row: dict[str, Any] = {"system": system, "rate_rps": m["rate_rps"]}
            for q in QUANTITIES:
                err = None if not m[q] or p[q] is None else round(float(p[q]) / float(m[q]) - 1.0, 4)
                row[q] = {"measured": m[q], "simulated": p[q], "error": err,
                          "within_15pct": err is not None and abs(err) <= TOLERANCE}  # fmt: skip
            rows.append(row)
    ok = [row[q]["within_15pct"] for row in rows for q in QUANTITIES]
    return {"source": measured.get("date"), "device": measured.get("device"), "tolerance": TOLERANCE,
            "within": f"{sum(ok)}/{len(ok)}", "rows": rows}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sim.sim_validation", description=__doc__.split("\n")[0])
    p.add_argument("--measured", type=Path, default=RESULTS / "serving_goodput.json")
    p.add_argument("--out", type=Path, default=RESULTS / "sim_validation.json")
    args = p.parse_args(argv)
    if not args.measured.is_file():
        print(
            f"{args.measured} does not exist yet: run the GPU serving sweep first (bench/run_serving_gpu.sh)"
        )
        return 2
    report = compare(json.loads(args.measured.read_text()))
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for row in report["rows"]:
        print(row["system"], row["rate_rps"], {q: row[q]["error"] for q in QUANTITIES})
    print(f"within 15%: {report['within']} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
