"""Predictions of the reported state (documented formulas; units in the names).

    stored_bytes_per_token = kv_bytes_per_token * compression_ratio        (compressed KV bytes)
    step_ms      = itl_ms; a worker reporting none (a new replica, or nothing running: zipkv.proto)
                   steps at min(placement.idle_itl_ms, the smallest itl_ms measured among the candidates): an
                   idle replica of the model is no slower than its fastest peer, else it would never
                   be picked over a warm peer that measured faster than the idle prior
    added_bytes  = (prompt_tokens + max_new_tokens / 2) * stored_bytes_per_token   (mean context of the
                   new request over its life)
    tpot_ms      = step_ms + added_bytes * decode_ms_per_gib / 2**30
                   decode is memory-bound: the measured step plus the new request's compressed bytes at
                   the configured read cost (the marginal cost of a byte; an earlier itl_ms / used_bytes
                   slope folded the step's fixed cost into every byte, so a lightly loaded worker looked
                   slowest for a long prompt and placement sent it to busy workers instead)
    ttft_ms      = step_ms + (queued_prefill + prompt_tokens - cached_tokens) * prefill_ms_per_token
                   cached_tokens: the leading prompt blocks the router's prefix index says this worker last
                   served (0 without the index): the worker's prefix cache skips their prefill, so the
                   worker holding a conversation is not predicted as slow as a cold one
    queued_prefill = max(queued_prefill_tokens - listed_done_tokens, 0) + unseen_prefill_tokens
                   the prompt tokens queued ahead on the worker, net of prefix-cache hits: the reported
                   queue (whole prompts: a worker cannot know its hits before scheduling) less the
                   expected hits of this router's requests it lists, plus the uncached prompts this router
                   placed there that the report cannot list yet (state.py, prefill accounting). Without the
                   unseen prompts a burst of arrivals within one report interval all saw the same queue and
                   piled long prompts on one worker; counting every reservation until its first token (in
                   full, with its output, on top of the report that lists it) predicted a worker that was
                   nearly idle past the shed bound (bench/sim/cluster_sim.py measured both)
    shed_wait_ms = (queued_prefill + best_cached_tokens - cached_tokens) * prefill_ms_per_token
                   what the `slo_wait` filter bounds: the queue ahead plus the part of the request's own
                   prefill this worker costs beyond the best candidate (the one holding most of its
                   prefix); the same count as ttft_ms less the prefill every candidate would do anyway, so
                   the filter and the SLO and affinity scorers rank the holder of a conversation alike
The SLO scorer reads both predictions; the `slo_wait` filter reads `shed_wait_ms`.
"""

from __future__ import annotations

from collections.abc import Iterable

from zipkv.controlplane.placement.shapes import RequestShape
from zipkv.controlplane.placement_config import PlacementConfig
from zipkv.controlplane.prefix_index import PrefixMatch
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
    ttft_ms = step_ms + (queued_prefill_tokens(view) + own_tokens) * req.prefill_ms_per_token
    return ttft_ms, tpot_ms


def peer_itl_ms(views: Iterable[WorkerView], cfg: PlacementConfig) -> float:
    """The step an unmeasured candidate is predicted at: its fastest measured peer, at most the prior."""
    return min([cfg.idle_itl_ms] + [v.capacity.itl_ms for v in views if v.capacity.itl_ms > 0])


def queued_prefill_tokens(view: WorkerView) -> int:
    """The prompt tokens queued ahead on `view`, net of expected prefix-cache hits (module doc)."""
    listed = max(view.capacity.queued_prefill_tokens - view.listed_done_tokens, 0)
    return listed + view.unseen_prefill_tokens


def cached_prompt_tokens(
    prefix: PrefixMatch | None, worker_id: str, req: RequestShape, block_tokens: int
) -> int:
    """The request's prompt tokens `worker_id` is expected to hold: its leading blocks the prefix index says
    that worker last served, at most the prompt (0 without an index answer)."""
    if prefix is None:
        return 0
    return min(prefix.served(worker_id) * block_tokens, req.prompt_tokens)


def prefill_wait_ms(view: WorkerView, req: RequestShape) -> float:
    """The prefill queued ahead of `req` on `view` (module doc); the TTFT prediction is this plus the
    request's own uncached prompt and a step."""
    return queued_prefill_tokens(view) * req.prefill_ms_per_token


def shed_wait_ms(view: WorkerView, req: RequestShape, cached_tokens: int, best_cached_tokens: int) -> float:
    """What the `slo_wait` filter bounds (module doc): the queue ahead plus the prompt tokens of `req` that
    `view` would prefill and the best candidate (holding `best_cached_tokens`) would not."""
    extra = max(best_cached_tokens - cached_tokens, 0)
    return prefill_wait_ms(view, req) + extra * req.prefill_ms_per_token
