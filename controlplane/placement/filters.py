"""Filters: a worker is a candidate only if every filter keeps it; the first that drops it names why.

    alive     now - received_s <= expire_after_ms (or the view is pinned while the shared state is down)
    model     view.model == request.model (other models are not candidates at all: no reason counted)
    draining  not draining
    context   prompt_tokens + max_new_tokens fit the worker's max_context_tokens (context.py)
    budget    need_tokens <= total_tokens (else `too_large`: it would never fit, even on an idle worker)
    headroom  need_tokens = prompt_tokens + max_new_tokens <= view.headroom_tokens (the reported
              headroom less this router's reservations the report cannot have seen: state.py)
    wait      when placement.shed_wait_over_ttft = f > 0: shed_wait_ms <= f * slo_ttft_ms (else `slo_wait`),
              predict.py: the prefill queued ahead of the request net of expected prefix-cache hits (the
              report's queue less the cached prompt tokens of this router's requests it lists, plus the
              uncached prompts placed since; the TTFT prediction the SLO scorer reads starts from the
              same count), plus the prompt tokens of this request the worker would prefill beyond the
              best case, the most any worker kept by the filters above holds (prefix index). Without a
              prefix match it is the queue alone. Past the knee every worker's queue is longer than the
              target: a request placed anyway misses it and delays the ones behind it, so refusing it
              (503) keeps the goodput at the knee (bench/sim/cluster_sim.py measured it; off by default). A
              cold worker with a short queue is not preferred to the one holding the conversation whose
              queue is a little longer: moving the turn costs its cached prefix in prefill (the filter
              counted the queue alone, and dropped the holder first; docs/benchmarks.md). The best
              case is taken over every worker the filters above keep, the holder even when its own
              queue is past the bound: a turn whose holder is busy and whose cached prefix alone would
              take longer than the bound to prefill elsewhere is refused rather than recomputed (taking
              it over the workers within the bound only never refuses more than the queue alone does,
              and measured no gain: the recomputed prefixes cost the goodput; docs/benchmarks.md)
Filters run before any scorer, so no scorer (prefix affinity included) can bring back a worker they drop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from zipkv.controlplane.context import fits_context
from zipkv.controlplane.placement.predict import cached_prompt_tokens, shed_wait_ms
from zipkv.controlplane.placement.shapes import RequestShape
from zipkv.controlplane.placement_config import PlacementConfig
from zipkv.controlplane.prefix_index import PrefixMatch
from zipkv.controlplane.state import Snapshot, WorkerView


@dataclass(frozen=True, slots=True)
class FilterInput:
    req: RequestShape
    cfg: PlacementConfig
    now_s: float
    prefix: PrefixMatch | None = None  # the prefix index's answer (None: no affinity)
    best_cached_tokens: int = 0  # the most of the prompt any worker kept before `slo_wait` holds


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


def cached_here(v: WorkerView, f: FilterInput) -> int:
    return cached_prompt_tokens(f.prefix, v.worker_id, f.req, f.cfg.prefix_block_tokens)


def long_wait(v: WorkerView, f: FilterInput) -> bool:
    if f.cfg.shed_wait_over_ttft <= 0:
        return False
    wait_ms = shed_wait_ms(v, f.req, cached_here(v, f), f.best_cached_tokens)
    return wait_ms > f.cfg.shed_wait_over_ttft * f.req.slo_ttft_ms


# In order; the reason None: not a candidate, and not counted as a rejection. The wait filter runs last,
# over the workers every one of these kept (its best case is theirs).
FILTERS: tuple[tuple[str | None, Filter], ...] = (
    ("expired", expired),
    (None, other_model),
    ("draining", draining),
    ("context", over_context),
    ("too_large", over_budget),
    ("headroom", no_headroom),
)
WAIT_FILTER: tuple[str, Filter] = ("slo_wait", long_wait)
# Each reason as a client reads it in a 503's message ("1 worker without KV headroom for it").
REASON_WORDS: dict[str, str] = {
    "expired": "whose reports stopped",
    "draining": "draining",
    "context": "with a shorter context",
    "too_large": "with a smaller KV budget",
    "headroom": "without KV headroom for it",
    "slo_wait": "that would start it past its TTFT SLO",
}


def explain_filtered(filtered: Mapping[str, int]) -> str:
    """The workers each filter dropped, in words."""
    return ", ".join(
        f"{n} worker{'s' if n != 1 else ''} {REASON_WORDS.get(r, r)}" for r, n in sorted(filtered.items())
    )


def drop_reason(
    v: WorkerView, f: FilterInput, filters: tuple[tuple[str | None, Filter], ...] = FILTERS
) -> tuple[bool, str | None]:
    """(dropped, reason) from the first filter that drops `v`; (False, None) when every filter keeps it."""
    for reason, drops in filters:
        if drops(v, f):
            return True, reason
    return False, None


def apply_filters(
    snap: Snapshot,
    req: RequestShape,
    cfg: PlacementConfig,
    now_s: float,
    prefix: PrefixMatch | None = None,
) -> tuple[list[WorkerView], dict[str, int]]:
    """The candidates, in snapshot order, and the count of workers dropped per reason. `prefix`: the
    prefix index's answer when affinity is on (the wait filter's best case), else None."""
    f = FilterInput(req, cfg, now_s, prefix)
    passed: list[WorkerView] = []
    dropped: dict[str, int] = {}
    for v in snap.workers:
        out, reason = drop_reason(v, f)
        if not out:
            passed.append(v)
        elif reason is not None:
            dropped[reason] = dropped.get(reason, 0) + 1
    best = max((cached_here(v, f) for v in passed), default=0)
    f = FilterInput(req, cfg, now_s, prefix, best)
    kept = [v for v in passed if not WAIT_FILTER[1](v, f)]
    if len(kept) < len(passed):
        dropped[WAIT_FILTER[0]] = len(passed) - len(kept)
    return kept, dropped
