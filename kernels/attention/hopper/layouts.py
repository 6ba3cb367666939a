"""Shared-memory views of the Hopper decode kernel (attention/hopper/decode.py): pure Python, no triton.

A tile of ``NP`` pages lands in shared memory per KV side (K or V) in two buffers of ``[NP, 16 D]`` bytes:
``A`` holds a coded page-head's lo plane or a raw page-head's channels ``< D/2``; ``B`` holds a coded
page-head's code plane (bytes ``0 .. 8D``) and its raw blocks' patches (block G's at ``8D + 64 G``), which
the pre-pass turns into the high-byte-pair plane, or a raw page-head's channels ``>= D/2``. After that
every operand is one ``[16 tokens][D/2 pairs]`` array of 16-bit elements per page with the same order
(``lo_offset``), and the MMA operands load from it with ``ldmatrix``.

Each view is given as its forward map (logical index -> offset, XOR-linear in the index bits, as every
swizzle here is); :func:`offset_bases` turns it into the ``offset_bases`` of a Gluon ``SharedLinearLayout``
(offset bit -> logical coordinate), the map's inverse over GF(2).

Swizzle (why it is here): ``ldmatrix`` reads 8 rows of 16 bytes and rows of one plane are ``D`` bytes apart,
so without a swizzle the 8 rows hit the same banks; ``swizzle_chunk(t)`` XORs the 16-byte chunk index of
row ``t``. The producer applies it when it picks the source of each 16-byte chunk, so stored pages stay in
the format's order.
"""

from __future__ import annotations

from collections.abc import Callable


def log2(x: int) -> int:
    if x <= 0 or x & (x - 1):
        raise ValueError(f"{x} is not a power of two")
    return x.bit_length() - 1


