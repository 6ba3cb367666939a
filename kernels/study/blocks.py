"""What the format study measures on captured KV: candidate block geometries and the real page formats.

A **candidate** is a way to cut a page-head (16 tokens x D channels) into blocks of 512, 256, 128 or 64
values, each coded when its exponents fit a 16-wide window above an even base (the rule of every zipkv
format) and raw otherwise:

- ``rows`` (token-major): R whole token rows x C channels (C = min(D, values); R = values / C), v1/v2's
  shape (``8x64`` at D = 64, ``4x128`` at D = 128);
- ``strip`` (channel-major): 16 tokens x C consecutive channels (``16x8``);
- ``pairs`` (pair-major): 16 tokens x k channel pairs ``(p, p + D/2)``, the two values one code byte holds
  (``16x4p`` is page format v3's block).

Each candidate is measured twice: as is, and with an **exact-zero code** (one of the eight 3-bit codes
reserved for "exponent field 0", so a zero or a subnormal no longer sends its block raw; a block holding
one keeps a 14-wide window for its other values, blocks without keep 16; the block's metadata byte would
say which). Candidate stored bytes: 1.5 B per value of a coded block, 2 B per value of a raw one (as v3's
patches store a raw block in exactly its raw bytes) and one metadata byte per block (its base or a raw
marker). The real formats v2 and v3 are measured by encoding every page with kernels/reference/page_codec.py,
which gives their exact stored bytes: coded and raw blocks, v3's patches, pages stored raw, all metadata.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from ..format.layout import PAGE_TOKENS, PageFormat
from ..reference import page_codec

BLOCK_SIZES = (512, 256, 128, 64)
SPAN = 16  # exponent window of a coded block
ZERO_CODE_SPAN = 14  # with code 7 reserved for exponent 0: d = 0..6


@dataclass(frozen=True)
class Candidate:
    """A block geometry to measure: ``layout`` rows / strip / pairs, ``tokens`` x ``width``."""

    layout: str
    tokens: int
    width: int  # channels (rows, strip) or channel pairs (pairs)

    @property
    def values(self) -> int:
        return self.tokens * self.width * (2 if self.layout == "pairs" else 1)

    @property
    def name(self) -> str:
        return f"{self.tokens}x{self.width}" + ("p" if self.layout == "pairs" else "")

    def blocks(self, exponents: torch.Tensor) -> torch.Tensor:
        """int32 ``[M, 16, D]`` per-value exponents -> ``[M, blocks per page-head, values]``."""
        m, _, d = exponents.shape
        if self.layout == "rows":
            r, c = self.tokens, self.width
            x = exponents.view(m, PAGE_TOKENS // r, r, d // c, c).permute(0, 1, 3, 2, 4)
            return x.reshape(m, -1, self.values)
        if self.layout == "pairs":  # interleave the halves: channel 2p + h is (p + h * D/2)
            exponents = torch.stack([exponents[..., : d // 2], exponents[..., d // 2 :]], dim=-1).view(
                m, -1, d
            )
        c = self.values // PAGE_TOKENS
        return exponents.view(m, PAGE_TOKENS, d // c, c).permute(0, 2, 1, 3).reshape(m, -1, self.values)


def candidates(head_dim: int) -> list[Candidate]:
    """Every candidate of BLOCK_SIZES values for a 16 x head_dim page-head (head_dim 64 .. 256)."""
    out = []
    for n in BLOCK_SIZES:
        c = min(head_dim, n)
        out += [Candidate("rows", n // c, c), Candidate("strip", PAGE_TOKENS, n // PAGE_TOKENS),
                Candidate("pairs", PAGE_TOKENS, n // (2 * PAGE_TOKENS))]  # fmt: skip
    return out


def exponents_of(values: torch.Tensor) -> torch.Tensor:
    """bf16 ``[tokens, heads, D]`` -> int32 ``[pages * heads, 16, D]`` exponents per page-head (a partial
    trailing page is dropped: the format codes only full pages)."""
    tokens, heads, d = values.shape
    pages = tokens // PAGE_TOKENS
    x = values[: pages * PAGE_TOKENS].reshape(pages, PAGE_TOKENS, heads, d).transpose(1, 2)
    return (x.contiguous().view(torch.int16).to(torch.int32) >> 7 & 0xFF).reshape(-1, PAGE_TOKENS, d)


def coded_blocks(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 ``[..., values]`` exponents -> (bool coded, bool coded with the exact-zero code)."""
    low, high = blocks.amin(dim=-1), blocks.amax(dim=-1)
    plain = high - (low & ~1) < SPAN
    low_nonzero = torch.where(blocks > 0, blocks, 255).amin(dim=-1)  # 255 when every value is zero: fits
    fits_with_zeros = high - (low_nonzero & ~1) < ZERO_CODE_SPAN
    return plain, plain | ((low == 0) & fits_with_zeros)


