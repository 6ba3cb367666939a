"""zipkv.controlplane."""