def swizzle_chunk(token: int, head_dim: int) -> int:
    """XOR applied to the 16-byte chunk index of row ``token`` of a [16][D/2] u16 plane.

    Any 8 consecutive rows get distinct values (ldmatrix reads 8 rows). With rows of 128 bytes or more,
    rows t and t + 8 also differ in bit 1: the pre-pass stores rows t, t+4, t+8, t+12 of four blocks in
    one instruction, which then fall on disjoint banks."""
    chunks = head_dim // 16  # 16-byte chunks per row (D bytes)
    rows_per_line = max(1, 8 // chunks)  # rows sharing one 128-byte line of banks
    swz = (token // rows_per_line) % min(chunks, 8)
    if chunks >= 8:
        swz ^= (token // 8) % 2 * 2
    return swz


def lo_offset(page: int, token: int, pair: int, head_dim: int) -> int:
    """u16 offset of (page, token, pair) in buffer A: the lo plane (coded) or channels < D/2 (raw)."""
    half = head_dim // 2
    chunk = (pair // 8) ^ swizzle_chunk(token, head_dim)
    return page * 16 * half + token * half + chunk * 8 + pair % 8


def code_word_offset(page: int, block: int, token: int, half: int, head_dim: int) -> int:
    """u32 offset in buffer B of a coded page-head's code word (half 0) or patch word (half 1) of
    (block, token): the 4 code bytes of the block's pairs for that token (format/layout_v3.py)."""
    return page * 4 * head_dim + half * 2 * head_dim + block * 16 + token


def hi_word_offset(page: int, block: int, token: int, word: int, head_dim: int) -> int:
    """u32 offset of the high-byte pairs of pairs 4G + 2w, 4G + 2w + 1 of (page, token): the pre-pass's
    output, in the same order as the lo plane."""
    return lo_offset(page, token, 4 * block, head_dim) // 2 + word


def offset_bases(shape: list[int], forward: Callable[..., int]) -> list[list[int]]:
    """Gluon SharedLinearLayout offset_bases of a bijective XOR-linear view ``forward(*index) -> offset``.

    Column i of the forward matrix is the offset of logical unit vector i; the result lists, for each
    offset bit, the logical coordinate whose offset is exactly that bit (the inverse over GF(2)).
    """
    dims = [log2(s) for s in shape]
    nbits = sum(dims)
    cols: list[tuple[int, list[int]]] = []  # (offset of a logical basis vector, that vector's coordinates)
    for axis, bits in enumerate(dims):
        for b in range(bits):
            idx = [0] * len(shape)
            idx[axis] = 1 << b
            cols.append((forward(*idx), idx))
    if forward(*([0] * len(shape))) != 0:
        raise ValueError("a view must map index 0 to offset 0")
    # Gauss-Jordan over GF(2): reduce the columns to single offset bits, tracking logical combinations.
    offs = [off for off, _ in cols]
    coords = [list(coord) for _, coord in cols]
    if len(offs) != nbits:
        raise ValueError("view is not bijective: logical and offset bit counts differ")
    used: set[int] = set()
    for bit in range(nbits):
        pivot = next((i for i, o in enumerate(offs) if i not in used and o >> bit & 1), None)
        if pivot is None:
            raise ValueError(f"view is not bijective: no logical index reaches offset bit {bit}")
        used.add(pivot)
        for i in range(nbits):
            if i != pivot and offs[i] >> bit & 1:
                offs[i] ^= offs[pivot]
                coords[i] = [a ^ b for a, b in zip(coords[i], coords[pivot], strict=True)]
    bases: list[list[int] | None] = [None] * nbits
    for off, coord in zip(offs, coords, strict=True):
        bases[log2(off)] = coord
    return [b for b in bases if b is not None]


def check_view(shape: list[int], forward: Callable[..., int], bases: list[list[int]]) -> None:
    """Assert that ``bases`` reproduce ``forward`` on every index (used by the tests)."""
    import itertools

    for idx in itertools.product(*(range(s) for s in shape)):
        off = forward(*idx)
        coord = [0] * len(shape)
        for bit, basis in enumerate(bases):
            if off >> bit & 1:
                coord = [a ^ b for a, b in zip(coord, basis, strict=True)]
        if coord != list(idx):
            raise AssertionError(f"offset {off} decodes to {coord}, expected {list(idx)}")


# ---- the kernel's views ---------------------------------------------------------------------------


def operand_view(kv: int, pages: int, head_dim: int) -> list[list[int]]:
    """K ``[D/2 pairs, N tokens]`` or V ``[N tokens, D/2 pairs]``, 16-bit elements, over A or B."""
    half, n = head_dim // 2, 16 * pages
    if kv == 0:
        return offset_bases([half, n], lambda p, t: lo_offset(t // 16, t % 16, p, head_dim))
    return offset_bases([n, half], lambda t, p: lo_offset(t // 16, t % 16, p, head_dim))


def page_operand_view(kv: int, pages: int, head_dim: int) -> list[list[int]]:
    """The same operands split by page, for the per-warp softmax (warp w reads page w): K ``[NP, D/2 pairs,
    16 tokens]`` or V ``[NP, 16 tokens, D/2 pairs]``, 16-bit elements, over A or B."""
    half = head_dim // 2
    if kv == 0:
        return offset_bases([pages, half, 16], lambda g, p, t: lo_offset(g, t, p, head_dim))
    return offset_bases([pages, 16, half], lambda g, t, p: lo_offset(g, t, p, head_dim))


def code_words_view(pages: int, head_dim: int) -> list[list[int]]:
    """``[NP, D/8 blocks, 16 tokens, 2]`` u32 over B: (code word, patch word) of each block and token."""
    shape = [pages, head_dim // 8, 16, 2]
    return offset_bases(shape, lambda g, b, t, h: code_word_offset(g, b, t, h, head_dim))


def hi_words_view(pages: int, head_dim: int) -> list[list[int]]:
    """``[NP, D/8 blocks, 16 tokens, 2]`` u32 over B: where the pre-pass writes a block's high-byte pairs."""
    shape = [pages, head_dim // 8, 16, 2]
    return offset_bases(shape, lambda g, b, t, w: hi_word_offset(g, b, t, w, head_dim))


def p_exchange_offset(row: int, col: int, n: int) -> int:
    """u16 offset of P's element (row, token col) of a ``[16, n]`` tile in the lean tile's exchange buffer
    (hopper/lean.py). Offset bits in the order of the MMA A fragment's registers (col 1, row 8, col 8, 16,
    ...) then lanes (col 2, 4, row 1, 2, 4): a thread's A fragment is one contiguous run (two 128-bit
    loads at n = 32) and its share of S's accumulator 8 bytes per register pair. Rows g and g + 1 swap
    the col-16 half: the stores of lanes 4 apart then land on different banks (2-way, not 4-way)."""
    kb = log2(n) - 3  # token bits at or above 8: registers in both layouts (and warps in the accumulator's)
    regs = (col & 1) | (row >> 3 & 1) << 1 | (col >> 3) << 2
    off = regs | (col >> 1 & 3) << (2 + kb) | (row & 7) << (4 + kb)
    if kb >= 2:
        off ^= (row & 1) << 3
    return off


def p_exchange_view(n: int) -> list[list[int]]:
    """``[16, n]`` u16 over the lean tile's P buffer (:func:`p_exchange_offset`)."""
    return offset_bases([16, n], lambda r, c: p_exchange_offset(r, c, n))
