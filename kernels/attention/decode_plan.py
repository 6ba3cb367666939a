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
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

import torch

from ..format.layout import PAGE_TOKENS, PageFormat


@dataclass(frozen=True)
class DecodeKernelConfig:
    """The shape of a decode kernel launch. Its text form (``$ZIPKV_DECODE_KERNEL``, the bench's
    ``--configs``) is the fields in order, prefetch as 0 or 1: :attr:`FIELDS`."""

    block_n: int  # tokens per tile: a power of two, a whole number of pages
    num_warps: int  # warps per program
    num_stages: int  # software-pipeline stages of the compressed kernel
    twin_num_stages: int  # of the uncompressed twin
    ctas_per_sm: int  # programs resident per SM: the slots of the split count's wave model
    prefetch: bool = False  # compressed kernel: double-buffer tile loads in registers

    FIELDS: ClassVar[str] = "block_n:warps:stages:twin_stages:ctas_per_sm:prefetch"

    def as_ints(self) -> tuple[int, int, int, int, int, int]:
        return (
            self.block_n, self.num_warps, self.num_stages, self.twin_num_stages, self.ctas_per_sm,
            int(self.prefetch),
        )  # fmt: skip

    @property
    def text(self) -> str:
        """``32:1:1:2:8:0``: what :func:`parse_kernel_config` reads back."""
        return ":".join(map(str, self.as_ints()))


# Per head_dim: (tokens per tile, warps per program, software-pipeline stages of the compressed kernel,
# of the twin, programs resident per SM, prefetch). head_dim 128 tuned on the H200 (docs/benchmarks.md, "Fused
# decode attention"): one warp per program and 32-token tiles beat four warps and 64-token tiles by 1.3x
# (0.72 against 0.54 of the compressed read floor): a one-warp program needs no barrier for the softmax's
# row max and sum, and eight resident programs keep more loads in flight than three four-warp ones. The
# registers (~250 per thread, no spills) allow eight programs per SM, which feeds the wave model above.
# Pipelining masked byte loads through shared memory costs the compressed kernel more than it hides
# (0.41 of the floor with two stages), while the twin's plain bf16 tiles gain from it (0.95-0.98 of the
# raw floor with two stages). The stage count changes only when loads are issued, never the arithmetic,
# so the two stay bit-identical (checked on every benchmarked shape). head_dim 64 and 256 keep the
# earlier four-warp shape, which the GPU tests compiled and checked; neither is tuned.
# Prefetch (the compressed kernel double-buffers its tile loads in registers) is off everywhere: measured
# slower for head_dim 128, it costs more registers than the overlap gains.
KERNEL_CONFIGS: dict[int, DecodeKernelConfig] = {
    64: DecodeKernelConfig(64, 4, 1, 2, 3, prefetch=False),
    128: DecodeKernelConfig(32, 1, 1, 2, 8, prefetch=False),
    256: DecodeKernelConfig(32, 4, 1, 2, 3, prefetch=False),
}
# Overrides the table for every head_dim, e.g. to run a shape a kernel sweep picked inside SGLang before it
# becomes the default: ``block_n:warps:stages:twin_stages:ctas_per_sm:prefetch`` (the bench's --configs).
KERNEL_CONFIG_ENV = "ZIPKV_DECODE_KERNEL"
# Which kernel a plan runs: "portable" (the plain-Triton kernel, attention/decode.py: any GPU and the
# interpreter), "hopper" (the Gluon kernel for sm_90 over page format v3, attention/hopper/decode.py), or
# "auto" (the default): the Hopper kernel where it can run (v3 pages on an sm_90 GPU, where it is the faster
# one, docs/benchmarks.md), the portable one elsewhere.
DECODE_IMPL_ENV = "ZIPKV_DECODE_IMPL"
DECODE_IMPLS = ("auto", "portable", "hopper")
# The page format a serving pool writes (2 or 3); by default v3 on sm_90, where the Hopper kernel reads it,
# and layout.FORMAT_VERSION elsewhere (the portable kernel reads v2 faster than v3).
PAGE_FORMAT_ENV = "ZIPKV_PAGE_FORMAT"
# The Hopper kernel's shape, measured on the H200: 64-token tiles, 4 warps, a 2-stage ring; its registers
# (~225) and shared memory (68 KB) leave two programs per SM.
HOPPER_CONFIG = DecodeKernelConfig(64, 4, 2, 2, 2, prefetch=False)
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


def choose_max_splits(work_items: int, slots: int, max_splits: int = MAX_SPLITS) -> int:
    """Smallest split count ``s`` minimising ``ceil(work_items * s / slots) / s`` (whole waves)."""
    best, best_cost = 1, math.inf
    for s in range(1, max_splits + 1):
        cost = math.ceil(work_items * s / slots) / s
        if cost < best_cost - 1e-9:
            best, best_cost = s, cost
        if work_items * s >= 4 * slots:
            break
    return best


