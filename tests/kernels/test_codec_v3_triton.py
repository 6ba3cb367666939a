"""The Triton codec at page format v3 against its torch reference (reference/pages_v3.py), bit for bit: the
whole heap after an encode (records, patches in rank order, raw pages, and nothing past each stored size),
metadata and sizes, and the restore of coded and raw pages (CPU interpreter here, compiled on a GPU)."""

from __future__ import annotations

import pytest
import torch
from test_reference_v3 import _coded_blocks, _page_heads_from_blocks, _raw_blocks, mixed_pages, same_bits

from zipkv.kernels.codec import pages as codec
from zipkv.kernels.format import layout_v3 as v3
from zipkv.kernels.format.layout import PageFormat
from zipkv.kernels.reference import heap_v3
from zipkv.kernels.reference import pages_v3 as ref

ALL_BITS = torch.arange(65536, dtype=torch.int32)
POISON = 0x7FBF  # a NaN pattern no test page holds at every position


def check_against_reference(
    pages: torch.Tensor, fmt: PageFormat, device: str, **decode_kwargs: object
) -> torch.Tensor:
    """Encode ``pages`` with both, compare every heap byte, decode both ways; returns the metadata."""
    n, raw = pages.shape[0], fmt.raw_page_bytes
    heap = torch.full((2 * n * raw + 64 * (n + 1),), 0xA5, dtype=torch.uint8, device=device)
    # Sources in reverse order; destinations 64 bytes apart past raw size (v3's unit, finer than v2's 256).
    src = ((n - 1 - torch.arange(n)) * raw).to(device)
    dst = (n * raw + 64 + torch.arange(n) * (raw + 64)).to(device)
    heap[: n * raw].view(n, raw)[n - 1 - torch.arange(n, device=device)] = pages.reshape(n, -1).view(
        torch.uint8
    )
    want, got = heap.clone(), heap  # the reference runs where the kernels do
    want_meta = torch.zeros(n, fmt.page_heads_per_page, fmt.meta_bytes, dtype=torch.uint8, device=device)
    want_sizes = torch.zeros(n, dtype=torch.int32, device=device)
    heap_v3.encode_pages(want, src, dst, want_meta, want_sizes, fmt)
    meta = torch.full_like(want_meta, 0xAB)
    sizes = torch.full_like(want_sizes, -1)
    codec.encode_pages(got, src, dst, meta, sizes, fmt)
    assert torch.equal(meta, want_meta), "metadata differs"
    assert torch.equal(sizes, want_sizes), "stored sizes differ"
    assert torch.equal(got, want), "heap bytes differ"
    raw_meta = ref.raw_page_meta_v3(fmt, device).expand(n, -1, -1).contiguous()
    for offsets, rows in ((dst, meta), (src, raw_meta)):
        out = torch.full(pages.shape, POISON, dtype=torch.int16, device=device).view(torch.bfloat16)
        codec.decode_pages(got, offsets, rows, out, fmt, **decode_kwargs)  # type: ignore[arg-type]
        assert same_bits(out, pages)
    return want_meta.cpu()


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_encode_and_decode_match_reference(head_dim: int, device: str) -> None:
    fmt = PageFormat(head_dim=head_dim, num_kv_heads=2, version=3)
    meta = check_against_reference(mixed_pages(5, fmt, head_dim).to(device), fmt, device)
    flat = meta.view(5, -1)
    assert bool((flat[2] == v3.RAW_PAGE_MARKER).all()) and int((flat[3:] >= v3.RAW_BLOCK_FLAG).sum()) >= 2


def test_several_page_heads_per_program_and_streaming_stores(device: str) -> None:
    fmt = PageFormat(head_dim=128, num_kv_heads=4, version=3)
    pages = mixed_pages(4, fmt, 3).to(device)
    check_against_reference(pages, fmt, device, page_heads_per_program=2, stream_stores=True)


def test_patch_limit_stores_the_page_raw(device: str) -> None:
    fmt = PageFormat(head_dim=256, num_kv_heads=4, version=3)  # 256 blocks per page
    pages = torch.ones(3, 2, 4, 16, 256, dtype=torch.bfloat16)
    flat = pages.view(3, -1, 16, 256)
    for page, count in ((0, v3.MAX_PATCHES), (1, v3.MAX_PATCHES + 1), (2, 256)):
        for blk in range(count):  # one outlier in each of the first `count` blocks (page-head order)
            head, b = divmod(blk, 32)
            flat[page, head, blk % 16, 4 * b + blk % 4] = -3e30
    meta = check_against_reference(pages.to(device), fmt, device)
    assert int(meta[0].view(-1)[v3.MAX_PATCHES - 1]) == v3.RAW_BLOCK_FLAG | (v3.MAX_PATCHES - 1)
    assert bool((meta[1:] == v3.RAW_PAGE_MARKER).all())


