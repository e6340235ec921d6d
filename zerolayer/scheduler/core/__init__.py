"""The scheduling core: requests, continuous batching, block tables and the engine loop."""
