"""Paged attention over zipkv's compressed KV store, as a transformers attention function.

One engine step runs the model once over a *packed* batch: every running request's new tokens
concatenated along the sequence axis (`[1, T]` input ids, per-token position ids). The attention function
of each layer then (1) writes the new tokens' K/V into their pages (slot = page_id * 16 + offset) and (2)
attends each request's queries over its own pages, raw or compressed:

- a step of decodes only, on CUDA: zipkv's fused decode-attention kernel, which reads compressed pages
  directly (its uncompressed twin when compression is off: the same kernel source);
- otherwise (prefill, extend, or the CPU): the request's pages are restored with the codec's page reader
  and attended in float32 with a causal mask, in plain torch.

With compression off the pool never compresses a page; the page reader and the kernel then see raw pages
only. The arithmetic after the read is the same code on the same bits, which is what makes the two runs'
tokens identical.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from zipkv.worker.engines.reference.kvstore import KVStore


@dataclass(frozen=True)
class SeqSlice:
    """One request's part of a packed step."""

    q_start: int  # first query row in the packed batch
    q_len: int  # new tokens this step
    kv_len: int  # tokens of KV after this step (cached + new)
    page_ids: torch.Tensor  # int64 [ceil(kv_len / 16)], on the store's device


@dataclass(frozen=True)
class StepBatch:
    """What the attention function of every layer needs for one step (built once per step)."""

    store: KVStore
    slots: torch.Tensor  # int64 [T] on the store's device: where each new token's K/V goes
    seqs: tuple[SeqSlice, ...]
    decode_plan: Any = None  # a DecodePlan when every request decodes one token on CUDA, else None


def zipkv_paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # bf16 [1, Hq, T, D]
    key: torch.Tensor,  # bf16 [1, Hkv, T, D]
    value: torch.Tensor,  # bf16 [1, Hkv, T, D]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    zipkv_batch: StepBatch | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    if zipkv_batch is None:
        raise RuntimeError(
            "the zipkv attention needs a `zipkv_batch` argument: run the model through the engine"
        )
    layer = int(module.layer_idx)  # type: ignore[arg-type]
    batch = zipkv_batch
    store = batch.store
    q = query[0].transpose(0, 1)  # [T, Hq, D]
    k = key[0].transpose(0, 1).to(torch.bfloat16).contiguous()  # [T, Hkv, D]
    v = value[0].transpose(0, 1).to(torch.bfloat16).contiguous()
    store.write(layer, batch.slots, k, v)
    sm_scale = float(scaling if scaling is not None else q.shape[-1] ** -0.5)
    if batch.decode_plan is not None:
        out = store.decode_attention(layer, batch.decode_plan, q.to(torch.bfloat16).contiguous(), sm_scale)
    else:
        out = torch.empty(q.shape, dtype=query.dtype, device=query.device)
        for seq in batch.seqs:
            rows = slice(seq.q_start, seq.q_start + seq.q_len)
            out[rows] = _attend_pages(store, layer, q[rows], seq, sm_scale).to(query.dtype)
    return out.unsqueeze(0), None  # [1, T, Hq, D]


def _attend_pages(
    store: KVStore, layer: int, q: torch.Tensor, seq: SeqSlice, sm_scale: float
) -> torch.Tensor:
    """Causal attention of ``q`` (``[q_len, Hq, D]``) over the request's pages, in float32."""
    pages = store.read_pages(layer, seq.page_ids)  # bf16 [n, 2, Hkv, 16, D]
    n, _, hkv, page_tokens, d = pages.shape
    kv = pages.permute(1, 2, 0, 3, 4).reshape(2, hkv, n * page_tokens, d)[:, :, : seq.kv_len].float()
    group = q.shape[1] // hkv
    keys = kv[0].repeat_interleave(group, dim=0)  # [Hq, L, D]
    values = kv[1].repeat_interleave(group, dim=0)
    qh = q.float().transpose(0, 1)  # [Hq, q_len, D]
    scores = torch.matmul(qh, keys.transpose(1, 2)) * sm_scale  # [Hq, q_len, L]
    if seq.q_len > 1:
        first = seq.kv_len - seq.q_len  # position of the first new token
        q_pos = torch.arange(first, seq.kv_len, device=q.device)[:, None]
        k_pos = torch.arange(seq.kv_len, device=q.device)[None, :]
        scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, values).transpose(0, 1)  # [q_len, Hq, D]
