"""The serving sweep's zipkv systems: their router settings reach the router's config as the stack starts
it, and the simulation places each with the same settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.serving.serving_systems import SYSTEMS
from bench.serving.zipkv_systems import ZIPKV_SYSTEMS
from bench.sim.sim_cluster import ZIPKV_POLICIES
from bench.sim.sim_validation import ROUTER_POLICY, router_policy
from zipkv.controlplane.config import load_config
from zipkv.stack.router_processes import router_config


def _router_as_started(tmp_path: Path, env: dict[str, str]) -> float:
    """placement.shed_wait_over_ttft of a router started as the local stack starts it: its config file
    (stack/router_processes.py) and the system's overrides in its environment."""
    model = {"name": "m", "max_context_tokens": 1024, "tokenizer": "byte"}
    path = tmp_path / "router.yaml"
    path.write_text(json.dumps(router_config(8000, 50051, model, "r" * 32, "d" * 32, None)))
    return load_config(str(path), env=env).placement.shed_wait_over_ttft


def test_each_zipkv_system_runs_the_router_settings_it_names(tmp_path: Path) -> None:
    assert set(ZIPKV_SYSTEMS) <= set(SYSTEMS)
    default = _router_as_started(tmp_path, {})
    assert default == 0.0  # the router's own default: no SLO shed
    got = {name: _router_as_started(tmp_path, s.router_env()) for name, s in ZIPKV_SYSTEMS.items()}
    assert got == {"zipkv": 0.0, "zipkv_uncompressed": 0.0, "zipkv_shed": 1.0}
    assert [s.compression for s in ZIPKV_SYSTEMS.values()] == [True, False, True]


def test_the_simulation_places_each_system_with_its_settings() -> None:
    for name, system in ZIPKV_SYSTEMS.items():
        variant = ZIPKV_POLICIES[router_policy(name)]
        assert variant.shed_wait_over_ttft == system.shed_wait_over_ttft
        # everything else is the router's default, as the sweep runs it
        assert variant.headroom_wait_ms == ZIPKV_POLICIES[ROUTER_POLICY].headroom_wait_ms == 5000
        assert variant.weight_prefix_affinity is None
    assert router_policy("zipkv_triton_prefill") == ROUTER_POLICY  # an unnamed variant: the defaults
    assert router_policy("sglang_gateway") == "round_robin"


def test_a_system_whose_settings_the_simulation_lacks_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.serving.zipkv_systems import ZipkvSystem

    monkeypatch.setitem(ZIPKV_SYSTEMS, "zipkv_odd", ZipkvSystem(compression=True, shed_wait_over_ttft=0.7))
    with pytest.raises(SystemExit, match=r"sheds at 0\.7 x TTFT"):
        router_policy("zipkv_odd")


def test_the_simulation_adds_a_system_the_sweep_did_not_run_and_it_sheds_under_load() -> None:
    from bench.sim.sim_calibrate import calibrated_models
    from bench.sim.sim_validation import beyond_sweep

    models, _ = calibrated_models()
    measured = {
        "workload": {"max_context_tokens": 131072, "requests": 24, "offset": 0},
        "systems": {},
        "rows": [{"system": "zipkv", "slo": "strict", "rate_rps": 4.0}],
    }
    out = beyond_sweep(measured, models, [], also=("zipkv_shed",))
    got = {(r["system"], r["slo"]): r for r in out["rows"]}
    assert set(got) == {(s, slo) for s in ("zipkv", "zipkv_shed") for slo in ("strict", "relaxed")}
    # the same arrivals: the router with the shed on refuses what its queue cannot start in time
    assert got[("zipkv_shed", "strict")]["shed"] > got[("zipkv", "strict")]["shed"]
