"""GGUF checkpoints (llama.cpp's format): header, metadata and tensor infos read and checked, and
turned into the manifest, config.json and tokenizer files the rest of the stack serves."""
