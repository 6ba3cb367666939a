"""Plain-torch oracle for paged decode attention (CPU and GPU), the reference of kernels/attention/decode.py.

It reads the same page table as the kernel but takes the pages as values (bf16 ``[num_pages, 2, H, 16, D]``,
e.g. from :func:`zipkv.kernels.reference.pages.gather_pages`), so it is independent of how they are stored.
"""

from __future__ import annotations

import torch

from ..format.layout import PAGE_TOKENS


def decode_attention_reference(
    q: torch.Tensor,
    pages: torch.Tensor,
    page_ids: torch.Tensor,
    page_indptr: torch.Tensor,
    kv_lens: torch.Tensor,
    sm_scale: float,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Attention of ``q`` (``[B, Hq, D]``) over each request's first ``kv_lens[b]`` tokens, in ``dtype``.

    ``pages``: ``[num_pages, 2, H, 16, D]`` indexed by page id; request ``b`` owns
    ``page_ids[page_indptr[b]:page_indptr[b + 1]]`` in token order. Query head ``i`` reads KV head
    ``i // (Hq / H)``. Returns ``[B, Hq, D]`` in ``dtype``.
    """
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads = pages.shape[2]
    if num_q_heads % num_kv_heads != 0:
        raise ValueError(f"{num_q_heads} query heads do not group over {num_kv_heads} KV heads")
    group = num_q_heads // num_kv_heads
    indptr = page_indptr.tolist()
    lens = kv_lens.tolist()
    out = torch.empty(batch, num_q_heads, head_dim, dtype=dtype, device=q.device)
    for b in range(batch):
        ids = page_ids[indptr[b] : indptr[b + 1]].to(torch.int64)
        if lens[b] < 1 or ids.numel() * PAGE_TOKENS < lens[b]:
            raise ValueError(f"request {b}: {lens[b]} tokens do not fit its {ids.numel()} pages")
        kv = pages[ids].to(dtype)  # [P, 2, H, 16, D]
        kv = kv.permute(1, 2, 0, 3, 4).reshape(2, num_kv_heads, -1, head_dim)[:, :, : lens[b]]
        k = kv[0].repeat_interleave(group, dim=0)  # [Hq, L, D]
        v = kv[1].repeat_interleave(group, dim=0)
        scores = torch.einsum("hd,hld->hl", q[b].to(dtype), k) * sm_scale
        out[b] = torch.einsum("hl,hld->hd", torch.softmax(scores, dim=-1), v)
    return out


def extend_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pages: torch.Tensor,
    page_ids: torch.Tensor,
    page_indptr: torch.Tensor,
    prefix_lens: list[int],
    qo_lens: list[int],
    sm_scale: float,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Causal attention of new tokens over their cached prefix and themselves, in ``dtype``.

    ``q``: ``[N, Hq, D]``, ``k``/``v``: ``[N, H, D]``, the new tokens of every request in order (request b
    has ``qo_lens[b]``); its first ``prefix_lens[b]`` tokens are in ``pages`` (as in
    :func:`decode_attention_reference`). New token i of a request sees the whole prefix and new tokens <= i.
    """
    num_kv_heads, head_dim = pages.shape[2], pages.shape[4]
    group = q.shape[1] // num_kv_heads
    indptr = page_indptr.tolist()
    out = torch.empty(q.shape, dtype=dtype, device=q.device)
    start = 0
    for b, (n_prefix, n_new) in enumerate(zip(prefix_lens, qo_lens, strict=True)):
        ids = page_ids[indptr[b] : indptr[b + 1]].to(torch.int64)
        kv = pages[ids].to(dtype).permute(1, 0, 3, 2, 4).reshape(2, -1, num_kv_heads, head_dim)[:, :n_prefix]
        new = slice(start, start + n_new)
        keys = torch.cat([kv[0], k[new].to(dtype)]).repeat_interleave(group, dim=1)  # [L, Hq, D]
        values = torch.cat([kv[1], v[new].to(dtype)]).repeat_interleave(group, dim=1)
        scores = torch.einsum("nhd,lhd->hnl", q[new].to(dtype), keys) * sm_scale
        seen = (
            torch.arange(n_prefix + n_new, device=q.device)[None, :]
            <= (n_prefix + torch.arange(n_new, device=q.device))[:, None]
        )
        scores = scores.masked_fill(~seen, float("-inf"))
        out[new] = torch.einsum("hnl,lhd->nhd", torch.softmax(scores, dim=-1), values)
        start += n_new
    return out
