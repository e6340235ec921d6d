"""The Anthropic Messages API of the frontend's HTTP server: ``POST /v1/messages`` and
``POST /v1/messages/count_tokens`` (docs/anthropic-messages.md)."""
