"""A request every worker lacks only headroom for: it waits at the router, claiming a worker's headroom,
until it is placed or has waited `placement.headroom_wait_ms` (the rules and why: placement/headroom_wait.py).

`decide_or_wait` runs the wait for `Dispatcher.start`: each round (the shared state's refresh interval) it
places the request again; while no worker takes it, it holds a claim on the worker placement/headroom_wait.py
picks, and turns the claim into the request's reservation, atomically, once that worker has the room. A
claim is always given back when the request leaves the wait any other way (placed elsewhere, refused, the
client gone), and expires with the reservations of a router that died.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Protocol

from zipkv.controlplane.config import RouterConfig
from zipkv.controlplane.metrics import RouterMetrics
from zipkv.controlplane.placement import Decision, RequestShape
from zipkv.controlplane.placement.headroom_wait import claim_state, claim_target, wait_for_headroom
from zipkv.controlplane.prefix_index import PrefixMatch
from zipkv.controlplane.state import Store, WorkerView

log = logging.getLogger("zipkv.controlplane.headroom_claim")


@dataclass(frozen=True, slots=True)
class Claimed:
    """A claim that became the request's reservation: open the request on `worker` as `request_id`."""

    worker: WorkerView
    request_id: str


class Placer(Protocol):
    """What the wait needs of the dispatcher."""

    cfg: RouterConfig
    store: Store
    metrics: RouterMetrics

    def clock(self) -> float: ...

    def decide(self, shape: RequestShape, prefix: PrefixMatch | None = None) -> Decision: ...


async def decide_or_wait(
    d: Placer, shape: RequestShape, match: PrefixMatch | None, claim_id: str
) -> tuple[Decision, Claimed | None]:
    """A decision with candidates; or a claim turned reservation (`Claimed`, the decision then empty); or
    the last decision without either, once waiting cannot help or has run its bound (the caller's 503).
    `claim_id`: the request id a claim, and the reservation it becomes, are taken under."""
    t0 = time.monotonic()
    cfg = d.cfg.placement
    claim: str | None = None  # the claimed worker's id
    rounds, ending = 0, "cancelled"  # how a claim ends when the wait is left by an exception
    try:
        while True:
            decision = d.decide(shape, match)
            waited_ms = (time.monotonic() - t0) * 1000.0
            claimed = None
            if claim is not None and not decision.ranked:
                claimed, lost = await _convert(d, shape, claim, claim_id)
                if lost:
                    await _give_back(d, claim, claim_id, "lost")
                    claim = None
            placed = bool(decision.ranked) or claimed is not None
            if placed or not wait_for_headroom(decision.filtered, waited_ms, cfg.headroom_wait_ms):
                if rounds:  # it waited: for how long, and whether a worker then took it
                    d.metrics.headroom_wait_ms.labels("placed" if placed else "refused").observe(waited_ms)
                ending = "placed" if claimed is not None else "moved" if placed else "refused"
                return decision, claimed
            if claim is None and cfg.claim_headroom:
                claim = await _take(d, shape, claim_id)
            rounds += 1
            await asyncio.sleep(d.cfg.state.refresh_ms / 1000.0)
    finally:
        if claim is not None:
            if ending == "placed":
                d.metrics.claims.labels("placed").inc()
            else:
                await _give_back(d, claim, claim_id, ending)


async def _take(d: Placer, shape: RequestShape, claim_id: str) -> str | None:
    """Claim the worker placement/headroom_wait.py picks (its id), or None when there is none to claim."""
    target = claim_target(d.store.snapshot(), shape, d.cfg.placement, d.clock())
    if target is None:
        return None
    return target.worker_id if await _reserve(d, shape, target.worker_id, claim_id, claim=True) else None


async def _convert(
    d: Placer, shape: RequestShape, worker_id: str, claim_id: str
) -> tuple[Claimed | None, bool]:
    """(the claim turned reservation, or None; whether the claimed worker is lost)."""
    snap = d.store.snapshot()
    state = claim_state(snap, worker_id, shape, d.cfg.placement, d.clock())
    if state != "fits":
        return None, state == "lost"
    if not await _reserve(d, shape, worker_id, claim_id, claim=False):
        return None, False
    view = next(v for v in snap.workers if v.worker_id == worker_id)
    return Claimed(view, claim_id), False


async def _reserve(d: Placer, shape: RequestShape, worker_id: str, claim_id: str, claim: bool) -> bool:
    """The claim (`claim`), or the reservation it turns into, of the request's whole need. The whole prompt
    counts as its prefill (the prefix index's cached share is not subtracted: the prediction errs long)."""
    return await d.store.reserve(
        worker_id, claim_id, shape.need_tokens, d.clock(), prefill_tokens=shape.prompt_tokens, claim=claim
    )


async def _give_back(d: Placer, worker_id: str, claim_id: str, ending: str) -> None:
    d.metrics.claims.labels(ending).inc()
    try:
        await d.store.release(worker_id, claim_id)
    except Exception:  # the store logs and replays failed releases itself; it must not mask the answer
        log.exception("claim release failed", extra={"worker": worker_id, "request": claim_id})
