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
from collections.abc import Callable
from functools import partial

import torch

from bench.kernels.decode_attention_baselines import Timer, flashinfer_ragged_fn, read_floor_fn
from bench.kernels.hopper_cases import check, make_case, same_bits
from zipkv.kernels.attention.decode_config import HOPPER_CONFIG
from zipkv.kernels.attention.decode_plan import DecodePlan, plan_decode
from zipkv.kernels.attention.hopper.launch import decode_attention_hopper, launch_programs
from zipkv.kernels.attention.hopper.stamps import STAMP_COLUMNS
from zipkv.kernels.attention.plan_shape import choose_max_splits


def _even_programs(sms: int, ctas_per_sm: int | None = None) -> int:
    """Programs per KV head (8 in every case here) for even shares: the ones a launch holds at
    ``ctas_per_sm`` (HOPPER_CONFIG's) programs per SM."""
    return sms * (ctas_per_sm or HOPPER_CONFIG.ctas_per_sm) // 8


def _zipkv_fns(
    case: dict,
    q: torch.Tensor,
    o: torch.Tensor,
    scale: float,
    configs: list[tuple[int, ...]],  # type: ignore[type-arg]
    sms: int,
) -> tuple[dict[str, Callable[[], object]], dict[str, Callable[[], object]], dict[str, int]]:
    """zipkv's calls per config (a prefix of block_n:stages:ctas_per_sm:maxnreg:warps:warp_softmax:lazy:lean:
    splits:even:pad:producer; even 1: the batch's tiles shared evenly over ctas_per_sm (HOPPER_CONFIG's)
    programs per SM, split_plan.program_items; pad 0: the lean tile's padding rows computed, launch.pads_hi's
    otherwise; producer 1: the kernel with a producer partition, hopper/specialized.py, whose shape is
    64:S:2:0:4; 2: its producer warps run the pre-pass too): on the v3 pages (timed) and on raw pages
    holding the same values (timed for the first config, the uncompressed run; checked bit for bit against
    the v3 run for every config); the split count each used."""
    batch = q.shape[0]
    raw_loc = (
        torch.arange(case["pages"].shape[0], dtype=torch.int64, device="cuda") * case["fmt"].raw_page_bytes
    )
    fns: dict[str, Callable[[], object]] = {}
    raw_fns: dict[str, Callable[[], object]] = {}
    splits: dict[str, int] = {}
    for cfg in configs:
        # Without ctas_per_sm / maxnreg / warps a config runs the plan's own split choice, the launch's
        # registers and the default warps per program.
        block_n, stages, ctas, maxnreg, warps, ws, lazy, lean, asked, even, pad, prod = (*cfg, *[None] * 11)[
            :12
        ]
        # splits: each request's split count, asked outright (the wave model's otherwise, for ctas_per_sm)
        wave_splits = choose_max_splits(batch * 8, sms * ctas) if ctas and not even else None
        programs = _even_programs(sms, ctas) if even else None
        plan = plan_decode(
            case["page_ids"],
            case["indptr"],
            case["lens"],
            case["fmt"],
            32,
            block_n=block_n,
            max_splits=asked or wave_splits,
            num_warps=warps,
            programs=programs,
        )
        tag = "zipkv" if cfg == configs[0] else "zipkv_" + "_".join(map(str, cfg))
        splits[tag] = int(plan.num_splits.max())  # the longest request's
        run = partial(
            decode_attention_hopper, plan, q, sm_scale=scale, out=o, stages=stages,
            maxnreg=plan.maxnreg if not maxnreg and plan.maxnreg else maxnreg,  # 0: the plan's, if it caps
            warp_softmax=None if ws is None else bool(ws), lazy_rescale=None if lazy is None else bool(lazy),
            lean=None if lean is None else bool(lean), pad_hi=None if pad is None else bool(pad),
            producer=prod,
        )  # fmt: skip
        fns[tag] = partial(run, case["heap"], case["loc"], case["meta"])
        raw_fns[tag] = partial(run, case["raw_heap"], raw_loc, case["raw_meta"], compressed=False)
    fns["zipkv_raw_pages"] = raw_fns["zipkv"]
    return fns, raw_fns, splits


def _same_bits(fn: Callable[[], object], raw_fn: Callable[[], object], o: torch.Tensor) -> bool:
    fn()
    coded = o.clone()
    raw_fn()
    return same_bits(coded, o) and bool(coded.isfinite().all())


def parse_shapes(spec: str) -> list[list[int]]:
    """``32x8192,1x87040+17x6400``: each shape's request lengths; ``+`` joins groups into one batch (a
    skewed batch: one long request among short ones, as the Mooncake trace's batches are)."""
    return [[int(t) for g in s.split("+") for t in [g.split("x")[1]] * int(g.split("x")[0])]
            for s in spec.split(",")]  # fmt: skip


