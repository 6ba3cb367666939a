"""The reference engine's GPU code path (Triton store_tokens + fused decode attention), run on the CPU
under the Triton interpreter: same tokens as the torch path, compression on and off."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import json, torch
    torch.set_num_threads(1)
    from zipkv.worker.engine import EngineRequest, SamplingOptions
    from zipkv.worker.engines.reference.engine import ReferenceEngine, ReferenceEngineConfig
    from zipkv.worker.engines.reference.model import load_model

    tiny = load_model(None, "cpu")

    def run(kernels, compression, version=2):
        config = ReferenceEngineConfig(kernels=kernels, compression=compression, format_version=version)
        engine = ReferenceEngine(tiny, config, "cpu")
        for i in range(2):
            g = torch.Generator().manual_seed(i)
            ids = [256] + torch.randint(0, 256, (31 + 17 * i,), generator=g).tolist()
            options = SamplingOptions(max_new_tokens=6, ignore_eos=True)
            engine.add_request(EngineRequest(f"r{i}", tuple(ids), options))
        out, compressed, fused = {}, 0, 0
        while engine.has_work():
            decoding = bool(engine._running) and all(r.computed_tokens for r in engine._running.values())
            fused += int(decoding and engine.store.decode_on_device)
            for e in engine.step():
                out.setdefault(e.request_id, []).extend(e.token_ids)
            compressed = max(compressed, engine.store.stats().compressed_pages)
        return {"tokens": out, "compressed": compressed, "fused": fused}

    print(json.dumps({"torch": run("torch", True), "on": run("triton", True), "off": run("triton", False),
                      "torch_v3": run("torch", True, 3), "on_v3": run("triton", True, 3)}))
    """
)


def test_triton_path_matches_torch_path_and_compression_changes_nothing() -> None:
    """Page formats v2 (the default) and v3: the fused kernel reads both, with no change to the engine."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["on"]["compressed"] > 0 and res["off"]["compressed"] == 0  # really compared compressed pages
    assert res["on"]["fused"] >= 5 and res["torch"]["fused"] == 0  # the fused kernel really ran
    assert res["on"]["tokens"] == res["off"]["tokens"] == res["torch"]["tokens"]
    assert res["on_v3"]["compressed"] > 0 and res["on_v3"]["fused"] >= 5  # v3 pages, coded, read fused
    assert res["on_v3"]["tokens"] == res["torch_v3"]["tokens"] == res["torch"]["tokens"]
