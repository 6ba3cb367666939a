"""zipkv.worker."""
