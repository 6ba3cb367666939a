"""headroom = (view.headroom_tokens - need_tokens) / total_tokens, in [0, 1]: prefer room to spare."""

from __future__ import annotations

from zipkv.controlplane.placement.scorers import ScoreInput
from zipkv.controlplane.placement.shapes import clamp


def score(s: ScoreInput) -> float:
    total = s.view.capacity.total_tokens
    return clamp((s.view.headroom_tokens - s.req.need_tokens) / total) if total else 0.0
