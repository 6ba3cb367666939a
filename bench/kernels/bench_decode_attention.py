"""Fused decode attention on the GPU: zipkv against the read floor and named baselines, same pages, one run.

Per (batch, context) and data, on the same pages (``real``: SmolLM2's captured K and V tiled to the shape,
bench/kernels/real_kv.py; a number: synthetic pages at that compressible fraction), with the fraction of
blocks that coded on them recorded: the read floor (a streaming read of
every stored byte), zipkv on compressed pages, its uncompressed twin on the raw pages, decompress-then-
attend (zipkv.kernels.codec.pages.decode_pages, then the twin), FlashInfer's
BatchDecodeWithPagedKVCacheWrapper (tensor cores; HND pages, the same bytes the twin reads), SGLang's Triton
decode kernel and cuDNN SDPA on dense K/V (both on token-major [tokens, H, D] copies). CUDA events, L2 flushed
before every call, median. Correctness on every shape: zipkv == twin bit for bit, and relative error against a
float64 reference.

    python -m bench.kernels.bench_decode_attention --out bench/results/decode_attention.json
"""

# The timed closures are built and called inside one loop iteration, on purpose.
# ruff: noqa: B023

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time

import torch
import triton

from bench.kernels.decode_attention_baselines import (
    HEAD_DIM,
    HKV,
    HQ,
    Timer,
    flashinfer_fn,
    read_floor_fn,
    reference,
    rel_err,
    sdpa_fn,
    sglang_fn,
)
from bench.kernels.decode_attention_data import REAL, bench_pages, data_notes, encode_packed
from bench.paths import write_record
from zipkv.kernels.attention import decode as da
from zipkv.kernels.attention.decode_config import DecodeKernelConfig, kernel_config, parse_kernel_config
from zipkv.kernels.format.layout import FORMAT_VERSION, PageFormat
from zipkv.kernels.reference.pages import raw_page_meta


def kernel_resources() -> list[dict[str, object]]:
    """Registers, spills and shared memory of the compiled zipkv kernels (best effort)."""
    found = []
    try:
        for caches in da._decode_kernel.device_caches.values():
            for key, kernel in caches[0].items():
                found.append({"key": str(key)[-160:], "n_regs": kernel.n_regs, "n_spills": kernel.n_spills,
                              "shared": kernel.metadata.shared})  # fmt: skip
    except Exception as exc:
        found.append({"error": repr(exc)})
    return found


