"""The cluster simulation against the GPU serving sweep: the same workload on one simulated worker.

    python -m bench.sim.sim_validation      # reads bench/results/serving_goodput.json -> sim_validation.json

For each system of the GPU sweep (zipkv and zipkv_uncompressed through zipkv's router, so with its
admission; sglang_gateway as SGLang's FlashInfer worker) and each of its first three rates, the simulation
replays the sweep's trace window (its offset, request count and context cap, from the file's `workload`;
each window and pooled, where the file pools several: bench/serving/serving_windows.py) at that rate and
compares TTFT and ITL p50 / p99 with the measured ones: error = simulated / measured - 1, `within_15pct`
per quantity. Until the GPU sweep has run there is no file and this says so.

Calibrations (--calibration; `auto`, the default, takes the one of the measured file's device):
    h200_e2e            step_model.py + sim_calibrate.py: uniform-batch runs on one H200 (sglang_e2e.json)
    h100_serving_logs   h100_calibration.py: the H100 sweep's own decode and prefill log lines, per system
                        (its record: bench/results/sim_calibration_h100_serving_logs.json); fitted on step
                        times only, never on these TTFT / ITL figures
A system with a model of its own name uses it (zipkv_triton_prefill under h100_serving_logs), else the one
of the name it starts with.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.paths import RESULTS
from bench.serving.serving_goodput import headline
from bench.serving.serving_metrics import SLOS, Outcome, rate_row, with_knees
from bench.serving.serving_windows import windows
from bench.serving.trace_workload import arrivals_s, load_trace
from bench.serving.zipkv_systems import ZIPKV_SYSTEMS
from bench.sim import h100_calibration
from bench.sim.sim_calibrate import calibrated_models, spec_for
from bench.sim.sim_cluster import ZIPKV_POLICIES, simulate
from bench.sim.step_model import StepModel

STEP_SYSTEM = {"zipkv": "zipkv", "zipkv_uncompressed": "zipkv_uncompressed", "sglang_gateway": "sglang"}


CALIBRATIONS = ("auto", "h200_e2e", h100_calibration.NAME)


def calibration_for(device: str | None, requested: str = "auto") -> str:
    """The calibration to use: the one asked for, or under `auto` the one of the measured device."""
    if requested != "auto":
        return requested
    return h100_calibration.NAME if device and "H100" in device else "h200_e2e"


def load_models(calibration: str) -> dict[str, StepModel]:
    if calibration == h100_calibration.NAME:
        return h100_calibration.models()
    return calibrated_models()[0]


def step_system(system: str, models: dict[str, StepModel] | None = None) -> str:
    """The step model of a measured system: its own where `models` has one, or for a variant
    (``zipkv_triton_prefill``) the one its name starts with, longest first."""
    if models is not None and system in models:
        return system
    for name in sorted(STEP_SYSTEM, key=len, reverse=True):
        if system == name or system.startswith(f"{name}_"):
            return STEP_SYSTEM[name]
    raise SystemExit(f"{system}: no step model (one of {', '.join(STEP_SYSTEM)} or a variant of one)")


# The sweep runs zipkv's router with its placement defaults (controlplane/config.py: shed_wait_over_ttft 0,
# headroom_wait_ms 5000, claim_headroom off, the default prefix-affinity weight), but for the settings a
# system of
# bench/serving/zipkv_systems.py names: the sim_cluster.py policy with the same settings. (The `zipkv`
# policy, shedding at a quarter of the TTFT target, shed 21-24 of the 32 requests where the GPU runs shed
# 0-3.)
ROUTER_POLICY = "zipkv_affinity_no_shed_wait"


def router_policy(system: str) -> str:
    """The simulated policy of a measured system: SGLang's server takes requests as they come (one worker:
    round robin), zipkv's router the sim_cluster.py policy of its system's settings (a zipkv variant the
    table does not name, e.g. `zipkv_triton_prefill`, runs the defaults)."""
    if not system.startswith("zipkv"):
        return "round_robin"
    shed = ZIPKV_SYSTEMS.get(system, ZIPKV_SYSTEMS["zipkv"]).shed_wait_over_ttft
    default = ZIPKV_POLICIES[ROUTER_POLICY]
    for name, variant in ZIPKV_POLICIES.items():
        if variant == replace(default, shed_wait_over_ttft=shed):
            return name
    raise SystemExit(f"{system}: no sim_cluster.py policy sheds at {shed} x TTFT with the router's defaults")


# bench_serving's benchmark() first sends input_requests[0] once (its `warmup_requests` default, which
# bench/serving/serving_client.py's run_rate leaves as is) and does not flush the cache after it (only under
# SGLANG_IS_IN_CI or --flush-cache): each rate's first prompt is cached when the timed run starts (its server
# logs "#new-token: 16, #cached-token: 6752" for it).
BENCH_SERVING_WARMUP_REQUESTS = 1
QUANTITIES = ("ttft_p50_s", "ttft_p99_s", "itl_p50_ms", "itl_p99_ms")
TOLERANCE = 0.15


def _predicted(system: str, rate: float, measured: dict[str, Any], models: dict[str, Any]) -> dict[str, Any]:
    """The simulated strict-SLO row of one system and rate (the percentiles do not depend on the SLO)."""
    return _predicted_rows(system, rate, measured, models)["strict"]


def _predicted_rows(
    system: str, rate: float, measured: dict[str, Any], models: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """The simulated rows of one system and rate, per SLO: each trace window of the measured file replayed
    on its own and pooled as serving_windows.py pools the measured ones."""
    opts = measured["systems"].get(system, {}).get("options", {})
    step = step_system(system, models)
    chunk = int(opts.get("sglang_args", {}).get("chunked_prefill_size", 8192))
    budget = int(opts["budget_tokens"]) if "budget_tokens" in opts else None
    spec = spec_for(step, models[step], chunk, int(opts.get("max_running", 64)), budget)
    policy = router_policy(system)
    outcomes: list[Outcome] = []
    gaps: list[float] = []
    weights: list[float] = []
    duration_s = span_s = 0.0
    for w in windows(measured["workload"]):
        reqs = load_trace(int(w["max_context_tokens"]), int(w["requests"]), int(w["offset"]))
        res = simulate(
            [spec],
            policy,
            reqs,
            arrivals_s(reqs, rate),
            SLOS[0],
            1000.0 / models["zipkv"].prefill_tokens_per_s,
            warm_prompts=reqs[:BENCH_SERVING_WARMUP_REQUESTS],
        )
        outcomes += res.outcomes
        gaps += res.gap_ms
        weights += res.gap_weights
        duration_s += res.duration_s
        span_s += (len(reqs) - 1) / rate
    return {slo.name: rate_row(outcomes, rate, duration_s, slo, gaps, weights, span_s=span_s) for slo in SLOS}


def beyond_sweep(
    measured: dict[str, Any], models: dict[str, Any], extra_rates: list[float], also: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Goodput per system and SLO simulated over the sweep's rates and `extra_rates` past them, with the
    simulated knees and zipkv's ratio there: where the sweep stopped before a knee (the relaxed SLO on one
    H100), what the validated model puts beyond it; `also`: systems the sweep did not run (zipkv_shed), on
    the same trace. A prediction, never a measurement."""
    rates = sorted({float(r["rate_rps"]) for r in measured["rows"]} | set(extra_rates))
    rows: list[dict[str, object]] = []
    for system in sorted({r["system"] for r in measured["rows"]} | set(also)):
        if step_system(system, models) not in models:
            continue
        for rate in rates:
            for slo_name, row in _predicted_rows(system, rate, measured, models).items():
                keep = ("rate_rps", "goodput_rps", "attainment", "shed", "ttft_p99_s", "itl_p99_ms")
                rows.append({"system": system, "slo": slo_name, **{k: row[k] for k in keep}})
    keyed = with_knees(rows, ("system", "slo"))
    ratio = {slo: h["zipkv_over_sglang_gateway"] for slo, h in headline(keyed).items()}  # the sweep's own
    return {"rates_rps": rates, "rows": keyed, "zipkv_over_sglang_gateway_at_knee": ratio}


