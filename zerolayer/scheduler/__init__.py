"""The scheduler layer: the engine (continuous batching, model forward, sampling)."""
