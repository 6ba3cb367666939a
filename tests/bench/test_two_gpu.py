"""The two-GPU runs' pure pieces, off the GPU: the gateway's command and policies, each replica's device,
the client's backend per system, the goodput table merged from several device calls, the simulation's
two-worker rows beside measured ones, and the TP=2 milestone's engine arguments."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from bench.serving import serving_goodput as sg
from bench.serving.bench_sglang_e2e import summarize
from bench.serving.serving_client import BACKEND, GATEWAY_BACKEND
from bench.serving.serving_systems import (
    GATEWAY_POLICIES,
    SYSTEMS,
    client_backend,
    gateway_cmd,
    gateway_policy,
    replica_plan,
    server_envs,
)
from bench.serving.sglang_e2e_config import BUDGET_TOKENS, MILESTONES, WORKLOADS, engine_kwargs, parse_runs
from bench.sim.serving_predicted import predict, side_by_side

ROOT = Path(__file__).resolve().parents[2]
SGLANG_SRC = Path(os.environ.get("ZIPKV_SGLANG_SRC", ROOT / ".cache" / "sglang-0.5.17"))


# ---- the gateway and the replicas ---------------------------------------------------------------------


def test_gateway_systems_name_sglang_router_0_3_2_policies() -> None:
    assert gateway_policy("sglang_gateway_cache_aware") == "cache_aware"
    assert gateway_policy("sglang_gateway_power_of_two") == "power_of_two"
    assert gateway_policy("sglang_gateway") is None and gateway_policy("zipkv") is None
    with pytest.raises(ValueError, match="no policy 'least_load'"):  # 0.3.2 has none of that name
        gateway_policy("sglang_gateway_least_load")
    assert {f"sglang_gateway_{p}" for p in GATEWAY_POLICIES} <= set(SYSTEMS)


def test_gateway_command_lists_every_worker_after_its_policy() -> None:
    urls = ["http://127.0.0.1:30001", "http://127.0.0.1:30002"]
    cmd = gateway_cmd("cache_aware", urls, 31000, 31001)
    assert cmd[1:3] == ["-m", "sglang_router.launch_router"]
    assert cmd[cmd.index("--policy") + 1] == "cache_aware"
    assert cmd[cmd.index("--port") + 1] == "31000"
    # --worker-urls takes every argument after it (nargs="*"): the URLs must end the command
    assert cmd[cmd.index("--worker-urls") + 1 :] == urls
    with pytest.raises(ValueError):
        gateway_cmd("least_load", urls, 31000, 31001)
    with pytest.raises(ValueError):
        gateway_cmd("cache_aware", [], 31000, 31001)


def test_the_client_talks_generate_to_the_gateway_and_completions_to_the_rest() -> None:
    assert client_backend("sglang_gateway_cache_aware") == GATEWAY_BACKEND == "sglang"
    assert client_backend("sglang_gateway_power_of_two") == GATEWAY_BACKEND
    assert client_backend("zipkv") == client_backend("sglang_gateway") == BACKEND == "sglang-oai"


def test_each_replica_gets_one_gpu_of_its_own() -> None:
    two = replica_plan(2, "sglang")
    assert (two.workers, two.ray_num_gpus, two.gpus_per_replica) == (2, 2, 1)
    assert two.ray_num_cpus >= two.workers * two.cpus_per_replica + 2  # Serve's controller has room
    cpu = replica_plan(2, "reference")
    assert (cpu.workers, cpu.ray_num_gpus, cpu.gpus_per_replica) == (2, 0, 0)
    assert replica_plan(1, "sglang").ray_num_gpus == 1
    with pytest.raises(ValueError):
        replica_plan(0, "sglang")
    base = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1"}
    envs = server_envs(2, base)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1"]
    assert all(e["PATH"] == "/bin" for e in envs) and base["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_two_replicas_can_share_one_gpu_for_the_dry_run() -> None:
    shared = replica_plan(2, "sglang", gpus=1)
    assert (shared.ray_num_gpus, shared.gpus_per_replica) == (1, 0.5)  # Ray packs both onto device 0
    four = replica_plan(4, "sglang", gpus=2)
    assert (four.ray_num_gpus, four.gpus_per_replica) == (2, 0.5)
    assert replica_plan(2, "sglang", gpus=2).gpus_per_replica == 1
    assert replica_plan(2, "reference", gpus=1).ray_num_gpus == 0  # the CPU engine asks Ray for none
    for bad in (0, 3):  # none, or more GPUs than replicas
        with pytest.raises(ValueError, match="divide"):
            replica_plan(2, "sglang", gpus=bad)
    with pytest.raises(ValueError, match="divide"):  # 3 replicas cannot split evenly over 2 GPUs
        replica_plan(3, "sglang", gpus=2)
    envs = server_envs(2, {"PATH": "/bin"}, gpus=1)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "0"]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in server_envs(4, {}, gpus=2)] == ["0", "1", "0", "1"]


def test_one_gpu_dry_run_shares_the_device_and_refuses_tp2(tmp_path: Path) -> None:
    import subprocess

    script = (ROOT / "bench" / "run_two_gpu.sh").read_text()
    assert "export GPUS=1 KV_BUDGET_MIB=" in script
    serving = (ROOT / "bench" / "run_serving_gpu.sh").read_text()
    assert '${GPUS:+--gpus "$GPUS"}' in serving
    # tp2 cannot run on one device: the script says so before touching anything (nvidia-smi stubbed to
    # list one GPU)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: test'\n")
    (fake / "nvidia-smi").chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "OUT": str(tmp_path), "STEP": "tp2", "ONE_GPU": "1"}
    res = subprocess.run(["bash", str(ROOT / "bench" / "run_two_gpu.sh")], env=env, capture_output=True,
                         text=True, cwd=ROOT)  # fmt: skip
    assert res.returncode == 2 and "tp2 needs two devices" in res.stdout
    env["ONE_GPU"] = "0"
    res = subprocess.run(["bash", str(ROOT / "bench" / "run_two_gpu.sh")], env=env, capture_output=True,
                         text=True, cwd=ROOT)  # fmt: skip
    assert res.returncode == 1 and "needs two GPUs" in res.stdout


def test_run_script_passes_replicas_and_installs_the_gateway_wheel() -> None:
    text = (ROOT / "bench" / "run_serving_gpu.sh").read_text()
    assert '--replicas "$REPLICAS"' in text
    assert "pip install -q --no-deps --target /tmp/routersite" in text
    two = (ROOT / "bench" / "run_two_gpu.sh").read_text()
    for system in ("zipkv", *(f"sglang_gateway_{p}" for p in GATEWAY_POLICIES)):
        assert re.search(rf"REPLICAS=2 SYSTEMS={system} ", two), f"run_two_gpu.sh does not run {system}"
    assert "TP2=1 bash bench/run_sglang_e2e_gpu.sh" in two


# ---- the table from several calls ---------------------------------------------------------------------


def _ok(ttft: float, out: int, gap: float) -> dict[str, Any]:
    gaps = [gap] * (out - 1)
    return {"ok": True, "shed": False, "ttft_s": ttft, "itl_s": gaps, "output_tokens": out,
            "start_s": 0.0, "latency_s": ttft + sum(gaps), "error": ""}  # fmt: skip


def _write(folder: Path, system: str, rate: float, reqs: list[dict[str, Any]]) -> None:
    (folder / system).mkdir(parents=True, exist_ok=True)
    rec = {"system": system, "rate_rps": rate, "duration_s": 10.0, "wall_s": 10.0, "client": f"c-{system}",
           "workload": {"requests": 48, "offset": 0}, "requests": reqs}  # fmt: skip
    (folder / system / f"rate_{rate:g}.json").write_text(json.dumps(rec))


def test_calls_merge_and_the_headline_takes_the_gateways_best_policy(tmp_path: Path) -> None:
    calls = [tmp_path / "call2", tmp_path / "call3", tmp_path / "call4"]
    # rate 1, four requests over a 3 s span: good ones / 3 s is the goodput
    _write(calls[0], "zipkv", 1.0, [_ok(0.5, 3, 0.01)] * 3 + [_ok(9.0, 3, 0.01)])  # 3 good -> 1.0
    _write(calls[1], "sglang_gateway_cache_aware", 1.0, [_ok(0.5, 3, 0.01)] + [_ok(9.0, 3, 0.01)] * 3)
    _write(calls[2], "sglang_gateway_power_of_two", 1.0, [_ok(0.5, 3, 0.01)] * 2 + [_ok(9.0, 3, 0.01)] * 2)
    report = sg.build(calls, "2 x test", "pytest")
    assert {r["system"] for r in report["rows"]} == {
        "zipkv", "sglang_gateway_cache_aware", "sglang_gateway_power_of_two"}  # fmt: skip
    h = report["headline"]["strict"]
    assert h["baseline"] == "sglang_gateway_power_of_two"  # 2/3 req/s against cache_aware's 1/3
    assert h["zipkv_over_sglang_gateway"] == pytest.approx(1.5)
    assert report["client"].count("|") == 2  # each call's client named, not the last one's alone


def test_a_system_in_two_calls_is_refused_not_mixed(tmp_path: Path) -> None:
    _write(tmp_path / "a", "zipkv", 1.0, [_ok(0.5, 3, 0.01)] * 2)
    _write(tmp_path / "b", "zipkv", 2.0, [_ok(0.5, 3, 0.01)] * 2)
    with pytest.raises(SystemExit, match="zipkv is in both"):
        sg.build([tmp_path / "a", tmp_path / "b"], "d", "c")


def test_the_servers_own_run_stays_the_baseline_on_one_gpu() -> None:
    assert sg.best_baseline({"sglang_gateway": 1.0, "sglang_gateway_cache_aware": 5.0}) == "sglang_gateway"
    assert sg.best_baseline({"sglang_gateway_cache_aware": 2.0, "sglang_gateway_random": 2.0}) == (
        "sglang_gateway_cache_aware"  # a tie: the first name, so reruns pick the same
    )
    assert sg.best_baseline({"zipkv": 1.0}) is None


# ---- the simulation beside the measurement ------------------------------------------------------------


def test_side_by_side_errors() -> None:
    got = side_by_side({"goodput_rps": 1.2, "ttft_p99_s": 2.0}, {"goodput_rps": 1.0, "ttft_p99_s": 0.0})
    assert got["goodput_rps"] == {"simulated": 1.2, "measured": 1.0, "error": pytest.approx(0.2)}
    assert got["ttft_p99_s"]["error"] is None  # nothing to divide by
    assert side_by_side({"goodput_rps": 1.0}, None)["goodput_rps"]["measured"] is None


def test_two_worker_prediction_rows_pair_with_measured_ones() -> None:
    measured = {"date": "d", "rows": [{"system": "zipkv", "rate_rps": 2.0, "slo": "strict",
                                        "goodput_rps": 0.5, "ttft_p99_s": 1.0}]}  # fmt: skip
    report = predict(2, [2.0], 12, 0, 131072, measured, systems=("zipkv", "sglang_gateway_cache_aware"))
    assert report["workers"] == 2 and len(report["rows"]) == 2 * 2  # two systems x two SLOs
    z = next(r for r in report["rows"] if r["system"] == "zipkv" and r["slo"] == "strict")
    assert z["goodput_rps"]["measured"] == 0.5 and z["goodput_rps"]["simulated"] is not None
    assert len(z["per_worker_requests"]) == 2 and sum(z["per_worker_requests"]) <= 12
    other = next(r for r in report["rows"] if r["system"] == "sglang_gateway_cache_aware")
    assert other["sim_policy"] == "cache_aware" and other["goodput_rps"]["measured"] is None


# ---- TP=2 ---------------------------------------------------------------------------------------------


def test_tp2_is_m2_on_two_gpus_for_every_system() -> None:
    assert MILESTONES["tp2"] == {**MILESTONES["m2"], "tp_size": 2}
    for system in ("zipkv", "zipkv_uncompressed", "flashinfer"):
        kw = engine_kwargs(system, "tp2", "m", BUDGET_TOKENS)
        assert kw["tp_size"] == 2 and kw["attention_backend"] == system
    medium = WORKLOADS["medium"]
    # every request fits at once (raw view): the ranks never face admission pressure in this run
    assert medium.requests * (medium.input_tokens + medium.output_tokens) <= BUDGET_TOKENS
    runs = parse_runs("zipkv:tp2:medium:180,flashinfer:tp2:medium")
    assert [r.milestone for r in runs] == ["tp2", "tp2"] and runs[0].workload.name == "online_1024x2048"


def test_tp2_rows_are_summarised_apart_from_one_gpu_rows() -> None:
    rows = []
    for milestone, fi in (("m2", 2000.0), ("tp2", 3000.0)):
        base = {"workload": "online_1024x2048", "milestone": milestone}
        rows += [{**base, "system": "zipkv", "request_sha256": ["a"], "decode_tokens_per_s": 3000.0},
                 {**base, "system": "zipkv_uncompressed", "request_sha256": ["a"]},
                 {**base, "system": "flashinfer", "decode_tokens_per_s": fi}]  # fmt: skip
    results: dict[str, Any] = {"rows": rows}
    summarize(results)
    ratios = results["zipkv_over_flashinfer"]
    assert ratios["online_1024x2048"]["decode_tokens_per_s"] == 1.5
    assert ratios["online_1024x2048:tp2"]["decode_tokens_per_s"] == 1.0
    assert results["greedy_tokens_identical"]["online_1024x2048:tp2"]["requests_differing"] == 0


def test_tp2_engine_arguments_are_sglang_0_5_17_server_args() -> None:
    source = SGLANG_SRC / "sglang" / "srt" / "server_args.py"
    if not source.is_file():
        pytest.skip(f"no SGLang 0.5.17 source at {SGLANG_SRC}")
    fields = set(re.findall(r"^    (\w+): ", source.read_text(), flags=re.M))
    unknown = sorted(set(engine_kwargs("zipkv", "tp2", "m", BUDGET_TOKENS)) - fields)
    assert not unknown, f"not SGLang 0.5.17 server arguments: {unknown}"


def test_placements_are_read_per_worker_from_prometheus_text() -> None:
    from bench.serving.serving_systems import GATEWAY_PLACEMENTS, ZIPKV_PLACEMENTS, placements

    text = "\n".join([
        "# HELP zipkv_router_placements_total requests placed on a worker",
        "# TYPE zipkv_router_placements_total counter",
        'zipkv_router_placements_total{mode="headroom",worker="w-a"} 7.0',
        'zipkv_router_placements_total{mode="headroom",worker="w-b"} 5.0',
        'zipkv_router_placements_created{mode="headroom",worker="w-a"} 1.7e9',
        'smg_worker_cb_outcomes_total{worker="http://127.0.0.1:1",outcome="success"} 3',
    ])  # fmt: skip
    assert placements(text, ZIPKV_PLACEMENTS) == {
        '{mode="headroom",worker="w-a"}': 7.0, '{mode="headroom",worker="w-b"}': 5.0}  # fmt: skip
    assert placements(text, GATEWAY_PLACEMENTS) == {'{worker="http://127.0.0.1:1",outcome="success"}': 3.0}
    assert placements(text, "absent_total") == {}
