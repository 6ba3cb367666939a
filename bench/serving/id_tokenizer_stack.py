"""zipkv's stack for the serving sweep: `zipkv up`'s stack, the router tokenizing through the id tokenizer.

Its own module so that importing the sweep's systems does not import the stack (Ray, gRPC stubs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.serving.ray_serve_gpu_stack import ServeStack


class IdTokenizerStack(ServeStack):
    """`zipkv up`'s stack with the router tokenizing through the id tokenizer."""

    def __init__(self, tokenizer: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tokenizer = tokenizer

    def _router_config(self, k: int) -> Path:
        path = super()._router_config(k)
        config = json.loads(path.read_text())
        config["models"][0]["tokenizer"] = self.tokenizer
        path.write_text(json.dumps(config, indent=2))
        return path
