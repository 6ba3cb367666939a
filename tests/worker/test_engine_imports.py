"""The code SGLang's scheduler process imports (zipkv's allocator and its telemetry) starts without
opentelemetry: the SGLang site on a GPU machine may not hold it, and a missing tracer must mean untraced
serving, not a scheduler that dies at import (as it did, ModuleNotFoundError in the plugin's backend)."""

from __future__ import annotations

import subprocess
import sys

BLOCK_OTEL = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
sys.meta_path.insert(0, Block())
"""


def _import_without_otel(module: str) -> subprocess.CompletedProcess[str]:
    code = BLOCK_OTEL + f"import {module}\nprint('imported')\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_scheduler_side_modules_import_without_opentelemetry() -> None:
    for module in ("zipkv.worker.engines.sglang.telemetry", "zipkv.worker.engines.sglang.allocator"):
        done = _import_without_otel(module)
        assert done.returncode == 0 and "imported" in done.stdout, (module, done.stderr[-2000:])


def test_the_blocker_blocks() -> None:
    # Without this, a blocker that never fired would make the test above pass vacuously.
    done = _import_without_otel("zipkv.worker.telemetry")
    assert done.returncode != 0 and "blocked by the test" in done.stderr
