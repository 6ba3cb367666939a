"""`place`: filters (filters.py) -> scorers in [0, 1] (scorers/) -> the ranked pick (picker.py)."""

from __future__ import annotations

from zipkv.controlplane.placement import picker
from zipkv.controlplane.placement.filters import apply_filters
from zipkv.controlplane.placement.predict import cached_prompt_tokens, peer_itl_ms, predict_ms
from zipkv.controlplane.placement.scorers import ScoreInput, headroom, prefix_affinity, queue, slo
from zipkv.controlplane.placement.shapes import Candidate, Decision, RequestShape
from zipkv.controlplane.placement_config import PlacementConfig
from zipkv.controlplane.prefix_index import PrefixMatch
from zipkv.controlplane.state import Snapshot


def place(
    snap: Snapshot,
    req: RequestShape,
    cfg: PlacementConfig,
    now_s: float,
    top_k: int | None = None,
    prefix: PrefixMatch | None = None,
) -> Decision:
    """Rank the workers that can take `req` (best first; only the best `top_k` when given); empty when
    none can (the caller answers 503). `prefix`: the router's prefix index's answer for this prompt
    (None: no affinity, as for a prompt shorter than one block)."""
    with_affinity = prefix is not None and prefix.blocks > 0 and cfg.weight_prefix_affinity > 0
    kept, dropped = apply_filters(snap, req, cfg, now_s, prefix if with_affinity else None)
    stale_s = cfg.stale_after_ms / 1000.0
    coarse = any(now_s - v.received_s > stale_s for v in kept)
    w = picker.weights(cfg, coarse, with_affinity)
    unmeasured_itl_ms = peer_itl_ms(kept, cfg)
    out = []
    for v in kept:
        cached = cached_prompt_tokens(
            prefix if with_affinity else None, v.worker_id, req, cfg.prefix_block_tokens
        )
        ttft_ms, tpot_ms = predict_ms(v, req, cfg, unmeasured_itl_ms, cached)
        s = ScoreInput(v, req, cfg, ttft_ms, tpot_ms)
        h, o, q = headroom.score(s), slo.score(s), queue.score(s)
        a = prefix_affinity.score(s, prefix) if with_affinity else 0.0
        out.append(Candidate(v, picker.combine(w, h, o, q, a), h, o, q, ttft_ms, tpot_ms, a, cached))
    return Decision(ranked=picker.rank(out, top_k), coarse=coarse, filtered=dropped)
