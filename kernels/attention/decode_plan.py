"""The per-step plan of the fused decode attention kernel (kernels/attention/decode.py).

Like FlashInfer's plan/run split: :func:`plan_decode` runs once per decode step and builds the batch's
metadata (how each request's context is cut into splits, the scratch for the split-KV merge); every
layer's :func:`~zipkv.kernels.attention.decode.decode_attention` call reuses it. Nothing here syncs with
the device: the grid depends only on the batch size and the model shape, and each request's split count
and split length are computed on the device from its ``kv_lens``.

Split-KV: one program handles one (request, KV head, split). When batch x KV heads cannot fill the GPU
(batch 1 at long context), each request's context is cut into up to ``max_splits`` splits, and a second
small kernel merges the splits' partial outputs by their log-sum-exp. The split count is chosen to fill
whole waves of the GPU: for ``w = batch * kv_heads`` programs per split and ``slots`` programs resident
at once, the step time goes as ``ceil(w * s / slots) / s``; the smallest ``s`` that minimises it wins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..format.layout import PAGE_TOKENS, PageFormat
from .decode_config import (
    HOPPER_CONFIG,
    HOPPER_MAX_SPLITS,
    HOPPER_MAX_WAVES,
    DecodeKernelConfig,
    decode_impl,
    kernel_config,
)

MAX_SPLITS = 128
MIN_SPLIT_TILES = 2  # a split reads at least this many tiles, so its fixed cost stays small
CPU_NUM_SMS = 4  # the Triton interpreter: keep grids small


@dataclass(frozen=True)
class DecodePlan:
    """One decode step's batch metadata, shared by every layer (all tensors on the KV device)."""

    fmt: PageFormat
    page_ids: torch.Tensor  # int32 [total_pages]: each request's pages, in token order
    page_indptr: torch.Tensor  # int32 [B + 1]: request b owns page_ids[page_indptr[b]:page_indptr[b + 1]]
    kv_lens: torch.Tensor  # int32 [B]: tokens of context per request (>= 1)
    num_splits: torch.Tensor  # int32 [B]: splits of each request's context (1 .. max_splits)
    split_tokens: torch.Tensor  # int32 [B]: tokens per split, a multiple of block_n
    o_partial: torch.Tensor  # float32 [B, Hq, max_splits, D]: per-split outputs (scratch)
    lse_partial: torch.Tensor  # float32 [B, Hq, max_splits]: per-split log2-sum-exp2 (scratch)
    batch_size: int
    num_q_heads: int
    max_splits: int
    block_n: int
    num_warps: int
    num_stages: int  # compressed kernel
    twin_num_stages: int  # the uncompressed twin
    prefetch: bool  # compressed kernel: double-buffer tile loads in registers
    impl: str = "portable"  # which kernel runs the plan (DECODE_IMPLS)

    @property
    def num_kv_heads(self) -> int:
        return self.fmt.num_kv_heads

    @property
    def group_size(self) -> int:
        return self.num_q_heads // self.fmt.num_kv_heads


def choose_max_splits(work_items: int, slots: int, max_splits: int = MAX_SPLITS, max_waves: int = 4) -> int:
    """Smallest split count ``s`` minimising ``ceil(work_items * s / slots) / s`` (whole waves), among
    those up to the first that fills ``max_waves`` waves (more waves of shorter programs cost each
    program's fixed start again: the Hopper kernel looks no further than one)."""
    best, best_cost = 1, math.inf
    for s in range(1, max_splits + 1):
        cost = math.ceil(work_items * s / slots) / s
        if cost < best_cost - 1e-9:
            best, best_cost = s, cost
        if work_items * s >= max_waves * slots:
            break
    return best


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


