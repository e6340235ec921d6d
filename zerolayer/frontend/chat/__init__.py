"""Chat output: tool-call and reasoning parsers, and the constraint of required tool calls."""
