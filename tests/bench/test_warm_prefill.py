"""The prefill warm-up's model shape, and when the SGLang end-to-end and Ray Serve scripts start it (its
GPU half, FlashInfer's build, runs only on the GPU machine)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from bench.serving.warm_prefill import model_heads

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("cfg", "want"),
    [
        ({"num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}, (32, 8, 128)),
        ({"num_attention_heads": 16, "hidden_size": 2048}, (16, 16, 128)),  # no GQA field: MHA
        (
            {"num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096, "head_dim": 64},
            (32, 8, 64),
        ),
    ],
)
def test_model_heads_reads_the_config(
    tmp_path: Path, cfg: dict[str, int], want: tuple[int, int, int]
) -> None:
    # the fields every config the worker reads has besides the heads (worker/checkpoint.py's model_shape)
    (tmp_path / "config.json").write_text(
        json.dumps({"num_hidden_layers": 2, "max_position_embeddings": 4096, **cfg})
    )
    assert model_heads(tmp_path) == want


def test_the_benchmarked_model_is_llama_8b_shaped(tmp_path: Path) -> None:
    """bench/configs/llama31_8b.json is what scripts/build_kernel_carry.sh copies to .carry/llama31_8b."""
    shutil.copy(ROOT / "bench/configs/llama31_8b.json", tmp_path / "config.json")
    assert model_heads(tmp_path) == (32, 8, 128)


def _starts(tmp_path: Path, script: str, block_re: str, env_set: dict[str, str]) -> list[str] | None:
    """Run a script's warm-up block under bash with a stand-in python3: its arguments, None if not called."""
    text = (ROOT / "bench" / script).read_text()
    block = re.search(block_re, text, re.S)
    assert block, f"the warm-up's block is gone from bench/{script}"
    stub = tmp_path / "bin" / "python3"
    stub.parent.mkdir(exist_ok=True)
    called = tmp_path / "called"
    called.unlink(missing_ok=True)
    stub.write_text(f'#!/bin/bash\necho "$@" > {called}\n')
    stub.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "ZIPKV_PREFILL_KERNEL"}
    env.update(PATH=f"{stub.parent}:{env['PATH']}", OUT=str(tmp_path), **env_set)
    subprocess.run(["bash", "-c", block.group(0) + "wait\n"], env=env, check=True, timeout=30)
    return called.read_text().split() if called.exists() else None


E2E_BLOCK = r'\ncase ",\$RUNS" in\n.*?\nesac\n'
RAY_BLOCK = (
    r'\nif \[ "\$ENGINE" = sglang \] && \[ "\$\{ZIPKV_PREFILL_KERNEL:-auto\}" != triton \]; then\n.*?\nfi\n'
)
WARM = ["-m", "bench.serving.warm_prefill", "--model", ".carry/llama31_8b"]


@pytest.mark.parametrize(
    ("runs", "prefill_kernel", "want"),
    [
        ("zipkv:m2:offline:420", None, True),
        ("flashinfer:m2:offline:250,zipkv:m2:offline:280", None, True),
        ("zipkv_uncompressed:m2:offline:300", "flashinfer", True),
        ("flashinfer:m2:offline:400", None, False),  # SGLang's own backend: not the worker's modules
        ("triton:m2:offline:130", None, False),
        ("zipkv:m2:offline:420", "triton", False),  # the worker then takes SGLang's Triton extend
    ],
)
def test_the_e2e_script_starts_it_for_zipkv_runs_on_flashinfer_prefill(
    tmp_path: Path, runs: str, prefill_kernel: str | None, want: bool
) -> None:
    env = {"RUNS": runs, **({"ZIPKV_PREFILL_KERNEL": prefill_kernel} if prefill_kernel else {})}
    assert _starts(tmp_path, "run_sglang_e2e_gpu.sh", E2E_BLOCK, env) == (WARM if want else None)


@pytest.mark.parametrize(
    ("engine", "prefill_kernel", "want"),
    [
        ("sglang", None, True),
        ("sglang", "flashinfer", True),
        ("sglang", "triton", False),
        ("reference", None, False),
    ],
)
def test_the_ray_serve_script_starts_it_for_the_sglang_engine(
    tmp_path: Path, engine: str, prefill_kernel: str | None, want: bool
) -> None:
    env = {"ENGINE": engine, "MODEL": ".carry/llama31_8b"}
    env.update({"ZIPKV_PREFILL_KERNEL": prefill_kernel} if prefill_kernel else {})
    assert _starts(tmp_path, "run_ray_serve_gpu.sh", RAY_BLOCK, env) == (WARM if want else None)
