"""Plain-torch oracles for the zipkv page format (CPU and GPU): pages, metadata and the heap.

Everything here follows kernels/format/layout.py exactly and is the reference the Triton kernels are tested
against bit for bit. This module turns pages into metadata rows and stored bytes and reads them back, and
holds the heap-level twins of the Triton codec (store tokens, gather, encode and decode pages). Every page
and heap function takes any supported version: v3's (format/layout_v3.py) live in reference/pages_v3.py and
are reached through these by ``fmt.version``, so callers do not change with the format. The block coding
underneath lives in reference/blocks.py; its names are re-exported here, with the decode attention oracle, so
``zipkv.kernels.reference.pages`` stays the one import for every reference.
"""

from __future__ import annotations

import torch

from ..format.layout import BLOCK_VALUES, OFFSET_BYTES, PAGE_TOKENS, RAW_MARKER, PageFormat
from . import heap_v3
from . import pages_v3 as v3
from .blocks import DEFAULT_BLOCK_GEOMETRY as DEFAULT_BLOCK_GEOMETRY
from .blocks import EncodedBlocks as EncodedBlocks
from .blocks import _bits_to_bf16 as _bits_to_bf16
from .blocks import (
    _exclusive_cumsum,
    _raw_bytes,
    _restore,
    _store_blocks,
    bf16_bits,
    block_markers,
    block_sizes,
    blocks_to_page,
    encode_blocks,
    page_to_blocks,
)
from .blocks import block_is_compressible as block_is_compressible
from .blocks import decode_blocks as decode_blocks

# ---- pages -----------------------------------------------------------------------------------------


def _check_page(page: torch.Tensor, fmt: PageFormat) -> None:
    want = (2, fmt.num_kv_heads, PAGE_TOKENS, fmt.head_dim)
    if page.dtype != torch.bfloat16 or tuple(page.shape) != want:
        raise ValueError(f"expected a bf16 page of shape {list(want)}, got {page.dtype} {list(page.shape)}")


def pack_meta(offsets: torch.Tensor, markers: torch.Tensor, fmt: PageFormat) -> torch.Tensor:
    """Metadata rows, uint8 ``[..., 2H, meta_bytes]``.

    From int64 ``[..., 2H]`` page-head offsets and uint8 ``[..., 2H, nb]`` markers.
    """
    off = offsets.to(torch.int64)[..., None]
    offset_bytes = (off >> (8 * torch.arange(OFFSET_BYTES, device=off.device))) & 0xFF
    pad = fmt.meta_bytes - OFFSET_BYTES - fmt.blocks_per_page_head
    zeros = torch.zeros(*markers.shape[:-1], pad, dtype=torch.int64, device=off.device)
    return torch.cat([offset_bytes, markers.to(torch.int64), zeros], dim=-1).to(torch.uint8)


