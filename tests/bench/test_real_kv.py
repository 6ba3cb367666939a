"""The benchmarks' real KV (bench/kernels/real_kv.py): the committed SmolLM2 capture and how it is tiled."""

from __future__ import annotations

import pytest
import torch

from bench.kernels.decode_attention_data import bench_pages, encode_packed
from bench.kernels.real_kv import FIXTURE, REQUEST_STRIDE_TOKENS, load_fixture, tile_pages
from zipkv.kernels.format.layout import PageFormat
from zipkv.kernels.reference import page_codec


def test_the_fixture_is_small_and_holds_smollm2_k_and_v() -> None:
    assert FIXTURE.stat().st_size < 6 * 2**20  # it travels with every checkout and GPU run
    k, v, info = load_fixture()
    assert k.shape == v.shape == (12, 1024, 64) and k.dtype == torch.bfloat16
    assert "SmolLM2" in str(info["model"]) and "SGLang" in str(info["k"])
    assert not torch.equal(k, v) and bool(torch.isfinite(k.float()).all())


def test_a_64_channel_head_is_one_source_head_and_requests_start_apart() -> None:
    k, v, _ = load_fixture()
    pages = tile_pages(130, 3, 64, pages_per_request=65)  # two requests of 65 pages: the second wraps
    assert torch.equal(pages[0, 0, 2], k[2, :16]) and torch.equal(pages[0, 1, 2], v[2, :16])
    assert torch.equal(pages[63, 0, 0], k[0, 1024 - 16 :])  # the capture's last page
    assert torch.equal(pages[64, 0, 0], k[0, :16])  # then it starts over
    start = REQUEST_STRIDE_TOKENS
    assert torch.equal(pages[65, 0, 0], k[1, start : start + 16])  # request 1: 7 pages on, heads rotated


def test_a_wider_head_keeps_each_rope_pair_inside_one_source_head() -> None:
    k, _, _ = load_fixture()
    pages = tile_pages(2, 8, 128)
    head = pages[1, 0, 5]  # KV head 5 of request 0: source heads 10 and 11, tokens 16..31
    s0, s1 = k[10, 16:32], k[11, 16:32]
    assert torch.equal(head, torch.cat([s0[:, :32], s1[:, :32], s0[:, 32:], s1[:, 32:]], dim=1))
    pages256 = tile_pages(1, 4, 256)
    assert torch.equal(pages256[0, 0, 3, :, 128 + 32 : 128 + 64], k[(4 * 3 + 1) % 12, :16, 32:])


def test_real_pages_code_at_a_real_fraction() -> None:
    """What the benches record: v2's 512-value blocks leave many real blocks raw, v3's blocks few."""
    pages = tile_pages(256, 8, 128)
    v2 = encode_packed(pages, PageFormat(128, 8, version=2)).compressible_fraction
    v3 = sum(p.coded_blocks for p in page_codec.encode_pages(pages, PageFormat(128, 8, version=3)))
    v3 /= 256 * PageFormat(128, 8, version=3).blocks_per_page
    assert 0.6 < v2 < 0.95 and 0.95 < v3 < 1.0 and v3 > v2


@pytest.mark.parametrize("entry", ["real", "0.5"])
def test_bench_pages_label_what_they_hold(entry: str) -> None:
    fmt = PageFormat(128, 8)
    pages, data = bench_pages(entry, 64, fmt, 32, torch.Generator().manual_seed(0), "cpu")
    assert pages.shape == (64, 2, 8, 16, 128)
    assert data == ("real" if entry == "real" else "synthetic")
    fraction = encode_packed(pages, fmt).compressible_fraction
    assert 0.4 < fraction < 0.95
    if entry == "real":
        assert torch.equal(pages, tile_pages(64, 8, 128, 32))
