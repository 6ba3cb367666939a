"""Every bench module imports, and every script answers --help, as `python -m bench.<group>.<script>` runs it
from the repo root. One fresh interpreter runs them all (runpy, as -m does): it is a test of the tree and
the imports, not of what the scripts measure (the other tests here run those)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Importing locust patches the standard library (gevent's monkey patching): it is imported on its own.
LAST = ("bench.router.locustfile",)
# Files that tests write into a temporary tree (tests/test_import_rules.py), named in their assertions.
FIXTURES = {"bench/router/bad.py"}

CHECK = r"""
import contextlib, importlib, io, json, runpy, sys
modules, scripts, last = (json.loads(a) for a in sys.argv[1:4])
failed = {}
for name in modules:
    try:
        importlib.import_module(name)
    except Exception as e:
        failed[name] = f"import: {e!r}"
for name in scripts:
    out = io.StringIO()
    sys.argv = [name, "--help"]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        failed[name] = "--help returned instead of exiting"
    except SystemExit as e:
        if e.code not in (0, None) or "usage:" not in out.getvalue():
            failed[name] = f"--help: exit {e.code}, {out.getvalue()[:300]!r}"
    except Exception as e:
        failed[name] = f"--help: {e!r}"
for name in last:
    try:
        importlib.import_module(name)
    except Exception as e:
        failed[name] = f"import: {e!r}"
print(json.dumps(failed))
"""


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _modules() -> tuple[list[str], list[str]]:
    """(every bench module, those with a command line: a ``__main__`` block)."""
    paths = sorted((ROOT / "bench").rglob("*.py"))
    scripts = [_module(p) for p in paths if 'if __name__ == "__main__":' in p.read_text()]
    return [_module(p) for p in paths], scripts


def test_the_module_list_is_the_tree() -> None:
    modules, scripts = _modules()
    assert {"bench", "bench.paths", "bench.plots", "bench.kernels.bench_decode_hopper"} <= set(modules)
    assert "bench.sim.cluster_sim" in scripts and "bench.sim.sim_worker" not in scripts
    assert set(LAST) <= set(modules)
    assert not list((ROOT / "bench").glob("*/*/*.py")), "bench/ is one level of folders"
    folders = {p.parent for p in (ROOT / "bench").rglob("*.py")}
    assert all((f / "__init__.py").is_file() for f in folders), "a bench folder without __init__.py"


@pytest.mark.slow
def test_every_bench_module_imports_and_every_script_answers_help() -> None:
    modules, scripts = _modules()
    first = [m for m in modules if m not in LAST]
    failed: dict[str, str] = {}
    # LAST in an interpreter of its own: gevent's patching of ssl fails (RecursionError) once another
    # module has imported ssl, and which one does depends on the installed packages, not on bench/.
    for args in ([first, scripts, []], [list(LAST), [], []]):
        done = subprocess.run(
            [sys.executable, "-c", CHECK, *map(json.dumps, args)],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        failed |= json.loads(done.stdout.strip().splitlines()[-1])
    assert failed == {}, "\n".join(f"{k}: {v}" for k, v in failed.items())
    assert len(scripts) >= 25  # every script of the tree was asked, not an empty list


def _text_files() -> list[Path]:
    """The repo's docs, scripts and code, but the records (bench/results/ keeps commands as they ran)."""
    skip = ("bench/results/", "build/")
    return [
        p
        for p in sorted(ROOT.rglob("*"))
        if (p.suffix in (".md", ".sh", ".py", ".toml") or p.name == "Makefile")
        and p.is_file()
        and not any(part.startswith(".") or part.endswith(".egg-info") for part in p.relative_to(ROOT).parts)
        and not p.relative_to(ROOT).as_posix().startswith(skip)
    ]


def test_every_bench_command_and_path_the_repo_names_exists() -> None:
    """Every `python -m bench.<group>.<script>` names a module of the tree, every bench/<group>/<script>.py a
    file: no stale path survives a move."""
    stale = []
    for path in _text_files():
        text = path.read_text(errors="replace")
        rel = path.relative_to(ROOT).as_posix()
        for module in re.findall(r"-m (bench(?:\.\w+)+)", text):
            file = ROOT / (module.replace(".", "/") + ".py")
            if not file.is_file() and not (file.with_suffix("") / "__init__.py").is_file():
                stale.append(f"{rel}: -m {module}")
        for named in re.findall(r"(?<![\w/.-])(bench/[\w/]*\.py)\b", text):
            if not (ROOT / named).is_file() and named not in FIXTURES:
                stale.append(f"{rel}: {named}")
    assert stale == []
