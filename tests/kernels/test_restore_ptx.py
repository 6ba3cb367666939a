"""The PTX restore programs of the decode kernel, run by a small emulator of the PTX they use, against the
plain-integer restore: every byte selector and mask is checked on the CPU, where inline assembly cannot run.

Operands are packed as Triton packs them for ``tl.inline_asm_elementwise(pack=4)``: four 8-bit values per
32-bit register (value j in byte j), two 16-bit values per register (value j in bits 16j..16j+15).
"""

from __future__ import annotations

import random
import re

import pytest

from zipkv.kernels.attention.tiles import _RESTORE_PTX
from zipkv.kernels.attention.tiles_paired import _RESTORE_PAIRED_PTX
from zipkv.kernels.attention.tiles_v3 import _RESTORE_V3_PTX

MASK = 0xFFFFFFFF


def _byte(x: int, i: int) -> int:
    return (x >> (8 * i)) & 0xFF


def _prmt(a: int, b: int, sel: int) -> int:
    pool = a | (b << 32)
    out = 0
    for i in range(4):
        s = (sel >> (4 * i)) & 0xF
        v = (pool >> (8 * (s & 7))) & 0xFF
        if s & 8:  # sign-replicate mode: the selected byte's top bit fills the byte
            v = 0xFF if v & 0x80 else 0
        out |= v << (8 * i)
    return out


def _lop3(a: int, b: int, c: int, lut: int) -> int:
    out = 0
    for bit in range(32):
        idx = (((a >> bit) & 1) << 2) | (((b >> bit) & 1) << 1) | ((c >> bit) & 1)
        out |= ((lut >> idx) & 1) << bit
    return out


def run_ptx(text: str, operands: dict[str, int]) -> dict[str, int]:
    """Run the straight-line PTX of a restore program over 32-bit registers."""
    regs = dict(operands)

    def val(tok: str) -> int:
        tok = tok.strip()
        return int(tok, 16) if tok.startswith("0x") else int(tok) if tok.isdigit() else regs[tok]

    for line in text.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        d, *src = [t.strip() for t in args.split(",")]
        x = [val(t) for t in src]
        if op == "prmt.b32":
            regs[d] = _prmt(x[0], x[1], x[2])
        elif op == "lop3.b32":
            regs[d] = _lop3(x[0], x[1], x[2], x[3])
        elif op == "and.b32":
            regs[d] = x[0] & x[1]
        elif op == "add.u32":
            regs[d] = (x[0] + x[1]) & MASK
        elif op == "shr.b32":
            regs[d] = x[0] >> x[1]
        elif op == "shl.b32":
            regs[d] = (x[0] << x[1]) & MASK
        else:
            raise AssertionError(f"the emulator does not know {op!r}: extend it with the PTX ISA's meaning")
    return regs


def pack8(v: list[int]) -> int:
    return v[0] | (v[1] << 8) | (v[2] << 16) | (v[3] << 24)


def pack16(v: list[int]) -> tuple[int, int]:
    return v[0] | (v[1] << 16), v[2] | (v[3] << 16)


def unpack16(lo: int, hi: int) -> list[int]:
    return [lo & 0xFFFF, lo >> 16, hi & 0xFFFF, hi >> 16]


def restore_int(low: int, code: int, marker: int, raw: int, second: bool) -> int:
    """The plain-integer restore of one value (attention/tiles.py's `_restore`, its interpreter path)."""
    if marker == 0xFF:
        return raw
    d = (code >> 3) & 7 if second else code & 7
    sign = (code >> 6) & 1 if second else code >> 7
    return (((sign << 7) | (d + (marker & 0x7F))) << 8) | low


