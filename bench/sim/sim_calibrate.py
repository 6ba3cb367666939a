"""The simulated worker against the H200 runs it is fitted to (bench/results/sglang_e2e.json).

`calibrated_models` fits each system's prefill rate: the offline measurement (64 requests of 8192 random
input ids -> 256 new tokens, all submitted at once, chunked prefill off so a prefill batch holds up to
SGLang's max_prefill_tokens of 16,384) is replayed through one simulated worker and the rate is bisected
until the simulated mean TTFT equals the measured one. `replay_table` then compares, per system, what the
simulation predicts for the measured workloads (offline, and online 32 x 1024 -> 8192, not used in the
prefill fit) with what was measured: TTFT, wall time, running requests, decode step.
"""

from __future__ import annotations

import statistics
from typing import Any

import simpy

from bench.serving.trace_workload import TraceRequest
from bench.sim.sim_worker import GapHistogram, SimRequest, SimWorker, WorkerSpec
from bench.sim.step_model import SYSTEMS, StepModel, budget_tokens, decode_points, fit_decode, measured

OFFLINE = ("offline_8192x256", 64, 8192, 256)
ONLINE = ("online_1024x8192", 32, 1024, 8192)
ZIPKV_RATIO = "compression_ratio_at_peak"


def compression_ratio(system: str) -> float:
    if system != "zipkv" and not system.startswith("zipkv_triton"):  # zipkv's variants compress alike
        return 1.0
    return float(measured("zipkv", OFFLINE[0])[ZIPKV_RATIO])  # type: ignore[arg-type]


def spec_for(
    system: str, step: StepModel, chunk_tokens: int = 8192, max_running: int = 64, budget: int | None = None
) -> WorkerSpec:
    return WorkerSpec(
        name=system,
        system=system,
        step=step,
        budget_tokens=budget_tokens() if budget is None else budget,
        compression_ratio=compression_ratio(system),
        max_running=max_running,
        chunk_tokens=chunk_tokens,
    )


def replay(spec: WorkerSpec, n: int, input_tokens: int, output_tokens: int) -> dict[str, float]:
    """n requests of unique random prompts submitted at t = 0 to one worker; what the run measured."""
    env = simpy.Environment()
    blocks = -(-input_tokens // 512)
    prompts = [tuple(range(i * blocks, (i + 1) * blocks)) for i in range(n)]  # no two share a block
    reqs = [
        SimRequest(i, TraceRequest(i, 0.0, input_tokens, output_tokens, p, False), 0.0)
        for i, p in enumerate(prompts)
    ]
    peak = [0]
    w = SimWorker(env, 0, spec, lambda r: None, lambda r: None, GapHistogram())
    for r in reqs:
        w.submit(r)

    def watch() -> Any:
        while any(r.done_s != r.done_s for r in reqs):  # NaN until done
            peak[0] = max(peak[0], w.running)
            yield env.timeout(0.01)

    env.process(watch())
    env.run()
    ttfts = [r.first_token_s for r in reqs]
    return {
        "max_running_requests": peak[0],
        "ttft_s_mean": statistics.fmean(ttfts),
        "ttft_s_max": max(ttfts),
        "wall_s": max(r.done_s for r in reqs),
    }


def calibrate_prefill(step: StepModel, system: str) -> float:
    """The prefill rate (tokens/s) at which the offline replay's mean TTFT is the measured one."""
    target = float(measured(system, OFFLINE[0])["ttft_s_mean"])  # type: ignore[arg-type]
    lo, hi = 5_000.0, 400_000.0
    for _ in range(40):
        mid = (lo * hi) ** 0.5
        spec = spec_for(system, step.with_prefill(mid), chunk_tokens=16384)
        if replay(spec, *OFFLINE[1:])["ttft_s_mean"] > target:
            lo = mid  # too slow: prefill faster
        else:
            hi = mid
    return round((lo * hi) ** 0.5, 1)


def calibrated_models() -> tuple[dict[str, StepModel], list[dict[str, object]]]:
    models, decode_table = fit_decode(decode_points())
    return {s: models[s].with_prefill(calibrate_prefill(models[s], s)) for s in SYSTEMS}, decode_table


def replay_table(models: dict[str, StepModel]) -> list[dict[str, object]]:
    keys = ("max_running_requests", "ttft_s_mean", "ttft_s_max", "wall_s")
    rows: list[dict[str, object]] = []
    for system in SYSTEMS:
        for workload, n, inp, out in (OFFLINE, ONLINE):
            try:
                got = measured(system, workload)
            except KeyError:
                continue  # zipkv's uncompressed twin has no online row
            chunk = 16384 if workload == OFFLINE[0] else 8192
            sim = replay(spec_for(system, models[system], chunk_tokens=chunk), n, inp, out)
            row: dict[str, object] = {"system": system, "workload": workload}
            for k in keys:
                m, p = float(got[k]), sim[k]  # type: ignore[arg-type]
                row[k] = {"measured": m, "simulated": round(p, 3), "error": round(p / m - 1.0, 4)}
            rows.append(row)
    return rows
