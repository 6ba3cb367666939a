"""The Triton codec against the torch reference, bit for bit (CPU interpreter here, compiled on a GPU)."""

from __future__ import annotations

import pytest
import torch

from zipkv.kernels.codec import pages as codec
from zipkv.kernels.format.layout import PageFormat, candidate_geometries, token_major
from zipkv.kernels.reference import pages as ref

ALL_BITS = torch.arange(65536, dtype=torch.int32)
POISON = 0x7FBF  # a NaN pattern no test page holds at every position


def formats(num_kv_heads: int = 2) -> list[PageFormat]:
    """Format v1 (still readable) in every head_dim, token-major and another geometry; v2, the default, is
    `formats_v2` below."""
    out = []
    for head_dim in (64, 128, 256):
        first, last = candidate_geometries(head_dim)[0], candidate_geometries(head_dim)[-1]
        major = token_major(head_dim)
        out.append(PageFormat(head_dim, num_kv_heads, major, major, version=1))
        out.append(PageFormat(head_dim, num_kv_heads, last, first, version=1))
    return out


def fmt_id(fmt: PageFormat) -> str:
    return f"v{fmt.version}-D{fmt.head_dim}-H{fmt.num_kv_heads}-K{fmt.k_geometry.name}-V{fmt.v_geometry.name}"