def candidate_bytes_per_value(coded: int, blocks: int, values_per_block: int) -> float:
    """Stored bytes per value: 1.5 B per coded value, 2 B per raw value, 1 metadata byte per block."""
    n = values_per_block
    return (1.5 * n * coded + 2.0 * n * (blocks - coded) + blocks) / (blocks * n)


@dataclass(frozen=True)
class GeometryCounts:
    """Blocks of one candidate geometry over some page-heads, and how many code (without, with zero code)."""

    geometry: str
    layout: str
    values_per_block: int
    blocks: int
    coded_blocks: int
    coded_blocks_zero_code: int

    def __add__(self, other: GeometryCounts) -> GeometryCounts:
        return GeometryCounts(self.geometry, self.layout, self.values_per_block, self.blocks + other.blocks,
                              self.coded_blocks + other.coded_blocks,
                              self.coded_blocks_zero_code + other.coded_blocks_zero_code)  # fmt: skip

    def figures(self) -> dict[str, float]:
        n, b, c, cz = self.values_per_block, self.blocks, self.coded_blocks, self.coded_blocks_zero_code
        return {
            "coded_fraction": round(c / b, 6),
            "bytes_per_value": round(candidate_bytes_per_value(c, b, n), 6),
            "coded_fraction_zero_code": round(cz / b, 6),
            "bytes_per_value_zero_code": round(candidate_bytes_per_value(cz, b, n), 6),
        }


def measure_candidates(values: torch.Tensor) -> list[GeometryCounts]:
    """One stream of one layer (bf16 ``[tokens, heads, D]``): counts per candidate geometry."""
    exponents = exponents_of(values)
    out = []
    for cand in candidates(values.shape[-1]):
        plain, zero = coded_blocks(cand.blocks(exponents))
        out.append(GeometryCounts(cand.name, cand.layout, cand.values, plain.numel(), int(plain.sum()),
                                  int(zero.sum())))  # fmt: skip
    return out


def zero_fraction(values: torch.Tensor) -> float:
    """Fraction of values whose exponent field is 0 (exact zeros and subnormals)."""
    return float((exponents_of(values) == 0).double().mean())


def pages_of(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """K and V bf16 ``[tokens, heads, D]`` -> full pages bf16 ``[pages, 2, heads, 16, D]``."""
    tokens, heads, d = k.shape
    pages = tokens // PAGE_TOKENS
    kv = torch.stack([k, v])[:, : pages * PAGE_TOKENS].reshape(2, pages, PAGE_TOKENS, heads, d)
    return kv.permute(1, 0, 3, 2, 4).contiguous()


@dataclass(frozen=True)
class FormatCounts:
    """Exact byte counts of pages encoded in one format version; per-kind tuples are (K, V)."""

    pages: int
    pages_stored_raw: int
    raw_bytes: int
    meta_bytes: int
    stored_bytes: tuple[int, int]  # blocks, records and patches of the K and of the V page-heads
    coded_blocks: tuple[int, int]  # 0 for a page stored raw
    blocks: tuple[int, int]

    def __add__(self, other: FormatCounts) -> FormatCounts:
        def add(a: Any, b: Any) -> Any:
            return (a[0] + b[0], a[1] + b[1]) if isinstance(a, tuple) else a + b

        return FormatCounts(
            **{f.name: add(getattr(self, f.name), getattr(other, f.name)) for f in fields(self)}
        )

    def figures(self) -> dict[str, float]:
        """Values coded and stored bytes per value (each kind carries half the metadata), K and V; the
        whole pages' stored bytes (metadata included) over their raw bytes."""
        out = {}
        values_per_kind = self.raw_bytes / 4
        for i, kind in enumerate("KV"):
            out[f"{kind}_coded_fraction"] = round(self.coded_blocks[i] / self.blocks[i], 6)
            out[f"{kind}_bytes_per_value"] = round(
                (self.stored_bytes[i] + self.meta_bytes / 2) / values_per_kind, 6
            )
        out["stored_over_raw"] = round((sum(self.stored_bytes) + self.meta_bytes) / self.raw_bytes, 6)
        return out


def measure_format(k: torch.Tensor, v: torch.Tensor, version: int) -> FormatCounts:
    """Encode every page of one layer in page format ``version`` (page_codec): exact byte counts."""
    heads, d = k.shape[1], k.shape[2]
    fmt = PageFormat(d, heads, version=version)
    encoded = page_codec.encode_pages(pages_of(k, v), fmt)
    halves = (slice(0, heads), slice(heads, 2 * heads))
    return FormatCounts(
        pages=len(encoded),
        pages_stored_raw=sum(p.stored_raw for p in encoded),
        raw_bytes=len(encoded) * fmt.raw_page_bytes,
        meta_bytes=sum(p.meta_bytes for p in encoded),
        stored_bytes=tuple(sum(sum(p.page_head_bytes[h]) for p in encoded) for h in halves),  # type: ignore[arg-type]
        coded_blocks=tuple(sum(sum(p.page_head_coded_blocks[h]) for p in encoded) for h in halves),  # type: ignore[arg-type]
        blocks=(len(encoded) * heads * fmt.blocks_per_page_head,) * 2,
    )
