"""The kvstore layer: the paged KV-cache block pool in a shared-memory arena."""
