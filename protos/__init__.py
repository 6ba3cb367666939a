"""zipkv.protos."""
