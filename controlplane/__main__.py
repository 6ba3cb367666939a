"""`python -m zipkv.controlplane --config FILE`: run the router (HTTP API + ControlPlane report server)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Callable

from zipkv.controlplane.config import ConfigError, load_config


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when it is installed (uvicorn[standard] brings it): a faster event loop; else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zipkv.controlplane", description=__doc__)
    parser.add_argument("--config", metavar="FILE", help="router YAML (ZIPKV_* env vars override it)")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, os.environ)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    from zipkv.controlplane.app import build_app
    from zipkv.controlplane.server import serve, setup_logging

    setup_logging(cfg.telemetry.log_level)
    try:
        app = build_app(cfg)  # loads every model's tokenizer: a bad path fails here, before serving
    except (ValueError, OSError) as exc:
        print(f"router start-up failed: {exc}", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt), asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(serve(cfg, app))
    return 0


if __name__ == "__main__":
    sys.exit(main())