def kv_like(n: int, fmt: PageFormat, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    shape = (n, 2, fmt.num_kv_heads, 16, fmt.head_dim)
    x = (
        torch.randn(shape, generator=gen) * torch.exp(torch.randn((*shape[:-1], 1), generator=gen))
    ).bfloat16()
    x[0, 0, 0, 0, 0] = 0.0  # one exact zero forces a raw block
    x[-1, 1, -1] = 3.0  # a page-head that compresses
    return x


class Heap:
    """n raw pages written by the reference, then room for their compressed copies."""

    def __init__(self, pages: torch.Tensor, fmt: PageFormat, device: str) -> None:
        n = pages.shape[0]
        self.fmt, self.n = fmt, n
        self.bytes = torch.zeros(2 * n * fmt.raw_page_bytes + 512, dtype=torch.uint8)
        # Sources in reverse order, destinations offset by 256: page i does not sit where it lands.
        self.src = (n - 1 - torch.arange(n)) * fmt.raw_page_bytes
        self.dst = n * fmt.raw_page_bytes + 256 + torch.arange(n) * fmt.raw_page_bytes
        for i in range(n):
            at = int(self.src[i])
            self.bytes[at : at + fmt.raw_page_bytes] = ref.raw_page_bytes(pages[i], fmt)
        self.bytes, self.src, self.dst = self.bytes.to(device), self.src.to(device), self.dst.to(device)

    def encode(self) -> tuple[torch.Tensor, torch.Tensor]:
        dev = self.bytes.device
        meta = torch.full(
            (self.n, self.fmt.page_heads_per_page, self.fmt.meta_bytes), 0xAB, dtype=torch.uint8, device=dev
        )
        sizes = torch.full((self.n,), -1, dtype=torch.int32, device=dev)
        codec.encode_pages(self.bytes, self.src, self.dst, meta, sizes, self.fmt)
        return meta, sizes

    def decode(self, offsets: torch.Tensor, meta: torch.Tensor, **kwargs: object) -> torch.Tensor:
        shape = (self.n, 2, self.fmt.num_kv_heads, 16, self.fmt.head_dim)
        out = torch.full(shape, POISON, dtype=torch.int16, device=self.bytes.device).view(torch.bfloat16)
        codec.decode_pages(self.bytes, offsets, meta, out, self.fmt, **kwargs)  # type: ignore[arg-type]
        return out


def check_against_reference(
    pages: torch.Tensor, fmt: PageFormat, device: str, **decode_kwargs: object
) -> None:
    heap = Heap(pages, fmt, device)
    meta, sizes = heap.encode()
    for i in range(heap.n):
        data, want_meta = ref.encode_page(pages[i], fmt)
        assert torch.equal(meta[i].cpu(), want_meta), f"page {i}: metadata differs"
        assert int(sizes[i]) == data.numel()
        at = int(heap.dst[i])
        assert torch.equal(heap.bytes[at : at + data.numel()].cpu(), data), f"page {i}: stored bytes differ"
    want = pages.view(torch.int16)
    assert torch.equal(heap.decode(heap.dst, meta, **decode_kwargs).cpu().view(torch.int16), want)
    raw_meta = ref.raw_page_meta(fmt, device).expand(heap.n, -1, -1).contiguous()
    assert torch.equal(heap.decode(heap.src, raw_meta, **decode_kwargs).cpu().view(torch.int16), want)


@pytest.mark.parametrize("fmt", formats(), ids=fmt_id)
def test_encode_and_decode_match_reference(fmt: PageFormat, device: str) -> None:
    check_against_reference(kv_like(3, fmt, fmt.head_dim), fmt, device)


@pytest.mark.parametrize("fmt", [formats()[1], formats()[2]], ids=fmt_id)
def test_decode_several_page_heads_per_program(fmt: PageFormat, device: str) -> None:
    check_against_reference(kv_like(2, fmt, 9), fmt, device, page_heads_per_program=2, stream_stores=True)


@pytest.mark.parametrize("fmt", [formats()[2], formats()[3]], ids=fmt_id)
def test_every_bit_pattern_round_trips(fmt: PageFormat, device: str) -> None:
    values = fmt.blocks_per_page * 512
    order = torch.argsort((ALL_BITS >> 7) & 0xFF, stable=True)  # blocks of exponents 2m, 2m+1: compress
    shuffled = ALL_BITS[torch.randperm(65536, generator=torch.Generator().manual_seed(5))]  # raw blocks
    bits = torch.cat([ALL_BITS[order], shuffled]).view(-1, values)
    bits = bits[torch.randperm(bits.shape[0], generator=torch.Generator().manual_seed(6))]  # mix pages
    blocks = ref._bits_to_bf16(bits).view(-1, 2, fmt.num_kv_heads, fmt.blocks_per_page_head, 512)
    # Through the block geometry, so that each block holds exactly one 512-value slice built above.
    halves = [ref.blocks_to_page(blocks[:, kv], fmt.geometry(kv), fmt.head_dim) for kv in (0, 1)]
    pages = torch.stack(halves, dim=1)
    markers = torch.stack([ref.encode_page(p, fmt)[1][:, 4 : 4 + fmt.blocks_per_page_head] for p in pages])
    assert bool((markers == 255).any()) and bool((markers != 255).any())
    check_against_reference(pages, fmt, device)


def test_store_tokens_matches_reference(device: str) -> None:
    fmt = formats()[3]
    gen = torch.Generator().manual_seed(7)
    page_loc = torch.tensor([3, 0, 2, 1]) * fmt.raw_page_bytes
    slots = torch.randperm(64, generator=gen)[:40]
    k = torch.randn(40, fmt.num_kv_heads, fmt.head_dim, generator=gen).bfloat16()
    v = torch.randn(40, fmt.num_kv_heads, fmt.head_dim, generator=gen).bfloat16()
    want = torch.zeros(4 * fmt.raw_page_bytes, dtype=torch.uint8)
    ref.store_tokens(want, page_loc, slots, k, v, fmt)
    got = torch.zeros_like(want, device=device)
    codec.store_tokens(got, page_loc.to(device), slots.to(device), k.to(device), v.to(device), fmt)
    assert torch.equal(got.cpu(), want)


def test_store_tokens_reads_k_and_v_as_slices_of_the_qkv_projection(device: str) -> None:
    # SGLang hands the store k and v as views of one [n, (Hq + 2H) * D] projection output: tokens a whole
    # row apart. The kernel reads them in place and writes what the contiguous copies would have.
    fmt = formats()[3]
    gen = torch.Generator().manual_seed(8)
    h, d, hq = fmt.num_kv_heads, fmt.head_dim, 2 * fmt.num_kv_heads
    page_loc = torch.tensor([1, 3, 0, 2]) * fmt.raw_page_bytes
    slots = torch.randperm(64, generator=gen)[:24]
    qkv = torch.randn(24, (hq + 2 * h) * d, generator=gen).bfloat16().to(device)
    k = qkv[:, hq * d : (hq + h) * d].view(24, h, d)
    v = qkv[:, (hq + h) * d :].view(24, h, d)
    assert not k.is_contiguous() and k.stride(0) == (hq + 2 * h) * d
    want = torch.zeros(4 * fmt.raw_page_bytes, dtype=torch.uint8)
    ref.store_tokens(want, page_loc, slots, k.cpu().contiguous(), v.cpu().contiguous(), fmt)
    got = torch.zeros_like(want, device=device)
    codec.store_tokens(got, page_loc.to(device), slots.to(device), k, v, fmt)
    assert torch.equal(got.cpu(), want)
    head_major = k.transpose(0, 1).contiguous().transpose(0, 1)  # a token's heads lie apart: refused
    with pytest.raises(ValueError, match="each token's values contiguous"):
        codec.store_tokens(got, page_loc.to(device), slots.to(device), head_major, v, fmt)


def test_bad_arguments_are_refused(device: str) -> None:
    fmt = formats()[2]
    heap = torch.zeros(2 * fmt.raw_page_bytes, dtype=torch.uint8, device=device)
    offs = torch.zeros(1, dtype=torch.int64, device=device)
    meta = torch.zeros(1, fmt.page_heads_per_page, fmt.meta_bytes, dtype=torch.uint8, device=device)
    with pytest.raises(ValueError, match="sizes_out must be"):
        codec.encode_pages(heap, offs, offs, meta, torch.zeros(1, dtype=torch.int64, device=device), fmt)
    with pytest.raises(ValueError, match="heap must be"):
        codec.decode_pages(heap.view(torch.int16), offs, meta, torch.empty(0), fmt)
    with pytest.raises(ValueError, match="page_heads_per_program"):
        out = torch.empty(1, 2, 2, 16, 128, dtype=torch.bfloat16, device=device)
        codec.decode_pages(heap, offs, meta, out, fmt, page_heads_per_program=3)
    with pytest.raises(ValueError, match="out must be"):
        codec.decode_pages(
            heap, offs, meta, torch.empty(1, 2, 2, 16, 64, dtype=torch.bfloat16, device=device), fmt
        )


@pytest.mark.gpu
@pytest.mark.parametrize("use_prmt", [True, False])
@pytest.mark.parametrize("page_heads_per_program", [1, 4])
def test_llama_shape_on_gpu_both_restore_paths(use_prmt: bool, page_heads_per_program: int) -> None:
    fmt = PageFormat(head_dim=128, num_kv_heads=8)
    check_against_reference(
        kv_like(64, fmt, 11), fmt, "cuda", use_prmt=use_prmt, page_heads_per_program=page_heads_per_program
    )


def formats_v2() -> list[PageFormat]:
    """Format v2 (low bytes in code-byte pairs) for the token-major geometry the decode kernel reads, and
    one other geometry."""
    return [PageFormat(d, 2, token_major(d), token_major(d), version=2) for d in (64, 128, 256)] + [
        PageFormat(128, 2, candidate_geometries(128)[-1], candidate_geometries(128)[0], version=2)
    ]


@pytest.mark.parametrize("fmt", formats_v2(), ids=fmt_id)
def test_format_v2_encode_and_decode_match_reference(fmt: PageFormat, device: str) -> None:
    check_against_reference(kv_like(3, fmt, fmt.head_dim + 1), fmt, device)
    check_against_reference(kv_like(2, fmt, 4), fmt, device, page_heads_per_program=2, stream_stores=True)


def test_format_v2_every_bit_pattern_round_trips(device: str) -> None:
    fmt = formats_v2()[1]
    values = fmt.blocks_per_page * 512
    order = torch.argsort((ALL_BITS >> 7) & 0xFF, stable=True)
    shuffled = ALL_BITS[torch.randperm(65536, generator=torch.Generator().manual_seed(8))]
    bits = torch.cat([ALL_BITS[order], shuffled]).view(-1, values)
    blocks = ref._bits_to_bf16(bits).view(-1, 2, fmt.num_kv_heads, fmt.blocks_per_page_head, 512)
    pages = torch.stack(
        [ref.blocks_to_page(blocks[:, kv], fmt.geometry(kv), fmt.head_dim) for kv in (0, 1)], 1
    )
    check_against_reference(pages, fmt, device)
