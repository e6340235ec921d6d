"""Model checkpoints and tokenizers: converters and builders for Hugging Face model directories."""
