"""The SGLang engine switch: the SGLang engine where it can run (CUDA, the one supported SGLang
version), else a clear error saying why."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zipkv.worker.engines.sglang.version import SGLANG_VERSION, UnsupportedSGLang, check_sglang_version

if TYPE_CHECKING:
    from zipkv.worker.engine import Engine
    from zipkv.worker.settings import WorkerSettings


class EngineUnavailable(RuntimeError):
    pass


def build_sglang_engine(settings: WorkerSettings) -> Engine:
    import torch

    if not torch.cuda.is_available():
        raise EngineUnavailable(
            f"engine 'sglang' is not available on this machine: needs CUDA and sglang=={SGLANG_VERSION}; "
            "use engine 'reference' (the default) here"
        )
    try:
        check_sglang_version()
    except UnsupportedSGLang as exc:
        raise EngineUnavailable(f"engine 'sglang' is not available on this machine: {exc}") from None
    try:
        from zipkv.worker.engines.sglang.engine import SGLangEngine
    except ImportError as exc:
        raise EngineUnavailable(f"engine 'sglang' cannot load its SGLang integration: {exc}") from None
    return SGLangEngine(settings)
