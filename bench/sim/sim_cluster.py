"""One simulated run: a pool of workers, one placement policy, the trace at one rate (SimPy).

`simulate` replays the arrivals, asks the policy for a worker per request (or sheds it), runs every worker's
engine (sim_worker.py) until the last request is done and returns one `Outcome` per request with the
inter-token gaps: the inputs of serving_metrics.rate_row, as a GPU run's bench_serving records are.
Requests sent at the same instant reach the policy in the order their HTTP bodies arrive (http_ingest.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import simpy

from bench.serving.serving_metrics import Outcome, Slo
from bench.serving.trace_workload import TraceRequest
from bench.sim.http_ingest import ingest_order
from bench.sim.sim_policies import BASELINES, Policy
from bench.sim.sim_worker import GapHistogram, SimRequest, SimWorker, WorkerSpec
from bench.sim.sim_zipkv_router import ZipkvRouter
from zipkv.controlplane.placement_config import PlacementConfig


@dataclass(frozen=True, slots=True)
class SimResult:
    outcomes: list[Outcome]
    gap_ms: list[float]
    gap_weights: list[float]
    duration_s: float  # first arrival to last completion
    peak_running: int  # over the pool
    per_worker_requests: list[int]
    prefix_hit_fraction: float  # admitted prompt tokens served from the workers' prefix caches
    router: dict[str, float] | None = None  # zipkv's router: its counters and estimated vs simulated waits


def outcome(r: SimRequest) -> Outcome:
    if r.shed or math.isnan(r.done_s):
        return Outcome(ok=False, shed=r.shed)
    out = r.tr.output_tokens
    itl_ms = 0.0 if out <= 1 else 1000.0 * (r.done_s - r.first_token_s) / (out - 1)
    return Outcome(ok=True, ttft_s=r.first_token_s - r.arrival_s, mean_itl_ms=itl_ms, output_tokens=out)


# zipkv's router as the simulation configures it: placement.shed_wait_over_ttft = 0.25 (a worker is a
# candidate while the prefill queued on it is under a quarter of the TTFT target; none left: 503). Chosen
# on 2,000 trace requests at 4 and 8 workers: 0.5 and 1.0 still let goodput fall past the knee; 0.1 holds
# it further but sheds bursts at light load (at 4 workers, 0.5 req/s each: strict goodput 1.10 against
# 1.42 at 0.25 and 1.60 with shedding off). The router's default (off) runs as `zipkv_no_shed`.
ZIPKV_SHED_WAIT_OVER_TTFT = 0.25


@dataclass(frozen=True, slots=True)
class ZipkvVariant:
    shed_wait_over_ttft: float
    weight_prefix_affinity: float | None  # None: the router's default (placement.weight_prefix_affinity)
    headroom_wait_ms: int = 0  # 0: refused at once, as the router did when the first rows were run
    claim_headroom: bool = False  # a waiting request claims a worker (placement.claim_headroom)


# `zipkv` and `zipkv_no_shed` are the router as first simulated (no prefix affinity), so their rows stay
# comparable with the runs before the scorer existed; `zipkv_affinity` adds the prefix-affinity scorer.
ZIPKV_POLICIES = {
    "zipkv": ZipkvVariant(ZIPKV_SHED_WAIT_OVER_TTFT, 0.0),
    "zipkv_no_shed": ZipkvVariant(0.0, 0.0),
    "zipkv_affinity": ZipkvVariant(ZIPKV_SHED_WAIT_OVER_TTFT, None),
    "zipkv_affinity_no_shed": ZipkvVariant(0.0, None),
    # the router's current default: a request only headroom keeps out waits up to 5 s (headroom_wait.py)
    "zipkv_affinity_wait": ZipkvVariant(ZIPKV_SHED_WAIT_OVER_TTFT, None, 5000),
    "zipkv_affinity_no_shed_wait": ZipkvVariant(0.0, None, 5000),
    # the serving sweep's `zipkv_shed` (bench/serving/zipkv_systems.py): the shed at the whole TTFT target
    "zipkv_affinity_shed_1x_wait": ZipkvVariant(1.0, None, 5000),
    # the wait with claims (placement.claim_headroom, placement/headroom_wait.py; off by default)
    "zipkv_affinity_no_shed_claim": ZipkvVariant(0.0, None, 5000, claim_headroom=True),
    "zipkv_affinity_claim": ZipkvVariant(ZIPKV_SHED_WAIT_OVER_TTFT, None, 5000, claim_headroom=True),
    # a longer wait, which claims make worth waiting (a worker queue would hold the request as long)
    "zipkv_affinity_no_shed_claim_30s": ZipkvVariant(0.0, None, 30_000, claim_headroom=True),
    "zipkv_affinity_no_shed_wait_30s": ZipkvVariant(0.0, None, 30_000),
}


def zipkv_config(
    name: str, decode_ms_per_gib: float | None = None, affinity_weight: float | None = None
) -> PlacementConfig:
    """The router's placement config for a zipkv policy; `affinity_weight` overrides the default weight
    of `zipkv_affinity` (the weight sweep)."""
    variant = ZIPKV_POLICIES[name]
    extra: dict[str, float] = {} if decode_ms_per_gib is None else {"decode_ms_per_gib": decode_ms_per_gib}
    weight = variant.weight_prefix_affinity
    if weight is None and affinity_weight is not None:
        weight = affinity_weight
    if weight is not None:
        extra["weight_prefix_affinity"] = weight
    return PlacementConfig(
        shed_wait_over_ttft=variant.shed_wait_over_ttft,
        headroom_wait_ms=variant.headroom_wait_ms,
        claim_headroom=variant.claim_headroom,
        **extra,
    )


def make_policy(
    name: str,
    env: Any,
    workers: list[SimWorker],
    slo: Slo,
    prefill_ms_per_token: float,
    decode_ms_per_gib: float | None = None,
    affinity_weight: float | None = None,
) -> Policy:
    if name in ZIPKV_POLICIES:
        cfg = zipkv_config(name, decode_ms_per_gib, affinity_weight)
        return ZipkvRouter(env, workers, slo, prefill_ms_per_token, cfg)
    if name not in BASELINES:
        raise ValueError(
            f"unknown policy {name!r}: one of {', '.join(ZIPKV_POLICIES)}, {', '.join(BASELINES)}"
        )
    return BASELINES[name](workers)


def _arrive(
    policy: Policy, r: SimRequest, now_s: float, submit: Callable[[SimRequest, int | None], None]
) -> None:
    """Hand an arriving request to the policy: zipkv's router may hold it for headroom (it submits it
    later); any other policy places or sheds it now."""
    if isinstance(policy, ZipkvRouter):
        policy.arrive(r, submit)
    else:
        submit(r, policy.choose(r, now_s))


def simulate(
    pool: list[WorkerSpec],
    policy_name: str,
    requests: list[TraceRequest],
    arrivals_s: list[float],
    slo: Slo,
    prefill_ms_per_token: float,
    progress: Callable[[str], None] | None = None,
    decode_ms_per_gib: float | None = None,
    affinity_weight: float | None = None,
    warm_prompts: Sequence[TraceRequest] = (),
) -> SimResult:
    """One run; `warm_prompts` start in every worker's prefix cache (bench_serving's warm-up leaves one)."""
    env = simpy.Environment()
    gaps = GapHistogram()
    sims = [SimRequest(i, tr, t) for i, (tr, t) in enumerate(zip(requests, arrivals_s, strict=True))]
    left = [len(sims)]
    all_done = env.event()
    policy_box: list[Policy] = []

    def first_token(r: SimRequest) -> None:
        policy_box[0].first_token(r)

    def done(r: SimRequest) -> None:
        policy_box[0].done(r)
        left[0] -= 1
        if left[0] == 0:
            all_done.succeed()

    workers = _workers(env, pool, first_token, done, gaps, warm_prompts)
    policy = make_policy(
        policy_name, env, workers, slo, prefill_ms_per_token, decode_ms_per_gib, affinity_weight
    )
    policy_box.append(policy)
    counts = [0] * len(workers)
    peak = [0]

    def submit(r: SimRequest, i: int | None) -> None:
        if i is None:
            r.shed = True
            done(r)
        else:
            counts[i] += 1
            workers[i].submit(r)

    def arrivals() -> Any:
        for k, i in enumerate(ingest_order(requests, arrivals_s)):
            r = sims[i]
            if r.arrival_s > env.now:
                yield env.timeout(r.arrival_s - env.now)
            _arrive(policy, r, env.now, submit)
            if k % 64 == 0:
                peak[0] = max(peak[0], sum(w.running for w in workers))
                if progress and k % 4096 == 0:
                    progress(f"{policy_name}: {k}/{len(sims)} requests placed at t={env.now:.0f} s")

    env.process(arrivals())
    env.run(until=all_done)
    res = _result(sims, workers, gaps, peak[0], counts)
    return replace(res, router=router_stats(policy, sims)) if isinstance(policy, ZipkvRouter) else res


def _workers(
    env: simpy.Environment,
    pool: list[WorkerSpec],
    first_token: Callable[[SimRequest], None],
    done: Callable[[SimRequest], None],
    gaps: GapHistogram,
    warm_prompts: Sequence[TraceRequest],
) -> list[SimWorker]:
    """The pool's workers, each with `warm_prompts` already in its prefix cache."""
    workers = [SimWorker(env, i, spec, first_token, done, gaps) for i, spec in enumerate(pool)]
    for w in workers:
        for tr in warm_prompts:
            w.cache.admit(tr)
            w.cache.release(tr)
    return workers


