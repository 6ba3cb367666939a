"""The lean tile of the Hopper decode kernel (decode.py, ``LEAN``): the shared softmax's attention over a tile
(restore.attend) in fewer instructions, for the H200, where the consumer warps' instruction issue bounds
the kernel (docs/benchmarks.md).

- The two exchanges between warps go through buffers of their own (``scratch``) instead of the compiler's
  scratch: each warp stores its partial row max ``[M, NW]`` and the others read it with two 64-bit loads (the
  compiler's reduction took two barriers and a second round trip); P goes to a buffer laid out as the MMA A
  fragment (layouts.p_exchange_offset), so each warp reads its fragments with two 128-bit loads straight
  into the registers the MMA takes (the compiler's layout needed ~15 register moves after its loads).
- The qk scale: the row max is taken of the unscaled S and scaled once per row (max(c s) == c max(s) for
  c > 0, the same bits), and p = exp2(fma(s, c, -m)): one FFMA per element instead of FMUL and FADD.
- Tokens past the split's end are masked only in a tile that has some (its last), not in every tile.
- ``PAD_HI`` (the GQA group is at most 8; Llama-3.1-8B's is 4): the MMA's rows 8-15 are padding, and every
  thread holds them in registers of their own (rows g + 8). Their alpha is taken as 1 and their scores and
  p as 0, constants the compiler folds, so their rescale multiplies, exp2s, FMAs and share of the row max
  drop out: 544 SASS instructions a coded tile against 587 at head_dim 128, offline sm_90 (launch.pads_hi
  decides; docs/benchmarks.md). The real rows keep their bits: an output row of the MMA reads only its own
  row of P, and padding rows are never stored.

The fma rounds once where the default rounds twice, so the bits differ from the default kernel's; the
kernel on compressed pages and on raw pages still run the same code on the same operands, so they give the
same bits as each other.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as ttgl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.runtime.jit import constexpr_function

from .restore import _lazy_rescale


@constexpr_function
def _rows_by_warp(NW):  # type: ignore[no-untyped-def]
    """``[16, NW]``: every thread holds its two rows' (g, g + 8) maxima of every warp, the warps' side by
    side in registers (one vector load), rows as in the MMA accumulator (lanes / 4, then a register)."""
    warp_regs = [[0, 1 << i] for i in range(NW.bit_length() - 1)]
    return ttgl.DistributedLinearLayout(
        reg_bases=[*warp_regs, [8, 0]],
        lane_bases=[[0, 0], [0, 0], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[0, 0]] * (NW.bit_length() - 1),
        block_bases=[],
        shape=[16, NW],
    )


@gluon.jit
def lean_scratch(M: ttgl.constexpr, N: ttgl.constexpr, PX: ttgl.constexpr):
    """The lean tile's exchange buffers: the warps' row maxima ``[M, NW]`` fp32 and P ``[M, N]`` bf16 (``PX``:
    layouts.p_exchange_view's layout, from launch.hopper_constexprs)."""
    plain: ttgl.constexpr = ttgl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    mx = ttgl.allocate_shared_memory(ttgl.float32, [M, ttgl.num_warps()], plain)
    p = ttgl.allocate_shared_memory(ttgl.bfloat16, [M, N], PX)
    return mx, p


@gluon.jit
def _row_max(s, mx_buf, mma: ttgl.constexpr, M: ttgl.constexpr, N: ttgl.constexpr):
    """Each row's max of ``s`` over the tile, in ``SliceLayout(1, mma)``. Warp w holds tokens 8 w + c + 8 NW r
    (to_linear_layout of the MMA layout): its partial max is a reduction inside the warp."""
    NW: ttgl.constexpr = ttgl.num_warps()
    if NW == 1:
        m = ttgl.max(s, axis=1)
    else:
        # the thread's registers first (axis 1), then the lanes: one shuffle reduction, not one per register
        part = ttgl.max(ttgl.max(ttgl.reshape(s, [M, N // (8 * NW), NW, 8]), axis=1), axis=2)
        mx_buf.store(part)  # the compiler's barrier follows: the other warps' columns are read next
        both = mx_buf.load(_rows_by_warp(NW))
        m = ttgl.convert_layout(ttgl.max(both, axis=1), ttgl.SliceLayout(1, mma))
    return m


@gluon.jit
def attend_lean(qa, qb, ops, tok0, end, state, qk_scale, scratch, mma: ttgl.constexpr, a_l: ttgl.constexpr,
                M: ttgl.constexpr, N: ttgl.constexpr, LAZY: ttgl.constexpr,
                PAD_HI: ttgl.constexpr = False):  # fmt: skip
    """restore.attend's online-softmax update of the tile at ``tok0`` (module docstring; ``qk_scale`` > 0;
    ``PAD_HI``: rows 8-15 are padding, module docstring)."""
    ka, kb, va, vb = ops
    m_i, l_acc, acc_a, acc_b = state
    mx_buf, p_buf = scratch
    s = mma_v2(qa, ka, ttgl.zeros([M, N], ttgl.float32, layout=mma))
    s = mma_v2(qb, kb, s)
    if tok0 + N > end:  # only a split's last tile reaches past its end
        valid = tok0 + ttgl.arange(0, N, layout=ttgl.SliceLayout(0, mma)) < end
        s = ttgl.where(valid[None, :], s, float("-inf"))
    live = ttgl.arange(0, M, layout=ttgl.SliceLayout(1, mma)) < 8  # per register, known when compiled
    if PAD_HI:
        s = ttgl.where(live[:, None], s, 0.0)  # the padding rows' share of the row max folds too
    m_new = ttgl.maximum(m_i, _row_max(s, mx_buf, mma, M, N) * qk_scale)
    alpha = ttgl.exp2(m_i - m_new)
    # m * -1.0, not -m: Triton spells -m as 0 - m, which the fma cannot take as a negated operand
    p = ttgl.exp2(ttgl.fma(s, qk_scale, m_new[:, None] * -1.0))
    if PAD_HI:
        alpha = ttgl.where(live, alpha, 1.0)
        p = ttgl.where(live[:, None], p, 0.0)
    if LAZY:
        l_acc, acc_a, acc_b = _lazy_rescale(alpha, p, l_acc, acc_a, acc_b)
    else:
        l_acc = ttgl.fma(l_acc, alpha[:, None], p)
        acc_a = acc_a * alpha[:, None]
        acc_b = acc_b * alpha[:, None]
    p_buf.store(p.to(ttgl.bfloat16))
    p_dot = p_buf.load(a_l)
    acc_a = mma_v2(p_dot, va, acc_a)
    acc_b = mma_v2(p_dot, vb, acc_b)
    return m_new, l_acc, acc_a, acc_b