def run_shape(args, timer, batch, ctx, fractions, configs, rows, checks, gen):  # type: ignore[no-untyped-def]
    fmt = PageFormat(HEAD_DIM, HKV)
    per = ctx // 16
    num_pages = batch * per
    scale = HEAD_DIM**-0.5
    q = torch.randn(batch, HQ, HEAD_DIM, generator=gen, device="cuda").to(torch.bfloat16)
    page_ids = torch.arange(num_pages, dtype=torch.int32, device="cuda")
    indptr = torch.arange(0, batch + 1, dtype=torch.int32, device="cuda") * per
    lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    raw_loc = torch.arange(num_pages, dtype=torch.int64, device="cuda") * fmt.raw_page_bytes
    # a raw page's metadata in each version (the twin does not read it; the wrapper checks its shape)
    raw_meta = {
        v: raw_page_meta(PageFormat(HEAD_DIM, HKV, version=v), "cuda").expand(num_pages, -1, -1).contiguous()
        for v in args.format_versions
    }
    heap_buf = torch.empty(num_pages * fmt.raw_page_bytes, dtype=torch.uint8, device="cuda")
    out = torch.empty_like(q)

    data = "raw"
    page_gen = lambda: torch.Generator(device="cuda").manual_seed(0)  # an entry's pages, drawn again alike

    def add(impl: str, fraction: float | None, us: float, **extra: object) -> None:
        rows.append({"batch": batch, "context": ctx, "impl": impl, "data": data,
                     "compressible_fraction": fraction, "median_us": round(us, 2), **extra})  # fmt: skip
        print(f"  {batch:>4} x {ctx:>6} {impl:<24} f={fraction!s:<7} {us:9.1f} us {extra if extra else ''}",
              flush=True)  # fmt: skip

    raw_bytes = num_pages * fmt.raw_page_bytes
    if "read_floor" in args.impls:  # raw bytes: what they hold does not matter to a read
        add("read_floor", None, timer.median_us(read_floor_fn(heap_buf, raw_bytes)), stored_bytes=raw_bytes,
            pages="raw")  # fmt: skip
    for entry in fractions:
        pages, data = bench_pages(entry, num_pages, fmt, per, page_gen(), "cuda")
        raw_heap = pages.view(-1).view(torch.uint8)
        fmt = PageFormat(HEAD_DIM, HKV, version=args.format_versions[0])
        stored = encode_packed(pages, fmt, heap_buf)
        measured = round(stored.compressible_fraction, 4)
        nbytes = stored.stored_bytes + stored.meta_bytes
        if "read_floor" in args.impls:
            add(
                "read_floor",
                measured,
                timer.median_us(read_floor_fn(stored.heap, nbytes)),
                stored_bytes=nbytes,
            )
        expect = reference(q, pages, batch, ctx, scale) if args.check else None
        for version, cfg in [(v, c) for v in args.format_versions for c in configs]:
            if version != fmt.version:  # the same values stored in this version
                fmt = PageFormat(HEAD_DIM, HKV, version=version)
                stored = encode_packed(pages, fmt, heap_buf)
            plan = da.plan_decode(page_ids, indptr, lens, fmt, HQ, config=cfg)
            tag: dict[str, object] = {} if len(configs) == 1 else {"config": cfg.text}
            if len(args.format_versions) > 1:
                tag["format_version"] = version
            zip_fn = lambda: da.decode_attention(plan, q, stored.heap, stored.page_loc, stored.page_meta,
                                                 scale,
                                                 out=out)  # fmt: skip
            twin_out = torch.empty_like(q)
            twin_fn = lambda: da.decode_attention(plan, q, raw_heap, raw_loc, raw_meta[fmt.version], scale,
                                                  compressed=False, out=twin_out)  # fmt: skip
            if args.check:
                zip_fn()
                twin_fn()
                torch.cuda.synchronize()
                checks.append({"batch": batch, "context": ctx, "data": data,
                               "compressible_fraction": measured, **tag,
                               "bit_identical_to_twin": bool(torch.equal(out, twin_out)),
                               "rel_err_zipkv": rel_err(out, expect),
                               "rel_err_twin": rel_err(twin_out, expect),
                               "max_splits": plan.max_splits})  # fmt: skip
                print("  check", checks[-1], flush=True)
            add("zipkv", measured, timer.median_us(zip_fn), splits=plan.max_splits, **tag)
            if "zipkv_twin" in args.impls and version == args.format_versions[0]:  # the twin reads raw pages
                add("zipkv_twin", measured, timer.median_us(twin_fn), splits=plan.max_splits, **tag)
        if "decompress_then_attend" in args.impls:  # on the pages of the last version measured above
            from zipkv.kernels.codec import pages as codec

            plan = da.plan_decode(page_ids, indptr, lens, fmt, HQ)
            decoded = torch.empty_like(pages)
            dec_heap = decoded.view(-1).view(torch.uint8)

            def dta() -> None:
                codec.decode_pages(stored.heap, stored.page_loc, stored.page_meta, decoded, fmt)
                da.decode_attention(
                    plan, q, dec_heap, raw_loc, raw_meta[fmt.version], scale, compressed=False, out=out
                )

            version_tag = {"format_version": fmt.version} if len(args.format_versions) > 1 else {}
            add("decompress_then_attend", measured, timer.median_us(dta), **version_tag)
            if args.check:
                dta()
                checks.append({"batch": batch, "context": ctx, "data": data,
                               "compressible_fraction": measured,
                               "decompress_then_attend_rel_err": rel_err(out, expect)})  # fmt: skip
            del decoded, dec_heap
        del expect, pages
    baselines = [i for i in ("flashinfer_tc", "sglang_triton", "sdpa_cudnn") if i in args.impls]
    if baselines:
        pages, data = bench_pages(fractions[0], num_pages, fmt, per, page_gen(), "cuda")  # same values
        expect = reference(q, pages, batch, ctx, scale) if args.check else None
        k_buf = pages[:, 0].permute(0, 2, 1, 3).reshape(num_pages * 16, HKV, HEAD_DIM)
        v_buf = pages[:, 1].permute(0, 2, 1, 3).reshape(num_pages * 16, HKV, HEAD_DIM)
        for impl in baselines:
            try:
                if impl == "flashinfer_tc":
                    fn = flashinfer_fn(pages, q, out, batch, ctx, scale)
                    result = lambda: out
                elif impl == "sglang_triton":
                    fn = sglang_fn(k_buf, v_buf, q, out, batch, ctx, scale)
                    result = lambda: out
                else:
                    fn = sdpa_fn(k_buf, v_buf, q, batch, ctx, scale)
                    result = lambda: fn().view(batch, HQ, HEAD_DIM)
                us = timer.median_us(fn)
                err = rel_err(result(), expect) if args.check else None
                add(impl, None, us, rel_err=err)
            except Exception as exc:
                rows.append({"batch": batch, "context": ctx, "impl": impl, "data": data,
                             "compressible_fraction": None, "median_us": None,
                             "error": repr(exc)[:300]})  # fmt: skip
                print(f"  {impl} failed: {exc!r}"[:400], flush=True)
        del k_buf, v_buf, pages
    del heap_buf
    torch.cuda.empty_cache()


