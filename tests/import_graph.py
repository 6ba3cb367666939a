"""zipkv's module import graph, read statically, and its loops (for tests/test_import_rules.py).

Every import statement counts: at module level, inside functions and under ``if TYPE_CHECKING:``. An import
inside a function still makes one module depend on the other, and one under TYPE_CHECKING ties the two
modules' types together; a loop through either is a loop in the design even when Python would run it, so
neither may be used to dodge one. Not an edge: the implicit import of a module's parent package, which
Python does for every submodule.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path


def module_name(root: Path, path: Path, package_dirs: dict[str, str]) -> str:
    """``zipkv.<package>.<...>`` of a file under one of ``package_dirs`` (folder -> package name)."""
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([package_dirs[parts[0]], *parts[1:]])


def modules(root: Path, package_dirs: dict[str, str]) -> dict[str, Path]:
    """Every module of the packages (generated protobuf code aside), by dotted name."""
    found = {}
    for folder in package_dirs:
        for path in sorted((root / folder).rglob("*.py")):
            if not path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                found[module_name(root, path, package_dirs)] = path
    return found


def _targets(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The known modules that ``path`` (module ``name``) imports."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for alias in node.names:
                sub = f"{mod}.{alias.name}"
                out.add(sub if sub in known else mod)  # `from pkg import module` names the module
    return {t for t in out if t in known and t != name}


def graph(root: Path, package_dirs: dict[str, str]) -> dict[str, set[str]]:
    known = modules(root, package_dirs)
    return {name: _targets(name, path, known) for name, path in known.items()}


def loops(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(iter(children), None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)
