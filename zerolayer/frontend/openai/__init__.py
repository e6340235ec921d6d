"""The OpenAI-compatible HTTP API (``--http-listen``): completions, chat completions, models."""
