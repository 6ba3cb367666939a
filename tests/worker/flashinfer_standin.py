"""A stand-in for the `flashinfer` package on the CPU (FlashInfer runs only on a GPU), named as such: the two
prefill wrappers zipkv calls and merge_state, in float32 torch, with FlashInfer's documented semantics
(ragged and paged KV layouts, causal masks aligned to the end of the keys, log-sum-exp in base 2). It lets
worker/engines/sglang/flashinfer_prefill.py run whole on the CPU; the GPU tests hold the real package to
the same float32 reference."""

from __future__ import annotations

import math
import types

import torch


def attend_lse(
    q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, sm_scale: float, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [n, Hq, D] over keys/vals [m, Hkv, D]: (out [n, Hq, D], lse float32 [n, Hq] in base 2); a causal
    mask puts q's last row at the keys' last position. No key: out 0, lse -inf."""
    n, hq, d = q.shape
    m = keys.shape[0]
    if m == 0:
        return torch.zeros(n, hq, d, dtype=q.dtype), torch.full((n, hq), float("-inf"))
    group = hq // keys.shape[1]
    k, v = keys.float().repeat_interleave(group, 1), vals.float().repeat_interleave(group, 1)
    scores = torch.einsum("nhd,mhd->hnm", q.float(), k) * sm_scale
    if causal:
        pos = torch.arange(n)[:, None] + (m - n)
        scores = scores.masked_fill(torch.arange(m)[None, :] > pos, float("-inf"))
    lse = torch.logsumexp(scores, -1)  # [h, n]
    out = torch.einsum("hnm,mhd->nhd", torch.exp(scores - lse[..., None]), v)
    return out.to(q.dtype), (lse / math.log(2)).transpose(0, 1).contiguous()


class RaggedWrapper:
    def __init__(self, workspace: torch.Tensor, layout: str) -> None:
        assert layout == "NHD"
        self.plans: list[tuple[list[int], list[int]]] = []

    def begin_forward(
        self, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, *shape: int, **_: object
    ) -> None:
        self.plans.append((qo_indptr.tolist(), kv_indptr.tolist()))

    def forward_return_lse(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, sm_scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        qo, kv = self.plans[-1]
        parts = [attend_lse(q[qo[b]:qo[b + 1]], k[kv[b]:kv[b + 1]], v[kv[b]:kv[b + 1]], sm_scale, causal)
                 for b in range(len(qo) - 1)]  # fmt: skip
        return torch.cat([o for o, _ in parts]), torch.cat([s for _, s in parts])

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, sm_scale: float
    ) -> torch.Tensor:
        return self.forward_return_lse(q, k, v, causal, sm_scale)[0]


class PagedWrapper:
    def __init__(self, workspace: torch.Tensor, layout: str) -> None:
        assert layout == "HND"
        self.plans: list[tuple[list[int], list[int], list[int], list[int], int]] = []

    def begin_forward(
        self, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
        last_page_len: torch.Tensor, hq: int, hkv: int, head_dim: int, page_size: int, **_: object,
    ) -> None:  # fmt: skip
        plan = (
            qo_indptr.tolist(),
            kv_indptr.tolist(),
            kv_indices.tolist(),
            last_page_len.tolist(),
            page_size,
        )
        self.plans.append(plan)

    def forward_return_lse(
        self, q: torch.Tensor, cache: torch.Tensor, causal: bool, sm_scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cache: [pages, 2, Hkv, page_size, D] (HND, keys then values)."""
        qo, indptr, indices, last, page = self.plans[-1]
        parts = []
        for b in range(len(qo) - 1):
            ids = indices[indptr[b] : indptr[b + 1]]
            tokens = (len(ids) - 1) * page + last[b] if ids else 0
            kv = cache[ids].permute(1, 0, 3, 2, 4).reshape(2, -1, cache.shape[2], cache.shape[4])[:, :tokens]
            parts.append(attend_lse(q[qo[b] : qo[b + 1]], kv[0], kv[1], sm_scale, causal))
        return torch.cat([o for o, _ in parts]), torch.cat([s for _, s in parts])


def merge_state(
    v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    s = torch.logaddexp(s_a * math.log(2), s_b * math.log(2)) / math.log(2)
    out = v_a.float() * torch.exp2(s_a - s)[..., None] + v_b.float() * torch.exp2(s_b - s)[..., None]
    return out.to(v_a.dtype), s


def module() -> types.ModuleType:
    """The stand-in as a module, for `monkeypatch.setitem(sys.modules, "flashinfer", module())`."""
    fake = types.ModuleType("flashinfer")
    fake.BatchPrefillWithRaggedKVCacheWrapper = RaggedWrapper  # type: ignore[attr-defined]
    fake.BatchPrefillWithPagedKVCacheWrapper = PagedWrapper  # type: ignore[attr-defined]
    fake.merge_state = merge_state  # type: ignore[attr-defined]
    return fake
