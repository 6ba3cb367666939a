"""Which third-party modules a module's import needs and this Python lacks, all of them in one run.

    python -m bench.serving.import_probe sglang.srt.entrypoints.http_server

A plain import stops at the first missing module, so on the GPU machine (no package index) each missing one
cost a device call. Here the import runs in a fresh interpreter; when it raises ModuleNotFoundError, that
module is recorded and the next run gives it a stand-in (any attribute is a new empty class), until the
import succeeds or fails some other way. Only modules whose absence breaks the import are listed: an
optional one (a package's `try: import brotlicffi except ImportError`, Windows-only `_winapi`) is caught by
the package itself and never raises, so it is never stood in for. The exit status is 1 when anything was
missing, with the list, so a run can fail in seconds and the carry can be completed at once
(scripts/build_sglang_carry.sh). A stand-in can make a later line fail in a way the real module would not;
that error is printed too.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import subprocess
import sys
import traceback
import types
from collections.abc import Sequence
from typing import Any

MAX_RUNS = 30  # a cap on re-imports: each names one more missing module


class _StandIn(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on sys.meta_path: stand-ins for the named top-level modules and their submodules only."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = set(names)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname.split(".")[0] not in self.names:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _StandIn(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def import_once(module: str, stand_ins: Sequence[str]) -> dict[str, str]:
    """In this interpreter: {"missing": name} | {"error": traceback} | {} (it imported)."""
    sys.meta_path.append(_StandInFinder(stand_ins))
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        name = (exc.name or "").split(".")[0]
        if name and name not in stand_ins:
            return {"missing": name}
        return {"error": traceback.format_exc(limit=-3)}
    except Exception:
        return {"error": traceback.format_exc(limit=-3)}
    return {}


def probe(module: str) -> tuple[list[str], str | None]:
    """(missing top-level modules, the import's own error or None), each try in a fresh interpreter."""
    missing: list[str] = []
    # The child sees this interpreter's sys.path, so it finds what an import here would find.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    for _ in range(MAX_RUNS):
        command = [sys.executable, __file__, "--child", module]
        child = subprocess.run(
            command + (["--stand-in", ",".join(missing)] if missing else []),
            capture_output=True,
            text=True,
            check=False,
            env=env,
        )
        lines = child.stdout.strip().splitlines()
        if not lines:
            return missing, f"the probe's interpreter exited {child.returncode}:\n{child.stderr[-2000:]}"
        result = json.loads(lines[-1])
        if "missing" not in result:
            return missing, result.get("error")
        missing.append(result["missing"])
    return missing, f"still failing after {MAX_RUNS} imports"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "modules", nargs="+", metavar="MODULE", help="a module to import, e.g. sglang.launch_server"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stand-in", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:  # one import in this interpreter, its outcome as the last line of stdout
        print(json.dumps(import_once(args.modules[0], [n for n in args.stand_in.split(",") if n])))
        return 0
    failed = False
    for module in args.modules:
        missing, error = probe(module)
        if missing:
            print(f"[import_probe] {module}: missing {', '.join(missing)}: add them to the carry")
        if error:
            print(f"[import_probe] {module}: import failed:\n{error}")
        failed |= bool(missing or error)
        if not (missing or error):
            print(f"[import_probe] {module}: imports")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
