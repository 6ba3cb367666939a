"""How many work items and splits a decode step gets, and the Hopper launch's programs per SM and registers.

Host arithmetic on the batch size and the model shape only (no device sync: decode_plan.py records the
plan into SGLang's CUDA graph). The wave model: for ``w = batch * kv_heads`` programs per split and
``slots`` programs resident at once, a step of equal requests cut into ``s`` splits takes time as
``ceil(w * s / slots) / s`` (:func:`choose_max_splits`); the plan then shares the items out by length
(split_plan.py), so a batch never has fewer items than one wave holds (:func:`pair_slots`). On the H200 the
Hopper kernel, where the plan splits, runs six programs per SM at a register cap instead of four
(:func:`hopper_launch`, decode_config's ``$ZIPKV_HOPPER_SPLIT_CAP``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

import torch

from ..format.layout import PageFormat
from .decode_config import (
    HOPPER_MAX_SPLITS,
    HOPPER_MAX_WAVES,
    HOPPER_SPLIT_CAP,
    DecodeKernelConfig,
    hopper_split_cap,
    split_cap_measured,
)

MAX_SPLITS = 128
CPU_NUM_SMS = 4  # the Triton interpreter: keep grids small


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


def _measured_splits(
    cfg: DecodeKernelConfig, batch: int, kv_heads: int, head_dim: int, num_sms: int
) -> int | None:
    """The wave model's split count for equal requests at ``cfg.ctas_per_sm`` as the Hopper plan searches
    it, where the launch shapes below were measured (head_dim 128 at 2 warps); None elsewhere."""
    if head_dim != 128 or cfg.num_warps != 2:
        return None
    return choose_max_splits(batch * kv_heads, num_sms * cfg.ctas_per_sm, HOPPER_MAX_SPLITS, HOPPER_MAX_WAVES)


def hopper_launch(
    cfg: DecodeKernelConfig, batch: int, kv_heads: int, head_dim: int, num_sms: int
) -> tuple[DecodeKernelConfig, int | None]:
    """The Hopper plan's programs per SM and register cap (None: the launch's default) with the split cap
    on (``$ZIPKV_HOPPER_SPLIT_CAP``, decode_config): a plan whose requests split at ``cfg.ctas_per_sm`` is
    launched with HOPPER_SPLIT_CAP's registers and planned for its programs per SM instead."""
    if _measured_splits(cfg, batch, kv_heads, head_dim, num_sms) in (None, 1):
        return cfg, None
    ctas, regs = HOPPER_SPLIT_CAP
    return replace(cfg, ctas_per_sm=ctas), regs


# Even shares (split_plan.program_items) pay where equal requests in whole waves would leave slots idle: on
# the H200 at 59 x 8448 (472 programs on 528 slots, 0.89 filled) 398.1 against 412.2 us, and they cost
# where the waves are nearly full (64 x 8192, 0.97: 419.2 against 409.1 us), docs/benchmarks.md. The
# threshold sits between the two. Where requests split, the split cap's launch stays (32 x 8192: 221.7
# against 225.2 us with even shares).
EVEN_SHARES_MAX_FILL = 0.92


def wave_fill(work_items: int, slots: int) -> float:
    """The fraction of the slots a launch of equal requests, one split each, keeps busy over its waves."""
    return work_items / (math.ceil(work_items / slots) * slots)


def even_shares_programs(
    cfg: DecodeKernelConfig, batch: int, kv_heads: int, head_dim: int, num_sms: int
) -> int | None:
    """Programs per KV head for even shares where they pay (``$ZIPKV_HOPPER_EVEN_SHARES`` on): the ones
    ``cfg.ctas_per_sm`` programs per SM hold at once, where equal requests would not split (the wave
    model's one split; where they split, the split cap's launch was measured instead) and would fill less
    than EVEN_SHARES_MAX_FILL of the slots; None elsewhere (head_dim 128 at 2 warps only, where measured)."""
    if _measured_splits(cfg, batch, kv_heads, head_dim, num_sms) != 1:
        return None
    slots = num_sms * cfg.ctas_per_sm
    if wave_fill(batch * kv_heads, slots) >= EVEN_SHARES_MAX_FILL:
        return None
    return slots // kv_heads


