"""The launch of the Hopper decode kernel with a producer partition (specialized.py beside this): whether a
plan runs it, and its launch (launch.py's decode_attention_hopper calls these, and merges the splits)."""

from __future__ import annotations

import torch

from ...format.layout import PAGE_TOKENS
from ..decode_plan import DecodePlan, producer_mode
from .specialized import PRODUCER_MAXNREG, _decode_hopper_producer_kernel


def producer_fits(plan: DecodePlan) -> bool:
    """Whether the producer kernel runs ``plan``: four consumer warps, one page each a tile, one work item
    a program (no even shares)."""
    return plan.num_warps == 4 and plan.block_n == PAGE_TOKENS * 4 and plan.program_items is None


def producer_choice(
    plan: DecodePlan, asked: int | None, options: tuple[bool, bool, bool], timing: bool
) -> int:
    """The producer kernel's mode as asked (0 none, 1 copies, 2 copies and the pre-pass), else
    ``$ZIPKV_HOPPER_PRODUCER``'s (decode_plan.producer_mode, read once per process) where the plan fits
    it; refused, loudly, with what it does not run (``options``: _tile_options's)."""
    fits = producer_fits(plan)
    mode = (producer_mode() if fits else 0) if asked is None else int(asked)
    if mode not in (0, 1, 2):
        raise ValueError(f"producer must be 0, 1 or 2, got {asked!r}")
    if not mode:
        return 0
    warp_softmax, lazy_rescale, _ = options
    if not fits:
        raise ValueError(
            f"the producer kernel runs 64-token tiles over 4 warps, one item a program: this plan has "
            f"block_n {plan.block_n}, {plan.num_warps} warps"
            + (", even shares" if plan.program_items is not None else "")
        )
    if warp_softmax or lazy_rescale or timing:
        raise ValueError(
            "the producer kernel runs the shared softmax without the lazy rescale or timing stamps: unset "
            "$ZIPKV_HOPPER_WARP_SOFTMAX / $ZIPKV_HOPPER_LAZY_RESCALE, or $ZIPKV_HOPPER_PRODUCER"
        )
    return mode


def run_producer(
    plan: DecodePlan,
    q: torch.Tensor,
    out: torch.Tensor,
    tables: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    qk_scale: float,
    consts: dict[str, object],
    maxnreg: int | None,
    mode: int = 1,
) -> None:
    """The producer kernel's launch (hopper/specialized.py; the caller merges the splits); ``tables``:
    (heap, page_loc, page_meta) of the layer. Capped at PRODUCER_MAXNREG registers a thread unless
    ``maxnreg`` is given. ``mode``: producer_choice's (2: the pre-pass on the producer warps)."""
    heap, page_loc, page_meta = tables
    fn = _decode_hopper_producer_kernel
    kernel_consts = {k: v for k, v in consts.items() if k in fn.arg_names}
    fn[(plan.num_pairs * plan.fmt.num_kv_heads,)](
        q, out, plan.o_partial, plan.lse_partial, heap, heap.view(torch.int16), page_loc, page_meta,
        plan.page_ids, plan.work, plan.num_splits, qk_scale, q.stride(0), q.stride(1), out.stride(0),
        out.stride(1), **kernel_consts, PREPASS=mode == 2, num_warps=4, maxnreg=maxnreg or PRODUCER_MAXNREG,
    )  # fmt: skip
