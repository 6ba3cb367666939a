"""The Hopper decode kernel's profiling stamps (its TIMING build, read by bench/kernels/bench_decode_hopper.py
--timing): when each program starts, when its first tile has landed and when it ends, and on which SM; with
even shares also when its second item starts and when that item's first tile has landed."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as ttgl

STAMP_COLUMNS = ttgl.constexpr(8)  # start, first tile, end, SM, second item's start and first tile, 2 spare


@gluon.jit
def stamp(timing_ptr, pid, k: ttgl.constexpr):
    """Profiling builds (TIMING): the global timer (ns) as event ``k`` of program ``pid`` (0: start, 1: its
    first tile landed, 2: done, 4: its second item starts, 5: that item's first tile landed) and, with
    event 0, the SM it runs on (column 3); int64 ``[programs, STAMP_COLUMNS]``."""
    one_l: ttgl.constexpr = ttgl.BlockedLayout([1], [32], [ttgl.num_warps()], [0])
    zero = ttgl.full([1], 0, ttgl.int32, layout=one_l)
    now = ttgl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l,r", [zero], dtype=ttgl.int64, is_pure=False, pack=1
    )
    row = timing_ptr + pid.to(ttgl.int64) * STAMP_COLUMNS + ttgl.arange(0, 1, layout=one_l)
    ttgl.store(row + k, now)
    if k == 0:
        sm = ttgl.inline_asm_elementwise(
            "mov.u32 $0, %smid;", "=r,r", [zero], dtype=ttgl.int32, is_pure=False, pack=1
        )
        ttgl.store(row + 3, sm.to(ttgl.int64))
