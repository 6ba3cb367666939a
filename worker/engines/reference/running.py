"""A request's state inside the reference engine, and small helpers."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from zipkv.kernels.format.layout import PAGE_TOKENS
from zipkv.worker.engine import EngineRequest
from zipkv.worker.engine_stats import RequestTimings, now_ns


@dataclass
class Running:
    request: EngineRequest
    arrival_s: float
    generator: torch.Generator | None
    reserved_pages: int = 0  # worst-case pages still to allocate
    page_ids: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    computed_tokens: int = 0  # tokens whose KV is stored
    full_pages: int = 0  # leading pages already marked full
    first_token_s: float | None = None
    # wall-clock ns for the request's spans (engine_stats.RequestTimings); 0 = not reached
    queued_ns: int = 0
    admitted_ns: int = 0
    admission_done_ns: int = 0
    prefill_start_ns: int = 0
    prefill_end_ns: int = 0
    prefill_batch_requests: int = 0
    headroom_tokens: int = 0  # free tokens when it was admitted
    reserved_tokens: int = 0  # its worst case, reserved at admission

    def timings(self) -> RequestTimings:
        """Its spans' times, at its finish; after the prefill's first token it decodes one per step."""
        decoded = max(len(self.output) - 1, 0)
        return RequestTimings(
            queued_ns=self.queued_ns,
            admitted_ns=self.admitted_ns,
            admission_done_ns=self.admission_done_ns,
            prefill_start_ns=self.prefill_start_ns,
            prefill_end_ns=self.prefill_end_ns,
            finished_ns=now_ns(),
            prefill_tokens=len(self.request.prompt_token_ids) if self.prefill_end_ns else 0,
            prefix_hit_tokens=0,  # the reference engine has no prefix cache
            prefill_batch_requests=self.prefill_batch_requests,
            decode_tokens=decoded,
            decode_steps=decoded,
            reserved_tokens=self.reserved_tokens,
            headroom_tokens=self.headroom_tokens,
        )

    @property
    def tokens(self) -> list[int]:
        return list(self.request.prompt_token_ids) + self.output


def pages_for(tokens: int) -> int:
    return -(-tokens // PAGE_TOKENS)


def ewma(prev: float, sample: float, alpha: float = 0.2) -> float:
    return sample if prev == 0.0 else (1 - alpha) * prev + alpha * sample
