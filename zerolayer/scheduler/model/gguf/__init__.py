"""GGUF's tensor types in the forward: weights used in place in their blocks (:class:`QuantWeight`),
their exact dequantization, the linear layers over them and their torch references; the native
kernels are ``csrc/gguf_*.cpp``."""
