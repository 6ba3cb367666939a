"""The format study measures compressibility correctly and runs on the real trained model."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from zipkv.kernels.layout import BlockGeometry
from zipkv.kernels.study import bytes_per_value, main, measure


def test_measure_counts_a_zero_against_its_block_only() -> None:
    # Two pages x one head x head_dim 128 of values 1.0..1.99 (one exponent): every block compresses.
    values = (1 + torch.rand(32, 1, 128)).to(torch.bfloat16)
    assert measure(values, BlockGeometry(4, 128)) == (8, 8)
    # An exact zero at token 5, channel 100: token-major block 1 of page 0 turns raw; channel-major
    # 16x32 puts it in block 3 of page 0. Either way exactly one block of eight.
    values[5, 0, 100] = 0
    assert measure(values, BlockGeometry(4, 128)) == (7, 8)
    assert measure(values, BlockGeometry(16, 32)) == (7, 8)
    # A partial trailing page is not measured.
    assert measure(values[:20], BlockGeometry(4, 128)) == (3, 4)


def test_bytes_per_value_includes_metadata() -> None:
    # 4 blocks = one page-head of head_dim 128: 3 x 768 + 1024 + 8 bytes of metadata over 2048 values.
    assert bytes_per_value(3, 4, 128) == (3 * 768 + 1024 + 8) / 2048


def test_study_runs_on_minilm(tmp_path: Path) -> None:
    out = tmp_path / "study.json"
    assert main(["--models", "minilm", "--minilm-chunks", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    geometries = {s["geometry"] for s in result["summary"]}
    assert geometries == {"4x128", "8x64", "16x32"}
    for s in result["summary"]:
        # Trained-model KV compresses well but not perfectly; exactly 1.0 would mean nothing was checked.
        assert 0.5 < s["compressible_fraction"] < 1.0
        assert 1.5 <= s["bytes_per_value"] < 2.0
    assert len(result["rows"]) == 6 * 2 * 3  # layers x K/V x geometries
