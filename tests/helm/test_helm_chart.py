"""The chart renders and lints with the real Helm engine for the defaults and every example; every object
validates against the Kubernetes schemas and the RayService against the KubeRay CRD; the router config
in the ConfigMap passes the router's own validation with the environment its pod would have."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml
from chart_render import (
    CHART_DIR,
    EXAMPLES,
    KUBE_VERSIONS,
    KUBERAY_CRDS_ENV,
    NAMESPACE,
    RAYSERVICE_CRD,
    RELEASE,
    container_env,
    containers,
    example_values,
    find,
    lint,
    notes,
    one,
    render,
    router_config_text,
    serve_config,
    validate_builtin,
    validate_rayservice,
)

from zipkv.controlplane.config import ConfigError, RouterConfig, load_config

# The production example names Secrets the user creates before installing; these stand in for them.
EXISTING_SECRETS = {
    "zipkv-auth": {
        "report-token": "prod-report-token-0123456789",
        "dispatch-token": "prod-dispatch-token-0123456789",
        "api-keys": '["key-aaaaaaaaaaaaaaaa"]',
    },
    "zipkv-redis": {"redis-password": "s3cretRedisPassw0rd"},
}
VALUE_SETS: dict[str, dict[str, Any]] = {"default": {}} | {p.stem: example_values(p) for p in EXAMPLES}
# Kinds without an offline schema here; each gets its own consistency checks below.
NO_OFFLINE_SCHEMA = {"ServiceMonitor", "PodMonitor"}


def test_examples_present() -> None:
    assert {p.name for p in EXAMPLES} >= {"dev-single-gpu.yaml", "production-multi-gpu.yaml"}


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_lint_is_clean(name: str) -> None:
    report = lint(VALUE_SETS[name])
    assert report["errors"] == [], report
    # Severity 2 = warning, 3 = error; info (1) such as "icon is recommended" is allowed.
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_objects_validate_against_kubernetes_schemas(name: str) -> None:
    objs = render(VALUE_SETS[name])
    kinds = {o["kind"] for o in objs}
    assert {"Deployment", "Service", "ConfigMap", "RayService"} <= kinds
    for obj in objs:
        assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]
        if obj["kind"] == "RayService" or obj["kind"] in NO_OFFLINE_SCHEMA:
            continue
        for version in KUBE_VERSIONS:
            validate_builtin(obj, version)


@pytest.mark.skipif(not RAYSERVICE_CRD.is_file(), reason=f"no KubeRay CRD: set {KUBERAY_CRDS_ENV}")
@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_rayservice_validates_against_crd(name: str) -> None:
    validate_rayservice(one(render(VALUE_SETS[name]), "RayService"))


@pytest.mark.skipif(not RAYSERVICE_CRD.is_file(), reason=f"no KubeRay CRD: set {KUBERAY_CRDS_ENV}")
def test_crd_validation_catches_mistakes() -> None:
    """The CRD check is strict: a misspelled field and a wrong type are both rejected."""
    good = one(render(), "RayService")
    typo = yaml.safe_load(yaml.safe_dump(good))
    typo["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["minReplica"] = 1
    wrong_type = yaml.safe_load(yaml.safe_dump(good))
    wrong_type["spec"]["serveConfigV2"] = {"applications": []}
    for bad in (typo, wrong_type):
        with pytest.raises(AssertionError, match="does not match the CRD schema"):
            validate_rayservice(bad)


def test_service_monitor_selects_the_router_metrics_port() -> None:
    objs = render(VALUE_SETS["production-multi-gpu"])
    monitor = one(objs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    service = one(objs, "Service", "router")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    port_names = {p["name"] for p in service["spec"]["ports"]}
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["http"] and "http" in port_names
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def router_config(objs: list[dict[str, Any]], tmp_path: Path) -> RouterConfig:
    """Load the ConfigMap's router.yaml with the router container's environment, as the pod would."""
    path = tmp_path / "router.yaml"
    path.write_text(router_config_text(objs))
    container = next(containers(one(objs, "Deployment", "router")))
    env = container_env(container, objs, EXISTING_SECRETS)
    return load_config(str(path), env)


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_router_config_passes_router_validation(name: str, tmp_path: Path) -> None:
    values = VALUE_SETS[name]
    objs = render(values)
    cfg = router_config(objs, tmp_path)
    # The file alone (no Secrets) must be valid too: with the chart's mutual TLS the certificate is the
    # report credential; without it only the Secret's token is, and the file alone is refused.
    if cfg.security.tls is None:
        with pytest.raises(ConfigError, match="report_token"):
            load_config(str(tmp_path / "router.yaml"), {})
    else:
        assert load_config(str(tmp_path / "router.yaml"), {}).security.tls == cfg.security.tls
    deployment = one(objs, "Deployment", "router")
    container = next(containers(deployment))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert cfg.http.port == ports["http"] and cfg.grpc.port == ports["grpc-report"]
    assert container["command"] == ["python", "-m", "zipkv.controlplane"]
    assert container["args"] == ["--config", "/etc/zipkv/router.yaml"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert mount["mountPath"] == "/etc/zipkv"
    # One model, the one the workers serve.
    args = serve_config(objs)["applications"][0]["args"]
    assert [m.name for m in cfg.models] == [args["model_name"]]
    # The token the router checks is the token the workers send.
    assert cfg.security.report_token and not cfg.security.allow_unauthenticated_reports
    for ray_container in containers(one(objs, "RayService")):
        assert container_env(ray_container, objs, EXISTING_SECRETS)["ZIPKV_REPORT_TOKEN"] == (
            cfg.security.report_token
        )
    replicas = (
        deployment["spec"].get("replicas") or one(objs, "HorizontalPodAutoscaler")["spec"]["minReplicas"]
    )
    if replicas > 1:
        assert cfg.state.backend == "redis"


def test_router_check_cli_accepts_the_rendered_config(tmp_path: Path) -> None:
    """`python -m zipkv.controlplane.config --check` (the router's own CLI) on the rendered file."""
    objs = render(VALUE_SETS["production-multi-gpu"])
    path = tmp_path / "router.yaml"
    path.write_text(router_config_text(objs))
    container = next(containers(one(objs, "Deployment", "router")))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZIPKV_")}
    env |= container_env(container, objs, EXISTING_SECRETS)
    done = subprocess.run(
        [sys.executable, "-m", "zipkv.controlplane.config", "--check", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "state redis" in done.stdout


def test_router_rejects_a_misspelled_setting(tmp_path: Path) -> None:
    """The chart passes router.config through; a typo inside a section fails the router's validation."""
    objs = render({"router": {"config": {"slo": {"ttft_msec": 100}}}})
    with pytest.raises(ConfigError, match="ttft_msec"):
        router_config(objs, tmp_path)


def test_workers_are_wired_to_the_router() -> None:
    objs = render()
    app = serve_config(objs)["applications"]
    assert len(app) == 1 and app[0]["import_path"] == "zipkv.worker.serve:app_builder"
    args = app[0]["args"]
    service = one(objs, "Service", "router-report")
    report_port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc-report")
    assert args["router"] == f"{service['metadata']['name']}.{NAMESPACE}.svc:{report_port}"
    # Reports must reach a router before it is ready (it is ready once a worker reported): published
    # while not ready, else the report Service has no endpoints and nothing ever becomes ready.
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert args["engine"] == "sglang"
    # The token travels through the Secret only, never in the RayService (readable by more people).
    token = container_env(next(containers(one(objs, "Deployment", "router"))), objs)
    assert token["ZIPKV_SECURITY__REPORT_TOKEN"] not in yaml.safe_dump(one(objs, "RayService"))
    worker_group = one(objs, "RayService")["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    limits = worker_group["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert int(limits["nvidia.com/gpu"]) >= args["gpus_per_replica"] >= 1


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_router_pods_are_hardened(name: str) -> None:
    objs = render(VALUE_SETS[name])
    pod = one(objs, "Deployment", "router")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
    container = pod["containers"][0]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
    for redis in find(objs, "StatefulSet", "redis"):
        redis_sc = redis["spec"]["template"]["spec"]["containers"][0]["securityContext"]
        assert redis_sc["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_notes_tell_how_to_reach_the_endpoint(name: str) -> None:
    values = VALUE_SETS[name]
    text = notes(values)
    model = (values.get("model") or {}).get("name", "llama-3.1-8b-instruct")
    assert "/v1/chat/completions" in text and f'"model": "{model}"' in text
    service = one(render(values), "Service", "router")
    assert service["metadata"]["name"] in text


def test_kubernetes_validation_catches_mistakes() -> None:
    """The built-in check is strict too: an unknown field and a wrong type are rejected."""
    good = one(render(), "Deployment", "router")
    typo = yaml.safe_load(yaml.safe_dump(good))
    typo["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    wrong_type = yaml.safe_load(yaml.safe_dump(good))
    wrong_type["spec"]["replicas"] = "two"
    for bad in (typo, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError, match=r"readinesProbe|two"):
            validate_builtin(bad, KUBE_VERSIONS[-1])


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_serve_args_are_accepted_by_the_worker(name: str, tmp_path: Path) -> None:
    """The worker's own argument parser (zipkv.worker.serve) takes the rendered Serve args as they are.

    Only the checkpoint folder is swapped for one that exists here: the worker checks it is a directory.
    """
    from zipkv.worker.serve import settings_from_args

    objs = render(VALUE_SETS[name])
    app = serve_config(objs)["applications"][0]
    module, _, attr = app["import_path"].partition(":")
    assert (module, attr) == ("zipkv.worker.serve", "app_builder")
    args = dict(app["args"]) | {"model": str(tmp_path)}
    settings, replicas, gpus, cpus = settings_from_args(args)
    values = VALUE_SETS[name].get("workers", {})
    assert replicas == values.get("numReplicas", 1) and gpus == values.get("gpusPerReplica", 1) and cpus >= 1
    assert settings.engine == "sglang" and settings.compression is True
    assert (
        settings.router_address == app["args"]["router"] and settings.model_name == app["args"]["model_name"]
    )
    assert settings.report_token == ""  # it comes from ZIPKV_REPORT_TOKEN in the pod, never an argument


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_serve_config_matches_ray_serve_schema(name: str) -> None:
    """serveConfigV2 is what `serve deploy` takes: check it with Ray Serve's own config schema."""
    from ray.serve.schema import ServeDeploySchema

    parsed = ServeDeploySchema.model_validate(serve_config(render(VALUE_SETS[name])))
    assert [app.name for app in parsed.applications] == ["zipkv"]


def test_packaged_chart_renders_the_same_objects(tmp_path: Path) -> None:
    """`helm package` output (what users install from a repository) holds every template and the schema."""
    archive = helm_python.package(CHART_DIR, destination=tmp_path)
    with helm_python.Chart.load(archive) as packaged:
        assert packaged.schema is not None
        files = packaged.render(values={}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    kinds = sorted(
        (d["kind"], d["metadata"]["name"])
        for path, text in files.items()
        if not path.endswith("NOTES.txt")
        for d in yaml.safe_load_all(text)
        if d
    )
    assert kinds == sorted((o["kind"], o["metadata"]["name"]) for o in render())
