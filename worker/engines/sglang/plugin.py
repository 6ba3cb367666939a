"""SGLang plugin entry point (``[project.entry-points."sglang.srt.plugins"] zipkv``).

SGLang runs every ``sglang.srt.plugins`` entry point in the launching process and again at the top of every
scheduler process (which is *spawned*, so patches made in the parent are lost there). `register` installs
zipkv's attention backends, KV pool, allocator and idle memory check (`zipkv.worker.engines.sglang.seams`); it
is idempotent and refuses any SGLang but the one version whose internals it was written against.
"""

from __future__ import annotations

import logging

from zipkv.worker.engines.sglang.version import UnsupportedSGLang as UnsupportedSGLang
from zipkv.worker.engines.sglang.version import check_sglang_version

log = logging.getLogger("zipkv.worker.sglang")

_registered: list[str] = []


def register() -> None:
    """Install zipkv into this SGLang process (idempotent)."""
    if _registered:
        return
    version = check_sglang_version()
    from zipkv.worker.engines.sglang import seams

    seams.install()
    _registered.append(version)
    log.info("zipkv SGLang plugin registered (sglang %s)", version)