def test_every_bit_pattern_coded_and_raw_round_trips(device: str) -> None:
    """All 65,536 patterns, each in a coded block and in a raw one, K and V, at varied positions (the
    reference's tests put each at every position; the GPU test below does that through the kernels)."""
    fmt = PageFormat(head_dim=128, num_kv_heads=2, version=3)
    gen = torch.Generator().manual_seed(5)
    coded = ALL_BITS[torch.argsort((ALL_BITS >> 8) & 0x7F, stable=True)].view(-1, 128)  # one e >> 1 each
    a, b = coded[:256], coded[256:]  # blocks whose e >> 1 differ by 64: halves of each never code together
    raw = torch.cat([torch.cat([a[:, :64], b[:, :64]], 1), torch.cat([a[:, 64:], b[:, 64:]], 1)])
    blocks = torch.cat([coded, raw])
    blocks = blocks[torch.randperm(blocks.shape[0], generator=gen)]  # coded and raw blocks mixed in pages
    blocks = torch.gather(blocks, 1, torch.argsort(torch.rand(blocks.shape, generator=gen), dim=1))
    pages = _page_heads_from_blocks(blocks, fmt.head_dim).view(-1, 2, 2, 16, fmt.head_dim)
    meta = check_against_reference(pages.to(device), fmt, device)
    assert bool((meta < v3.RAW_BLOCK_FLAG).any()) and bool((meta >= v3.RAW_BLOCK_FLAG).any())


def test_store_tokens_write_plain_raw_pages(device: str) -> None:
    fmt = PageFormat(head_dim=64, num_kv_heads=2, version=3)
    pages = mixed_pages(3, fmt, 7)
    page_loc = torch.tensor([2, 0, 1]) * fmt.raw_page_bytes + 64
    heap = torch.zeros(3 * fmt.raw_page_bytes + 64, dtype=torch.uint8, device=device)
    slots = torch.randperm(48, generator=torch.Generator().manual_seed(8))
    for part in slots.split(20):  # tokens in any order, a few at a time
        p, t = part // 16, part % 16
        k, v = pages[p, 0, :, t].to(device), pages[p, 1, :, t].to(device)
        codec.store_tokens(heap, page_loc.to(device), part.to(device), k, v, fmt)
    want = torch.zeros_like(heap, device="cpu")
    want[page_loc[:, None] + torch.arange(fmt.raw_page_bytes)] = pages.reshape(3, -1).view(torch.uint8)
    assert torch.equal(heap.cpu(), want)


def test_bad_arguments_are_refused(device: str) -> None:
    fmt = PageFormat(head_dim=64, num_kv_heads=2, version=3)
    heap = torch.zeros(4 * fmt.raw_page_bytes, dtype=torch.uint8, device=device)
    offs = torch.zeros(1, dtype=torch.int64, device=device)
    meta = torch.zeros(1, fmt.page_heads_per_page, fmt.meta_bytes, dtype=torch.uint8, device=device)
    out = torch.empty(1, 2, 2, 16, 64, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="use_prmt"):
        codec.decode_pages(heap, offs, meta, out, fmt, use_prmt=True)
    with pytest.raises(ValueError, match="meta must be"):
        codec.decode_pages(heap, offs, meta[:, :, :4], out, fmt)
    if device == "cpu":  # checked where it needs no device sync: under the interpreter
        with pytest.raises(ValueError, match="multiples of 16 bytes"):
            codec.decode_pages(heap, offs + 8, meta, out, fmt)
        with pytest.raises(ValueError, match="multiples of 16 bytes"):
            sizes = torch.zeros(1, dtype=torch.int32)
            codec.encode_pages(heap, offs, offs + fmt.raw_page_bytes + 32 + 8, meta, sizes, fmt)


@pytest.mark.gpu
@pytest.mark.parametrize("page_heads_per_program", [1, 4])
def test_llama_shape_on_gpu(page_heads_per_program: int) -> None:
    fmt = PageFormat(head_dim=128, num_kv_heads=8, version=3)
    check_against_reference(
        mixed_pages(64, fmt, 11).cuda(), fmt, "cuda", page_heads_per_program=page_heads_per_program
    )


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["coded", "raw"])
def test_every_bit_pattern_in_every_position_on_gpu(kind: str) -> None:
    """The reference's exhaustive blocks (every pattern at every one of a block's 128 positions, 65,536
    blocks) through the compiled kernels, in K and V page-heads of head_dim 256 with 4 KV heads."""
    fmt = PageFormat(head_dim=256, num_kv_heads=4, version=3)
    blocks = _coded_blocks() if kind == "coded" else _raw_blocks()
    if kind == "raw":  # a page patches at most MAX_PATCHES raw blocks: every 4th block raw, the rest 1.0
        ones = torch.full((blocks.shape[0], 3, 128), 0x3F80, dtype=torch.int32)
        blocks = torch.cat([blocks[:, None], ones], dim=1).view(-1, 128)
    pages = _page_heads_from_blocks(blocks, fmt.head_dim).view(-1, 2, 4, 16, fmt.head_dim)
    meta = check_against_reference(pages.cuda(), fmt, "cuda")
    assert bool((meta == v3.RAW_PAGE_MARKER).sum() == 0)
