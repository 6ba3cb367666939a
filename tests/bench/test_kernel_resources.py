"""The decode kernel compiled for sm_90 on this (GPU-less) machine: its resources are read, not guessed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from kernel_resources import compile_decode_kernel

from zipkv.kernels.layout import PageFormat


def test_pipelined_twin_moves_its_tiles_from_registers_to_shared_memory() -> None:
    try:
        flat = compile_decode_kernel(PageFormat(64, 2), False, block_n=32, num_warps=1, num_stages=1)
        piped = compile_decode_kernel(PageFormat(64, 2), False, block_n=32, num_warps=1, num_stages=2)
    except (FileNotFoundError, ImportError) as exc:  # a Triton build without the NVIDIA backend's tools
        pytest.skip(f"Triton cannot compile for sm_90 here: {exc}")
    for r in (flat, piped):
        assert 0 < r.registers <= 255 and r.global_loads > 0
    assert flat.async_copies == 0 and piped.async_copies > 0
    assert piped.shared_bytes > flat.shared_bytes


def test_v2_compressed_kernel_compiles_with_its_ptx_restore() -> None:
    try:
        r = compile_decode_kernel(PageFormat(128, 8, version=2), True, block_n=32, num_warps=1, num_stages=1)
    except (FileNotFoundError, ImportError) as exc:
        pytest.skip(f"Triton cannot compile for sm_90 here: {exc}")
    assert 0 < r.registers <= 255 and "v2 compressed" in r.variant
