"""``zerolayer bench llamacpp``: zerolayer against llama.cpp, llama-server and transformers."""
