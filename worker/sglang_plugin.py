"""SGLang plugin entry point (``[project.entry-points."sglang.srt.plugins"] zipkv``).

SGLang runs every ``sglang.srt.plugins`` entry point in the launching process and again at the top of every
scheduler process (which is *spawned*, so patches made in the parent are lost there). `register` installs
zipkv's attention backends, KV pool, allocator and idle memory check (`zipkv.worker.sglang_seams`); it is
idempotent and refuses any SGLang but the one version whose internals it was written against.
"""

from __future__ import annotations

import importlib.metadata
import logging

log = logging.getLogger("zipkv.worker.sglang")

SUPPORTED_SGLANG = "0.5.17"
_registered: list[str] = []


class UnsupportedSGLang(RuntimeError):
    pass


def check_sglang_version(found: str | None = None) -> str:
    """The installed SGLang version, or UnsupportedSGLang saying what to install."""
    if found is None:
        try:
            found = importlib.metadata.version("sglang")
        except importlib.metadata.PackageNotFoundError:
            raise UnsupportedSGLang(
                f"zipkv's SGLang plugin needs sglang=={SUPPORTED_SGLANG}, which is not installed: "
                f"pip install 'zipkv[sglang]' (or sglang=={SUPPORTED_SGLANG})"
            ) from None
    if found != SUPPORTED_SGLANG:
        raise UnsupportedSGLang(
            f"zipkv's SGLang plugin supports sglang=={SUPPORTED_SGLANG} only (its attention backend, KV pool "
            f"and allocator hook into that version's internals); found sglang {found}. Install "
            f"sglang=={SUPPORTED_SGLANG}, or disable the plugin with SGLANG_PLUGINS=<other plugins>."
        )
    return found


def register() -> None:
    """Install zipkv into this SGLang process (idempotent)."""
    if _registered:
        return
    version = check_sglang_version()
    from . import sglang_seams

    sglang_seams.install()
    _registered.append(version)
    log.info("zipkv SGLang plugin registered (sglang %s)", version)
