"""The v1/v2 codec's rules for one value and one code byte (kernels/format/layout.py describes the format):
the single source of truth the torch reference and the tests follow. Pure Python.
"""

from __future__ import annotations

from .layout import EXPONENT_SPAN


def exponent_of(bits: int) -> int:
    """Biased 8-bit exponent of a bf16 bit pattern."""
    return (bits >> 7) & 0xFF


def block_base(exponents: list[int]) -> int | None:
    """``b`` for a block (smallest exponent rounded down to even), or None when it does not fit 4 bits."""
    b = min(exponents) & ~1
    return b if max(exponents) - b < EXPONENT_SPAN else None


def code_nibble(bits: int, b: int) -> tuple[int, int]:
    """(sign, d) of one value of a compressible block with base ``b``."""
    return bits >> 15, (exponent_of(bits) - b) >> 1


def restore_high_byte(sign: int, d: int, half_b: int) -> int:
    """High byte of a bf16 value from its code: never carries, as ``half_b + d <= 127``."""
    return (sign << 7) | (half_b + d)


def pack_code_byte(lo: tuple[int, int], hi: tuple[int, int]) -> int:
    """Code byte of a pair: ``lo`` = (sign, d) of value (t, k), ``hi`` of value (t, k + C/2)."""
    return (lo[0] << 7) | (hi[0] << 6) | (hi[1] << 3) | lo[1]
