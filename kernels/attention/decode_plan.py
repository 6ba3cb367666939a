"""The per-step plan of the fused decode attention kernel (kernels/attention/decode.py).

Like FlashInfer's plan/run split: :func:`plan_decode` runs once per decode step and builds the batch's
metadata (how each request's context is cut into splits, the scratch for the split-KV merge); every
layer's :func:`~zipkv.kernels.attention.decode.decode_attention` call reuses it. Nothing here syncs with
the device: the grid depends only on the batch size and the model shape, and each request's split count
and split length are computed on the device from its ``kv_lens``.

Split-KV over a work list: one program handles one (work item, KV head); a work item is one split of one
request's context. When batch x KV heads cannot fill the GPU (batch 1 at long context), contexts are cut
into splits, and a second small kernel merges each request's partial outputs by their log-sum-exp. The
splits are balanced over the whole batch, as FlashInfer's planner does: every split reads about the same
number of tiles, the smallest length for which all splits fit ``pair_slots`` work items (whole waves of
the GPU, ``max_waves`` of them). A request 10x longer than the others gets 10x the splits; with the split
count per request fixed instead, a batch of the Mooncake trace (one 87k-token request among 2-15k-token
ones) left the GPU idle behind the long request's few programs (47.7 ms a step where SGLang took 22.6,
docs/benchmarks.md, "Serving under SLO"). How many items and splits, and the Hopper launch's shape:
plan_shape.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import torch

from ..env_choice import env_choice
from ..format.layout import PAGE_TOKENS, PageFormat
from .decode_config import (
    HOPPER_CONFIG,
    HOPPER_MAX_SPLITS,
    HOPPER_MAX_WAVES,
    HOPPER_PRODUCER_CONFIG,
    DecodeKernelConfig,
    decode_impl,
    hopper_even_shares,
    hopper_producer,
    kernel_config,
)
from .even_shares_triton import even_shares_triton
from .plan_shape import MAX_SPLITS, even_shares_programs, hopper_shape, pair_slots, producer_fills, sm_count
from .split_plan import balanced_splits, even_split_tiles, program_items, work_items
from .split_plan_triton import split_work_triton

SPLIT_PLAN_ENV = "ZIPKV_SPLIT_PLAN"


@dataclass(frozen=True)
class DecodePlan:
    """One decode step's batch metadata, shared by every layer (all tensors on the KV device)."""

    fmt: PageFormat
    page_ids: torch.Tensor  # int32 [total_pages]: each request's pages, in token order
    page_indptr: torch.Tensor  # int32 [B + 1]: request b owns page_ids[page_indptr[b]:page_indptr[b + 1]]
    kv_lens: torch.Tensor  # int32 [B]: tokens of context per request (>= 1)
    num_splits: torch.Tensor  # int32 [B]: splits of each request's context (1 .. max_splits)
    split_tokens: torch.Tensor  # int32 [B]: tokens per split, a multiple of block_n
    work: torch.Tensor  # int32 [num_pairs, 4]: each work item's split (split_plan.py); request -1: idle
    pair_start: torch.Tensor  # int32 [B]: request b's splits are work items pair_start[b] .. + num_splits[b]
    o_partial: torch.Tensor  # float32 [num_pairs, Hq, D]: per-split outputs (scratch)
    lse_partial: torch.Tensor  # float32 [num_pairs, Hq]: per-split log2-sum-exp2 (scratch)
    batch_size: int
    num_q_heads: int
    max_splits: int  # the most splits one request can get (1: no split, no merge)
    num_pairs: int  # work items: the grid is num_pairs x KV heads programs
    block_n: int
    num_warps: int
    num_stages: int  # compressed kernel
    twin_num_stages: int  # the uncompressed twin
    prefetch: bool  # compressed kernel: double-buffer tile loads in registers
    impl: str = "portable"  # which kernel runs the plan (DECODE_IMPLS)
    maxnreg: int | None = None  # the Hopper launch's register cap (None: hopper/launch.py's default)
    # int32 [num_programs + 1] on the KV device, or None: program p of the Hopper kernel (per KV head) runs
    # work items program_items[p] .. program_items[p + 1] - 1 in turn (even shares, split_plan.program_items);
    # None: one item per program. The portable kernel runs one item per program either way.
    program_items: torch.Tensor | None = None
    num_programs: int = 0  # programs per KV head of an even-shares plan (0: one per work item)

    @property
    def num_kv_heads(self) -> int:
        return self.fmt.num_kv_heads

    @property
    def group_size(self) -> int:
        return self.num_q_heads // self.fmt.num_kv_heads


def _check_int32(name: str, x: torch.Tensor, dims: int) -> None:
    if x.dtype != torch.int32 or x.dim() != dims:
        raise ValueError(f"{name} must be an int32 tensor with {dims} dim(s), got {x.dtype} {list(x.shape)}")