def cases(n: int, seed: int) -> list[tuple[list[int], list[int], list[int], list[int], list[int], int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        marker = rng.choice([0xFF, rng.randrange(0, 121)])  # b/2 + d <= 127: d <= 7
        lo_a = [rng.randrange(256) for _ in range(4)]
        lo_b = [rng.randrange(256) for _ in range(4)]
        code = [rng.randrange(256) for _ in range(4)]
        raw_a = [rng.randrange(65536) for _ in range(4)]
        raw_b = [rng.randrange(65536) for _ in range(4)]
        out.append((lo_a, lo_b, code, raw_a, raw_b, marker))
    return out


def regs(text: object) -> str:
    return str(getattr(text, "value", text))


@pytest.mark.parametrize("seed", range(4))
def test_v1_restore_ptx_equals_the_integer_restore(seed: int) -> None:
    for lo_a, lo_b, code, raw_a, raw_b, marker in cases(200, seed):
        ops = {"$4": pack8(lo_a), "$5": pack8(lo_b), "$6": pack8(code), "$7": pack8([marker] * 4)}
        ops["$8"], ops["$9"] = pack16(raw_a)
        ops["$10"], ops["$11"] = pack16(raw_b)
        r = run_ptx(regs(_RESTORE_PTX), ops)
        assert unpack16(r["$0"], r["$1"]) == [
            restore_int(lo_a[j], code[j], marker, raw_a[j], False) for j in range(4)
        ]
        assert unpack16(r["$2"], r["$3"]) == [
            restore_int(lo_b[j], code[j], marker, raw_b[j], True) for j in range(4)
        ]


@pytest.mark.parametrize("seed", range(4))
def test_v2_restore_ptx_equals_the_integer_restore(seed: int) -> None:
    for lo_a, lo_b, code, raw_a, raw_b, marker in cases(200, seed):
        # v2: one 16-bit word per channel pair: lo(k) | lo(k + D/2) << 8 (compressed) or bf16(k) (raw)
        pair = raw_a if marker == 0xFF else [lo_a[j] | (lo_b[j] << 8) for j in range(4)]
        ops = {"$8": pack8(code), "$9": pack8([marker] * 4)}
        ops["$4"], ops["$5"] = pack16(pair)
        ops["$6"], ops["$7"] = pack16(raw_b)
        r = run_ptx(regs(_RESTORE_PAIRED_PTX), ops)
        assert unpack16(r["$0"], r["$1"]) == [
            restore_int(lo_a[j], code[j], marker, raw_a[j], False) for j in range(4)
        ]
        assert unpack16(r["$2"], r["$3"]) == [
            restore_int(lo_b[j], code[j], marker, raw_b[j], True) for j in range(4)
        ]


def restore_v3_int(pair: int, raw_b: int, code: int, marker: int, patch: int, second: bool) -> int:
    """One value of page format v3 (format/layout_v3.py), written from the format's rules: a raw page's value
    is its bf16 word; a raw block's high byte is the code byte (channel p) or the patch byte (channel p +
    D/2); a coded block's is sign << 7 | (b/2 + d)."""
    if marker == 0xFF:
        return raw_b if second else pair
    low = pair >> 8 if second else pair & 0xFF
    if marker & 0x80:
        return ((patch if second else code) << 8) | low
    d = (code >> 3) & 7 if second else code & 7
    sign = (code >> 6) & 1 if second else code >> 7
    return (((sign << 7) | (d + marker)) << 8) | low


@pytest.mark.parametrize("seed", range(4))
def test_v3_restore_ptx_equals_the_format_rules(seed: int) -> None:
    rng = random.Random(100 + seed)
    for _ in range(400):
        # per value: raw page (0xFF), raw block (0x80 | patch rank 0..126) or coded block (b/2 + d <= 127)
        marker = [rng.choice([0xFF, 0x80 | rng.randrange(127), rng.randrange(121)]) for _ in range(4)]
        pair, raw_b = [rng.randrange(65536) for _ in range(4)], [rng.randrange(65536) for _ in range(4)]
        code, patch = [rng.randrange(256) for _ in range(4)], [rng.randrange(256) for _ in range(4)]
        ops = {"$8": pack8(code), "$9": pack8(marker), "$10": pack8(patch)}
        ops["$4"], ops["$5"] = pack16(pair)
        ops["$6"], ops["$7"] = pack16(raw_b)
        r = run_ptx(regs(_RESTORE_V3_PTX), ops)
        for half, outs in ((False, ("$0", "$1")), (True, ("$2", "$3"))):
            want = [restore_v3_int(pair[j], raw_b[j], code[j], marker[j], patch[j], half) for j in range(4)]
            assert unpack16(r[outs[0]], r[outs[1]]) == want, (marker, half)


def test_the_emulator_knows_the_sign_replicate_and_lut_conventions() -> None:
    # prmt: selector nibble 8 replicates byte 0's top bit; lop3 LUT 0xD8 is "c ? b : a" (F0/CC/AA rule).
    # The v1 program, which the GPU tests check against the integer restore on the H200, passing here
    # (above) is what ties this emulator to the hardware.
    assert _prmt(0x80, 0, 0x9988) == 0x0000FFFF and _prmt(0x7F, 0, 0x8888) == 0
    assert _lop3(0x0F0F0F0F, 0xFFFF0000, 0x00FF00FF, 0xD8) == 0x0FFF0F00
    assert re.search(r"prmt\.b32 \$0", regs(_RESTORE_PAIRED_PTX))


def test_codec_v2_unpair_selectors_split_pair_words_like_the_integer_path() -> None:
    """restore._unpair (kernels/codec/restore.py): its two prmt selectors against the shifts and masks the
    interpreter runs."""
    import inspect

    from zipkv.kernels.codec import restore

    src = inspect.getsource(restore._unpair.fn)
    sel_a, sel_b = (int(x, 16) for x in re.findall(r"prmt\.b32 \$0, \$1, \$2, (0x[0-9A-Fa-f]+);", src))
    rng = random.Random(9)
    for _ in range(500):
        p0, p1 = rng.getrandbits(32), rng.getrandbits(32)
        a = (p0 & 0xFF) | ((p0 >> 8) & 0xFF00) | ((p1 & 0xFF) << 16) | ((p1 << 8) & 0xFF000000)
        b = ((p0 >> 8) & 0xFF) | ((p0 >> 16) & 0xFF00) | ((p1 << 8) & 0xFF0000) | (p1 & 0xFF000000)
        assert _prmt(p0, p1, sel_a) == a and _prmt(p0, p1, sel_b) == b
        # and both are what v2 means: the low bytes of channels k..k+3, then of k + C/2 ..
        assert [_byte(a, i) for i in range(4)] == [_byte(p0, 0), _byte(p0, 2), _byte(p1, 0), _byte(p1, 2)]
        assert [_byte(b, i) for i in range(4)] == [_byte(p0, 1), _byte(p0, 3), _byte(p1, 1), _byte(p1, 3)]
