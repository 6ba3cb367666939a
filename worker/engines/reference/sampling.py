"""Token sampling: greedy, temperature, top-k and top-p, one row per request."""

from __future__ import annotations

import torch

from zipkv.worker.engine import SamplingOptions


def sample_next(logits: torch.Tensor, options: SamplingOptions, generator: torch.Generator | None) -> int:
    """Pick the next token from ``logits`` (float ``[vocab]``, any device).

    Greedy (temperature 0) is an argmax over the float32 logits, so two runs whose logits are bitwise
    equal pick the same token. Sampling draws on ``generator`` (a per-request CPU generator, so that a
    seeded request is reproducible whatever else runs beside it).
    """
    row = logits.float()
    if options.temperature == 0.0:
        return int(torch.argmax(row).item())
    row = row / options.temperature
    if options.top_k > 0 and options.top_k < row.numel():
        kth = torch.topk(row, options.top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    if options.top_p < 1.0:
        sorted_logits, order = torch.sort(row, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the mass before it already reaches top_p (the first token always stays).
        drop = (torch.cumsum(probs, dim=-1) - probs) >= options.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        row = torch.full_like(row, float("-inf")).scatter(0, order, sorted_logits)
    probs = torch.softmax(row, dim=-1).cpu()
    return int(torch.multinomial(probs, 1, generator=generator).item())


def make_generator(options: SamplingOptions, request_index: int) -> torch.Generator | None:
    """A CPU generator for a sampled request: seeded from the request, else from its arrival index."""
    if options.temperature == 0.0:
        return None
    gen = torch.Generator(device="cpu")
    gen.manual_seed(options.seed if options.seed else 0x5EED + request_index)
    return gen
