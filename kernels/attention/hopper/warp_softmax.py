"""Per-warp softmax for the Hopper decode kernel (decode.py): each warp attends over its own page of every
tile with its own running max, sum and output, and the warps merge once, when the program ends.

Why: with the warps splitting a tile's tokens inside one softmax (the 2D layout), every tile pays two
exchanges between warps through shared memory, each behind a CTA barrier: the row max of S, and P moved
from the accumulator layout into the A-operand layout of P V (each warp holds a quarter of P's columns,
and P V needs all of them). At 32 x 8192 those exchanges are where the stalls sit (ncu: FMNMX waiting on
the cross-warp max, the barriers around P). With one page per warp, S, P and P V stay inside the warp:
the row max reduces across the four lanes of a quad, and the accumulator fragment of S *is* the A
fragment of P V (the FlashAttention-2 register layout), so P never leaves the registers. The cost: each
warp holds the whole ``[16, D]`` output (twice the accumulator registers) and the program ends with one
merge across warps (log-sum-exp, as the split-KV merge does across programs).

Tensors are 3D, ``[NW pages, rows or tokens, columns]``, with the MMA layout's warps on the page axis:
warp w owns page w of each tile (NP == NW; the copy and pre-pass layouts already give warp w page w).
Compressed and raw pages still take one path here, so they stay bit-identical to each other; against the
2D softmax the sums run in another order (agreement within bf16 rounding, not bit for bit).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as ttgl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.runtime.jit import constexpr_function

from .ring import _PT


@constexpr_function
def warp_mma_layout(NW):  # type: ignore[no-untyped-def]
    """The MMA layout of ``[NW, 16, X]`` tensors: warp w computes batch w (its page) alone."""
    return ttgl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[NW, 1, 1], instr_shape=[1, 16, 8])


@gluon.jit
def load_q_pages(q_ptr, req, head, stride_qb, stride_qh, M: ttgl.constexpr, GROUP: ttgl.constexpr,
                 D: ttgl.constexpr):  # fmt: skip
    """The KV head's GROUP query rows (padded to M), channels < D/2 and >= D/2, once per warp: ``[NW, M,
    D/2]`` as loaded, for ``[NW, M, D/2]`` A operands (every warp multiplies the same queries by its own
    page; decode._q_operands turns them into operands)."""
    NW: ttgl.constexpr = ttgl.num_warps()
    ld_l: ttgl.constexpr = ttgl.BlockedLayout([1, 1, 8], [1, 2, 16], [NW, 1, 1], [2, 1, 0])
    offs_w = ttgl.arange(0, NW, layout=ttgl.SliceLayout(1, ttgl.SliceLayout(2, ld_l)))[:, None, None]
    offs_m = ttgl.arange(0, M, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(2, ld_l)))[None, :, None]
    offs_d = ttgl.arange(0, D // 2, layout=ttgl.SliceLayout(0, ttgl.SliceLayout(1, ld_l)))[None, None, :]
    # offs_w * 0 and offs_w >= 0 add the warp axis without moving the address: each warp loads all the rows
    q_rows = q_ptr + req * stride_qb + (head * GROUP + offs_m) * stride_qh + offs_d + offs_w * 0
    q_mask = (offs_m < GROUP) & (offs_w >= 0)
    return ttgl.load(q_rows, mask=q_mask, other=0.0), ttgl.load(q_rows + D // 2, mask=q_mask, other=0.0)


@gluon.jit
def token_valid(tok0, end, mma: ttgl.constexpr):
    """bool ``[NW, 16]``: token t of warp w's page of the tile at ``tok0`` is before ``end``."""
    tok_l: ttgl.constexpr = ttgl.SliceLayout(1, mma)
    w = ttgl.arange(0, ttgl.num_warps(), layout=ttgl.SliceLayout(1, tok_l))[:, None]
    t = ttgl.arange(0, _PT, layout=ttgl.SliceLayout(0, tok_l))[None, :]
    return tok0 + w * _PT + t < end


@gluon.jit
def attend_pages(qa, qb, ka, kb, va, vb, valid, m_i, l_acc, acc_a, acc_b, qk_scale,
                 mma: ttgl.constexpr, a_l: ttgl.constexpr, M: ttgl.constexpr):  # fmt: skip
    """One tile, each warp over its page: the online-softmax update of (m_i ``[NW, M]``, l_acc ``[NW, M,
    16]``, acc ``[NW, M, D/2]`` x 2). A page wholly past the end leaves its warp's state as it was."""
    NW: ttgl.constexpr = ttgl.num_warps()
    s = mma_v2(qa, ka, ttgl.zeros([NW, M, _PT], ttgl.float32, layout=mma))
    s = mma_v2(qb, kb, s) * qk_scale
    s = ttgl.where(valid[:, None, :], s, float("-inf"))
    m_new = ttgl.maximum(m_i, ttgl.max(s, axis=2))
    # A warp that has seen no valid token yet keeps m = -inf; subtract 0 then, so exp2 gives 0, not NaN.
    m_use = ttgl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = ttgl.exp2(m_i - m_use)
    p = ttgl.exp2(s - m_use[:, :, None])
    l_acc = l_acc * alpha[:, :, None] + p
    p_dot = ttgl.convert_layout(p.to(ttgl.bfloat16), a_l)  # the same registers (module doc)
    acc_a = mma_v2(p_dot, va, acc_a * alpha[:, :, None])
    acc_b = mma_v2(p_dot, vb, acc_b * alpha[:, :, None])
    return m_new, l_acc, acc_a, acc_b


@gluon.jit
def merge_warps(m_i, l_acc, acc_a, acc_b, mma: ttgl.constexpr):
    """The program's (m ``[M]``, l ``[M]``, acc ``[M, D/2]`` x 2) from its warps' states: each warp's sum
    and output rescaled to the largest max. A warp that saw no valid token (m = -inf) weighs 0. The rows
    come back in the layout of the output's rows (``SliceLayout(1, SliceLayout(0, mma))``)."""
    row_l: ttgl.constexpr = ttgl.SliceLayout(1, ttgl.SliceLayout(0, mma))
    m = ttgl.max(m_i, axis=0)
    scale = ttgl.exp2(m_i - m[None, :])
    l_i = ttgl.sum(ttgl.sum(l_acc, axis=2) * scale, axis=0)
    out_a = ttgl.sum(acc_a * scale[:, :, None], axis=0)
    out_b = ttgl.sum(acc_b * scale[:, :, None], axis=0)
    return ttgl.convert_layout(m, row_l), ttgl.convert_layout(l_i, row_l), out_a, out_b
