"""The size rules of docs/design.md: no module over 300 lines, no function over 60.

A file that grows past them has a second responsibility to move out (kernels included: a Triton or Gluon
kernel's steps are @jit functions the compiler inlines). It walks
the project's code: every package folder pyproject.toml installs, and bench/. Not tests/ (a test file is
split by topic, not by size) and not generated code (protos/*_pb2*.py). Exceptions are listed below, each
with its reason; one that no longer needs its exception fails the test, so the list only shrinks.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 60
# The package folders pyproject.toml installs, and the benchmarks (project code, not installed).
FOLDERS = sorted(
    {
        *tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values(),
        "bench",
    }
)
GENERATED = ("_pb2.py", "_pb2_grpc.py")  # protos/generate.py writes them

# path -> why it may be longer than MAX_MODULE_LINES.
MODULE_EXCEPTIONS: dict[str, str] = {}
# "path:function" -> why it may be longer than MAX_FUNCTION_LINES.
FUNCTION_EXCEPTIONS: dict[str, str] = {}


def _modules(root: Path, folders: list[str]) -> list[Path]:
    return sorted(
        p for folder in folders for p in (root / folder).rglob("*.py") if not p.name.endswith(GENERATED)
    )


def oversized(root: Path = ROOT, folders: list[str] = FOLDERS) -> tuple[dict[str, int], dict[str, int]]:
    """({module path: lines} over MAX_MODULE_LINES, {"path:function": lines} over MAX_FUNCTION_LINES).
    A function's lines run from its ``def`` to its last line (docstring included, decorators not); nested
    functions and methods count on their own, under their own name."""
    modules, functions = {}, {}
    for path in _modules(root, folders):
        rel = path.relative_to(root).as_posix()
        text = path.read_text()
        if (lines := len(text.splitlines())) > MAX_MODULE_LINES:
            modules[rel] = lines
        for node in ast.walk(ast.parse(text, rel)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    functions[f"{rel}:{node.name}"] = length
    return modules, functions


def test_modules_and_functions_stay_under_their_limits() -> None:
    modules, functions = oversized()
    new_modules = {m: n for m, n in modules.items() if m not in MODULE_EXCEPTIONS}
    new_functions = {f: n for f, n in functions.items() if f not in FUNCTION_EXCEPTIONS}
    assert new_modules == {}, f"modules over {MAX_MODULE_LINES} lines: split along a second responsibility"
    assert new_functions == {}, f"functions over {MAX_FUNCTION_LINES} lines: split into named steps"


def test_every_exception_is_still_needed() -> None:
    modules, functions = oversized()
    stale = sorted(set(MODULE_EXCEPTIONS) - set(modules)) + sorted(set(FUNCTION_EXCEPTIONS) - set(functions))
    assert stale == [], f"now within the limits: remove {stale} from this file's exceptions"


def test_the_walk_covers_the_project_and_skips_tests_and_generated_code() -> None:
    walked = {p.relative_to(ROOT).parts[0] for p in _modules(ROOT, FOLDERS)}
    assert {"controlplane", "worker", "kernels", "allocator", "stack", "bench"} <= walked
    assert "tests" not in walked
    assert not any(p.name.endswith(GENERATED) for p in _modules(ROOT, FOLDERS))


@pytest.mark.parametrize("nested", [False, True], ids=["top-level", "nested"])
def test_the_scan_catches_a_long_module_and_a_long_function(tmp_path: Path, nested: bool) -> None:
    (tmp_path / "pkg").mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))  # def line + this: one too many
    long_function = (
        f"def outer():\n    def long():\n{body.replace('    ', '        ')}"
        if nested
        else f"def long():\n{body}"
    )
    (tmp_path / "pkg" / "long_function.py").write_text(long_function)
    (tmp_path / "pkg" / "fits.py").write_text("def short():\n" + "    pass\n" * (MAX_FUNCTION_LINES - 1))
    (tmp_path / "pkg" / "long_module.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (tmp_path / "pkg" / "big_pb2.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))  # generated: skipped
    modules, functions = oversized(tmp_path, ["pkg"])
    assert modules == {"pkg/long_module.py": MAX_MODULE_LINES + 1}
    expected = {"pkg/long_function.py:long": MAX_FUNCTION_LINES + 1}
    if nested:
        expected["pkg/long_function.py:outer"] = MAX_FUNCTION_LINES + 2
    assert functions == expected
