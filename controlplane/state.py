"""What the router knows about workers: accepted capacity reports and its own reservations.

A `WorkerView` is one worker's last accepted report plus the router-side reservations that report
cannot have seen yet. A `Snapshot` is an immutable set of views; placement reads only snapshots.

Reservation accounting (shared by the in-memory and the Redis store):
a reservation of `tokens` on worker w is made before Generate is called and released when the request
ends. The worker's own reported headroom starts to include the request once the worker admitted it, so a
reservation counts against a report only while the report may predate the admission:
    counts  <=>  started_s == 0 (no token seen yet)  or  started_s >= report.received_s
`started_s` is the router's clock when the first token arrived. A report received after that was built
after the worker admitted the request (a report is not delayed past a token on the same host pair, up to
clock noise), so it already accounts for it. Double counting is conservative; never counting would
over-commit.

Prefill accounting (the prefill-wait and TTFT predictions, placement/predict.py) follows another rule:
a worker lists a request in its reported queued_prefill_tokens from the moment it has it until its first
token, at the whole prompt (it does not know its prefix-cache hits ahead of scheduling). Each reservation
carries the prompt tokens the router expects the worker to prefill (`prefill_tokens`: the prompt less the
`cached_tokens` the prefix index says that worker holds) and when it was placed (`placed_s`). A report
lists a reservation when it was built after the worker got the request (placed_s + delay <= received_s,
the rule above turned round) and before its first token (started_s == 0 or started_s > received_s):
    listed, not started        its cached_tokens come off the reported queue (no prefill for them)
    listed, started since      its whole prompt comes off the reported queue (its prefill is done)
    not listed, not started    the report cannot show it yet: its prefill_tokens are added
    not listed, started        nothing (done, and not in the report)
(`prefill_accounting`; what comes off is `listed_done_tokens`, what is added `unseen_prefill_tokens`).
A reservation of a router from before these fields (placed_s 0, prefill_tokens None) is never taken as
listed and adds all of `tokens` until its first token. The headroom rule above, used for the queue, had
counted every queued request twice (in the report and as a reservation), with its output and its cached
prefix as prefill, until its first token, and the shed filter dropped workers that were nearly idle
(docs/benchmarks.md, the cluster simulation). Timing noise (a first token emitted before the report was
built but received after it) can take a prompt off that the report did not list: one prompt, for one
report interval; the prediction is an estimate, never a reservation of memory.

Reports are accepted only in order: (epoch, sequence) must grow per worker_id; every field was range-checked
before (report_checks.py), including lateness and timestamps from the future.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, replace
from typing import Protocol

from zipkv.controlplane.reservations import (
    CLAIM_PLACED_S,
    Reservation,
    claimed_tokens,
    prefill_accounting,
    unseen_reserved,
)
from zipkv.protos import zipkv_pb2 as pb
from zipkv.protos.capacity import Capacity


@dataclass(frozen=True, slots=True)
class WorkerView:
    worker_id: str
    address: str
    model: str
    epoch: int
    sequence: int
    timestamp_s: float  # worker clock when the report was built
    received_s: float  # router clock (unix seconds) when it was accepted
    draining: bool
    capacity: Capacity  # what the worker reported: headroom, budget, load, latencies (protos/capacity.py)
    reserved_tokens: int = 0  # router reservations this report cannot have seen (see module doc)
    unseen_prefill_tokens: int = 0  # prompt tokens to prefill of reservations the report cannot list yet
    listed_done_tokens: int = 0  # of the reported queue, what needs no prefill (module doc: cached, done)
    claimed_tokens: int = 0  # of reserved_tokens, what claims hold (placement/headroom_wait.py)
    pinned: bool = False  # kept past expiry: the shared state is unreachable and this is the last known view

    @property
    def order(self) -> tuple[int, int]:
        return (self.epoch, self.sequence)

    @property
    def headroom_tokens(self) -> int:
        """The reported headroom less this router's reservations that the report cannot have seen: what
        placement may still put on the worker."""
        return self.capacity.headroom_tokens - self.reserved_tokens


def view_from_report(report: pb.CapacityReport, received_s: float) -> WorkerView:
    return WorkerView(
        worker_id=report.worker_id,
        address=report.address,
        model=report.model,
        epoch=report.epoch,
        sequence=report.sequence,
        timestamp_s=report.timestamp_s,
        received_s=received_s,
        draining=report.draining,
        capacity=Capacity.from_report(report),
    )


# Each router computes these from the reservations when it takes a snapshot; the shared copy of a report
# leaves them out (a router from before a field existed could not read it back).
ROUTER_SIDE = ("reserved_tokens", "unseen_prefill_tokens", "listed_done_tokens", "claimed_tokens")


def view_to_json(view: WorkerView) -> str:
    """A view as the shared state stores it: one flat JSON object, capacity fields by their wire names,
    without the router-side accounting (`ROUTER_SIDE`)."""
    skip = ("capacity", *ROUTER_SIDE)
    flat = {f.name: getattr(view, f.name) for f in dataclasses.fields(view) if f.name not in skip}
    return json.dumps({**flat, **view.capacity.report_fields()})


def view_from_json(data: str) -> WorkerView:
    flat = json.loads(data)
    if "free_tokens" in flat:  # written by a router from before the capacity field was named headroom
        flat["headroom_tokens"] = flat.pop("free_tokens")
    names = {f.name for f in dataclasses.fields(Capacity)}
    capacity = Capacity(**{k: flat.pop(k) for k in list(flat) if k in names})
    return WorkerView(**flat, capacity=capacity)


def out_of_order(prev: WorkerView | None, new: WorkerView) -> bool:
    return prev is not None and new.order <= prev.order


def bare(view: WorkerView) -> WorkerView:
    """`view` with no reservation counted on it (the report alone)."""
    return replace(view, reserved_tokens=0, unseen_prefill_tokens=0, listed_done_tokens=0, claimed_tokens=0)


def with_reservations(
    view: WorkerView, reservations: list[Reservation], now_s: float, delay_bound_s: float
) -> WorkerView:
    """`view` with this router's reservations on it counted as both rules say (module doc)."""
    unseen, listed_done = prefill_accounting(reservations, view.received_s, now_s, delay_bound_s)
    return replace(
        view,
        reserved_tokens=unseen_reserved(reservations, view.received_s, now_s, delay_bound_s),
        unseen_prefill_tokens=unseen,
        listed_done_tokens=listed_done,
        claimed_tokens=claimed_tokens(reservations, now_s),
    )


