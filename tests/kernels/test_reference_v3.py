"""Page format v3's torch reference (kernels/reference/pages_v3.py) against the format's rules
(format/layout_v3.py).

The exhaustive tests put every one of the 65,536 bf16 bit patterns (NaN payloads, infinities, -0,
subnormals included) at every one of a block's 128 positions, once in coded blocks and once in raw ones,
for K and for V, and require a bit-exact round trip.
"""

from __future__ import annotations

import pytest
import torch

from zipkv.kernels.format import layout_v3 as v3
from zipkv.kernels.format.layout import PageFormat
from zipkv.kernels.reference import heap_v3
from zipkv.kernels.reference import pages as reference
from zipkv.kernels.reference import pages_v3 as ref

D = 64  # 8 blocks per page-head; a block is 128 values whatever the head_dim


def _block_channels(head_dim: int) -> torch.Tensor:
    """int64 [D/8, 128]: (token * D + channel) of each block's values, in (token, pair, half) order."""
    half = head_dim // 2
    pairs = torch.tensor([[v3.pair_of(g, j) for j in range(4)] for g in range(head_dim // 8)])
    t = torch.arange(16)[None, :, None, None]
    h = torch.arange(2)[None, None, None, :]
    return (t * head_dim + h * half + pairs[:, None, :, None]).reshape(head_dim // 8, 128)


def _page_heads_from_blocks(blocks: torch.Tensor, head_dim: int) -> torch.Tensor:
    """int32 [M * D/8, 128] block values -> bf16 page-heads [M, 16, D] holding them."""
    nb = head_dim // 8
    m = blocks.shape[0] // nb
    flat = torch.empty(m, 16 * head_dim, dtype=torch.int32)
    flat[:, _block_channels(head_dim).reshape(-1)] = blocks.view(m, -1)
    return ref._to_bf16(flat.view(m, 16, head_dim))


def _rotations(seq: torch.Tensor) -> torch.Tensor:
    """[k, 128] blocks -> [128 * k, 128]: every value at every position."""
    return torch.cat([torch.roll(seq, r, dims=1) for r in range(128)])


def _coded_blocks() -> torch.Tensor:
    """Blocks whose 128 values share e >> 1 (so every block codes), covering all patterns x positions."""
    pats = torch.arange(65536, dtype=torch.int32)
    groups = pats[torch.argsort((pats >> 8) & 0x7F, stable=True)].view(128, 512)  # by e >> 1
    return torch.cat([_rotations(g.view(4, 128)) for g in groups])


def _raw_blocks() -> torch.Tensor:
    """Blocks mixing exponents 128 apart (never coded), covering all patterns x positions."""
    pats = torch.arange(65536, dtype=torch.int32)
    groups = pats[torch.argsort((pats >> 8) & 0x7F, stable=True)].view(128, 512)
    out = []
    for ep in range(64):
        mixed = torch.stack([groups[ep], groups[ep + 64]], dim=1).reshape(8, 128)
        out.append(_rotations(mixed))
    return torch.cat(out)


@pytest.mark.parametrize("kv", [0, 1])
@pytest.mark.parametrize("kind", ["coded", "raw"])
def test_every_pattern_in_every_position_round_trips(kv: int, kind: str) -> None:
    blocks = _coded_blocks() if kind == "coded" else _raw_blocks()
    heads = _page_heads_from_blocks(blocks, D)
    enc = ref.encode_page_heads(heads, kv)
    assert bool(enc.coded.all()) if kind == "coded" else not bool(enc.coded.any())
    back = ref.decode_page_heads(enc, kv)
    assert torch.equal(back.view(torch.int16), heads.view(torch.int16))


def test_scalar_rules_are_the_vectorised_codec() -> None:
    """Every byte of a record and every marker follows layout_v3's scalar rules (the spec)."""
    g = torch.Generator().manual_seed(3)
    head_dim = 128
    x = torch.randn(3, 16, head_dim, generator=g) * torch.rand(3, 1, head_dim, generator=g) * 4
    x[1, :, 5] = 3e30  # pair 5 is in block 1 (pairs 4..7): page-head 1's block 1 goes raw
    vals = x.to(torch.bfloat16)
    bits = ref._bits(vals)
    for kv in (0, 1):
        enc = ref.encode_page_heads(vals, kv)
        for m in range(3):
            rec = enc.records[m].tolist()
            for t in range(16):
                for c in range(head_dim):
                    assert rec[v3.lo_byte_index(t, c, head_dim)] == int(bits[m, t, c]) & 0xFF
            for blk in range(head_dim // 8):
                pairs = [v3.pair_of(blk, j) for j in range(4)]
                chans = [p + h * head_dim // 2 for p in pairs for h in (0, 1)]
                exps = [(int(bits[m, t, c]) >> 7) & 0xFF for t in range(16) for c in chans]
                b = v3.block_base(exps)
                assert bool(enc.coded[m, blk]) == (b is not None)
                for t in range(16):
                    for p in pairs:
                        lo, hi = int(bits[m, t, p]), int(bits[m, t, p + head_dim // 2])
                        want = v3.code_byte(lo, hi, b) if b is not None else hi_byte(lo)
                        assert rec[v3.code_byte_index(t, p, head_dim)] == want
                        if b is not None:
                            assert v3.restore_pair(lo & 0xFF, hi & 0xFF, want, b >> 1) == (lo, hi)
        assert not bool(enc.coded[1, 1]) and int(enc.coded.sum()) >= 3 * 16 - 8


def hi_byte(bits: int) -> int:
    return bits >> 8


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_pages_round_trip_and_report_sizes(head_dim: int) -> None:
    fmt = PageFormat(head_dim=head_dim, num_kv_heads=2, version=3)
    g = torch.Generator().manual_seed(head_dim)
    x = torch.randn(4, 2, 2, 16, head_dim, generator=g)
    pages = (x.sign() * (1 + x.abs().clamp(max=100))).to(torch.bfloat16)  # |x| in 1..101: all code
    pages[1] = torch.randint(-32768, 32767, (2, 2, 16, head_dim), dtype=torch.int16, generator=g).view(
        torch.bfloat16
    )  # random bits: every block raw -> the page is stored raw
    pages[2, 1, 0, 7, 3] = 1e35  # one raw block in V h0
    stored, meta = ref.encode_pages_v3(pages, fmt)
    assert torch.equal(ref.decode_pages_v3(stored, meta, fmt).view(torch.int16), pages.view(torch.int16))
    assert stored[1].numel() == fmt.raw_page_bytes and bool((meta[1] == v3.RAW_PAGE_MARKER).all())
    coded = v3.coded_page_bytes(2, head_dim, 0)
    assert stored[2].numel() == coded + v3.PATCH_BYTES and stored[0].numel() == coded
    raw_marks = meta[2].reshape(-1)[meta[2].reshape(-1) >= v3.RAW_BLOCK_FLAG]
    assert raw_marks.tolist() == [v3.RAW_BLOCK_FLAG] * (1 + (stored[2].numel() - coded - 64) // 64)
    assert ref.stored_page_bytes(meta, fmt).tolist() == [s.numel() for s in stored]


def test_too_many_raw_blocks_store_the_page_raw() -> None:
    fmt = PageFormat(head_dim=256, num_kv_heads=4, version=3)  # 256 blocks per page
    pages = torch.ones(2, 2, 4, 16, 256, dtype=torch.bfloat16)
    flat = pages.view(2, -1, 16, 256)
    # page 0: exactly MAX_PATCHES raw blocks (one outlier in each of the first 127 blocks) -> coded
    # page 1: one more -> stored raw
    for page, count in ((0, v3.MAX_PATCHES), (1, v3.MAX_PATCHES + 1)):
        for blk in range(count):
            head, b = divmod(blk, 32)
            flat[page, head, 0, v3.pair_of(b, 0)] = 1e30
    stored, meta = ref.encode_pages_v3(pages, fmt)
    assert stored[0].numel() == v3.coded_page_bytes(4, 256, v3.MAX_PATCHES)
    assert int(meta[0].reshape(-1)[v3.MAX_PATCHES - 1]) == v3.RAW_BLOCK_FLAG | (v3.MAX_PATCHES - 1)
    assert stored[1].numel() == fmt.raw_page_bytes
    assert torch.equal(ref.decode_pages_v3(stored, meta, fmt).view(torch.int16), pages.view(torch.int16))


def test_corrupt_metadata_is_refused() -> None:
    fmt = PageFormat(head_dim=64, num_kv_heads=1, version=3)
    pages = torch.ones(1, 2, 1, 16, 64, dtype=torch.bfloat16)
    pages[0, 0, 0, 0, 0] = 1e30
    stored, meta = ref.encode_pages_v3(pages, fmt)
    bad = meta.clone()
    bad[0, 1, 3] = v3.RAW_BLOCK_FLAG  # claims a second raw block: the stored page is too short for it
    with pytest.raises(ValueError, match="corrupt metadata"):
        ref.decode_pages_v3(stored, bad, fmt)
    bad = meta.clone()
    bad[0, 0, 0] = v3.RAW_BLOCK_FLAG | 5  # a patch rank past the page's one patch
    with pytest.raises(ValueError, match="patch rank"):
        ref.decode_pages_v3(stored, bad, fmt)


def test_packed_heap_matches_the_page_encoder() -> None:
    fmt = PageFormat(head_dim=64, num_kv_heads=2, version=3)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(6, 2, 2, 16, 64, generator=g)
    pages = (x.sign() * (1 + x.abs().clamp(max=100))).to(torch.bfloat16)
    pages[1, 0, 1, 2, 9] = 1e35
    pages[3, 1, 0, 0, 40] = 1e-30
    pages[4] = torch.randint(-32768, 32767, (2, 2, 16, 64), dtype=torch.int16, generator=g).view(
        torch.bfloat16
    )
    heap, loc, meta = heap_v3.pack_pages_v3(pages, fmt)
    stored, meta_ref = ref.encode_pages_v3(pages, fmt)
    assert torch.equal(meta, meta_ref)
    for i, data in enumerate(stored):
        assert torch.equal(heap[int(loc[i]) : int(loc[i]) + data.numel()], data)


# ---- the heap: the Triton codec's twins, reached through reference/pages.py by fmt.version
# ---------------------


def mixed_pages(n: int, fmt: PageFormat, seed: int) -> torch.Tensor:
    """bf16 [n, 2, H, 16, D]: one raw block, all coded, stored raw, then value-like pages (raw blocks)."""
    g = torch.Generator().manual_seed(seed)
    shape = (n, 2, fmt.num_kv_heads, 16, fmt.head_dim)
    x = torch.randn(shape, generator=g) * torch.exp(torch.randn((*shape[:-1], 1), generator=g))
    pages = x.to(torch.bfloat16)
    pages[0] = (torch.rand(shape[1:], generator=g) + 1) * x[0].sign()
    pages[0, 1, -1, 5, 7] = 0.0  # an exact zero: one raw block in V's last head
    pages[1] = 1.5  # every block codes
    pages[2] = torch.randint(-32768, 32767, shape[1:], dtype=torch.int16, generator=g).view(torch.bfloat16)
    return pages


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_heap_encode_and_decode_match_the_page_functions(head_dim: int) -> None:
    fmt = PageFormat(head_dim=head_dim, num_kv_heads=2, version=3)
    n, raw_bytes = 5, fmt.raw_page_bytes
    pages = mixed_pages(n, fmt, head_dim)
    stored, want_meta = ref.encode_pages_v3(pages, fmt)
    assert {s.numel() for s in stored[:3]} == {
        v3.coded_page_bytes(2, head_dim, 1),
        fmt.min_page_bytes,
        raw_bytes,
    }
    heap = torch.full((2 * n * raw_bytes + 64 * n,), 0xA5, dtype=torch.uint8)
    # sources in reverse order; destinations 64 bytes apart beyond raw size: v3's granularity, not v2's 256
    src = (n - 1 - torch.arange(n)) * raw_bytes
    dst = n * raw_bytes + torch.arange(n) * (raw_bytes + 64) + 64
    for i in range(n):
        heap[int(src[i]) : int(src[i]) + raw_bytes] = reference.raw_page_bytes(pages[i], fmt)
    before = heap.clone()
    meta = torch.zeros(n, fmt.page_heads_per_page, fmt.meta_bytes, dtype=torch.uint8)
    sizes = torch.zeros(n, dtype=torch.int32)
    reference.encode_pages(heap, src, dst, meta, sizes, fmt)
    assert torch.equal(meta, want_meta) and sizes.tolist() == [s.numel() for s in stored]
    for i in range(n):
        at, size = int(dst[i]), stored[i].numel()
        assert torch.equal(heap[at : at + size], stored[i]), f"page {i}: stored bytes differ"
        assert torch.equal(heap[at + size : at + raw_bytes + 64], before[at + size : at + raw_bytes + 64])
        assert torch.equal(reference.encode_page(pages[i], fmt)[0], stored[i])
        assert same_bits(reference.decode_page(stored[i], meta[i], fmt), pages[i])
    assert torch.equal(heap[: n * raw_bytes], before[: n * raw_bytes])  # sources untouched
    out = torch.empty_like(pages)
    reference.decode_pages(heap, dst, meta, out, fmt)
    assert same_bits(out, pages)
    raw_meta = reference.raw_page_meta(fmt).expand(n, -1, -1)
    reference.decode_pages(heap, src, raw_meta, out.zero_(), fmt)
    assert same_bits(out, pages)
    # a page table mixing raw and coded pages, some read twice
    page_loc = torch.cat([src, dst])
    page_meta = torch.cat([raw_meta, meta])
    ids = torch.tensor([6, 0, 9, 7, 2, 6])
    assert same_bits(reference.gather_pages(heap, page_loc, page_meta, ids, fmt), pages[ids % n])


def test_store_tokens_write_plain_raw_pages() -> None:
    fmt = PageFormat(head_dim=128, num_kv_heads=2, version=3)
    pages = mixed_pages(3, fmt, 1)
    heap = torch.zeros(4 * fmt.raw_page_bytes + 64, dtype=torch.uint8)
    page_loc = torch.tensor([2, 0, 3]) * fmt.raw_page_bytes + 64
    slots = torch.randperm(48, generator=torch.Generator().manual_seed(2))
    for part in slots.split(11):  # tokens in any order, a few at a time
        p, t = part // 16, part % 16
        reference.store_tokens(heap, page_loc, part, pages[p, 0, :, t], pages[p, 1, :, t], fmt)
    for i in range(3):
        at = int(page_loc[i])
        assert torch.equal(heap[at : at + fmt.raw_page_bytes], pages[i].view(torch.uint8).reshape(-1))
    assert torch.equal(reference.raw_page_meta(fmt), ref.raw_page_meta_v3(fmt))
    assert bool((reference.raw_page_meta(fmt) == v3.RAW_PAGE_MARKER).all())


def test_heap_functions_take_no_pages() -> None:
    fmt = PageFormat(head_dim=64, num_kv_heads=1, version=3)
    heap = torch.zeros(fmt.raw_page_bytes, dtype=torch.uint8)
    none = torch.zeros(0, dtype=torch.int64)
    meta = torch.zeros(0, 2, fmt.meta_bytes, dtype=torch.uint8)
    reference.encode_pages(heap, none, none, meta, torch.zeros(0, dtype=torch.int32), fmt)
    out = torch.empty(0, 2, 1, 16, 64, dtype=torch.bfloat16)
    reference.decode_pages(heap, none, meta, out, fmt)
    assert not bool(heap.any())
