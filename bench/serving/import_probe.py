"""Which third-party modules a module's import needs and this Python lacks, all of them in one run.

    python -m bench.serving.import_probe sglang.srt.entrypoints.http_server

A plain import stops at the first missing module, so on the GPU machine (no package index) each missing one
cost a device call. Here a missing top-level module is recorded and a stand-in (any attribute is a new
empty class) takes its place so the import goes on; the exit status is 1 when anything was missing, with
the list, so a run can fail in seconds and the carry can be completed at once (scripts/build_sglang_carry.sh).
A stand-in can make a later line fail in a way the real module would not; that error is printed too.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import sys
import traceback
import types
from collections.abc import Sequence
from typing import Any


class _StandIn(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})


class _Recorder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on sys.meta_path: asked only for modules no real finder found."""

    def __init__(self) -> None:
        self.missing: list[str] = []

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if "." in fullname:  # a submodule of a stand-in, or a real package's missing optional part
            parent = sys.modules.get(fullname.split(".")[0])
            if not isinstance(parent, _StandIn):
                return None
        elif fullname not in self.missing:
            self.missing.append(fullname)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _StandIn(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def probe(module: str) -> tuple[list[str], str | None]:
    """(missing top-level modules, the import's own error or None)."""
    recorder = _Recorder()
    sys.meta_path.append(recorder)
    try:
        importlib.import_module(module)
        error = None
    except Exception:
        error = traceback.format_exc(limit=-3)
    finally:
        sys.meta_path.remove(recorder)
    return recorder.missing, error


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "modules", nargs="+", metavar="MODULE", help="a module to import, e.g. sglang.launch_server"
    )
    args = parser.parse_args(argv)
    failed = False
    for module in args.modules:
        missing, error = probe(module)
        if missing:
            print(f"[import_probe] {module}: missing {', '.join(missing)}: add them to the carry")
        if error:
            print(f"[import_probe] {module}: import failed even with stand-ins:\n{error}")
        failed |= bool(missing or error)
        if not (missing or error):
            print(f"[import_probe] {module}: imports")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
