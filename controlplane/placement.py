"""Placement: filters -> weighted scorers in [0, 1] -> a ranked pick. Pure functions of a snapshot.

Filters (a worker is a candidate only if all hold):
    alive     now - received_s <= expire_after_ms (or the view is pinned while the shared state is down)
    model     view.model == request.model, and not draining
    context   prompt_tokens + max_new_tokens fit the worker's max_context_tokens (context.py)
    budget    need_tokens <= total_tokens (else `too_large`: it would never fit, even on an idle worker)
    fits      need_tokens = prompt_tokens + max_new_tokens <= view.headroom_tokens (the reported
              headroom less this router's reservations the report cannot have seen: state.py)
    wait      when placement.shed_wait_over_ttft = f > 0: wait_ms <= f * slo_ttft_ms (else `slo_wait`),
              wait_ms = (queued_prefill_tokens + reserved_tokens) * prefill_ms_per_token, the prefill
              queued ahead of the request. Past the knee every worker's queue is longer than the target:
              a request placed anyway misses it and delays the ones behind it, so refusing it (503) keeps
              the goodput at the knee (bench/cluster_sim.py measured it; off by default)

Predictions (documented formulas of the reported state; units in the names):
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
    ttft_ms      = step_ms + (queued_prefill_tokens + reserved_tokens + prompt_tokens) * prefill_ms_per_token
                   reserved_tokens: what this router placed there that the report cannot have seen yet;
                   those prompts are still to prefill (their outputs are counted too: the safe side).
                   Without it a burst of arrivals within one report interval all saw the same queue
                   and piled long prompts on one worker (bench/cluster_sim.py measured both)

Scorers, each in [0, 1]:
    headroom  (view.headroom_tokens - need_tokens) / total_tokens
    slo       min(slack(ttft_ms, slo_ttft_ms), slack(tpot_ms, slo_tpot_ms)),  slack(p, s) = clamp((s - p) / s)
    queue     1 / (1 + queued_requests)
    score     sum(weight_i * scorer_i) / sum(weight_i)

Staleness: when any candidate's report is older than stale_after_ms, its TTFT/ITL no longer describe
the worker, so *every* candidate is compared on the coarse signal (headroom and queue only; the SLO
weight is dropped) and the decision says `coarse=True` (counted in a metric).
Ties break on worker_id so the result is deterministic.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from zipkv.controlplane.config import PlacementConfig
from zipkv.controlplane.context import fits_context
from zipkv.controlplane.state import Snapshot, WorkerView

GIB = float(1 << 30)


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


@dataclass(frozen=True, slots=True)
class Decision:
    ranked: tuple[Candidate, ...]  # best first
    coarse: bool  # some candidate's report was stale: compared on headroom and queue only
    filtered: dict[str, int] = field(default_factory=dict)  # reason -> workers dropped

    @property
    def best(self) -> Candidate | None:
        return self.ranked[0] if self.ranked else None


def _clamp(x: float) -> float:
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else x


def predict_ms(
    view: WorkerView, req: RequestShape, cfg: PlacementConfig, unmeasured_itl_ms: float | None = None
) -> tuple[float, float]:
    """(ttft_ms, tpot_ms) predicted for `req` on `view` (formulas in the module doc); a worker without
    an ITL measurement steps at `unmeasured_itl_ms` (default: placement.idle_itl_ms)."""
    cap = view.capacity
    ratio = cap.compression_ratio if cap.compression_ratio > 0 else 1.0
    stored_bpt = cap.kv_bytes_per_token * ratio
    step_ms = cap.itl_ms if cap.itl_ms > 0 else (unmeasured_itl_ms or cfg.idle_itl_ms)
    added_bytes = (req.prompt_tokens + req.max_new_tokens / 2) * stored_bpt
    tpot_ms = step_ms + added_bytes * cfg.decode_ms_per_gib / GIB
    pending_tokens = cap.queued_prefill_tokens + view.reserved_tokens + req.prompt_tokens
    ttft_ms = step_ms + pending_tokens * req.prefill_ms_per_token
    return ttft_ms, tpot_ms


def prefill_wait_ms(view: WorkerView, req: RequestShape) -> float:
    """The prefill queued ahead of `req` on `view`: reported queue plus unseen reservations (module doc)."""
    return (view.capacity.queued_prefill_tokens + view.reserved_tokens) * req.prefill_ms_per_token


def _filter(
    snap: Snapshot, req: RequestShape, cfg: PlacementConfig, now_s: float
) -> tuple[list[WorkerView], dict[str, int]]:
    expire_s = cfg.expire_after_ms / 1000.0
    need = req.need_tokens
    max_wait_ms = cfg.shed_wait_over_ttft * req.slo_ttft_ms if cfg.shed_wait_over_ttft > 0 else None
    kept: list[WorkerView] = []
    dropped: dict[str, int] = {}
    for v in snap.workers:
        if now_s - v.received_s > expire_s and not v.pinned:
            reason = "expired"
        elif v.model != req.model:
            continue  # other models are not candidates at all; not a rejection
        elif v.draining:
            reason = "draining"
        elif not fits_context(need, v.capacity.max_context_tokens):
            reason = "context"
        elif need > v.capacity.total_tokens:
            reason = "too_large"  # more than the worker's whole KV budget: waiting cannot help
        elif v.headroom_tokens < need:
            reason = "headroom"
        elif max_wait_ms is not None and prefill_wait_ms(v, req) > max_wait_ms:
            reason = "slo_wait"
        else:
            kept.append(v)
            continue
        dropped[reason] = dropped.get(reason, 0) + 1
    return kept, dropped


def place(
    snap: Snapshot, req: RequestShape, cfg: PlacementConfig, now_s: float, top_k: int | None = None
) -> Decision:
    """Rank the workers that can take `req` (best first; only the best `top_k` when given); empty when
    none can (the caller answers 503)."""
    kept, dropped = _filter(snap, req, cfg, now_s)
    stale_s = cfg.stale_after_ms / 1000.0
    coarse = any(now_s - v.received_s > stale_s for v in kept)
    w_head, w_queue = cfg.weight_headroom, cfg.weight_queue
    w_slo = 0.0 if coarse else cfg.weight_slo
    w_sum = w_head + w_slo + w_queue
    if w_sum <= 0:  # only the SLO scorer was weighted and it is off: fall back to headroom
        w_head, w_sum = 1.0, 1.0
    need = req.need_tokens
    slo_ttft, slo_tpot = req.slo_ttft_ms, req.slo_tpot_ms
    peer_itl_ms = min([cfg.idle_itl_ms] + [v.capacity.itl_ms for v in kept if v.capacity.itl_ms > 0])
    rows = []
    for v in kept:
        total = v.capacity.total_tokens
        headroom = _clamp((v.headroom_tokens - need) / total) if total else 0.0
        ttft_ms, tpot_ms = predict_ms(v, req, cfg, peer_itl_ms)
        slo = min(_clamp((slo_ttft - ttft_ms) / slo_ttft), _clamp((slo_tpot - tpot_ms) / slo_tpot))
        # reports are range-checked; this never divides by 0
        queue = 1.0 / (1.0 + max(v.capacity.queued_requests, 0))
        score = (w_head * headroom + w_slo * slo + w_queue * queue) / w_sum
        rows.append((-score, v.worker_id, v, headroom, slo, queue, ttft_ms, tpot_ms))
    rows = heapq.nsmallest(top_k, rows) if top_k is not None and top_k < len(rows) else sorted(rows)
    ranked = tuple(Candidate(r[2], -r[0], r[3], r[4], r[5], r[6], r[7]) for r in rows)
    return Decision(ranked=ranked, coarse=coarse, filtered=dropped)
