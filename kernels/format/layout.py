"""The zipkv page format, v1, v2 and v3 (pure Python: no torch, no triton). v3's byte order is in
format/layout_v3.py; this module holds the sizes of every version and v1/v2's rules.

Words (docs/design.md): a **page** holds 16 tokens of one layer's KV, all KV heads, K and V; a
**page-head** is one KV head's K (or V) in one page, 16 x head_dim values; a **block** is the codec's
unit of 512 values.

BF16 is 1 sign, 8 exponent and 7 fraction bits. A block is *compressible* when, with ``b`` its smallest
exponent rounded down to even, every exponent lies in ``[b, b + 15]``. A compressible block keeps every
value's **low byte** unchanged (the lowest exponent bit and the 7 fraction bits) and a 4-bit **code**:
the sign and ``d = (e - b) >> 1``. The high byte comes back as ``sign * 128 + b/2 + d``, which never
carries since ``b/2 + d <= 127``. Other blocks are stored raw (plain little-endian bf16).

Block geometry. Inside a page-head (16 tokens x head_dim channels, row-major), a block is ``R`` tokens x
``C`` channels with ``R * C = 512``; block ``j`` covers tokens ``(j // (D/C)) * R ...`` and channels
``(j % (D/C)) * C ...``. The geometry is chosen per K and V from measurements on real KV
(``python -m zipkv.kernels.study``, recorded in docs/format.md).

Byte layout of one block::

    compressed (768 bytes)                       raw (1024 bytes)
    +------------------------+------------+      +--------------------------------+
    | low bytes  [R, C] u8   | codes      |      | values [R, C] bf16 (row-major) |
    | 512 bytes, row-major   | [R, C/2] u8|      | 1024 bytes                     |
    +------------------------+------------+      +--------------------------------+

Code packing (the pairing follows the kernel's loads): code byte ``(t, k)`` for ``k < C/2`` holds value
``(t, k)`` in bit 7 (sign) and bits 0-2 (d), and value ``(t, k + C/2)`` in bit 6 (sign) and bits 3-5 (d).
So one masked byte-wise add of ``b/2`` restores four high bytes of a 32-bit code word at once::

    high(t, k)       = (w & 0x07070707) + b/2 * 0x01010101 | (w & 0x80808080)
    high(t, k + C/2) = ((w >> 3) & 0x07070707) + b/2 * 0x01010101 | ((w << 1) & 0x80808080)

and the kernel sees each block as two ``[R, C/2]`` channel halves, ready for two dot products.

Page layout: the ``2 * num_kv_heads`` page-heads in order ``(K h0, K h1, ..., V h0, V h1, ...)``, each a
run of its blocks in order ``j = 0 ..``. A page that is not compressed (a new page, the tail page) has every
block raw, so it is plain ``[2, num_kv_heads, 16, head_dim]`` bf16 when ``C == head_dim`` (token-major
blocks), and the same values permuted into block order otherwise.

Version 2 (the default: on the H200, side by side with v1 on the same pages, 1-3% faster and bit-identical;
docs/benchmarks.md; v1 stays readable) changes one thing: the order of a compressed
block's low bytes. Row ``t``'s low bytes are stored in code-byte pairs, ``lo(t, 0), lo(t, C/2), lo(t, 1),
lo(t, C/2 + 1), ...``, so the kernel loads both low bytes of a channel pair as one 16-bit value, exactly
where a raw row holds the bf16 value of channel ``k``: one load serves both kinds of row. Raw blocks, raw
pages, codes and metadata are as in v1.

Metadata: per page, per page-head, ``meta_bytes`` bytes: a little-endian int32 byte offset of the
page-head's first block *relative to the page's start* (so moving a page only rewrites the page table),
then one marker byte per block: ``RAW_MARKER`` (0xFF) or ``b/2`` (0..127); padded with 0 to a multiple
of 8 bytes. Block ``j`` starts at the page-head's offset plus the sizes (768 or 1024) of blocks before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import layout_v3 as v3

FORMAT_VERSION = 2
SUPPORTED_VERSIONS = (1, 2, 3)  # 2: low bytes in code-byte pairs (see above); 3: format/layout_v3.py
PAGE_TOKENS = 16
BLOCK_VALUES = 512
RAW_BLOCK_BYTES = 1024  # 512 bf16 values
COMPRESSED_BLOCK_BYTES = 768  # 512 low bytes + 256 code bytes
LOW_BYTES = 512
CODE_BYTES = 256
RAW_MARKER = 0xFF  # any value > 127 cannot be b/2
EXPONENT_SPAN = 16  # exponents b .. b+15 fit a 3-bit d plus the kept lowest exponent bit
OFFSET_BYTES = 4
SUPPORTED_HEAD_DIMS = (64, 128, 256)
KV_NAMES = ("K", "V")
V3_BLOCK = (v3.BLOCK_TOKENS, 2 * v3.BLOCK_PAIRS)  # v3: 16 tokens x 4 pairs (channels p, p + D/2)


@dataclass(frozen=True)
class BlockGeometry:
    """Which 512 values of a page-head form one block: ``tokens`` x ``channels``."""

    tokens: int
    channels: int

    def __post_init__(self) -> None:
        if self.tokens * self.channels != BLOCK_VALUES and (self.tokens, self.channels) != V3_BLOCK:
            raise ValueError(f"block geometry {self} must hold {BLOCK_VALUES} values")
        if PAGE_TOKENS % self.tokens != 0 or self.channels % 2 != 0:
            raise ValueError(f"block geometry {self}: tokens must divide {PAGE_TOKENS}, channels be even")

    @property
    def name(self) -> str:
        return f"{self.tokens}x{self.channels}"

    @staticmethod
    def parse(text: str) -> BlockGeometry:
        """Parse ``"4x128"`` (tokens x channels); raises ValueError with the accepted form."""
        try:
            tokens, channels = (int(p) for p in text.lower().split("x"))
        except ValueError as exc:
            raise ValueError(f"block geometry {text!r}: expected TOKENSxCHANNELS, e.g. 4x128") from exc
        return BlockGeometry(tokens, channels)


def token_major(head_dim: int) -> BlockGeometry:
    """Blocks of whole token rows: ``512 / head_dim`` tokens x ``head_dim`` channels."""
    return BlockGeometry(BLOCK_VALUES // head_dim, head_dim)


def candidate_geometries(head_dim: int) -> list[BlockGeometry]:
    """Every geometry that tiles a 16 x head_dim page-head, fewest tokens first."""
    out = []
    for tokens in (1, 2, 4, 8, 16):
        channels = BLOCK_VALUES // tokens
        if channels <= head_dim and head_dim % channels == 0:
            out.append(BlockGeometry(tokens, channels))
    return out


@dataclass(frozen=True)
class PageFormat:
    """Byte layout of a page for one model shape. All sizes in bytes."""

    head_dim: int
    num_kv_heads: int
    k_geometry: BlockGeometry = field(default=None)  # type: ignore[assignment]
    v_geometry: BlockGeometry = field(default=None)  # type: ignore[assignment]
    version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.head_dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"head_dim {self.head_dim} not supported; use one of {SUPPORTED_HEAD_DIMS}")
        if self.num_kv_heads < 1:
            raise ValueError(f"num_kv_heads must be >= 1, got {self.num_kv_heads}")
        if self.version not in SUPPORTED_VERSIONS:
            raise ValueError(
                f"page format version {self.version} unknown; this build reads "
                + ", ".join(f"v{v}" for v in SUPPORTED_VERSIONS)
            )
        for name in ("k_geometry", "v_geometry"):
            geometry = getattr(self, name)
            if self.version >= 3:
                if geometry not in (None, BlockGeometry(*V3_BLOCK)):
                    raise ValueError(f"page format v3 has one block geometry (16x8), got {name} {geometry}")
                object.__setattr__(self, name, BlockGeometry(*V3_BLOCK))
            elif geometry is None:
                object.__setattr__(self, name, default_geometry(self.head_dim, name[0].upper()))
            elif self.head_dim % geometry.channels != 0:
                raise ValueError(f"{name} {geometry.name} does not tile head_dim {self.head_dim}")

    @property
    def paired_low_bytes(self) -> bool:
        """v2: a compressed row's low bytes of channels k and k + C/2 sit next to each other."""
        return self.version >= 2

    @property
    def fixed_stride(self) -> bool:
        """v3: every page-head is a fixed-size record; raw blocks add a patch after the last one."""
        return self.version >= 3

    # ---- sizes ----------------------------------------------------------------------------------
    @property
    def values_per_page_head(self) -> int:
        return PAGE_TOKENS * self.head_dim

    @property
    def block_values(self) -> int:
        return v3.BLOCK_VALUES if self.version >= 3 else BLOCK_VALUES

    @property
    def compressed_block_bytes(self) -> int:
        return v3.CODED_BLOCK_BYTES if self.version >= 3 else COMPRESSED_BLOCK_BYTES

    @property
    def raw_block_bytes(self) -> int:
        return v3.RAW_BLOCK_BYTES if self.version >= 3 else RAW_BLOCK_BYTES

    @property
    def blocks_per_page_head(self) -> int:
        return self.values_per_page_head // self.block_values

    @property
    def page_heads_per_page(self) -> int:
        return 2 * self.num_kv_heads

    @property
    def blocks_per_page(self) -> int:
        return self.page_heads_per_page * self.blocks_per_page_head

    @property
    def raw_page_head_bytes(self) -> int:
        return self.blocks_per_page_head * self.raw_block_bytes

    @property
    def raw_page_bytes(self) -> int:
        """Size of an uncompressed page: what every new page is allocated at."""
        return self.page_heads_per_page * self.raw_page_head_bytes

    @property
    def min_page_bytes(self) -> int:
        """Size of a page whose every block compressed."""
        return self.blocks_per_page * self.compressed_block_bytes

    @property
    def page_alignment_bytes(self) -> int:
        """What page offsets the codec's kernels need: v1/v2 multiples of 256 bytes (blocks start on them),
        v3 of 16 (16-byte vector loads and stores; v3 pages are multiples of 64 bytes)."""
        return 16 if self.version >= 3 else 256

    @property
    def meta_bytes(self) -> int:
        """Metadata per page-head: v1/v2 an int32 offset + one marker per block, padded to 8 bytes;
        v3 one byte per block (its base, patch rank or raw-page marker)."""
        if self.version >= 3:
            return self.blocks_per_page_head
        return -(-(OFFSET_BYTES + self.blocks_per_page_head) // 8) * 8

    @property
    def meta_bytes_per_page(self) -> int:
        return self.page_heads_per_page * self.meta_bytes

    def geometry(self, kv: int) -> BlockGeometry:
        """Block geometry of K (kv=0) or V (kv=1)."""
        return self.k_geometry if kv == 0 else self.v_geometry

    def page_head_index(self, kv: int, head: int) -> int:
        return kv * self.num_kv_heads + head

    def raw_page_head_offset(self, kv: int, head: int) -> int:
        """Offset of a page-head in an uncompressed page."""
        return self.page_head_index(kv, head) * self.raw_page_head_bytes

    def compressed_page_bytes(self, compressed_blocks: int) -> int:
        """Size of a page of which ``compressed_blocks`` blocks compressed and the rest stayed raw."""
        if not 0 <= compressed_blocks <= self.blocks_per_page:
            raise ValueError(f"compressed_blocks {compressed_blocks} outside 0..{self.blocks_per_page}")
        raw = self.blocks_per_page - compressed_blocks
        if self.version >= 3 and v3.stores_raw(raw, self.blocks_per_page):
            return self.raw_page_bytes
        return compressed_blocks * self.compressed_block_bytes + raw * self.raw_block_bytes

    def expected_page_bytes(self, compressible_fraction: float) -> float:
        """Mean stored bytes per page (metadata included) at a compressible fraction of blocks."""
        per_block = (
            compressible_fraction * self.compressed_block_bytes
            + (1 - compressible_fraction) * self.raw_block_bytes
        )
        return self.blocks_per_page * per_block + self.meta_bytes_per_page

    def block_of(self, kv: int, token: int, channel: int) -> int:
        """Index of the block that holds (token, channel) of a page-head."""
        if self.version >= 3:
            return v3.block_of(token, channel, self.head_dim)
        g = self.geometry(kv)
        return (token // g.tokens) * (self.head_dim // g.channels) + channel // g.channels

    def ascii_map(self) -> str:
        """A picture of one page and its metadata, for docs and error messages."""
        if self.version >= 3:
            return v3.ascii_map(self.head_dim, self.num_kv_heads)
        lines = [
            f"zipkv page format v{self.version}: head_dim {self.head_dim}, {self.num_kv_heads} KV heads, "
            f"{PAGE_TOKENS} tokens",
            f"  K blocks {self.k_geometry.name} (tokens x channels), V blocks {self.v_geometry.name}; "
            f"{self.blocks_per_page_head} blocks per page-head",
            f"  raw page {self.raw_page_bytes} B; all-compressed page {self.min_page_bytes} B "
            f"(+{self.meta_bytes_per_page} B metadata)",
            "  page: | K h0 | K h1 | ... | V h0 | V h1 | ... |   each page-head: | blk0 | blk1 | ... |",
            "  blk compressed: | low bytes 512 | codes 256 |    blk raw: | bf16 x 512 (1024) |",
            f"  meta per page-head ({self.meta_bytes} B): | offset int32 LE | "
            + " | ".join(f"m{j}" for j in range(self.blocks_per_page_head))
            + (" | pad" if self.meta_bytes > OFFSET_BYTES + self.blocks_per_page_head else "")
            + " |   m = 0xFF raw, else b/2",
        ]
        return "\n".join(lines)


# v1/v2's geometry: token-major for K and V, one restore path in the kernel. Other 512-value shapes were
# measured (docs/format.md, bench/results/format_study.json): on SmolLM2's K a 16x32 channel strip codes
# 3 points more blocks than 8x64 rows, against 11 points more for v3's 128-value blocks.
_DEFAULT_GEOMETRY: dict[str, str] = {"K": "token_major", "V": "token_major"}


def default_geometry(head_dim: int, kv_name: str) -> BlockGeometry:
    choice = _DEFAULT_GEOMETRY[kv_name]
    if choice == "token_major":
        return token_major(head_dim)
    return BlockGeometry.parse(choice)
