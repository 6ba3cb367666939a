"""The zipkv page format v3: byte order and rules (pure Python: no torch, no triton).

Why v3 (measured in docs/format.md): on a trained decoder's KV (SmolLM2-135M-Instruct, K after RoPE as
SGLang computes it, and V) 512-value blocks with one exponent window leave 12-23% of the values raw; blocks
of 16 tokens x 8 channels leave ~1%. v3 makes that the unit of fallback and lays the bytes out for the
Hopper decode kernel's loads: every page-head is a fixed-size record, so a page's tiles can be copied to
shared memory before anything about them is known, and a raw block costs no more than its raw bytes.

Words. A **page** is 16 tokens of one layer, all KV heads, K and V; a **page-head** one KV head's K (or V)
in a page, 16 x D values (D = head_dim); a **pair** ``p < D/2`` is channels ``p`` and ``p + D/2`` of a
token (the two values one code byte holds, as in v1/v2); a **block** is 16 tokens x 4 pairs (128 values),
the unit that is coded or raw. Block ``G`` holds the pairs ``4G .. 4G + 3`` (its pairs j = 0..3).

A block is *coded* when all its exponents lie in ``[b, b + 15]`` (``b`` = smallest exponent rounded down
to even): each value keeps its low byte (lowest exponent bit + 7 fraction bits) and gets a 4-bit code
(sign, ``d = (e - b) >> 1``); the high byte comes back as ``sign << 7 | (b/2 + d)``, never carrying.

Page-head record (``24 * D`` bytes, at ``page start + index * 24 * D``; index = ``kv * H + head``)::

    | lo plane  [16 tokens][D/2 pairs] u16 = lo(t, p) | lo(t, p + D/2) << 8     16 * D bytes |
    | code plane  D/8 blocks x 64 bytes, block G at 64 * G                          8 * D bytes |

    code byte of (t, p), coded block:   s(t, p) << 7 | s(t, p + D/2) << 6 | d(t, p + D/2) << 3 | d(t, p)
    code byte of (t, p), raw block:     hi(t, p)          (the value's whole high byte)
    patch byte of (t, p), raw block:    hi(t, p + D/2)    (in the page's patch area, same order)

    inside a block's 64 bytes (K and V alike):   byte 4 * t + j   (j = p - 4G)

Page (coded)::  | page-head 0 | ... | page-head 2H-1 | patch 0 | ... | patch r-1 |    (64 bytes each)

Metadata: one byte per block, uint8 ``[2H, D/8]`` per page: ``b/2`` (0..127) for a coded block,
``0x80 | r`` for a raw block whose odd-half high bytes are patch ``r`` of the page (r = the block's rank
among the page's raw blocks in (page-head, block) order), ``0xFF`` in every byte for a page stored raw.
A page is stored raw (plain ``[2, H, 16, D]`` bf16, as every new page is written) when it has more raw
blocks than ``MAX_PATCHES`` or when every block is raw; otherwise coded.

Why this order (the Hopper decode kernel, kernels/attention/hopper/decode.py): a page-head lands in shared
memory as two 16 * D-byte halves, the lo plane and the code plane + patches; the kernel turns each 32-bit code
word (four pairs of one token) into four high-byte pairs in place, after which the lo plane and the high-byte
plane are both ``[16][D/2]`` u16 in the same order, and the MMA operands load straight from them with
``ldmatrix``. A raw page's two channel halves land in the same two slots in the same order. A raw block's
high bytes take the place of its codes plus one 64-byte patch, so a raw block stores exactly its 256 raw
bytes and goes through the same path as a coded one.
"""

from __future__ import annotations

VERSION = 3
BLOCK_TOKENS = 16  # a block spans the whole page
BLOCK_PAIRS = 4
BLOCK_VALUES = BLOCK_TOKENS * BLOCK_PAIRS * 2  # 128
CODED_BLOCK_BYTES = BLOCK_VALUES + BLOCK_VALUES // 2  # 128 low bytes + 64 code bytes = 192
RAW_BLOCK_BYTES = 2 * BLOCK_VALUES  # 256: lo 128 + high bytes in the code slot 64 + patch 64
CODE_BLOCK_BYTES = BLOCK_VALUES // 2  # 64
PATCH_BYTES = BLOCK_VALUES // 2  # 64
RAW_PAGE_MARKER = 0xFF
RAW_BLOCK_FLAG = 0x80
MAX_PATCHES = 127  # ranks 0..126 fit 0x80 | r below RAW_PAGE_MARKER
EXPONENT_SPAN = 16


