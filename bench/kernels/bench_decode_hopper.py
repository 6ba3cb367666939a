"""The Hopper decode kernel (kernels/attention/hopper/decode.py) on the GPU: checked, then timed against
FlashInfer.

``--check`` runs the correctness cases (head_dim 64/128/256, GQA groups 1/4/8, unaligned lengths, split-KV
on and off, pages in random order, raw blocks, raw pages mid-sequence, a raw tail page per request): the
compressed run on v3 pages must be bit-identical to the uncompressed run (``compressed=False``) on raw pages
holding the same values, and within 1e-2 of a float64 reference. ``--bench`` times one layer (32 query /
8 KV heads, head_dim 128) per batch x context: zipkv on v3 pages (each request's last page raw, as in
serving), zipkv on raw pages, FlashInfer's tensor-core decode on the same values, and the read floor of
the stored bytes and of raw bytes (a streaming read). ``--ncu`` launches one shape for Nsight Compute.

    python -m bench.kernels.bench_decode_hopper --check --bench --out bench/results/decode_hopper.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
import traceback
from collections.abc import Callable
from functools import partial

import torch

from bench.kernels.decode_attention_baselines import Timer, flashinfer_fn, read_floor_fn
from zipkv.kernels.attention.decode_config import HOPPER_CONFIG
from zipkv.kernels.attention.decode_plan import choose_max_splits, plan_decode
from zipkv.kernels.attention.hopper.launch import decode_attention_hopper
from zipkv.kernels.format.layout import PAGE_TOKENS, PageFormat
from zipkv.kernels.reference import heap_v3
from zipkv.kernels.reference import pages_v3 as ref
from zipkv.kernels.reference.attention import decode_attention_reference

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
    block_n: int = 64,
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
    )
    if compressed:
        return decode_attention_hopper(
            plan, q, case["heap"], case["loc"], case["meta"], scale, compressed=True, gather_all=gather_all
        )
    loc = torch.arange(case["pages"].shape[0], dtype=torch.int64, device="cuda") * case["fmt"].raw_page_bytes
    return decode_attention_hopper(plan, q, case["raw_heap"], loc, case["raw_meta"], scale, compressed=False)


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


def check(out: dict) -> bool:  # type: ignore[type-arg]
    ok_all = True
    out["checks"] = []
    for i, (lens, h, d, group, raw_mid, shuffle, outliers, splits) in enumerate(CHECKS):
        rec: dict[str, object] = dict(
            lens=lens, kv_heads=h, head_dim=d, group=group, raw_mid=raw_mid, max_splits=splits
        )
        try:
            case = make_case(lens, h, d, group, seed=i, raw_mid=raw_mid, shuffle=shuffle, outliers=outliers)
            q = torch.randn(len(lens), h * group, d, device="cuda").to(torch.bfloat16)
            scale = 1 / math.sqrt(d)
            got = run_case(case, q, scale, splits, compressed=True)
            twin = run_case(case, q, scale, splits, compressed=False)
            gathered = run_case(case, q, scale, splits, compressed=True, gather_all=True)
            refo = decode_attention_reference(
                q, case["pages"], case["page_ids"], case["indptr"], case["lens"], scale
            )
            err = float((got.double() - refo).norm() / refo.norm())
            twin_err = float((twin.double() - refo).norm() / refo.norm())
            same = bool(torch.equal(got.view(torch.int16), twin.view(torch.int16)))
            rec["same_as_gathered"] = bool(torch.equal(got.view(torch.int16), gathered.view(torch.int16)))
            rec["gathered_rel_err"] = float((gathered.double() - refo).norm() / refo.norm())
            rec.update(
                bit_identical=same,
                rel_err=err,
                twin_rel_err=twin_err,
                coded=case["coded_fraction"],
                finite=bool(torch.isfinite(got.float()).all()),
            )
            rec["ok"] = same and err < 1e-2 and twin_err < 1e-2 and rec["finite"]
        except Exception as exc:
            rec.update(
                ok=False, error=f"{type(exc).__name__}: {exc}"[:2000], tb=traceback.format_exc()[-3000:]
            )
        ok_all &= bool(rec["ok"])
        out["checks"].append(rec)
        print("check", json.dumps({k: v for k, v in rec.items() if k != "tb"})[:600], flush=True)
    return ok_all


def _zipkv_fns(
    case: dict,
    q: torch.Tensor,
    o: torch.Tensor,
    scale: float,
    configs: list[tuple[int, ...]],  # type: ignore[type-arg]
    sms: int,
) -> tuple[dict[str, Callable[[], object]], dict[str, int]]:
    """zipkv's timed calls: each config (block_n:stages[:ctas_per_sm[:maxnreg]]) on the v3 pages, and the
    first config on raw pages (the uncompressed run); the split count each used."""
    batch = q.shape[0]
    raw_loc = (
        torch.arange(case["pages"].shape[0], dtype=torch.int64, device="cuda") * case["fmt"].raw_page_bytes
    )
    fns: dict[str, Callable[[], object]] = {}
    splits: dict[str, int] = {}
    for cfg in configs:
        # Without ctas_per_sm / maxnreg a config runs the plan's own split choice and the launch's registers.
        block_n, stages, ctas, maxnreg = (*cfg, None, None)[:4]
        plan = plan_decode(
            case["page_ids"],
            case["indptr"],
            case["lens"],
            case["fmt"],
            32,
            block_n=block_n,
            max_splits=choose_max_splits(batch * 8, sms * ctas) if ctas else None,
        )
        n_splits = plan.max_splits
        tag = "zipkv" if cfg == configs[0] else "zipkv_" + "_".join(map(str, cfg))
        splits[tag] = n_splits
        fns[tag] = partial(
            decode_attention_hopper,
            plan,
            q,
            case["heap"],
            case["loc"],
            case["meta"],
            scale,
            out=o,
            stages=stages,
            maxnreg=maxnreg,
        )
        if cfg == configs[0]:
            fns["zipkv_raw_pages"] = partial(
                decode_attention_hopper,
                plan,
                q,
                case["raw_heap"],
                raw_loc,
                case["raw_meta"],
                scale,
                compressed=False,
                out=o,
                stages=stages,
            )
    return fns, splits


def bench(out: dict, shapes: list[tuple[int, int]], target_s: float, configs: list[tuple[int, ...]]) -> None:  # type: ignore[type-arg]
    timer = Timer(target_s, min_reps=10, max_reps=200)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows: list[dict[str, object]] = []
    out["rows"] = rows
    for batch, ctx in shapes:
        case = make_case([ctx] * batch, 8, 128, 4, seed=1000 + batch, raw_mid=0.0, shuffle=True, outliers=0)
        q = torch.randn(batch, 32, 128, device="cuda").to(torch.bfloat16)
        scale = 1 / math.sqrt(128)
        fns, splits = _zipkv_fns(case, q, torch.empty_like(q), scale, configs, sms)
        fns["flashinfer_tc"] = flashinfer_fn(
            case["pages"][case["page_ids"].long()], q, torch.empty_like(q), batch, ctx, scale
        )
        fns["read_floor_stored"] = read_floor_fn(case["heap"], case["stored_bytes"])
        fns["read_floor_raw"] = read_floor_fn(case["raw_heap"], case["raw_heap"].numel())
        row: dict[str, object] = dict(
            batch=batch,
            ctx=ctx,
            coded_fraction=case["coded_fraction"],
            stored_bytes=case["stored_bytes"],
            raw_bytes=case["raw_heap"].numel(),
            splits=splits,
        )
        for name, fn in fns.items():
            try:
                row[name + "_us"] = timer.median_us(fn)
            except Exception as exc:  # one failing implementation must not hide the others
                row[name + "_error"] = f"{type(exc).__name__}: {exc}"[:500]
        if "zipkv_us" in row and "flashinfer_tc_us" in row:
            row["speedup_vs_flashinfer"] = float(row["flashinfer_tc_us"]) / float(row["zipkv_us"])  # type: ignore[arg-type]
            row["of_stored_floor"] = float(row["read_floor_stored_us"]) / float(row["zipkv_us"])  # type: ignore[arg-type]
        rows.append(row)
        print("bench", json.dumps(row), flush=True)
        del case, fns
        torch.cuda.empty_cache()


def ncu_target(batch: int, ctx: int, launches: int) -> None:
    case = make_case([ctx] * batch, 8, 128, 4, seed=7, raw_mid=0.0, shuffle=True, outliers=0)
    q = torch.randn(batch, 32, 128, device="cuda").to(torch.bfloat16)
    plan = plan_decode(case["page_ids"], case["indptr"], case["lens"], case["fmt"], 32, block_n=64)
    for _ in range(launches):
        decode_attention_hopper(plan, q, case["heap"], case["loc"], case["meta"], 1 / math.sqrt(128))
    torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--shapes", default="32x8192,64x8192,128x8192,32x32768,1x32768,32x4096,8x8192")
    ap.add_argument("--target-s", type=float, default=0.03)
    ap.add_argument(
        "--configs", default="64:3", help="block_n:stages[:ctas_per_sm[:maxnreg]], first is the default"
    )
    ap.add_argument("--ncu", default=None, help="BxT: launch that shape a few times (for Nsight Compute)")
    ap.add_argument("--out", default="bench/results/decode_hopper.json")
    a = ap.parse_args()
    if a.ncu:
        b, t = (int(x) for x in a.ncu.split("x"))
        ncu_target(b, t, launches=4)
        return
    out: dict[str, object] = dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        python=platform.python_version(),
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        command="python -m bench.kernels.bench_decode_hopper "
        + " ".join(
            x
            for x in (("--check" if a.check else ""), ("--bench" if a.bench else ""), f"--shapes {a.shapes}")
            if x
        ),
    )
    import triton

    out["triton"] = triton.__version__
    ok = True
    if a.check:
        ok = check(out)
    if a.bench:
        configs = [tuple(int(x) for x in c.split(":")) for c in a.configs.split(",")]
        bench(out, [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")], a.target_s, configs)  # type: ignore[misc,arg-type]
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", a.out, "checks ok" if ok else "CHECKS FAILED", flush=True)


if __name__ == "__main__":
    main()
