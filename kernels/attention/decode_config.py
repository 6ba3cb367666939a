"""The decode kernel's configuration: which kernel a plan runs, its launch shape, and the page format a
serving pool writes (kernels/attention/decode_plan.py builds the per-step plan from them).

Each has a default and an environment override read here: ``$ZIPKV_DECODE_IMPL`` (the kernel),
``$ZIPKV_DECODE_KERNEL`` (the portable kernel's shape) and ``$ZIPKV_PAGE_FORMAT`` (the pool's format).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

import torch

from ..env_choice import env_choice, env_flag
from ..format.layout import FORMAT_VERSION, PAGE_TOKENS, PageFormat


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
# The Hopper kernel's shape, measured on the H200 (docs/benchmarks.md): 32-token tiles, 2 warps (one page
# each), a 2-stage ring, four programs per SM (~224 registers, 34 KB of shared memory each): 1.13-1.21x
# FlashInfer at batch >= 32, context >= 8192, against 1.02-1.13x with 64-token tiles over 4 warps.
HOPPER_CONFIG = DecodeKernelConfig(32, 2, 2, 2, 4, prefetch=False)
# Splits fill at most one wave: more waves of shorter programs pay each program's start again (8 x 8192:
# 87 us with 33 splits over four waves, 81 us with 6).
HOPPER_MAX_WAVES = 1
HOPPER_MAX_SPLITS = 128
# The Hopper kernel's softmax: "0" (the default) the warps of a program share one online softmax per tile;
# "1" each warp keeps its own over its own page, merged once per program (hopper/warp_softmax.py). Off
# until measured against the shared one on the GPU (docs/benchmarks.md).
HOPPER_WARP_SOFTMAX_ENV = "ZIPKV_HOPPER_WARP_SOFTMAX"


# The Hopper kernel's rescale of its running output: "0" (the default) every tile multiplies the output and
# the sums by alpha = exp2(m_old - m_new); "1" a tile skips those multiplies when alpha is exactly 1 in every
# row (no row max grew: most tiles once the first few have set the max), which changes no bit (x * 1.0 == x,
# fma(l, 1.0, p) == l + p). The H200 profile (docs/benchmarks.md) has the kernel bound by the consumer warps'
# instruction issue, and the rescale is 32 of its ~270 attend instructions per warp and tile. Off until the
# GPU measures it (shared softmax only: the per-warp softmax has no program-wide scalar to branch on).
HOPPER_LAZY_RESCALE_ENV = "ZIPKV_HOPPER_LAZY_RESCALE"


# The Hopper kernel's tile in fewer instructions: "1" (the default) the lean tile
# (hopper/lean.py: the row max and P exchanged between warps through buffers of their own, the qk scale
# folded into one FFMA, the end-of-split mask only in a split's last tile; the pre-pass's twin high byte in
# one step fewer; the coded copies' V and patch addresses in fewer adds): offline sm_90, 601 SASS
# instructions per coded tile against 677, 202 registers against 206 (611 against 688 since the kernel
# writes unsplit requests' rows itself; docs/benchmarks.md). The kernel on compressed pages still equals
# the kernel on raw pages bit for bit; against the earlier tile the softmax's
# exp2 argument rounds once (an fma) where it rounded twice. On the H200 2.5-3.5% faster than the earlier
# tile at batch >= 32, context >= 8192, as fast on the H100 (docs/benchmarks.md); "0" the earlier tile.
# Shared softmax only (the per-warp softmax runs its own tile); combines with the lazy rescale.
HOPPER_LEAN_ENV = "ZIPKV_HOPPER_LEAN"


# The Hopper kernel's launch where the plan splits: "1" where four programs per SM would split requests (one
# program per request and KV head does not fill the GPU), registers capped (HOPPER_SPLIT_CAP's) and splits
# planned for six programs per SM; "0" four per SM at the compiler's registers for every plan. Unset: "1" on
# the H200 and the H100, where it was measured, "0" on other sm_90 parts. On the H200
# with the lean tile (docs/benchmarks.md, 2026-12-06): 1.17-1.18x FlashInfer against 1.14-1.15x at
# 32 x 8192, 1.24x against 1.20-1.21x at 32 x 32768, 47.2 against 50.1 us at 1 x 32768; where one split
# already fills the GPU (64 and 128 x 8192) the cap loses (1.02-1.11x against 1.22-1.24x), so it is not
# taken there. On the H100 (2026-12-07) as fast or faster: 1.177x against 1.143x at 1 x 32768, 1.252x
# against 1.241x at 48 x 8448, equal within 0.3% at 32 x 8192 and 32 x 32768.
# head_dim 128 at 2 warps only, where it was measured. Those runs capped at 168 registers; since the lean
# tile folds its GQA padding rows (lean.py's PAD_HI), 164: 580 SASS instructions a coded tile against 633 at
# 168, where ptxas keeps every address in a register and recomputes them (offline sm_90, 2026-12-07); on an
# H100 at 164: 1.221x FlashInfer at 32 x 8192 and 0.84 of the floor at 1 x 32768 (not yet on the H200).
HOPPER_SPLIT_CAP_ENV = "ZIPKV_HOPPER_SPLIT_CAP"
HOPPER_SPLIT_CAP = (6, 164)  # (programs per SM, registers per thread)


def hopper_split_cap(env: Mapping[str, str] | None = None, measured_here: bool = True) -> bool:
    """Whether a Hopper plan that splits caps registers for six programs per SM (see above); unset, whether
    the device is one it was measured on (``measured_here``: :func:`split_cap_measured`)."""
    off = "four programs per SM at the compiler's registers"
    return env_flag(HOPPER_SPLIT_CAP_ENV, off, env, default=measured_here)


def split_cap_measured(device: torch.device) -> bool:
    """Whether the split cap's default is on for ``device``: the H200 and the H100, where it was measured."""
    return device.type == "cuda" and any(p in torch.cuda.get_device_name(device) for p in ("H200", "H100"))