def _check_int32(name: str, x: torch.Tensor, dims: int) -> None:
    if x.dtype != torch.int32 or x.dim() != dims:
        raise ValueError(f"{name} must be an int32 tensor with {dims} dim(s), got {x.dtype} {list(x.shape)}")


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
    impl = decode_impl(impl, fmt, kv_lens.device)
    if config is None:
        config = HOPPER_CONFIG if impl == "hopper" else kernel_config(fmt.head_dim)
    block_n = block_n or config.block_n
    num_warps = num_warps or config.num_warps
    num_stages = num_stages or config.num_stages
    twin_num_stages = twin_num_stages or config.twin_num_stages
    if block_n % PAGE_TOKENS != 0 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two multiple of {PAGE_TOKENS}, got {block_n}")
    device = kv_lens.device
    if num_sms is None:
        num_sms = (
            torch.cuda.get_device_properties(device).multi_processor_count
            if device.type == "cuda"
            else CPU_NUM_SMS
        )
    if max_splits is None:
        slots = num_sms * (ctas_per_sm or config.ctas_per_sm)
        max_splits = choose_max_splits(batch * fmt.num_kv_heads, slots)
    if not 1 <= max_splits <= MAX_SPLITS:
        raise ValueError(f"max_splits must be in 1..{MAX_SPLITS}, got {max_splits}")

    # Device-side split sizes: as even as possible, a whole number of tiles, no empty split.
    lens = kv_lens.to(torch.int64)
    tiles = (lens + block_n - 1) // block_n
    splits = torch.clamp(torch.minimum(tiles // MIN_SPLIT_TILES, torch.full_like(tiles, max_splits)), min=1)
    split_tiles = (tiles + splits - 1) // splits
    splits = (tiles + split_tiles - 1) // split_tiles
    hd = fmt.head_dim
    return DecodePlan(
        fmt=fmt,
        page_ids=page_ids,
        page_indptr=page_indptr,
        kv_lens=kv_lens,
        num_splits=splits.to(torch.int32),
        split_tokens=(split_tiles * block_n).to(torch.int32),
        o_partial=torch.empty(batch, num_q_heads, max_splits, hd, dtype=torch.float32, device=device),
        lse_partial=torch.empty(batch, num_q_heads, max_splits, dtype=torch.float32, device=device),
        batch_size=batch,
        num_q_heads=num_q_heads,
        max_splits=max_splits,
        block_n=block_n,
        num_warps=num_warps,
        num_stages=num_stages,
        twin_num_stages=twin_num_stages,
        prefetch=config.prefetch if prefetch is None else prefetch,
        impl=impl,
    )


def is_sm90(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


def serving_format_version(device: torch.device, env: Mapping[str, str] | None = None) -> int:
    """The page format a serving pool on ``device`` writes (``$ZIPKV_PAGE_FORMAT``, see above)."""
    from ..format.layout import FORMAT_VERSION

    env = os.environ if env is None else env
    asked = env.get(PAGE_FORMAT_ENV, "")
    if asked:
        if asked not in ("2", "3"):
            raise ValueError(f"{PAGE_FORMAT_ENV}={asked!r}: choose 2 or 3 (docs/format.md)")
        return int(asked)
    return 3 if is_sm90(device) else FORMAT_VERSION


def decode_impl(impl: str | None, fmt: PageFormat, device: torch.device) -> str:
    """The kernel a plan runs, checked: ValueError saying what to change when it cannot run here."""
    impl = impl or os.environ.get(DECODE_IMPL_ENV, "") or "auto"
    if impl not in DECODE_IMPLS:
        raise ValueError(f"{DECODE_IMPL_ENV}={impl!r}: choose one of {', '.join(DECODE_IMPLS)}")
    if impl == "auto":
        return "hopper" if fmt.version >= 3 and is_sm90(device) else "portable"
    if impl == "hopper":
        if fmt.version < 3:
            raise ValueError(
                f"the hopper decode kernel reads page format v3; this pool stores v{fmt.version}"
                f" (set {PAGE_FORMAT_ENV}=3)"
            )
        if not is_sm90(device):
            raise ValueError(
                f"the hopper decode kernel needs an sm_90 GPU (H100/H200); the KV is on {device}"
            )
    return impl


def kernel_config(head_dim: int) -> DecodeKernelConfig:
    """The portable kernel's shape for ``head_dim``: the tuned table, or the override in
    ``$ZIPKV_DECODE_KERNEL``."""
    override = os.environ.get(KERNEL_CONFIG_ENV, "")
    if override:
        return parse_kernel_config(override)
    return KERNEL_CONFIGS[head_dim]


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


@lru_cache(maxsize=8)
def parse_kernel_config(text: str, source: str = KERNEL_CONFIG_ENV) -> DecodeKernelConfig:
    """Parse ``block_n:warps:stages:twin_stages:ctas_per_sm:prefetch``; ValueError says what is wrong
    (``source`` names where the text came from)."""
    want = f"{source}={text!r}: expected {DecodeKernelConfig.FIELDS}, e.g. 32:1:1:2:8:0"
    try:
        block_n, warps, stages, twin_stages, ctas, prefetch = (int(x) for x in text.split(":"))
    except ValueError as exc:
        raise ValueError(want) from exc
    if block_n < PAGE_TOKENS or block_n & (block_n - 1):
        raise ValueError(f"{want}; block_n must be a power of two >= {PAGE_TOKENS}")
    if warps not in (1, 2, 4, 8) or not 1 <= stages <= 4 or not 1 <= twin_stages <= 4 or ctas < 1:
        raise ValueError(f"{want}; warps in 1/2/4/8, stages 1..4, ctas_per_sm >= 1")
    if prefetch not in (0, 1):
        raise ValueError(f"{want}; prefetch is 0 or 1")
    return DecodeKernelConfig(block_n, warps, stages, twin_stages, ctas, prefetch=bool(prefetch))