def bench(out: dict, shapes: list[list[int]], target_s: float, configs: list[tuple[int, ...]],  # type: ignore[type-arg]
          graph: bool = False) -> None:  # fmt: skip
    timer = Timer(target_s, min_reps=10, max_reps=200)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows: list[dict[str, object]] = []
    out["rows"] = rows
    for lens in shapes:
        batch, ctx = len(lens), max(lens)
        case = make_case(lens, 8, 128, 4, seed=1000 + batch, raw_mid=0.0, shuffle=True, outliers=0)
        q = torch.randn(batch, 32, 128, device="cuda").to(torch.bfloat16)
        scale = 1 / math.sqrt(128)
        o = torch.empty_like(q)
        fns, raw_fns, splits = _zipkv_fns(case, q, o, scale, configs, sms)
        fns["flashinfer_tc"] = flashinfer_ragged_fn(
            case["pages"][case["page_ids"].long()], q, torch.empty_like(q), lens, scale
        )
        fns["read_floor_stored"] = read_floor_fn(case["heap"], case["stored_bytes"])
        fns["read_floor_raw"] = read_floor_fn(case["raw_heap"], case["raw_heap"].numel())
        row: dict[str, object] = dict(
            batch=batch,
            ctx=ctx,
            kv_tokens=sum(lens),
            coded_fraction=case["coded_fraction"],
            stored_bytes=case["stored_bytes"],
            raw_bytes=case["raw_heap"].numel(),
            splits=splits,
            raw_pages_bit_identical={tag: _same_bits(fns[tag], raw_fns[tag], o) for tag in raw_fns},
            # a variant meant to change no bit (the lazy rescale) must match the first config exactly
            bit_identical_to_first={tag: _same_bits(fns["zipkv"], fns[tag], o) for tag in raw_fns},
        )
        for name, fn in fns.items():
            try:
                row[name + "_us"] = timer.median_us(fn, graph=graph)
            except Exception as exc:  # one failing implementation must not hide the others
                row[name + "_error"] = f"{type(exc).__name__}: {exc}"[:500]
        if "zipkv_us" in row and "flashinfer_tc_us" in row:
            row["speedup_vs_flashinfer"] = float(row["flashinfer_tc_us"]) / float(row["zipkv_us"])  # type: ignore[arg-type]
            row["of_stored_floor"] = float(row["read_floor_stored_us"]) / float(row["zipkv_us"])  # type: ignore[arg-type]
        rows.append(row)
        print("bench", json.dumps(row), flush=True)
        del case, fns
        torch.cuda.empty_cache()


def ncu_target(batch: int, ctx: int, launches: int, even: bool = False) -> None:
    """``launches`` launches of the plan's own launch at ``batch x ctx`` (``even``: with even shares)."""
    case = make_case([ctx] * batch, 8, 128, 4, seed=7, raw_mid=0.0, shuffle=True, outliers=0)
    q = torch.randn(batch, 32, 128, device="cuda").to(torch.bfloat16)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    programs = _even_programs(sms) if even else None
    plan = plan_decode(case["page_ids"], case["indptr"], case["lens"], case["fmt"], 32, programs=programs)
    for _ in range(launches):
        decode_attention_hopper(plan, q, case["heap"], case["loc"], case["meta"], 1 / math.sqrt(128))
    torch.cuda.synchronize()


def timing(out: dict, shapes: list[tuple[int, int]], even: bool = False) -> None:  # type: ignore[type-arg]
    """Per-program timeline (the kernel's TIMING build) of the plan's launch and, with ``even``, of even
    shares beside it: how long a program waits for its first tile, its time per tile after that, how full
    the SMs stay (programs resident over the launch's span, against the slots); with even shares also how
    long a second item waits for its first tile, and the whole call's time (the merge included)."""
    out["timing"] = rows = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    timer = Timer(0.03, min_reps=10, max_reps=100)
    for batch, ctx in shapes:
        case = make_case([ctx] * batch, 8, 128, 4, seed=7, raw_mid=0.0, shuffle=True, outliers=0)
        q = torch.randn(batch, 32, 128, device="cuda").to(torch.bfloat16)
        for programs in [None, _even_programs(sms)] if even else [None]:
            plan = plan_decode(
                case["page_ids"], case["indptr"], case["lens"], case["fmt"], 32, programs=programs
            )
            row = _timeline(plan, q, case, sms, timer)
            row.update(batch=batch, ctx=ctx, even_shares=programs is not None)
            print("timing", json.dumps({k: v for k, v in row.items() if k != "stamps_ns"}), flush=True)
            rows.append(row)
        del case
        torch.cuda.empty_cache()