# The Hopper plan's even shares: "1" where equal requests would not split and their waves would leave more
# than 8% of the slots idle (plan_shape.even_shares_programs), the batch's tiles shared out evenly over the
# programs one launch holds at four per SM (split_plan.program_items: a program may run the end of one
# request and the start of the next, each an item of its own, merged as splits are), so every SM has the
# same work to the end; "0" (the default) whole waves of equal splits (plan_shape.py). On the H200
# (docs/benchmarks.md, 2026-12-07) 398.1 against 412.2 us at 59 x 8448 (1.183x FlashInfer against 1.143x),
# and slower where the waves are nearly full (64 x 8192: 419.2 against 409.1 us), which the rule leaves
# alone. On the H100 after the merge's reshape for even shares (merge.merge_shape), faster where the rule
# takes them (59 x 8448: 521.7 against 525.7 us; 40 x 8448: 362.0 against 405.2) and neutral in SGLang end to
# end (22.297 against 22.290 ms a step at 59 running, 2026-12-07). Off until the H200's end-to-end run.
HOPPER_EVEN_SHARES_ENV = "ZIPKV_HOPPER_EVEN_SHARES"


def hopper_even_shares(env: Mapping[str, str] | None = None) -> bool:
    """Whether the Hopper plan shares the batch's tiles out evenly over its programs (see above)."""
    return env_flag(HOPPER_EVEN_SHARES_ENV, "whole waves of equal splits", env)


