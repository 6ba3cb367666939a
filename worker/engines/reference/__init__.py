"""The reference engine: a small paged engine over Hugging Face model definitions (CPU or GPU)."""
