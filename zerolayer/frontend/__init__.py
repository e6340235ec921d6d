"""Frontend layer: tokenization, incremental detokenization and stop strings."""
