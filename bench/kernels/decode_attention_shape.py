"""One (batch, context) of bench/kernels/bench_decode_attention.py: the read floor, zipkv in each page format
version and kernel config, its uncompressed twin, decompress-then-attend and the named baselines, on the same
pages; each adds its rows (median times) and, with --check, its correctness checks.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

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
from bench.kernels.decode_attention_data import StoredPages, bench_pages, encode_packed
from zipkv.kernels.attention import decode as da
from zipkv.kernels.attention.decode_config import DecodeKernelConfig
from zipkv.kernels.format.layout import PageFormat
from zipkv.kernels.reference.pages import raw_page_meta


@dataclass
class Entry:
    """One data entry's pages on a shape, as its zipkv, twin and decompress-then-attend steps share them."""

    pages: torch.Tensor
    raw_heap: torch.Tensor
    stored: StoredPages  # in the last page format version encoded
    measured: float
    expect: torch.Tensor | None


class ShapeRun:
    """One (batch, context): the inputs every impl reads, and the rows and checks it adds (run_shape's
    steps). ``fmt`` and ``data`` follow the steps: the page format and data of the last pages encoded."""

    def __init__(self, args: argparse.Namespace, timer: Timer, batch: int, ctx: int,
                 rows: list[dict[str, object]], checks: list[dict[str, object]],
                 gen: torch.Generator) -> None:  # fmt: skip
        self.args, self.timer, self.batch, self.ctx = args, timer, batch, ctx
        self.rows, self.checks = rows, checks
        self.fmt = PageFormat(HEAD_DIM, HKV)
        self.per = ctx // 16
        self.num_pages = num_pages = batch * self.per
        self.scale = HEAD_DIM**-0.5
        self.q = torch.randn(batch, HQ, HEAD_DIM, generator=gen, device="cuda").to(torch.bfloat16)
        self.page_ids = torch.arange(num_pages, dtype=torch.int32, device="cuda")
        self.indptr = torch.arange(0, batch + 1, dtype=torch.int32, device="cuda") * self.per
        self.lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
        self.raw_loc = torch.arange(num_pages, dtype=torch.int64, device="cuda") * self.fmt.raw_page_bytes
        # a raw page's metadata in each version (the twin does not read it; the wrapper checks its shape)
        self.raw_meta = {
            v: raw_page_meta(PageFormat(HEAD_DIM, HKV, version=v), "cuda")
            .expand(num_pages, -1, -1)
            .contiguous()
            for v in args.format_versions
        }
        self.heap_buf = torch.empty(num_pages * self.fmt.raw_page_bytes, dtype=torch.uint8, device="cuda")
        self.out = torch.empty_like(self.q)
        self.data = "raw"

    @staticmethod
    def page_gen() -> torch.Generator:  # an entry's pages, drawn again alike
        return torch.Generator(device="cuda").manual_seed(0)

    def add(self, impl: str, fraction: float | None, us: float, **extra: object) -> None:
        batch, ctx = self.batch, self.ctx
        self.rows.append({"batch": batch, "context": ctx, "impl": impl, "data": self.data,
                          "compressible_fraction": fraction, "median_us": round(us, 2), **extra})  # fmt: skip
        print(f"  {batch:>4} x {ctx:>6} {impl:<24} f={fraction!s:<7} {us:9.1f} us {extra if extra else ''}",
              flush=True)  # fmt: skip

    def read_floor_raw(self) -> None:
        raw_bytes = self.num_pages * self.fmt.raw_page_bytes
        if "read_floor" in self.args.impls:  # raw bytes: what they hold does not matter to a read
            self.add("read_floor", None, self.timer.median_us(read_floor_fn(self.heap_buf, raw_bytes)),
                     stored_bytes=raw_bytes, pages="raw")  # fmt: skip

    def run_entry(self, entry: str, configs: list[DecodeKernelConfig]) -> None:
        """zipkv (each format version and config), its twin, decompress-then-attend: one entry's pages."""
        args = self.args
        pages, self.data = bench_pages(entry, self.num_pages, self.fmt, self.per, self.page_gen(), "cuda")
        raw_heap = pages.view(-1).view(torch.uint8)
        self.fmt = PageFormat(HEAD_DIM, HKV, version=args.format_versions[0])
        stored = encode_packed(pages, self.fmt, self.heap_buf)
        measured = round(stored.compressible_fraction, 4)
        nbytes = stored.stored_bytes + stored.meta_bytes
        if "read_floor" in args.impls:
            self.add(
                "read_floor",
                measured,
                self.timer.median_us(read_floor_fn(stored.heap, nbytes)),
                stored_bytes=nbytes,
            )
        expect = reference(self.q, pages, self.batch, self.ctx, self.scale) if args.check else None
        e = Entry(pages, raw_heap, stored, measured, expect)
        for version, cfg in [(v, c) for v in args.format_versions for c in configs]:
            self.zipkv_version(e, version, cfg, len(configs))
        if "decompress_then_attend" in args.impls:  # on the pages of the last version measured above
            self.decompress_then_attend(e)

    def zipkv_version(self, e: Entry, version: int, cfg: DecodeKernelConfig, n_configs: int) -> None:
        args, q, scale, out = self.args, self.q, self.scale, self.out
        if version != self.fmt.version:  # the same values stored in this version
            self.fmt = PageFormat(HEAD_DIM, HKV, version=version)
            e.stored = encode_packed(e.pages, self.fmt, self.heap_buf)
        fmt, stored = self.fmt, e.stored
        plan = da.plan_decode(self.page_ids, self.indptr, self.lens, fmt, HQ, config=cfg)
        tag: dict[str, object] = {} if n_configs == 1 else {"config": cfg.text}
        if len(args.format_versions) > 1:
            tag["format_version"] = version
        zip_fn = lambda: da.decode_attention(plan, q, stored.heap, stored.page_loc, stored.page_meta,
                                             scale,
                                             out=out)  # fmt: skip
        twin_out = torch.empty_like(q)
        twin_fn = lambda: da.decode_attention(plan, q, e.raw_heap, self.raw_loc, self.raw_meta[fmt.version],
                                              scale, compressed=False, out=twin_out)  # fmt: skip
        if args.check:
            zip_fn()
            twin_fn()
            torch.cuda.synchronize()
            self.checks.append({"batch": self.batch, "context": self.ctx, "data": self.data,
                                "compressible_fraction": e.measured, **tag,
                                "bit_identical_to_twin": bool(torch.equal(out, twin_out)),
                                "rel_err_zipkv": rel_err(out, e.expect),
                                "rel_err_twin": rel_err(twin_out, e.expect),
                                "max_splits": plan.max_splits})  # fmt: skip
            print("  check", self.checks[-1], flush=True)
        self.add("zipkv", e.measured, self.timer.median_us(zip_fn), splits=plan.max_splits, **tag)
        if "zipkv_twin" in args.impls and version == args.format_versions[0]:  # the twin reads raw pages
            self.add("zipkv_twin", e.measured, self.timer.median_us(twin_fn), splits=plan.max_splits, **tag)

    def decompress_then_attend(self, e: Entry) -> None:
        from zipkv.kernels.codec import pages as codec

        fmt, stored, q, scale, out = self.fmt, e.stored, self.q, self.scale, self.out
        plan = da.plan_decode(self.page_ids, self.indptr, self.lens, fmt, HQ)
        decoded = torch.empty_like(e.pages)
        dec_heap = decoded.view(-1).view(torch.uint8)

        def dta() -> None:
            codec.decode_pages(stored.heap, stored.page_loc, stored.page_meta, decoded, fmt)
            da.decode_attention(
                plan, q, dec_heap, self.raw_loc, self.raw_meta[fmt.version], scale, compressed=False, out=out
            )

        version_tag = {"format_version": fmt.version} if len(self.args.format_versions) > 1 else {}
        self.add("decompress_then_attend", e.measured, self.timer.median_us(dta), **version_tag)
        if self.args.check:
            dta()
            self.checks.append({"batch": self.batch, "context": self.ctx, "data": self.data,
                                "compressible_fraction": e.measured,
                                "decompress_then_attend_rel_err": rel_err(out, e.expect)})  # fmt: skip

    def baselines(self, entry: str, baselines: list[str]) -> None:
        """The named baselines on dense or HND copies of ``entry``'s values (the last version's pages)."""
        batch, ctx, num_pages = self.batch, self.ctx, self.num_pages
        # the same values as the entry's own pages
        pages, self.data = bench_pages(entry, num_pages, self.fmt, self.per, self.page_gen(), "cuda")
        expect = reference(self.q, pages, batch, ctx, self.scale) if self.args.check else None
        k_buf = pages[:, 0].permute(0, 2, 1, 3).reshape(num_pages * 16, HKV, HEAD_DIM)
        v_buf = pages[:, 1].permute(0, 2, 1, 3).reshape(num_pages * 16, HKV, HEAD_DIM)
        for impl in baselines:
            self.baseline(impl, pages, k_buf, v_buf, expect)

    def baseline(self, impl: str, pages: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                 expect: torch.Tensor | None) -> None:  # fmt: skip
        batch, ctx, q, out, scale = self.batch, self.ctx, self.q, self.out, self.scale
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
            us = self.timer.median_us(fn)
            err = rel_err(result(), expect) if self.args.check else None
            self.add(impl, None, us, rel_err=err)
        except Exception as exc:
            self.rows.append({"batch": batch, "context": ctx, "impl": impl, "data": self.data,
                              "compressible_fraction": None, "median_us": None,
                              "error": repr(exc)[:300]})  # fmt: skip
            print(f"  {impl} failed: {exc!r}"[:400], flush=True)


def run_shape(args, timer, batch, ctx, fractions, configs, rows, checks, gen):  # type: ignore[no-untyped-def]
    """Every impl in ``args.impls`` on one (batch, context) over each of ``fractions``: rows into ``rows``,
    checks into ``checks``."""
    shape = ShapeRun(args, timer, batch, ctx, rows, checks, gen)
    shape.read_floor_raw()
    for entry in fractions:
        shape.run_entry(entry, configs)
    baselines = [i for i in ("flashinfer_tc", "sglang_triton", "sdpa_cudnn") if i in args.impls]
    if baselines:
        shape.baselines(fractions[0], baselines)
    del shape  # its buffers, heap_buf among them
    torch.cuda.empty_cache()
