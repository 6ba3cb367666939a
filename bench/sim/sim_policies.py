"""Placement policies for the cluster simulation, side by side on the same workers and trace.

Every policy answers `choose(request, now_s)` with a worker index, or None to refuse the request (shed:
the client gets 429/503). The baselines read each worker's live state (an idealised gateway: fresher than
any real one); zipkv's policy is the router's own code (sim_zipkv_router.py), fed by periodic reports.

    round_robin     the next worker in turn
    least_requests  fewest requests in flight (running + queued)
    least_load      the SGLang gateway's least_load as stated for this comparison:
                    score = (queued + in-flight tokens) / throughput + 0.15 s x k / (1 - k), lowest wins;
                    queued = prompt tokens not yet prefilled, in-flight = output tokens still to generate,
                    throughput = the worker's smoothed tokens/s (prefill + decode, 5 s window),
                    k = KV utilisation in the raw view (tokens held x raw bytes / KV memory, at most 0.99)
    kv_queue_cap    llm-d's saturation style: only workers with <= 5 queued requests and k <= 0.8 (raw view)
                    are candidates, best (1 - k) + 1 / (1 + queued); none left: shed
    cache_aware     sglang-router 0.3.2's default: the worker whose routed prefixes match the most leading
                    blocks when the match is > 30% of the prompt, else the one that has seen the fewest
                    blocks; the least loaded (in flight) instead when loads differ by > 64 and > 1.5x
The raw view is what a policy knowing only the KV memory and the model's token size sees: on a worker that
stores KV compressed it over-states utilisation by 1 / compression ratio.
"""

from __future__ import annotations

from typing import Protocol

from bench.sim.sim_worker import SimRequest, SimWorker


class Policy(Protocol):
    name: str

    def choose(self, r: SimRequest, now_s: float) -> int | None: ...
    def first_token(self, r: SimRequest) -> None: ...
    def done(self, r: SimRequest) -> None: ...


def raw_utilisation(w: SimWorker) -> float:
    """KV utilisation as a compression-blind policy computes it (module doc)."""
    return min(w.cache.used_tokens / (w.spec.budget_tokens * w.spec.admit_fraction), 0.99)


def in_flight(w: SimWorker) -> int:
    return w.running + w.queued


class _Base:
    name = ""

    def __init__(self, workers: list[SimWorker]) -> None:
        self.workers = workers

    def choose(self, r: SimRequest, now_s: float) -> int | None:
        raise NotImplementedError

    def first_token(self, r: SimRequest) -> None:
        return None

    def done(self, r: SimRequest) -> None:
        return None


class RoundRobin(_Base):
    name = "round_robin"

    def __init__(self, workers: list[SimWorker]) -> None:
        super().__init__(workers)
        self._next = 0

    def choose(self, r: SimRequest, now_s: float) -> int | None:
        i, self._next = self._next, (self._next + 1) % len(self.workers)
        return i


class LeastRequests(_Base):
    name = "least_requests"

    def choose(self, r: SimRequest, now_s: float) -> int | None:
        return min(range(len(self.workers)), key=lambda i: (in_flight(self.workers[i]), i))


class LeastLoad(_Base):
    name = "least_load"
    KV_PENALTY_S = 0.15

    def score_s(self, w: SimWorker) -> float:
        k = raw_utilisation(w)
        pending = w.queued_prefill_tokens() + w.remaining_decode_tokens()
        return pending / w.tokens_per_s + self.KV_PENALTY_S * k / (1.0 - k)

    def choose(self, r: SimRequest, now_s: float) -> int | None:
        return min(range(len(self.workers)), key=lambda i: (self.score_s(self.workers[i]), i))


class KvQueueCap(_Base):
    name = "kv_queue_cap"
    MAX_QUEUED = 5
    MAX_KV = 0.8

    def choose(self, r: SimRequest, now_s: float) -> int | None:
        best: tuple[float, int] | None = None
        for i, w in enumerate(self.workers):
            k = raw_utilisation(w)
            if w.queued > self.MAX_QUEUED or k > self.MAX_KV:
                continue
            score = (1.0 - k) + 1.0 / (1.0 + w.queued)
            if best is None or score > best[0]:
                best = (score, i)
        return None if best is None else best[1]


class CacheAware(_Base):
    name = "cache_aware"
    CACHE_THRESHOLD = 0.3
    BALANCE_ABS = 64
    BALANCE_REL = 1.5

    def __init__(self, workers: list[SimWorker]) -> None:
        super().__init__(workers)
        self._seen: list[set[int]] = [set() for _ in workers]  # block ids routed to each worker

    def _match_tokens(self, i: int, r: SimRequest) -> int:
        seen, tokens = self._seen[i], 0
        for k, b in enumerate(r.tr.block_ids):
            if b not in seen:
                break
            tokens += r.tr.block_tokens(k)
        return tokens

    def choose(self, r: SimRequest, now_s: float) -> int | None:
        loads = [in_flight(w) for w in self.workers]
        lo, hi = min(loads), max(loads)
        if hi - lo > self.BALANCE_ABS and hi > self.BALANCE_REL * lo:
            i = loads.index(lo)
        else:
            match = [self._match_tokens(i, r) for i in range(len(self.workers))]
            best = max(range(len(match)), key=lambda i: (match[i], -i))
            if match[best] > self.CACHE_THRESHOLD * r.tr.input_tokens:
                i = best
            else:
                i = min(range(len(self._seen)), key=lambda j: (len(self._seen[j]), j))
        self._seen[i].update(r.tr.block_ids)
        return i


BASELINES: dict[str, type[_Base]] = {
    p.name: p for p in (RoundRobin, LeastRequests, LeastLoad, KvQueueCap, CacheAware)
}
