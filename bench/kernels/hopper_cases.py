"""The Hopper decode kernel's GPU test cases (bench/kernels/bench_decode_hopper.py --check): random bf16
pages stored as page format v3 and as raw pages, and the checks that the kernel on v3 pages is
bit-identical to itself on raw pages holding the same values (and to its gather path), within 1e-2 of a
float64 reference, at head_dim 64/128/256, GQA groups 1/4/8 and 1, 2 or 4 warps per program.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import traceback
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import TypeVar

import torch

from bench.kernels.decode_attention_baselines import rel_err
from zipkv.kernels.attention.decode_config import HOPPER_CONFIG
from zipkv.kernels.attention.decode_plan import plan_decode
from zipkv.kernels.attention.hopper.launch import decode_attention_hopper
from zipkv.kernels.format.layout import PAGE_TOKENS, PageFormat
from zipkv.kernels.reference import heap_v3
from zipkv.kernels.reference import pages_v3 as ref
from zipkv.kernels.reference.attention import decode_attention_reference

R = TypeVar("R")
CTAS_PER_SM = HOPPER_CONFIG.ctas_per_sm  # the plan's programs per SM (kernels/attention/decode_config.py)


def make_case(
    lens: list[int],
    kv_heads: int,
    head_dim: int,
    group: int,
    seed: int,
    raw_mid: float,
    shuffle: bool,
    outliers: int,
) -> dict:  # type: ignore[type-arg]
    """Random bf16 K/V pages for requests of ``lens`` tokens, stored as v3 (coded where the format allows,
    each request's last page and a ``raw_mid`` share of the others raw) and as raw pages."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    fmt = PageFormat(head_dim=head_dim, num_kv_heads=kv_heads, version=3)
    per = [-(-n // PAGE_TOKENS) for n in lens]
    n_pages = sum(per)
    pages = torch.randn(n_pages, 2, kv_heads, PAGE_TOKENS, head_dim, device="cuda", generator=g).to(
        torch.bfloat16
    )
    if outliers:  # values far outside their block's window: raw blocks inside coded pages
        idx = torch.randint(0, pages.numel(), (outliers,), device="cuda", generator=g)
        pages.view(-1)[idx] = 3e4
    order = (
        torch.randperm(n_pages, device="cuda", generator=g)
        if shuffle
        else torch.arange(n_pages, device="cuda")
    )
    page_ids = order.to(torch.int32)
    indptr = torch.tensor([0, *torch.tensor(per).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    heap, loc, meta = heap_v3.pack_pages_v3(pages, fmt)
    force_raw = torch.rand(n_pages, device="cuda", generator=g) < raw_mid
    force_raw[page_ids[(indptr[1:] - 1).long()].long()] = True  # each request's tail page is raw
    rows = heap.view(n_pages, fmt.raw_page_bytes)
    rows[force_raw] = pages[force_raw].contiguous().view(torch.uint8).reshape(-1, fmt.raw_page_bytes)
    meta[force_raw] = 0xFF
    raw_heap = pages.contiguous().view(torch.uint8).reshape(-1)
    raw_meta = torch.full_like(meta, 0xFF)
    stored = int(ref.stored_page_bytes(meta, fmt).sum()) + meta.numel()
    return dict(
        fmt=fmt,
        pages=pages,
        page_ids=page_ids,
        indptr=indptr,
        lens=torch.tensor(lens, dtype=torch.int32, device="cuda"),
        heap=heap,
        loc=loc,
        meta=meta,
        raw_heap=raw_heap,
        raw_meta=raw_meta,
        stored_bytes=stored,
        coded_fraction=coded_fraction(meta),
    )


def coded_fraction(meta: torch.Tensor) -> float:
    m = meta.view(meta.shape[0], -1)
    coded_pages = m[:, 0] != 0xFF
    blocks = m[coded_pages]
    return float((blocks < 0x80).sum()) / max(1, m.numel())


def run_case(  # type: ignore[type-arg]
    case: dict,
    q: torch.Tensor,
    scale: float,
    max_splits: int | None,
    compressed: bool,
    gather_all: bool = False,
    block_n: int | None = None,
    warps: int | None = None,
    warp_softmax: bool | None = None,
    programs: int | None = None,
    producer: int | None = None,
) -> torch.Tensor:
    plan = plan_decode(
        case["page_ids"],
        case["indptr"],
        case["lens"],
        case["fmt"],
        q.shape[1],
        block_n=block_n,
        max_splits=max_splits,
        ctas_per_sm=CTAS_PER_SM,
        num_warps=warps,
        programs=programs,
    )
    if compressed:
        return decode_attention_hopper(
            plan, q, case["heap"], case["loc"], case["meta"], scale, compressed=True, gather_all=gather_all,
            warp_softmax=warp_softmax, producer=producer,
        )  # fmt: skip
    loc = torch.arange(case["pages"].shape[0], dtype=torch.int64, device="cuda") * case["fmt"].raw_page_bytes
    return decode_attention_hopper(
        plan, q, case["raw_heap"], loc, case["raw_meta"], scale, compressed=False, warp_softmax=warp_softmax,
        producer=producer,
    )  # fmt: skip


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit the same bf16 outputs (compared as int16, so -0.0 != 0.0 and NaN payloads count)."""
    return bool(torch.equal(a.view(torch.int16), b.view(torch.int16)))


CHECKS = [  # (lens, kv_heads, head_dim, group, raw_mid, shuffle, outliers, max_splits)
    ([128, 256], 2, 128, 4, 1.0, False, 0, 1),  # every page raw: the raw path (and the tail)
    ([40, 17], 2, 128, 4, 0.0, False, 0, 1),  # partial tiles only: the gather path
    ([1000, 64, 1, 517], 2, 128, 4, 0.0, True, 40, 1),
    ([1000, 64, 1, 517], 2, 128, 4, 0.2, True, 40, None),
    ([4096, 333], 8, 128, 4, 0.05, True, 200, None),
    ([2048], 1, 128, 8, 0.0, False, 0, 1),
    ([700, 129], 4, 64, 1, 0.1, True, 30, None),
    ([700, 129], 2, 256, 4, 0.1, True, 30, None),
    ([640, 96], 2, 64, 8, 0.0, True, 10, 2),
    ([3000], 1, 256, 1, 0.3, True, 50, 4),
]


WARP_CHECKS = (1, 2, 3, 6, 8)  # the cases also run with 1 and 2 warps per program


def _warp_softmax_check(case: dict, q: torch.Tensor, scale: float, splits: int | None,  # type: ignore[type-arg]
                        refo: torch.Tensor) -> dict[str, object]:  # fmt: skip
    """The per-warp softmax (each warp its own page) against its own raw-page and gathered runs, bit for
    bit, and against the float64 reference, at the default tile and warps and at 1 warp x 1 page."""
    rec: dict[str, object] = {}
    ok = True
    for w in (None, 1):
        shape = dict(block_n=None if w is None else 16 * w, warps=w, warp_softmax=True)
        got = run_case(case, q, scale, splits, compressed=True, **shape)  # type: ignore[arg-type]
        raw = run_case(case, q, scale, splits, compressed=False, **shape)  # type: ignore[arg-type]
        gathered = run_case(case, q, scale, splits, compressed=True, gather_all=True, **shape)  # type: ignore[arg-type]
        r = dict(bit_identical=same_bits(got, raw), same_as_gathered=same_bits(got, gathered),
                 rel_err=rel_err(got, refo), finite=bool(torch.isfinite(got.float()).all()))  # fmt: skip
        ok = ok and all(r[k] for k in ("bit_identical", "same_as_gathered", "finite")) and r["rel_err"] < 1e-2
        rec["default" if w is None else f"warps{w}"] = r
    rec["ok"] = ok
    return rec


def _producer_check(case: dict, q: torch.Tensor, scale: float, splits: int | None,  # type: ignore[type-arg]
                    refo: torch.Tensor) -> dict[str, object]:  # fmt: skip
    """The kernel with a producer partition (hopper/specialized.py, its 64-token tile over 4 warps; mode 1
    copies on the producer warps, 2 the pre-pass too) against its own raw-page and gathered runs, bit for
    bit, and against the float64 reference."""
    rec: dict[str, object] = {}
    for mode in (1, 2):
        shape = dict(block_n=64, warps=4, producer=mode)
        got = run_case(case, q, scale, splits, compressed=True, **shape)  # type: ignore[arg-type]
        raw = run_case(case, q, scale, splits, compressed=False, **shape)  # type: ignore[arg-type]
        gathered = run_case(case, q, scale, splits, compressed=True, gather_all=True, **shape)  # type: ignore[arg-type]
        err = rel_err(got, refo)
        same, same_gathered = same_bits(got, raw), same_bits(got, gathered)
        finite = bool(torch.isfinite(got.float()).all())
        ok = same and same_gathered and finite and err < 1e-2
        rec[f"mode{mode}"] = dict(
            bit_identical=same, same_as_gathered=same_gathered, rel_err=err, finite=finite
        )
        rec["ok"] = rec.get("ok", True) and ok
    return rec


EVEN_SHARES_PROGRAMS = (1, 3, 7)  # programs per KV head: one program holding every item, and a few


def _even_shares_check(case: dict, q: torch.Tensor, scale: float, refo: torch.Tensor) -> dict[str, object]:  # type: ignore[type-arg]
    """Even shares (split_plan.program_items): programs that run one, two or more items in turn, each
    against its raw-page run bit for bit and against the float64 reference."""
    rec: dict[str, object] = {}
    ok = True
    for p in EVEN_SHARES_PROGRAMS:
        got = run_case(case, q, scale, None, compressed=True, programs=p)
        raw = run_case(case, q, scale, None, compressed=False, programs=p)
        r = dict(bit_identical=same_bits(got, raw), rel_err=rel_err(got, refo),
                 finite=bool(torch.isfinite(got.float()).all()))  # fmt: skip
        ok = ok and bool(r["bit_identical"]) and bool(r["finite"]) and float(r["rel_err"]) < 1e-2  # type: ignore[arg-type]
        rec[f"programs{p}"] = r
    rec["ok"] = ok
    return rec


def check(out: dict, jobs: int = 1) -> bool:  # type: ignore[type-arg]
    """Every case of CHECKS, each printed as a line as it completes, all in ``out["checks"]`` in CHECKS'
    order. ``jobs`` > 1: that many processes, one case each at a time. A case's time is mostly compiling
    the kernel's variants (a single CPU thread each): in one process the ten took more than the 200 s a GPU
    call could give them, and the last three never ran (docs/benchmarks.md)."""
    done: dict[int, dict[str, object]] = {}
    for i, rec in map_in_processes(check_one, range(len(CHECKS)), jobs):
        done[i] = rec
        print(
            "check", json.dumps({"case": i} | {k: v for k, v in rec.items() if k != "tb"})[:600], flush=True
        )
    out["checks"] = [done[i] for i in sorted(done)]
    return all(bool(rec["ok"]) for rec in out["checks"])


def map_in_processes(fn: Callable[[int], R], items: Iterable[int], jobs: int) -> Iterator[tuple[int, R]]:
    """``(item, fn(item))`` for every item, in order with ``jobs`` <= 1; else in that many fresh processes
    (spawned, so each has its own CUDA context; ``fn`` must be importable), as each completes."""
    if jobs <= 1:
        yield from ((i, fn(i)) for i in items)
        return
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        futures = {pool.submit(fn, i): i for i in items}
        for fut in as_completed(futures):
            yield futures[fut], fut.result()


def check_inputs(i: int) -> tuple[dict, torch.Tensor, float, torch.Tensor]:  # type: ignore[type-arg]
    """Case ``i`` of CHECKS built: (its pages, the queries, the softmax scale, the float64 reference), the
    same in any process."""
    lens, h, d, group, raw_mid, shuffle, outliers, _ = CHECKS[i]
    torch.manual_seed(i)
    case = make_case(lens, h, d, group, seed=i, raw_mid=raw_mid, shuffle=shuffle, outliers=outliers)
    q = torch.randn(len(lens), h * group, d, device="cuda").to(torch.bfloat16)
    scale = 1 / math.sqrt(d)
    refo = decode_attention_reference(q, case["pages"], case["page_ids"], case["indptr"], case["lens"], scale)
    return case, q, scale, refo


def check_one(i: int) -> dict[str, object]:
    """Case ``i`` of CHECKS: v3 pages against raw pages and the gather path, bit for bit, and against the
    float64 reference; the per-warp softmax, even shares, the producer partition and (WARP_CHECKS) 1 and 2
    warps a program."""
    lens, h, d, group, raw_mid, _, _, splits = CHECKS[i]
    rec: dict[str, object] = dict(
        lens=lens, kv_heads=h, head_dim=d, group=group, raw_mid=raw_mid, max_splits=splits
    )
    try:
        case, q, scale, refo = check_inputs(i)
        got = run_case(case, q, scale, splits, compressed=True)
        twin = run_case(case, q, scale, splits, compressed=False)
        gathered = run_case(case, q, scale, splits, compressed=True, gather_all=True)
        err = rel_err(got, refo)
        twin_err = rel_err(twin, refo)
        same = same_bits(got, twin)
        rec["same_as_gathered"] = same_bits(got, gathered)
        rec["gathered_rel_err"] = rel_err(gathered, refo)
        rec.update(
            bit_identical=same,
            rel_err=err,
            twin_rel_err=twin_err,
            coded=case["coded_fraction"],
            finite=bool(torch.isfinite(got.float()).all()),
        )
        rec["ok"] = same and err < 1e-2 and twin_err < 1e-2 and rec["finite"]
        warp_rec = _warp_softmax_check(case, q, scale, splits, refo)
        rec["warp_softmax"] = warp_rec
        even_rec = _even_shares_check(case, q, scale, refo)
        rec["even_shares"] = even_rec
        prod_rec = _producer_check(case, q, scale, splits, refo)
        rec["producer"] = prod_rec
        rec["ok"] = rec["ok"] and bool(warp_rec["ok"]) and bool(even_rec["ok"]) and bool(prod_rec["ok"])
        if i in WARP_CHECKS:  # fewer warps per program, one page per warp: the same bits on raw pages
            for w in (1, 2):
                got_w = run_case(case, q, scale, splits, compressed=True, block_n=16 * w, warps=w)
                twin_w = run_case(case, q, scale, splits, compressed=False, block_n=16 * w, warps=w)
                err_w = rel_err(got_w, refo)
                same_w = same_bits(got_w, twin_w)
                rec[f"warps{w}"] = dict(bit_identical=same_w, rel_err=err_w)
                rec["ok"] = rec["ok"] and same_w and err_w < 1e-2
    except Exception as exc:
        rec.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:2000], tb=traceback.format_exc()[-3000:])
    return rec
