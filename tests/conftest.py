"""Shared pytest setup: the `gpu` marker skips without CUDA; Triton kernels run under its CPU interpreter
without CUDA; a real redis-server on loopback."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import free_port, start_redis


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


# Triton picks the interpreter when `triton.jit` decorates a function, i.e. when a kernel module is first
# imported: set it here, before any test folder imports one (tests/worker reaches the kernels too).
if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; run on the GPU machine (docs/benchmarks.md)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A fresh redis-server; yields (url, process) and stops it afterwards."""
    port = free_port()
    proc = start_redis(tmp_path, port)
    yield f"redis://127.0.0.1:{port}/0", proc
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder (tests/smollm2.py), once per run."""
    from smollm2 import smollm2_folder

    return smollm2_folder()