def unpack_meta(meta: torch.Tensor, fmt: PageFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 ``[..., 2H, meta_bytes]`` -> (int64 ``[..., 2H]`` offsets, uint8 ``[..., 2H, nb]`` markers)."""
    if meta.dtype != torch.uint8 or tuple(meta.shape[-2:]) != (fmt.page_heads_per_page, fmt.meta_bytes):
        raise ValueError(
            f"expected uint8 metadata [..., {fmt.page_heads_per_page}, {fmt.meta_bytes}], "
            f"got {meta.dtype} {list(meta.shape)}"
        )
    b = meta[..., :OFFSET_BYTES].to(torch.int64)
    offsets = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)
    return offsets, meta[..., OFFSET_BYTES : OFFSET_BYTES + fmt.blocks_per_page_head]


def encode_page(page: torch.Tensor, fmt: PageFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 ``[2, H, 16, D]`` -> (uint8 ``[nbytes]`` stored page, uint8 ``[2H, meta_bytes]`` metadata)."""
    _check_page(page, fmt)
    if fmt.version >= 3:
        stored, meta = v3.encode_pages_v3(page[None], fmt)
        return stored[0], meta[0]
    encoded = [
        encode_blocks(
            page_to_blocks(page[kv], fmt.geometry(kv)).reshape(-1, BLOCK_VALUES),
            fmt.geometry(kv),
            fmt.paired_low_bytes,
        )
        for kv in (0, 1)
    ]
    markers = torch.cat([e.markers for e in encoded]).view(fmt.page_heads_per_page, -1)
    page_head_bytes = block_sizes(markers).sum(dim=-1)
    meta = pack_meta(_exclusive_cumsum(page_head_bytes), markers, fmt)
    return torch.cat([e.data for e in encoded]), meta


def _decode_pages(
    data: torch.Tensor, bases: torch.Tensor, meta: torch.Tensor, fmt: PageFormat
) -> torch.Tensor:
    """Pages at byte ``bases`` (int64 [n]) of ``data`` with metadata [n, 2H, mb] -> bf16 [n, 2, H, 16, D]."""
    offsets, markers = unpack_meta(meta, fmt)
    starts = bases[:, None, None] + offsets[..., None] + _exclusive_cumsum(block_sizes(markers))
    n, h = bases.numel(), fmt.num_kv_heads
    halves = []
    for kv in (0, 1):
        heads = slice(kv * h, (kv + 1) * h)
        blocks = _restore(
            data,
            starts[:, heads].reshape(-1),
            markers[:, heads].reshape(-1),
            fmt.geometry(kv).channels,
            fmt.paired_low_bytes,
        )
        halves.append(blocks_to_page(blocks.view(n, h, -1, BLOCK_VALUES), fmt.geometry(kv), fmt.head_dim))
    return torch.stack(halves, dim=1)


def decode_page(data: torch.Tensor, meta: torch.Tensor, fmt: PageFormat) -> torch.Tensor:
    """Inverse of :func:`encode_page` (and of :func:`raw_page_bytes` with :func:`raw_page_meta`)."""
    if fmt.version >= 3:
        return v3.decode_pages_v3([data], meta[None], fmt)[0]
    if data.dtype != torch.uint8 or data.dim() != 1:
        raise ValueError(f"expected uint8 [nbytes] page data, got {data.dtype} {list(data.shape)}")
    bases = torch.zeros(1, dtype=torch.int64, device=data.device)
    return _decode_pages(data, bases, meta.unsqueeze(0), fmt)[0]


def raw_page_bytes(page: torch.Tensor, fmt: PageFormat) -> torch.Tensor:
    """bf16 ``[2, H, 16, D]`` -> uint8 ``[fmt.raw_page_bytes]``: every block raw, in block order."""
    _check_page(page, fmt)
    if fmt.version >= 3:  # plain [2, H, 16, D] bf16
        return page.contiguous().view(torch.uint8).reshape(-1)
    blocks = [page_to_blocks(page[kv], fmt.geometry(kv)).reshape(-1, BLOCK_VALUES) for kv in (0, 1)]
    return _raw_bytes(bf16_bits(torch.cat(blocks))).reshape(-1)


def raw_page_meta(fmt: PageFormat, device: torch.device | str = "cpu") -> torch.Tensor:
    """uint8 ``[2H, meta_bytes]`` of an uncompressed page: raw offsets, every marker RAW_MARKER."""
    if fmt.version >= 3:
        return v3.raw_page_meta_v3(fmt, device)
    offsets = (
        torch.arange(fmt.page_heads_per_page, dtype=torch.int64, device=device) * fmt.raw_page_head_bytes
    )
    markers = torch.full(
        (fmt.page_heads_per_page, fmt.blocks_per_page_head), RAW_MARKER, dtype=torch.uint8, device=device
    )
    return pack_meta(offsets, markers, fmt)


def raw_page_value_index(fmt: PageFormat, device: torch.device | str = "cpu") -> torch.Tensor:
    """int64 ``[2, H, 16, D]``: bf16 element index of each (kv, head, token, channel) in a raw page."""
    idx = torch.arange(fmt.raw_page_bytes // 2, dtype=torch.int64, device=device)
    if fmt.version >= 3:  # plain [2, H, 16, D] bf16
        return idx.view(2, fmt.num_kv_heads, PAGE_TOKENS, fmt.head_dim)
    idx = idx.view(2, fmt.num_kv_heads, fmt.blocks_per_page_head, BLOCK_VALUES)
    return torch.stack([blocks_to_page(idx[kv], fmt.geometry(kv), fmt.head_dim) for kv in (0, 1)])


# ---- the heap ---------------------------------------------------------------------------------------


def store_tokens(
    heap: torch.Tensor,
    page_loc_layer: torch.Tensor,
    slots: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    fmt: PageFormat,
) -> None:
    """Write tokens ``k``, ``v`` (bf16 [n, H, D]) into their raw pages; ``slot = page_id * 16 + offset``."""
    want = (slots.numel(), fmt.num_kv_heads, fmt.head_dim)
    for name, x in (("k", k), ("v", v)):
        if x.dtype != torch.bfloat16 or tuple(x.shape) != want:
            raise ValueError(f"{name} must be bf16 {list(want)}, got {x.dtype} {list(x.shape)}")
    index = raw_page_value_index(fmt, heap.device)  # [2, H, 16, D]
    base = page_loc_layer[slots // PAGE_TOKENS] // 2  # bf16 index of each token's page
    pos = base[:, None, None, None] + index[:, :, slots % PAGE_TOKENS].permute(2, 0, 1, 3)  # [n, 2, H, D]
    heap.view(torch.bfloat16)[pos] = torch.stack([k, v], dim=1)


def gather_pages(
    heap: torch.Tensor,
    page_loc_layer: torch.Tensor,
    page_meta_layer: torch.Tensor,
    page_ids: torch.Tensor,
    fmt: PageFormat,
) -> torch.Tensor:
    """Read pages (raw or compressed) of one layer: bf16 ``[n, 2, H, 16, D]``."""
    if fmt.version >= 3:
        return heap_v3.gather_pages(heap, page_loc_layer, page_meta_layer, page_ids, fmt)
    return _decode_pages(heap, page_loc_layer[page_ids], page_meta_layer[page_ids], fmt)


def encode_pages(
    heap: torch.Tensor,
    src_offsets: torch.Tensor,
    dst_offsets: torch.Tensor,
    meta_out: torch.Tensor,
    sizes_out: torch.Tensor,
    fmt: PageFormat,
) -> None:
    """Twin of ``codec.encode_pages``: compress n raw pages at ``src_offsets`` into ``dst_offsets``.

    Writes metadata into ``meta_out`` (uint8 [n, 2H, meta_bytes]) and stored sizes (blocks only) into
    ``sizes_out`` (int32 [n]). Destinations must not overlap any source page.
    """
    if fmt.version >= 3:
        return heap_v3.encode_pages(heap, src_offsets, dst_offsets, meta_out, sizes_out, fmt)
    n, h = src_offsets.numel(), fmt.num_kv_heads
    if n == 0:
        return
    raw_meta = raw_page_meta(fmt, heap.device).expand(n, -1, -1)
    pages = _decode_pages(heap, src_offsets, raw_meta, fmt)
    blocks = [page_to_blocks(pages[:, kv], fmt.geometry(kv)) for kv in (0, 1)]  # [n, H, nb, 512] each
    markers = torch.cat([block_markers(b) for b in blocks], dim=1)  # [n, 2H, nb]
    sizes = block_sizes(markers)
    starts = _exclusive_cumsum(sizes.view(n, -1)).view_as(sizes)  # bytes from each page's start
    meta_out.copy_(pack_meta(starts[..., 0], markers, fmt))
    sizes_out.copy_(sizes.view(n, -1).sum(dim=-1))
    at = dst_offsets[:, None, None] + starts
    for kv in (0, 1):
        heads = slice(kv * h, (kv + 1) * h)
        bits = bf16_bits(blocks[kv].reshape(-1, BLOCK_VALUES))
        _store_blocks(
            heap,
            at[:, heads].reshape(-1),
            markers[:, heads].reshape(-1),
            bits,
            fmt.geometry(kv).channels,
            fmt.paired_low_bytes,
        )


def decode_pages(
    heap: torch.Tensor, offsets: torch.Tensor, meta: torch.Tensor, out: torch.Tensor, fmt: PageFormat
) -> None:
    """Twin of ``codec.decode_pages``: pages at byte ``offsets`` -> ``out`` (bf16 [n, 2, H, 16, D])."""
    if fmt.version >= 3:
        return heap_v3.decode_pages(heap, offsets, meta, out, fmt)
    out.copy_(_decode_pages(heap, offsets, meta, fmt))


# ---- decode attention (its oracle lives in reference/attention.py; re-exported for the contract) -----

from .attention import decode_attention_reference as decode_attention_reference  # noqa: E402
