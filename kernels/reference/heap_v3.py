"""Plain-torch oracle of page format v3 in a heap (kernels/format/layout_v3.py): the twins of the Triton
codec's v3 launches (reference/pages.py dispatches here for v3), and a packer for tests and benchmarks.

Built on the page-head and page codes of pages_v3.py beside this; bit for bit what the kernels store and read.
"""

from __future__ import annotations

import torch

from ..format import layout_v3 as v3
from ..format.layout import PAGE_TOKENS, PageFormat
from .pages_v3 import (
    PageHeads,
    _page_markers,
    _page_order,
    decode_page_heads,
    encode_page_heads,
    stored_page_bytes,
)


def pack_pages_v3(pages: torch.Tensor, fmt: PageFormat) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """bf16 ``[n, 2, H, 16, D]`` -> (uint8 heap, int64 [n] page byte offsets, uint8 [n, 2H, D/8] metadata).

    Vectorised, for tests and benchmarks: page i is stored at ``i * raw_page_bytes`` (the allocator packs
    pages tighter; the readers only follow the offsets), coded or raw as the format decides.
    """
    n, h, d = pages.shape[0], fmt.num_kv_heads, fmt.head_dim
    k, v = (encode_page_heads(pages[:, kv].reshape(n * h, PAGE_TOKENS, d)) for kv in (0, 1))
    heads = _page_order(k, v, n, h)
    meta, stored_raw = _page_markers(heads, n, fmt)
    heap = torch.zeros(n * fmt.raw_page_bytes, dtype=torch.uint8, device=pages.device)
    page_loc = torch.arange(n, dtype=torch.int64, device=pages.device) * fmt.raw_page_bytes
    _write_pages(heap, page_loc, heads, stored_raw, pages.reshape(n, -1).view(torch.uint8), fmt)
    return heap, page_loc, meta


def _rows(heap: torch.Tensor, starts: torch.Tensor, nbytes: int) -> torch.Tensor:
    """uint8 [n, nbytes]: ``nbytes`` bytes of ``heap`` from each of byte ``starts`` (int64 [n])."""
    return heap[starts.to(torch.int64)[:, None] + torch.arange(nbytes, device=heap.device)]


def _write_rows(heap: torch.Tensor, starts: torch.Tensor, rows: torch.Tensor) -> None:
    heap[starts.to(torch.int64)[:, None] + torch.arange(rows.shape[1], device=heap.device)] = rows


def _write_pages(
    heap: torch.Tensor,
    dst: torch.Tensor,
    heads: PageHeads,
    stored_raw: torch.Tensor,
    raw_rows: torch.Tensor,
    fmt: PageFormat,
) -> None:
    """Store n pages at byte ``dst`` (int64 [n]): a coded page's records then its raw blocks' patches in
    rank order; a page stored raw as its raw bytes (``raw_rows``, uint8 [n, raw_page_bytes])."""
    n, coded = dst.numel(), ~stored_raw
    _write_rows(heap, dst[coded], heads.records.view(n, -1)[coded])
    raw_blocks = ~heads.coded.view(n, -1) & coded[:, None]
    rank = torch.cumsum(raw_blocks.to(torch.int64), dim=1) - 1
    page, block = raw_blocks.nonzero(as_tuple=True)
    patch_at = (
        dst[page]
        + v3.coded_page_bytes(fmt.num_kv_heads, fmt.head_dim, 0)
        + v3.PATCH_BYTES * rank[page, block]
    )
    _write_rows(heap, patch_at, heads.patches.view(n, -1, v3.PATCH_BYTES)[page, block])
    _write_rows(heap, dst[stored_raw], raw_rows[stored_raw])


