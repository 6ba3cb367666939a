"""The pick: scorer weights, the weighted mean, the ranking.

    score = sum(weight_i * scorer_i) / sum(weight_i)
The SLO weight is dropped when any candidate's report is stale (the coarse signal); when only the SLO
scorer was weighted, headroom alone decides. Ranked best first; ties break on worker_id, so the result
is deterministic; only the best `top_k` are kept when given.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from zipkv.controlplane.placement.shapes import Candidate
from zipkv.controlplane.placement_config import PlacementConfig


@dataclass(frozen=True, slots=True)
class Weights:
    headroom: float
    slo: float
    queue: float
    affinity: float = 0.0

    @property
    def total(self) -> float:
        return self.headroom + self.slo + self.queue + self.affinity


def weights(cfg: PlacementConfig, coarse: bool, with_affinity: bool = False) -> Weights:
    """`with_affinity`: the request has prompt blocks to match (else that scorer is left out, so a short
    prompt is ranked exactly as without the scorer)."""
    affinity = cfg.weight_prefix_affinity if with_affinity else 0.0
    w = Weights(cfg.weight_headroom, 0.0 if coarse else cfg.weight_slo, cfg.weight_queue, affinity)
    if w.total - w.affinity <= 0:  # only the SLO scorer was weighted and it is off: fall back to headroom
        return Weights(1.0, 0.0, 0.0, affinity)
    return w


def combine(w: Weights, headroom: float, slo: float, queue: float, affinity: float = 0.0) -> float:
    """The weighted mean of the scorers, in [0, 1]."""
    return (w.headroom * headroom + w.slo * slo + w.queue * queue + w.affinity * affinity) / w.total


def rank(candidates: list[Candidate], top_k: int | None = None) -> tuple[Candidate, ...]:
    """Best first, ties on worker_id; only the best `top_k` when given."""
    rows = [(-c.score, c.worker.worker_id, i) for i, c in enumerate(candidates)]
    rows = heapq.nsmallest(top_k, rows) if top_k is not None and top_k < len(rows) else sorted(rows)
    return tuple(candidates[r[2]] for r in rows)