def sustained_sweep(
    measured: dict[str, Any], models: dict[str, Any], rates: list[float], requests: int
) -> dict[str, Any]:
    """beyond_sweep over one long window (the trace's first `requests`) instead of the sweep's windows: a
    32-request window is one burst however high the rate, so no queue builds past it and the relaxed SLO
    shows no knee; a few hundred requests a rate keep the load on long enough for one. A prediction."""
    cap = windows(measured["workload"])[0]["max_context_tokens"]
    long_window = {**measured, "workload": {"max_context_tokens": cap, "requests": requests, "offset": 0}}
    return {"requests": requests, **beyond_sweep(long_window, models, rates)}


def compare(
    measured: dict[str, Any],
    rates_per_system: int = 3,
    calibration: str = "auto",
    extra_rates: list[float] | None = None,
    sustained: tuple[int, list[float]] | None = None,
    also_systems: tuple[str, ...] = (),
) -> dict[str, Any]:
    calibration = calibration_for(measured.get("device"), calibration)
    models = load_models(calibration)
    rows, skipped = [], {}
    for system in sorted({r["system"] for r in measured["rows"]}):
        step = step_system(system, models)
        if step not in models:
            # e.g. the H100 logs' calibration has no compression-off model: say so rather than guess one
            skipped[system] = f"no step model for {step} in calibration {calibration}"
            continue
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
    report = {"source": measured.get("date"), "device": measured.get("device"), "calibration": calibration,
              "tolerance": TOLERANCE,
              "within": f"{sum(ok)}/{len(ok)}", "rows": rows, "skipped": skipped}  # fmt: skip
    if extra_rates or also_systems:
        report["beyond_sweep"] = beyond_sweep(measured, models, extra_rates or [], also_systems)
    if sustained and sustained[0] > 0:
        report["sustained"] = sustained_sweep(measured, models, sustained[1], sustained[0])
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sim.sim_validation", description=__doc__.split("\n")[0])
    p.add_argument("--measured", type=Path, default=RESULTS / "serving_goodput.json")
    p.add_argument("--out", type=Path, default=RESULTS / "sim_validation.json")
    p.add_argument("--calibration", choices=CALIBRATIONS, default="auto",
                   help="step models to simulate with (default: the measured device's)")  # fmt: skip
    p.add_argument("--sustained-requests", type=int, default=256,
                   help="also simulate one window of this many requests (0: no)")  # fmt: skip
    p.add_argument("--sustained-rates", default="0.5,1.5,4", help="its rates besides the sweep's")
    p.add_argument("--beyond-rates", default="4,6,8,12",
                   help="rates (req/s) past the sweep's to simulate goodput at ('' for none)")  # fmt: skip
    p.add_argument("--also-systems", type=lambda s: tuple(x for x in s.split(",") if x), default=(),
                   help="systems the sweep did not run to simulate beside it (e.g. zipkv_shed)")  # fmt: skip
    args = p.parse_args(argv)
    if not args.measured.is_file():
        print(
            f"{args.measured} does not exist yet: run the GPU serving sweep first (bench/run_serving_gpu.sh)"
        )
        return 2
    extra = [float(x) for x in args.beyond_rates.split(",") if x]
    sustained = (args.sustained_requests, [float(x) for x in args.sustained_rates.split(",") if x])
    measured = json.loads(args.measured.read_text())
    report = compare(measured, calibration=args.calibration, extra_rates=extra, sustained=sustained,
                     also_systems=args.also_systems)  # fmt: skip
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    if "sustained" in report:  # drawn like the GPU sweep (serving_plots.plot_serving): a prediction
        from bench.serving.serving_plots import plot_serving

        title = (
            f"Simulated, sustained load: the trace's first {report['sustained']['requests']} requests a rate"
        )
        plot_serving(report["sustained"]["rows"], args.out.with_name(args.out.stem + "_sustained.png"), title)
    for row in report["rows"]:
        print(row["system"], row["rate_rps"], {q: row[q]["error"] for q in QUANTITIES})
    # the simulated knees past the sweep's rates, and under sustained load
    for block in ("beyond_sweep", "sustained"):
        if block in report:
            knees = {f"{r['system']}/{r['slo']}": r["knee_rps"] for r in report[block]["rows"]}
            print(f"{block}: simulated knees (req/s) {knees}; zipkv / sglang_gateway at the knee "
                  f"{report[block]['zipkv_over_sglang_gateway_at_knee']}")  # fmt: skip
    print(f"within 15% ({report['calibration']}): {report['within']} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
