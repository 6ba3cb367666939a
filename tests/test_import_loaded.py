"""The import rules of docs/design.md as a real import sees them: each package's modules imported in a fresh
interpreter, which then lists sys.modules. The static side (every import statement, the import graph) is
test_import_rules.py; this side catches what a scan cannot see, such as a dependency's own imports.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _loaded_after_import(modules: list[str]) -> set[str]:
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "tops = {n.split('.')[0] for n in sys.modules}\n"
        "own = {n for n in sys.modules if n.startswith(('zipkv.', 'bench.'))}\n"
        "print(json.dumps(sorted(tops | own)))\n"
    )
    out = subprocess.run(  # from the repo root, where bench/ imports as `bench`
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def _modules(folder: str, skip: tuple[str, ...] = ()) -> list[str]:
    """Every module under ``folder`` (subpackages included), but those under the folders in ``skip``."""
    found = []
    for p in sorted((ROOT / folder).rglob("*.py")):
        rel = p.relative_to(ROOT)
        if p.stem in ("__init__", "__main__") or rel.as_posix().startswith(tuple(f + "/" for f in skip)):
            continue
        prefix = [] if rel.parts[0] == "bench" else ["zipkv"]
        found.append(".".join([*prefix, *rel.with_suffix("").parts]))
    return found


def test_router_loads_no_torch_triton_sglang_ray() -> None:
    loaded = _loaded_after_import(_modules("controlplane"))
    assert "zipkv.controlplane.app" in loaded  # the import really happened
    assert loaded & {"torch", "triton", "sglang", "ray", "transformers"} == set()
    assert not any(m.startswith(("zipkv.kernels", "zipkv.allocator", "zipkv.worker")) for m in loaded)


def test_router_bench_loads_no_torch() -> None:
    loaded = _loaded_after_import(_modules("bench/router"))
    assert "bench.router.bench_router" in loaded  # the import really happened (zipkv's come in its functions)
    assert loaded & {"torch", "triton", "sglang", "ray", "transformers"} == set()


def test_kernels_and_allocator_load_no_serving_stack() -> None:
    loaded = _loaded_after_import(_modules("kernels", skip=("kernels/study",)) + _modules("allocator"))
    assert "torch" in loaded and "zipkv.kernels.attention.hopper.launch" in loaded
    assert loaded & {"sglang", "ray", "transformers", "fastapi", "grpc"} == set()
    assert not any(m.startswith(("zipkv.worker", "zipkv.controlplane")) for m in loaded)


def test_the_page_format_is_pure_python() -> None:
    loaded = _loaded_after_import(_modules("kernels/format"))
    assert "zipkv.kernels.format.layout" in loaded and "zipkv.kernels.format.layout_v3" in loaded
    assert loaded & {"torch", "triton", "numpy"} == set()
