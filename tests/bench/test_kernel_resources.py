"""The decode kernel compiled for sm_90 on this (GPU-less) machine: its resources are read, not guessed.

Runs bench/kernels/kernel_resources.py in its own process: the test session imports the kernels for Triton's
interpreter (tests/conftest.py), and a compile for the GPU needs them built without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _resources(*args: str) -> list[dict[str, object]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "bench.kernels.kernel_resources", "--json", *args]
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if done.returncode != 0 and "cuobjdump" in done.stderr and "No such file" in done.stderr:
        pytest.skip("this Triton build has no NVIDIA tools to compile for sm_90")
    assert done.returncode == 0, done.stderr[-2000:]
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_pipelined_twin_moves_its_tiles_from_registers_to_shared_memory() -> None:
    found = {str(r["variant"]): r for r in _resources("--head-dim", "64", "--configs", "32:1:1,32:1:2")}
    flat = found["twin head_dim 64 block_n 32 warps 1 stages 1"]
    piped = found["twin head_dim 64 block_n 32 warps 1 stages 2"]
    for r in found.values():
        assert 0 < int(r["registers"]) <= 255 and int(r["global_loads"]) > 0  # type: ignore[call-overload]
    assert flat["async_copies"] == 0 and int(piped["async_copies"]) > 0  # type: ignore[call-overload]
    assert int(piped["shared_bytes"]) > int(flat["shared_bytes"])  # type: ignore[call-overload]
    assert "v2 compressed head_dim 64 block_n 32 warps 1 stages 1" in found  # v2's PTX restore compiles
    v2, v3 = (found[f"v{v} compressed head_dim 64 block_n 32 warps 1 stages 1"] for v in (2, 3))
    # v3's PTX restore compiles without spills, and its code, patch and metadata bytes load as words and
    # vectors (one byte per load would be ~6x v2's loads)
    assert v3["spill_bytes"] == 0 and int(v3["global_loads"]) <= 2 * int(v2["global_loads"])  # type: ignore[call-overload]


def test_interpreted_kernels_are_refused_with_what_to_do() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "bench.kernels.kernel_resources", "--configs", "32:1:1"]
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode != 0 and "TRITON_INTERPRET unset" in done.stderr


def test_extend_kernel_compiles_for_sm90_without_spills() -> None:
    found = {
        str(r["variant"]): r
        for r in _resources("--kernel", "extend", "--head-dim", "64", "--versions", "2,3")
    }
    assert set(found) == {
        "extend v2 compressed head_dim 64 block_m 16 block_n 32 warps 4",
        "extend v3 compressed head_dim 64 block_m 16 block_n 32 warps 4",
        "extend twin head_dim 64 block_m 16 block_n 32 warps 4",
    }
    for r in found.values():
        assert 0 < int(r["registers"]) <= 255 and r["spill_bytes"] == 0  # type: ignore[call-overload]


def test_v3_codec_compiles_for_sm90_without_spills_and_moves_16_byte_vectors() -> None:
    found = {str(r["variant"]): r for r in _resources("--kernel", "codec", "--head-dim", "128")}
    assert set(found) == {"codec v3 encode head_dim 128 warps 4", "codec v3 decode head_dim 128 warps 4"}
    for r in found.values():
        assert 0 < int(r["registers"]) <= 255 and r["spill_bytes"] == 0  # type: ignore[call-overload]
        assert int(r["vector_loads"]) > 0 and int(r["vector_stores"]) > 0  # type: ignore[call-overload]
