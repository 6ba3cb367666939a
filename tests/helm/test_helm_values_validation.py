"""Which values and release names the chart accepts: values.schema.json rejects malformed values and
covers exactly the values that exist, values.yaml documents every value, the templates refuse value
combinations that cannot work, and every release name Helm allows gives valid object names or says which
value to set."""

from __future__ import annotations

import json
import re
from typing import Any

import helm_python
import pytest
import yaml
from chart_render import (
    CHART_DIR,
    DNS_1035_LABEL,
    KUBE_VERSIONS,
    KUBERAY_MAX_RAYSERVICE_NAME,
    one,
    render,
    validate_builtin,
)

from zipkv.controlplane.config import RouterConfig

# ---- value combinations the templates refuse ----------------------------------------------------
# Each passes the schema on its own; the template fails with a message naming the value to change.


def test_several_routers_without_redis_fail_with_a_clear_message() -> None:
    with pytest.raises(helm_python.HelmRenderError, match="needs shared state"):
        render({"router": {"replicas": 2}, "redis": {"enabled": False}})
    with pytest.raises(helm_python.HelmRenderError, match="needs shared state"):
        render({"router": {"replicas": 1, "autoscaling": {"enabled": True}}, "redis": {"enabled": False}})


def test_a_replica_larger_than_a_pod_is_refused() -> None:
    with pytest.raises(helm_python.HelmRenderError, match="gpusPerReplica"):
        render({"workers": {"gpusPerReplica": 2, "gpusPerPod": 1}})


def test_pods_need_cpus_for_their_replicas() -> None:
    with pytest.raises(helm_python.HelmRenderError, match="cpusPerReplica"):
        render({"workers": {"gpusPerPod": 4, "cpusPerReplica": 4, "gpuWorker": {"cpu": "8"}}})


def test_external_redis_with_auth_needs_a_secret() -> None:
    with pytest.raises(helm_python.HelmRenderError, match="existingSecret"):
        render({"redis": {"enabled": False, "external": {"url": "redis://r:6379/0"}}})


def test_otel_on_needs_an_endpoint() -> None:
    with pytest.raises(helm_python.HelmRenderError, match=r"otel\.endpoint"):
        render({"otel": {"enabled": True}})


# ---- names ------------------------------------------------------------------------------------


def test_the_longest_release_name_gives_valid_object_names() -> None:
    """Helm allows 53-character release names; every name must still fit Kubernetes and KubeRay."""
    objs = render(release="r" * 53)
    for obj in objs:
        name = obj["metadata"]["name"]
        assert DNS_1035_LABEL.match(name) and len(name) <= 63, name
    assert len(one(objs, "RayService")["metadata"]["name"]) <= KUBERAY_MAX_RAYSERVICE_NAME
    for obj in objs:
        if obj["kind"] != "RayService":
            validate_builtin(obj, KUBE_VERSIONS[-1])


def test_a_release_name_starting_with_a_digit_needs_an_override() -> None:
    with pytest.raises(helm_python.HelmRenderError, match="fullnameOverride"):
        render(release="1st")
    assert one(render({"fullnameOverride": "first"}, release="1st"), "RayService")["metadata"]["name"] == (
        "first-workers"
    )


# ---- the values schema and the comments ---------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"router": {"replicas": 0}}, "/router/replicas"),
        ({"workers": {"engine": "vllm"}}, "/workers/engine"),
        ({"routr": {}}, "routr"),
        ({"router": {"config": {"sloo": {}}}}, "sloo"),
        ({"otel": {"sampler": "sometimes"}}, "/otel/sampler"),
        ({"redis": {"external": {"url": "redis://user:pw@host:6379"}}}, "/redis/external/url"),
    ],
)
def test_schema_rejects_bad_values(values: dict[str, Any], where: str) -> None:
    with pytest.raises(helm_python.HelmValuesError, match=re.escape(where)):
        render(values)


def _leaf_paths(tree: Any, prefix: str = "") -> set[str]:
    """Paths of the values a user sets; free-form maps (resources, volume...) count as one value."""
    if not isinstance(tree, dict) or not tree:
        return {prefix}
    return set().union(*(_leaf_paths(v, f"{prefix}.{k}" if prefix else k) for k, v in tree.items()))


def _schema_paths(schema: dict[str, Any], prefix: str = "") -> set[str]:
    props = schema.get("properties")
    if not props or schema.get("additionalProperties") is not False:
        return {prefix}
    return set().union(*(_schema_paths(s, f"{prefix}.{k}" if prefix else k) for k, s in props.items()))


def test_schema_covers_every_value() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    documented = _schema_paths(schema)
    for path in _leaf_paths(values):
        # A value is covered when the schema names it or a free-form map above it.
        parts = path.split(".")
        above = any(".".join(parts[:i]) in documented for i in range(len(parts), 0, -1))
        below = any(d.startswith(path + ".") for d in documented)  # an empty map the schema details
        assert above or below, f"values.yaml has {path}, the schema does not"
    # Each strict schema section exists in values.yaml (no stale schema entries), except "global".
    # router.config's sections are optional; test_router_config_sections_match_the_router checks them.
    for path in {d for d in documented if not d.startswith("router.config.")} - {"global"}:
        node: Any = values
        for part in path.split("."):
            if node == {}:  # an empty map by default (e.g. hfTokenSecret: {}) whose keys are optional
                break
            assert isinstance(node, dict) and part in node, f"schema lists {path}, values.yaml lacks it"
            node = node[part]


def test_router_config_sections_match_the_router() -> None:
    """router.config accepts exactly the router's sections that the chart does not own outright."""
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    sections = set(schema["properties"]["router"]["properties"]["config"]["properties"])
    owned = {"models", "grpc", "security"}  # set from model.*, router.grpcPort and the auth Secret
    assert sections == set(RouterConfig.model_fields) - owned


def test_every_value_has_a_comment() -> None:
    """Each key in values.yaml is commented, or sits inside a commented value (e.g. resources:)."""
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()
    documented_at: list[int] = []  # indents of commented keys enclosing the current line
    missing = []
    for i, line in enumerate(lines):
        key = re.match(r"^(\s*)([\w.-]+):", line)
        if not key:
            continue
        indent = len(key[1])
        documented_at = [d for d in documented_at if d < indent]
        previous = lines[i - 1].strip() if i else ""
        section = line.rstrip().endswith(":")  # its children carry the comments
        if previous.startswith("#"):
            documented_at.append(indent)
        elif not documented_at and not section:
            missing.append(line.strip())
    assert missing == [], f"values.yaml keys without a comment: {missing}"
