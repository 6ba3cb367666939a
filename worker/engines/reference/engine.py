"""The reference engine: continuous batching over a paged, compressed KV cache.

Each `step()`:
1. applies aborts;
2. admits queued requests first come, first served while the allocator says their worst case fits:
   a request reserves the pages it may need to reach its max length (`headroom_pages()` already counts
   the pages that compression freed), so a running request never fails for lack of memory;
3. runs the model once over a packed batch (batch_inputs.py) of the admitted prompts (prefill) and one
   token of every running request (decode);
4. samples, finishes requests (stop tokens, EOS, max tokens, context limit), marks pages that filled as
   full and ends the allocator's step, which compresses them.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from zipkv.kernels.format.layout import FORMAT_VERSION, PAGE_TOKENS, PageFormat
from zipkv.protos.capacity import Capacity
from zipkv.worker.engine import EngineEvent, EngineRequest, FinishReason, RequestRejected
from zipkv.worker.engine_stats import KVStats, now_ns
from zipkv.worker.engines.reference.batch_inputs import pack_batch
from zipkv.worker.engines.reference.kvstore import KVStore
from zipkv.worker.engines.reference.model import LoadedModel
from zipkv.worker.engines.reference.running import Running, ewma, pages_for
from zipkv.worker.engines.reference.sampling import make_generator, sample_next


@dataclass(frozen=True)
class ReferenceEngineConfig:
    kv_budget_bytes: int = 64 << 20
    compression: bool = True
    max_running_requests: int = 64
    max_queued_requests: int = 256
    max_prefill_tokens: int = 4096  # per step; a longer prompt still runs, alone
    chunk_bytes: int = 256 << 10
    kernels: str = "auto"  # auto | triton | torch (see KVStore)
    format_version: int = (
        FORMAT_VERSION  # the page format the KV cache is written in (kernels/format/layout.py)
    )


class ReferenceEngine:
    def __init__(self, loaded: LoadedModel, config: ReferenceEngineConfig, device: str) -> None:
        self.loaded = loaded
        self.model_name = loaded.name
        self.config = config
        self.device = torch.device(device)
        fmt = PageFormat(
            head_dim=loaded.head_dim, num_kv_heads=loaded.num_kv_heads, version=config.format_version
        )
        self.store = KVStore(
            fmt,
            loaded.num_layers,
            config.kv_budget_bytes,
            device,
            config.compression,
            config.chunk_bytes,
            config.kernels,
        )
        self._idle_pages = self.store.headroom_pages()
        self._queue: collections.deque[Running] = collections.deque()
        self._running: dict[str, Running] = {}
        self._aborts: set[str] = set()
        self._arrivals = 0
        self._ttft_ms = 0.0
        self._itl_ms = 0.0
        self.steps = 0
        self.max_running_seen = 0

    # ---- requests -----------------------------------------------------------------------------------
    def add_request(self, request: EngineRequest) -> None:
        prompt_tokens = len(request.prompt_token_ids)
        if prompt_tokens == 0:
            raise RequestRejected("the prompt is empty: send at least one token", retryable=False)
        bad = [t for t in request.prompt_token_ids if not 0 <= t < self.loaded.vocab_size]
        if bad:
            raise RequestRejected(
                f"prompt token ids {bad[:5]} are outside this model's vocabulary "
                f"(0..{self.loaded.vocab_size - 1})",
                retryable=False,
            )
        limit = self.loaded.max_context_tokens
        if prompt_tokens >= limit:
            raise RequestRejected(
                f"the prompt has {prompt_tokens} tokens; this model's context is {limit}: shorten it",
                retryable=False,
            )
        if self._worst_case_pages(request) > self._budget_pages():
            raise RequestRejected(
                f"the request needs {self._worst_case_pages(request)} KV pages at most but this worker's "
                "whole "
                f"budget holds {self._budget_pages()}: lower max_tokens or use a larger worker",
                retryable=True,
            )
        if len(self._queue) >= self.config.max_queued_requests:
            raise RequestRejected(f"queue full ({len(self._queue)} requests waiting)", retryable=True)
        if request.request_id in self._running or any(
            r.request.request_id == request.request_id for r in self._queue
        ):
            raise RequestRejected(f"request id {request.request_id} is already in use", retryable=False)
        self._arrivals += 1
        gen = make_generator(request.sampling, self._arrivals)
        self._queue.append(Running(request, time.monotonic(), gen, queued_ns=now_ns()))

    def abort(self, request_id: str) -> bool:
        known = request_id in self._running or any(r.request.request_id == request_id for r in self._queue)
        if known:
            self._aborts.add(request_id)
        return known

    def has_work(self) -> bool:
        return bool(self._queue or self._running or self._aborts)

    # ---- one step -----------------------------------------------------------------------------------
    def step(self, on_scheduled: Callable[[], None] | None = None) -> list[EngineEvent]:
        events = self._apply_aborts()
        prefill = self._admit()
        if on_scheduled is not None:
            on_scheduled()  # capacity() now counts the requests this step prefills
        batch = [r for r in self._running.values() if r.computed_tokens > 0] + prefill
        if not batch:
            return events
        decoding = len(batch) - len(prefill)
        started, started_ns = time.monotonic(), now_ns()
        next_tokens = self._forward(batch)
        now, now_wall_ns = time.monotonic(), now_ns()
        for req in prefill:
            req.prefill_start_ns, req.prefill_end_ns = started_ns, now_wall_ns
            req.prefill_batch_requests = len(prefill)
        for req, token in zip(batch, next_tokens, strict=True):
            events.append(self._append_token(req, token, now))
        if decoding and not prefill:  # a pure decode step measures the inter-token latency
            self._itl_ms = ewma(self._itl_ms, (now - started) * 1000.0)
        self.store.end_step()
        self.steps += 1
        return events

    def _apply_aborts(self) -> list[EngineEvent]:
        events = []
        for rid in sorted(self._aborts):
            req = self._running.pop(rid, None)
            if req is None:
                req = next((r for r in self._queue if r.request.request_id == rid), None)
                if req is None:
                    continue
                self._queue.remove(req)
            else:
                self._release(req)
            events.append(self._finish_event(req, FinishReason.ABORT, "aborted"))
        self._aborts.clear()
        return events

    def _admit(self) -> list[Running]:
        admitted: list[Running] = []
        prefill_tokens = 0
        while self._queue and len(self._running) < self.config.max_running_requests:
            req = self._queue[0]
            prompt = len(req.request.prompt_token_ids)
            if admitted and prefill_tokens + prompt > self.config.max_prefill_tokens:
                break
            need = self._worst_case_pages(req.request)
            # headroom_pages() already keeps the allocator's encode margin (allocator/page_table.py) out
            fit = self.store.headroom_pages()
            if need > fit:
                break  # first come, first served: wait for pages to come back
            req.admitted_ns, req.headroom_tokens = now_ns(), fit * PAGE_TOKENS
            self._queue.popleft()
            self.store.reserve(req.request.request_id, need)
            req.reserved_pages, req.reserved_tokens = need, need * PAGE_TOKENS
            req.admission_done_ns = now_ns()
            self._running[req.request.request_id] = req
            admitted.append(req)
            prefill_tokens += prompt
        self.max_running_seen = max(self.max_running_seen, len(self._running))
        return admitted

    def _forward(self, batch: list[Running]) -> list[int]:
        for req in batch:
            self._grow_pages(req, len(req.tokens))
        inputs = pack_batch(batch, self.store, self.device, self.loaded.num_q_heads)
        with torch.inference_mode():
            out = self.loaded.model(
                input_ids=inputs.input_ids,
                position_ids=inputs.position_ids,
                use_cache=False,
                logits_to_keep=inputs.last_rows,
                zipkv_batch=inputs.step,
            )
        logits = out.logits[0]  # [B, vocab]
        tokens = []
        for i, req in enumerate(batch):
            req.computed_tokens = inputs.step.seqs[i].kv_len
            self._mark_filled(req)
            tokens.append(sample_next(logits[i], req.request.sampling, req.generator))
        return tokens

    def _grow_pages(self, req: Running, kv_len: int) -> None:
        missing = pages_for(kv_len) - len(req.page_ids)
        if missing > 0:
            req.page_ids.extend(self.store.allocate(missing, req.request.request_id))
            req.reserved_pages = max(0, req.reserved_pages - missing)  # the pool drew them from it

    def _mark_filled(self, req: Running) -> None:
        full = req.computed_tokens // PAGE_TOKENS
        if full > req.full_pages:
            self.store.mark_full(req.page_ids[req.full_pages : full])
            req.full_pages = full

    def _append_token(self, req: Running, token: int, now: float) -> EngineEvent:
        req.output.append(token)
        if req.first_token_s is None:
            req.first_token_s = now
            self._ttft_ms = ewma(self._ttft_ms, (now - req.arrival_s) * 1000.0)
        opts = req.request.sampling
        reason = None
        if token in opts.stop_token_ids or (not opts.ignore_eos and token in self.loaded.eos_token_ids):
            reason = FinishReason.STOP
        elif len(req.output) >= opts.max_new_tokens or len(req.tokens) >= self.loaded.max_context_tokens:
            reason = FinishReason.LENGTH
        if reason is None:
            return EngineEvent(req.request.request_id, token_ids=(token,))
        del self._running[req.request.request_id]
        self._release(req)
        return self._finish_event(req, reason, "", token_ids=(token,))

    def _release(self, req: Running) -> None:
        self.store.free(req.page_ids)
        self.store.release(req.request.request_id)
        req.page_ids = []

    def _finish_event(
        self, req: Running, reason: FinishReason, message: str, token_ids: tuple[int, ...] = ()
    ) -> EngineEvent:
        ttft = (req.first_token_s - req.arrival_s) * 1000.0 if req.first_token_s else 0.0
        return EngineEvent(
            req.request.request_id,
            token_ids=token_ids,
            finish=reason,
            message=message,
            prompt_tokens=len(req.request.prompt_token_ids),
            completion_tokens=len(req.output),
            ttft_ms=ttft,
            timings=req.timings(),
        )

    # ---- capacity -----------------------------------------------------------------------------------
    def kv_stats(self) -> KVStats:
        return self.store.kv_stats()

    def _worst_case_pages(self, request: EngineRequest) -> int:
        total = len(request.prompt_token_ids) + request.sampling.max_new_tokens
        return pages_for(min(total, self.loaded.max_context_tokens))

    def _budget_pages(self) -> int:
        """What the idle store admits (chunk rounding included), the most any one request can get."""
        return self._idle_pages

    def capacity(self) -> Capacity:
        stats = self.store.stats()
        headroom_pages = self.store.headroom_pages()
        committed_pages = sum(r.reserved_pages for r in self._running.values())
        used_pages = sum(len(r.page_ids) for r in self._running.values())
        ratio = float(getattr(stats, "compression_ratio", 1.0) or 1.0)
        return Capacity(
            headroom_tokens=headroom_pages * PAGE_TOKENS,
            committed_tokens=committed_pages * PAGE_TOKENS,
            total_tokens=(headroom_pages + committed_pages + used_pages) * PAGE_TOKENS,
            compression_ratio=ratio,
            running_requests=len(self._running),
            queued_requests=len(self._queue),
            queued_prefill_tokens=sum(len(r.request.prompt_token_ids) for r in self._queue)
            + sum(len(r.request.prompt_token_ids) for r in self._running.values() if r.first_token_s is None),
            ttft_ms=self._ttft_ms,
            itl_ms=self._itl_ms if self._running else 0.0,  # idle: no current step (protos/zipkv.proto)
            max_context_tokens=self.loaded.max_context_tokens,
            kv_bytes_per_token=self.store.kv_bytes_per_token,
        )
