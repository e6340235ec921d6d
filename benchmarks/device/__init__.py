"""The GPU device check's bench and summary (``scripts/device_check.sh``; docs/gpu.md)."""
