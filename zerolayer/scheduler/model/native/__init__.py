"""The native CPU kernels' library: its build (``build``, standard library only) and its ctypes
bindings (``library``)."""
