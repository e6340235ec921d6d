"""The KV cache contract between kvstore and schedulers: arena layout, mapping, commits."""
