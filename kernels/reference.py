"""Plain-torch oracles for the zipkv page format (CPU and GPU): the codec and decode attention.

Everything here follows kernels/layout.py exactly and is the reference the Triton kernels are tested
against bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .layout import (
    BLOCK_VALUES,
    CODE_BYTES,
    COMPRESSED_BLOCK_BYTES,
    EXPONENT_SPAN,
    LOW_BYTES,
    OFFSET_BYTES,
    PAGE_TOKENS,
    RAW_BLOCK_BYTES,
    RAW_MARKER,
    BlockGeometry,
    PageFormat,
)


def bf16_bits(values: torch.Tensor) -> torch.Tensor:
    """The 16-bit patterns of bf16 ``values`` as int32 in 0..65535 (same shape)."""
    if values.dtype != torch.bfloat16:
        raise TypeError(f"expected bfloat16 values, got {values.dtype}")
    return values.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF


def block_is_compressible(values: torch.Tensor) -> torch.Tensor:
    """bf16 ``[..., 512]`` -> bool ``[...]``: every exponent lies in ``[b, b + 15]``.

    ``b`` is the block's smallest exponent rounded down to even.
    """
    if values.shape[-1] != BLOCK_VALUES:
        raise ValueError(f"blocks hold {BLOCK_VALUES} values, got last dim {values.shape[-1]}")
    exponents = (bf16_bits(values) >> 7) & 0xFF
    base = exponents.amin(dim=-1) & ~1
    return (exponents.amax(dim=-1) - base) < EXPONENT_SPAN


def page_to_blocks(page_heads: torch.Tensor, geometry: BlockGeometry) -> torch.Tensor:
    """``[..., 16, D]`` page-heads -> ``[..., D*16/512, 512]`` blocks in layout.py's block order."""
    *lead, tokens, head_dim = page_heads.shape
    if tokens != PAGE_TOKENS or head_dim % geometry.channels != 0:
        raise ValueError(
            f"page-heads of shape [..., {tokens}, {head_dim}] do not fit geometry {geometry.name}"
        )
    r, c = geometry.tokens, geometry.channels
    x = page_heads.reshape(*lead, PAGE_TOKENS // r, r, head_dim // c, c)
    x = x.transpose(-3, -2)  # [..., token groups, channel groups, r, c]
    return x.reshape(*lead, -1, BLOCK_VALUES)


def blocks_to_page(blocks: torch.Tensor, geometry: BlockGeometry, head_dim: int) -> torch.Tensor:
    """Inverse of :func:`page_to_blocks`: ``[..., n_blocks, 512]`` -> ``[..., 16, head_dim]``."""
    *lead, _n_blocks, _ = blocks.shape
    r, c = geometry.tokens, geometry.channels
    x = blocks.reshape(*lead, PAGE_TOKENS // r, head_dim // c, r, c).transpose(-3, -2)
    return x.reshape(*lead, PAGE_TOKENS, head_dim)


# ---- block codec ------------------------------------------------------------------------------------

# The code pairing depends only on a block's channel count C; encode_blocks defaults to 4 x 128 blocks.
DEFAULT_BLOCK_GEOMETRY = BlockGeometry(4, 128)


@dataclass(frozen=True)
class EncodedBlocks:
    """Blocks stored back to back in the format of layout.py, with one marker byte each as metadata."""

    data: torch.Tensor  # uint8 [sum of block sizes], device of the input: 768 or 1024 bytes per block
    markers: torch.Tensor  # uint8 [N], same device: RAW_MARKER or b/2
    geometry: BlockGeometry  # which values pair up in a code byte (value (t, k) with (t, k + C/2))

    @property
    def num_blocks(self) -> int:
        return int(self.markers.numel())

    @property
    def nbytes(self) -> int:
        """Bytes these blocks occupy: the stored blocks plus one marker byte per block."""
        return int(self.data.numel() + self.markers.numel())

    def block_offsets(self) -> torch.Tensor:
        """int64 [N]: byte offset of each block in ``data``."""
        return _exclusive_cumsum(block_sizes(self.markers))


def block_sizes(markers: torch.Tensor) -> torch.Tensor:
    """int64 sizes (768 or 1024) of blocks with the given markers (any shape)."""
    return torch.where(markers == RAW_MARKER, RAW_BLOCK_BYTES, COMPRESSED_BLOCK_BYTES).to(torch.int64)


def _exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(x, dim=-1) - x


def _bits_to_bf16(bits: torch.Tensor) -> torch.Tensor:
    """int32 patterns in 0..65535 -> bf16 with exactly those bits."""
    signed = bits - ((bits >> 15) << 16)  # into int16 range so the cast cannot saturate
    return signed.to(torch.int16).view(torch.bfloat16)


def block_markers(values: torch.Tensor) -> torch.Tensor:
    """bf16 ``[..., 512]`` -> uint8 ``[...]``: ``b/2`` for a compressible block, else RAW_MARKER."""
    exponents = (bf16_bits(values) >> 7) & 0xFF
    base = exponents.amin(dim=-1) & ~1
    fits = (exponents.amax(dim=-1) - base) < EXPONENT_SPAN
    return torch.where(fits, base >> 1, RAW_MARKER).to(torch.uint8)


def _compress(bits: torch.Tensor, half_base: torch.Tensor, channels: int) -> torch.Tensor:
    """int32 [M, 512] bits of compressible blocks, int32 [M] b/2 -> uint8 [M, 768] stored blocks."""
    m = bits.shape[0]
    sign = bits >> 15
    d = (((bits >> 7) & 0xFF) - 2 * half_base[:, None]) >> 1
    sign, d = sign.view(m, -1, channels), d.view(m, -1, channels)
    half = channels // 2
    codes = (sign[..., :half] << 7) | (sign[..., half:] << 6) | (d[..., half:] << 3) | d[..., :half]
    return torch.cat([bits & 0xFF, codes.reshape(m, CODE_BYTES)], dim=1).to(torch.uint8)


def _raw_bytes(bits: torch.Tensor) -> torch.Tensor:
    """int32 [M, 512] bits -> uint8 [M, 1024]: little-endian bf16."""
    return (
        torch.stack([bits & 0xFF, bits >> 8], dim=-1).reshape(bits.shape[0], RAW_BLOCK_BYTES).to(torch.uint8)
    )


def _store_blocks(
    data: torch.Tensor, starts: torch.Tensor, markers: torch.Tensor, bits: torch.Tensor, channels: int
) -> None:
    """Write blocks (int32 [M, 512] bits, uint8 [M] markers) into uint8 ``data`` at byte ``starts`` [M]."""
    raw = markers == RAW_MARKER
    comp = ~raw
    if bool(comp.any()):
        idx = starts[comp][:, None] + torch.arange(COMPRESSED_BLOCK_BYTES, device=data.device)
        data[idx] = _compress(bits[comp], markers[comp].to(torch.int32), channels)
    if bool(raw.any()):
        idx = starts[raw][:, None] + torch.arange(RAW_BLOCK_BYTES, device=data.device)
        data[idx] = _raw_bytes(bits[raw])


def encode_blocks(values: torch.Tensor, geometry: BlockGeometry = DEFAULT_BLOCK_GEOMETRY) -> EncodedBlocks:
    """bf16 ``[N, 512]`` blocks (each ``[R, C]`` row-major) -> their stored form, in order."""
    if values.dim() != 2 or values.shape[1] != BLOCK_VALUES:
        raise ValueError(f"encode_blocks takes bf16 [N, {BLOCK_VALUES}], got shape {tuple(values.shape)}")
    bits = bf16_bits(values)
    markers = block_markers(values)
    sizes = block_sizes(markers)
    data = torch.empty(int(sizes.sum()), dtype=torch.uint8, device=values.device)
    _store_blocks(data, _exclusive_cumsum(sizes), markers, bits, geometry.channels)
    return EncodedBlocks(data=data, markers=markers, geometry=geometry)


def _restore(data: torch.Tensor, starts: torch.Tensor, markers: torch.Tensor, channels: int) -> torch.Tensor:
    """Blocks stored in uint8 ``data`` at byte ``starts`` (int64 [M]) -> bf16 [M, 512]."""
    m = starts.numel()
    if m and int((starts + block_sizes(markers)).max()) > data.numel():
        raise ValueError(
            f"a block runs past the end of the stored bytes ({data.numel()} B): corrupt metadata?"
        )
    bits = torch.empty(m, BLOCK_VALUES, dtype=torch.int32, device=data.device)
    raw = markers == RAW_MARKER
    comp = ~raw
    if bool(raw.any()):
        b = data[starts[raw][:, None] + torch.arange(RAW_BLOCK_BYTES, device=data.device)].to(torch.int32)
        bits[raw] = b[:, 0::2] | (b[:, 1::2] << 8)
    if bool(comp.any()):
        s = starts[comp][:, None]
        low = data[s + torch.arange(LOW_BYTES, device=data.device)].to(torch.int32)
        codes = data[s + LOW_BYTES + torch.arange(CODE_BYTES, device=data.device)].to(torch.int32)
        codes = codes.view(-1, BLOCK_VALUES // channels, channels // 2)
        half_b = markers[comp].to(torch.int32)[:, None, None]
        high_lo = ((codes >> 7) << 7) | (half_b + (codes & 7))
        high_hi = (((codes >> 6) & 1) << 7) | (half_b + ((codes >> 3) & 7))
        high = torch.cat([high_lo, high_hi], dim=-1).reshape(-1, BLOCK_VALUES)
        bits[comp] = (high << 8) | low
    return _bits_to_bf16(bits)


def decode_blocks(encoded: EncodedBlocks) -> torch.Tensor:
    """Inverse of :func:`encode_blocks`: bf16 ``[N, 512]``, bit-identical to the input."""
    return _restore(encoded.data, encoded.block_offsets(), encoded.markers, encoded.geometry.channels)


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
    encoded = [
        encode_blocks(page_to_blocks(page[kv], fmt.geometry(kv)).reshape(-1, BLOCK_VALUES), fmt.geometry(kv))
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
            data, starts[:, heads].reshape(-1), markers[:, heads].reshape(-1), fmt.geometry(kv).channels
        )
        halves.append(blocks_to_page(blocks.view(n, h, -1, BLOCK_VALUES), fmt.geometry(kv), fmt.head_dim))
    return torch.stack(halves, dim=1)


def decode_page(data: torch.Tensor, meta: torch.Tensor, fmt: PageFormat) -> torch.Tensor:
    """Inverse of :func:`encode_page` (and of :func:`raw_page_bytes` with :func:`raw_page_meta`)."""
    if data.dtype != torch.uint8 or data.dim() != 1:
        raise ValueError(f"expected uint8 [nbytes] page data, got {data.dtype} {list(data.shape)}")
    bases = torch.zeros(1, dtype=torch.int64, device=data.device)
    return _decode_pages(data, bases, meta.unsqueeze(0), fmt)[0]


def raw_page_bytes(page: torch.Tensor, fmt: PageFormat) -> torch.Tensor:
    """bf16 ``[2, H, 16, D]`` -> uint8 ``[fmt.raw_page_bytes]``: every block raw, in block order."""
    _check_page(page, fmt)
    blocks = [page_to_blocks(page[kv], fmt.geometry(kv)).reshape(-1, BLOCK_VALUES) for kv in (0, 1)]
    return _raw_bytes(bf16_bits(torch.cat(blocks))).reshape(-1)


def raw_page_meta(fmt: PageFormat, device: torch.device | str = "cpu") -> torch.Tensor:
    """uint8 ``[2H, meta_bytes]`` of an uncompressed page: raw offsets, every marker RAW_MARKER."""
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
            heap, at[:, heads].reshape(-1), markers[:, heads].reshape(-1), bits, fmt.geometry(kv).channels
        )


def decode_pages(
    heap: torch.Tensor, offsets: torch.Tensor, meta: torch.Tensor, out: torch.Tensor, fmt: PageFormat
) -> None:
    """Twin of ``codec.decode_pages``: pages at byte ``offsets`` -> ``out`` (bf16 [n, 2, H, 16, D])."""
    out.copy_(_decode_pages(heap, offsets, meta, fmt))


# ---- decode attention (its oracle lives in reference_attention.py; re-exported for the contract) -----

from .reference_attention import decode_attention_reference as decode_attention_reference  # noqa: E402
