"""The loader layer: maps a safetensors checkpoint and hands out zero-copy weight handles."""
