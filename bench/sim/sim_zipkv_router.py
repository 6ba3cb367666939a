"""zipkv's placement in the cluster simulation: the router's own code, imported, on simulated reports.

Each worker reports every `report_interval_ms` what a zipkv worker reports (worker/engines/sglang/engine.py
`capacity()`: free tokens after the outputs still owed, total, compression ratio, running and queued
requests, queued prefill tokens as that engine counts them (the whole prompt of every request without its
first token: `SimWorker.reported_prefill_tokens`), the mean of its last 64 TTFTs and last ~256 inter-token
gaps). The router's `MemoryStore` (controlplane/state.py) holds the views and the reservations, `place`
(controlplane/placement/) ranks the workers, and the request goes to the first ranked worker whose
reservation succeeds, as `Dispatcher.start` does; none: 503 (shed), or, with placement.headroom_wait_ms
> 0 and only headroom keeping every worker out, placed again at each report until that bound
(sim_cluster.py). With placement.weight_prefix_affinity >
0 the router's `PrefixIndex` (controlplane/prefix_index.py) is kept as the dispatcher keeps it: looked up
before placement, the placement recorded after, and each reservation carries the candidate's expected
prefill and cached tokens (state.py, prefill accounting). The trace's block ids stand for the blocks'
tokens (equal ids are equal 512-token blocks), so the chain is hashed over the ids of the prompt's full
blocks instead of over token ids; the chain and the index are the router's. What the router decided is
counted for the rows (`stats`): requests shed, workers dropped by `slo_wait`, turns whose earlier turns a
worker holds (more than half the prompt's blocks) and how many went to it, and per placed request the wait
it estimated on the chosen worker (`prefill_wait_ms`), against which sim_cluster.py sets the simulated wait
(arrival to the start of its prefill). The store runs on the simulation's clock. Its methods are coroutines
that never await (one router, in memory); they are driven here to completion in place (`run_now`), since
the simulation has no event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from bench.serving.serving_metrics import Slo
from bench.serving.trace_workload import BLOCK_TOKENS, KV_BYTES_PER_TOKEN
from bench.sim.sim_worker import SimRequest, SimWorker
from zipkv.controlplane.config import PlacementConfig
from zipkv.controlplane.placement import RequestShape, place, prefill_wait_ms
from zipkv.controlplane.placement.headroom_wait import claim_state, claim_target, wait_for_headroom
from zipkv.controlplane.prefix_index import PrefixIndex, PrefixMatch, chain_hashes
from zipkv.controlplane.state import MemoryStore, WorkerView
from zipkv.protos.capacity import Capacity

EPOCH_S = 1.8e9  # the simulation's t = 0 on the router's (unix seconds) clock
MODEL = "llama-3.1-8b"
CONTEXT_TOKENS = 131072


def run_now(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never suspends (the in-memory store's) to its result."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("the store suspended: it cannot run inside the simulation")


def worker_view(w: SimWorker, sequence: int, now_s: float) -> WorkerView:
    ttfts = w.recent_ttft_ms
    return WorkerView(
        worker_id=f"w{w.wid:03d}",
        address=f"sim:{w.wid}",
        model=MODEL,
        epoch=1,
        sequence=sequence,
        timestamp_s=now_s,
        received_s=now_s,
        draining=False,
        capacity=Capacity(
            headroom_tokens=max(w.cache.free_tokens, 0),
            committed_tokens=w.remaining_decode_tokens(),
            total_tokens=w.cache.capacity_tokens,
            compression_ratio=w.spec.compression_ratio,
            running_requests=w.running,
            queued_requests=w.queued,
            queued_prefill_tokens=w.reported_prefill_tokens(),
            ttft_ms=sum(ttfts) / len(ttfts) if ttfts else 0.0,
            itl_ms=w.itl_ms() if w.running else 0.0,  # idle: no current step, as the workers report
            max_context_tokens=CONTEXT_TOKENS,
            kv_bytes_per_token=KV_BYTES_PER_TOKEN,
        ),
    )


def conversation_holder(match: PrefixMatch | None) -> str:
    """The worker holding more than half of the prompt's blocks (a conversation's earlier turns), or ""."""
    if match is None or not match.served_blocks:
        return ""
    wid, blocks = max(match.served_blocks, key=lambda kv: (kv[1], kv[0]))
    return wid if 2 * blocks > match.blocks else ""


class ZipkvRouter:
    name = "zipkv"

    def __init__(
        self,
        env: Any,
        workers: list[SimWorker],
        slo: Slo,
        prefill_ms_per_token: float,
        cfg: PlacementConfig | None = None,
        report_interval_ms: float = 200.0,
    ) -> None:
        self.env, self.workers, self.slo = env, workers, slo
        self.cfg = cfg or PlacementConfig()
        self.prefill_ms_per_token = prefill_ms_per_token
        self.store = MemoryStore(
            expire_after_ms=self.cfg.expire_after_ms,
            reservation_ttl_s=self.cfg.reservation_ttl_s,
            clock=self.clock,
            report_delay_bound_ms=self.cfg.report_delay_bound_ms,
        )
        self._interval_s = report_interval_ms / 1000.0
        self._sequence = 0
        self.placed: dict[int, str] = {}  # rid -> reservation id
        self.prefix: PrefixIndex | None = None
        self.stats = {
            "shed": 0, "shed_slo_wait": 0, "slo_wait_drops": 0, "held": 0, "to_holder": 0, "waited": 0,
            "claimed": 0, "claim_placed": 0,
        }  # fmt: skip
        self.last_filtered: dict[str, int] = {}  # the last decision's workers dropped per reason
        self.est_wait_ms: dict[int, float] = {}  # rid -> the wait estimated on the chosen worker
        if self.cfg.weight_prefix_affinity > 0:
            if self.cfg.prefix_block_tokens != BLOCK_TOKENS:
                raise ValueError(f"the trace's blocks are {BLOCK_TOKENS} tokens: set prefix_block_tokens so")
            self.prefix = PrefixIndex(self.cfg.prefix_index_blocks, self.cfg.prefix_block_tokens)
        self._report_all()
        env.process(self._reports())

    def clock(self) -> float:
        return EPOCH_S + float(self.env.now)

    def _report_all(self) -> None:
        self._sequence += 1
        now = self.clock()
        for w in self.workers:
            self.store.put_report_sync(worker_view(w, self._sequence, now))

    def _reports(self) -> Any:
        while True:
            yield self.env.timeout(self._interval_s)
            self._report_all()

    def shape(self, r: SimRequest) -> RequestShape:
        return RequestShape(
            model=MODEL,
            prompt_tokens=r.tr.input_tokens,
            max_new_tokens=r.tr.output_tokens,
            slo_ttft_ms=self.slo.ttft_s * 1000.0,
            slo_tpot_ms=self.slo.mean_itl_ms,
            prefill_ms_per_token=self.prefill_ms_per_token,
        )

    def block_hashes(self, r: SimRequest) -> tuple[int, ...]:
        """The router's chain over the prompt's full blocks, a block's trace id as its payload."""
        full = r.tr.input_tokens // BLOCK_TOKENS
        return chain_hashes((b.to_bytes(8, "little") for b in r.tr.block_ids[:full]), MODEL.encode())

    def choose(self, r: SimRequest, now_s: float) -> int | None:
        """A worker for `r` now, or None: shed. The policy interface; the simulation hands zipkv's router
        its requests through `arrive` instead, which may also hold one for headroom (sim_cluster.py)."""
        i = self.try_place(r)
        if i is None:
            self.count_shed()
        return i

    def arrive(self, r: SimRequest, submit: Callable[[SimRequest, int | None], None]) -> None:
        """Place `r` now (submit it to its worker), hold it for headroom, or shed it (submit None)."""
        i = self.try_place(r)
        if i is None and self.may_wait(0.0):
            self.env.process(self._held(r, submit))
            return
        if i is None:
            self.count_shed()
        submit(r, i)

    def _held(self, r: SimRequest, submit: Callable[[SimRequest, int | None], None]) -> Any:
        """A request held for headroom: placed again at each report, or shed at the bound. With
        placement.claim_headroom it claims a worker as `Dispatcher.start` does (headroom_claim.py): the
        claim is tried as its reservation at each report and given back if placed elsewhere or shed."""
        t0, rid = self.env.now, f"r{r.rid}"
        claim = self._claim(r)
        while True:
            yield self.env.timeout(self._interval_s)
            i = self.try_place(r, retry=True)
            if i is None and claim is not None:
                i, lost = self._convert(r, claim)
                if lost:
                    run_now(self.store.release(claim, rid))
                    claim = None
            if i is not None or not self.may_wait(self.env.now - t0):
                self.stats["waited"] += 1
                if claim is not None and self.placed.get(r.rid) != claim:
                    run_now(self.store.release(claim, rid))  # placed elsewhere, or shed
                if i is None:
                    self.count_shed()
                submit(r, i)
                return
            if claim is None:
                claim = self._claim(r)

    def _claim(self, r: SimRequest) -> str | None:
        """Claim the worker placement/headroom_wait.py picks for `r` (its id), if claims are on."""
        if not self.cfg.claim_headroom:
            return None
        shape = self.shape(r)
        target = claim_target(self.store.snapshot(), shape, self.cfg, self.clock())
        if target is None:
            return None
        wid, need, prefill = target.worker_id, shape.need_tokens, shape.prompt_tokens
        reserve = self.store.reserve(wid, f"r{r.rid}", need, self.clock(), prefill_tokens=prefill, claim=True)
        if not run_now(reserve):  # as the dispatcher's `_take`: no claim without the reservation
            return None
        self.stats["claimed"] += 1
        return wid

    def _convert(self, r: SimRequest, wid: str) -> tuple[int | None, bool]:
        """(the worker's index once the claim on `wid` became `r`'s reservation, or None; whether the
        claimed worker is lost), as headroom_claim.py's `_convert`."""
        shape = self.shape(r)
        snap = self.store.snapshot()
        state = claim_state(snap, wid, shape, self.cfg, self.clock())
        if state != "fits":
            return None, state == "lost"
        need, prefill = shape.need_tokens, shape.prompt_tokens
        reserve = self.store.reserve(wid, f"r{r.rid}", need, self.clock(), prefill_tokens=prefill)
        if not run_now(reserve):
            return None, False
        self.placed[r.rid] = wid
        self.stats["claim_placed"] += 1
        view = next(v for v in snap.workers if v.worker_id == wid)
        self.est_wait_ms[r.rid] = prefill_wait_ms(view, shape)
        return int(wid[1:]), False

    def may_wait(self, waited_s: float) -> bool:
        """Whether the request the last `try_place` could not place waits for headroom, as
        `Dispatcher._decide_or_wait` decides (placement.headroom_wait_ms)."""
        return wait_for_headroom(self.last_filtered, waited_s * 1000.0, self.cfg.headroom_wait_ms)

    def count_shed(self) -> None:
        self.stats["shed"] += 1
        self.stats["shed_slo_wait"] += "slo_wait" in self.last_filtered

    def try_place(self, r: SimRequest, retry: bool = False) -> int | None:
        """Place and reserve as `Dispatcher.start` does; None when no candidate's reservation succeeds.
        `retry`: a held request placed again (its decision counted once, at its first try)."""
        shape = self.shape(r)
        hashes = self.block_hashes(r) if self.prefix is not None else ()
        match = self.prefix.match(hashes) if self.prefix is not None else None
        decision = place(self.store.snapshot(), shape, self.cfg, self.clock(), top_k=9, prefix=match)
        self.last_filtered = dict(decision.filtered)
        holder = conversation_holder(match)
        if not retry:
            self._count(decision.filtered.get("slo_wait", 0), holder)
        rid = f"r{r.rid}"
        for cand in decision.ranked:
            wid = cand.worker.worker_id
            reserve = self.store.reserve(
                wid,
                rid,
                shape.need_tokens,
                self.clock(),
                prefill_tokens=cand.prefill_tokens(shape),
                cached_tokens=cand.cached_tokens,
            )
            if run_now(reserve):
                self.placed[r.rid] = wid
                if self.prefix is not None:
                    self.prefix.record(hashes, wid)
                self.stats["to_holder"] += wid == holder
                self.est_wait_ms[r.rid] = prefill_wait_ms(cand.worker, shape)
                return int(wid[1:])
        return None

    def _count(self, slo_wait_drops: int, holder: str) -> None:
        self.stats["slo_wait_drops"] += slo_wait_drops
        self.stats["held"] += bool(holder)

    def first_token(self, r: SimRequest) -> None:
        wid = self.placed.get(r.rid)
        if wid is not None:
            run_now(self.store.mark_started(wid, f"r{r.rid}", self.clock()))

    def done(self, r: SimRequest) -> None:
        wid = self.placed.pop(r.rid, None)
        if wid is not None:
            run_now(self.store.release(wid, f"r{r.rid}"))
