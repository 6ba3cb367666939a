"""Shared router state in Redis, for several routers: reports with a TTL, atomic reservations.

Keys (one Redis, not a cluster: the report script also touches the worker set):
    {prefix}:workers         SET of worker ids
    {prefix}:w:{id}          HASH epoch, seq, recv, free (the reported headroom), data (the view as JSON);
                             PEXPIRE = expire_after_ms
    {prefix}:r:{id}          HASH request_id -> "tokens:started_s:expires_s:prefill:cached:placed_s"
                             (reservations; a router from before the last three wrote only the first three)
Each write is one Lua script, so ordering checks and the fit check + reservation are atomic: two routers
cannot both take the last headroom of a worker. The accounting rule is the one in state.py.

Redis is not on the per-token path: a request costs one reserve, one mark-started and one release.
When Redis is unreachable the router keeps serving from its last snapshot (views pinned, compared on
the coarse signal) plus the reports it receives itself, reserves locally, reports `degraded` in /readyz
and in metrics, and recovers by itself when a refresh succeeds (releases that failed are replayed).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeout

from zipkv.controlplane.config import RouterConfig
from zipkv.controlplane.redis_scripts import MARK_STARTED, PUT_REPORT, RESERVE, parse_reservations
from zipkv.controlplane.state import (
    MemoryStore,
    Snapshot,
    WorkerView,
    bare,
    view_from_json,
    view_to_json,
    with_reservations,
)

log = logging.getLogger("zipkv.controlplane.redis")
ERRORS = (RedisError, OSError, asyncio.TimeoutError)
TIMEOUTS_TO_DEGRADE = 3


class RedisStore:
    def __init__(self, cfg: RouterConfig, clock: Callable[[], float] = time.time) -> None:
        st, pl = cfg.state, cfg.placement
        assert st.redis_url, "validated by StateConfig"
        timeout_s = st.redis_timeout_ms / 1000.0
        self._redis = aioredis.Redis.from_url(
            st.redis_url,
            decode_responses=True,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry_on_timeout=False,
        )
        self._p = st.key_prefix
        self._expire_ms = pl.expire_after_ms
        self._res_ttl_s = pl.reservation_ttl_s
        self._refresh_s = st.refresh_ms / 1000.0
        self._clock = clock
        self._delay_s = pl.report_delay_bound_ms / 1000.0
        self._local = MemoryStore(pl.expire_after_ms, pl.reservation_ttl_s, clock, pl.report_delay_bound_ms)
        self._local_res: set[tuple[str, str]] = set()  # reservations made while degraded
        self._pending_release: list[tuple[str, str]] = []
        self._claims_in_redis: set[tuple[str, str]] = set()  # claims Redis holds (released there too)
        self._snap = Snapshot((), 0.0)
        self._degraded = False
        self._timeouts = 0
        self._stopping = False
        self._put = self._redis.register_script(PUT_REPORT)
        self._reserve = self._redis.register_script(RESERVE)
        self._started = self._redis.register_script(MARK_STARTED)

    def _w(self, wid: str) -> str:
        return f"{self._p}:w:{wid}"

    def _r(self, wid: str) -> str:
        return f"{self._p}:r:{wid}"

    @property
    def degraded(self) -> bool:
        return self._degraded

    def _failed(self, exc: BaseException) -> None:
        """A refused or reset connection means Redis is down: degrade at once. A timeout may be a busy
        moment: degrade after `TIMEOUTS_TO_DEGRADE` in a row (a success resets the count)."""
        if isinstance(exc, (RedisTimeout, asyncio.TimeoutError)):
            self._timeouts += 1
            if self._timeouts < TIMEOUTS_TO_DEGRADE:
                log.info("redis call timed out", extra={"in_a_row": self._timeouts})
                return
        self._degrade(exc)

    def _degrade(self, exc: BaseException) -> None:
        if not self._degraded:
            log.warning("redis unreachable; serving from the last snapshot", extra={"error": repr(exc)})
            # Keep the last shared view of every worker (pinned) so placement can still use it.
            for v in self._snap.workers:
                if v.worker_id not in self._local.views():
                    self._local.put_report_sync(dataclasses.replace(bare(v), pinned=True))
        self._degraded = True

    async def put_report(self, view: WorkerView) -> str | None:
        local = self._local.put_report_sync(view)
        if self._degraded or local is not None:
            return local  # a replay to this router is refused here, whatever Redis holds
        try:
            cur = await self._put_shared(view)
        except ERRORS as exc:
            self._failed(exc)
            return local
        if cur in ("", f"{view.epoch}:{view.sequence}"):
            return None  # applied, or the same report already applied through another router
        return f"out of order: ({view.epoch}, {view.sequence}) <= ({cur.replace(':', ', ')})"

    async def _put_shared(self, view: WorkerView) -> str:
        data = view_to_json(view)
        keys = [self._w(view.worker_id), f"{self._p}:workers"]
        args: list[str | int] = [view.epoch, view.sequence, repr(view.received_s)]
        args += [view.capacity.headroom_tokens, data, self._expire_ms, view.worker_id]
        return str(await self._put(keys=keys, args=args))

    def snapshot(self) -> Snapshot:
        if not self._degraded:
            return self._snap
        snap = self._local.snapshot()
        return dataclasses.replace(snap, degraded=True)

    async def refresh(self) -> None:
        now = self._clock()
        ids = sorted(str(i) for i in await self._redis.smembers(f"{self._p}:workers"))
        async with self._redis.pipeline(transaction=False) as pipe:
            for wid in ids:
                pipe.hget(self._w(wid), "data")
                pipe.hgetall(self._r(wid))
            rows = await pipe.execute() if ids else []
        missing = await self._repopulate(set(ids), now)
        views, gone = list(missing), []
        for i, wid in enumerate(ids):
            data, res = rows[2 * i], rows[2 * i + 1]
            if data is None:
                gone.append(wid)  # its report hash expired: the worker stopped reporting
                continue
            view = view_from_json(data)
            counted = with_reservations(view, parse_reservations(res), now, self._delay_s)
            views.append(dataclasses.replace(counted, pinned=False))
        if gone:
            await self._redis.srem(f"{self._p}:workers", *gone)
        self._snap = Snapshot(tuple(views), now)

    async def _repopulate(self, present: set[str], now: float) -> list[WorkerView]:
        """Write back the live reports this router received itself that Redis lacks: a Redis that came
        back empty (restarted without persistence) is refilled before any placement reads it, so the
        routers never see "no worker" while their workers are reporting. The report script keeps the
        newest, so a peer router's fresher copy wins."""
        back = []
        for view in self._local.views().values():
            if view.worker_id in present or view.pinned or now - view.received_s > self._expire_ms / 1000:
                continue
            await self._put_shared(view)
            back.append(bare(view))
        if back:
            log.warning(
                "redis lacked live workers; wrote back their last reports", extra={"workers": len(back)}
            )
        return back

    async def run(self) -> None:
        """Refresh the snapshot every refresh_ms; detect outages and recover from them."""
        while not self._stopping:
            try:
                await self.refresh()
                self._timeouts = 0
                await self._flush_releases()
                if self._degraded:
                    await self._recover()
            except ERRORS as exc:
                self._failed(exc)
            await asyncio.sleep(self._refresh_s)

    async def _recover(self) -> None:
        # Reports received while Redis was away go back into the shared state (the script keeps order).
        for view in self._local.views().values():
            if not view.pinned:
                await self._put_shared(view)
        self._degraded = False
        self._local = MemoryStore(self._expire_ms, self._res_ttl_s, self._clock, int(self._delay_s * 1000))
        log.info("redis reachable again; shared state restored")

    async def _flush_releases(self) -> None:
        for wid, rid in list(self._pending_release):
            await self._redis.hdel(self._r(wid), rid)
            self._pending_release.remove((wid, rid))

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
        if not self._degraded:
            args: list[str | int] = [
                request_id,
                tokens,
                repr(now_s),
                repr(now_s + self._res_ttl_s),
                int(self._res_ttl_s * 1000),
                repr(self._delay_s),
                "-" if prefill_tokens is None else prefill_tokens,
                cached_tokens,
                int(claim),
            ]
            try:
                ok = await self._reserve(keys=[self._w(worker_id), self._r(worker_id)], args=args) == 1
                if ok and claim:
                    self._claims_in_redis.add((worker_id, request_id))
                return bool(ok)
            except ERRORS as exc:
                self._failed(exc)
                if not self._degraded:
                    # It may have been applied before the timeout: undo it later, and do not use it.
                    self._pending_release.append((worker_id, request_id))
                    return False
        ok = await self._local.reserve(
            worker_id,
            request_id,
            tokens,
            now_s,
            prefill_tokens=prefill_tokens,
            cached_tokens=cached_tokens,
            claim=claim,
        )
        if ok:
            self._local_res.add((worker_id, request_id))
        return ok

    async def mark_started(self, worker_id: str, request_id: str, now_s: float) -> None:
        if (worker_id, request_id) in self._local_res:
            await self._local.mark_started(worker_id, request_id, now_s)
            return
        try:
            await self._started(keys=[self._r(worker_id)], args=[request_id, repr(now_s)])
        except ERRORS as exc:
            self._failed(exc)  # the reservation keeps counting until released: the safe side

    async def release(self, worker_id: str, request_id: str) -> None:
        claimed_in_redis = (worker_id, request_id) in self._claims_in_redis
        self._claims_in_redis.discard((worker_id, request_id))
        if (worker_id, request_id) in self._local_res:
            self._local_res.discard((worker_id, request_id))
            await self._local.release(worker_id, request_id)
            if claimed_in_redis:  # claimed in Redis before the outage: still there, undone on recovery
                self._pending_release.append((worker_id, request_id))
            return
        try:
            await self._redis.hdel(self._r(worker_id), request_id)
        except ERRORS as exc:
            self._pending_release.append((worker_id, request_id))  # replayed by the refresh loop
            self._failed(exc)

    def stop(self) -> None:
        self._stopping = True

    async def close(self) -> None:
        await self._redis.aclose()
