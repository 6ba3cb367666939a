"""Scorers: each maps one candidate to [0, 1], higher is better; picker.py weighs them."""

from __future__ import annotations

from dataclasses import dataclass

from zipkv.controlplane.placement.shapes import RequestShape
from zipkv.controlplane.placement_config import PlacementConfig
from zipkv.controlplane.state import WorkerView


@dataclass(frozen=True, slots=True)
class ScoreInput:
    """What a scorer may read about one candidate: its view, the request, and the predictions."""

    view: WorkerView
    req: RequestShape
    cfg: PlacementConfig
    ttft_ms: float
    tpot_ms: float