# The producer kernel (hopper/specialized.py) holds two programs an SM, eight consumer warps, against the
# split cap's six two-warp programs (twelve). Where the batch leaves that wave's slots idle, the default
# kernel's extra splits win (an H100, 2026-12-07: 55.1 against 71.9 us at 1 x 32768, 224.5 against 277.4 us
# for a skewed batch of 18, docs/benchmarks.md). Where the batch fills the wave, the producer's tile does
# (283.3 against 293.5 us at 32 x 8192, 381.1 against 395.6 us at 40 x 8448). The line sits between:
# nine tenths of a wave.
PRODUCER_MIN_FILL = 0.9


def producer_fills(batch: int, kv_heads: int, num_sms: int, ctas_per_sm: int) -> bool:
    """Whether a batch of ``batch`` requests fills PRODUCER_MIN_FILL of the producer kernel's wave (one
    program per request and KV head, ``ctas_per_sm`` an SM)."""
    return batch * kv_heads >= PRODUCER_MIN_FILL * num_sms * ctas_per_sm


def sm_count(num_sms: int | None, device: torch.device) -> int:
    """``num_sms`` if given, else the device's (CPU_NUM_SMS for the interpreter)."""
    if num_sms is not None:
        return num_sms
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return CPU_NUM_SMS


def pair_slots(
    max_splits: int | None,
    batch: int,
    kv_heads: int,
    num_sms: int | None,
    ctas_per_sm: int,
    device: torch.device,
    cap: int = MAX_SPLITS,
    max_waves: int = 4,
) -> tuple[int, int]:
    """(work items of the step, the most splits one request gets). Asked ``max_splits``: every request
    gets up to that many, as many items as that takes. Else the wave model's split count for equal
    requests, times the batch, and never fewer items than one wave's programs hold: the same programs,
    shared out by length (the module docstring).

    The floor matters where equal requests would not split (batch x KV heads x 2 >= slots: batch >= 33 on
    an H100 with 8 KV heads, 4 programs per SM): without it there is one item per request, so no slack to
    cut a long one, and a batch of 36-47 of the Mooncake trace ran 84-89 ms a step against SGLang's 30
    (the H100 sweep of 96 requests, docs/benchmarks.md)."""
    if max_splits is not None:
        if not 1 <= max_splits <= MAX_SPLITS:
            raise ValueError(f"max_splits must be in 1..{MAX_SPLITS}, got {max_splits}")
        return batch * max_splits, max_splits
    slots = sm_count(num_sms, device) * ctas_per_sm
    pairs = batch * choose_max_splits(batch * kv_heads, slots, cap, max_waves)
    pairs = max(pairs, min(slots // kv_heads, batch * cap))  # a wave's items: equal requests take no more
    return pairs, min(cap, pairs - batch + 1)  # one request takes what the others' one split each leave


@lru_cache(maxsize=8)
def _split_cap(device: torch.device) -> bool:
    """``$ZIPKV_HOPPER_SPLIT_CAP`` for ``device``, read once per process: a plan is built every step."""
    return hopper_split_cap(measured_here=split_cap_measured(device))


def hopper_shape(
    cfg: DecodeKernelConfig,
    fmt: PageFormat,
    batch: int,
    num_sms: int | None,
    device: torch.device,
    free: bool,
) -> tuple[DecodeKernelConfig, int | None]:
    """hopper_launch's choice where the caller left the shape to the plan (``free``), else ``cfg``."""
    if not free or not _split_cap(device):
        return cfg, None
    return hopper_launch(cfg, batch, fmt.num_kv_heads, fmt.head_dim, sm_count(num_sms, device))