def pair_of(block: int, j: int) -> int:
    """The j-th pair (0..3) of block ``block``."""
    return BLOCK_PAIRS * block + j


def block_of_pair(pair: int) -> tuple[int, int]:
    """(block, j) of a pair: the inverse of :func:`pair_of`."""
    return divmod(pair, BLOCK_PAIRS)


def blocks_per_page_head(head_dim: int) -> int:
    return head_dim // 8


def page_head_bytes(head_dim: int) -> int:
    """Size of a page-head record: lo plane (16 * D) + code plane (8 * D)."""
    return 24 * head_dim


def lo_plane_bytes(head_dim: int) -> int:
    return 16 * head_dim


def lo_byte_index(token: int, channel: int, head_dim: int) -> int:
    """Byte of (token, channel)'s low byte inside a page-head record."""
    half = head_dim // 2
    pair, odd = (channel, 0) if channel < half else (channel - half, 1)
    return token * head_dim + 2 * pair + odd


def code_byte_index(token: int, pair: int, head_dim: int) -> int:
    """Byte of (token, pair)'s code byte inside a page-head record (the same for K and V)."""
    block, j = block_of_pair(pair)
    return lo_plane_bytes(head_dim) + CODE_BLOCK_BYTES * block + 4 * token + j


def block_of(token: int, channel: int, head_dim: int) -> int:
    """Index of the block (0 .. D/8 - 1) that holds (token, channel) of a page-head: blocks span tokens."""
    del token
    return block_of_pair(channel % (head_dim // 2))[0]


def block_base(exponents: list[int]) -> int | None:
    """``b`` of a block (smallest exponent rounded down to even), or None when the block is raw."""
    b = min(exponents) & ~1
    return b if max(exponents) - b < EXPONENT_SPAN else None


def code_byte(lo: int, hi: int, b: int) -> int:
    """Code byte of pair (bits of channel p, bits of channel p + D/2) in a coded block of base ``b``."""
    d_lo, d_hi = (((lo >> 7) & 0xFF) - b) >> 1, (((hi >> 7) & 0xFF) - b) >> 1
    return (lo >> 15) << 7 | (hi >> 15) << 6 | d_hi << 3 | d_lo


def restore_pair(lo_byte: int, hi_byte: int, code: int, half_b: int) -> tuple[int, int]:
    """(bits of channel p, bits of channel p + D/2) from their low bytes, code byte and ``b/2``."""
    high_p = (code >> 7) << 7 | (half_b + (code & 7))
    high_q = ((code >> 6) & 1) << 7 | (half_b + ((code >> 3) & 7))
    return high_p << 8 | lo_byte, high_q << 8 | hi_byte


def coded_page_bytes(num_kv_heads: int, head_dim: int, raw_blocks: int) -> int:
    """Stored size of a coded page with ``raw_blocks`` raw blocks (metadata excluded)."""
    return 2 * num_kv_heads * page_head_bytes(head_dim) + PATCH_BYTES * raw_blocks


def stores_raw(raw_blocks: int, total_blocks: int) -> bool:
    """Whether a page with this many raw blocks is stored as a plain raw page instead of coded."""
    return raw_blocks >= total_blocks or raw_blocks > MAX_PATCHES


def ascii_map(head_dim: int, num_kv_heads: int) -> str:
    """A picture of one v3 page, for docs and error messages."""
    ph = page_head_bytes(head_dim)
    nb = blocks_per_page_head(head_dim)
    return "\n".join(
        [
            f"zipkv page format v3: head_dim {head_dim}, {num_kv_heads} KV heads, 16 tokens; "
            f"{nb} blocks of 16 tokens x 4 pairs per page-head",
            f"  raw page {2 * num_kv_heads * 32 * head_dim} B; coded page {2 * num_kv_heads * ph} B "
            f"+ 64 B per raw block (+{2 * num_kv_heads * nb} B metadata)",
            "  page: | K h0 | ... | K hH-1 | V h0 | ... | V hH-1 | patch 0 | ... | patch r-1 |",
            f"  page-head ({ph} B): | lo plane [16][{head_dim // 2}] u16 ({16 * head_dim} B) | "
            f"code plane {nb} x 64 B |",
            "  code block (64 B): [16 tokens][4 pairs], one code byte per pair",
            f"  meta per page-head ({nb} B): | m0 | m1 | ... |   m = b/2, 0x80|patch rank (raw block), "
            "0xFF raw page",
        ]
    )