# The Hopper kernel's producer partition (hopper/specialized.py): "1" four producer warps load the page
# tables and issue the copies, four consumer warps restore and multiply (64-token tiles, one page a consumer
# warp, two programs of eight warps per SM: HOPPER_PRODUCER_CONFIG, taken where the batch fills that wave,
# plan_shape.producer_fills); "2" the producer warps also run each
# coded tile's pre-pass (codes to high bytes), so the consumers only load operands, multiply and take the
# softmax; "0" (the default) decode.py's programs, whose warps do everything. Offline sm_90 at head_dim 128 a
# consumer warp issues 387 ("1") or 199 ("2") SASS instructions a coded tile against 544 (docs/benchmarks.md);
# off until the GPU has checked and timed them.
HOPPER_PRODUCER_ENV = "ZIPKV_HOPPER_PRODUCER"
HOPPER_PRODUCER_CONFIG = DecodeKernelConfig(64, 4, 2, 2, 2, prefetch=False)
PRODUCER_MODES = ("0", "1", "2")


def hopper_producer(env: Mapping[str, str] | None = None) -> int:
    """The Hopper kernel's producer partition (``$ZIPKV_HOPPER_PRODUCER``, see above): 0 none, 1 copies and
    table loads, 2 those and the pre-pass."""
    hint = "0: one kind of warp, 1: producer warps copy, 2: they also run the pre-pass"
    return int(env_choice(HOPPER_PRODUCER_ENV, PRODUCER_MODES, "0", env, hint=hint))


def hopper_producer_for_serving(env: Mapping[str, str] | None = None) -> int:
    """``$ZIPKV_HOPPER_PRODUCER`` as the SGLang worker reads it at start-up: refused when set, because the
    first SGLang run with it (an H100, 2026-12-07, docs/benchmarks.md) never scheduled its first batch,
    with either mode; the kernel benchmarks and the checks take it."""
    mode = hopper_producer(env)
    if mode:
        raise ValueError(
            f"{HOPPER_PRODUCER_ENV}={mode}: the producer kernel is for the kernel benchmarks only for now "
            "(SGLang end to end stalled with it, docs/benchmarks.md); unset it to serve"
        )
    return mode


def hopper_warp_softmax(env: Mapping[str, str] | None = None) -> bool:
    """Whether the Hopper kernel runs one softmax per warp (``$ZIPKV_HOPPER_WARP_SOFTMAX``, see above)."""
    return env_flag(HOPPER_WARP_SOFTMAX_ENV, "one softmax per program", env)


def hopper_lazy_rescale(env: Mapping[str, str] | None = None) -> bool:
    """Whether the Hopper kernel skips the output rescale of tiles where no row max grew
    (``$ZIPKV_HOPPER_LAZY_RESCALE``, see above)."""
    return env_flag(HOPPER_LAZY_RESCALE_ENV, "rescale every tile", env)


def hopper_lean(env: Mapping[str, str] | None = None) -> bool:
    """Whether the Hopper kernel runs the lean tile (``$ZIPKV_HOPPER_LEAN``, see above)."""
    return env_flag(HOPPER_LEAN_ENV, "the earlier tile", env, default=True)


def is_sm90(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


def serving_format_version(device: torch.device, env: Mapping[str, str] | None = None) -> int:
    """The page format a serving pool on ``device`` writes (``$ZIPKV_PAGE_FORMAT``, see above)."""
    default = "3" if is_sm90(device) else str(FORMAT_VERSION)
    return int(env_choice(PAGE_FORMAT_ENV, ("2", "3"), default, env, hint="docs/format.md"))


def auto_impl(format_version: int, device: torch.device) -> str:
    """What "auto" runs: the Hopper kernel where it can (v3 pages on sm_90), else the portable one."""
    return "hopper" if format_version >= 3 and is_sm90(device) else "portable"


def decode_impl(impl: str | None, fmt: PageFormat, device: torch.device) -> str:
    """The kernel a plan runs, checked: ValueError saying what to change when it cannot run here."""
    impl = impl or env_choice(DECODE_IMPL_ENV, DECODE_IMPLS, "auto")
    if impl not in DECODE_IMPLS:
        raise ValueError(f"decode impl {impl!r}: choose one of {', '.join(DECODE_IMPLS)}")
    if impl == "auto":
        return auto_impl(fmt.version, device)
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
