"""The set of checks, in the order the policy pack registers them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Sequence

from .autoscaling import POLICY as AUTOSCALING_POLICY
from .autoscaling import check_autoscaling_fits_pool
from .buckets import check_buckets
from .eks_version import check_eks_version
from .iam import ROLE_TYPES, check_irsa_model_write, check_irsa_trust
from .network import check_gpu_subnets_s3_endpoint
from .nodes import check_gpu_node_classes_nvme
from .records import Resource, Violation, as_resources
from .vllm import check_vllm_eager, check_vllm_gpu_equals_tp, check_vllm_loader_concurrency, check_vllm_startup_probe


@dataclass(frozen=True)
class Check:
    name: str
    description: str
    fn: Callable[[Sequence[Resource]], list[Violation]]
    scope: Literal["stack", "resource"]
    """`resource`: runs per resource before it is created or updated (blocks an `up` early);
    `stack`: sees every resource (relationships), runs after the update on `up`."""
    types: tuple[str, ...] = ()
    """For `resource` scope: the type tokens it applies to (empty: any)."""
    enforcement: Literal["mandatory", "advisory"] = "mandatory"
    """`mandatory`: a violation fails the preview or update; `advisory`: it is reported as a
    warning and never blocks (a policy-pack config can still change either)."""


CHECKS: tuple[Check, ...] = (
    Check("s3-bucket-guardrails", "S3 buckets are private (public access block all true), encrypted, "
          "TLS-only and versioned", check_buckets, "stack"),
    Check("irsa-trust-pinned", "IRSA role trust is pinned to one service account (:sub) and to "
          "sts.amazonaws.com (:aud)", check_irsa_trust, "resource", ROLE_TYPES),
    Check("irsa-no-model-bucket-write", "No IRSA role can write the model bucket", check_irsa_model_write, "stack"),
    Check("gpu-subnets-s3-gateway-endpoint", "GPU subnets' route tables are on an S3 Gateway endpoint",
          check_gpu_subnets_s3_endpoint, "stack"),
    Check("gpu-node-classes-nvme", "GPU node classes put ephemeral storage on NVMe (Auto Mode: size below "
          "NVMe capacity; Karpenter: instanceStorePolicy RAID0)", check_gpu_node_classes_nvme, "stack"),
    Check("vllm-no-eager-with-distributed-or-cache", "vLLM does not run --enforce-eager with distributed "
          "loading or a compile cache", check_vllm_eager, "resource"),
    Check("vllm-loader-concurrency", "vLLM streamer concurrency matches ceil(weights / chunk) from the declared "
          "sizes", check_vllm_loader_concurrency, "resource"),
    Check("vllm-gpu-request-equals-tp", "vLLM pods request exactly tensor-parallel-size GPUs",
          check_vllm_gpu_equals_tp, "resource"),
    Check("vllm-startup-probe", "vLLM containers have a startup probe", check_vllm_startup_probe, "resource"),
    Check(AUTOSCALING_POLICY, "Every GPU NodePool's GPU limit holds its autoscaled models at KEDA's "
          "maxReplicaCount (and the others at replicas), plus one surge pod each", check_autoscaling_fits_pool, "stack"),
    Check("eks-version-standard-support", "The EKS cluster's Kubernetes version is in EKS standard support "
          "today (past it, EKS bills extended support)", check_eks_version, "stack", enforcement="advisory"),
)


def run_all(resources: Iterable[Any]) -> list[Violation]:
    """Every check over a stack's resources."""
    rs = as_resources(resources)
    return [v for c in CHECKS for v in c.fn(rs)]
