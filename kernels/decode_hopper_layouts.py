"""Shared-memory views of the Hopper decode kernel (kernels/decode_hopper.py): pure Python, no triton.

A tile of ``NP`` pages lands in shared memory per KV side (K or V) in two buffers, ``A`` ([NP, 16 D]
bytes) and ``C`` ([2, NP, 8 D] bytes), filled by the producer's copies (decode_hopper.py says which page
bytes go where). The consumer reads them through *views*: a logical tensor shape (tokens ``n`` of the
tile, pairs ``p``) and, for every logical element, its offset in the buffer. Each view here is given as
that forward map (logical -> offset, an XOR-linear function of the index bits, as every swizzle here is);
:func:`offset_bases` turns it into the ``offset_bases`` of a Gluon ``SharedLinearLayout`` (offset bit ->
logical coordinate), which is the map's inverse over GF(2).

Swizzles (why they are here): ``ldmatrix`` reads 8 rows of 16 bytes; rows of one lo plane are ``D`` bytes
apart, so without a swizzle the 8 rows hit the same banks. ``swizzle_chunk(t)`` XORs the 16-byte chunk
index of row ``t``. Code and patch words: threads of a warp read one 32-bit word each from blocks
``4kc + q`` (K) or pairs ``8nc + g`` (V); blocks whose ``(G >> 1) & 1`` is set have their 16-byte chunks
swapped pairwise so those reads spread over all 32 banks. The producer applies the same permutations
when it picks the source of each 16-byte chunk, so stored pages stay in the format's order.
"""

from __future__ import annotations

from collections.abc import Callable

from . import layout_v3 as v3


def log2(x: int) -> int:
    if x <= 0 or x & (x - 1):
        raise ValueError(f"{x} is not a power of two")
    return x.bit_length() - 1


def swizzle_chunk(token: int, head_dim: int) -> int:
    """XOR applied to the 16-byte chunk index of row ``token`` of a [16][D/2] u16 plane."""
    chunks = head_dim // 16  # 16-byte chunks per row (D bytes)
    rows_per_line = max(1, 8 // chunks)  # rows sharing one 128-byte line of banks
    return (token // rows_per_line) % min(chunks, 8)


def block_swap(block: int) -> int:
    """XOR applied to the 16-byte chunk index (0..3) inside a block's 64 code (or patch) bytes."""
    return 2 * ((block >> 1) & 1)


def lo_offset(page: int, token: int, pair: int, head_dim: int) -> int:
    """u16 offset of (page, token, pair) in buffer A: the lo plane (coded) or channels < D/2 (raw)."""
    half = head_dim // 2
    chunk = (pair // 8) ^ swizzle_chunk(token, head_dim)
    return page * 16 * half + token * half + chunk * 8 + pair % 8


def raw_b_offset(pages: int, page: int, token: int, pair: int, head_dim: int) -> int:
    """bf16 offset of raw channel ``pair + D/2`` of (page, token) in buffer C (rows 8h..8h+7 in C[h])."""
    half = head_dim // 2
    chunk = (pair // 8) ^ swizzle_chunk(token, head_dim)
    return ((token // 8) * pages + page) * 8 * half + (token % 8) * half + chunk * 8 + pair % 8


def code_offset(kv: int, page: int, token: int, pair: int, head_dim: int) -> int:
    """Byte offset of (page, token, pair)'s code (or patch) byte in C[0] (or C[1]), swizzled."""
    block, j = v3.block_of_pair(pair)
    inner = 4 * token + j if kv == 0 else 16 * j + v3.TOKEN_ORDER[token]
    chunk = (inner // 16) ^ block_swap(block)
    return page * 8 * head_dim + block * v3.CODE_BLOCK_BYTES + chunk * 16 + inner % 16


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


# ---- the kernel's views (logical shapes: K [D/2 pairs, N tokens], V [N tokens, D/2 pairs]) ---------


def _split(n: int) -> tuple[int, int]:
    return n // 16, n % 16


def lo_view(kv: int, pages: int, head_dim: int) -> list[list[int]]:
    half, n = head_dim // 2, 16 * pages
    if kv == 0:
        return offset_bases([half, n], lambda p, t: lo_offset(*_split(t), p, head_dim))
    return offset_bases([n, half], lambda t, p: lo_offset(*_split(t), p, head_dim))


def raw_b_view(kv: int, pages: int, head_dim: int) -> list[list[int]]:
    half, n = head_dim // 2, 16 * pages
    if kv == 0:
        return offset_bases([half, n], lambda p, t: raw_b_offset(pages, *_split(t), p, head_dim))
    return offset_bases([n, half], lambda t, p: raw_b_offset(pages, *_split(t), p, head_dim))


def code_view(kv: int, pages: int, head_dim: int) -> list[list[int]]:
    half, n = head_dim // 2, 16 * pages
    if kv == 0:
        return offset_bases([half, n], lambda p, t: code_offset(0, *_split(t), p, head_dim))
    return offset_bases([n, half], lambda t, p: code_offset(1, *_split(t), p, head_dim))
