"""zipkv's benchmarks, grouped by what they measure; run each from the repo root as a module,
``python -m bench.<group>.<script>`` (docs/benchmarks.md has every command). Not installed with zipkv."""
