"""A stand-in SGLang server for gateway benchmarks (no model, named as such): what sglang-router 0.3.2 asks of
a worker (health, server and model info, /generate streaming ``max_new_tokens`` chunks at once), and the
time each /generate arrived (on this process's clock) with its body.

    python -m bench.router.standin_sglang --port P       (a separate process, for throughput)
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    arrived_s: list[float]  # set per server class: perf_counter() at each /generate
    seen: list[dict[str, Any]]  # and each /generate's body

    def _send(self, body: bytes, ctype: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._send(json.dumps({"model_path": "llama", "is_generation": True}).encode(), "application/json")

    def do_POST(self) -> None:
        arrived = time.perf_counter()
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path != "/generate":
            self.send_error(404, f"no {self.path} here: the stand-in serves /generate")
            return
        self.arrived_s.append(arrived)
        self.seen.append(body)
        n = int(body.get("sampling_params", {}).get("max_new_tokens", 1))
        chunks = (
            json.dumps({"text": " t" * (i + 1), "meta_info": {"completion_tokens": i + 1}}) for i in range(n)
        )
        self._send(
            ("".join(f"data: {c}\n\n" for c in chunks) + "data: [DONE]\n\n").encode(), "text/event-stream"
        )

    def log_message(self, *args: Any) -> None:
        pass


class StandInSGLang:
    """The server on a thread of this process (its arrival times share the caller's clock)."""

    def __init__(self, port: int = 0) -> None:
        self.arrived_s: list[float] = []
        self.seen: list[dict[str, Any]] = []
        handler = type("Handler", (_Handler,), {"arrived_s": self.arrived_s, "seen": self.seen})
        self.server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> StandInSGLang:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    port = ap.parse_args().port
    with StandInSGLang(port):
        threading.Event().wait()


if __name__ == "__main__":
    main()
