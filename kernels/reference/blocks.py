"""Plain-torch oracle of the zipkv block coding (kernels/format/layout.py): blocks in, stored bytes out, and
back.

A block is 512 bf16 values; it is stored compressed (low bytes + 3-bit exponent codes, 768 bytes) when its
exponents fit a span of 16 above an even base, raw (1024 bytes) otherwise. This module holds that rule, the
page-head <-> block reshapes and the byte-level store and restore of blocks; reference/pages.py builds pages,
metadata and the heap on top of it. Split from reference/pages.py so the block format can be read (and tested,
tests/kernels/test_reference_codec.py) on its own; everything is re-exported from
zipkv.kernels.reference.pages.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..format.layout import (
    BLOCK_VALUES,
    CODE_BYTES,
    COMPRESSED_BLOCK_BYTES,
    EXPONENT_SPAN,
    LOW_BYTES,
    PAGE_TOKENS,
    RAW_BLOCK_BYTES,
    RAW_MARKER,
    BlockGeometry,
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
    """``[..., 16, D]`` page-heads -> ``[..., D*16/512, 512]`` blocks in format/layout.py's block order."""
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
    """Blocks stored back to back in the format of format/layout.py, with one marker byte each as metadata."""

    data: torch.Tensor  # uint8 [sum of block sizes], device of the input: 768 or 1024 bytes per block
    markers: torch.Tensor  # uint8 [N], same device: RAW_MARKER or b/2
    geometry: BlockGeometry  # which values pair up in a code byte (value (t, k) with (t, k + C/2))
    paired: bool = False  # format v2: low bytes stored in code-byte pairs (format/layout.py)

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


def low_byte_order(channels: int, paired: bool) -> torch.Tensor:
    """int64 [512]: which value of a block each stored low byte belongs to (v1: identity; v2: row t
    stores lo(t, 0), lo(t, C/2), lo(t, 1), lo(t, C/2 + 1), ...)."""
    order = torch.arange(BLOCK_VALUES)
    if not paired:
        return order
    half = channels // 2
    pos = order % channels
    return order - pos + (pos // 2) + (pos % 2) * half


def _compress(
    bits: torch.Tensor, half_base: torch.Tensor, channels: int, paired: bool = False
) -> torch.Tensor:
    """int32 [M, 512] bits of compressible blocks, int32 [M] b/2 -> uint8 [M, 768] stored blocks."""
    m = bits.shape[0]
    sign = bits >> 15
    d = (((bits >> 7) & 0xFF) - 2 * half_base[:, None]) >> 1
    sign, d = sign.view(m, -1, channels), d.view(m, -1, channels)
    half = channels // 2
    codes = (sign[..., :half] << 7) | (sign[..., half:] << 6) | (d[..., half:] << 3) | d[..., :half]
    low = (bits & 0xFF)[:, low_byte_order(channels, paired).to(bits.device)]
    return torch.cat([low, codes.reshape(m, CODE_BYTES)], dim=1).to(torch.uint8)


def _raw_bytes(bits: torch.Tensor) -> torch.Tensor:
    """int32 [M, 512] bits -> uint8 [M, 1024]: little-endian bf16."""
    return (
        torch.stack([bits & 0xFF, bits >> 8], dim=-1).reshape(bits.shape[0], RAW_BLOCK_BYTES).to(torch.uint8)
    )


def _store_blocks(
    data: torch.Tensor,
    starts: torch.Tensor,
    markers: torch.Tensor,
    bits: torch.Tensor,
    channels: int,
    paired: bool = False,
) -> None:
    """Write blocks (int32 [M, 512] bits, uint8 [M] markers) into uint8 ``data`` at byte ``starts`` [M]."""
    raw = markers == RAW_MARKER
    comp = ~raw
    if bool(comp.any()):
        idx = starts[comp][:, None] + torch.arange(COMPRESSED_BLOCK_BYTES, device=data.device)
        data[idx] = _compress(bits[comp], markers[comp].to(torch.int32), channels, paired)
    if bool(raw.any()):
        idx = starts[raw][:, None] + torch.arange(RAW_BLOCK_BYTES, device=data.device)
        data[idx] = _raw_bytes(bits[raw])


def encode_blocks(
    values: torch.Tensor, geometry: BlockGeometry = DEFAULT_BLOCK_GEOMETRY, paired: bool = False
) -> EncodedBlocks:
    """bf16 ``[N, 512]`` blocks (each ``[R, C]`` row-major) -> their stored form, in order."""
    if values.dim() != 2 or values.shape[1] != BLOCK_VALUES:
        raise ValueError(f"encode_blocks takes bf16 [N, {BLOCK_VALUES}], got shape {tuple(values.shape)}")
    bits = bf16_bits(values)
    markers = block_markers(values)
    sizes = block_sizes(markers)
    data = torch.empty(int(sizes.sum()), dtype=torch.uint8, device=values.device)
    _store_blocks(data, _exclusive_cumsum(sizes), markers, bits, geometry.channels, paired)
    return EncodedBlocks(data=data, markers=markers, geometry=geometry, paired=paired)


def _restore(
    data: torch.Tensor, starts: torch.Tensor, markers: torch.Tensor, channels: int, paired: bool = False
) -> torch.Tensor:
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
        stored = data[s + torch.arange(LOW_BYTES, device=data.device)].to(torch.int32)
        low = torch.empty_like(stored)
        low[:, low_byte_order(channels, paired).to(data.device)] = stored
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
    return _restore(
        encoded.data, encoded.block_offsets(), encoded.markers, encoded.geometry.channels, encoded.paired
    )
