"""Predictions of the reported state (documented formulas; units in the names).

    stored_bytes_per_token = kv_bytes_per_token * compression_ratio        (compressed KV bytes)
    step_ms      = itl_ms; a worker with no measurement yet (a new replica) steps at
                   min(placement.idle_itl_ms, the smallest itl_ms measured among the candidates): an
                   idle replica of the model is no slower than its fastest peer, else it would never
                   be picked over a warm peer that measured faster than the idle prior
    added_bytes  = (prompt_tokens + max_new_tokens / 2) * stored_bytes_per_token   (mean context of the
                   new request over its life)
    tpot_ms      = step_ms + added_bytes * decode_ms_per_gib / 2**30
                   decode is memory-bound: the measured step plus the new request's compressed bytes at
                   the configured read cost (the marginal cost of a byte; an earlier itl_ms / used_bytes
                   slope folded the step's fixed cost into every byte, so a lightly loaded worker looked
                   slowest for a long prompt and placement sent it to busy workers instead)
    ttft_ms      = step_ms + (queued_prefill_tokens + reserved_tokens + prompt_tokens - cached_tokens)
                   * prefill_ms_per_token
                   cached_tokens: the leading prompt blocks the router's prefix index says this worker last
                   served (0 without the index): the worker's prefix cache skips their prefill, so the
                   worker holding a conversation is not predicted as slow as a cold one
                   reserved_tokens: what this router placed there that the report cannot have seen yet;
                   those prompts are still to prefill (their outputs are counted too: the safe side).
                   Without it a burst of arrivals within one report interval all saw the same queue
                   and piled long prompts on one worker (bench/sim/cluster_sim.py measured both)
The SLO scorer reads both predictions; the `slo_wait` filter reads `prefill_wait_ms`.
"""

from __future__ import annotations

from collections.abc import Iterable

from zipkv.controlplane.config import PlacementConfig
from zipkv.controlplane.placement.shapes import RequestShape
from zipkv.controlplane.state import WorkerView

GIB = float(1 << 30)


def predict_ms(
    view: WorkerView,
    req: RequestShape,
    cfg: PlacementConfig,
    unmeasured_itl_ms: float | None = None,
    cached_tokens: int = 0,
) -> tuple[float, float]:
    """(ttft_ms, tpot_ms) predicted for `req` on `view` (formulas in the module doc); a worker without
    an ITL measurement steps at `unmeasured_itl_ms` (default: placement.idle_itl_ms); `cached_tokens`
    of the prompt are expected in its prefix cache (at most the prompt)."""
    cap = view.capacity
    ratio = cap.compression_ratio if cap.compression_ratio > 0 else 1.0
    stored_bpt = cap.kv_bytes_per_token * ratio
    step_ms = cap.itl_ms if cap.itl_ms > 0 else (unmeasured_itl_ms or cfg.idle_itl_ms)
    added_bytes = (req.prompt_tokens + req.max_new_tokens / 2) * stored_bpt
    tpot_ms = step_ms + added_bytes * cfg.decode_ms_per_gib / GIB
    own_tokens = req.prompt_tokens - min(max(cached_tokens, 0), req.prompt_tokens)
    pending_tokens = cap.queued_prefill_tokens + view.reserved_tokens + own_tokens
    ttft_ms = step_ms + pending_tokens * req.prefill_ms_per_token
    return ttft_ms, tpot_ms


def peer_itl_ms(views: Iterable[WorkerView], cfg: PlacementConfig) -> float:
    """The step an unmeasured candidate is predicted at: its fastest measured peer, at most the prior."""
    return min([cfg.idle_itl_ms] + [v.capacity.itl_ms for v in views if v.capacity.itl_ms > 0])


def prefill_wait_ms(view: WorkerView, req: RequestShape) -> float:
    """The prefill queued ahead of `req` on `view`: reported queue plus unseen reservations (module doc)."""
    return (view.capacity.queued_prefill_tokens + view.reserved_tokens) * req.prefill_ms_per_token
