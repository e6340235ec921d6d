"""llguidance against xgrammar (``python -m benchmarks.structured_output.compare``)."""
