"""The serving client without Hugging Face `datasets`, and the sweep's systems without gRPC."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.serving import serving_client


def test_datasets_stand_in_is_installed_only_when_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    serving_client._stand_in_for_datasets()
    stand_in = sys.modules["datasets"]
    assert stand_in is not None and "stand-in" in (stand_in.__doc__ or "")
    with pytest.raises(ImportError, match="pip install datasets"):
        stand_in.load_dataset("MMMU/MMMU")


def test_datasets_left_alone_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    real = types.ModuleType("datasets")
    monkeypatch.setitem(sys.modules, "datasets", real)
    serving_client._stand_in_for_datasets()
    assert sys.modules["datasets"] is real


def test_sweep_systems_import_without_grpc_or_ray() -> None:
    # SGLang's own server runs in a site whose grpcio is older than the generated stubs need: starting it must
    # not import zipkv's stack (gRPC stubs, Ray).
    code = (
        "import sys; sys.modules['grpc'] = None; sys.modules['ray'] = None\n"
        "import bench.serving.serving_run, bench.serving.serving_sweep\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