def _check_batch(
    page_ids: torch.Tensor,
    page_indptr: torch.Tensor,
    kv_lens: torch.Tensor,
    fmt: PageFormat,
    num_q_heads: int,
) -> int:
    """The batch size, after checking what the plan's inputs must be (host metadata only: no sync)."""
    _check_int32("page_ids", page_ids, 1)
    _check_int32("page_indptr", page_indptr, 1)
    _check_int32("kv_lens", kv_lens, 1)
    batch = kv_lens.numel()
    if page_indptr.numel() != batch + 1:
        raise ValueError(f"page_indptr must have B + 1 = {batch + 1} entries, got {page_indptr.numel()}")
    if batch < 1:
        raise ValueError("plan_decode needs at least one request")
    if num_q_heads % fmt.num_kv_heads != 0:
        raise ValueError(f"num_q_heads {num_q_heads} is not a multiple of num_kv_heads {fmt.num_kv_heads}")
    require_token_major(fmt, "decode attention")
    return batch


def split_plan_impl(env: Mapping[str, str] | None = None) -> str:
    """``$ZIPKV_SPLIT_PLAN``: "kernel" (default; one Triton launch on a GPU, split_plan_triton.py) or
    "torch" (split_plan.py's ops, some 60 small kernels a step: the reference). The CPU always takes torch."""
    return env_choice(SPLIT_PLAN_ENV, ("kernel", "torch"), "kernel", env, hint="how the decode plan is built")


