"""The cluster simulation's parts: KV memory with a prefix cache, the fitted step model against the H200 runs,
the policies' arithmetic, and a whole run through the router's own placement code."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from typing import Any

import pytest
import simpy

from bench.serving.serving_metrics import SLOS
from bench.serving.trace_workload import TraceRequest, arrivals_s, load_trace
from bench.sim.cluster_sim import META_KEYS, merged
from bench.sim.sim_calibrate import budget_tokens, calibrated_models, replay_table, spec_for
from bench.sim.sim_cluster import simulate, zipkv_config
from bench.sim.sim_kv_cache import KvCache
from bench.sim.sim_policies import KvQueueCap, LeastLoad, RoundRobin, raw_utilisation
from bench.sim.sim_worker import GapHistogram, SimRequest, SimWorker
from bench.sim.sim_zipkv_router import run_now
from bench.sim.step_model import decode_points, fit_decode


def tr(i: int, inp: int, out: int, blocks: tuple[int, ...]) -> TraceRequest:
    return TraceRequest(i, 0.0, inp, out, blocks, False)


def test_shared_prefixes_are_held_once_and_reused() -> None:
    kv = KvCache(4000)
    a, b = tr(0, 1100, 100, (1, 2, 3)), tr(1, 1536, 100, (1, 2, 4))
    assert kv.admit(a) == 1100 and kv.used_tokens == 1100 + 100
    assert kv.need_tokens(b) == 512 + 100  # blocks 1 and 2 are pinned by a: only block 4 and the output
    assert kv.admit(b) == 1536 - 1024  # the cached prefix is not prefilled again
    assert kv.pinned_tokens == 512 * 2 + 76 + 512
    kv.release(a)
    assert kv.pinned_tokens == 512 * 3 and kv.cached_tokens == 76 and kv.free_tokens == 4000 - 1536 - 100
    kv.release(b)
    assert kv.used_tokens == 0 and kv.free_tokens == 4000
    # Everything is cached now; a request sharing block 1 reuses it.
    assert kv.cached_prefix(tr(2, 700, 1, (1, 9))) == (1, 512)


def test_eviction_drops_the_least_recent_leaves_first() -> None:
    kv = KvCache(2048)
    kv.admit(old := tr(0, 1024, 1, (1, 2)))
    kv.release(old)
    kv.admit(new := tr(1, 1024, 1, (3, 4)))
    kv.release(new)
    kv.admit(tr(2, 1023, 1, (5, 6)))  # 1023 + 1 pinned: the oldest blocks, leaf (2) first, go
    assert kv.cached_prefix(tr(3, 1024, 1, (3, 4))) == (2, 1024)
    assert kv.cached_prefix(tr(4, 1024, 1, (1, 2))) == (0, 0)
    assert kv.used_tokens + kv.cached_tokens <= kv.capacity_tokens


def test_the_decode_fit_is_close_to_every_measurement() -> None:
    models, table = fit_decode(decode_points())
    assert len(table) == 7
    for row in table:  # within 6% of each measured step (the largest is 5.3%), out of sample within 10%
        measured_ms, loo_ms = float(row["measured_ms"]), float(row["leave_one_out_ms"])  # type: ignore[arg-type]
        assert abs(float(row["residual_ms"])) <= 0.06 * measured_ms, row  # type: ignore[arg-type]
        assert abs(loo_ms - measured_ms) <= 0.10 * measured_ms, row
    assert 3.0 < models["sglang"].fixed_ms < 7.0  # ~16 GB of weights at ~4 TB/s


def test_the_simulated_worker_replays_the_measured_runs() -> None:
    models, _ = calibrated_models()
    rows: list[dict[str, Any]] = replay_table(models)
    assert {r["system"] for r in rows} == {"sglang", "zipkv_uncompressed", "zipkv"}
    for r in rows:
        if r["workload"] == "offline_8192x256":  # fitted on its mean TTFT; the rest is predicted
            assert abs(r["wall_s"]["error"]) < 0.03 and abs(r["ttft_s_max"]["error"]) < 0.03, r
            assert abs(r["max_running_requests"]["error"]) <= 1 / 45, r  # 45 (58 for zipkv, 59 simulated)
        else:
            assert abs(r["wall_s"]["error"]) < 0.06, r


def _workers(n: int, budget: int = 10_000) -> tuple[simpy.Environment, list[SimWorker]]:
    models, _ = fit_decode(decode_points())
    env = simpy.Environment()
    spec = spec_for("sglang", models["sglang"])
    small = type(spec)(
        **{**{f: getattr(spec, f) for f in spec.__dataclass_fields__}, "budget_tokens": budget}
    )
    ws = [SimWorker(env, i, small, lambda r: None, lambda r: None, GapHistogram()) for i in range(n)]
    return env, ws


def test_least_load_and_the_saturation_filter_follow_their_formulas() -> None:
    env, ws = _workers(2)
    ws[0].submit(SimRequest(0, tr(0, 8000, 200, tuple(range(16))), 0.0))
    env.run(until=1e-6)  # the worker admits it and starts its prefill
    # raw k = (8000 + 200) / (10000 * 45/46) = .838; pending = the 8000 prompt tokens still prefilling.
    k = 8200 / (10_000 * 45 / 46)
    assert raw_utilisation(ws[0]) == pytest.approx(k)
    expect = 8000 / ws[0].tokens_per_s + 0.15 * k / (1 - k)
    assert LeastLoad(ws).score_s(ws[0]) == pytest.approx(expect)
    new = SimRequest(1, tr(1, 100, 10, (99,)), 0.0)
    assert LeastLoad(ws).choose(new, 0.0) == 1  # the idle worker scores 0
    assert KvQueueCap(ws).choose(new, 0.0) == 1  # worker 0 is over k = 0.8
    ws[1].submit(SimRequest(2, tr(2, 8000, 200, tuple(range(100, 116))), 0.0))
    env.run(until=2e-6)
    assert KvQueueCap(ws).choose(new, 0.0) is None  # both saturated: shed
    rr = RoundRobin(ws)
    assert [rr.choose(new, 0.0) for _ in range(3)] == [0, 1, 0]


def test_the_worker_counts_prompt_tokens_served_from_its_prefix_cache() -> None:
    env, ws = _workers(1)
    ws[0].submit(SimRequest(0, tr(0, 1100, 4, (1, 2, 3)), 0.0))
    env.run(until=1.0)  # done: its blocks stay cached
    ws[0].submit(SimRequest(1, tr(1, 1536, 4, (1, 2, 4)), 1.0))  # shares blocks 1 and 2 (1024 tokens)
    ws[0].submit(SimRequest(2, tr(2, 600, 4, (7, 8)), 1.0))  # shares nothing
    env.run(until=2.0)
    assert ws[0].admitted_prompt_tokens == 1100 + 1536 + 600
    assert ws[0].prefix_hit_tokens == 1024


def test_an_idle_simulated_worker_reports_no_step_as_the_real_workers_do() -> None:
    from bench.sim.sim_zipkv_router import worker_view

    env, ws = _workers(1)
    ws[0].submit(SimRequest(0, tr(0, 1100, 40, (1, 2, 3)), 0.0))
    env.run(until=0.05)  # prefilled, decoding
    assert ws[0].running == 1 and worker_view(ws[0], 1, env.now).capacity.itl_ms == ws[0].itl_ms() > 0
    env.run(until=5.0)  # done: the last burst's steps stay in the worker's window, not in its report
    assert ws[0].running == 0 and ws[0].itl_ms() > 0
    assert worker_view(ws[0], 2, env.now).capacity.itl_ms == 0.0


def test_a_run_through_the_routers_placement_accounts_for_every_request() -> None:
    models, _ = calibrated_models()
    reqs = load_trace(limit=80)
    pool = [spec_for("zipkv", models["zipkv"])] * 2
    res = simulate(pool, "zipkv", reqs, arrivals_s(reqs, 2.0), SLOS[0], 0.03)
    assert len(res.outcomes) == 80 and sum(res.per_worker_requests) + sum(o.shed for o in res.outcomes) == 80
    assert all(o.ok for o in res.outcomes if not o.shed)
    assert all(o.ttft_s > 0 and math.isfinite(o.mean_itl_ms) for o in res.outcomes if o.ok)
    assert sum(res.gap_weights) > 0 and min(res.gap_ms) > 0
    assert 0.0 <= res.prefix_hit_fraction < 1.0


def test_the_routers_counters_and_waits_account_for_its_decisions() -> None:
    # 400 trace requests on 2 workers at 3 requests/s: past the knee, so the shed filter refuses some.
    models, _ = calibrated_models()
    reqs = load_trace(limit=400)
    pool = [spec_for("zipkv", models["zipkv"])] * 2
    res = simulate(pool, "zipkv_affinity", reqs, arrivals_s(reqs, 3.0), SLOS[0], 0.03)
    st = res.router
    assert st is not None
    shed = sum(o.shed for o in res.outcomes)  # the router's, plus any a worker refused (never fits)
    assert 0 < st["shed"] <= shed and st["shed_slo_wait"] <= st["shed"] <= st["slo_wait_drops"]
    assert 0 < st["to_holder"] <= st["held"] <= 400
    assert st["est_wait_ms_mean"] > 0 and st["sim_wait_ms_mean"] > 0
    assert st["wait_error_ms_mean"] == pytest.approx(st["est_wait_ms_mean"] - st["sim_wait_ms_mean"], abs=0.2)
    assert st["wait_abs_error_ms_mean"] >= abs(st["wait_error_ms_mean"]) - 0.1
    assert simulate(pool, "least_load", reqs, arrivals_s(reqs, 3.0), SLOS[0], 0.03).router is None


def test_zipkv_variants_differ_only_in_shedding_and_affinity() -> None:
    assert zipkv_config("zipkv").weight_prefix_affinity == 0.0  # the router as first simulated
    assert zipkv_config("zipkv", affinity_weight=2.0).weight_prefix_affinity == 0.0
    default = zipkv_config("zipkv_affinity")
    assert default.weight_prefix_affinity > 0 and default.shed_wait_over_ttft == 0.25
    assert zipkv_config("zipkv_affinity", affinity_weight=2.0).weight_prefix_affinity == 2.0
    assert zipkv_config("zipkv_affinity_no_shed").shed_wait_over_ttft == 0.0


def test_prefix_affinity_serves_more_prompt_tokens_from_cache() -> None:
    # 400 trace requests on 4 workers: without affinity a conversation's next turn finds its worker about
    # a quarter of the time; with it, whenever that worker has the headroom and the shortest wait.
    models, _ = calibrated_models()
    reqs = load_trace(limit=400)
    pool = [spec_for("zipkv", models["zipkv"])] * 4
    hit = {
        p: simulate(pool, p, reqs, arrivals_s(reqs, 2.0), SLOS[0], 0.03).prefix_hit_fraction
        for p in ("zipkv", "zipkv_affinity")
    }
    assert hit["zipkv_affinity"] > 1.2 * hit["zipkv"] > 0


def test_merge_keeps_earlier_rows_and_replaces_the_resimulated_ones() -> None:
    key = {"pool": "zipkv", "workers": 8, "slo": "strict", "per_worker_rps": 1.0}
    trace = {"sampled": "requests 0..3999"}
    old: dict[str, Any] = {k: k for k in META_KEYS}
    old["trace"] = trace
    old["rows"] = [
        {**key, "policy": "cache_aware", "goodput_rps": 5.0, "knee_rps": 8.0},
        {**key, "policy": "zipkv_affinity", "goodput_rps": 1.0, "knee_rps": 8.0},
    ]
    meta: dict[str, Any] = {"date": "d2", "command": "c2", "wall_s": 1.0, "trace": trace, "router_config": {}}
    new: list[dict[str, object]] = [{**key, "policy": "zipkv_affinity", "goodput_rps": 6.0}]
    out_meta, rows = merged(old, meta, new)
    assert [(r["policy"], r["goodput_rps"]) for r in rows] == [("cache_aware", 5.0), ("zipkv_affinity", 6.0)]
    assert "knee_rps" not in rows[0]  # recomputed over all rows by build_report
    assert out_meta["command"] == "command" and out_meta["additions"][0]["command"] == "c2"
    with pytest.raises(SystemExit):
        merged(old, {**meta, "trace": {"sampled": "requests 0..999"}}, new)


def test_run_now_refuses_a_coroutine_that_suspends() -> None:
    async def waits() -> int:
        await asyncio.sleep(0)
        return 1

    async def returns() -> int:
        return 2

    assert run_now(returns()) == 2
    with pytest.raises(RuntimeError, match="suspended"):
        run_now(waits())


def test_the_validation_compares_like_with_like() -> None:
    # A "measured" file whose rows are the simulation's own predictions: every error must come out 0, so a
    # mismatch between what the GPU sweep ran and what the validation replays would show here.
    from bench.sim.sim_validation import QUANTITIES, _predicted, compare

    models, _ = calibrated_models()
    measured: dict[str, object] = {
        "date": "test",
        "workload": {"max_context_tokens": 131072, "requests": 20, "offset": 10},
        "systems": {
            "sglang_gateway": {"options": {"max_running": 64, "sglang_args": {"chunked_prefill_size": 8192}}}
        },
        "rows": [],
    }
    rows = []
    for rate in (0.5, 1.0):
        p = _predicted("sglang_gateway", rate, measured, models)
        rows.append(
            {"system": "sglang_gateway", "slo": "strict", "rate_rps": rate, **{q: p[q] for q in QUANTITIES}}
        )
    measured["rows"] = rows
    report = compare(measured)
    assert report["within"] == "8/8"
    assert all(r[q]["error"] == 0.0 for r in report["rows"] for q in QUANTITIES)


def test_the_validation_skips_a_system_its_calibration_has_no_model_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A calibration without a compression-off model (the H100 logs' had none before the one-machine run):
    # that system's rows are listed as skipped, with the reason, instead of failing the whole comparison.
    from bench.sim import h100_calibration, sim_validation
    from bench.sim.sim_validation import QUANTITIES, compare

    models = {k: v for k, v in h100_calibration.models().items() if k != "zipkv_uncompressed"}
    monkeypatch.setattr(sim_validation, "load_models", lambda calibration: models)

    row = {"slo": "strict", "rate_rps": 1.0, **{q: 1.0 for q in QUANTITIES}}
    measured = {
        "date": "test",
        "device": "1 x NVIDIA H100 80GB HBM3",
        "workload": {"max_context_tokens": 131072, "requests": 12, "offset": 0},
        "systems": {},
        "rows": [{"system": "zipkv_uncompressed", **row}, {"system": "sglang_gateway", **row}],
    }
    report = compare(measured)
    assert [r["system"] for r in report["rows"]] == ["sglang_gateway"]
    assert "zipkv_uncompressed" in report["skipped"]["zipkv_uncompressed"]


def test_a_router_that_waits_for_headroom_sheds_less_than_one_that_refuses_at_once() -> None:
    # One worker with a quarter of the KV budget, 300 trace requests at 1.5 requests/s: bursts outrun its
    # headroom. Refusing at once sheds them; waiting up to 5 s (the router's default) places most later.
    models, _ = calibrated_models()
    reqs = load_trace(limit=300)
    small = replace(spec_for("zipkv", models["zipkv"]), budget_tokens=budget_tokens() // 4)
    runs = {
        p: simulate([small], p, reqs, arrivals_s(reqs, 1.5), SLOS[0], 0.03)
        for p in ("zipkv_affinity_no_shed", "zipkv_affinity_no_shed_wait")
    }
    at_once, waiting = runs["zipkv_affinity_no_shed"].router, runs["zipkv_affinity_no_shed_wait"].router
    assert at_once is not None and waiting is not None
    assert at_once["shed"] > 0 and at_once["waited"] == 0, "the case must run out of headroom"
    assert waiting["waited"] > 0 and waiting["shed"] < at_once["shed"]
    for res in runs.values():  # every request is served or shed, once
        assert sum(res.per_worker_requests) + sum(o.shed for o in res.outcomes) == len(reqs)


def test_a_pooled_file_is_replayed_window_by_window() -> None:
    # Two trace windows pooled (bench/serving/serving_windows.py): the prediction replays each on its own
    # and pools them the same way, so its counts are the two single-window predictions' sums and its goodput
    # divides by both arrival spans.
    from bench.sim.sim_validation import _predicted

    models, _ = calibrated_models()
    one = {"max_context_tokens": 131072, "requests": 8}
    parts = [{**one, "offset": 32}, {**one, "offset": 64}]
    base: dict[str, Any] = {"systems": {}, "rows": []}
    alone = [_predicted("sglang_gateway", 2.0, {**base, "workload": w}, models) for w in parts]
    pooled = _predicted(
        "sglang_gateway", 2.0, {**base, "workload": {"windows": parts, "requests": 16}}, models
    )
    assert pooled["requests"] == 16
    assert pooled["good"] == alone[0]["good"] + alone[1]["good"]
    assert pooled["goodput_rps"] == pytest.approx(pooled["good"] / (7 / 2.0 + 7 / 2.0), abs=1e-4)


def test_the_simulation_past_the_sweep_covers_every_rate_and_names_its_knees() -> None:
    # The sweep ran 1 and 2 req/s; beyond_sweep adds 4 and simulates goodput at both SLOs for each system,
    # the same rows _predicted_rows gives, with the knee of each (system, SLO) over all three rates.
    from bench.sim.sim_validation import _predicted_rows, beyond_sweep

    models, _ = calibrated_models()
    row = {"slo": "strict", "ttft_p50_s": 1.0}
    measured: dict[str, Any] = {
        "workload": {"max_context_tokens": 131072, "requests": 8, "offset": 32},
        "systems": {},
        "rows": [
            {"system": s, "rate_rps": r, **row} for s in ("zipkv", "sglang_gateway") for r in (1.0, 2.0)
        ],
    }
    out = beyond_sweep(measured, models, [4.0])
    assert out["rates_rps"] == [1.0, 2.0, 4.0]
    got = {(r["system"], r["slo"], r["rate_rps"]): r for r in out["rows"]}
    assert len(got) == 2 * 2 * 3
    direct = _predicted_rows("zipkv", 4.0, measured, models)
    assert got[("zipkv", "relaxed", 4.0)]["goodput_rps"] == direct["relaxed"]["goodput_rps"]
    for system in ("zipkv", "sglang_gateway"):
        for slo in ("strict", "relaxed"):
            curve = {rate: got[(system, slo, rate)]["goodput_rps"] for rate in (1.0, 2.0, 4.0)}
            knee = min(curve, key=lambda rate: (-curve[rate], rate))  # the peak, the lowest rate on a tie
            assert got[(system, slo, 1.0)]["knee_rps"] == knee
    z = got[("zipkv", "relaxed", 1.0)]["goodput_at_knee_rps"]
    b = got[("sglang_gateway", "relaxed", 1.0)]["goodput_at_knee_rps"]
    assert out["zipkv_over_sglang_gateway_at_knee"]["relaxed"] == pytest.approx(z / b, abs=1e-3)


def test_the_sustained_simulation_replays_one_long_window_from_the_start() -> None:
    # Whatever windows the sweep pooled, the sustained run is the trace's first N requests at each rate.
    from bench.sim.sim_validation import _predicted_rows, sustained_sweep

    models, _ = calibrated_models()
    parts = [{"max_context_tokens": 131072, "requests": 8, "offset": o} for o in (32, 64)]
    measured: dict[str, Any] = {
        "workload": {"windows": parts, "requests": 16, "max_context_tokens": 131072},
        "systems": {},
        "rows": [{"system": "zipkv", "slo": "strict", "rate_rps": 1.0}],
    }
    out = sustained_sweep(measured, models, [2.0], 40)
    assert out["requests"] == 40 and out["rates_rps"] == [1.0, 2.0]
    long_window = {**measured, "workload": {"max_context_tokens": 131072, "requests": 40, "offset": 0}}
    want = _predicted_rows("zipkv", 2.0, long_window, models)["relaxed"]
    got = next(r for r in out["rows"] if (r["slo"], r["rate_rps"]) == ("relaxed", 2.0))
    assert (got["goodput_rps"], got["attainment"]) == (want["goodput_rps"], want["attainment"])
    assert want["requests"] == 40


def test_a_router_with_claims_claims_and_places_through_them() -> None:
    # The same short-of-headroom case with placement.claim_headroom: waiting requests claim the worker, and
    # some of those claims become their reservations; every request is still served or shed once.
    models, _ = calibrated_models()
    reqs = load_trace(limit=300)
    small = replace(spec_for("zipkv", models["zipkv"]), budget_tokens=budget_tokens() // 4)
    res = simulate([small], "zipkv_affinity_no_shed_claim", reqs, arrivals_s(reqs, 1.5), SLOS[0], 0.03)
    st = res.router
    assert st is not None and st["waited"] > 0
    assert 0 < st["claim_placed"] <= st["claimed"] <= st["waited"]
    assert sum(res.per_worker_requests) + sum(o.shed for o in res.outcomes) == len(reqs)
    assert zipkv_config("zipkv_affinity_no_shed_claim").claim_headroom
    assert not zipkv_config("zipkv_affinity_no_shed_wait").claim_headroom
