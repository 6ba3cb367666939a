"""The image Dockerfiles agree with the repository and the chart (no image is built here: no Docker).

The router image must install every third-party distribution the control plane imports and nothing
that pulls torch; both images must run as the users the chart's security contexts name.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from chart_render import CHART_DIR, REPO

IMAGES = REPO / "helm" / "images"
ROUTER = IMAGES / "router.Dockerfile"
WORKER = IMAGES / "worker.Dockerfile"
GPU_ONLY = {"torch", "triton", "ray", "sglang", "transformers"}


def _name(requirement: str) -> str:
    """The normalized distribution name of a requirement string ("redis>=5.0" -> "redis")."""
    base = re.split(r"[\s<>=!~;\[]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", base).lower()


def _router_requirements() -> set[str]:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {_name(r) for r in extras["controlplane"]}
    # Packages the Dockerfile adds on top of the extra (quoted requirement strings on `pip install`).
    names |= {_name(r) for r in re.findall(r'"([A-Za-z0-9_.-]+[<>=~!][^"]*)"', ROUTER.read_text())}
    return names


def _third_party_imports(folder: Path) -> set[str]:
    mods: set[str] = set()
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                mods |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods.add(node.module.split(".")[0])
    return {m for m in mods if m not in sys.stdlib_module_names and m not in {"zipkv", "__future__"}}


@pytest.mark.parametrize("dockerfile", [ROUTER, WORKER], ids=["router", "worker"])
def test_copied_sources_exist(dockerfile: Path) -> None:
    sources = re.findall(r"^COPY\s+(?!--from)(.+?)\s+\S+$", dockerfile.read_text(), flags=re.M)
    assert sources, f"{dockerfile.name} copies nothing"
    for line in sources:
        for src in line.split():
            assert (REPO / src).exists(), f"{dockerfile.name}: COPY {src} does not exist in the repository"


@pytest.mark.parametrize("dockerfile", [ROUTER, WORKER], ids=["router", "worker"])
def test_every_package_folder_is_copied(dockerfile: Path) -> None:
    """The wheel build needs every folder pyproject.toml maps a package from."""
    folders = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
    )
    copied = {
        s.rstrip("/")
        for s in re.findall(r"^COPY\s+(?!--from)(\S+)/\s+\S+$", dockerfile.read_text(), flags=re.M)
    }
    assert folders <= copied, f"{dockerfile.name} does not copy {sorted(folders - copied)}"


def test_router_image_installs_what_the_control_plane_imports() -> None:
    installed = _router_requirements()
    by_module = importlib.metadata.packages_distributions()
    missing = []
    for module in sorted(_third_party_imports(REPO / "controlplane")):
        dists = {_name(d) for d in by_module.get(module, [module])}
        if not dists & installed:
            missing.append(f"{module} ({', '.join(sorted(dists))})")
    assert missing == [], f"the router image lacks distributions for: {missing}"


def test_router_image_has_no_gpu_stack() -> None:
    assert _router_requirements().isdisjoint(GPU_ONLY)
    assert "torch must not be in the router image" in ROUTER.read_text()


def _user(dockerfile: Path) -> int:
    users = re.findall(r"^USER\s+(\d+)", dockerfile.read_text(), flags=re.M)
    assert users, f"{dockerfile.name} sets no numeric USER"
    return int(users[-1])


def test_images_run_as_the_users_the_chart_names() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert _user(ROUTER) == values["router"]["podSecurityContext"]["runAsUser"]
    assert _user(WORKER) == values["workers"]["podSecurityContext"]["runAsUser"]


def test_router_entrypoint_matches_the_chart() -> None:
    text = ROUTER.read_text()
    assert 'ENTRYPOINT ["python", "-m", "zipkv.controlplane"]' in text
    assert 'CMD ["--config", "/etc/zipkv/router.yaml"]' in text


def test_worker_image_pins_the_tested_sglang() -> None:
    pins = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["sglang"]
    pinned = next(r.split("==")[1] for r in pins if _name(r) == "sglang")
    assert f"ARG SGLANG_VERSION={pinned}" in WORKER.read_text()
    assert re.search(r"^FROM \$\{CUDA_IMAGE\}", WORKER.read_text(), flags=re.M)
    assert re.search(r"^ARG CUDA_IMAGE=nvidia/cuda:\S+-devel-", WORKER.read_text(), flags=re.M)
