"""The embedded PyTorch engine: scheduler, sequence state, model runner and KV caches."""
