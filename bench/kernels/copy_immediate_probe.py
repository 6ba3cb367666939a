"""How far from a register a ``cp.async`` source may be on sm_90 (Gluon, Triton 3.6.0, compiled offline): the
byte offsets ptxas folds into the copy's immediate, and those it adds to the address first.

The Hopper decode kernel copies V's lo plane from K's addresses plus ``H * 24 * D`` bytes
(kernels/attention/hopper/ring.py). Whether that costs nothing or a 64-bit add per chunk (two instructions)
depends on the immediate's range. A loop here copies one chunk a thread from ``p`` and a second from
``p + offset``; reported, for each offset, the second copy's SASS and whether it reuses the first's address
register with the offset as its immediate.

    python -m bench.kernels.copy_immediate_probe [--offsets 128,2032,2048,-2048,-2064,24576] [--json]

Run it with Triton 3.6.0 (scripts/setup.sh's .cache/gluon-venv).
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from triton.experimental import gluon
from triton.experimental.gluon import language as ttgl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from bench.kernels.hopper_resources import compile_gluon, sass_of

_LDGSTS = re.compile(r"LDGSTS\S* \[[^]]*\], desc\[\w+\]\[(R\d+)\.64(?:\+(-?0x[0-9a-f]+))?\]")


@gluon.jit
def _two_copies_kernel(src_ptr, out_ptr, locs_ptr, n, OFFSET: ttgl.constexpr):
    """Per step, one 16-byte chunk a thread from a page at ``locs[i]`` and one from OFFSET bytes further."""
    cp_l: ttgl.constexpr = ttgl.BlockedLayout([1, 16], [32, 1], [2, 1], [1, 0])
    sw_l: ttgl.constexpr = ttgl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    a = ttgl.allocate_shared_memory(ttgl.uint8, [64, 16], sw_l)
    b = ttgl.allocate_shared_memory(ttgl.uint8, [64, 16], sw_l)
    c = ttgl.arange(0, 64, layout=ttgl.SliceLayout(1, cp_l))[:, None]
    byte = ttgl.arange(0, 16, layout=ttgl.SliceLayout(0, cp_l))[None, :]
    acc = ttgl.zeros([64, 16], ttgl.int32, cp_l)
    for i in range(n):
        p = ttgl.multiple_of(src_ptr + ttgl.load(locs_ptr + i) + c * 16, [16, 16])
        async_copy.async_copy_global_to_shared(a, p + byte)
        async_copy.async_copy_global_to_shared(b, p + OFFSET + byte)
        async_copy.commit_group()
        async_copy.wait_group(0)
        acc += a.load(cp_l).to(ttgl.int32) + b.load(cp_l).to(ttgl.int32)
    ttgl.store(out_ptr + c * 16 + byte, acc)


def probe(offset: int) -> dict[str, Any]:
    """The loop's two copies at ``offset``: their address registers and immediates."""
    sig = {"src_ptr": "*u8", "out_ptr": "*i32", "locs_ptr": "*i64", "n": "i32", "OFFSET": "constexpr"}
    attrs = {(0,): [["tt.divisibility", 16]]}
    k = compile_gluon(_two_copies_kernel, sig, {(4,): offset}, attrs, {"num_warps": 2})
    copies = [(m.group(1), int(m.group(2) or "0", 16)) for m in _LDGSTS.finditer(sass_of(k.asm["cubin"]))]
    # The loop is unrolled once by ptxas: the first pair of copies stands for every pair.
    (reg_a, imm_a), (reg_b, imm_b) = copies[0], copies[1]
    folded = reg_a == reg_b and imm_b - imm_a == offset
    return {"offset": offset, "folded": folded, "immediate": imm_b, "same_register": reg_a == reg_b}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--offsets",
        default="128,2032,2048,-2048,-2064,24576",
        help="bytes past the first copy (multiples of 16)",
    )
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = [probe(int(o)) for o in a.offsets.split(",")]
    print(json.dumps(rows, indent=1) if a.json else "\n".join(json.dumps(r) for r in rows))


if __name__ == "__main__":
    main()
