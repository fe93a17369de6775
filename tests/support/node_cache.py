"""The node cache's test library: its scripts, a model version's objects built by the component
under Pulumi mocks, and what a staged copy holds."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import components
from components.node_cache import ModelNodeCache
from warmstart import mocks
from warmstart.decisions import node_cache as decide
from warmstart.decisions.node_cache import model_version_digest
from warmstart.podside import weights_select, weights_stage

if TYPE_CHECKING:
    from tests.node_cache.conftest import Version

STAGE = Path(weights_stage.__file__).resolve()
SELECT = Path(weights_select.__file__).resolve()
K8S = "1.33"
SOURCE = "s3://team-models/llama-8b/v3"
IMAGE = "vllm/vllm-openai:v0.33.0@sha256:" + "cd" * 32
DIGEST = decide.model_version_digest(SOURCE)


def node_cache_component(**overrides: Any) -> tuple[Any, list[mocks.Registered]]:
    built: dict[str, Any] = {}
    args = {"model_name": "llama", "source": SOURCE, "digest": DIGEST, "image": IMAGE, "pools": ["l40s", "h100"],
            "weights_gib": 15, "region": "us-east-1", "namespace": "inference",
            "cluster_mode": components.ClusterMode.KARPENTER, "role_arn": "arn:aws:iam::123456789012:role/llama-read",
            "warm_spares": {"l40s": {"warm_nodes": 1, "instance_type": "g6e.xlarge", "gpus": 1}}} | overrides

    def program() -> None:
        cache = ModelNodeCache("llama-cache", args)
        built["cache"] = cache
        # The integrator's edge: the serving Deployment waits for the staging rollout.
        import pulumi
        import pulumi_kubernetes as k8s
        k8s.apps.v1.Deployment("llama-deployment", metadata={"name": "llama", "namespace": "inference"},
                               spec={"selector": {"matchLabels": {"a": "b"}},
                                     "template": {"metadata": {"labels": {"a": "b"}},
                                                  "spec": {"containers": [{"name": "vllm", "image": IMAGE}]}}},
                               opts=pulumi.ResourceOptions(depends_on=cache.daemon_sets))

    resources = mocks.run(program, region="us-east-1", stack="unit")
    return built["cache"], resources


def tree(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*")
            if p.is_file() and p.name != weights_stage.MARKER}


def digest_of(v: Version) -> str:
    return model_version_digest(v.source)


def wait_for(pred, timeout: float = 30.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return False
