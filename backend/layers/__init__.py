"""Building blocks the model and the engine share: attention, KV cache, linear layers and their kernels."""
