"""Model directories: reading checkpoints and their configs, converters, the dummy model."""
