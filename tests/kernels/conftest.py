"""Kernel tests run the Triton kernels compiled on a CUDA GPU and under Triton's CPU interpreter otherwise.

The interpreter is chosen when ``triton.jit`` decorates a function, so the variable must be set before
any test module imports ``zipkv.kernels.codec.pages``: this conftest is loaded before the modules beside it.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def device() -> str:
    """Where the kernels under test run: the GPU when there is one, else the CPU interpreter."""
    return "cuda" if torch.cuda.is_available() else "cpu"
