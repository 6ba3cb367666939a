"""Worker settings and the Serve builder's arguments: validated at start-up, clear errors."""

from __future__ import annotations

import pytest
import torch

from zipkv.worker.engine_factory import build_engine
from zipkv.worker.engines.sglang.availability import EngineUnavailable
from zipkv.worker.serve import app_builder, settings_from_args
from zipkv.worker.settings import WorkerSettings, resolve_device


def test_serve_args_parse_strings_as_serve_run_passes_them() -> None:
    settings, replicas, gpus, cpus = settings_from_args(
        {
            "engine": "reference",
            "router": "router:50051,tap:1",
            "num_replicas": "3",
            "gpus_per_replica": "0",
            "cpus_per_replica": "0.5",
            "kv_budget_mib": "32",
            "compression": "false",
        }
    )
    assert (replicas, gpus, cpus) == (3, 0.0, 0.5)
    assert settings.kv_budget_bytes == 32 << 20 and not settings.compression
    assert settings.report_addresses() == ["router:50051", "tap:1"]
    assert settings.bind_host == "0.0.0.0" and settings.device == "auto"
    gpu, _, _, _ = settings_from_args({"gpus_per_replica": "1"})
    assert gpu.device == "cuda"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"replicas": "2"}, "unknown worker arguments"),
        ({"engine": "vllm"}, "engine must be"),
        ({"num_replicas": "0"}, "num_replicas"),
        ({"compression": "maybe"}, "true/false"),
        ({"kv_budget_mib": "0"}, "kv_budget_bytes"),
        ({"engine": "sglang", "sglang_args": "{mem_fraction_static: 0.3}"}, "must be a JSON object"),
        ({"engine": "sglang", "sglang_args": "[1, 2]"}, "got list"),
        ({"engine": "sglang", "sglang_args": '{"model_path": "/x"}'}, "must not set model_path"),
        ({"sglang_args": '{"log_level": "info"}'}, "engine 'sglang' only"),
    ],
)
def test_bad_serve_args_fail_loudly(args: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        settings_from_args(args)


def test_app_builder_never_ships_the_report_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZIPKV_REPORT_TOKEN", "do-not-ship")
    app = app_builder({"num_replicas": "2", "router": "r:1"})
    assert "do-not-ship" not in repr(app._bound_deployment.init_args)
    assert app._bound_deployment._deployment_config.num_replicas == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_sglang_engine_is_a_clear_error_without_cuda() -> None:
    with pytest.raises(EngineUnavailable, match=r"needs CUDA and sglang==0\.5\.17"):
        build_engine(WorkerSettings(engine="sglang"))
    with pytest.raises(ValueError, match="no CUDA GPU"):
        resolve_device("cuda")
    assert resolve_device("auto") == "cpu"


def test_missing_model_dir_is_a_clear_error_where_it_loads() -> None:
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        build_engine(WorkerSettings(model_path="/no/such/dir"))
