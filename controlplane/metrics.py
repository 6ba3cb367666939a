"""Prometheus metrics of one router (own registry, so several routers can live in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from zipkv.controlplane.state import Snapshot

_LATENCY_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000)


class RouterMetrics:
    def __init__(self, models: tuple[str, ...] = ()) -> None:
        self._models = models
        self.registry = CollectorRegistry()
        # Registered in this order, which is the order /metrics lists them in.
        self._add_latencies(self.registry)
        self._add_placement_counters(self.registry)
        self._add_outcome_counters(self.registry)
        self._add_gauges(self.registry)
        self._known: set[tuple[str, str]] = set()

    def _add_latencies(self, r: CollectorRegistry) -> None:
        """Request latencies per model, and the placement decision's."""
        self.ttft_ms = Histogram(
            "zipkv_router_ttft_ms",
            "HTTP request in to first token out",
            ["model"],
            buckets=_LATENCY_MS,
            registry=r,
        )
        self.itl_ms = Histogram(
            "zipkv_router_itl_ms",
            "time between streamed token chunks",
            ["model"],
            buckets=(0.5, *_LATENCY_MS),
            registry=r,
        )
        self.e2e_ms = Histogram(
            "zipkv_router_e2e_ms",
            "HTTP request in to last byte out",
            ["model"],
            buckets=_LATENCY_MS,
            registry=r,
        )
        self.placement_ms = Histogram(
            "zipkv_router_placement_ms",
            "placement decision time",
            [],
            buckets=(0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10),
            registry=r,
        )

        self.headroom_wait_ms = Histogram(
            "zipkv_router_headroom_wait_ms",
            "how long a request waited at the router for a worker's headroom, by outcome (placed, refused)",
            ["outcome"],
            buckets=(10, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000),
            registry=r,
        )
        self.claims = Counter(
            "zipkv_router_claims_total",
            "claims waiting requests took on a worker's headroom, by how they ended: placed (the claim "
            "became the reservation), moved (placed on another worker), lost (the worker left), expired, "
            "cancelled (the client went away)",
            ["outcome"],
            registry=r,
        )

    def _add_placement_counters(self, r: CollectorRegistry) -> None:
        """Requests placed, retried elsewhere, refused, and placements that saw a stale report."""
        self.placements = Counter(
            "zipkv_router_placements_total", "requests placed on a worker", ["worker", "mode"], registry=r
        )
        self.retries = Counter(
            "zipkv_router_retries_total", "dispatch retried on the next-best worker", ["reason"], registry=r
        )
        self.rejections = Counter(
            "zipkv_router_rejections_total", "requests refused, by reason", ["reason"], registry=r
        )
        self.stale_reports = Counter(
            "zipkv_router_stale_reports_total",
            "placements that saw a stale report (coarse comparison)",
            registry=r,
        )

    def _add_outcome_counters(self, r: CollectorRegistry) -> None:
        """Outcomes: of capacity reports (and the field that refused one), of finished requests against
        their SLOs, of streams a worker broke."""
        self.reports = Counter(
            "zipkv_router_reports_total", "capacity reports by outcome", ["outcome"], registry=r
        )
        self.report_rejections = Counter(
            "zipkv_router_report_rejections_total",
            "capacity reports refused at the boundary, by the first bad field",
            ["field"],
            registry=r,
        )
        self.slo_requests = Counter(
            "zipkv_router_slo_requests_total",
            "finished requests by whether they met their TTFT and TPOT SLOs (goodput: outcome met)",
            ["model", "outcome"],
            registry=r,
        )
        self.stream_errors = Counter(
            "zipkv_router_stream_errors_total", "streams ended by a worker failure", registry=r
        )

    def _add_gauges(self, r: CollectorRegistry) -> None:
        """Per worker (headroom, ratio), per model (live workers), and the router's own state."""
        self.headroom_tokens = Gauge(
            "zipkv_router_worker_headroom_tokens",
            "free tokens under compression minus reservations",
            ["worker", "model"],
            registry=r,
        )
        self.compression_ratio = Gauge(
            "zipkv_router_worker_compression_ratio", "reported ratio", ["worker", "model"], registry=r
        )
        self.workers = Gauge("zipkv_router_workers", "live workers per model", ["model"], registry=r)
        self.inflight = Gauge("zipkv_router_inflight_requests", "requests being served", registry=r)
        self.degraded = Gauge(
            "zipkv_router_degraded", "1 while the shared state (Redis) is unreachable", registry=r
        )

    def observe_snapshot(self, snap: Snapshot) -> None:
        seen: set[tuple[str, str]] = set()
        per_model: dict[str, int] = {}
        for v in snap.workers:
            key = (v.worker_id, v.model)
            seen.add(key)
            per_model[v.model] = per_model.get(v.model, 0) + 1
            self.headroom_tokens.labels(*key).set(v.headroom_tokens)
            self.compression_ratio.labels(*key).set(v.capacity.compression_ratio)
        for key in self._known - seen:  # expired workers leave the gauges
            self.headroom_tokens.remove(*key)
            self.compression_ratio.remove(*key)
        for model in ({m for _, m in self._known} | set(self._models)) - set(per_model):
            self.workers.labels(model).set(0)
        for model, n in per_model.items():
            self.workers.labels(model).set(n)
        self._known = seen
        self.degraded.set(1 if snap.degraded else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
