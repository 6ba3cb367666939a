"""The decode benchmark's bulk page encoder against the torch reference, byte for byte (v1 and v2)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from decode_attention_data import encode_packed

from zipkv.kernels import reference as ref
from zipkv.kernels.layout import PageFormat


@pytest.mark.parametrize("version", [1, 2])
def test_encode_packed_matches_the_reference_page_encoder(version: int) -> None:
    fmt = PageFormat(128, 2, version=version)
    gen = torch.Generator().manual_seed(version)
    pages = torch.randn(5, 2, 2, 16, 128, generator=gen).bfloat16()
    pages[1, 0, 1, 4, 3] = 0.0  # raw blocks in the middle of a page
    pages[3, 1, 0, 0, 0] = 1e-30
    stored = encode_packed(pages, fmt)
    for i in range(pages.shape[0]):
        data, meta = ref.encode_page(pages[i], fmt)
        at = int(stored.page_loc[i])
        assert torch.equal(stored.heap[at : at + data.numel()], data), f"page {i} bytes"
        assert torch.equal(stored.page_meta[i], meta), f"page {i} metadata"
    assert 0.0 < stored.compressible_fraction < 1.0