def _timeline(plan: DecodePlan, q: torch.Tensor, case: dict, sms: int, timer: Timer) -> dict[str, object]:  # type: ignore[type-arg]
    """One launch's stamps (the third of three), summarised; ``stamps_ns`` keeps them all."""
    launch = partial(decode_attention_hopper, plan, q, case["heap"], case["loc"], case["meta"], 0.088)
    programs = launch_programs(plan)
    stamps = torch.zeros(programs, STAMP_COLUMNS.value, dtype=torch.int64, device="cuda")
    for _ in range(3):
        launch(timing=stamps)
    torch.cuda.synchronize()
    t = stamps.cpu().double()
    t0 = t[:, 0].min()
    start, end = (t[:, 0] - t0) / 1e3, (t[:, 2] - t0) / 1e3
    span = float(end.max())
    live = t[:, 1] > 0  # idle programs (the plan's spare items) never land a tile: left out of the times
    start, first, end = start[live], (t[live, 1] - t0) / 1e3, end[live]
    q50 = lambda x: float(x.median())
    row: dict[str, object] = dict(
        programs=programs, idle_programs=int((~live).sum()), splits=int(plan.num_splits.max()),
        call_us=timer.median_us(launch),
        span_us=span, first_tile_wait_us_p50=q50(first - start),
        first_tile_wait_us_p90=float((first - start).quantile(0.9)),
        program_us_p50=q50(end - start), program_us_p10=float((end - start).quantile(0.1)),
        start_us_max=float(start.max()), end_us_p10=float(end.quantile(0.1)),
        mean_resident_programs_per_sm=float((end - start).sum()) / span / sms,  # (the live ones)
        programs_per_sm_max=int(torch.bincount(t[:, 3].long()).max()),
    )  # fmt: skip
    if plan.program_items is None:
        tiles = -(-int(plan.split_tokens[0]) // plan.block_n)
        row.update(tiles_per_program=tiles, per_tile_us_p50=q50((end - first) / max(tiles - 1, 1)))
    else:
        second = t[:, 4] > 0  # programs with a second item
        wait2 = (t[second, 5] - t[second, 4]) / 1e3
        row["programs_with_two_items"] = int(second.sum())
        if len(wait2):
            row.update(second_item_first_tile_wait_us_p50=q50(wait2),
                       second_item_first_tile_wait_us_p90=float(wait2.quantile(0.9)))  # fmt: skip
    rel = t[:, :6].clone()
    rel[:, :3] -= t0
    rel[:, 4:] = torch.where(rel[:, 4:] > 0, rel[:, 4:] - t0, -1)  # -1: no second item
    # [programs][start, first tile, end (ns from the first), SM, second item's start, its first tile]
    row["stamps_ns"] = rel.long().tolist()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--check-jobs", type=int, default=1, help="--check: processes running the cases at once")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--shapes", default="32x8192,64x8192,128x8192,32x32768,1x32768,32x4096,8x8192")
    ap.add_argument("--target-s", type=float, default=0.03)
    ap.add_argument(
        "--configs",
        default="32:2",
        help="block_n:stages[:ctas_per_sm[:maxnreg[:warps[:warp_softmax[:lazy_rescale[:lean[:splits]]]]]]]],"
        " first is the baseline (ctas_per_sm 0: the plan's splits; maxnreg 0: the compiler's registers;"
        " splits: every request's split count, else the wave model's for ctas_per_sm)",
    )
    ap.add_argument("--graph", action="store_true", help="time CUDA-graph replays (no host launch time)")
    ap.add_argument("--timing", default=None, help="BxT,...: per-program timeline (the TIMING build)")
    ap.add_argument("--timing-even", action="store_true", help="--timing: even shares too, beside the plan")
    ap.add_argument("--ncu", default=None, help="BxT: launch that shape a few times (for Nsight Compute)")
    ap.add_argument("--ncu-even", action="store_true", help="--ncu: with even shares")
    ap.add_argument("--out", default="bench/results/decode_hopper.json")
    a = ap.parse_args()
    if a.ncu:
        b, t = (int(x) for x in a.ncu.split("x"))
        ncu_target(b, t, launches=4, even=a.ncu_even)
        return
    out: dict[str, object] = dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        python=platform.python_version(),
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        command="python -m bench.kernels.bench_decode_hopper "
        + " ".join(
            x
            for x in (
                ("--check" if a.check else ""),
                ("--bench" if a.bench else ""),
                ("--graph" if a.graph else ""),
                f"--configs {a.configs}",
                f"--shapes {a.shapes}",
            )
            if x
        ),
    )
    import triton

    out["triton"] = triton.__version__
    ok = True
    if a.check:
        ok = check(out, jobs=a.check_jobs)
    if a.timing:
        shapes = [tuple(int(x) for x in s.split("x")) for s in a.timing.split(",")]
        timing(out, shapes, even=a.timing_even)  # type: ignore[arg-type]
    if a.bench:
        configs = [tuple(int(x) for x in c.split(":")) for c in a.configs.split(",")]
        out["timed"] = "cuda_graph_replay" if a.graph else "eager"
        bench(out, parse_shapes(a.shapes), a.target_s, configs, graph=a.graph)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", a.out, "checks ok" if ok else "CHECKS FAILED", flush=True)


if __name__ == "__main__":
    main()