def versions() -> dict[str, str]:
    out = {"torch": torch.__version__, "triton": triton.__version__, "cuda": str(torch.version.cuda),
           "cudnn": str(torch.backends.cudnn.version()), "python": platform.python_version()}  # fmt: skip
    for name in ("flashinfer", "sglang"):
        try:
            from importlib.metadata import version

            out[name] = version("flashinfer-python" if name == "flashinfer" else name)
        except Exception:
            out[name] = "not installed"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,32,64,128")
    ap.add_argument("--contexts", default="1024,4096,8192,32768")
    ap.add_argument(
        "--shapes", default="", help="BxL list overriding --batches/--contexts, e.g. 32x8192,1x32768"
    )
    ap.add_argument("--fractions", default=f"{REAL},0,1",
                    help="real (SmolLM2 KV, bench/kernels/real_kv.py) or synthetic fractions")  # fmt: skip
    ap.add_argument("--impls", default="read_floor,zipkv,zipkv_twin,decompress_then_attend,flashinfer_tc,"
                    "sglang_triton,sdpa_cudnn")  # fmt: skip
    ap.add_argument(
        "--configs",
        default="",
        help="block_n:warps:stages:twin_stages:ctas_per_sm:prefetch list; default = tuned",
    )
    ap.add_argument(
        "--tune-shapes", default="", help="BxL list: first pick the fastest of --configs on these shapes"
    )
    ap.add_argument(
        "--format-versions",
        default=str(FORMAT_VERSION),
        help="page format versions to measure zipkv on, e.g. 1,2 (default: kernels/format/layout.py's)",
    )
    ap.add_argument("--no-check", dest="check", action="store_false")
    ap.add_argument("--target-s", type=float, default=0.12, help="timed seconds per measurement")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.shapes:
        shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    else:
        shapes = [
            (b, c) for b in map(int, args.batches.split(",")) for c in map(int, args.contexts.split(","))
        ]
    fractions = args.fractions.split(",")  # "real" or a number (decode_attention_data.bench_pages)
    args.impls = set(args.impls.split(","))
    args.format_versions = [int(v) for v in args.format_versions.split(",")]
    configs = (
        [parse_kernel_config(c, "--configs") for c in args.configs.split(",")]
        if args.configs
        else [kernel_config(HEAD_DIM)]  # the tuned table or $ZIPKV_DECODE_KERNEL
    )
    timer = Timer(args.target_s, 10, 200)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows: list[dict[str, object]] = []
    checks: list[dict[str, object]] = []
    t0 = time.time()
    result: dict[str, object] = {}
    tuning: list[dict[str, object]] = []
    if args.tune_shapes and len(configs) > 1:
        tune_args = argparse.Namespace(**{**vars(args), "impls": {"read_floor", "zipkv", "zipkv_twin"}})
        tune_checks: list[dict[str, object]] = []
        for shape in args.tune_shapes.split(","):
            batch, ctx = (int(x) for x in shape.split("x"))
            run_shape(tune_args, timer, batch, ctx, fractions[:1], configs, tuning, tune_checks, gen)
        good = {str(c.get("config")) for c in tune_checks if c.get("bit_identical_to_twin")}
        floor: dict[tuple[object, object], float] = {
            (r["batch"], r["context"]): float(r["median_us"])  # type: ignore[arg-type]
            for r in tuning
                 if r["impl"] == "read_floor" and r.get("pages") != "raw"}  # fmt: skip

        def score(cfg: DecodeKernelConfig) -> float:  # mean fraction of the compressed read floor
            tag = cfg.text
            got = [floor[(r["batch"], r["context"])] / float(r["median_us"]) for r in tuning  # type: ignore[arg-type]
                   if r["impl"] == "zipkv" and r.get("config") == tag]  # fmt: skip
            return sum(got) / len(got) if tag in good and got else 0.0

        configs = [max(configs, key=score)]
        print(f"tuning picked {configs[0]}: " + ", ".join(f"{c}={score(c):.3f}" for c in
              [tuple(int(x) for x in t.split(":")) for t in sorted(good)]), flush=True)  # fmt: skip
    for batch, ctx in shapes:
        run_shape(args, timer, batch, ctx, fractions, configs, rows, checks, gen)
        result = {  # written after every shape, so a cut-short run keeps what it measured
            "device": torch.cuda.get_device_name(0),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python " + " ".join(sys.argv),
            "versions": versions(),
            "shape": {
                "num_q_heads": HQ,
                "num_kv_heads": HKV,
                "head_dim": HEAD_DIM,
                "page_tokens": 16,
                "layers": 1,
            },
            "data": data_notes(),
            "configs": [list(c.as_ints()) for c in configs],
            "config_fields": DecodeKernelConfig.FIELDS,
            "tuning": tuning,
            "kernel_resources": kernel_resources(),
            "seconds": round(time.time() - t0, 1),
            "checks": checks,
            "rows": rows,
        }
        if args.out:
            write_record(args.out, result)
    errs = [float(c["rel_err_zipkv"]) for c in checks if "rel_err_zipkv" in c]  # type: ignore[arg-type]
    bad = sum(c.get("bit_identical_to_twin") is False for c in checks)
    bad += sum(not e <= 1e-2 for e in errs)  # NaN fails too
    print(
        f"checks: {len(checks)}, failing: {bad}; {result['seconds']} s; "
        f"resources {result['kernel_resources']}"
    )
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
