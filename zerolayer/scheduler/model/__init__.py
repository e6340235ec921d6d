"""The model: forward, attention, kernels, weights, step inputs and sampling."""
