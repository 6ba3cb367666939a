"""Page format v3's torch reference (kernels/reference_v3.py) against the format's rules (layout_v3.py).

The exhaustive tests put every one of the 65,536 bf16 bit patterns (NaN payloads, infinities, -0,
subnormals included) at every one of a block's 128 positions, once in coded blocks and once in raw ones,
for K and for V, and require a bit-exact round trip.
"""

from __future__ import annotations

import pytest
import torch

from zipkv.kernels import layout_v3 as v3
from zipkv.kernels import reference_v3 as ref
from zipkv.kernels.layout import PageFormat

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
    heap, loc, meta = ref.pack_pages_v3(pages, fmt)
    stored, meta_ref = ref.encode_pages_v3(pages, fmt)
    assert torch.equal(meta, meta_ref)
    for i, data in enumerate(stored):
        assert torch.equal(heap[int(loc[i]) : int(loc[i]) + data.numel()], data)
