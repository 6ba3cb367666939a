"""The Hopper decode kernel's online softmax (decode.py): one per program, its warps splitting each tile's
tokens (2D tensors ``[M, X]``, restore.attend), or one per warp over its own page, merged when the program
ends (3D tensors ``[NW, M, X]``, warp_softmax.py). The kernel calls these four and never looks inside the
state, so the choice is one compile-time flag, ``WARP_SOFTMAX``.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as ttgl
from triton.runtime.jit import constexpr_function

from .lean import attend_lean
from .restore import attend
from .ring import _PT
from .warp_softmax import attend_pages, merge_warps, token_valid, warp_mma_layout

M_ROWS = 16  # MMA rows: the GQA group, padded
_M = ttgl.constexpr(M_ROWS)  # Gluon reads globals only as constexpr


@constexpr_function
def kernel_mma_layout(NW, WARP_SOFTMAX):  # type: ignore[no-untyped-def]
    """The MMA layout: warps split a tile's tokens inside one softmax (2D), or one page per warp (3D,
    warp_softmax.py)."""
    if WARP_SOFTMAX:
        return warp_mma_layout(NW)
    return ttgl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, NW], instr_shape=[16, 8])


@constexpr_function
def out_layout(mma, WARP_SOFTMAX):  # type: ignore[no-untyped-def]
    """The layout of the program's ``[M, D/2]`` output: the MMA's, or (3D) its slice past the warp merge."""
    return ttgl.SliceLayout(0, mma) if WARP_SOFTMAX else mma


@gluon.jit
def init_state(mma: ttgl.constexpr, N: ttgl.constexpr, D: ttgl.constexpr, WARP_SOFTMAX: ttgl.constexpr):
    """The online softmax's empty state: (max, per-column sums, output channels < D/2, >= D/2)."""
    if WARP_SOFTMAX:
        NW: ttgl.constexpr = ttgl.num_warps()
        m_i = ttgl.full([NW, _M], float("-inf"), ttgl.float32, layout=ttgl.SliceLayout(2, mma))
        l_acc = ttgl.zeros([NW, _M, _PT], ttgl.float32, layout=mma)
        acc_a = ttgl.zeros([NW, _M, D // 2], ttgl.float32, layout=mma)
        acc_b = ttgl.zeros([NW, _M, D // 2], ttgl.float32, layout=mma)
    else:
        m_i = ttgl.full([_M], float("-inf"), ttgl.float32, layout=ttgl.SliceLayout(1, mma))
        l_acc = ttgl.zeros([_M, N], ttgl.float32, layout=mma)
        acc_a = ttgl.zeros([_M, D // 2], ttgl.float32, layout=mma)
        acc_b = ttgl.zeros([_M, D // 2], ttgl.float32, layout=mma)
    return m_i, l_acc, acc_a, acc_b


@gluon.jit
def attend_tile(qa, qb, ops, tok0, end, state, qk_scale, mma: ttgl.constexpr, a_l: ttgl.constexpr,
                 N: ttgl.constexpr, WARP_SOFTMAX: ttgl.constexpr, LAZY: ttgl.constexpr = False,
                 scratch=None, LEAN: ttgl.constexpr = False, PAD_HI: ttgl.constexpr = False):  # fmt: skip
    """The softmax state after the tile at ``tok0`` (``ops``: its K_a, K_b, V_a, V_b operands). ``LAZY``
    (shared softmax only): skip the output rescale of a tile where no row max grew (restore.attend).
    ``LEAN`` (shared softmax only): lean.attend_lean, exchanging through ``scratch`` (lean.lean_scratch);
    ``PAD_HI`` with it: the MMA's rows 8-15 are padding (a GQA group of at most 8; lean.py)."""
    ka, kb, va, vb = ops
    m_i, l_acc, acc_a, acc_b = state
    if WARP_SOFTMAX:
        valid = token_valid(tok0, end, mma)
        m_i, l_acc, acc_a, acc_b = attend_pages(
            qa, qb, ka, kb, va, vb, valid, m_i, l_acc, acc_a, acc_b, qk_scale, mma, a_l, _M
        )  # fmt: skip
    elif LEAN:
        m_i, l_acc, acc_a, acc_b = attend_lean(
            qa, qb, ops, tok0, end, state, qk_scale, scratch, mma, a_l, _M, N, LAZY, PAD_HI
        )  # fmt: skip
    else:
        valid = tok0 + ttgl.arange(0, N, layout=ttgl.SliceLayout(0, mma)) < end
        m_i, l_acc, acc_a, acc_b = attend(
            qa, qb, ka, kb, va, vb, valid, m_i, l_acc, acc_a, acc_b, qk_scale, mma, a_l, _M, N, LAZY
        )  # fmt: skip
    return m_i, l_acc, acc_a, acc_b


@gluon.jit
def final_state(state, mma: ttgl.constexpr, WARP_SOFTMAX: ttgl.constexpr):
    """(max ``[M]``, sum ``[M]``, output channels < D/2, >= D/2 ``[M, D/2]``) of the whole program."""
    m_i, l_acc, acc_a, acc_b = state
    if WARP_SOFTMAX:
        m_i, l_i, acc_a, acc_b = merge_warps(m_i, l_acc, acc_a, acc_b, mma)
    else:
        l_i = ttgl.sum(l_acc, axis=1)
    return m_i, l_i, acc_a, acc_b