def _split_work(
    kv_lens: torch.Tensor, page_indptr: torch.Tensor, block_n: int, num_pairs: int, max_splits: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(splits, split_tokens, work, pair_start): the batch cut into balanced splits (split_plan.py)."""
    if kv_lens.is_cuda and split_plan_impl() == "kernel":
        return split_work_triton(kv_lens, page_indptr, block_n, num_pairs, max_splits)
    tiles = (kv_lens.to(torch.int64) + block_n - 1) // block_n
    splits, split_tiles = even_split_tiles(tiles, balanced_splits(tiles, num_pairs, max_splits))
    split_tokens = split_tiles * block_n
    work, pair_start = work_items(splits, split_tokens, kv_lens, page_indptr, num_pairs)
    return splits, split_tokens, work, pair_start


@lru_cache(maxsize=1)
def _even_shares_on() -> bool:
    """``$ZIPKV_HOPPER_EVEN_SHARES``, read once per process: a plan is built every step (the worker reads
    it at start-up too, so a malformed value stops it there)."""
    return hopper_even_shares()


@lru_cache(maxsize=1)
def producer_mode() -> int:
    """``$ZIPKV_HOPPER_PRODUCER`` (0, 1, 2), read once per process (as the even shares above); the plan and
    the Hopper launch (hopper/producer_launch.py) both read it here."""
    return hopper_producer()


def _hopper_base(
    fmt: PageFormat, batch: int, num_sms: int | None, device: torch.device
) -> DecodeKernelConfig:
    """The Hopper plan's shape: HOPPER_PRODUCER_CONFIG's with the producer partition on, where the batch
    fills its wave (plan_shape.producer_fills; head_dim 128, the one it was built and compiled for), else
    HOPPER_CONFIG's. The SM count is asked for only then: a plan is built every step."""
    cfg = HOPPER_PRODUCER_CONFIG
    if fmt.head_dim != 128 or not producer_mode():
        return HOPPER_CONFIG
    fills = producer_fills(batch, fmt.num_kv_heads, sm_count(num_sms, device), cfg.ctas_per_sm)
    return cfg if fills else HOPPER_CONFIG


def _even_shares(
    kv_lens: torch.Tensor, page_indptr: torch.Tensor, block_n: int, programs: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(splits, split_tokens, work, pair_start, program_items): the batch's tiles shared out evenly over
    ``programs`` programs (split_plan.program_items; one launch on a GPU, even_shares_triton.py)."""
    if kv_lens.is_cuda and split_plan_impl() == "kernel":
        return even_shares_triton(kv_lens, page_indptr, block_n, programs)
    splits, split_tiles, work, pair_start, prog_items = program_items(kv_lens, page_indptr, block_n, programs)
    return splits, split_tiles * block_n, work, pair_start, prog_items


def _overridden(base: DecodeKernelConfig, **asked: Any) -> DecodeKernelConfig:
    """``base`` with the fields asked for: None (or 0 for a count) keeps the base's; prefetch any bool."""
    cfg = replace(base, **{k: v for k, v in asked.items() if v is not None and (v or k == "prefetch")})
    if cfg.block_n % PAGE_TOKENS != 0 or cfg.block_n & (cfg.block_n - 1):
        raise ValueError(f"block_n must be a power of two multiple of {PAGE_TOKENS}, got {cfg.block_n}")
    return cfg


def _work_list(
    kv_lens: torch.Tensor,
    page_indptr: torch.Tensor,
    kv_heads: int,
    cfg: DecodeKernelConfig,
    num_sms: int | None,
    hopper: bool,
    max_splits: int | None,
    programs: int | None,
) -> tuple[int, int, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """(work items, the most splits a request gets, (splits, split_tokens, work, pair_start,
    program_items)): even shares over ``programs`` programs, else the balanced splits of pair_slots."""
    batch = kv_lens.numel()
    if programs:
        return programs + batch, programs, _even_shares(kv_lens, page_indptr, cfg.block_n, programs)
    num_pairs, max_splits = pair_slots(
        max_splits, batch, kv_heads, num_sms, cfg.ctas_per_sm, kv_lens.device,
        HOPPER_MAX_SPLITS if hopper else MAX_SPLITS, HOPPER_MAX_WAVES if hopper else 4,
    )  # fmt: skip
    return (
        num_pairs,
        max_splits,
        (*_split_work(kv_lens, page_indptr, cfg.block_n, num_pairs, max_splits), None),
    )


def plan_decode(
    page_ids: torch.Tensor,
    page_indptr: torch.Tensor,
    kv_lens: torch.Tensor,
    fmt: PageFormat,
    num_q_heads: int,
    num_sms: int | None = None,
    max_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    ctas_per_sm: int | None = None,
    num_stages: int | None = None,
    twin_num_stages: int | None = None,
    prefetch: bool | None = None,
    impl: str | None = None,
    config: DecodeKernelConfig | None = None,
    programs: int | None = None,
) -> DecodePlan:
    """Build the step's plan. ``page_ids``/``page_indptr``/``kv_lens`` live on the KV device.

    Each request must hold ``ceil(kv_lens[b] / 16)`` pages (not checked on the device: that would sync).
    ``config`` replaces the tuned shape (:func:`kernel_config`, or :data:`HOPPER_CONFIG` for the Hopper
    kernel); ``max_splits``, ``block_n``, ``num_warps``, ``num_stages``, ``twin_num_stages``,
    ``ctas_per_sm``, ``prefetch`` override single fields of it; ``impl`` picks the kernel (default
    ``$ZIPKV_DECODE_IMPL`` or "auto"). ``programs``: even shares over that many programs per KV head
    (split_plan.program_items); unset, where they pay when ``$ZIPKV_HOPPER_EVEN_SHARES`` is on."""
    batch = _check_batch(page_ids, page_indptr, kv_lens, fmt, num_q_heads)
    impl = decode_impl(impl, fmt, kv_lens.device)
    device, hopper = kv_lens.device, impl == "hopper"
    base = config or (_hopper_base(fmt, batch, num_sms, device) if hopper else kernel_config(fmt.head_dim))
    sizes = dict(block_n=block_n, num_warps=num_warps, num_stages=num_stages, twin_num_stages=twin_num_stages)
    cfg = _overridden(base, ctas_per_sm=ctas_per_sm, prefetch=prefetch, **sizes)
    free = hopper and config is None and ctas_per_sm is None and max_splits is None and programs is None
    if free and _even_shares_on():  # where equal requests would leave slots idle (plan_shape.py)
        programs = even_shares_programs(cfg, batch, fmt.num_kv_heads, fmt.head_dim, sm_count(num_sms, device))
    cfg, maxnreg = hopper_shape(cfg, fmt, batch, num_sms, device, free and programs is None)
    num_pairs, max_splits, (splits, split_tokens, work, pair_start, prog_items) = _work_list(
        kv_lens, page_indptr, fmt.num_kv_heads, cfg, num_sms, hopper, max_splits, programs
    )
    return DecodePlan(
        fmt=fmt, page_ids=page_ids, page_indptr=page_indptr, kv_lens=kv_lens,
        num_splits=splits.to(torch.int32),  # (no copy when the kernel built them)
        split_tokens=split_tokens.to(torch.int32),
        work=work,
        pair_start=pair_start,
        o_partial=torch.empty(num_pairs, num_q_heads, fmt.head_dim, dtype=torch.float32, device=device),
        lse_partial=torch.empty(num_pairs, num_q_heads, dtype=torch.float32, device=device),
        batch_size=batch, num_q_heads=num_q_heads, max_splits=max_splits, num_pairs=num_pairs,
        block_n=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        twin_num_stages=cfg.twin_num_stages, prefetch=cfg.prefetch, impl=impl, maxnreg=maxnreg,
        program_items=prog_items, num_programs=programs or 0,
    )  # fmt: skip


def require_token_major(fmt: PageFormat, reader: str) -> None:
    """The kernels' v1/v2 tile loads read token-major blocks only: a clear error for any other geometry.
    v3 has one geometry (16 tokens x 4 pairs), which its own tile loads read (attention/tiles_v3.py)."""
    if fmt.fixed_stride:
        return
    if fmt.k_geometry.channels != fmt.head_dim or fmt.v_geometry.channels != fmt.head_dim:
        raise ValueError(
            f"{reader} reads token-major blocks (512/head_dim tokens x head_dim channels); "
            f"this format has K {fmt.k_geometry.name}, V {fmt.v_geometry.name}"
        )
