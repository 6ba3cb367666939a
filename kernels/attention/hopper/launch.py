"""The launch of the Hopper decode kernel (decode.py beside this): its compile-time arguments, shared with
the offline compile (bench/kernels/hopper_resources.py), the checks, the kernel launch and the split-KV merge.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import torch
from triton.experimental.gluon import language as ttgl

from ...format.layout import PAGE_TOKENS
from ..decode_config import hopper_lazy_rescale, hopper_lean, hopper_warp_softmax
from ..decode_plan import DecodePlan
from ..merge import merge_splits
from . import layouts as views
from .decode import LOG2E, _decode_hopper_kernel
from .producer_launch import producer_choice, run_producer
from .softmax import M_ROWS

# Registers per thread by (head_dim, warps per program): at 4 warps, 168 leaves three programs per SM at
# head_dim 128 with no spill in the main loop (bench/kernels/hopper_resources.py --maxnreg); the
# compiler's own choice (~225) leaves two. At 2 warps its choice (~224) leaves four; any cap spills.
HOPPER_MAXNREG: dict[tuple[int, int], int] = {(128, 4): 168}


@lru_cache(maxsize=1)
def _default_warp_softmax() -> bool:
    """``$ZIPKV_HOPPER_WARP_SOFTMAX``, read once per process: the launch runs for every layer of every step
    (the worker reads it at start-up too, so a malformed value stops it there)."""
    return hopper_warp_softmax()


@lru_cache(maxsize=1)
def _default_lazy_rescale() -> bool:
    """``$ZIPKV_HOPPER_LAZY_RESCALE``, read once per process (as the softmax choice above)."""
    return hopper_lazy_rescale()


@lru_cache(maxsize=1)
def _default_lean() -> bool:
    """``$ZIPKV_HOPPER_LEAN``, read once per process (as the softmax choice above)."""
    return hopper_lean()


@lru_cache(maxsize=64)
def hopper_constexprs(
    num_kv_heads: int,
    group: int,
    head_dim: int,
    pages_per_tile: int,
    stages: int,
    split: bool,
    gather_all: bool = False,
    warp_softmax: bool = False,
    lazy_rescale: bool = False,
    lean: bool = False,
    pad_hi: bool = False,
) -> dict[str, object]:
    """The kernel's compile-time arguments (the launch and the offline compile share them); ``pad_hi``:
    lean.py's PAD_HI (:func:`pads_hi`)."""
    np_, shared = pages_per_tile, ttgl.SharedLinearLayout
    operand_view = views.page_operand_view if warp_softmax else views.operand_view
    return dict(
        H=num_kv_heads,
        GROUP=group,
        D=head_dim,
        NP=np_,
        STAGES=stages,
        SPLIT=split,
        GATHER_ALL=gather_all,
        OP_K=shared(operand_view(0, np_, head_dim)),
        OP_V=shared(operand_view(1, np_, head_dim)),
        CW=shared(views.code_words_view(np_, head_dim)),
        HW=shared(views.hi_words_view(np_, head_dim)),
        PG1=shared(views.operand_view(1, 1, head_dim)),
        WARP_SOFTMAX=warp_softmax,
        LAZY_RESCALE=lazy_rescale,
        LEAN=lean,
        PAD_HI=pad_hi,
        **({"PX": shared(views.p_exchange_view(16 * np_))} if lean else {}),  # the lean tile's P buffer
    )


def pads_hi(group: int, lean: bool) -> bool:
    """The lean tile's ``PAD_HI`` (lean.py): rows 8-15 of the MMA are padding where the GQA group is at most
    8, and their arithmetic folds away (544 SASS instructions a coded tile against 587 at head_dim 128,
    offline sm_90; 580 at the split cap's 164 registers, docs/benchmarks.md)."""
    return lean and group <= 8


