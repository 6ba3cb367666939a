"""The one SGLang version zipkv's SGLang engine is written against, and the check every entry makes.

The plugin, the seams and the engine switch all hook into this version's internals, so they all check
the installed distribution's version here (its metadata: no sglang import, so the check is cheap and
runs before anything of SGLang loads).
"""

from __future__ import annotations

import importlib.metadata

SGLANG_VERSION = "0.5.17"


class UnsupportedSGLang(RuntimeError):
    pass


def check_sglang_version(found: str | None = None) -> str:
    """The installed SGLang version, or UnsupportedSGLang saying what to install."""
    if found is None:
        try:
            found = importlib.metadata.version("sglang")
        except importlib.metadata.PackageNotFoundError:
            raise UnsupportedSGLang(
                f"zipkv's SGLang plugin needs sglang=={SGLANG_VERSION}, which is not installed: "
                f"pip install 'zipkv[sglang]' (or sglang=={SGLANG_VERSION})"
            ) from None
    if found != SGLANG_VERSION:
        raise UnsupportedSGLang(
            f"zipkv's SGLang plugin supports sglang=={SGLANG_VERSION} only (its attention backend, KV pool "
            f"and allocator hook into that version's internals); found sglang {found}. Install "
            f"sglang=={SGLANG_VERSION}, or disable the plugin with SGLANG_PLUGINS=<other plugins>."
        )
    return found
