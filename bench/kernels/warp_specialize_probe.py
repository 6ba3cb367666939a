"""What Gluon's warp specialization (Triton 3.6.0, ``ttgl.warp_specialize``) gives a decode program on sm_90,
compiled offline: the warps a kernel runs and the registers each partition gets.

The Hopper decode kernel spends about a quarter of a coded tile's instructions on its producer work (copies
and table loads, docs/benchmarks.md). A producer warp of its own would take them off the warps that restore
and multiply. Whether that fits the kernel's occupancy (two warps a program, four programs an SM) is a
question of what the compiler allows, answered here before any kernel is written: a minimal ring of the
same kind (a ``cp.async`` producer partition signalling an mbarrier per slot, ``cp.async.mbarrier.arrive``;
a consumer partition waiting on it and releasing the slot) is compiled for each (consumer warps, producer
warps, register cap) asked, and the PTX's ``setmaxnreg`` values and thread count are read back. (Registers
a thread actually holds need the cubin's loader, that is a GPU; the launch's share is ``maxnreg``.)

    python -m bench.kernels.warp_specialize_probe [--consumers 2,4] [--producers 1] [--maxnreg 0,128] [--json]

Run it with Triton 3.6.0 (scripts/setup.sh's .cache/gluon-venv). A shape the compiler refuses is reported
with its error, not raised.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import tempfile
from typing import Any

from triton.experimental import gluon
from triton.experimental.gluon import language as ttgl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mbarrier

from bench.kernels.hopper_resources import compile_gluon

_ROWS = 32  # a slot: [32 tokens, 16 values] bf16, 1 KiB, one 16-byte chunk per producer thread and copy
_COLS = 16


@gluon.jit
def _consumer(buf, ready, empty, out_ptr, n_tiles, NW: ttgl.constexpr, ROWS: ttgl.constexpr,
              COLS: ttgl.constexpr):  # fmt: skip
    ld_l: ttgl.constexpr = ttgl.BlockedLayout([1, 4], [8, 4], [NW, 1], [1, 0])
    acc = ttgl.zeros([ROWS, COLS], ttgl.float32, ld_l)
    for i in range(n_tiles):
        s = i % 2
        mbarrier.wait(ready.index(s), (i // 2) & 1)
        x = buf.index(s).load(ld_l)
        mbarrier.arrive(empty.index(s))
        acc += x.to(ttgl.float32)
    r = ttgl.arange(0, ROWS, layout=ttgl.SliceLayout(1, ld_l))[:, None]
    c = ttgl.arange(0, COLS, layout=ttgl.SliceLayout(0, ld_l))[None, :]
    ttgl.store(out_ptr + r * COLS + c, acc)


@gluon.jit
def _producer(buf, ready, empty, in_ptr, n_tiles, NW: ttgl.constexpr, ROWS: ttgl.constexpr,
              COLS: ttgl.constexpr):  # fmt: skip
    cp_l: ttgl.constexpr = ttgl.BlockedLayout([1, 8], [16, 2], [NW, 1], [1, 0])
    r = ttgl.arange(0, ROWS, layout=ttgl.SliceLayout(1, cp_l))[:, None]
    c = ttgl.arange(0, COLS, layout=ttgl.SliceLayout(0, cp_l))[None, :]
    for i in range(n_tiles):
        s = i % 2
        # a slot is free once every consumer thread has arrived on it (not before its first use)
        mbarrier.wait(empty.index(s), ((i // 2) & 1) ^ 1, pred=i >= 2)
        async_copy.async_copy_global_to_shared(buf.index(s), in_ptr + i * (ROWS * COLS) + r * COLS + c)
        async_copy.mbarrier_arrive(ready.index(s), increment_count=False)


@gluon.jit
def _ring_kernel(in_ptr, out_ptr, n_tiles, CONSUMERS: ttgl.constexpr, PRODUCERS: ttgl.constexpr,
                 ROWS: ttgl.constexpr, COLS: ttgl.constexpr):  # fmt: skip
    sl: ttgl.constexpr = ttgl.SwizzledSharedLayout(8, 1, 1, [1, 0])
    buf = ttgl.allocate_shared_memory(ttgl.bfloat16, [2, ROWS, COLS], sl)
    bl: ttgl.constexpr = mbarrier.MBarrierLayout()
    ready = ttgl.allocate_shared_memory(ttgl.int64, [2, 1], bl)
    empty = ttgl.allocate_shared_memory(ttgl.int64, [2, 1], bl)
    for s in ttgl.static_range(2):
        mbarrier.init(ready.index(s), count=32 * PRODUCERS)
        # Gluon's mbarrier.arrive is a partition barrier, then one elected thread arrives: one arrival a slot
        mbarrier.init(empty.index(s), count=1)
    ttgl.warp_specialize(
        [
            (_consumer, (buf, ready, empty, out_ptr, n_tiles, CONSUMERS, ROWS, COLS)),
            (_producer, (buf, ready, empty, in_ptr, n_tiles, PRODUCERS, ROWS, COLS)),
        ],
        [PRODUCERS],
        [48],
    )


def _setmaxnreg(ptx: str, way: str) -> list[int]:
    return sorted({int(v) for v in re.findall(rf"setmaxnreg\.{way}\.sync\.aligned\.u32\s+(\d+)", ptx)})


def probe(consumers: int, producers: int, maxnreg: int) -> dict[str, Any]:
    """One shape: the kernel's threads and the ``setmaxnreg`` values its partitions run, or the compiler's
    refusal."""
    row: dict[str, Any] = {"consumer_warps": consumers, "producer_warps": producers, "maxnreg": maxnreg}
    sig = {"in_ptr": "*bf16", "out_ptr": "*fp32", "n_tiles": "i32"}
    names = list(_ring_kernel.arg_names)
    const = {"CONSUMERS": consumers, "PRODUCERS": producers, "ROWS": _ROWS, "COLS": _COLS}
    sig.update({n: "constexpr" for n in const})
    constexprs = {(names.index(n),): v for n, v in const.items()}
    attrs = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}
    options: dict[str, int] = {"num_warps": consumers, **({"maxnreg": maxnreg} if maxnreg else {})}
    with tempfile.TemporaryFile(mode="w+") as err:
        saved = os.dup(2)  # MLIR prints the reason on fd 2; the exception only says that parsing failed
        os.dup2(err.fileno(), 2)
        try:
            k = compile_gluon(_ring_kernel, sig, constexprs, attrs, options)
        except Exception:  # the refusal is the answer for this shape
            os.dup2(saved, 2)
            err.seek(0)
            reasons = [ln.split("error: ", 1)[1] for ln in err.read().splitlines() if "error: " in ln]
            return {**row, "compiles": False, "error": (reasons or ["(no reason printed)"])[0][:200]}
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    ptx = k.asm["ptx"]
    threads = re.search(r"\.reqntid (\d+)", ptx)
    row.update(
        compiles=True,
        threads=int(threads.group(1)) if threads else None,
        setmaxnreg_inc=_setmaxnreg(ptx, "inc"),
        setmaxnreg_dec=_setmaxnreg(ptx, "dec"),
        shared_bytes=k.metadata.shared,
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--consumers", default="2,4", help="warps of the default (consumer) partition")
    ap.add_argument("--producers", default="1", help="warps of the producer partition")
    ap.add_argument("--maxnreg", default="0,128", help="the kernel's register cap (0: none)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    shapes = itertools.product(*(map(int, v.split(",")) for v in (a.consumers, a.producers, a.maxnreg)))
    rows = [probe(c, p, m) for c, p, m in shapes]
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