def decode_attention_hopper(
    plan: DecodePlan,
    q: torch.Tensor,
    heap: torch.Tensor,
    page_loc_layer: torch.Tensor,
    page_meta_layer: torch.Tensor,
    sm_scale: float,
    compressed: bool = True,
    out: torch.Tensor | None = None,
    stages: int = 2,
    gather_all: bool = False,
    maxnreg: int | None = None,
    timing: torch.Tensor | None = None,
    warp_softmax: bool | None = None,
    lazy_rescale: bool | None = None,
    lean: bool | None = None,
    pad_hi: bool | None = None,
    producer: int | None = None,
) -> torch.Tensor:
    """bf16 ``[B, Hq, D]`` attention of ``q`` over one layer's v3 pages (sm_90; see the module docstring).

    ``plan.block_n`` is the tile (16 tokens per page). ``compressed=False`` reads every page as a raw page
    (the pages must be raw, as an uncompressed pool's are): the same kernel, the raw path. ``timing``
    (int64 ``[programs, 8]``, profiling only) compiles the variant that stamps each program's start, first
    landed tile, end (global timer, ns) and SM, and an even share's second item (stamps.py;
    bench/kernels/bench_decode_hopper.py --timing reads them).
    ``warp_softmax``: one page per warp, each with its own softmax (hopper/warp_softmax.py); None: the
    default, ``$ZIPKV_HOPPER_WARP_SOFTMAX`` (decode_config.hopper_warp_softmax). ``lazy_rescale``: skip
    the output rescale of tiles where no row max grew (same bits; shared softmax only); None: the default,
    ``$ZIPKV_HOPPER_LAZY_RESCALE`` (decode_config.hopper_lazy_rescale). ``lean``: the lean tile
    (hopper/lean.py; shared softmax only); None: ``$ZIPKV_HOPPER_LEAN`` (decode_config.hopper_lean).
    ``pad_hi``: False keeps the lean tile's padding rows' arithmetic (the same bits; for side-by-side
    timing); None: :func:`pads_hi`'s. ``producer``: the kernel with a producer partition
    (hopper/specialized.py; 1 copies on it, 2 the pre-pass too; the shared softmax, no lazy rescale, no
    timing); None: ``$ZIPKV_HOPPER_PRODUCER``'s where the plan is of its shape
    (producer_launch.producer_fits).
    """
    _check_plan(plan)
    if out is None:
        out = torch.empty_like(q)
    options = _tile_options(plan, warp_softmax, lazy_rescale, lean)
    consts, regs = _plan_constexprs(plan, stages, gather_all, options, maxnreg, pad_hi)
    if not compressed:  # every page read as raw: what an uncompressed pool's metadata says anyway
        page_meta_layer = _raw_meta_like(page_meta_layer)
    tables = (heap, page_loc_layer, page_meta_layer)
    mode = producer_choice(plan, producer, options, timing is not None)
    if mode:
        run_producer(plan, q, out, tables, sm_scale * LOG2E, consts, maxnreg, mode)
    else:
        _run_kernel(plan, q, out, tables, sm_scale * LOG2E, consts, regs, timing)
    if plan.max_splits > 1:
        merge_splits(plan, out, skip_whole=True)  # the kernel wrote the unsplit requests' rows itself
    return out


def _run_kernel(
    plan: DecodePlan,
    q: torch.Tensor,
    out: torch.Tensor,
    tables: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    qk_scale: float,
    consts: dict[str, object],
    regs: int | None,
    timing: torch.Tensor | None,
) -> None:
    """decode.py's launch; ``tables``: (heap, page_loc, page_meta) of the layer."""
    heap, page_loc, page_meta = tables
    even = plan.program_items is not None
    _decode_hopper_kernel[(launch_programs(plan),)](
        q, out, plan.o_partial, plan.lse_partial, heap, heap.view(torch.int16), page_loc, page_meta,
        plan.page_ids, plan.work, plan.num_splits,
        plan.program_items if even else plan.num_splits,  # (unread without even shares)
        qk_scale, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        plan.kv_lens if timing is None else timing,
        **consts,
        TIMING=timing is not None,
        EVEN_SHARES=even,
        num_warps=plan.num_warps,
        **({"maxnreg": regs} if regs else {}),
    )  # fmt: skip