def _split_sizes(kv_lens: torch.Tensor, block_n: int, max_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each request's split count and tokens per split (int32 [B]), computed on the device: as even as
    possible, a whole number of tiles, no empty split."""
    lens = kv_lens.to(torch.int64)
    tiles = (lens + block_n - 1) // block_n
    splits = torch.clamp(torch.minimum(tiles // MIN_SPLIT_TILES, torch.full_like(tiles, max_splits)), min=1)
    split_tiles = (tiles + splits - 1) // splits
    splits = (tiles + split_tiles - 1) // split_tiles
    return splits.to(torch.int32), (split_tiles * block_n).to(torch.int32)


def _max_splits(
    max_splits: int | None,
    work_items: int,
    num_sms: int | None,
    ctas_per_sm: int,
    device: torch.device,
    cap: int = MAX_SPLITS,
    max_waves: int = 4,
) -> int:
    """``max_splits`` as asked, else the wave model's pick for ``work_items`` programs per split; checked."""
    if max_splits is None:
        if num_sms is None:
            num_sms = (
                torch.cuda.get_device_properties(device).multi_processor_count
                if device.type == "cuda"
                else CPU_NUM_SMS
            )
        max_splits = choose_max_splits(work_items, num_sms * ctas_per_sm, cap, max_waves)
    if not 1 <= max_splits <= MAX_SPLITS:
        raise ValueError(f"max_splits must be in 1..{MAX_SPLITS}, got {max_splits}")
    return max_splits


def _overridden(base: DecodeKernelConfig, **asked: Any) -> DecodeKernelConfig:
    """``base`` with the fields asked for: None (or 0 for a count) keeps the base's; prefetch any bool."""
    return replace(base, **{k: v for k, v in asked.items() if v is not None and (v or k == "prefetch")})


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
) -> DecodePlan:
    """Build the step's plan. ``page_ids``/``page_indptr``/``kv_lens`` live on the KV device.

    Each request must hold ``ceil(kv_lens[b] / 16)`` pages (not checked on the device: that would sync).
    ``config`` replaces the tuned shape (:func:`kernel_config`, or :data:`HOPPER_CONFIG` for the Hopper
    kernel); ``max_splits``, ``block_n``, ``num_warps``, ``num_stages``, ``twin_num_stages``,
    ``ctas_per_sm``, ``prefetch`` override single fields of it; ``impl`` picks the kernel (default
    ``$ZIPKV_DECODE_IMPL`` or "auto").
    """
    batch = _check_batch(page_ids, page_indptr, kv_lens, fmt, num_q_heads)
    impl = decode_impl(impl, fmt, kv_lens.device)
    base = config or (HOPPER_CONFIG if impl == "hopper" else kernel_config(fmt.head_dim))
    cfg = _overridden(base, block_n=block_n, num_warps=num_warps, num_stages=num_stages,
                      twin_num_stages=twin_num_stages, ctas_per_sm=ctas_per_sm,
                      prefetch=prefetch)  # fmt: skip
    if cfg.block_n % PAGE_TOKENS != 0 or cfg.block_n & (cfg.block_n - 1):
        raise ValueError(f"block_n must be a power of two multiple of {PAGE_TOKENS}, got {cfg.block_n}")
    device = kv_lens.device
    hopper = impl == "hopper"
    max_splits = _max_splits(
        max_splits, batch * fmt.num_kv_heads, num_sms, cfg.ctas_per_sm, device,
        HOPPER_MAX_SPLITS if hopper else MAX_SPLITS, HOPPER_MAX_WAVES if hopper else 4,
    )  # fmt: skip
    splits, split_tokens = _split_sizes(kv_lens, cfg.block_n, max_splits)
    hd = fmt.head_dim
    return DecodePlan(
        fmt=fmt,
        page_ids=page_ids,
        page_indptr=page_indptr,
        kv_lens=kv_lens,
        num_splits=splits,
        split_tokens=split_tokens,
        o_partial=torch.empty(batch, num_q_heads, max_splits, hd, dtype=torch.float32, device=device),
        lse_partial=torch.empty(batch, num_q_heads, max_splits, dtype=torch.float32, device=device),
        batch_size=batch,
        num_q_heads=num_q_heads,
        max_splits=max_splits,
        block_n=cfg.block_n,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        twin_num_stages=cfg.twin_num_stages,
        prefetch=cfg.prefetch,
        impl=impl,
    )


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
