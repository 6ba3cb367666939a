"""queue = 1 / (1 + queued_requests), in (0, 1]: fewer requests waiting ahead is better."""

from __future__ import annotations

from zipkv.controlplane.placement.scorers import ScoreInput


def score(s: ScoreInput) -> float:
    # reports are range-checked; this never divides by 0
    return 1.0 / (1.0 + max(s.view.capacity.queued_requests, 0))
