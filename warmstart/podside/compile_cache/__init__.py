"""Pre-warm vLLM's torch.compile cache on a new node from S3, and publish it once.

The entry point is `__main__` (`python3 <folder>/compile_cache.pyz`); the work is in `main`."""
