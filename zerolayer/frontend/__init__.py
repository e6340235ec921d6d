"""The frontend layer: the public API (gRPC, KServe v2), tokenization, detokenization, stops."""
