"""One simulated SGLang worker (a SimPy process): continuous batching as SGLang 0.5.17's scheduler does it.

Each iteration runs a prefill batch when one can be formed, else one decode step of every running request
(SGLang's `get_next_batch_to_run`: "run prefill first if possible"), so a long prefill stalls decoding, as
on the GPU. A prefill batch takes waiting requests first come, first served while they fit the KV memory
(sim_kv_cache.py: prompt + whole output reserved) and the running-request cap, up to `chunk_tokens` new
tokens; a longer prompt is prefilled in chunks over consecutive iterations (chunked prefill). Step times
come from the fitted model (step_model.py). Decoding is counted, not stepped per request: a request joining
the batch at step s with n tokens to go finishes at step s + n.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.serving.trace_workload import TraceRequest
from bench.sim.sim_kv_cache import KvCache
from bench.sim.step_model import StepModel

GAP_BIN_MS = 0.1


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    name: str  # pool label, e.g. "zipkv-0.76"
    system: str  # step_model.SYSTEMS
    step: StepModel
    budget_tokens: int  # the KV memory in raw (uncompressed) tokens
    compression_ratio: float = 1.0  # stored / raw bytes
    admit_fraction: float = 45 / 46  # of the pool SGLang fills (page rounding, a reserve per request)
    max_running: int = 64
    chunk_tokens: int = 8192  # SGLang's chunked_prefill_size default on an H200

    @property
    def capacity_tokens(self) -> int:
        return int(self.budget_tokens * self.admit_fraction / self.compression_ratio)


@dataclass(slots=True)
class SimRequest:
    rid: int
    tr: TraceRequest
    arrival_s: float
    worker: int = -1
    enqueued_s: float = 0.0
    first_token_s: float = math.nan
    done_s: float = math.nan
    prefill_left: int = 0
    prefilled: int = 0  # prompt tokens in the context so far (cached prefix + prefilled chunks)
    prefill_start_s: float = math.nan  # admitted into a prefill batch: the wait ahead of it is over
    shed: bool = False


@dataclass(slots=True)
class GapHistogram:
    """Inter-token gaps with weights, binned at 0.1 ms (percentiles without keeping every gap)."""

    counts: dict[int, float] = field(default_factory=dict)

    def add(self, gap_ms: float, weight: float) -> None:
        if weight > 0:
            k = int(gap_ms / GAP_BIN_MS)
            self.counts[k] = self.counts.get(k, 0.0) + weight

    def values_weights(self) -> tuple[list[float], list[float]]:
        keys = sorted(self.counts)
        return [(k + 0.5) * GAP_BIN_MS for k in keys], [self.counts[k] for k in keys]


class SimWorker:
    def __init__(
        self,
        env: Any,
        wid: int,
        spec: WorkerSpec,
        on_first_token: Callable[[SimRequest], None],
        on_done: Callable[[SimRequest], None],
        gaps: GapHistogram,
    ) -> None:
        self.env, self.wid, self.spec, self.gaps = env, wid, spec, gaps
        self.cache = KvCache(spec.capacity_tokens)
        self._on_first, self._on_done = on_first_token, on_done
        self.waiting: deque[SimRequest] = deque()
        self.prefilling: list[SimRequest] = []  # admitted, prompt not all in yet
        self._finish: list[tuple[int, int, SimRequest]] = []  # (finish step, rid, request)
        self.running = 0
        self.context_tokens = 0  # of the running batch
        self.steps = 0
        self._last_decode_s = 0.0
        self._joined_since_decode = 0
        self.recent_ttft_ms: deque[float] = deque(maxlen=64)
        self.recent_itl: deque[tuple[float, int]] = deque()  # (gap ms, tokens), about the last 256 tokens
        self._itl_tokens = 0
        self._itl_sum_ms = 0.0
        self._waiting_tokens = 0
        self._finish_step_sum = 0  # over running requests: remaining tokens = sum - running x steps
        self.admitted_prompt_tokens = 0
        self.prefix_hit_tokens = 0  # of those, served from the prefix cache (not prefilled)
        self.tokens_per_s = spec.step.prefill_tokens_per_s  # smoothed work rate (prefill + decode tokens)
        self._wake = env.event()
        env.process(self._loop())

    # ---- what policies and reports read ---------------------------------------------------------------
    @property
    def queued(self) -> int:
        return len(self.waiting) + len(self.prefilling)

    def queued_prefill_tokens(self) -> int:
        return self._waiting_tokens + sum(r.prefill_left for r in self.prefilling)

    def reported_prefill_tokens(self) -> int:
        """queued_prefill_tokens as a zipkv worker reports it (worker/engines/sglang/engine.py): the whole
        prompt of every request without its first token, cached prefix and prefilled chunks included."""
        return self._waiting_tokens + sum(r.tr.input_tokens for r in self.prefilling)

    def remaining_decode_tokens(self) -> int:
        return self._finish_step_sum - self.running * self.steps

    def itl_ms(self) -> float:
        return self._itl_sum_ms / self._itl_tokens if self._itl_tokens else 0.0

    # ---- the engine --------------------------------------------------------------------------------------
    def submit(self, r: SimRequest) -> None:
        r.worker, r.enqueued_s = self.wid, self.env.now
        self.waiting.append(r)
        self._waiting_tokens += r.tr.input_tokens
        if not self._wake.triggered:
            self._wake.succeed()

    def _loop(self) -> Any:
        while True:
            batch = self._prefill_batch()
            if batch:
                work = sum(n for _, n in batch)
                dt = self.spec.step.prefill_batch_ms([(n, r.prefilled) for r, n in batch]) / 1000.0
                yield self.env.timeout(dt)
                self._smooth_rate(work, dt)
                self._after_prefill(batch)
            elif self.running:
                dt = self.spec.step.decode_ms(self.context_tokens) / 1000.0
                yield self.env.timeout(dt)
                self._smooth_rate(self.running, dt)
                self._after_decode(dt)
            else:
                if self.waiting:  # nothing runs and the head does not fit an empty pool: it never will
                    r = self.waiting.popleft()
                    self._waiting_tokens -= r.tr.input_tokens
                    self._refuse(r)
                    continue
                self._wake = self.env.event()
                yield self._wake

    def _prefill_batch(self) -> list[tuple[SimRequest, int]]:
        budget = self.spec.chunk_tokens
        batch: list[tuple[SimRequest, int]] = []
        for r in self.prefilling:  # a chunked prompt goes on first
            n = min(r.prefill_left, budget)
            batch.append((r, n))
            budget -= n
        while budget > 0 and self.waiting and self.running + len(self.prefilling) < self.spec.max_running:
            head = self.waiting[0]
            if not self.cache.fits(head.tr):
                break  # first come, first served: the head waits for memory
            self.waiting.popleft()
            self._waiting_tokens -= head.tr.input_tokens
            left = max(self.cache.admit(head.tr), 1)  # a whole-prompt cache hit still computes one token
            self.admitted_prompt_tokens += head.tr.input_tokens
            self.prefix_hit_tokens += head.tr.input_tokens - left
            head.prefill_left, head.prefilled = left, head.tr.input_tokens - left
            head.prefill_start_s = self.env.now
            self.prefilling.append(head)
            n = min(left, budget)
            batch.append((head, n))
            budget -= n
        return batch

    def _after_prefill(self, batch: list[tuple[SimRequest, int]]) -> None:
        now = self.env.now
        for r, n in batch:
            r.prefill_left -= n
            r.prefilled += n
            if r.prefill_left > 0:
                continue
            self.prefilling.remove(r)
            r.first_token_s = now
            self.recent_ttft_ms.append((now - r.enqueued_s) * 1000.0)
            self._on_first(r)
            if r.tr.output_tokens <= 1:
                self._complete(r)
                continue
            self.running += 1
            self._joined_since_decode += 1
            self.context_tokens += r.tr.input_tokens + 1
            finish = self.steps + r.tr.output_tokens - 1
            self._finish_step_sum += finish
            heapq.heappush(self._finish, (finish, r.rid, r))

    def _after_decode(self, dt: float) -> None:
        now = self.env.now
        waited = self.running - self._joined_since_decode
        gap_ms = (now - self._last_decode_s) * 1000.0 if self.steps else dt * 1000.0
        self.gaps.add(gap_ms, waited)  # in the batch before: waited through any prefill since
        self.gaps.add(dt * 1000.0, self._joined_since_decode)
        self._note_itl(gap_ms, waited)
        self._note_itl(dt * 1000.0, self._joined_since_decode)
        self.steps += 1
        self.context_tokens += self.running
        self._last_decode_s, self._joined_since_decode = now, 0
        while self._finish and self._finish[0][0] <= self.steps:
            finish, _, r = heapq.heappop(self._finish)
            self._finish_step_sum -= finish
            self.running -= 1
            self.context_tokens -= r.tr.input_tokens + r.tr.output_tokens
            self._complete(r)

    def _complete(self, r: SimRequest) -> None:
        r.done_s = self.env.now
        self.cache.release(r.tr)
        self._on_done(r)

    def _refuse(self, r: SimRequest) -> None:
        r.shed = True
        self._on_done(r)

    def _note_itl(self, gap_ms: float, tokens: int) -> None:
        if tokens <= 0:
            return
        self.recent_itl.append((gap_ms, tokens))
        self._itl_tokens += tokens
        self._itl_sum_ms += gap_ms * tokens
        while self._itl_tokens - self.recent_itl[0][1] >= 256:
            g, n = self.recent_itl.popleft()
            self._itl_tokens -= n
            self._itl_sum_ms -= g * n

    def _smooth_rate(self, tokens: int, dt: float) -> None:
        a = 1.0 - math.exp(-dt / 5.0)  # a 5 s window
        self.tokens_per_s = (1 - a) * self.tokens_per_s + a * tokens / max(dt, 1e-9)
