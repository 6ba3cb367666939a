"""Codec throughput on the GPU: Triton encode and decode of full pages against a plain copy of the same pages.

Pages of Llama-3.1-8B shape (32 layers x ``--pages-per-layer`` pages, 8 KV heads, head_dim 128, page 16) in
page format ``--format-version`` (default: the default format). Data (``--data``): ``real``, SmolLM2-135M-
Instruct's captured K and V tiled to that shape (bench/kernels/real_kv.py), the first and the one that says
what real decoder KV gives; then synthetic pages (N(0,1) values, one exponent window, random bit patterns).
Each records the fraction of blocks that coded. Every kernel output is checked bit for bit (decode against the
original pages, encode against the torch reference on a sample of pages) before it is timed. Timing: CUDA
events around each call, L2 flushed before each call by zeroing a 512 MiB buffer (outside the events),
warm-ups, median of ``--reps`` calls.

    python -m bench.kernels.bench_codec --out bench/results/codec.json
    python -m bench.kernels.bench_codec --format-version 3 --out bench/results/codec_v3.json

Without a GPU it runs under Triton's interpreter as a smoke test of the script (``--device cpu`` and a tiny
``--layers 1 --pages-per-layer 2``): its times are wall-clock times of the interpreter, not a benchmark.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

if (
    not torch.cuda.is_available()
):  # before zipkv.kernels.codec.pages's triton.jit: the kernels then run interpreted
    os.environ.setdefault("TRITON_INTERPRET", "1")
import triton

from bench.kernels.codec_heap import DecodeConfig, Setup, coded_blocks, make_pages
from bench.kernels.real_kv import describe
from zipkv.kernels.codec import pages as codec
from zipkv.kernels.format.layout import PageFormat

GB = 1e9


def median_ms(fn: Callable[[], object], reps: int, flush: torch.Tensor, warmups: int = 3) -> float:
    """Median over ``reps`` calls after ``warmups``: CUDA events, L2 flushed before each call on the GPU;
    wall clock on the CPU (the interpreter: a smoke run)."""
    for _ in range(warmups):
        fn()
    times = []
    for _ in range(reps):
        if flush.device.type != "cuda":
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
            continue
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def rate(nbytes: int, ms: float) -> float:
    return nbytes / GB / (ms / 1e3)


def encode_once(s: Setup, args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    """Encode with the first warp count and check it against the reference: the sizes the row records
    (stored bytes, coded blocks) are those of checked output. Returns the row and the stored bytes."""
    fmt, raw_bytes = s.fmt, s.n * s.fmt.raw_page_bytes
    s.encode(args.encode_warps[0])
    sync(args.device)
    s.check_encode()
    stored = int(s.sizes.sum())
    compressed_blocks = coded_blocks(s.meta, fmt)
    row: dict[str, Any] = {
        "pages": s.n,
        "raw_bytes": raw_bytes,
        "stored_bytes": stored,
        "stored_over_raw": stored / raw_bytes,
        "compressible_block_fraction": compressed_blocks / (s.n * fmt.blocks_per_page),
    }
    return row, stored


def time_decodes(
    s: Setup, args: argparse.Namespace, flush: torch.Tensor
) -> tuple[dict[DecodeConfig, float], DecodeConfig]:
    """Check, then time, each decode configuration; returns the times and the fastest configuration.
    The full sweep (then the best one's variants) on the first data set; the others reuse its best
    configuration, which this leaves in ``args.best`` (emptying ``args.sweep``)."""
    configs = args.sweep or [args.best]
    dec_ms: dict[DecodeConfig, float] = {}

    def time_decode(config: DecodeConfig) -> None:
        s.decode(config)
        sync(args.device)
        s.check_decode(config.name)
        dec_ms[config] = median_ms(functools.partial(s.decode, config), args.reps, flush, args.warmups)

    for config in configs:
        time_decode(config)
    best = min(dec_ms, key=lambda c: dec_ms[c])
    if args.sweep:
        variants = [replace(best, stream_stores=True)]
        if s.fmt.version < 3:  # v3's restore has one (plain-integer) path
            variants.insert(0, replace(best, use_prmt=False))
        for variant in variants:
            time_decode(variant)
        best = min(dec_ms, key=lambda c: dec_ms[c])
        args.sweep, args.best = [], best
    return dec_ms, best


def time_raw_decode(s: Setup, best: DecodeConfig, args: argparse.Namespace, flush: torch.Tensor) -> float:
    """The best configuration on the same pages stored raw: the restore's cost when nothing coded."""
    s.decode(best, raw=True)
    sync(args.device)
    s.check_decode("raw pages")
    return median_ms(functools.partial(s.decode, best, raw=True), args.reps, flush, args.warmups)


def rates(row: dict[str, Any], raw_bytes: int, stored: int) -> dict[str, float]:
    """GB/s of each timed call, from the row's times."""
    return {
        "encode_GBps_consumed": rate(raw_bytes, row["encode_ms"]),
        "decode_GBps_restored": rate(raw_bytes, row["decode_ms"]),
        "copy_GBps_copied": rate(raw_bytes, row["copy_ms"]),
        "decode_raw_pages_GBps": rate(raw_bytes, row["decode_raw_pages_ms"]),
        "decode_speedup_vs_copy": row["copy_ms"] / row["decode_ms"],
        # Bytes moved (read + written) over time, beside the copy's rate measured in the same run.
        "decode_traffic_GBps": rate(stored + raw_bytes, row["decode_ms"]),
        "encode_traffic_GBps": rate(stored + raw_bytes, row["encode_ms"]),
        "copy_traffic_GBps": rate(2 * raw_bytes, row["copy_ms"]),
    }


def measure(s: Setup, args: argparse.Namespace, flush: torch.Tensor) -> dict[str, Any]:
    """Check, then time, encode and decode of one data set against a copy of the same bytes."""
    raw_bytes = s.n * s.fmt.raw_page_bytes
    row, stored = encode_once(s, args)
    flat_out, flat_src = s.out.view(-1), s.heap[:raw_bytes].view(torch.bfloat16)
    row["copy_ms"] = median_ms(lambda: flat_out.copy_(flat_src), args.reps, flush, args.warmups)
    enc_ms: dict[int, float] = {}
    for w in args.encode_warps:
        enc_ms[w] = median_ms(functools.partial(s.encode, w), args.reps, flush, args.warmups)
    dec_ms, best = time_decodes(s, args, flush)
    row["decode_raw_pages_ms"] = time_raw_decode(s, best, args, flush)
    row["encode_ms_by_warps"] = enc_ms
    row["decode_ms_by_config"] = {c.name: t for c, t in dec_ms.items()}
    row["encode_best_num_warps"] = min(enc_ms, key=lambda w: enc_ms[w])
    row["decode_best_config"] = best.name
    row["encode_ms"], row["decode_ms"] = min(enc_ms.values()), dec_ms[best]
    return row | rates(row, raw_bytes, stored)


def run(args: argparse.Namespace) -> dict[str, Any]:
    fmt = PageFormat(head_dim=128, num_kv_heads=8, version=args.format_version)
    n = args.layers * args.pages_per_layer
    shape = (n, 2, fmt.num_kv_heads, 16, fmt.head_dim)
    on_gpu = args.device == "cuda"
    flush = torch.empty(512 * 2**20 if on_gpu else 1, dtype=torch.uint8, device=args.device)
    gen = torch.Generator(device=args.device).manual_seed(0)
    results = {}
    for kind in args.data:
        results[kind] = measure(Setup(fmt, make_pages(kind, shape, gen)), args, flush)
        if on_gpu:
            torch.cuda.empty_cache()
        print(kind, "done", flush=True)
    shape_info = {"layers": args.layers, "pages_per_layer": args.pages_per_layer, "num_kv_heads": 8}
    shape_info |= {"head_dim": 128, "page_tokens": 16, "geometry": fmt.k_geometry.name}
    shape_info |= {"format_version": fmt.version}
    return {
        "benchmark": "codec" if on_gpu else False,  # the interpreter's times are a smoke run's
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if on_gpu else "cpu (Triton interpreter)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "command": " ".join(["python", *sys.argv]),
        "shape": shape_info,
        "data": {
            "real": describe(),
            "normal": "synthetic N(0, 1)",
            "compressible": "synthetic, 1 + U(0, 1)",
            "raw": "synthetic random bit patterns",
        },
        "timing": f"CUDA events, L2 flushed (512 MiB memset) before each call, {args.warmups} warm-ups, "
        f"median of {args.reps}"
        if on_gpu
        else f"wall clock under the Triton interpreter, median of {args.reps} (not a benchmark)",
        "results": results,
    }


def print_table(report: dict[str, Any]) -> None:
    version = report["shape"]["format_version"]
    print(f"\ncodec v{version} on {report['device']} (torch {report['torch']}, triton {report['triton']})")
    print("| data | compressible blocks | stored/raw | encode GB/s | decode GB/s | copy GB/s "
          "| decode raw pages GB/s | decode vs copy |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for kind, r in report["results"].items():
        print(f"| {kind} | {r['compressible_block_fraction']:.3f} | {r['stored_over_raw']:.3f} "
              f"| {r['encode_GBps_consumed']:.0f} | {r['decode_GBps_restored']:.0f} "
              f"| {r['copy_GBps_copied']:.0f} "
              f"| {r['decode_raw_pages_GBps']:.0f} | {r['decode_speedup_vs_copy']:.2f}x |")  # fmt: skip
    for kind, r in report["results"].items():
        print(kind, "encode ms by warps", {k: round(v, 4) for k, v in r["encode_ms_by_warps"].items()})
        print(kind, "decode ms by config", {k: round(v, 4) for k, v in r["decode_ms_by_config"].items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--pages-per-layer", type=int, default=512)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--warmups", type=int, default=3, help="untimed calls before each timing")
    parser.add_argument("--data", nargs="+", default=["real", "normal", "compressible", "raw"])
    parser.add_argument("--encode-warps", type=int, nargs="+", default=[4, 2, 8])
    parser.add_argument("--decode-warps", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--decode-page-heads", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--format-version", type=int, default=PageFormat(128, 8).version, choices=(1, 2, 3))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default="bench/results/codec.json")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_codec needs a CUDA GPU for --device cuda (docs/benchmarks.md has the command)")
    if args.device == "cpu" and not codec._INTERPRET:
        sys.exit("--device cpu runs the kernels under Triton's interpreter: set TRITON_INTERPRET=1")
    prmt = args.format_version < 3 and args.device == "cuda"  # v1/v2 PTX interleave (GPU only); v3 has none
    args.sweep = [
        DecodeConfig(g, w, use_prmt=prmt) for g in args.decode_page_heads for w in args.decode_warps
    ]
    report = run(args)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print_table(report)


if __name__ == "__main__":
    main()
