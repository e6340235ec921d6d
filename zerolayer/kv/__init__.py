"""The KV cache contract between kvstore and schedulers: arena layout, info and mapping, commits,
stats."""
