"""Placement: filters -> weighted scorers in [0, 1] -> a ranked pick. Pure functions of a snapshot.

The pipeline (`pipeline.place`), one small module per stage:
    filters.py            a worker is a candidate only if every filter keeps it (alive, model, draining,
                          context, budget, headroom, and the optional prefill-wait shed)
    predict.py            the documented TTFT / TPOT predictions the SLO scorer and the shed filter read,
                          both from one count of the prefill queued ahead, net of prefix-cache hits
    scorers/headroom.py   (headroom_tokens - need_tokens) / total_tokens
    scorers/slo.py        min(slack(ttft_ms, slo_ttft_ms), slack(tpot_ms, slo_tpot_ms))
    scorers/queue.py      1 / (1 + queued_requests)
    scorers/prefix_affinity.py   the fraction of the prompt's leading blocks the worker last served (the
                          router's prefix index, controlplane/prefix_index.py, passed in as a frozen
                          PrefixMatch; its weight only counts for a prompt with at least one full block)
    picker.py             the weights (SLO dropped when any report is stale), the weighted mean, the ranking
                          (best first, ties on worker_id, only the best top_k when given)
    shapes.py             RequestShape (what is placed), Candidate and Decision (the answer)

Staleness: when any candidate's report is older than stale_after_ms, its TTFT/ITL no longer describe
the worker, so *every* candidate is compared on the coarse signal (headroom and queue only; the SLO
weight is dropped) and the decision says `coarse=True` (counted in a metric).
Ties break on worker_id so the result is deterministic.
"""

from __future__ import annotations

from zipkv.controlplane.placement.filters import explain_filtered
from zipkv.controlplane.placement.pipeline import place
from zipkv.controlplane.placement.predict import GIB, predict_ms, prefill_wait_ms, queued_prefill_tokens
from zipkv.controlplane.placement.shapes import Candidate, Decision, RequestShape

__all__ = [
    "GIB",
    "Candidate",
    "Decision",
    "RequestShape",
    "explain_filtered",
    "place",
    "predict_ms",
    "prefill_wait_ms",
    "queued_prefill_tokens",
]
