"""The torch reference at page level: encode/decode_page, raw pages, store_tokens and gather_pages."""

from __future__ import annotations

import itertools

import pytest
import torch

from zipkv.kernels.format import layout
from zipkv.kernels.format.layout import PageFormat
from zipkv.kernels.reference import pages as ref


def kv_like(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Normal values with per-token scales (value-like outliers), a few exact zeros, some bit patterns."""
    x = torch.randn(shape, generator=gen) * torch.exp(torch.randn((*shape[:-1], 1), generator=gen))
    x = x.bfloat16()
    x.view(-1)[torch.randint(0, x.numel(), (3,), generator=gen)] = 0.0
    return x


def formats() -> list[PageFormat]:
    """v1 and v2 in every geometry (v3 has one geometry; its pages are tested in test_reference_v3.py)."""
    out = []
    for head_dim in layout.SUPPORTED_HEAD_DIMS:
        geoms = layout.candidate_geometries(head_dim)
        for kg, vg in itertools.product(geoms, geoms):
            for version in (v for v in layout.SUPPORTED_VERSIONS if v < 3):  # v3: test_reference_v3.py
                out.append(PageFormat(head_dim, 2, k_geometry=kg, v_geometry=vg, version=version))
    return out


def fmt_id(f: PageFormat) -> str:
    return f"v{f.version}-D{f.head_dim}-K{f.k_geometry.name}-V{f.v_geometry.name}"


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("fmt", formats(), ids=fmt_id)
def test_page_round_trip(fmt: PageFormat) -> None:
    gen = torch.Generator().manual_seed(fmt.head_dim)
    page = kv_like((2, fmt.num_kv_heads, 16, fmt.head_dim), gen)
    page[1, 0] = 1.5  # a page-head that compresses
    page[0, 1, :, 3] = 1e30  # an outlier channel
    data, meta = ref.encode_page(page, fmt)
    offsets, markers = ref.unpack_meta(meta, fmt)
    sizes = ref.block_sizes(markers)
    assert data.numel() == int(sizes.sum()) == fmt.compressed_page_bytes(int((markers != 255).sum()))
    assert offsets.tolist() == (torch.cumsum(sizes.sum(1), 0) - sizes.sum(1)).tolist()
    assert bool((meta[:, layout.OFFSET_BYTES + fmt.blocks_per_page_head :] == 0).all())
    assert bool((markers[fmt.num_kv_heads] != 255).all())
    assert same_bits(ref.decode_page(data, meta, fmt), page)
    raw = ref.raw_page_bytes(page, fmt)
    assert raw.numel() == fmt.raw_page_bytes
    assert same_bits(ref.decode_page(raw, ref.raw_page_meta(fmt), fmt), page)


def test_token_major_raw_page_is_plain_bf16() -> None:
    fmt = PageFormat(
        head_dim=128, num_kv_heads=2, k_geometry=layout.token_major(128), v_geometry=layout.token_major(128)
    )
    page = kv_like((2, 2, 16, 128), torch.Generator().manual_seed(0))
    assert torch.equal(ref.raw_page_bytes(page, fmt), page.contiguous().view(torch.uint8).view(-1))
    offsets, markers = ref.unpack_meta(ref.raw_page_meta(fmt), fmt)
    assert offsets.tolist() == [i * fmt.raw_page_head_bytes for i in range(4)]
    assert bool((markers == 255).all())


@pytest.mark.parametrize("head_dim", layout.SUPPORTED_HEAD_DIMS)
def test_store_tokens_then_gather_raw_and_compressed_pages(head_dim: int) -> None:
    geoms = layout.candidate_geometries(head_dim)
    fmt = PageFormat(head_dim=head_dim, num_kv_heads=2, k_geometry=geoms[0], v_geometry=geoms[-1])
    gen = torch.Generator().manual_seed(head_dim)
    max_pages, n_pages = 6, 4
    heap = torch.zeros(max_pages * fmt.raw_page_bytes + 4096, dtype=torch.uint8)
    page_loc = torch.tensor([5, 0, 3, 1, 4, 2]) * fmt.raw_page_bytes + 256
    page_meta = ref.raw_page_meta(fmt).expand(max_pages, -1, -1).clone()
    pages = kv_like((n_pages, 2, 2, 16, head_dim), gen)
    # Tokens arrive one at a time, pages interleaved (as in decode), in a shuffled order.
    slots = torch.arange(n_pages * 16)[torch.randperm(n_pages * 16, generator=gen)]
    for chunk in slots.split(7):
        k = pages[chunk // 16, 0, :, chunk % 16]
        v = pages[chunk // 16, 1, :, chunk % 16]
        ref.store_tokens(heap, page_loc, chunk, k, v, fmt)
    ids = torch.arange(n_pages)
    assert same_bits(ref.gather_pages(heap, page_loc, page_meta, ids, fmt), pages)
    # Compress pages 1 and 2 into the unused slots of page ids 4 and 5; gather reads the mix.
    for pid, free in ((1, int(page_loc[4])), (2, int(page_loc[5]))):
        data, meta = ref.encode_page(pages[pid], fmt)
        heap[free : free + data.numel()] = data
        page_loc[pid], page_meta[pid] = free, meta
    order = torch.tensor([2, 0, 1, 3, 2])
    assert same_bits(ref.gather_pages(heap, page_loc, page_meta, order, fmt), pages[order])


def test_page_errors_are_clear() -> None:
    fmt = PageFormat(head_dim=64, num_kv_heads=1)
    with pytest.raises(ValueError, match="bf16 page of shape"):
        ref.encode_page(torch.zeros(2, 2, 16, 64, dtype=torch.bfloat16), fmt)
    data, meta = ref.encode_page(torch.ones(2, 1, 16, 64, dtype=torch.bfloat16), fmt)
    with pytest.raises(ValueError, match="past the end"):
        ref.decode_page(data[:-1], meta, fmt)
    with pytest.raises(ValueError, match="metadata"):
        ref.decode_page(data, meta[:, :4], fmt)


@pytest.mark.parametrize("fmt", formats()[::3], ids=fmt_id)
def test_batched_encode_and_decode_pages_match_page_by_page(fmt: PageFormat) -> None:
    n = 3
    pages = kv_like((n, 2, fmt.num_kv_heads, 16, fmt.head_dim), torch.Generator().manual_seed(4))
    pages[1, 1] = 2.0
    heap = torch.zeros(2 * n * fmt.raw_page_bytes + 256, dtype=torch.uint8)
    src = torch.tensor([2, 0, 1]) * fmt.raw_page_bytes
    dst = n * fmt.raw_page_bytes + 256 + torch.arange(n) * fmt.raw_page_bytes
    for i in range(n):
        heap[int(src[i]) : int(src[i]) + fmt.raw_page_bytes] = ref.raw_page_bytes(pages[i], fmt)
    meta = torch.zeros(n, fmt.page_heads_per_page, fmt.meta_bytes, dtype=torch.uint8)
    sizes = torch.zeros(n, dtype=torch.int32)
    ref.encode_pages(heap, src, dst, meta, sizes, fmt)
    for i in range(n):
        data, want_meta = ref.encode_page(pages[i], fmt)
        assert torch.equal(meta[i], want_meta) and int(sizes[i]) == data.numel()
        assert torch.equal(heap[int(dst[i]) : int(dst[i]) + data.numel()], data)
    out = torch.empty_like(pages)
    ref.decode_pages(heap, dst, meta, out, fmt)
    assert same_bits(out, pages)
