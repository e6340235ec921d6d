"""Micro-benchmarks of the native kernels (``python -m benchmarks.kernels.attention``, ...)."""
