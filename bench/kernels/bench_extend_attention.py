"""Fused extend attention: new tokens over a compressed cached prefix, against named baselines, one run.

Per (batch, prefix, new tokens) shape and data (``real``: SmolLM2's K and V tiled, bench/kernels/real_kv.py; a
number: synthetic pages at that compressible fraction), on the same values: zipkv's extend kernel
reading the compressed prefix pages (kernels/attention/extend.py), its twin on the raw pages,
decompress-then-attend (zipkv.kernels.codec.pages.decode_pages of the prefix pages into scratch, then the
twin: what the SGLang worker's default extend path does before SGLang's kernel), and PyTorch SDPA over dense
K/V (prefix + new tokens, causal from the prefix's end; GQA). CUDA events with L2 flushed before every call,
median, on the GPU. Correctness on every shape: zipkv == twin bit for bit, relative error of request 0's
first new tokens (up to 128) against a float64 reference.

    python -m bench.kernels.bench_extend_attention --out bench/results/extend_attention.json

Without a GPU it runs under Triton's interpreter as a smoke test of the script (``--device cpu``, tiny
shapes): its times are wall-clock times of the interpreter, not a benchmark.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

if not torch.cuda.is_available():  # before any triton.jit below: the kernels then run interpreted
    os.environ.setdefault("TRITON_INTERPRET", "1")
from bench.kernels.decode_attention_baselines import HEAD_DIM, HKV, HQ, Timer, rel_err
from bench.kernels.decode_attention_data import REAL, StoredPages, bench_pages, data_notes, encode_packed
from bench.paths import write_record
from zipkv.kernels.attention.extend import ExtendPlan, extend_attention, plan_extend
from zipkv.kernels.format.layout import PAGE_TOKENS, PageFormat
from zipkv.kernels.reference.attention import extend_attention_reference
from zipkv.kernels.reference.pages import raw_page_meta


class WallTimer:
    """The interpreter's stand-in for `Timer`: wall-clock median of a few calls (a smoke run, not a bench)."""

    def median_us(self, fn: Callable[[], object]) -> float:
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)


def dense_kv(pages: torch.Tensor, k: torch.Tensor, prefix: int) -> torch.Tensor:
    """[H, prefix + N, D]: one request's prefix (bf16 [P, H, 16, D] page values) then its new tokens."""
    p, h, _, d = pages.shape
    cached = pages.permute(1, 0, 2, 3).reshape(h, p * PAGE_TOKENS, d)[:, :prefix]
    return torch.cat([cached, k.transpose(0, 1)], dim=1)


@dataclass
class Case:
    """One shape and data entry's inputs: the pages (compressed and raw), the new tokens and the plan."""

    batch: int
    prefix: int
    new: int
    dev: str
    fmt: PageFormat
    scale: float
    per: int
    pages: torch.Tensor
    data: str
    stored: StoredPages
    measured: float
    raw_heap: torch.Tensor
    raw_loc: torch.Tensor
    raw_meta: torch.Tensor
    page_ids: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    plan: ExtendPlan


