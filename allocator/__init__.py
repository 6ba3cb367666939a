"""zipkv.allocator."""
