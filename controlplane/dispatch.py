"""Dispatch: place, reserve, call Worker.Generate, relay the stream, retry once, always release.

`Dispatcher.start` returns only once the chosen worker sent its first event, so a worker that refuses
(RESOURCE_EXHAUSTED, UNAVAILABLE) or cannot be reached before any token was sent is retried on the
next-best candidate, and the HTTP layer can still answer 503 when nobody takes the request.
After the first token a failure ends the worker's stream with a `Failed` event; reopen.py then opens the
request on another worker (`start(avoid=...)`), from scratch or from the tokens already sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import grpc
from opentelemetry import trace

from zipkv.controlplane import grpc_keepalive as keepalive
from zipkv.controlplane.config import RouterConfig
from zipkv.controlplane.dispatch_request import Opening, Sampling, UnreachableWorkers
from zipkv.controlplane.grpc_auth import bearer_metadata, open_channel
from zipkv.controlplane.headroom_claim import decide_or_wait
from zipkv.controlplane.metrics import RouterMetrics
from zipkv.controlplane.placement import Candidate, Decision, RequestShape, explain_filtered, place
from zipkv.controlplane.prefix_index import PrefixIndex, PrefixMatch
from zipkv.controlplane.state import Store, WorkerView
from zipkv.controlplane.telemetry import trace_metadata
from zipkv.controlplane.worker_rpc import (
    CALLER_ERRORS,
    RETRYABLE,
    DispatchError,
    connect,
    final_error,
    unreachable,
)
from zipkv.controlplane.worker_stream import Stream
from zipkv.protos import zipkv_pb2 as pb
from zipkv.protos import zipkv_pb2_grpc as pb_grpc

log = logging.getLogger("zipkv.controlplane.dispatch")


class Dispatcher:
    def __init__(
        self,
        cfg: RouterConfig,
        store: Store,
        metrics: RouterMetrics,
        tracer: trace.Tracer,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg, self.store, self.metrics, self.tracer, self.clock = cfg, store, metrics, tracer, clock
        self._stubs: dict[str, tuple[grpc.aio.Channel, pb_grpc.WorkerStub]] = {}
        self._tasks: set[asyncio.Future[None]] = set()
        # Candidates kept per decision: the retries plus room for reservations lost to other routers.
        self._top_k = cfg.dispatch.retries + 8
        self.unreachable = UnreachableWorkers(cfg.dispatch.unreachable_cooldown_s)
        sec = cfg.security
        self._tls = sec.tls.files(sec.tls.worker_server_name) if sec.tls else None
        self._auth = bearer_metadata(sec.dispatch_token)
        self._keepalive = keepalive.client_options(cfg.dispatch.keepalive_s, cfg.dispatch.keepalive_timeout_s)
        # Where each prompt block went (prefix affinity); router-local, bounded (prefix_index.py).
        pl = cfg.placement
        self.prefix: PrefixIndex | None = (
            PrefixIndex(pl.prefix_index_blocks, pl.prefix_block_tokens)
            if pl.weight_prefix_affinity > 0
            else None
        )

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)  # keep a reference until done
        task.add_done_callback(self._tasks.discard)

    def _stub(self, address: str) -> tuple[grpc.aio.Channel, pb_grpc.WorkerStub]:
        if address not in self._stubs:
            channel = open_channel(address, self._tls, self._keepalive)
            self._stubs[address] = (channel, pb_grpc.WorkerStub(channel))
        return self._stubs[address]

    async def close(self) -> None:
        for channel, _ in self._stubs.values():
            await channel.close(None)
        self._stubs.clear()

    def decide(self, shape: RequestShape, prefix: PrefixMatch | None = None) -> Decision:
        with self.tracer.start_as_current_span("zipkv.placement") as span:
            t0 = time.perf_counter()
            decision = place(
                self.store.snapshot(),
                shape,
                self.cfg.placement,
                self.clock(),
                top_k=self._top_k,
                prefix=prefix,
            )
            self.metrics.placement_ms.observe((time.perf_counter() - t0) * 1000.0)
            span.set_attribute("zipkv.placement.candidates", len(decision.ranked))
            span.set_attribute("zipkv.placement.coarse", decision.coarse)
            if decision.best is not None:
                span.set_attribute("zipkv.worker.id", decision.best.worker.worker_id)
                span.set_attribute("zipkv.placement.prefix_affinity", decision.best.affinity)
        if decision.coarse:
            self.metrics.stale_reports.inc()
        return decision

    def _too_large(self, shape: RequestShape) -> DispatchError:
        largest = max(
            (v.capacity.total_tokens for v in self.store.snapshot().workers if v.model == shape.model),
            default=0,
        )
        return DispatchError(
            400,
            "too_large",
            f"this request needs {shape.need_tokens} KV tokens (prompt {shape.prompt_tokens} + max_tokens "
            f"{shape.max_new_tokens}), more than the whole KV budget of any worker of model "
            f"{shape.model!r} (largest: {largest}); lower max_tokens or shorten the prompt",
        )

    def _nobody(self, decision: Decision, shape: RequestShape) -> DispatchError:
        """Why no worker was ranked: 400 when every worker is too small for it, else 503."""
        if set(decision.filtered) == {"too_large"}:
            return self._too_large(shape)
        why = explain_filtered(decision.filtered) or "no worker serves it"
        return DispatchError(
            503,
            "no_worker",
            f"no worker can take this request now ({why}); retry later",
            retry_after_s=self.cfg.limits.retry_after_s,
        )

    def stream_failed(self) -> None:
        self.metrics.stream_errors.inc()

    def first_token(self, worker_id: str, request_id: str) -> None:
        """A request's first token arrived: from now on its worker's reports count it (state.py). Off the
        token path: the token goes out without waiting for the store."""
        self.spawn(self.store.mark_started(worker_id, request_id, self.clock()))

    def _prefix_match(
        self, shape: RequestShape, prompt_ids: list[int]
    ) -> tuple[tuple[int, ...], PrefixMatch | None]:
        """The prompt's block hashes and who last served them (none without the prefix index)."""
        if self.prefix is None:
            return (), None
        hashes = self.prefix.hashes(prompt_ids, shape.model)
        return hashes, self.prefix.match(hashes)

    def _in_order(self, decision: Decision, avoid: frozenset[str]) -> list[Candidate]:
        """The ranked candidates to try: those in `avoid` dropped, those lately unreachable moved last."""
        now = self.clock()
        ranked = [c for c in decision.ranked if c.worker.worker_id not in avoid]
        return sorted(ranked, key=lambda c: self.unreachable.cooling(c.worker.worker_id, now))  # stable

    async def start(
        self,
        shape: RequestShape,
        prompt_ids: list[int],
        sampling: Sampling,
        avoid: frozenset[str] = frozenset(),
    ) -> Stream:
        """The request opened on a worker (its first event in hand). `avoid`: workers not to try (one that
        already failed this request mid-generation)."""
        hashes, match = self._prefix_match(shape, prompt_ids)
        base_id = uuid.uuid4().hex
        decision, claimed = await decide_or_wait(self, shape, match, f"{base_id}-claim")
        if not decision.ranked and claimed is None:
            raise self._nobody(decision, shape)
        opening = Opening(shape.model, prompt_ids, sampling.wire(shape.max_new_tokens), hashes)
        attempts = 0
        if claimed is not None:  # the claim is the request's reservation now (headroom_claim.py)
            self.metrics.placements.labels(claimed.worker.worker_id, "claim").inc()
            stream = await self._open_reserved(claimed.worker, claimed.request_id, opening, attempts)
            if stream is not None:
                return stream
            attempts += 1
        for cand in self._in_order(decision, avoid):
            if attempts > self.cfg.dispatch.retries:
                break
            w = cand.worker
            rid = f"{base_id}-{attempts}"
            reserved = await self.store.reserve(
                w.worker_id,
                rid,
                shape.need_tokens,
                self.clock(),
                prefill_tokens=cand.prefill_tokens(shape),
                cached_tokens=cand.cached_tokens,
            )
            if not reserved:
                self.metrics.retries.labels("reservation_conflict").inc()
                continue  # another router took the headroom first; not an attempt on the worker
            self.metrics.placements.labels(w.worker_id, "coarse" if decision.coarse else "fine").inc()
            stream = await self._open_reserved(w, rid, opening, attempts)
            if stream is not None:
                return stream
            attempts += 1
        raise DispatchError(
            503,
            "all_refused",
            "every candidate worker refused, was unreachable or had its headroom taken by another "
            "router; retry later",
            retry_after_s=self.cfg.limits.retry_after_s,
        )

    async def _open_reserved(self, w: WorkerView, rid: str, opening: Opening, attempt: int) -> Stream | None:
        """Open the request on `w` under its reservation `rid`. None: the worker refused or could not be
        reached before its first token (the reservation is released; the caller tries the next); an error
        that another worker would answer alike is raised."""
        req = pb.GenerateRequest(request_id=rid, model=opening.model, sampling=opening.sampling)
        req.prompt_token_ids.extend(opening.prompt_ids)
        try:
            stream = await self._open(w.worker_id, w.address, req, attempt)
        except grpc.aio.AioRpcError as exc:
            await self.release(w.worker_id, rid)
            if exc.code() in CALLER_ERRORS or exc.code() not in RETRYABLE:
                raise final_error(w.worker_id, exc) from None
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                self.unreachable.mark(w.worker_id, self.clock())
            self.metrics.retries.labels(exc.code().name.lower()).inc()
            log.info("retrying elsewhere", extra={"worker": w.worker_id, "code": exc.code().name})
            return None
        except BaseException:
            await self.release(w.worker_id, rid)
            raise
        self.unreachable.clear(w.worker_id)
        if self.prefix is not None:  # the worker took it: its prefix cache now holds these blocks
            self.prefix.record(opening.hashes, w.worker_id)
        return stream

    async def _open(self, worker_id: str, address: str, req: pb.GenerateRequest, attempt: int) -> Stream:
        with self.tracer.start_as_current_span("zipkv.dispatch") as span:
            span.set_attribute("zipkv.worker.id", worker_id)
            span.set_attribute("zipkv.dispatch.attempt", attempt)
            channel, stub = self._stub(address)
            await connect(channel, address, self.cfg.dispatch.connect_timeout_s)
            metadata = [*trace_metadata(), *self._auth]
            call = stub.Generate(req, metadata=metadata, timeout=self.cfg.dispatch.deadline_s)
            try:
                first = await call.read()
            except asyncio.CancelledError:
                call.cancel()
                raise
            if first is grpc.aio.EOF:  # type: ignore[attr-defined]
                raise unreachable(address)
            return Stream(self, call, first, worker_id, address, req.request_id)  # type: ignore[arg-type]

    async def abort(self, address: str, request_id: str) -> None:
        _, stub = self._stub(address)
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.TimeoutError):
            await stub.Abort(pb.AbortRequest(request_id=request_id), metadata=self._auth, timeout=2.0)

    async def release(self, worker_id: str, request_id: str) -> None:
        try:
            await self.store.release(worker_id, request_id)
        except Exception:  # the store logs and falls back itself; a release must not mask the response
            log.exception("release failed", extra={"worker": worker_id, "request": request_id})