def router_stats(router: ZipkvRouter, sims: list[SimRequest]) -> dict[str, float]:
    """zipkv's router in one run: its counters (sim_zipkv_router.py) and, over the requests it placed, the
    wait it estimated on the chosen worker against the simulated one (arrival to the start of the prefill),
    mean and the 90th percentile of each, mean error, mean absolute error."""
    pairs = [
        (router.est_wait_ms[r.rid], 1000.0 * (r.prefill_start_s - r.arrival_s))
        for r in sims
        if r.rid in router.est_wait_ms and not math.isnan(r.prefill_start_s)
    ]
    est, got = sorted(p[0] for p in pairs), sorted(p[1] for p in pairs)
    n = max(len(pairs), 1)
    p90 = lambda xs: xs[int(0.9 * (len(xs) - 1))] if xs else 0.0
    return {
        **{k: float(v) for k, v in router.stats.items()},
        "est_wait_ms_mean": round(sum(est) / n, 1),
        "sim_wait_ms_mean": round(sum(got) / n, 1),
        "est_wait_ms_p90": round(p90(est), 1),
        "sim_wait_ms_p90": round(p90(got), 1),
        "wait_error_ms_mean": round(sum(e - g for e, g in pairs) / n, 1),
        "wait_abs_error_ms_mean": round(sum(abs(e - g) for e, g in pairs) / n, 1),
    }


def _result(
    sims: list[SimRequest], workers: list[SimWorker], gaps: GapHistogram, peak: int, counts: list[int]
) -> SimResult:
    values, weights = gaps.values_weights()
    end = max((r.done_s for r in sims if not math.isnan(r.done_s)), default=0.0)
    return SimResult(
        outcomes=[outcome(r) for r in sims],
        gap_ms=values,
        gap_weights=weights,
        duration_s=end - sims[0].arrival_s,
        peak_running=peak,
        per_worker_requests=counts,
        prefix_hit_fraction=sum(w.prefix_hit_tokens for w in workers)
        / max(sum(w.admitted_prompt_tokens for w in workers), 1),
    )
