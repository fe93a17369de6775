"""A stack with a standby pool (four models sharing one spare engine host), for the pooled-standby
tests: built in memory from the keys of docs/scale-out.md "Pooled standby"."""

from __future__ import annotations

import copy
from typing import Any

POOL = "shared-h100"
MODELS = ("chat-a", "chat-b", "code-c", "embed-d")


def pooled_config(mode: str = "karpenter", **pool: Any) -> dict[str, Any]:
    """The stack's config (keys without `warmstart:`): four 15 GiB models at TP=1 on p5.48xlarge,
    two of them at minReplicas 0 (served from the spare through the front queue), one pool."""
    return copy.deepcopy({
        "clusterMode": mode, "region": "us-east-1",
        "gpuPools": [{"name": "h100", "instanceTypes": ["p5.48xlarge"]}],
        "models": [{"name": name, "source": f"org/{name}", "weightsGiB": 15, "pool": "h100",
                    "tensorParallelSize": 1, "autoscaling": {"minReplicas": i % 2, "maxReplicas": 2},
                    "standby": {"pool": POOL}} for i, name in enumerate(MODELS)],
        "standbyPools": [{"name": POOL, "gpuPool": "h100", **pool}],
    })


def pooled_doc(mode: str = "karpenter", **pool: Any) -> dict[str, Any]:
    """The same as a stack file's document."""
    return {"config": {f"warmstart:{k}": v for k, v in pooled_config(mode, **pool).items()}}
