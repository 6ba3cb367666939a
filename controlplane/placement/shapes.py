"""What placement is asked (`RequestShape`) and what it answers (`Candidate`, `Decision`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from zipkv.controlplane.state import WorkerView


@dataclass(frozen=True, slots=True)
class RequestShape:
    model: str
    prompt_tokens: int
    max_new_tokens: int
    slo_ttft_ms: float
    slo_tpot_ms: float
    prefill_ms_per_token: float

    @property
    def need_tokens(self) -> int:
        return self.prompt_tokens + self.max_new_tokens


@dataclass(frozen=True, slots=True)
class Candidate:
    worker: WorkerView
    score: float
    headroom: float
    slo: float
    queue: float
    ttft_ms: float
    tpot_ms: float
    affinity: float = 0.0  # the prefix-affinity scorer (0 when the request had no blocks to match)
    cached_tokens: int = 0  # prompt tokens this worker is expected to hold (prefix index; 0 without it)

    def prefill_tokens(self, req: RequestShape) -> int:
        """The prompt tokens this worker is expected to prefill for `req` (what a reservation carries)."""
        return req.prompt_tokens - self.cached_tokens


@dataclass(frozen=True, slots=True)
class Decision:
    ranked: tuple[Candidate, ...]  # best first
    coarse: bool  # some candidate's report was stale: compared on headroom and queue only
    filtered: dict[str, int] = field(default_factory=dict)  # reason -> workers dropped

    @property
    def best(self) -> Candidate | None:
        return self.ranked[0] if self.ranked else None


def clamp(x: float) -> float:
    """x limited to [0, 1]: every scorer's range."""
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else x
