"""Whether a request no worker can take now waits at the router for headroom, or is refused (503); and
which worker a waiting request claims.

A worker's own scheduler queues what does not fit yet (SGLang admits it when running requests finish), and
a client of an OpenAI endpoint expects the same: a busy server answers later, not "retry later". So when
some worker lacks only headroom, which frees up as running requests finish, the request is placed again
as reports arrive, until it has waited `placement.headroom_wait_ms`. When no worker lacks only headroom
(no worker of the model; every one draining, too small, or its reports stopped) it is answered at once:
waiting would not change it. So is a request the SLO wait filter sheds: placement chose to refuse it.
Workers kept out for other reasons do not stop the wait for one that lacks headroom: before claims, one
draining worker (a rolling restart) or one whose reports stopped sent every request that found the others
full a 503 at once.
Measured: on the trace sweep the router refused 6 of 32 requests at 1 req/s for headroom while the worker
was about to free it (docs/benchmarks.md, "Serving under SLO").

**Claims** (`placement.claim_headroom`). Waiting alone starves a long prompt: the room running requests
free goes to the short requests arriving behind it, which fit first, so the long one waits out its bound
and is refused (the two-replica run refused the trace's 87k-token prompt this way while the gateway, whose
workers queue in order, served it). A waiting request therefore claims one worker: a reservation of its
tokens taken although they do not fit yet (`Store.reserve(..., claim=True)`). It counts against that
worker's headroom like any reservation, in every router through the shared state, so nothing placed later
takes the room it waits for; the worker's other requests finish and free it. Once the room is there the
claim becomes the request's reservation, atomically (a reserve under the same request id fits when the
headroom less every other reservation holds it). The claimed worker is the one short of the fewest
tokens that no claim holds yet (`claim_target`: one claim a worker); one whose reports stop or that a
filter other than headroom drops is given up (`claim_state`) and the request is placed again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from zipkv.controlplane.placement.filters import FILTERS, FilterInput, drop_reason
from zipkv.controlplane.placement.shapes import RequestShape
from zipkv.controlplane.placement_config import PlacementConfig
from zipkv.controlplane.state import Snapshot, WorkerView

WAITABLE_REASONS = frozenset({"headroom"})
SHED_REASON = "slo_wait"  # placement/filters.py's deliberate shed: never waited out
# Every filter but headroom: what a claimed worker must still pass (`claim_state`).
CLAIM_FILTERS = tuple((reason, f) for reason, f in FILTERS if reason != "headroom")

ClaimState = Literal["fits", "waits", "lost"]


def wait_for_headroom(filtered: Mapping[str, int], waited_ms: float, limit_ms: float) -> bool:
    """True: place again shortly. `filtered`: workers dropped per filter reason (a Decision's `filtered`);
    `waited_ms`: how long this request has waited so far; `limit_ms`: placement.headroom_wait_ms."""
    if waited_ms >= limit_ms or SHED_REASON in filtered:
        return False
    return bool(set(filtered) & WAITABLE_REASONS)


def claim_target(snap: Snapshot, req: RequestShape, cfg: PlacementConfig, now_s: float) -> WorkerView | None:
    """The worker a waiting request claims: of those only headroom keeps out and no claim holds yet, the
    one short of the fewest tokens (ties on worker_id); None when there is none (the request then only
    waits). One claim a worker: claims stacked on one worker would each wait for the room of all of them,
    which may never come (the cluster simulation shed more with them: docs/benchmarks.md)."""
    f = FilterInput(req, cfg, now_s)
    short = [v for v in snap.workers if v.claimed_tokens == 0 and drop_reason(v, f) == (True, "headroom")]
    return min(short, key=lambda v: (req.need_tokens - v.headroom_tokens, v.worker_id), default=None)


def claim_state(
    snap: Snapshot, worker_id: str, req: RequestShape, cfg: PlacementConfig, now_s: float
) -> ClaimState:
    """Where a claim on `worker_id` stands in `snap`: "lost" when the worker is gone from the snapshot or a
    filter other than headroom drops it; "fits" when its headroom, the claim counted in it, is not
    negative (worth the atomic reserve that turns the claim into the reservation); else "waits". A
    snapshot taken before the claim reached the shared state can say "fits" early: the reserve decides."""
    view = next((v for v in snap.workers if v.worker_id == worker_id), None)
    if view is None or drop_reason(view, FilterInput(req, cfg, now_s), CLAIM_FILTERS)[0]:
        return "lost"
    return "fits" if view.headroom_tokens >= 0 else "waits"
