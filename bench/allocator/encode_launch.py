"""The pool's encode launch, timed by part: what one prefill chunk's pages cost the GPU to compress and pack.

A serving run's pool lines put zipkv's encode at 3.07 ms of GPU per 1k prefilled tokens on the Mooncake
trace (H100, docs/benchmarks.md, "sustained load"): about 43 GB/s of raw KV, where the codec's encode kernel
alone runs at 1.37 TB/s (H200). ``PagePool.end_step`` does more than the kernel: it uploads the plan, runs
the encoder into worst-case stage places, packs each region's pages one after another (a gather of whole
staged pages and a scatter of their kept units) and writes the page table and metadata. This bench times the
launch as ``end_step`` issues it and, inside it, the encoder's call, on a pool of the serving shape
(Llama-3.1-8B: 32 layers, 8 KV heads of 128) holding real KV (bench/kernels/real_kv.py):

    python -m bench.allocator.encode_launch                      # on the GPU: writes
        bench/results/encode_launch_<gpu>.json
    python -m bench.allocator.encode_launch --pages 8 --layers 2 --trials 2   # a CPU dry run

The pack's ways side by side (``--copies all``, the default): torch copies of 8-byte words (the default on
the CPU), of bytes (before 2026-12-06), and the Triton kernel (the default on CUDA since this bench timed it
on an H100: 2.36 ms a launch against 13.3 with the words, bench/results/encode_launch_h100.json); each launch
over the words' in ``launch_over_words``.

Per trial: allocate ``--pages`` page ids (a prefill chunk: 512 = 8,192 tokens), write real KV into every
layer's raw page, mark them full, and time ``end_step`` with CUDA events (device) and the host clock; the
encoder's call is wrapped with its own events. Pack and table writes = launch - encoder. Then the pages are
freed and the pool settled, so every trial starts from the same state.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from bench.kernels.real_kv import describe, tile_pages
from bench.paths import RESULTS
from zipkv.allocator import PagePool
from zipkv.kernels.format.layout import PageFormat
from zipkv.kernels.reference import pages as ref

MiB = 1 << 20


class Stopwatch:
    """Device time of a span on the GPU (CUDA events, read after a sync), host time elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.spans: list[tuple[Any, Any]] = []

    def start(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def stop(self, begun: Any) -> None:
        self.spans.append((begun, self.start()))

    def take_ms(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            out = [float(a.elapsed_time(b)) for a, b in self.spans]
        else:
            out = [1e3 * (b - a) for a, b in self.spans]
        self.spans = []
        return out


def timed_encoder(encoder: Callable[..., None], watch: Stopwatch) -> Callable[..., None]:
    def run(*args: Any, **kwargs: Any) -> None:
        begun = watch.start()
        encoder(*args, **kwargs)
        watch.stop(begun)

    return run


def write_raw_pages(pool: PagePool, ids: list[int], pages: torch.Tensor) -> None:
    """Every layer's raw page of ``ids`` holds ``pages`` (bf16 [n, 2, H, 16, D]), one source page per layer
    shifted so that layers differ."""
    index = ref.raw_page_value_index(pool.fmt, pool.device).view(-1)
    values = pool.heap.view(torch.bfloat16)
    idx = torch.tensor(ids, dtype=torch.int64, device=pool.device)
    for layer in range(pool.num_layers):
        at = pool.page_loc[layer, idx] // 2  # bf16 element offsets of the raw pages
        src = pages.roll(layer, dims=0).reshape(len(ids), -1)
        values[at[:, None] + index[None, :]] = src


# The pool's pack: torch copies of 8-byte words (the CPU's default), of bytes (before 2026-12-06), and the
# Triton kernel that copies the kept units only (CUDA's default, allocator/pack.py pack_choice)
COPIES = ("words", "bytes", "triton")


def run(args: argparse.Namespace, copies: str) -> dict[str, object]:
    device = torch.device(args.device)
    fmt = PageFormat(args.head_dim, args.kv_heads, version=args.format_version)
    raw_bytes = args.pages * args.layers * fmt.raw_page_bytes
    pool = PagePool(fmt, args.layers, budget_bytes=3 * raw_bytes + 64 * MiB, device=device)
    if copies == "bytes":  # the copies before 2026-12-06: the same unit rows, one byte per element
        pool._units = pool._units.view(torch.uint8).view(-1, pool.unit_bytes)
    pool.pack_impl = "triton" if copies == "triton" else "torch"
    encoder_watch, launch_watch = Stopwatch(device), Stopwatch(device)
    pool.encoder = timed_encoder(pool.encoder, encoder_watch)
    pages = tile_pages(args.pages, fmt.num_kv_heads, fmt.head_dim, device=device)
    host_ms: list[float] = []
    for trial in range(args.warmup + args.trials):
        ids = pool.allocate(args.pages)
        write_raw_pages(pool, ids, pages)
        pool.mark_full(ids)
        t0 = time.perf_counter()
        begun = launch_watch.start()
        pool.end_step()
        launch_watch.stop(begun)
        host_ms.append(1e3 * (time.perf_counter() - t0))
        pool.settle()
        stats = pool.stats()
        if stats.compressed_pages != args.pages:
            raise SystemExit(f"trial {trial}: {stats.compressed_pages} of {args.pages} pages compressed")
        pool.free(ids)
        pool.settle()
        print(f"[encode_launch] trial {trial + 1}/{args.warmup + args.trials}", flush=True)
    launch, encoder = launch_watch.take_ms()[args.warmup :], encoder_watch.take_ms()[args.warmup :]
    rest = [a - b for a, b in zip(launch, encoder, strict=True)]
    med = statistics.median
    return {
        "copies": copies,
        "pages": args.pages,
        "layers": args.layers,
        "format": f"v{fmt.version}, {fmt.num_kv_heads} KV heads of {fmt.head_dim}",
        "raw_bytes": raw_bytes,
        "trials": args.trials,
        "launch_device_ms": round(med(launch), 4),
        "encoder_device_ms": round(med(encoder), 4),
        "pack_and_tables_device_ms": round(med(rest), 4),
        "launch_raw_gb_per_s": round(raw_bytes / med(launch) / 1e6, 1),
        "encoder_raw_gb_per_s": round(raw_bytes / med(encoder) / 1e6, 1),
        "end_step_host_ms": round(med(host_ms[args.warmup :]), 4),
        "ms_per_1k_tokens": round(med(launch) * 1000 / (args.pages * 16), 4),
        "data": describe(),
    }


def run_or_error(args: argparse.Namespace, copies: str) -> dict[str, object]:
    """One way's row; a way that fails (a kernel that does not compile on this GPU) is recorded with its
    error, and the others still run."""
    try:
        return run(args, copies)
    except Exception as exc:  # recorded, not hidden: the row says what failed
        print(f"[encode_launch] {copies}: {type(exc).__name__}: {exc}", flush=True)
        return {"copies": copies, "error": f"{type(exc).__name__}: {exc}"}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=512, help="page ids per trial (512: one 8,192-token chunk)")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--format-version", type=int, default=3)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--copies", choices=(*COPIES, "all"), default="all")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, help="default: bench/results/encode_launch_<gpu>.json on a GPU")
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    if args.pages < 1 or args.trials < 1 or args.warmup < 0:
        raise SystemExit("--pages and --trials must be >= 1, --warmup >= 0")
    rows = [run_or_error(args, copies) for copies in (COPIES if args.copies == "all" else (args.copies,))]
    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU ({platform.machine()})"
    command = " ".join(["python -m bench.allocator.encode_launch", *argv])
    date = datetime.now(UTC).isoformat(timespec="seconds")
    record: dict[str, object] = {"device": gpu, "date": date, "command": command, "rows": rows}
    if rows[0]["copies"] == "words" and "error" not in rows[0]:  # side by side: each launch over the default
        words_ms = float(str(rows[0]["launch_device_ms"]))
        record["launch_over_words"] = {
            str(r["copies"]): round(float(str(r["launch_device_ms"])) / words_ms, 3)
            for r in rows[1:]
            if "error" not in r
        }
    print(json.dumps(record, indent=1))
    out = args.out
    if out is None and args.device.startswith("cuda"):
        out = RESULTS / f"encode_launch_{gpu.split()[1].lower()}.json"
    if out is not None:
        out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"[encode_launch] wrote {out}")


if __name__ == "__main__":
    main()