@dataclass(frozen=True, slots=True)
class Snapshot:
    workers: tuple[WorkerView, ...]
    taken_s: float
    degraded: bool = False


class Store(Protocol):
    """The router's state: the in-memory store (one router) or Redis (several routers)."""

    @property
    def degraded(self) -> bool: ...

    async def put_report(self, view: WorkerView) -> str | None:
        """Apply a report atomically; return why it was refused (None = accepted)."""

    def snapshot(self) -> Snapshot: ...

    async def reserve(
        self,
        worker_id: str,
        request_id: str,
        tokens: int,
        now_s: float,
        *,
        prefill_tokens: int | None = None,
        cached_tokens: int = 0,
        claim: bool = False,
    ) -> bool:
        """Atomically reserve if it still fits the worker's headroom less the other reservations; False
        when it does not. `prefill_tokens` / `cached_tokens`: of the prompt, what the worker is expected to
        prefill and to find in its prefix cache (prefill accounting, module doc; None: all of `tokens` is
        prefill). `claim`: take it although it does not fit (placement/headroom_wait.py; False only when
        the worker has no report), marked not yet placed; a later reserve under the same request id turns
        it into the reservation once it fits."""

    async def mark_started(self, worker_id: str, request_id: str, now_s: float) -> None: ...

    async def release(self, worker_id: str, request_id: str) -> None: ...


class MemoryStore:
    """State for one router process. All methods run on the event loop, so each is atomic."""

    def __init__(
        self,
        expire_after_ms: int,
        reservation_ttl_s: float,
        clock: object = None,
        report_delay_bound_ms: int = 200,
    ) -> None:
        import time

        self._delay_s = report_delay_bound_ms / 1000.0
        self._expire_s = expire_after_ms / 1000.0
        self._res_ttl_s = reservation_ttl_s
        self._clock = clock if callable(clock) else time.time
        self._views: dict[str, WorkerView] = {}
        self._res: dict[str, dict[str, Reservation]] = {}
        self._cache: Snapshot | None = None

    @property
    def degraded(self) -> bool:
        return False

    def now(self) -> float:
        return float(self._clock())

    async def put_report(self, view: WorkerView) -> str | None:
        return self.put_report_sync(view)

    def put_report_sync(self, view: WorkerView) -> str | None:
        prev = self._views.get(view.worker_id)
        if prev is not None and view.received_s - prev.received_s > self._expire_s:
            prev = None  # expired: a restarted worker may begin again
        if out_of_order(prev, view):
            assert prev is not None
            return f"out of order: ({view.epoch}, {view.sequence}) <= ({prev.epoch}, {prev.sequence})"
        self._views[view.worker_id] = view
        self._cache = None
        return None

    def views(self) -> dict[str, WorkerView]:
        return dict(self._views)

    def snapshot(self) -> Snapshot:
        now = self.now()
        if self._cache is not None and now - self._cache.taken_s < 0.001:
            return self._cache
        workers = []
        for wid, view in list(self._views.items()):
            if now - view.received_s > self._expire_s and not view.pinned:
                del self._views[wid]  # its reports stopped: forget it
                continue
            res = list(self._res.get(wid, {}).values())
            workers.append(with_reservations(view, res, now, self._delay_s))
        self._cache = Snapshot(workers=tuple(workers), taken_s=now)
        return self._cache

    async def reserve(
        self,
        worker_id: str,
        request_id: str,
        tokens: int,
        now_s: float,
        *,
        prefill_tokens: int | None = None,
        cached_tokens: int = 0,
        claim: bool = False,
    ) -> bool:
        view = self._views.get(worker_id)
        if view is None:
            return False
        table = self._res.setdefault(worker_id, {})
        for rid in [k for k, r in table.items() if r.expires_s <= now_s]:
            del table[rid]
        others = [r for rid, r in table.items() if rid != request_id]  # a claim of its own is not in its way
        used = unseen_reserved(others, view.received_s, now_s, self._delay_s)
        if not claim and view.capacity.headroom_tokens - used < tokens:
            return False
        table[request_id] = Reservation(
            tokens=tokens,
            started_s=0.0,
            expires_s=now_s + self._res_ttl_s,
            prefill_tokens=prefill_tokens,
            cached_tokens=cached_tokens,
            placed_s=CLAIM_PLACED_S if claim else now_s,  # a claim is not at the worker: no report lists it
        )
        self._cache = None
        return True

    async def mark_started(self, worker_id: str, request_id: str, now_s: float) -> None:
        table = self._res.get(worker_id, {})
        if request_id in table:
            table[request_id] = replace(table[request_id], started_s=now_s)
            self._cache = None

    async def release(self, worker_id: str, request_id: str) -> None:
        if self._res.get(worker_id, {}).pop(request_id, None) is not None:
            self._cache = None

    def reserved_total(self, worker_id: str) -> int:
        return sum(r.tokens for r in self._res.get(worker_id, {}).values())
