"""What the SGLang engine adapter hands SGLang, on the CPU: the ``sglang.Engine`` arguments (the KV budget
in raw tokens, the backend, the measured milestone's flags, tracing) and their precedence."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from worker_helpers import LLAMA_8B

from zipkv.worker.engines.sglang import telemetry as sglang_telemetry
from zipkv.worker.engines.sglang.engine_args import engine_kwargs, kv_bytes_per_token
from zipkv.worker.engines.sglang.telemetry import scheduler_env
from zipkv.worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]


def test_engine_kwargs_size_the_budget_in_raw_tokens_and_pick_the_backend(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    llama = str(tmp_path)
    assert kv_bytes_per_token(llama) == 131072
    settings = WorkerSettings(engine="sglang", model_path=llama, kv_budget_bytes=46 * 8448 * 131072)
    kw = engine_kwargs(settings, llama)
    assert (
        kw["attention_backend"] == "zipkv" and kw["max_total_tokens"] == 46 * 8448 and kw["page_size"] == 16
    )
    off = WorkerSettings(engine="sglang", model_path=llama, compression=False)
    assert engine_kwargs(off, llama, disable_cuda_graph=True)["attention_backend"] == "zipkv_uncompressed"
    assert engine_kwargs(off, llama, disable_cuda_graph=True)["disable_cuda_graph"] is True


def test_sglang_args_from_serve_win_over_zipkv_defaults_and_lose_to_overrides(tmp_path: Path) -> None:
    from zipkv.worker.serve import settings_from_args

    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    extra = '{"log_level": "info", "mem_fraction_static": 0.3, "page_size": 32}'
    settings, _, _, _ = settings_from_args({"engine": "sglang", "model": str(tmp_path), "sglang_args": extra})
    kw = engine_kwargs(settings, str(tmp_path), page_size=64)
    assert (kw["log_level"], kw["mem_fraction_static"], kw["page_size"]) == ("info", 0.3, 64)
    assert kw["attention_backend"] == "zipkv"  # untouched defaults stay


def test_a_replica_given_several_gpus_runs_sglang_over_all_of_them(tmp_path: Path) -> None:
    from zipkv.worker.serve import settings_from_args

    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    base = {"engine": "sglang", "model": str(tmp_path)}

    def kwargs(**args: object) -> dict[str, object]:
        settings, _, gpus, _ = settings_from_args({**base, **args})
        assert settings.gpus == gpus  # what Ray reserves is what SGLang spreads over
        return engine_kwargs(settings, str(tmp_path))

    assert kwargs(gpus_per_replica=2)["tp_size"] == 2
    assert kwargs(gpus_per_replica=4, sglang_args='{"tp_size": 4}')["tp_size"] == 4  # saying it is fine
    assert "tp_size" not in kwargs(gpus_per_replica=1)  # SGLang's default, 1
    assert "tp_size" not in kwargs(gpus_per_replica=0.5)  # two replicas sharing one GPU
    with pytest.raises(ValueError, match="tp_size=2 but the replica holds 1 GPU"):
        kwargs(gpus_per_replica=1, sglang_args='{"tp_size": 2}')
    with pytest.raises(ValueError, match=r"tp_size=2 but the replica holds 0\.5 GPU"):
        kwargs(gpus_per_replica=0.5, sglang_args='{"tp_size": 2}')
    with pytest.raises(ValueError, match="whole GPUs"):
        kwargs(gpus_per_replica=1.5)
    with pytest.raises(ValueError, match="gpus must be >= 0"):
        WorkerSettings(engine="sglang", gpus=-1)


def test_worker_defaults_are_the_serving_benchmarks_sglang_flags(tmp_path: Path) -> None:
    """The replica runs SGLang with the flags the serving benchmark measures (bench/run_serving_gpu.sh's
    SGLANG_ARGS): radix cache and chunked prefill on, the prefill CUDA graph off."""
    script = (ROOT / "bench" / "run_serving_gpu.sh").read_text()
    measured = json.loads(re.search(r"SGLANG_ARGS=\$\{SGLANG_ARGS:-'(\{.*?\})'\}", script).group(1))  # type: ignore[union-attr]
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    kw = engine_kwargs(WorkerSettings(engine="sglang", model_path=str(tmp_path)), str(tmp_path))
    for key in ("disable_radix_cache", "chunked_prefill_size", "disable_prefill_cuda_graph"):
        assert kw[key] == measured[key], key
    off = WorkerSettings(
        engine="sglang", model_path=str(tmp_path), sglang_args='{"disable_radix_cache": true}'
    )
    assert engine_kwargs(off, str(tmp_path))["disable_radix_cache"] is True  # sglang_args still win


def test_otlp_export_turns_on_sglangs_scheduler_tracing_without_per_token_spans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    settings = WorkerSettings(engine="sglang", model_path=str(tmp_path))
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    assert "enable_trace" not in engine_kwargs(settings, str(tmp_path)) and scheduler_env() == {}
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    # SGLang refuses to start tracing without the OTLP HTTP exporter: then only the worker's spans
    monkeypatch.setattr(sglang_telemetry, "sglang_can_trace", lambda: False)
    assert "enable_trace" not in engine_kwargs(settings, str(tmp_path))
    monkeypatch.setattr(sglang_telemetry, "sglang_can_trace", lambda: True)
    kw = engine_kwargs(settings, str(tmp_path))
    assert kw["enable_trace"] is True and kw["otlp_traces_endpoint"] == "http://collector:4317"
    # SGLang's level 3 adds a decode_loop span per decode step (per token): the scheduler runs at 2
    assert scheduler_env() == {"SGLANG_TRACE_LEVEL": "2"}
    monkeypatch.setenv("SGLANG_TRACE_LEVEL", "1")
    assert scheduler_env() == {}  # the operator's level stays
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert "enable_trace" not in engine_kwargs(settings, str(tmp_path))
