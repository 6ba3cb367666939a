"""Plain-torch oracle of page format v3 (kernels/format/layout_v3.py): page-heads and pages (their heap:
heap_v3.py).

Everything here follows format/layout_v3.py exactly and is the reference the Triton codec and the decode
kernels are tested against bit for bit (CPU or GPU tensors; integer-only). Page-heads are vectorised: one call
codes any number of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..format import layout_v3 as v3
from ..format.layout import PAGE_TOKENS, PageFormat


def _bits(values: torch.Tensor) -> torch.Tensor:
    if values.dtype != torch.bfloat16:
        raise TypeError(f"expected bfloat16 values, got {values.dtype}")
    return values.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF


def _to_bf16(bits: torch.Tensor) -> torch.Tensor:
    return (bits - ((bits >> 15) << 16)).to(torch.int16).view(torch.bfloat16)


def _to_code_plane(x: torch.Tensor) -> torch.Tensor:
    """uint8-valued int32 [M, 16, D/2] (token, pair) -> [M, D/8, 64]: each block's [16 tokens][4 pairs]."""
    m, _, pairs = x.shape
    return x.view(m, PAGE_TOKENS, pairs // 4, 4).permute(0, 2, 1, 3).reshape(m, pairs // 4, 64)


def _from_code_plane(plane: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`_to_code_plane`: [M, D/8, 64] -> [M, 16, D/2]."""
    m, nb, _ = plane.shape
    return plane.view(m, nb, PAGE_TOKENS, 4).permute(0, 2, 1, 3).reshape(m, PAGE_TOKENS, nb * 4)


def _exponent_windows(bits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 [M, 16, D] bits -> (bool [M, D/8] coded, int32 [M, D/8] b/2): per block of 16 x 4 pairs."""
    m, _, d = bits.shape
    e = ((bits >> 7) & 0xFF).view(m, PAGE_TOKENS, 2, d // 8, 4).permute(0, 3, 1, 2, 4).reshape(m, d // 8, -1)
    base = e.amin(dim=-1) & ~1
    return (e.amax(dim=-1) - base) < v3.EXPONENT_SPAN, base >> 1


def _per_pair(per_block: torch.Tensor) -> torch.Tensor:
    """[M, D/8] per-block values -> [M, D/2] the value of each pair's block."""
    return per_block.repeat_interleave(v3.BLOCK_PAIRS, dim=1)


@dataclass(frozen=True)
class PageHeads:
    """Page-heads coded in v3: fixed-size records, one marker per block, the raw blocks' patches."""

    records: torch.Tensor  # uint8 [M, 24 * D]: lo plane then code plane (format/layout_v3.py)
    coded: torch.Tensor  # bool [M, D/8]: block coded (else raw: its patch is used)
    half_base: torch.Tensor  # uint8 [M, D/8]: b/2 of coded blocks (0 for raw ones)
    patches: torch.Tensor  # uint8 [M, D/8, 64]: odd-half high bytes of raw blocks (0 for coded ones)


def encode_page_heads(values: torch.Tensor, kv: int = 0) -> PageHeads:
    """bf16 ``[M, 16, D]`` page-heads -> their v3 records and block markers (``kv``: K 0 or V 1; v3 codes
    both alike, the argument keeps the call the same as for the versions that do not)."""
    del kv
    if values.dim() != 3 or values.shape[1] != PAGE_TOKENS or values.shape[2] % 16 != 0:
        raise ValueError(f"expected bf16 page-heads [M, 16, D], got {tuple(values.shape)}")
    bits = _bits(values)
    m, _, d = bits.shape
    half = d // 2
    coded, half_base = _exponent_windows(bits)
    lo = (bits & 0xFF).view(m, PAGE_TOKENS, 2, half).transpose(-1, -2).reshape(m, -1)  # lo(p), lo(p + D/2)
    pair_hb = _per_pair(half_base)[:, None, :]  # [M, 1, D/2]
    sign, d_val = bits >> 15, (((bits >> 7) & 0xFF) - 2 * torch.cat([pair_hb, pair_hb], dim=-1)) >> 1
    code = (sign[..., :half] << 7) | (sign[..., half:] << 6) | (d_val[..., half:] << 3) | d_val[..., :half]
    pair_coded = _per_pair(coded)[:, None, :]
    code = torch.where(pair_coded, code, bits[..., :half] >> 8)  # raw block: high bytes of channel p
    patch = torch.where(pair_coded, 0, bits[..., half:] >> 8)
    records = torch.cat([lo, _to_code_plane(code).reshape(m, -1)], dim=1).to(torch.uint8)
    patches = _to_code_plane(patch).to(torch.uint8)
    return PageHeads(records, coded, torch.where(coded, half_base, 0).to(torch.uint8), patches)


def decode_page_heads(heads: PageHeads, kv: int = 0) -> torch.Tensor:
    """Inverse of :func:`encode_page_heads`: bf16 ``[M, 16, D]``, bit-identical."""
    del kv
    m, nbytes = heads.records.shape
    d = nbytes // 24
    half = d // 2
    rec = heads.records.to(torch.int32)
    lo = rec[:, : 16 * d].view(m, PAGE_TOKENS, half, 2)
    code = _from_code_plane(rec[:, 16 * d :].reshape(m, d // 8, 64))
    patch = _from_code_plane(heads.patches.to(torch.int32))
    hb = _per_pair(heads.half_base.to(torch.int32))[:, None, :]
    high_p = ((code >> 7) << 7) | (hb + (code & 7))
    high_q = (((code >> 6) & 1) << 7) | (hb + ((code >> 3) & 7))
    raw = ~_per_pair(heads.coded)[:, None, :]
    high_p = torch.where(raw, code, high_p)
    high_q = torch.where(raw, patch, high_q)
    bits = torch.cat([(high_p << 8) | lo[..., 0], (high_q << 8) | lo[..., 1]], dim=-1)
    return _to_bf16(bits)


# ---- pages -------------------------------------------------------------------------------------------


def _page_markers(heads: PageHeads, n: int, fmt: PageFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 [n, 2H, D/8] metadata, bool [n] stored raw) of n pages' page-heads ([n * 2H] in order)."""
    raw = ~heads.coded.view(n, -1)
    rank = torch.cumsum(raw.to(torch.int32), dim=1) - 1
    raw_count = raw.sum(dim=1)
    stored_raw = (raw_count >= raw.shape[1]) | (raw_count > v3.MAX_PATCHES)
    half_base = heads.half_base.view(n, -1).to(torch.int32)
    meta = torch.where(raw, v3.RAW_BLOCK_FLAG | rank.clamp(min=0), half_base)
    meta = torch.where(stored_raw[:, None], v3.RAW_PAGE_MARKER, meta)
    return meta.view(n, fmt.page_heads_per_page, fmt.meta_bytes).to(torch.uint8), stored_raw


def _page_order(k: PageHeads, v: PageHeads, n: int, h: int) -> PageHeads:
    """K and V page-heads of n pages ([n * H] each) -> [n * 2H] in page order (K h0 .. V hH-1)."""

    def cat(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.cat([a.view(n, h, *a.shape[1:]), b.view(n, h, *b.shape[1:])], dim=1).flatten(0, 1)

    return PageHeads(
        cat(k.records, v.records), cat(k.coded, v.coded), cat(k.half_base, v.half_base),
        cat(k.patches, v.patches),
    )  # fmt: skip


def encode_pages_v3(pages: torch.Tensor, fmt: PageFormat) -> tuple[list[torch.Tensor], torch.Tensor]:
    """bf16 ``[n, 2, H, 16, D]`` -> (n stored pages, uint8 each; uint8 ``[n, 2H, D/8]`` metadata)."""
    n, h, d = pages.shape[0], fmt.num_kv_heads, fmt.head_dim
    k, v = (encode_page_heads(pages[:, kv].reshape(n * h, PAGE_TOKENS, d), kv) for kv in (0, 1))
    heads = _page_order(k, v, n, h)
    meta, stored_raw = _page_markers(heads, n, fmt)
    records = heads.records.view(n, -1)
    patches = heads.patches.view(n, -1, v3.PATCH_BYTES)
    raw_blocks = ~heads.coded.view(n, -1)
    out = []
    for i in range(n):
        if bool(stored_raw[i]):
            out.append(pages[i].contiguous().view(torch.uint8).reshape(-1))
        else:
            out.append(torch.cat([records[i], patches[i][raw_blocks[i]].reshape(-1)]))
    return out, meta


def decode_pages_v3(stored: list[torch.Tensor], meta: torch.Tensor, fmt: PageFormat) -> torch.Tensor:
    """Inverse of :func:`encode_pages_v3`: bf16 ``[n, 2, H, 16, D]``."""
    n, h, d = len(stored), fmt.num_kv_heads, fmt.head_dim
    out = torch.empty(n, 2, h, PAGE_TOKENS, d, dtype=torch.bfloat16, device=meta.device)
    rec_bytes = 2 * h * v3.page_head_bytes(d)
    for i, data in enumerate(stored):
        m = meta[i].reshape(-1).to(torch.int32)
        if int(m[0]) == v3.RAW_PAGE_MARKER:
            if data.numel() != fmt.raw_page_bytes:
                raise ValueError(f"a raw page holds {fmt.raw_page_bytes} bytes, got {data.numel()}")
            out[i] = data.view(torch.bfloat16).view(2, h, PAGE_TOKENS, d)
            continue
        raw = m >= v3.RAW_BLOCK_FLAG
        n_raw = int(raw.sum())
        if data.numel() != rec_bytes + v3.PATCH_BYTES * n_raw:
            raise ValueError(
                f"a coded page with {n_raw} raw blocks holds {rec_bytes + v3.PATCH_BYTES * n_raw} bytes, "
                f"got {data.numel()}: corrupt metadata?"
            )
        patches = torch.zeros(m.numel(), v3.PATCH_BYTES, dtype=torch.uint8, device=data.device)
        ranks = (m[raw] & 0x7F).to(torch.int64)
        if n_raw and int(ranks.max()) >= n_raw:
            raise ValueError("a raw block's patch rank points past the page's patches: corrupt metadata?")
        patches[raw] = data[rec_bytes:].view(n_raw, v3.PATCH_BYTES)[ranks]
        heads = PageHeads(
            data[:rec_bytes].view(2 * h, -1),
            ~raw.view(2 * h, -1),
            torch.where(raw, 0, m).to(torch.uint8).view(2 * h, -1),
            patches.view(2 * h, -1, v3.PATCH_BYTES),
        )
        for kv in (0, 1):
            sel = slice(kv * h, (kv + 1) * h)
            part = PageHeads(heads.records[sel], heads.coded[sel], heads.half_base[sel], heads.patches[sel])
            out[i, kv] = decode_page_heads(part, kv)
    return out


def raw_page_meta_v3(fmt: PageFormat, device: torch.device | str = "cpu") -> torch.Tensor:
    """uint8 ``[2H, D/8]`` of a page stored raw (every new page): all RAW_PAGE_MARKER."""
    return torch.full(
        (fmt.page_heads_per_page, fmt.meta_bytes), v3.RAW_PAGE_MARKER, dtype=torch.uint8, device=device
    )


def stored_page_bytes(meta: torch.Tensor, fmt: PageFormat) -> torch.Tensor:
    """int64 [...]: stored size of pages from their metadata uint8 ``[..., 2H, D/8]``."""
    flat = meta.flatten(-2).to(torch.int32)
    raw_page = flat[..., 0] == v3.RAW_PAGE_MARKER
    n_raw = (flat >= v3.RAW_BLOCK_FLAG).sum(dim=-1)
    coded = v3.coded_page_bytes(fmt.num_kv_heads, fmt.head_dim, 0) + v3.PATCH_BYTES * n_raw
    return torch.where(raw_page, fmt.raw_page_bytes, coded).to(torch.int64)
