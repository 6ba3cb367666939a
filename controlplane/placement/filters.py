"""Filters: a worker is a candidate only if every filter keeps it; the first that drops it names why.

    alive     now - received_s <= expire_after_ms (or the view is pinned while the shared state is down)
    model     view.model == request.model (other models are not candidates at all: no reason counted)
    draining  not draining
    context   prompt_tokens + max_new_tokens fit the worker's max_context_tokens (context.py)
    budget    need_tokens <= total_tokens (else `too_large`: it would never fit, even on an idle worker)
    headroom  need_tokens = prompt_tokens + max_new_tokens <= view.headroom_tokens (the reported
              headroom less this router's reservations the report cannot have seen: state.py)
    wait      when placement.shed_wait_over_ttft = f > 0: wait_ms <= f * slo_ttft_ms (else `slo_wait`),
              wait_ms = queued_prefill * prefill_ms_per_token, the prefill queued ahead of the request
              net of expected prefix-cache hits (predict.py: the report's queue less the cached prompt
              tokens of this router's requests it lists, plus the uncached prompts placed since; the
              TTFT prediction the SLO scorer reads starts from the same count). Past the knee every
              worker's queue is longer than the target: a request placed anyway misses it and delays the
              ones behind it, so refusing it (503) keeps the goodput at the knee (bench/cluster_sim.py
              measured it; off by default)
Filters run before any scorer, so no scorer (prefix affinity included) can bring back a worker they drop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from zipkv.controlplane.config import PlacementConfig
from zipkv.controlplane.context import fits_context
from zipkv.controlplane.placement.predict import prefill_wait_ms
from zipkv.controlplane.placement.shapes import RequestShape
from zipkv.controlplane.state import Snapshot, WorkerView


@dataclass(frozen=True, slots=True)
class FilterInput:
    req: RequestShape
    cfg: PlacementConfig
    now_s: float


# True: the filter drops the worker.
Filter = Callable[[WorkerView, FilterInput], bool]


def expired(v: WorkerView, f: FilterInput) -> bool:
    return f.now_s - v.received_s > f.cfg.expire_after_ms / 1000.0 and not v.pinned


def other_model(v: WorkerView, f: FilterInput) -> bool:
    return v.model != f.req.model


def draining(v: WorkerView, f: FilterInput) -> bool:
    return v.draining


def over_context(v: WorkerView, f: FilterInput) -> bool:
    return not fits_context(f.req.need_tokens, v.capacity.max_context_tokens)


def over_budget(v: WorkerView, f: FilterInput) -> bool:
    return f.req.need_tokens > v.capacity.total_tokens  # waiting cannot help


def no_headroom(v: WorkerView, f: FilterInput) -> bool:
    return v.headroom_tokens < f.req.need_tokens


def long_wait(v: WorkerView, f: FilterInput) -> bool:
    if f.cfg.shed_wait_over_ttft <= 0:
        return False
    return prefill_wait_ms(v, f.req) > f.cfg.shed_wait_over_ttft * f.req.slo_ttft_ms


# In order; the reason None: not a candidate, and not counted as a rejection.
FILTERS: tuple[tuple[str | None, Filter], ...] = (
    ("expired", expired),
    (None, other_model),
    ("draining", draining),
    ("context", over_context),
    ("too_large", over_budget),
    ("headroom", no_headroom),
    ("slo_wait", long_wait),
)


def drop_reason(v: WorkerView, f: FilterInput) -> tuple[bool, str | None]:
    """(dropped, reason) from the first filter that drops `v`; (False, None) when every filter keeps it."""
    for reason, drops in FILTERS:
        if drops(v, f):
            return True, reason
    return False, None


def apply_filters(
    snap: Snapshot, req: RequestShape, cfg: PlacementConfig, now_s: float
) -> tuple[list[WorkerView], dict[str, int]]:
    """The candidates, in snapshot order, and the count of workers dropped per reason."""
    f = FilterInput(req, cfg, now_s)
    kept: list[WorkerView] = []
    dropped: dict[str, int] = {}
    for v in snap.workers:
        out, reason = drop_reason(v, f)
        if not out:
            kept.append(v)
        elif reason is not None:
            dropped[reason] = dropped.get(reason, 0) + 1
    return kept, dropped
