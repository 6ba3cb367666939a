"""Render, lint and validate the zipkv Helm chart with the real Helm engine (helm-python-sdk's libhelm).

Functions for tests/helm/: render a values set into Kubernetes objects, validate them against the
Kubernetes OpenAPI schemas (kubernetes-validate, offline) and the KubeRay RayService CRD (the file
ray.io_rayservices.yaml in the folder that $ZIPKV_KUBERAY_CRDS names: KubeRay's
ray-operator/config/crd/bases; the CRD checks skip without it), and rebuild a container's environment
the way the kubelet would (Secret references resolved, $(VAR) expanded) so the router config can be
loaded as the pod would.
"""

from __future__ import annotations

import base64
import copy
import functools
import os
import re
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import yaml

from zipkv.controlplane.config import RouterConfig, load_config

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "helm" / "zipkv"
EXAMPLES = sorted((CHART_DIR / "examples").glob("*.yaml"))
# KubeRay's CRDs are not copied into the repository: the environment names the folder that holds them.
KUBERAY_CRDS_ENV = "ZIPKV_KUBERAY_CRDS"
KUBERAY_CRDS = Path(os.environ.get(KUBERAY_CRDS_ENV, "") or "/nonexistent")
RAYSERVICE_CRD = KUBERAY_CRDS / "ray.io_rayservices.yaml"
# The oldest Kubernetes the chart declares (Chart.yaml kubeVersion) and the newest schema set shipped.
KUBE_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
RELEASE = "zipkv"
NAMESPACE = "llm"

Obj = dict[str, Any]


@functools.cache
def chart() -> helm_python.Chart:
    return helm_python.Chart.load(CHART_DIR)


def example_values(path: Path) -> dict[str, Any]:
    """An examples/ values file, parsed by Helm's own YAML reader (as `helm install -f` does)."""
    return helm_python.values_from_yaml(path.read_text())


def render_files(values: Mapping[str, Any] | None = None, release: str = RELEASE) -> dict[str, str]:
    """Template path -> rendered text; raises helm_python.HelmError on schema or template errors."""
    return chart().render(values=dict(values or {}), name=release, namespace=NAMESPACE, is_install=True)


def render(values: Mapping[str, Any] | None = None, release: str = RELEASE) -> list[Obj]:
    """Every Kubernetes object the chart renders for `values` (NOTES.txt left out)."""
    objs: list[Obj] = []
    for path, text in sorted(render_files(values, release).items()):
        if path.endswith("NOTES.txt"):
            continue
        objs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objs


def notes(values: Mapping[str, Any] | None = None) -> str:
    return next(t for p, t in render_files(values).items() if p.endswith("NOTES.txt"))