def make_case(
    args: argparse.Namespace, batch: int, prefix: int, new: int, entry: str, gen: torch.Generator
) -> Case:
    """The pages of ``entry`` encoded, the raw twin's view of them, the new tokens' q, k, v and the plan."""
    dev, fmt, scale = args.device, PageFormat(HEAD_DIM, HKV, version=args.format_version), HEAD_DIM**-0.5
    per = -(-prefix // PAGE_TOKENS)
    num_pages = batch * per
    pages, data = bench_pages(entry, num_pages, fmt, per, gen, dev)
    stored = encode_packed(pages, fmt)
    measured = round(stored.compressible_fraction, 4)
    raw_heap, raw_loc = (
        pages.view(-1).view(torch.uint8),
        torch.arange(num_pages, device=dev) * fmt.raw_page_bytes,
    )
    raw_meta = raw_page_meta(fmt, dev).expand(num_pages, -1, -1).contiguous()
    page_ids = torch.arange(num_pages, dtype=torch.int32, device=dev)
    q = torch.randn(batch * new, HQ, HEAD_DIM, generator=gen, device=dev).to(torch.bfloat16)
    k, v = (
        torch.randn(batch * new, HKV, HEAD_DIM, generator=gen, device=dev).to(torch.bfloat16) for _ in "kv"
    )
    plan = plan_extend([new] * batch, [prefix] * batch, page_ids, [per] * batch, fmt, HQ)
    return Case(batch, prefix, new, dev, fmt, scale, per, pages, data, stored, measured, raw_heap, raw_loc,
                raw_meta, page_ids, q, k, v, plan)  # fmt: skip


def paged_impls(c: Case) -> tuple[dict[str, Callable[[], object]], list[torch.Tensor]]:
    """zipkv on the compressed prefix, its twin on the raw pages, decompress-then-attend; their outputs."""
    plan, q, k, v, stored, scale, fmt = c.plan, c.q, c.k, c.v, c.stored, c.scale, c.fmt
    out, twin_out, dta_out = torch.empty_like(q), torch.empty_like(q), torch.empty_like(q)
    zip_fn = lambda: extend_attention(plan, q, k, v, stored.heap, stored.page_loc, stored.page_meta, scale,
                                      out=out)  # fmt: skip
    twin_fn = lambda: extend_attention(plan, q, k, v, c.raw_heap, c.raw_loc, c.raw_meta, scale,
                                       compressed=False, out=twin_out)  # fmt: skip
    decoded = torch.empty_like(c.pages)

    def dta() -> None:
        from zipkv.kernels.codec import pages as codec

        codec.decode_pages(stored.heap, stored.page_loc, stored.page_meta, decoded, fmt)
        extend_attention(plan, q, k, v, decoded.view(-1).view(torch.uint8), c.raw_loc, c.raw_meta, scale,
                         compressed=False, out=dta_out)  # fmt: skip

    impls = {"zipkv": zip_fn, "zipkv_twin": twin_fn, "decompress_then_attend": dta}
    return impls, [out, twin_out, dta_out]


def sdpa_impl(c: Case) -> tuple[Callable[[], None], list[torch.Tensor]]:
    """PyTorch SDPA over each request's dense K/V (prefix + new tokens, causal from the prefix's end), and
    where it leaves its outputs."""
    batch, prefix, new, per, pages, q, k, v = c.batch, c.prefix, c.new, c.per, c.pages, c.q, c.k, c.v
    kv = [(dense_kv(pages[b * per : (b + 1) * per, 0], k[b * new : (b + 1) * new], prefix),
           dense_kv(pages[b * per : (b + 1) * per, 1], v[b * new : (b + 1) * new], prefix))
          for b in range(batch)]  # fmt: skip
    seen = (
        torch.arange(prefix + new, device=c.dev)[None, :] <= prefix + torch.arange(new, device=c.dev)[:, None]
    )

    sdpa_out: list[torch.Tensor] = []

    def sdpa() -> None:
        sdpa_out.clear()
        for b in range(batch):
            o = torch.nn.functional.scaled_dot_product_attention(
                q[b * new : (b + 1) * new].transpose(0, 1)[None], kv[b][0][None], kv[b][1][None],
                attn_mask=seen, scale=c.scale, enable_gqa=True,
            )  # fmt: skip
            sdpa_out.append(o)

    return sdpa, sdpa_out


def check_record(c: Case, out: torch.Tensor, twin_out: torch.Tensor, dta_out: torch.Tensor,
                 sdpa_out: list[torch.Tensor]) -> dict[str, object]:  # fmt: skip
    """The correctness check of one case, after every impl ran once."""
    # request 0's first m new tokens (causal: they do not see the later ones), so float64 fits in memory
    m = min(c.new, 128)
    first_pages = torch.tensor([0, c.per])
    expect = extend_attention_reference(c.q[:m], c.k[:m], c.v[:m], c.pages, c.page_ids[:c.per], first_pages,
                                        [c.prefix], [m], c.scale)  # fmt: skip

    return {
        "batch": c.batch, "prefix_tokens": c.prefix, "new_tokens": c.new, "data": c.data,
        "compressible_fraction": c.measured,
        "bit_identical_to_twin": bool(torch.equal(out, twin_out)),
        "decompress_then_attend_identical": bool(torch.equal(out, dta_out)),
        "rel_err_zipkv": rel_err(out[:m], expect),
        "rel_err_sdpa": rel_err(sdpa_out[0][0, :, :m].transpose(0, 1), expect),
    }  # fmt: skip


def run_shape(args, timer, batch, prefix, new, entry, rows, checks, gen):  # type: ignore[no-untyped-def]
    c = make_case(args, batch, prefix, new, entry, gen)

    def add(impl: str, us: float) -> None:
        rows.append({"batch": batch, "prefix_tokens": prefix, "new_tokens": new, "impl": impl, "data": c.data,
                     "compressible_fraction": c.measured, "median_us": round(us, 2)})  # fmt: skip
        print(f"  {batch:>3} x {prefix:>6} + {new:>5} {impl:<24} f={c.measured:<7} {us:10.1f} us", flush=True)

    impls, (out, twin_out, dta_out) = paged_impls(c)
    impls["sdpa"], sdpa_out = sdpa_impl(c)
    if args.check:
        for fn in (impls["zipkv"], impls["zipkv_twin"], impls["decompress_then_attend"], impls["sdpa"]):
            fn()
        checks.append(check_record(c, out, twin_out, dta_out, sdpa_out))
        print("  check", checks[-1], flush=True)
    for impl in args.impls:
        add(impl, timer.median_us(impls[impl]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1x2048x2048,1x8192x2048,1x30720x2048,16x2048x1024",
                    help="batch x prefix tokens x new tokens list")  # fmt: skip
    ap.add_argument("--fractions", default=f"{REAL},1",
                    help="real (SmolLM2 KV, bench/kernels/real_kv.py) or synthetic fractions")  # fmt: skip
    ap.add_argument("--impls", default="zipkv,zipkv_twin,decompress_then_attend,sdpa")
    ap.add_argument("--format-version", type=int, default=PageFormat(HEAD_DIM, HKV).version)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-check", dest="check", action="store_false")
    ap.add_argument("--target-s", type=float, default=0.1, help="timed seconds per measurement (GPU)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    args.impls = args.impls.split(",")
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    timer = Timer(args.target_s, 10, 200) if args.device == "cuda" else WallTimer()
    gen = torch.Generator(device=args.device).manual_seed(0)
    rows: list[dict[str, object]] = []
    checks: list[dict[str, object]] = []
    t0 = time.time()
    for (batch, prefix, new), entry in [(s, f) for s in shapes for f in args.fractions.split(",")]:
        run_shape(args, timer, batch, prefix, new, entry, rows, checks, gen)
        result = {  # written after every shape, so a cut-short run keeps what it measured
            "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu (Triton interpreter)",
            "benchmark": args.device == "cuda",
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python " + " ".join(sys.argv),
            "shape": {
                "num_q_heads": HQ,
                "num_kv_heads": HKV,
                "head_dim": HEAD_DIM,
                "page_tokens": PAGE_TOKENS,
                "format_version": args.format_version,
            },
            "data": data_notes(),
            "seconds": round(time.time() - t0, 1),
            "checks": checks,
            "rows": rows,
        }
        if args.out:
            write_record(args.out, result)
    bad = [c for c in checks if not (c["bit_identical_to_twin"] and c["decompress_then_attend_identical"])]
    bad += [c for c in checks if not max(float(c["rel_err_zipkv"]), float(c["rel_err_sdpa"])) <= 1e-2]  # type: ignore[arg-type]
    print(f"checks: {len(checks)}, failing: {len(bad)}; {time.time() - t0:.1f} s")
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
