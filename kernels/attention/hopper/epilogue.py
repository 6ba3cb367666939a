"""The Hopper decode kernel's epilogue (kernels/attention/hopper/decode.py): a program's rows, written as
the final bf16 output or as its split's fp32 partial and log2-sum-exp2 for the merge
(kernels/attention/merge.py)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as ttgl

from .softmax import _M


@gluon.jit
def store_out(out_ptr, o_part_ptr, lse_part_ptr, m_i, l_i, acc_a, acc_b, req, head, pair, whole,
              stride_ob, stride_oh, row_l: ttgl.constexpr, col_l: ttgl.constexpr, H: ttgl.constexpr,
              GROUP: ttgl.constexpr, D: ttgl.constexpr, SPLIT: ttgl.constexpr):  # fmt: skip
    """The program's rows: the final bf16 output, or (SPLIT, unless the item is its request's ``whole``
    context) this split's fp32 partial and log2-sum-exp2. A whole request's output is the same bits either
    way (the merge of one split divides by exp2(0) = 1), but written here it skips a round trip of fp32
    partials: at 64 x 8192 the plan's floor of items switches the merge on with no request split, and
    this took the step from 415.9 to 409.1 us on the H200 (docs/benchmarks.md); the merge (merge.py,
    SKIP_WHOLE) leaves such requests alone."""
    out_a = acc_a / l_i[:, None]
    out_b = acc_b / l_i[:, None]
    offs_om = ttgl.arange(0, _M, layout=row_l)
    offs_od = ttgl.arange(0, D // 2, layout=col_l)
    o_mask = (offs_om < GROUP)[:, None]
    q_head = head * GROUP + offs_om
    if SPLIT:
        if whole:
            store_final(out_ptr, out_a, out_b, req, q_head, offs_od, o_mask, stride_ob, stride_oh, D)
        else:
            part = pair * H * GROUP + q_head  # o_partial [pairs, Hq, D]
            o_rows = o_part_ptr + part[:, None] * D + offs_od[None, :]
            ttgl.store(o_rows, out_a, mask=o_mask)
            ttgl.store(o_rows + D // 2, out_b, mask=o_mask)
            ttgl.store(lse_part_ptr + part, m_i + ttgl.log2(l_i), mask=offs_om < GROUP)
    else:
        store_final(out_ptr, out_a, out_b, req, q_head, offs_od, o_mask, stride_ob, stride_oh, D)


@gluon.jit
def store_final(out_ptr, out_a, out_b, req, q_head, offs_od, o_mask, stride_ob, stride_oh,
                D: ttgl.constexpr):  # fmt: skip
    o_rows = out_ptr + req * stride_ob + q_head[:, None] * stride_oh + offs_od[None, :]
    ttgl.store(o_rows, out_a.to(ttgl.bfloat16), mask=o_mask)
    ttgl.store(o_rows + D // 2, out_b.to(ttgl.bfloat16), mask=o_mask)
