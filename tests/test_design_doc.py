"""docs/design.md matches the tree: the files it names exist, and it names every package and bench folder."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "design.md").read_text()


def test_every_path_it_names_exists() -> None:
    """Paths from a top-level folder (``allocator/ledger.py``), and the worker's ``engines/...``."""
    tops = {p.name for p in ROOT.iterdir() if p.is_dir()}
    paths = set(re.findall(r"(?<![\w./*])((?:\w+/)+[\w.]*)(?![\w*])", DOC))
    named = {("worker/" + p if p.startswith("engines/") else p) for p in paths}
    missing = sorted(p for p in named if p.split("/")[0] in tops | {"worker"} and not (ROOT / p).exists())
    assert len(named) > 20 and missing == []


def test_it_names_every_package_folder() -> None:
    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ].values()
    nested = {
        p.parent.relative_to(ROOT).as_posix()
        for folder in folders
        for p in (ROOT / folder).rglob("__init__.py")
        if p.parent != ROOT / folder
    }
    for folder in sorted(set(folders) | nested):
        name = folder.split("/", 1)[1] if "/" in folder else folder
        assert f"{name}/" in DOC, f"docs/design.md does not show {folder}/"


def test_it_names_every_bench_folder() -> None:
    """bench/ is no installed package, but its folders are on the map and in the rules by their full name."""
    folders = sorted(p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "bench").glob("*/__init__.py"))
    assert folders and "bench/" in DOC
    for folder in folders:
        assert f"`{folder}/`" in DOC, f"docs/design.md does not name {folder}/"
