"""Hugging Face transformers on the same checkpoint: the baseline of the wheel's scenarios."""
