"""What the compile-cache key is made of, on the side that is known at render time.

The pod-side code (warmstart/podside/compile_cache.py) adds what only the node knows (GPU name
and compute capability, torch/triton/vLLM/CUDA versions in the image) to this fingerprint.
"""

from __future__ import annotations

import hashlib
import json

# Arguments that cannot change what torch.compile produces: the loader streams the same
# weights whatever its concurrency, and vLLM leaves gpu_memory_utilization out of its own hash
# (`CacheConfig.compute_hash` in
# https://github.com/vllm-project/vllm/blob/main/vllm/config/cache.py). Everything else a
# model passes to `vllm serve` is in the fingerprint.
_NOT_COMPILE_RELEVANT = ("--model-loader-extra-config", "--load-format", "--gpu-memory-utilization",
                         "--host", "--port", "--served-model-name")


def compile_fingerprint(image: str, source: str, tensor_parallel_size: int, args: list[str]) -> str:
    """sha256 over the model, TP degree, image and the compile-relevant `vllm serve` args."""
    relevant = [a for a in args if a.split("=", 1)[0] not in _NOT_COMPILE_RELEVANT]
    factors = {"image": image, "model": source, "tensorParallelSize": tensor_parallel_size,
               "args": relevant}
    return hashlib.sha256(json.dumps(factors, sort_keys=True).encode()).hexdigest()


def cache_key_prefix(model: str) -> str:
    """Key prefix of a model's objects in the compile-cache bucket: what its pods read and
    write, and all its IAM role may touch there."""
    return f"{model}/"
