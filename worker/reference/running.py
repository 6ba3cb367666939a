"""A request's state inside the reference engine, and small helpers."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from zipkv.kernels.layout import PAGE_TOKENS

from ..engine import EngineRequest


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

    @property
    def tokens(self) -> list[int]:
        return list(self.request.prompt_token_ids) + self.output


def pages_for(tokens: int) -> int:
    return -(-tokens // PAGE_TOKENS)


def ewma(prev: float, sample: float, alpha: float = 0.2) -> float:
    return sample if prev == 0.0 else (1 - alpha) * prev + alpha * sample
