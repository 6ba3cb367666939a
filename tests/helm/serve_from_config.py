"""Deploy a rendered serveConfigV2 on a local Ray cluster, as KubeRay does on the head (used by the tests).

    python serve_from_config.py SERVE_CONFIG.yaml

Builds each application from its import path and args, runs it with Ray Serve, prints READY and blocks
until terminated. The environment (ZIPKV_REPORT_TOKEN) reaches the replicas as it does in a Ray pod.
"""

from __future__ import annotations

import importlib
import signal
import sys
import threading

import yaml


def main(path: str) -> None:
    import ray
    from ray import serve
    from ray.serve.schema import ServeDeploySchema

    with open(path) as f:
        config = ServeDeploySchema.model_validate(yaml.safe_load(f))
    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False)
    for app in config.applications:
        module, _, attr = app.import_path.partition(":")
        builder = getattr(importlib.import_module(module), attr)
        serve.run(builder(app.args), name=app.name, route_prefix=None)
    print("READY", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
