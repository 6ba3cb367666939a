"""The SGLang engine switch. The SGLang integration itself is built separately (GPU only); here only the
clear error when it cannot run on this machine."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .engine import Engine
    from .settings import WorkerSettings

SGLANG_VERSION = "0.5.17"


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
        import sglang
    except ImportError as exc:
        raise EngineUnavailable(
            f"engine 'sglang' is not available on this machine: needs CUDA and sglang=={SGLANG_VERSION} "
            f"(pip install 'zipkv[sglang]'): {exc}"
        ) from None
    if getattr(sglang, "__version__", "") != SGLANG_VERSION:
        raise EngineUnavailable(
            f"engine 'sglang' needs sglang=={SGLANG_VERSION}, found {getattr(sglang, '__version__', '?')}"
        )
    try:
        from .sglang_adapter import SGLangEngine  # type: ignore[import-not-found]
    except ImportError as exc:
        raise EngineUnavailable(f"engine 'sglang': this build has no SGLang adapter yet ({exc})") from None
    return SGLangEngine(settings)  # type: ignore[no-any-return]
