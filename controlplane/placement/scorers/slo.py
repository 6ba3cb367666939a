"""slo = min(slack(ttft_ms, slo_ttft_ms), slack(tpot_ms, slo_tpot_ms)), slack(p, s) = clamp((s - p) / s).

The predictions are predict.py's; the tighter of the two targets decides."""

from __future__ import annotations

from zipkv.controlplane.placement.scorers import ScoreInput
from zipkv.controlplane.placement.shapes import clamp


def slack(predicted_ms: float, target_ms: float) -> float:
    return clamp((target_ms - predicted_ms) / target_ms)


def score(s: ScoreInput) -> float:
    return min(slack(s.ttft_ms, s.req.slo_ttft_ms), slack(s.tpot_ms, s.req.slo_tpot_ms))
