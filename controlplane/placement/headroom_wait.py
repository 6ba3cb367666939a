"""Whether a request no worker can take now waits at the router for headroom, or is refused (503).

A worker's own scheduler queues what does not fit yet (SGLang admits it when running requests finish), and
a client of an OpenAI endpoint expects the same: a busy server answers later, not "retry later". So when
the only thing keeping every worker out is headroom, which frees up as running requests finish, the
request is placed again as reports arrive, until it has waited `placement.headroom_wait_ms`. Any other
reason (no worker of the model, draining, too large, the SLO wait filter's deliberate shed, an expired
report) is answered at once: waiting would not change it, or placement chose to refuse.
Measured: on the trace sweep the router refused 6 of 32 requests at 1 req/s for headroom while the worker
was about to free it (docs/benchmarks.md, "Serving under SLO").
"""

from __future__ import annotations

from collections.abc import Mapping

WAITABLE_REASONS = frozenset({"headroom"})


def wait_for_headroom(filtered: Mapping[str, int], waited_ms: float, limit_ms: float) -> bool:
    """True: place again shortly. `filtered`: workers dropped per filter reason (a Decision's `filtered`);
    `waited_ms`: how long this request has waited so far; `limit_ms`: placement.headroom_wait_ms."""
    if not filtered or waited_ms >= limit_ms:
        return False
    return set(filtered) <= WAITABLE_REASONS
