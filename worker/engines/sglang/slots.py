"""Slot and page arithmetic of zipkv's SGLang allocator (pure torch; no sglang, no pool).

A **slot** is ``page_id * 16 + offset`` (what SGLang keeps in ``req_to_token`` and ``out_cache_loc``). The
functions here say how many pages an extend or decode needs, which of them the step fills, and which slot each
new token gets: torch twins of SGLang's ``alloc_extend_kernel`` / ``alloc_decode_kernel``, so they run
(and are tested) on the CPU. Sizing helpers turn SGLang's raw token budget into zipkv's heap bytes and
page ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zipkv.kernels.format.layout import PAGE_TOKENS, PageFormat


def to_device(values: list[int], device: torch.device) -> torch.Tensor:
    """int64 host list -> device tensor without blocking the host (pinned, non-blocking on CUDA)."""
    host = torch.tensor(values, dtype=torch.int64)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def raw_bytes_per_token(fmt: PageFormat, num_layers: int) -> int:
    """Uncompressed KV bytes of one token over all layers (SGLang's ``cell_size`` for bf16 MHA)."""
    return fmt.raw_page_bytes // PAGE_TOKENS * num_layers


def budget_bytes_for_tokens(max_total_num_tokens: int, fmt: PageFormat, num_layers: int) -> int:
    """The heap budget of the bytes SGLang would spend on ``max_total_num_tokens`` uncompressed tokens."""
    if max_total_num_tokens < 2 * PAGE_TOKENS:
        raise ValueError(f"max_total_num_tokens {max_total_num_tokens} is below two pages of {PAGE_TOKENS}")
    return max_total_num_tokens // PAGE_TOKENS * fmt.raw_page_bytes * num_layers


def virtual_pages_for_budget(budget_bytes: int, fmt: PageFormat, num_layers: int, compression: bool) -> int:
    """Page ids to offer: as many pages as the budget holds when every page compresses fully (the format's
    ``min_page_bytes``, v1/v2 and v3 alike 3/4 of a raw page), + the pad."""
    page_bytes = fmt.min_page_bytes if compression else fmt.raw_page_bytes
    return budget_bytes // (page_bytes * num_layers) + 1


@dataclass(frozen=True)
class ExtendPlan:
    """Host-side arithmetic of one extend allocation (SGLang's batch order)."""

    new_pages_per_req: list[int]  # new pages each request needs
    full_new_pages_per_req: list[int]  # of those, how many the step fills completely
    tail_fill_reqs: list[int]  # requests whose partially filled last prefix page this step completes

    @property
    def num_new_pages(self) -> int:
        return sum(self.new_pages_per_req)


def plan_extend(prefix_lens: list[int], seq_lens: list[int]) -> ExtendPlan:
    """Which pages an extend of ``prefix_lens[i] -> seq_lens[i]`` tokens allocates and fills."""
    new, full, tail = [], [], []
    for i, (p, s) in enumerate(zip(prefix_lens, seq_lens, strict=True)):
        if not 0 <= p <= s:
            raise ValueError(
                f"request {i}: prefix length {p} and sequence length {s} must satisfy 0 <= p <= s"
            )
        first_new = -(-p // PAGE_TOKENS)  # pages already held (the last one maybe partial)
        new.append(-(-s // PAGE_TOKENS) - first_new)
        full.append(max(s // PAGE_TOKENS - first_new, 0))
        if p % PAGE_TOKENS and s >= first_new * PAGE_TOKENS and s > p:
            tail.append(i)
    return ExtendPlan(new, full, tail)


def extend_slots(
    prefix_lens_cpu: list[int],
    seq_lens_cpu: list[int],
    last_loc: torch.Tensor,
    new_pages: torch.Tensor,
) -> torch.Tensor:
    """Slots of the new tokens, in batch order (torch twin of SGLang's ``alloc_extend_kernel``).

    ``last_loc``: int32/int64 [B] (device), slot of each request's last prefix token (-1 when none);
    ``new_pages``: int64 [num_new_pages] (device), the new page ids in batch order.
    Returns int64 [N] (device).
    """
    device = last_loc.device
    plan = plan_extend(prefix_lens_cpu, seq_lens_cpu)
    lens = torch.tensor(seq_lens_cpu, dtype=torch.int64) - torch.tensor(prefix_lens_cpu, dtype=torch.int64)
    if int(lens.sum()) == 0:
        return torch.empty(0, dtype=torch.int64, device=device)
    r = torch.repeat_interleave(torch.arange(len(lens)), lens)  # request of each new token
    prefix = torch.tensor(prefix_lens_cpu, dtype=torch.int64)[r]
    t = prefix + torch.arange(r.numel()) - (torch.cumsum(lens, 0) - lens)[r]  # its position in the request
    first_new = (prefix + PAGE_TOKENS - 1) // PAGE_TOKENS  # its request's first new page (page index)
    new_start = torch.cumsum(torch.tensor(plan.new_pages_per_req), 0) - torch.tensor(plan.new_pages_per_req)
    in_tail = t < first_new * PAGE_TOKENS  # goes into the partially filled last prefix page
    new_index = (new_start[r] + t // PAGE_TOKENS - first_new).clamp(0, max(new_pages.numel() - 1, 0))
    r_d, t_d = r.to(device), t.to(device)
    tail_slot = last_loc.to(torch.int64)[r_d] + 1 + (t_d - prefix.to(device))
    if new_pages.numel() == 0:
        return tail_slot
    new_slot = new_pages[new_index.to(device)] * PAGE_TOKENS + t_d % PAGE_TOKENS
    return torch.where(in_tail.to(device), tail_slot, new_slot)


def decode_slots(seq_lens_cpu: list[int], last_loc: torch.Tensor, new_pages: torch.Tensor) -> torch.Tensor:
    """Slot of each request's next token: a new page where ``seq_len % 16 == 1``, else ``last_loc + 1``."""
    starts = [i for i, s in enumerate(seq_lens_cpu) if s % PAGE_TOKENS == 1]
    out = last_loc.to(torch.int64) + 1  # SGLang's last_loc comes from req_to_token (int32); slots are int64
    if starts:
        idx = to_device(starts, last_loc.device)
        out = out.index_put((idx,), new_pages * PAGE_TOKENS)
    return out
