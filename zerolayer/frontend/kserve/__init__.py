"""The KServe v2 / Open Inference Protocol gRPC API: its handlers and its tensor codec (the
generated messages are ``zerolayer.kserve``, another package)."""
