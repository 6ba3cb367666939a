"""Flipping values changes the rendered objects as intended: router replicas, autoscaling and disruption
budget, router resources and worker GPUs, bundled vs external Redis, OpenTelemetry, images and monitoring.
Auth (API keys, tokens, network policies, gRPC mutual TLS) is test_helm_auth_values.py; values and release
names the chart refuses are in test_helm_values_validation.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_render import (
    CHART_DIR,
    NAMESPACE,
    container_env,
    containers,
    find,
    load_router_config,
    one,
    render,
    router_container,
    serve_config,
)

# ---- replicas, autoscaling, disruption budget ---------------------------------------------------


def test_router_replicas_default_to_two_with_a_pdb() -> None:
    objs = render()
    assert one(objs, "Deployment", "router")["spec"]["replicas"] == 2
    assert one(objs, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    assert find(objs, "HorizontalPodAutoscaler") == []


@pytest.mark.parametrize("replicas", [3, 5])
def test_router_replicas_follow_the_value(replicas: int) -> None:
    objs = render({"router": {"replicas": replicas}})
    assert one(objs, "Deployment", "router")["spec"]["replicas"] == replicas


def test_autoscaling_replaces_the_replica_count_with_an_hpa() -> None:
    objs = render(
        {
            "router": {
                "autoscaling": {
                    "enabled": True,
                    "minReplicas": 3,
                    "maxReplicas": 9,
                    "targetCPUUtilizationPercentage": 55,
                }
            }
        }
    )
    assert "replicas" not in one(objs, "Deployment", "router")["spec"]
    hpa = one(objs, "HorizontalPodAutoscaler")["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (3, 9)
    assert hpa["scaleTargetRef"]["name"] == one(objs, "Deployment", "router")["metadata"]["name"]
    assert hpa["metrics"][0]["resource"]["target"]["averageUtilization"] == 55


def test_one_router_in_memory_needs_no_redis_and_no_pdb(tmp_path: Path) -> None:
    objs = render({"router": {"replicas": 1}, "redis": {"enabled": False}})
    assert find(objs, "PodDisruptionBudget") == [] and find(objs, "StatefulSet") == []
    assert load_router_config(objs, tmp_path).state.backend == "memory"
    assert "REDIS_PASSWORD" not in container_env(router_container(objs), objs)


def test_pdb_can_be_turned_off() -> None:
    assert find(render({"router": {"podDisruptionBudget": {"enabled": False}}}), "PodDisruptionBudget") == []


# ---- resources --------------------------------------------------------------------------------


def test_router_resources_follow_the_values() -> None:
    resources = {"requests": {"cpu": "3", "memory": "3Gi"}, "limits": {"cpu": "4", "memory": "5Gi"}}
    objs = render({"router": {"resources": resources}})
    assert router_container(objs)["resources"] == resources


@pytest.mark.parametrize(
    ("replicas", "gpus_per_replica", "gpus_per_pod", "pods"),
    [(1, 1, 1, 1), (8, 1, 4, 2), (6, 2, 4, 3), (3, 1, 2, 2), (2, 2, 3, 2)],
)
def test_worker_gpus_and_pods_follow_the_values(
    replicas: int, gpus_per_replica: int, gpus_per_pod: int, pods: int
) -> None:
    objs = render(
        {"workers": {"numReplicas": replicas, "gpusPerReplica": gpus_per_replica, "gpusPerPod": gpus_per_pod}}
    )
    group = one(objs, "RayService")["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == pods
    resources = group["template"]["spec"]["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"] == gpus_per_pod
    args = serve_config(objs)["applications"][0]["args"]
    assert (args["num_replicas"], args["gpus_per_replica"]) == (replicas, gpus_per_replica)
    # Every replica finds its GPUs inside one pod.
    assert pods * (gpus_per_pod // gpus_per_replica) >= replicas
    assert group["rayStartParams"]["num-gpus"] == str(gpus_per_pod)


def test_worker_engine_and_model_reach_the_serve_config() -> None:
    objs = render(
        {
            "workers": {"engine": "reference", "compression": False},
            "model": {"name": "tiny", "path": "/models/tiny", "tokenizer": "byte"},
        }
    )
    args = serve_config(objs)["applications"][0]["args"]
    assert (args["engine"], args["model_name"], args["model"], args["compression"]) == (
        "reference",
        "tiny",
        "/models/tiny",
        False,
    )


def test_workers_can_be_left_out() -> None:
    assert find(render({"workers": {"enabled": False}}), "RayService") == []


# ---- Redis: bundled vs external -----------------------------------------------------------------


def test_bundled_redis_is_a_statefulset_with_a_generated_password(tmp_path: Path) -> None:
    objs = render()
    redis = one(objs, "StatefulSet", "redis")
    service = one(objs, "Service", "redis")
    redis_env = container_env(redis["spec"]["template"]["spec"]["containers"][0], objs)
    password = redis_env["REDIS_PASSWORD"]
    assert len(password) >= 24 and redis_env["REDISCLI_AUTH"] == password
    assert "$(REDIS_PASSWORD)" in redis["spec"]["template"]["spec"]["containers"][0]["args"]
    cfg = load_router_config(objs, tmp_path)
    host = f"{service['metadata']['name']}.{NAMESPACE}.svc:{service['spec']['ports'][0]['port']}"
    assert cfg.state.backend == "redis"
    assert cfg.state.redis_url == f"redis://:{password}@{host}/0"
    # The ConfigMap itself never holds the password.
    assert password not in one(objs, "ConfigMap", "router")["data"]["router.yaml"]


def test_bundled_redis_persistence_uses_a_claim() -> None:
    objs = render({"redis": {"persistence": {"enabled": True, "size": "5Gi", "storageClass": "fast"}}})
    spec = one(objs, "StatefulSet", "redis")["spec"]
    claim = spec["volumeClaimTemplates"][0]
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert claim["spec"]["storageClassName"] == "fast"
    assert "data" not in {v["name"] for v in spec["template"]["spec"]["volumes"]}


def test_external_redis_replaces_the_bundled_one(tmp_path: Path) -> None:
    url = "rediss://state.example.com:6380/2"
    objs = render(
        {
            "redis": {
                "enabled": False,
                "external": {"url": url},
                "auth": {"existingSecret": "my-redis", "existingSecretKey": "pw"},
            }
        }
    )
    assert find(objs, "StatefulSet") == [] and find(objs, "Service", "redis") == []
    assert find(objs, "Secret", "redis") == []
    cfg = load_router_config(objs, tmp_path, {"my-redis": {"pw": "hunter2hunter2"}})
    assert cfg.state.redis_url == "rediss://:hunter2hunter2@state.example.com:6380/2"


def test_external_redis_without_auth_uses_the_url_as_is(tmp_path: Path) -> None:
    url = "redis://state.example.com:6379/0"
    objs = render({"redis": {"enabled": False, "external": {"url": url}, "auth": {"enabled": False}}})
    assert "REDIS_PASSWORD" not in container_env(router_container(objs), objs)
    assert load_router_config(objs, tmp_path).state.redis_url == url


def test_bundled_redis_without_auth_runs_without_a_password() -> None:
    objs = render({"redis": {"auth": {"enabled": False}}})
    container = one(objs, "StatefulSet", "redis")["spec"]["template"]["spec"]["containers"][0]
    assert "--requirepass" not in container["args"] and "env" not in container
    assert find(objs, "Secret", "redis") == []


# ---- OpenTelemetry ------------------------------------------------------------------------------


def test_otel_off_disables_the_sdk_everywhere() -> None:
    objs = render()
    for container in [router_container(objs), *containers(one(objs, "RayService"))]:
        env = container_env(container, objs)
        assert env["OTEL_SDK_DISABLED"] == "true" and env["OTEL_TRACES_EXPORTER"] == "none"
        assert not any(k.startswith("OTEL_EXPORTER_OTLP") for k in env)


def test_otel_on_sets_the_standard_variables(tmp_path: Path) -> None:
    otel = {
        "enabled": True,
        "endpoint": "http://collector.obs:4317",
        "protocol": "grpc",
        "sampler": "traceidratio",
        "samplerArg": 0.25,
        "environment": "staging",
        "serviceNames": {"router": "edge-router", "worker": "gpu-worker"},
        "resourceAttributes": {"k8s.cluster.name": "eu1"},
    }
    objs = render({"otel": otel})
    names = set()
    for container in [router_container(objs), *containers(one(objs, "RayService"))]:
        env = container_env(container, objs)
        assert "OTEL_SDK_DISABLED" not in env
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector.obs:4317"
        assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc"
        assert (env["OTEL_TRACES_SAMPLER"], env["OTEL_TRACES_SAMPLER_ARG"]) == ("traceidratio", "0.25")
        attrs = dict(kv.split("=", 1) for kv in env["OTEL_RESOURCE_ATTRIBUTES"].split(","))
        assert attrs["k8s.cluster.name"] == "eu1" and attrs["deployment.environment.name"] == "staging"
        assert attrs["service.namespace"] == NAMESPACE
        names.add(env["OTEL_SERVICE_NAME"])
    assert names == {"edge-router", "gpu-worker"}
    assert load_router_config(objs, tmp_path).telemetry.service_name == "edge-router"


# ---- images, monitoring, config rollout ---------------------------------------------------------


def test_image_names_and_tags_are_values() -> None:
    objs = render(
        {
            "images": {
                "router": {"repository": "reg.example/r", "tag": "1.2.3"},
                "worker": {"repository": "reg.example/w", "tag": "4.5.6"},
            }
        }
    )
    assert router_container(objs)["image"] == "reg.example/r:1.2.3"
    assert {c["image"] for c in containers(one(objs, "RayService"))} == {"reg.example/w:4.5.6"}
    assert one(render(), "Deployment", "router")["spec"]["template"]["spec"]["containers"][0][
        "image"
    ].endswith(":" + yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["appVersion"])


def test_service_monitor_is_optional() -> None:
    assert find(render(), "ServiceMonitor") == []
    assert len(find(render({"router": {"serviceMonitor": {"enabled": True}}}), "ServiceMonitor")) == 1


def test_config_change_rolls_the_router_pods() -> None:
    def checksum(values: dict[str, Any]) -> str:
        pod = one(render(values), "Deployment", "router")["spec"]["template"]
        return str(pod["metadata"]["annotations"]["checksum/config"])

    assert checksum({}) == checksum({})
    assert checksum({}) != checksum({"router": {"config": {"slo": {"ttft_ms": 999}}}})
