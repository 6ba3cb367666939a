"""One step's requests packed into the model's inputs: every request's new tokens concatenated (`[1, T]`
token and position ids), the slots their K/V go to, each request's slice of the batch and, for a step of
decodes only on the device, the fused kernel's decode plan (attention.py reads it all as a `StepBatch`).

Split from engine.py, which decides who runs and what happens to the tokens: this is the arithmetic from
a request's tokens and pages to tensors, and it reads the requests without changing them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zipkv.kernels.format.layout import PAGE_TOKENS
from zipkv.worker.engines.reference.attention import SeqSlice, StepBatch
from zipkv.worker.engines.reference.kvstore import KVStore
from zipkv.worker.engines.reference.running import Running


@dataclass(frozen=True)
class BatchInputs:
    """The model's inputs for one step, on the store's device."""

    input_ids: torch.Tensor  # int64 [1, T]: the new tokens of every request, request by request
    position_ids: torch.Tensor  # int64 [1, T]
    last_rows: torch.Tensor  # int64 [B]: each request's last row, whose logits give its next token
    step: StepBatch  # what every layer's attention reads (slots, slices, decode plan)


def pack_batch(batch: list[Running], store: KVStore, device: torch.device, num_q_heads: int) -> BatchInputs:
    """The inputs of one forward pass over ``batch``, whose pages already cover every token's KV."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    seqs: list[SeqSlice] = []
    for req in batch:
        tokens = req.tokens
        new = tokens[req.computed_tokens :]
        kv_len = len(tokens)
        seqs.append(
            SeqSlice(
                q_start=len(input_ids),
                q_len=len(new),
                kv_len=kv_len,
                page_ids=torch.tensor(req.page_ids, dtype=torch.int64, device=device),
            )
        )
        for pos in range(req.computed_tokens, kv_len):
            slots.append(req.page_ids[pos // PAGE_TOKENS] * PAGE_TOKENS + pos % PAGE_TOKENS)
        input_ids.extend(new)
        positions.extend(range(req.computed_tokens, kv_len))
    plan = None
    if store.decode_on_device and all(s.q_len == 1 for s in seqs):
        plan = store.plan_decode([r.page_ids for r in batch], [s.kv_len for s in seqs], num_q_heads)
    step = StepBatch(
        store=store,
        slots=torch.tensor(slots, dtype=torch.int64, device=device),
        seqs=tuple(seqs),
        decode_plan=plan,
    )
    return BatchInputs(
        input_ids=torch.tensor([input_ids], device=device),
        position_ids=torch.tensor([positions], device=device),
        last_rows=torch.tensor([s.q_start + s.q_len - 1 for s in seqs], device=device),
        step=step,
    )
