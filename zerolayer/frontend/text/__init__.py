"""The text side of a request, shared by every public API: tokenizer, chat template, validation
into engine requests, detokenizer, stop strings, logprob token texts."""
