"""The split-KV merge of the fused decode kernel (kernels/attention/decode.py).

When the plan cuts a request's context into splits, each split writes a partial output and its
log2-sum-exp2; this small kernel combines them, one program per (request, query head).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _merge_kernel(
    o_part_ptr, lse_part_ptr, out_ptr, num_splits_ptr, stride_ob, stride_oh, max_splits,
    NUM_Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """Combine one (request, query head)'s split outputs by their log2-sum-exp2."""
    req = tl.program_id(0)
    q_head = tl.program_id(1)
    n = tl.load(num_splits_ptr + req)
    base = (req * NUM_Q_HEADS + q_head) * max_splits
    offs = tl.arange(0, CHUNK)
    d = tl.arange(0, HEAD_DIM)
    m = tl.max(tl.full([CHUNK], float("-inf"), tl.float32), 0)
    for s0 in range(0, n, CHUNK):
        lse = tl.load(lse_part_ptr + base + s0 + offs, mask=s0 + offs < n, other=float("-inf"))
        m = tl.maximum(m, tl.max(lse, 0))
    acc = tl.zeros([HEAD_DIM], tl.float32)
    den = tl.sum(tl.zeros([CHUNK], tl.float32), 0)
    for s0 in range(0, n, CHUNK):
        live = s0 + offs < n
        w = tl.exp2(tl.load(lse_part_ptr + base + s0 + offs, mask=live, other=float("-inf")) - m)
        o = tl.load(
            o_part_ptr + (base + s0 + offs)[:, None] * HEAD_DIM + d[None, :], mask=live[:, None], other=0.0
        )
        acc += tl.sum(w[:, None] * o, 0)
        den += tl.sum(w, 0)
    tl.store(out_ptr + req * stride_ob + q_head * stride_oh + d, (acc / den).to(tl.bfloat16))
