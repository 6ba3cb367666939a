"""What a TMA copy costs a decode tile in Gluon (Triton 3.6.0) on sm_90, compiled offline: the boxes a page
can be copied in, and the instructions and CTA barriers one copy adds to a loop that is not warp-specialized.

The Hopper decode kernel copies a tile with ``cp.async``, one 16-byte chunk a thread and instruction (91
instructions a coded tile at head_dim 128, docs/benchmarks.md). A TMA copy moves a whole box with one
instruction, and its 128-byte swizzle is close to the kernel's own. A minimal loop of the kernel's kind is
compiled here: the heap seen as rows of 128 bytes (a tensor descriptor over it), one box of ``--rows`` rows a
tile into a two-slot ring with an mbarrier each, and an MMA operand loaded from the box (bf16, the swizzled
layout) with ``ldmatrix``. Reported: whether the box shape compiles, and the loop's SASS (``UTMALDG``, CTA
barriers, ``ldmatrix``, all instructions).

    python -m bench.kernels.tma_probe [--rows 8,16,24,32] [--json]

Run it with Triton 3.6.0 (scripts/setup.sh's .cache/gluon-venv).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from triton.experimental import gluon
from triton.experimental.gluon import language as ttgl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from bench.kernels.hopper_resources import compile_gluon, sass_of
from bench.kernels.sass_loops import instructions, loops, opcode_counts


@gluon.jit
def _tma_ring_kernel(desc, out_ptr, rows_ptr, n_tiles, ROWS: ttgl.constexpr):
    """Per tile, 16 rows (or one box of more) in boxes of ROWS rows, then P V over the first 16."""
    TILE: ttgl.constexpr = 16 if ROWS < 16 else ROWS
    box_l: ttgl.constexpr = ttgl.NVMMASharedLayout(128, 8, 2)
    bf16_l: ttgl.constexpr = ttgl.NVMMASharedLayout(128, 16, 2)  # the same bytes, seen as bf16
    buf = ttgl.allocate_shared_memory(ttgl.uint8, [2, TILE, 128], box_l)
    bar = ttgl.allocate_shared_memory(ttgl.int64, [2, 1], mbarrier.MBarrierLayout())
    for s0 in ttgl.static_range(2):
        mbarrier.init(bar.index(s0), count=1)
    mma: ttgl.constexpr = ttgl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 2],
                                                      instr_shape=[16, 8])  # fmt: skip
    a_l: ttgl.constexpr = ttgl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_l: ttgl.constexpr = ttgl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    acc = ttgl.zeros([16, 64], ttgl.float32, mma)
    p = ttgl.full([16, 16], 1.0, ttgl.bfloat16, a_l)
    for i in range(n_tiles):
        s = i % 2
        row = ttgl.load(rows_ptr + i)  # a page's first row in the heap: any row, as a page table gives
        mbarrier.expect(bar.index(s), TILE * 128)
        for j in ttgl.static_range(TILE // ROWS):
            tma.async_copy_global_to_shared(desc, [row + j * ROWS, 0], bar.index(s),
                                            buf.index(s).slice(j * ROWS, ROWS, dim=0))  # fmt: skip
        mbarrier.wait(bar.index(s), (i // 2) & 1)
        v = buf.index(s).slice(0, 16, dim=0)._reinterpret(ttgl.bfloat16, [16, 64], bf16_l).load(b_l)
        acc = mma_v2(p, v, acc)  # P V over 16 tokens, as the kernel's PV
    r = ttgl.arange(0, 16, layout=ttgl.SliceLayout(1, mma))[:, None]
    c = ttgl.arange(0, 64, layout=ttgl.SliceLayout(0, mma))[None, :]
    ttgl.store(out_ptr + r * 64 + c, acc)


def _tile_loop(sass: str) -> list[tuple[int, str]]:
    """The loop over tiles: the widest loop that holds the MMAs (the mbarrier wait's retry loop, placed
    after it, jumps back into it and is narrower: sass_loops' innermost rule would take that one)."""
    insts = instructions(sass)
    head, tail = max(loops(insts)[1], key=lambda span: span[1] - span[0])
    return [(a, t) for a, t in insts if head <= a <= tail]


def probe(rows: int) -> dict[str, Any]:
    """One box of ``rows`` x 128 bytes a tile: the loop's SASS counts, or the refusal."""
    sig = {"desc": f"tensordesc<u8[{rows},128],NVMMASharedLayout(128, 8, 2)>", "out_ptr": "*fp32",
           "rows_ptr": "*i32", "n_tiles": "i32", "ROWS": "constexpr"}  # fmt: skip
    attrs = {(1,): [["tt.divisibility", 16]], (2,): [["tt.divisibility", 16]]}
    try:
        k = compile_gluon(_tma_ring_kernel, sig, {(4,): rows}, attrs, {"num_warps": 2})
    except Exception as e:  # the refusal is the answer for this box
        return {"rows": rows, "compiles": False, "error": str(e).strip().splitlines()[-1][:200]}
    loop = _tile_loop(sass_of(k.asm["cubin"]))
    ops = opcode_counts("".join(f"/*{a:04x}*/ {txt};" for a, txt in loop))
    counted = ("UTMALDG", "BAR", "LDSM", "HMMA", "SYNCS", "MEMBAR", "FENCE")
    return {"rows": rows, "copies_a_tile": max(1, 16 // rows), "compiles": True,
            "loop_instructions": len(loop), **{op: ops.get(op, 0) for op in counted}}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="8,16,24,32", help="box rows of 128 bytes (24 coded, 32 raw)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = [probe(int(r)) for r in a.rows.split(",")]
    print(json.dumps(rows, indent=1) if a.json else "\n".join(json.dumps(r) for r in rows))


if __name__ == "__main__":
    main()
