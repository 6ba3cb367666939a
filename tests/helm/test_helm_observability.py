"""The chart's observability objects: the Grafana dashboard ConfigMap (sidecar label, the dashboard JSON,
queries that name only metrics the router and the workers export) and the workers' metrics ports with
the PodMonitor that scrapes them, wired to the Serve args the worker parses."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from chart_render import CHART_DIR, NAMESPACE, containers, find, one, render, serve_config

from zipkv.controlplane.metrics import RouterMetrics
from zipkv.protos.capacity import Capacity
from zipkv.worker.engine_stats import EncodeCounts, KernelsInUse, KVStats
from zipkv.worker.metrics import WorkerMetrics
from zipkv.worker.serve import settings_from_args

DASHBOARD = CHART_DIR / "dashboards" / "zipkv.json"
PROMQL_WORDS = {"sum", "by", "rate", "histogram_quantile", "le", "label_values", "clamp_min", "on"}


def dashboard_configmap(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objs, "ConfigMap", "dashboard")


def exported_metric_names() -> set[str]:
    """Every series name the router and a worker replica expose (histogram and counter suffixes too)."""
    router = RouterMetrics(("m",))
    cap = Capacity(10, 0, 10, 1.0, 0, 0, 0, 0.0, 0.0, 2048, 1024)
    kv = KVStats(1, 1, 1, 0, 0, 0, KernelsInUse("d", "e"), EncodeCounts())
    worker = WorkerMetrics("w", "m", lambda: kv, lambda: cap)
    suffixes = {"histogram": ("_bucket", "_count", "_sum"), "counter": ("_total",)}
    names: set[str] = set()
    for registry in (router.registry, worker.registry):
        for family in registry.collect():  # labelled series without samples yet still list their family
            names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
    return names


def dashboard_exprs(dash: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    return exprs


def test_dashboard_configmap_carries_the_sidecar_label_and_the_dashboard() -> None:
    objs = render()
    cm = dashboard_configmap(objs)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == NAMESPACE
    assert json.loads(cm["data"]["zipkv.json"]) == json.loads(DASHBOARD.read_text())


def test_dashboard_shows_what_an_operator_needs() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = dashboard_exprs(dash)
    joined = "\n".join(exprs)
    for q in ("0.5", "0.9", "0.99"):  # TTFT and ITL percentiles
        assert f"histogram_quantile({q}, sum by (le) (rate(zipkv_router_ttft_ms_bucket" in joined
        assert f"histogram_quantile({q}, sum by (le) (rate(zipkv_router_itl_ms_bucket" in joined
    assert 'zipkv_router_slo_requests_total{model=~"$model",outcome="met"}' in joined  # goodput
    assert "zipkv_worker_headroom_tokens" in joined
    assert "zipkv_worker_kv_stored_bytes{" in joined and "/ zipkv_worker_kv_raw_bytes{" in joined
    assert "sum by (worker, mode) (rate(zipkv_router_placements_total" in joined
    assert "sum by (reason) (rate(zipkv_router_rejections_total" in joined
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and dash["uid"] == "zipkv-overview"


def test_every_dashboard_query_names_metrics_that_are_exported() -> None:
    exported = exported_metric_names()
    assert "zipkv_worker_encode_ms_bucket" in exported and "zipkv_router_slo_requests_total" in exported
    for expr in dashboard_exprs(json.loads(DASHBOARD.read_text())):
        scrubbed = re.sub(r'"[^"]*"|\{[^}]*\}|\[[^\]]*\]', " ", expr)  # label matchers, ranges
        for name in re.findall(r"\b(zipkv_\w+)", scrubbed):
            assert name in exported, f"dashboard query {expr!r} names {name}, which nothing exports"


def test_dashboard_can_be_left_out_or_moved_to_grafanas_namespace() -> None:
    assert not find(render({"grafana": {"dashboard": {"enabled": False}}}), "ConfigMap", "dashboard")
    moved = render(
        {"grafana": {"dashboard": {"namespace": "monitoring", "annotations": {"grafana_folder": "zipkv"}}}}
    )
    cm = dashboard_configmap(moved)
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "zipkv"}


@pytest.mark.parametrize(("gpus_per_pod", "gpus_per_replica"), [(1, 1), (4, 1), (8, 2)])
def test_each_replica_of_a_pod_has_a_metrics_port_that_the_podmonitor_scrapes(
    gpus_per_pod: int, gpus_per_replica: int
) -> None:
    per_pod = gpus_per_pod // gpus_per_replica
    values = {
        "workers": {
            "gpusPerPod": gpus_per_pod,
            "gpusPerReplica": gpus_per_replica,
            "numReplicas": 2 * per_pod,
            "cpusPerReplica": 1,
            "gpuWorker": {"cpu": "16"},
            "metrics": {"port": 9500, "podMonitor": {"enabled": True, "labels": {"release": "prom"}}},
        }
    }
    objs = render(values)
    ray = one(objs, "RayService")
    group = ray["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    (worker,) = group["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in worker["ports"]}
    assert ports == {f"metrics-{i}": 9500 + i for i in range(per_pod)}
    # The replicas take their ports from exactly that range (the worker's own argument parser).
    (app,) = serve_config(objs)["applications"]
    settings, *_ = settings_from_args(app["args"])
    assert (settings.metrics_port, settings.metrics_ports) == (9500, per_pod)
    monitor = one(objs, "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == list(ports)
    assert all(e["path"] == "/metrics" for e in monitor["spec"]["podMetricsEndpoints"])
    pod_labels = group["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    head = ray["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]
    assert not monitor["spec"]["selector"]["matchLabels"].items() <= head["metadata"]["labels"].items()


def test_podmonitor_is_optional() -> None:
    objs = render()
    assert not find(objs, "PodMonitor")
    # the ports are there regardless, for any scraper that reads pod ports
    worker = list(containers(one(objs, "RayService")))[1]
    assert [p["name"] for p in worker["ports"]] == ["metrics-0"]


def test_network_policy_lets_prometheus_reach_only_the_metrics_ports() -> None:
    prometheus = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    values = {"workers": {"gpusPerPod": 2, "gpusPerReplica": 1, "numReplicas": 2},
              "networkPolicy": {"metricsFrom": prometheus}}  # fmt: skip
    objs = render(values)
    policy = next(o for o in find(objs, "NetworkPolicy") if o["metadata"]["name"].endswith("-ray-worker"))
    rules = [r for r in policy["spec"]["ingress"] if "ports" in r]
    assert rules == [
        {"ports": [{"port": "metrics-0", "protocol": "TCP"}, {"port": "metrics-1", "protocol": "TCP"}],
         "from": prometheus}
    ]  # fmt: skip
    head = next(o for o in find(objs, "NetworkPolicy") if o["metadata"]["name"].endswith("-ray-head"))
    assert all("ports" not in r for r in head["spec"]["ingress"])  # no replica (no metrics) on the head
