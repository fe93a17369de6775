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


# What vLLM's startup plan depends on but its fingerprint does not hold: vLLM leaves these out of
# its config hash (`CacheConfig.compute_hash`'s ignored_factors in vllm/config/cache.py, 0.33.0),
# and the plan's fingerprint is that hash plus the device and library versions
# (vllm/v1/worker/startup_plan.py). A plan saved at one gpu-memory-utilization would be applied
# at another, so the pod-side restore drops the node's plans when these change, and the S3 key
# carries them.
_STARTUP_PLAN_ARGS = ("--gpu-memory-utilization", "--device-memory-utilization", "--num-gpu-blocks-override")


def startup_plan_fingerprint(args: list[str]) -> str:
    """sha256 over the `vllm serve` arguments the startup plan depends on beyond its own
    fingerprint (`--flag=value` or `--flag value`, in order)."""
    picked: list[str] = []
    for i, a in enumerate(args):
        flag, eq, value = a.partition("=")
        if flag in _STARTUP_PLAN_ARGS:
            picked.append(f"{flag}={value if eq else (args[i + 1] if i + 1 < len(args) else '')}")
    return hashlib.sha256(json.dumps(picked).encode()).hexdigest()


def cache_key_prefix(model: str) -> str:
    """Key prefix of a model's objects in the compile-cache bucket: what its pods read and
    write, and all its IAM role may touch there."""
    return f"{model}/"
