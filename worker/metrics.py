"""Prometheus metrics of one worker replica, served on its own `/metrics` port.

The router's conventions: an own registry, `zipkv_worker_` names, units in the names (`_ms`, `_bytes`,
`_tokens`), and `worker` / `model` labels on every series (the worker label is the id the router's
`zipkv_router_placements_total{worker=...}` uses, so the two join). Engine state (KV pool, encoder,
kernels, capacity) is read at scrape time from the engine loop's latest snapshot (taken on the engine
thread, so a scrape never touches the engine); per-request series are observed when a request finishes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from zipkv.protos.capacity import Capacity
from zipkv.worker.engine import EngineEvent
from zipkv.worker.engine_stats import ENCODE_MS_BUCKETS, KVStats

log = logging.getLogger("zipkv.worker")
_LATENCY_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000)
_LABELS = ["worker", "model"]


class WorkerMetrics:
    def __init__(
        self,
        worker_id: str,
        model: str,
        kv_stats: Callable[[], KVStats | None],
        capacity: Callable[[], Capacity],
        draining: Callable[[], bool] = lambda: False,
        silent_s: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.labels = (worker_id, model)
        r = self.registry = CollectorRegistry()
        self.ttft_ms = Histogram(
            "zipkv_worker_ttft_ms", "request queued to first token, in the engine", _LABELS,
            buckets=_LATENCY_MS, registry=r,
        )  # fmt: skip
        self.queue_ms = Histogram(
            "zipkv_worker_queue_ms", "request queued to admitted (0 where the engine cannot tell)", _LABELS,
            buckets=(0.1, 0.5, *_LATENCY_MS), registry=r,
        )  # fmt: skip
        self.requests = Counter(
            "zipkv_worker_requests_total",
            "finished requests by finish reason",
            [*_LABELS, "finish"],
            registry=r,
        )
        self.prefill_tokens = Counter(
            "zipkv_worker_prefill_tokens_total", "prompt tokens computed", _LABELS, registry=r
        )
        self.prefix_hit_tokens = Counter(
            "zipkv_worker_prefix_hit_tokens_total", "prompt tokens served from the prefix cache", _LABELS,
            registry=r,
        )  # fmt: skip
        self.generated_tokens = Counter(
            "zipkv_worker_generated_tokens_total", "output tokens", _LABELS, registry=r
        )
        r.register(_EngineCollector(self.labels, kv_stats, capacity, draining, silent_s))
        self._server: Any = None
        self.port = 0

    def observe_finish(self, event: EngineEvent) -> None:
        lab = self.labels
        self.requests.labels(*lab, event.finish.value if event.finish else "error").inc()
        self.generated_tokens.labels(*lab).inc(event.completion_tokens)
        if event.ttft_ms:
            self.ttft_ms.labels(*lab).observe(event.ttft_ms)
        t = event.timings
        if t is None:
            return
        self.prefill_tokens.labels(*lab).inc(t.prefill_tokens)
        self.prefix_hit_tokens.labels(*lab).inc(t.prefix_hit_tokens)
        if t.admitted_ns:
            self.queue_ms.labels(*lab).observe((t.admitted_ns - t.queued_ns) / 1e6)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # ---- the /metrics endpoint ----------------------------------------------------------------------
    def serve(self, host: str, first_port: int, ports: int) -> int:
        """Serve /metrics on the first free port of first_port .. first_port + ports - 1 (several replicas
        share a pod: each takes the next); first_port 0 = any free port. Returns the port."""
        candidates = [0] if first_port == 0 else list(range(first_port, first_port + ports))
        for port in candidates:
            try:
                self._server, _ = start_http_server(port, addr=host, registry=self.registry)
            except OSError:
                continue
            self.port = int(self._server.server_port)
            return self.port
        # A replica starting while an old one still holds the ports (a rolling update) keeps serving
        # requests; its metrics go to a free port that the scrape config does not list.
        self._server, _ = start_http_server(0, addr=host, registry=self.registry)
        self.port = int(self._server.server_port)
        log.warning(
            "metrics ports %d..%d are all in use; /metrics is on port %d, which scrapes do not cover: "
            "raise metrics_ports",
            first_port, first_port + ports - 1, self.port,
        )  # fmt: skip
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _EngineCollector(Collector):
    def __init__(
        self,
        labels: tuple[str, str],
        kv_stats: Callable[[], KVStats | None],
        capacity: Callable[[], Capacity],
        draining: Callable[[], bool],
        silent_s: Callable[[], float],
    ) -> None:
        self._labels, self._kv_stats, self._capacity, self._draining = labels, kv_stats, capacity, draining
        self._silent_s = silent_s

    def collect(self) -> Iterator[Metric]:
        lab = list(self._labels)
        yield from _capacity_metrics(lab, self._capacity(), self._draining())
        silent_doc = "seconds with requests and no token (0 idle); past engine_stall_s: unhealthy"
        yield _gauge("zipkv_worker_silent_seconds", silent_doc, lab, self._silent_s())
        kv = self._kv_stats()
        if kv is not None:
            yield from _kv_metrics(lab, kv)


def _gauge(name: str, doc: str, labels: list[str], value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=_LABELS)
    g.add_metric(labels, value)
    return g


def _capacity_metrics(lab: list[str], cap: Capacity, draining: bool) -> Iterator[Metric]:
    yield _gauge("zipkv_worker_headroom_tokens", "new tokens that fit, under compression (reported)", lab,
                 cap.headroom_tokens)  # fmt: skip
    yield _gauge("zipkv_worker_capacity_tokens", "tokens the KV budget holds at the current ratio", lab,
                 cap.total_tokens)  # fmt: skip
    yield _gauge("zipkv_worker_committed_tokens", "tokens reserved for running requests", lab,
                 cap.committed_tokens)  # fmt: skip
    yield _gauge("zipkv_worker_compression_ratio", "stored / raw bytes of full pages (reported)", lab,
                 cap.compression_ratio)  # fmt: skip
    yield _gauge("zipkv_worker_running_requests", "requests running", lab, cap.running_requests)
    yield _gauge("zipkv_worker_queued_requests", "requests waiting for admission", lab, cap.queued_requests)
    itl_help = "recent mean decode step (inter-token latency); 0 while nothing runs"
    yield _gauge("zipkv_worker_itl_ms", itl_help, lab, cap.itl_ms)
    yield _gauge("zipkv_worker_draining", "1 while the replica drains", lab, 1.0 if draining else 0.0)


def _kv_metrics(lab: list[str], kv: KVStats) -> Iterator[Metric]:
    yield _gauge("zipkv_worker_kv_budget_bytes", "KV heap bytes", lab, kv.budget_bytes)
    yield _gauge("zipkv_worker_kv_stored_bytes", "bytes the live KV pages hold, as stored", lab,
                 kv.stored_bytes)  # fmt: skip
    yield _gauge("zipkv_worker_kv_raw_bytes", "bytes the live KV pages would hold uncompressed", lab,
                 kv.raw_bytes)  # fmt: skip
    pages = GaugeMetricFamily(
        "zipkv_worker_kv_pages", "live KV page ids by state", labels=[*_LABELS, "state"]
    )
    for state, n in (
        ("raw", kv.raw_pages),
        ("compressed", kv.compressed_pages),
        ("encoding", kv.encoding_pages),
    ):
        pages.add_metric([*lab, state], n)
    yield pages
    enc = kv.encode
    launches = CounterMetricFamily("zipkv_worker_encode_launches", "page encoder launches", labels=_LABELS)
    launches.add_metric(lab, enc.launches)
    yield launches
    encoded = CounterMetricFamily("zipkv_worker_encode_pages", "pages encoded", labels=_LABELS)
    encoded.add_metric(lab, enc.pages)
    yield encoded
    hist = HistogramMetricFamily("zipkv_worker_encode_ms", "encode launch latency", labels=_LABELS)
    cumulative, buckets = 0, []
    for bound, n in zip((*ENCODE_MS_BUCKETS, float("inf")), enc.latency_counts, strict=True):
        cumulative += n
        buckets.append((_le(bound), cumulative))
    hist.add_metric(lab, buckets, enc.latency_sum_ms)
    yield hist
    k = kv.kernels
    info = GaugeMetricFamily(
        "zipkv_worker_kernel_info", "the kernels this replica runs (value 1)",
        labels=[*_LABELS, "decode", "encode", "extend", "page_format"],
    )  # fmt: skip
    info.add_metric([*lab, k.decode, k.encode, k.extend, k.page_format], 1.0)
    yield info


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))