def encode_pages(
    heap: torch.Tensor,
    src_offsets: torch.Tensor,
    dst_offsets: torch.Tensor,
    meta_out: torch.Tensor,
    sizes_out: torch.Tensor,
    fmt: PageFormat,
) -> None:
    """Twin of ``codec.encode_pages`` for v3: n raw pages (plain ``[2, H, 16, D]`` bf16) at byte
    ``src_offsets`` -> stored pages at ``dst_offsets`` (records, then the raw blocks' patches in rank order;
    or the raw page again when the page is stored raw). Writes metadata into ``meta_out`` (uint8
    ``[n, 2H, D/8]``) and stored sizes into ``sizes_out`` (int32 [n]). Destinations must not overlap any
    source page; each needs room for ``fmt.raw_page_bytes``.
    """
    n, h, d = src_offsets.numel(), fmt.num_kv_heads, fmt.head_dim
    if n == 0:
        return
    raw_bytes = _rows(heap, src_offsets, fmt.raw_page_bytes)
    pages = raw_bytes.view(torch.bfloat16).view(n, 2, h, PAGE_TOKENS, d)
    k, v = (encode_page_heads(pages[:, kv].reshape(n * h, PAGE_TOKENS, d)) for kv in (0, 1))
    heads = _page_order(k, v, n, h)
    meta, stored_raw = _page_markers(heads, n, fmt)
    _write_pages(heap, dst_offsets.to(torch.int64), heads, stored_raw, raw_bytes, fmt)
    meta_out.copy_(meta)
    sizes_out.copy_(stored_page_bytes(meta, fmt))


def _decode_coded(heap: torch.Tensor, at: torch.Tensor, m: torch.Tensor, fmt: PageFormat) -> torch.Tensor:
    """Coded pages at byte ``at`` (int64 [c]) with metadata ``m`` (int32 [c, 2H * D/8]) -> bf16
    ``[c, 2, H, 16, D]``."""
    c, h, d = at.numel(), fmt.num_kv_heads, fmt.head_dim
    rec_bytes = v3.coded_page_bytes(h, d, 0)
    raw_block = m >= v3.RAW_BLOCK_FLAG
    # a coded block's marker is no rank: read from the page's start instead (in bounds, then dropped)
    patch_at = torch.where(raw_block, at[:, None] + rec_bytes + v3.PATCH_BYTES * (m & 0x7F), at[:, None])
    patches = _rows(heap, patch_at.reshape(-1), v3.PATCH_BYTES).view(c, -1, v3.PATCH_BYTES)
    flat = (
        _rows(heap, at, rec_bytes),
        ~raw_block,
        torch.where(raw_block, 0, m).to(torch.uint8),
        torch.where(raw_block[..., None], patches, 0),
    )
    parts = [x.view(c, 2, h, -1, *x.shape[2:]) for x in flat]  # [c, K/V, head, ...]
    halves = [decode_page_heads(PageHeads(*(x[:, kv].flatten(0, 1) for x in parts))) for kv in (0, 1)]
    return torch.stack([x.view(c, h, PAGE_TOKENS, d) for x in halves], dim=1)


def decode_pages(
    heap: torch.Tensor, offsets: torch.Tensor, meta: torch.Tensor, out: torch.Tensor, fmt: PageFormat
) -> None:
    """Twin of ``codec.decode_pages`` for v3: pages (raw or coded) at byte ``offsets`` with metadata
    ``meta`` (uint8 ``[n, 2H, D/8]``) -> ``out`` (bf16 ``[n, 2, H, 16, D]``). The metadata is trusted, as
    the kernels trust it (``decode_pages_v3`` checks it against stored sizes)."""
    flat = meta.flatten(1).to(torch.int32)
    raw_page = flat[:, 0] == v3.RAW_PAGE_MARKER
    at = offsets.to(torch.int64)
    raw = _rows(heap, at[raw_page], fmt.raw_page_bytes)
    out[raw_page] = raw.view(torch.bfloat16).view(-1, *out.shape[1:])
    if not bool(raw_page.all()):
        out[~raw_page] = _decode_coded(heap, at[~raw_page], flat[~raw_page], fmt)


def gather_pages(
    heap: torch.Tensor,
    page_loc_layer: torch.Tensor,
    page_meta_layer: torch.Tensor,
    page_ids: torch.Tensor,
    fmt: PageFormat,
) -> torch.Tensor:
    """Read pages (raw or coded) of one layer: bf16 ``[n, 2, H, 16, D]``."""
    out = torch.empty(
        page_ids.numel(), 2, fmt.num_kv_heads, PAGE_TOKENS, fmt.head_dim, dtype=torch.bfloat16,
        device=heap.device,
    )  # fmt: skip
    decode_pages(heap, page_loc_layer[page_ids], page_meta_layer[page_ids], out, fmt)
    return out
