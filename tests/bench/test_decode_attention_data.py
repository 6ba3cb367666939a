"""The decode benchmark's bulk page encoder against the torch reference, byte for byte (v1, v2, v3)."""

from __future__ import annotations

import pytest
import torch

from bench.kernels.decode_attention_data import encode_packed, plant_raw_blocks
from zipkv.kernels.format.layout import PageFormat
from zipkv.kernels.reference import pages as ref
from zipkv.kernels.reference import pages_v3 as ref3


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


def test_encode_packed_writes_v3_pages_back_to_back() -> None:
    """v3: coded pages with patches, a page stored raw, each at its place; fractions planted per v3 block."""
    fmt = PageFormat(64, 2, version=3)
    gen = torch.Generator().manual_seed(3)
    pages = torch.randn(6, 2, 2, 16, 64, generator=gen).bfloat16()
    pages[2] = 1.0
    pages[2, :, :, 0, :32:4] = 1e-30  # every block of page 2 raw: stored raw
    plant_raw_blocks(pages[4:], fmt, 0.5, gen)  # raw blocks, i.e. patches, in pages 4 and 5
    stored = encode_packed(pages, fmt)
    want, want_meta = ref3.encode_pages_v3(pages, fmt)
    assert torch.equal(stored.page_meta, want_meta)
    for i, data in enumerate(want):
        at = int(stored.page_loc[i])
        assert torch.equal(stored.heap[at : at + data.numel()], data), f"page {i} bytes"
    assert int(stored.page_loc[-1]) + want[-1].numel() == stored.stored_bytes
    assert want[2].numel() == fmt.raw_page_bytes and int(want_meta[2].min()) == 0xFF
    assert (want_meta[4:] >= 0x80).any() and 0.5 < stored.compressible_fraction < 1.0