def lint(values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return helm_python.lint(CHART_DIR, dict(values or {}), strict=True, kube_version=f"v{KUBE_VERSIONS[0]}")


def find(objs: list[Obj], kind: str, component: str | None = None) -> list[Obj]:
    """Objects of `kind`, optionally only those labelled app.kubernetes.io/component=`component`."""
    out = [o for o in objs if o["kind"] == kind]
    if component is not None:
        out = [o for o in out if o["metadata"]["labels"].get("app.kubernetes.io/component") == component]
    return out


def one(objs: list[Obj], kind: str, component: str | None = None) -> Obj:
    found = find(objs, kind, component)
    assert len(found) == 1, f"expected one {kind} ({component}), found {len(found)}"
    return found[0]


def containers(obj: Obj) -> Iterator[Obj]:
    """Every container of a workload, including the Ray head and worker groups of a RayService."""
    if obj["kind"] == "RayService":
        cluster = obj["spec"]["rayClusterConfig"]
        templates = [cluster["headGroupSpec"]["template"]]
        templates += [g["template"] for g in cluster.get("workerGroupSpecs", [])]
    else:
        templates = [obj["spec"]["template"]]
    for template in templates:
        yield from template["spec"]["containers"]


# ---- schema validation -------------------------------------------------------------------------


def validate_builtin(obj: Obj, version: str) -> None:
    """Strict validation (unknown fields are errors) against the Kubernetes `version` schemas."""
    kubernetes_validate.validate(obj, version, strict=True)


def _strict(schema: Any) -> Any:
    """A CRD's structural schema with unknown fields forbidden, as `kubectl --validate=strict` does.

    Objects that list properties and neither allow extra keys (additionalProperties) nor opt out with
    x-kubernetes-preserve-unknown-fields get additionalProperties: false. Without this a misspelled
    field would pass validation and be pruned silently by the API server.
    """
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def rayservice_validator() -> jsonschema.protocols.Validator:
    crd = yaml.load(RAYSERVICE_CRD.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = _strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    return cls(schema)


DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# KubeRay appends "-" + 5 characters for its RayCluster and "-serve-svc" to that: 63 - 10 - 6.
KUBERAY_MAX_RAYSERVICE_NAME = 47


def validate_rayservice(obj: Obj) -> None:
    """The RayService against the KubeRay v1 CRD schema (strict), plus KubeRay's own name rules."""
    assert obj["apiVersion"] == "ray.io/v1"
    errors = sorted(rayservice_validator().iter_errors(obj), key=lambda e: list(e.absolute_path))
    assert not errors, "RayService does not match the CRD schema:\n" + "\n".join(
        f"  {'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:20]
    )
    name = obj["metadata"]["name"]
    assert DNS_1035_LABEL.match(name), f"RayService name {name!r} is not a DNS-1035 label"
    assert len(name) <= KUBERAY_MAX_RAYSERVICE_NAME, f"KubeRay refuses RayService names over 47: {name!r}"
    _kuberay_cluster_rules(obj["spec"]["rayClusterConfig"])


def _kuberay_cluster_rules(spec: Obj) -> None:
    """The KubeRay operator's own checks of a cluster spec that a schema cannot express
    (ray-operator/controllers/ray/utils/validation.go: ValidateRayClusterSpec)."""
    head = spec["headGroupSpec"]
    assert head["template"]["spec"]["containers"], "headGroupSpec needs a container"
    groups = spec.get("workerGroupSpecs", [])
    assert len({g["groupName"] for g in groups}) == len(groups), "worker group names must be unique"
    autoscaling = spec.get("enableInTreeAutoscaling", False)
    for group in [head, *groups]:
        params = group.get("rayStartParams", {})
        assert all(isinstance(v, str) for v in params.values()), f"rayStartParams must be strings: {params}"
        assert not (
            params.keys() & {"num-cpus", "num-gpus", "memory", "resources"} and group.get("resources")
        ), "resources set both in rayStartParams and in resources"
    for group in groups:
        assert group["template"]["spec"]["containers"], f"worker group {group['groupName']} needs a container"
        if not autoscaling:
            assert "minReplicas" in group and "maxReplicas" in group, (
                "min/maxReplicas needed without autoscaling"
            )
            assert group["minReplicas"] <= group.get("replicas", group["minReplicas"]) <= group["maxReplicas"]
    head_env = {e["name"] for e in head["template"]["spec"]["containers"][0].get("env", [])}
    # These would switch on GCS fault tolerance implicitly, which KubeRay refuses without its options.
    assert not head_env & {"RAY_REDIS_ADDRESS", "REDIS_USERNAME"}, head_env


# ---- the environment a container would see -----------------------------------------------------


def _secret_value(objs: list[Obj], extra: Mapping[str, Mapping[str, str]], name: str, key: str) -> str | None:
    for secret in find(objs, "Secret"):
        if secret["metadata"]["name"] == name:
            data = secret.get("data", {})
            return base64.b64decode(data[key]).decode() if key in data else None
    if name in extra:
        return extra[name].get(key)
    raise AssertionError(f"Secret {name!r} is neither rendered nor given as an existing Secret")


def container_env(
    container: Obj, objs: list[Obj], existing_secrets: Mapping[str, Mapping[str, str]] | None = None
) -> dict[str, str]:
    """The container's environment as the kubelet builds it: Secret keys resolved, $(VAR) expanded.

    `existing_secrets` stands in for Secrets the user creates before installing ({name: {key: value}}).
    An optional reference to a missing key leaves the variable unset, as Kubernetes does.
    """
    extra = existing_secrets or {}
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            # Kubernetes expands $(NAME) for variables defined earlier in the list; $$ escapes.
            value = re.sub(
                r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), str(var["value"])
            )
            env[var["name"]] = value
            continue
        source = var["valueFrom"]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            found = _secret_value(objs, extra, ref["name"], ref["key"])
            if found is None:
                assert ref.get("optional"), f"{var['name']}: Secret {ref['name']} lacks key {ref['key']}"
                continue
            env[var["name"]] = found
        elif "fieldRef" in source:
            env[var["name"]] = f"<{source['fieldRef']['fieldPath']}>"
        else:
            raise AssertionError(f"{var['name']}: unexpected env source {source}")
    return env


def free_port() -> int:
    """A free TCP port on loopback (bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def router_config_text(objs: list[Obj]) -> str:
    return str(one(objs, "ConfigMap", "router")["data"]["router.yaml"])


def router_container(objs: list[Obj]) -> Obj:
    return next(containers(one(objs, "Deployment", "router")))


def load_router_config(objs: list[Obj], tmp_path: Path, secrets: Any = None) -> RouterConfig:
    """The router config the pod would load: its ConfigMap under its container's environment."""
    path = tmp_path / "router.yaml"
    path.write_text(router_config_text(objs))
    return load_config(str(path), container_env(router_container(objs), objs, secrets))


def serve_config(objs: list[Obj]) -> dict[str, Any]:
    text = one(objs, "RayService")["spec"]["serveConfigV2"]
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded
