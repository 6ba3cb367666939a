"""prefix_affinity = the fraction of the request's leading prompt blocks this worker last served, in [0, 1].

A conversation's next turn extends the previous prompt, and only the worker that served it holds those
blocks in its prefix cache: sending the turn there skips their prefill. The fractions come from the
router's prefix index (controlplane/prefix_index.py) as a frozen `PrefixMatch`.

Balance guard: the filters run first, so affinity never brings back a worker without the headroom or past
the prefill-wait limit (`slo_wait`); and config.py refuses a weight above the sum of the headroom, SLO and
queue weights, so a worker whose load signals are worse by more than that weight loses whatever it holds.
A further guard that zeroed affinity on a worker predicted to miss the SLO (slack 0) was measured and
dropped: it sent turns away from the worker holding their prefix exactly when the fleet was busiest, and
the full prefill elsewhere cost more goodput than it saved (docs/benchmarks.md, the cluster simulation).
"""

from __future__ import annotations

from zipkv.controlplane.placement.scorers import ScoreInput
from zipkv.controlplane.prefix_index import PrefixMatch


def score(s: ScoreInput, prefix: PrefixMatch | None) -> float:
    if prefix is None or prefix.blocks <= 0:
        return 0.0
    return prefix.fraction(s.view.worker_id)