def _plan_constexprs(
    plan: DecodePlan,
    stages: int,
    gather_all: bool,
    options: tuple[bool, bool, bool],
    maxnreg: int | None,
    pad_hi: bool | None,
) -> tuple[dict[str, object], int | None]:
    """(the kernel's compile-time arguments for ``plan``, its register cap); ``options``: _tile_options's."""
    fmt = plan.fmt
    warp_softmax, lazy_rescale, lean = options
    regs = register_cap(maxnreg, fmt.head_dim, plan.num_warps, plan)
    pad = pad_hi is not False and pads_hi(plan.group_size, lean)
    consts = hopper_constexprs(
        fmt.num_kv_heads, plan.group_size, fmt.head_dim, plan.block_n // PAGE_TOKENS, stages,
        plan.max_splits > 1, gather_all, warp_softmax, lazy_rescale, lean, pad,
    )  # fmt: skip
    return consts, regs


def launch_programs(plan: DecodePlan) -> int:
    """Programs the launch runs, KV heads fastest: one per work item and KV head, or with even shares one per
    share (``plan.num_programs``) and KV head."""
    items = plan.num_programs if plan.program_items is not None else plan.num_pairs
    return items * plan.fmt.num_kv_heads


def _tile_options(
    plan: DecodePlan, warp_softmax: bool | None, lazy_rescale: bool | None, lean: bool | None
) -> tuple[bool, bool, bool]:
    """(per-warp softmax, lazy rescale, lean tile) as asked, the environment's where not."""
    warp_softmax = _warp_softmax_choice(plan, warp_softmax)
    lazy = _shared_softmax_option(lazy_rescale, _default_lazy_rescale, warp_softmax, "the lazy rescale")
    return warp_softmax, lazy, _shared_softmax_option(lean, _default_lean, warp_softmax, "the lean tile")


def _warp_softmax_choice(plan: DecodePlan, warp_softmax: bool | None) -> bool:
    """The per-warp softmax as asked, else the environment's, checked against the plan."""
    pages = plan.block_n // PAGE_TOKENS
    warp_softmax = _default_warp_softmax() if warp_softmax is None else warp_softmax
    if warp_softmax and pages != plan.num_warps:
        raise ValueError(
            f"the per-warp softmax gives each warp one page: block_n {plan.block_n} is {pages} pages for "
            f"{plan.num_warps} warps (set block_n = 16 x warps)"
        )
    return warp_softmax


def _shared_softmax_option(
    asked: bool | None, default: Callable[[], bool], warp_softmax: bool, what: str
) -> bool:
    """An option of the shared softmax only (one row max per program: the lazy rescale, the lean tile) as
    asked, refused with the per-warp softmax; unasked, the environment's where it applies."""
    if asked is None:
        return default() and not warp_softmax
    if asked and warp_softmax:
        raise ValueError(f"{what} needs the shared softmax (one row max per program)")
    return asked


def _check_plan(plan: DecodePlan) -> None:
    """What the kernel reads: page format v3, a GQA group of at most M_ROWS query heads."""
    if plan.fmt.version != 3:
        raise ValueError(f"the Hopper decode kernel reads page format v3, got v{plan.fmt.version}")
    if plan.group_size > M_ROWS:
        raise ValueError(f"GQA group {plan.group_size} exceeds the kernel's {M_ROWS} rows")


def register_cap(
    asked: int | None, head_dim: int, num_warps: int, plan: DecodePlan | None = None
) -> int | None:
    """None: the plan's cap (plan_shape.hopper_launch), else HOPPER_MAXNREG's for (head_dim, num_warps);
    0: the compiler's choice."""
    if asked is not None:
        return asked or None
    if plan is not None and plan.maxnreg is not None:
        return plan.maxnreg
    return HOPPER_MAXNREG.get((head_dim, num_warps))


_RAW_META: dict[tuple[tuple[int, ...], torch.device], torch.Tensor] = {}


def _raw_meta_like(meta: torch.Tensor) -> torch.Tensor:
    key = (tuple(meta.shape), meta.device)
    if key not in _RAW_META:
        _RAW_META[key] = torch.full_like(meta, 0xFF)
    return _RAW_META[key]
