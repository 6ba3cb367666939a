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

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from collections.abc import Callable

import torch
import triton

from bench.kernels.decode_attention_baselines import HEAD_DIM, HKV, HQ, Timer
from bench.kernels.decode_attention_data import REAL, data_notes
from bench.kernels.decode_attention_shape import run_shape
from bench.paths import write_record
from zipkv.kernels.attention import decode as da
from zipkv.kernels.attention.decode_config import DecodeKernelConfig, kernel_config, parse_kernel_config
from zipkv.kernels.format.layout import FORMAT_VERSION


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


def parse_args() -> argparse.Namespace:
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
    return ap.parse_args()


def parse_shapes(args: argparse.Namespace) -> list[tuple[int, ...]]:
    """(batch, context) pairs: --shapes, else every --batches x --contexts."""
    if args.shapes:
        shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    else:
        shapes = [
            (b, c) for b in map(int, args.batches.split(",")) for c in map(int, args.contexts.split(","))
        ]
    return shapes


def tuning_score(
    tuning: list[dict[str, object]], tune_checks: list[dict[str, object]]
) -> tuple[set[str], Callable[[DecodeKernelConfig], float]]:
    """(the configs bit identical to the twin, a config's score: its mean fraction of the compressed read
    floor over the tuning rows, 0 for one not bit identical)."""
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

    return good, score


def tune(args, timer, fractions, configs, tuning, gen):  # type: ignore[no-untyped-def]
    """The fastest of ``configs`` on --tune-shapes (their rows into ``tuning``), as a list of one."""
    tune_args = argparse.Namespace(**{**vars(args), "impls": {"read_floor", "zipkv", "zipkv_twin"}})
    tune_checks: list[dict[str, object]] = []
    for shape in args.tune_shapes.split(","):
        batch, ctx = (int(x) for x in shape.split("x"))
        run_shape(tune_args, timer, batch, ctx, fractions[:1], configs, tuning, tune_checks, gen)
    good, score = tuning_score(tuning, tune_checks)
    picked = max(configs, key=score)
    scores = ", ".join(f"{c.text}={score(c):.3f}" for c in configs if c.text in good)
    print(f"tuning picked {picked.text}: {scores}", flush=True)
    return [picked]


def record(configs: list[DecodeKernelConfig], tuning: list[dict[str, object]], t0: float,
           checks: list[dict[str, object]], rows: list[dict[str, object]]) -> dict[str, object]:  # fmt: skip
    """The run's JSON record so far: the machine, the command, the shape and data, and every row."""
    return {
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


def failing(checks: list[dict[str, object]]) -> int:
    """How many checks fail: zipkv not bit identical to its twin, or off the reference by more than 1e-2."""
    errs = [float(c["rel_err_zipkv"]) for c in checks if "rel_err_zipkv" in c]  # type: ignore[arg-type]
    bad = sum(c.get("bit_identical_to_twin") is False for c in checks)
    bad += sum(not e <= 1e-2 for e in errs)  # NaN fails too
    return bad


def main() -> None:
    args = parse_args()
    shapes = parse_shapes(args)
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
        configs = tune(args, timer, fractions, configs, tuning, gen)
    for batch, ctx in shapes:
        run_shape(args, timer, batch, ctx, fractions, configs, rows, checks, gen)
        result = record(configs, tuning, t0, checks, rows)  # after every shape: a cut-short run keeps it
        if args.out:
            write_record(args.out, result)
    bad = failing(checks)
    print(
        f"checks: {len(checks)}, failing: {bad}; {result['seconds']} s; "
        f"resources {result['kernel_resources']}"
    )
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
