"""Registers, spills and load instructions of the decode kernel (and the v3 codec's) for a GPU target,
compiled on any machine.

The decode kernel's speed is set by how many programs fit on an SM, i.e. by its registers
(docs/benchmarks.md), so a change to it can be judged before it reaches the GPU: Triton compiles for
``sm_90`` here with its bundled ``ptxas`` and no GPU. With the GPU machine's Triton (3.6.0, e.g.
``pip install triton==3.6.0`` into a virtualenv made with ``--system-site-packages``) the figures equal
those the H200 reports (253 registers for v1's compressed kernel, 244 for v2's, 188 for the twin).
Other Triton versions allocate differently: at head_dim 128 (one warp, 32-token tiles) Triton 3.9 gives
v2 252 registers and v3 255 with 88 bytes of spill, where 3.6 gives 244 and 247 with none
(docs/benchmarks.md), so judge a change with 3.6.

    python -m bench.kernels.kernel_resources [--head-dim 128] [--configs 32:1:1,32:1:2] [--arch 90]
    python -m bench.kernels.kernel_resources --kernel codec [--configs 4,8]   # v3 encode/decode, num_warps
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

from zipkv.kernels.attention import decode as da
from zipkv.kernels.attention import extend as ea
from zipkv.kernels.codec import v3 as codec_v3
from zipkv.kernels.format.layout import PageFormat

_ARG_TYPES = {
    "q_ptr": "*bf16", "out_ptr": "*bf16", "o_part_ptr": "*fp32", "lse_part_ptr": "*fp32",
    "heap_u8": "*u8", "heap_bf16": "*bf16", "page_loc_ptr": "*i64", "meta32_ptr": "*i32",
    "page_ids_ptr": "*i32", "work_ptr": "*i32", "qk_scale": "fp32", "stride_qb": "i32", "stride_qh": "i32",
    "stride_ob": "i32", "stride_oh": "i32",
}  # fmt: skip
_STRIDES = {"stride_qb", "stride_qh", "stride_ob", "stride_oh"}
_ALIGNED = {n for n, t in _ARG_TYPES.items() if t.startswith("*")} | _STRIDES  # as Triton specialises them
_EXTEND_ARG_TYPES = {
    "q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "out_ptr": "*bf16", "heap_u8": "*u8",
    "heap_bf16": "*bf16", "page_loc_ptr": "*i64", "meta32_ptr": "*i32", "page_ids_ptr": "*i32",
    "page_indptr_ptr": "*i32", "prefix_lens_ptr": "*i32", "qo_indptr_ptr": "*i32", "block_req_ptr": "*i32",
    "block_first_ptr": "*i32", "qk_scale": "fp32",
    **{f"stride_{t}{d}": "i32" for t in "qkvo" for d in "th"},
}  # fmt: skip
_EXTEND_ALIGNED = {n for n in _EXTEND_ARG_TYPES if n != "qk_scale"}
_CODEC_ARG_TYPES = {
    "heap_i16": "*i16", "heap_u8": "*u8", "src_offsets": "*i64", "dst_offsets": "*i64", "offsets": "*i64",
    "meta_u8": "*u8", "sizes_out": "*i32", "out_i16": "*i16", "H": "i32",
}  # fmt: skip
_CODEC_ALIGNED = {n for n, t in _CODEC_ARG_TYPES.items() if t.startswith("*")}


@dataclass(frozen=True)
class Resources:
    variant: str
    registers: int
    spill_bytes: int
    shared_bytes: int
    global_loads: int  # ld.global instructions in the PTX
    vector_loads: int  # of those, 16-byte ones (ld.global.v4 of 32-bit words)
    vector_stores: int  # 16-byte st.global
    async_copies: int  # cp.async instructions (pipelined loads through shared memory)
    shared_stores: int  # st.shared: tiles moved to another register layout go through shared memory
    barriers: int  # bar.sync
    ldmatrix: int  # ldmatrix: tensor-core operands read from shared memory
    ptx_statements: int  # every ';' of the PTX: the static size of the program


def compile_decode_kernel(
    fmt: PageFormat,
    compressed: bool,
    block_n: int,
    num_warps: int,
    num_stages: int,
    arch: int = 90,
    group: int = 4,
    prefetch: bool = False,
) -> Resources:
    """Compile the decode kernel as `decode_attention` would launch it and read its resources."""
    # as a split launch on the GPU: the PTX restore, bf16 dots
    const = da.kernel_constexprs(fmt, group, block_n, True, compressed, True, False, prefetch)
    kernel = _compile(da._decode_kernel, const, _ARG_TYPES, _ALIGNED, arch, num_warps, num_stages)
    kind = (f"v{fmt.version} compressed" + (" prefetch" if prefetch else "")) if compressed else "twin"
    return _resources(
        kernel, f"{kind} head_dim {fmt.head_dim} block_n {block_n} warps {num_warps} stages {num_stages}"
    )


def compile_extend_kernel(
    fmt: PageFormat,
    compressed: bool,
    block_m: int,
    block_n: int,
    num_warps: int,
    arch: int = 90,
    group: int = 4,
) -> Resources:
    """Compile the extend kernel (kernels/attention/extend.py) as `extend_attention` launches it on a GPU."""
    plan = ea.ExtendPlan(fmt, fmt.num_kv_heads * group, *[torch.empty(0)] * 6, block_m, block_n, num_warps)  # type: ignore[arg-type]
    const = ea.extend_constexprs(plan, compressed, True, False)
    kernel = _compile(ea._extend_kernel, const, _EXTEND_ARG_TYPES, _EXTEND_ALIGNED, arch, num_warps, 1)
    kind = f"extend v{fmt.version} compressed" if compressed else "extend twin"
    return _resources(
        kernel, f"{kind} head_dim {fmt.head_dim} block_m {block_m} block_n {block_n} warps {num_warps}"
    )


def compile_codec_kernel(
    fmt: PageFormat, kind: str, num_warps: int, arch: int = 90, page_heads_per_program: int = 1
) -> Resources:
    """Compile page format v3's encode or decode kernel (kernels/codec/v3.py) as kernels/codec/pages.py
    launches it on a GPU (16-byte aligned pointers)."""
    if fmt.version < 3:
        raise ValueError(
            f"compile_codec_kernel compiles the v3 codec (kernels/codec/v3.py), got v{fmt.version}"
        )
    fn = codec_v3._encode_pages_v3_kernel if kind == "encode" else codec_v3._decode_pages_v3_kernel
    const = {"D": fmt.head_dim, "G": page_heads_per_program, "STREAM": False}
    kernel = _compile(fn, const, _CODEC_ARG_TYPES, _CODEC_ALIGNED, arch, num_warps, 1)
    return _resources(kernel, f"codec v3 {kind} head_dim {fmt.head_dim} warps {num_warps}")


def _compile(fn, const, arg_types, aligned, arch, num_warps, num_stages):  # type: ignore[no-untyped-def]
    if not isinstance(fn, JITFunction):  # TRITON_INTERPRET=1 at import made it an interpreted function
        raise RuntimeError("the kernels were built for Triton's interpreter: run with TRITON_INTERPRET unset")
    signature = {n: arg_types.get(n, "constexpr") for n in fn.arg_names}
    constexprs = {(i,): const[n] for i, n in enumerate(fn.arg_names) if n not in arg_types}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if n in aligned}
    return triton.compile(
        ASTSource(fn, signature, constexprs, attrs),
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )


def _resources(kernel, variant: str) -> Resources:  # type: ignore[no-untyped-def]
    registers, spill_bytes = _cubin_usage(kernel.asm["cubin"])
    ptx = kernel.asm["ptx"]
    return Resources(
        variant=variant,
        registers=registers,
        spill_bytes=spill_bytes,
        shared_bytes=int(kernel.metadata.shared),
        global_loads=len(re.findall(r"\bld\.global", ptx)),
        vector_loads=len(re.findall(r"\bld\.global(\.\w+)*\.v4\.b32", ptx)),
        vector_stores=len(re.findall(r"\bst\.global(\.\w+)*\.v4\.b32", ptx)),
        async_copies=len(re.findall(r"\bcp\.async\.c[ag]", ptx)),
        shared_stores=len(re.findall(r"\bst\.shared", ptx)),
        barriers=len(re.findall(r"\bbar\.sync", ptx)),
        ldmatrix=len(re.findall(r"\bldmatrix", ptx)),
        ptx_statements=ptx.count(";"),
    )


def _cubin_usage(cubin: bytes) -> tuple[int, int]:
    """(registers, spill stack bytes) from ``cuobjdump --dump-resource-usage`` (bundled with Triton)."""
    from triton.backends import nvidia

    tool = os.path.join(os.path.dirname(nvidia.__file__), "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+).*?STACK:(\d+)", out)
    if found is None:
        raise RuntimeError(f"cuobjdump gave no resource line for the kernel: {out[:300]!r}")
    return int(found.group(1)), int(found.group(2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", choices=["decode", "extend", "codec"], default="decode")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument(
        "--configs",
        default="",
        help="decode: block_n:warps:stages list (32:1:1,32:1:2); extend: block_m:block_n:warps; "
        "codec: warps (4,8)",
    )
    ap.add_argument("--versions", default="1,2,3", help="page format versions of the compressed kernel")
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 for H100/H200")
    ap.add_argument("--json", action="store_true", help="one JSON list on stdout instead of lines")
    args = ap.parse_args()
    if not args.json:
        print(f"triton {triton.__version__}, sm_{args.arch}", flush=True)
    found = []
    if args.kernel == "codec":
        for warps in (int(w) for w in (args.configs or "4").split(",")):
            for kind in ("encode", "decode"):
                found.append(
                    compile_codec_kernel(PageFormat(args.head_dim, 8, version=3), kind, warps, args.arch)
                )
                if not args.json:
                    print(found[-1], flush=True)
    configs = args.configs or ("32:1:1,32:1:2" if args.kernel == "decode" else "16:32:4")
    for cfg in configs.split(",") if args.kernel != "codec" else []:
        a, b, c = (int(x) for x in cfg.split(":"))
        runs = [(PageFormat(args.head_dim, 8, version=int(v)), True) for v in args.versions.split(",")]
        for fmt, compressed in [*runs, (PageFormat(args.head_dim, 8), False)]:
            if args.kernel == "decode":
                found.append(compile_decode_kernel(fmt, compressed, a, b, c, args.arch))
            else:
                found.append(compile_extend_kernel(fmt, compressed, a, b, c, args.arch))
            if not args.json:
                print(found[-1], flush=True)
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in found]))


if __name__ == "__main__":
    main()
