"""Registers, spills, shared memory and instruction counts of the Hopper decode kernel, compiled offline.

Compiles kernels/attention/hopper/decode.py for sm_90 on any machine (no GPU) with Triton's bundled ptxas, the
way the GPU machine compiles it; run it with the GPU machine's Triton (3.6.0, whose Gluon API the kernel is
written against) to get the figures the H200 reports. SASS counts come from the cubin (cuobjdump in Triton's
package): the instructions of the main loop, by opcode, say what a tile costs before any GPU time is spent.

    python -m bench.kernels.hopper_resources [--head-dims 128] [--pages 4] [--stages 3] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget

from bench.kernels.sass_loops import coded_tile, loop_local_accesses, opcode_counts, producer_loop
from zipkv.kernels.attention.hopper import decode as dh
from zipkv.kernels.attention.hopper import launch
from zipkv.kernels.attention.hopper import specialized as sp
from zipkv.kernels.attention.hopper.ring import NUM_WARPS

ARG_TYPES = {
    "q_ptr": "*bf16",
    "out_ptr": "*bf16",
    "o_part_ptr": "*fp32",
    "lse_part_ptr": "*fp32",
    "heap_ptr": "*u8",
    "heap16_ptr": "*i16",
    "page_loc_ptr": "*i64",
    "meta_ptr": "*u8",
    "page_ids_ptr": "*i32",
    "work_ptr": "*i32",
    "num_splits_ptr": "*i32",
    "program_items_ptr": "*i32",
    "qk_scale": "fp32",
    "stride_qb": "i32",
    "stride_qh": "i32",
    "stride_ob": "i32",
    "stride_oh": "i32",
    "timing_ptr": "*i64",
}


def compile_hopper(
    head_dim: int,
    pages: int,
    stages: int,
    group: int = 4,
    kv_heads: int = 8,
    split: bool = True,
    compressed: bool = True,
    arch: int = 90,
    maxnreg: int | None = None,
    num_warps: int = NUM_WARPS,
    warp_softmax: bool = False,
    lazy_rescale: bool = False,
    lean: bool = False,
    even_shares: bool = False,
    producer: bool = False,
    prepass: bool = False,
):  # type: ignore[no-untyped-def]
    """``producer``: hopper/specialized.py's kernel (four consumer warps, capped as its launch caps it);
    ``prepass``: with the pre-pass on its producer warps (PREPASS)."""
    fn = sp._decode_hopper_producer_kernel if producer else dh._decode_hopper_kernel
    del compressed  # one kernel reads coded and raw pages
    regs = launch.register_cap(maxnreg, head_dim, num_warps)  # as the launch does
    if producer:
        regs = maxnreg or sp.PRODUCER_MAXNREG
    const = launch.hopper_constexprs(
        kv_heads, group, head_dim, pages, stages, split, warp_softmax=warp_softmax, lazy_rescale=lazy_rescale,
        lean=lean, pad_hi=launch.pads_hi(group, lean),
    )  # fmt: skip
    const = {**const, "EVEN_SHARES": even_shares, "PREPASS": prepass}
    const = {n: v for n, v in const.items() if n in fn.arg_names}
    signature = {n: ARG_TYPES.get(n, "constexpr") for n in fn.arg_names}
    constexprs = {(i,): const[n] for i, n in enumerate(fn.arg_names) if n in const}
    aligned = {n for n in ARG_TYPES if ARG_TYPES[n].startswith("*") or n.startswith("stride")}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if n in aligned}
    options: dict[str, int] = {"num_warps": num_warps, **({"maxnreg": regs} if regs else {})}
    return compile_gluon(fn, signature, constexprs, attrs, options, arch)


def compile_gluon(fn, signature, constexprs, attrs, options, arch=90):  # type: ignore[no-untyped-def]
    """A Gluon kernel compiled offline for sm_<arch>, no GPU needed (this and the offline probes)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    src = GluonASTSource(fn, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def _tool(name: str) -> str:
    import triton.backends.nvidia as nv

    path = os.path.join(os.path.dirname(nv.__file__), "bin", name)
    if os.path.exists(path) and not os.access(path, os.X_OK):
        os.chmod(path, 0o755)  # the wheel may ship it without the executable bit
    return path


def sass_of(cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([_tool("cuobjdump"), "-sass", f.name], capture_output=True, text=True).stdout


def usage(cubin: bytes) -> dict[str, int]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        txt = subprocess.run(
            [_tool("cuobjdump"), "-res-usage", f.name], capture_output=True, text=True
        ).stdout
    m = re.search(r"REG:(\d+).*?STACK:(\d+).*?SHARED:(\d+)", txt)
    return {"registers": int(m.group(1)), "stack_bytes": int(m.group(2))} if m else {}


def report(
    head_dim: int,
    pages: int,
    stages: int,
    compressed: bool = True,
    maxnreg: int | None = None,
    num_warps: int = NUM_WARPS,
    warp_softmax: bool = False,
    lazy_rescale: bool = False,
    lean: bool = False,
    even_shares: bool = False,
    group: int = 4,
    producer: bool = False,
    prepass: bool = False,
) -> dict[str, object]:
    kernel = compile_hopper(
        head_dim, pages, stages, group=group, compressed=compressed, maxnreg=maxnreg, num_warps=num_warps,
        warp_softmax=warp_softmax, lazy_rescale=lazy_rescale, lean=lean, even_shares=even_shares,
        producer=producer, prepass=prepass,
    )  # fmt: skip
    sass = sass_of(kernel.asm["cubin"])
    ptx = kernel.asm["ptx"]
    return {
        "head_dim": head_dim,
        "pages_per_tile": pages,
        "stages": stages,
        "num_warps": num_warps,
        "warp_softmax": warp_softmax,
        "lazy_rescale": lazy_rescale,
        "lean": lean,
        "even_shares": even_shares,
        "producer": producer,
        "prepass": prepass,
        "group": group,
        "compressed": compressed,
        "shared_bytes": kernel.metadata.shared,
        **usage(kernel.asm["cubin"]),
        "sass_instructions": sum(opcode_counts(sass).values()),
        "loop_local_accesses": loop_local_accesses(sass),
        "coded_tile": coded_tile(sass),
        **({"producer_loop": producer_loop(sass), "setmaxnreg": setmaxnreg(ptx)} if producer else {}),
        "sass_ops": opcode_counts(sass),
        "ptx_cp_async": len(re.findall(r"cp\.async\.c[ag]", ptx)),
        "ptx_ldmatrix": len(re.findall(r"ldmatrix", ptx)),
        "ptx_ld_shared": len(re.findall(r"ld\.shared", ptx)),
        "ptx_st_shared": len(re.findall(r"st\.shared", ptx)),
        "ptx_mma": len(re.findall(r"mma\.sync", ptx)),
        "ptx_prmt": len(re.findall(r"prmt\.", ptx)),
    }


def setmaxnreg(ptx: str) -> dict[str, list[int]]:
    """The registers each partition of a warp-specialized kernel asks for (``setmaxnreg.inc`` / ``.dec``)."""
    found = re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)
    return {way: sorted({int(n) for w, n in found if w == way}) for way in ("inc", "dec")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dims", default="128")
    ap.add_argument("--pages", default="4", help="pages per tile (tile = 16 x pages tokens)")
    ap.add_argument("--stages", default="3")
    ap.add_argument("--twin", action="store_true", help="also the uncompressed twin")
    ap.add_argument(
        "--maxnreg", type=int, default=None, help="registers per thread (default: the launch's; 0: none)"
    )
    ap.add_argument("--warps", default=str(NUM_WARPS), help="warps per program, e.g. 1,2,4")
    ap.add_argument("--warp-softmax", action="store_true", help="one softmax per warp (warp_softmax.py)")
    ap.add_argument(
        "--lazy-rescale", action="store_true", help="skip the rescale of tiles where no row max grew"
    )
    ap.add_argument("--lean", action="store_true", help="the lean tile (hopper/lean.py)")
    ap.add_argument(
        "--even-shares", action="store_true", help="programs that run several work items (program_items)"
    )
    ap.add_argument(
        "--producer", action="store_true", help="the kernel with a producer partition (hopper/specialized.py)"
    )
    ap.add_argument("--prepass", action="store_true", help="--producer: the pre-pass on the producer warps")
    ap.add_argument("--group", type=int, default=4, help="query heads per KV head (at most 16)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--dump", default=None, help="folder for .ptx/.sass/.ttgir of each variant")
    a = ap.parse_args()
    rows = []
    warp_counts = [int(x) for x in a.warps.split(",")]
    for d in (int(x) for x in a.head_dims.split(",")):
        for p in (int(x) for x in a.pages.split(",")):
            for s in (int(x) for x in a.stages.split(",")):
                for comp, w in itertools.product((True, False) if a.twin else (True,), warp_counts):
                    r = report(
                        d, p, s, comp, a.maxnreg, w, a.warp_softmax, a.lazy_rescale, a.lean, a.even_shares,
                        a.group, a.producer, a.prepass,
                    )  # fmt: skip
                    rows.append(r)
                    if a.dump:
                        os.makedirs(a.dump, exist_ok=True)
                        k = compile_hopper(
                            d, p, s, group=a.group, compressed=comp, num_warps=w, warp_softmax=a.warp_softmax,
                            lazy_rescale=a.lazy_rescale, lean=a.lean, even_shares=a.even_shares,
                            producer=a.producer, prepass=a.prepass,
                        )  # fmt: skip
                        tag = f"d{d}_p{p}_s{s}_w{w}_{'c' if comp else 't'}"
                        for ext in ("ptx", "ttgir"):
                            with open(os.path.join(a.dump, f"{tag}.{ext}"), "w") as f:
                                f.write(k.asm[ext])
                        with open(os.path.join(a.dump, f"{tag}.sass"), "w") as f:
                            f.write(sass_of(k.asm["cubin"]))
                    if not a.json:
                        brief = {k: v for k, v in r.items() if k != "sass_ops"}
                        print(json.dumps(brief), flush=True)
    if a.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
