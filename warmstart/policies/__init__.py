"""warmstart's guardrails as pure checks over a stack's resources.

Every check is a function `(resources) -> list[Violation]` over `Resource(typ, name, props)`
records. The SAME functions run in two places:

- inside the Pulumi policy pack (`policy/`, adapters in `warmstart/policy_pack.py`) on what a
  real `pulumi preview` / `up` is about to deploy: props are the engine's view of the resource,
  with values not known yet during a preview replaced by `UNKNOWN`;
- in tests, over what a program registered under the mocks (`warmstart.mocks.policy_records()`), where the Pulumi mocks
  answered every registration.

A check never reports what it cannot see: an `UNKNOWN` value (a preview of a resource whose
inputs come from resources not created yet) skips that part of the check, and the same check
runs again on `up` with the values resolved. Relationships between resources (a bucket and its
public access block, a subnet and its route table) are followed both by value (names, ids,
ARNs) and by the engine's property dependencies, so they hold in a preview too.

Modules, by concern:

- `records`: `Resource`, `UNKNOWN`, `Violation`, and the helpers every check shares;
- `buckets`: S3 buckets private, encrypted, TLS-only and versioned;
- `iam`: IRSA trust pinned to one service account; no role writes the model bucket;
- `network`: the GPU subnets' route tables on the S3 Gateway endpoint;
- `nodes`: the GPU node classes' ephemeral storage (and the compile cache) on NVMe;
- `vllm`: the vLLM Deployment checks;
- `autoscaling`: KEDA's maxReplicaCount fits the GPU NodePool's limit;
- `eks_version`: the cluster's Kubernetes version in EKS standard support (advisory);
- `registry`: `Check`, `CHECKS` (the order the pack registers them in) and `run_all`.

No Pulumi import here: the checks depend only on the decision modules' constants and rules

This package re-exports the names callers use, so `policies.X` works whatever module X is in.
"""

from __future__ import annotations

from ..decisions.placement import ANNOTATION_DOMAIN
from .autoscaling import check_autoscaling_fits_pool, scaled_objects
from .buckets import (
    ACCOUNT_PUBLIC_ACCESS_BLOCK_TYPES,
    BUCKET_POLICY_TYPES,
    BUCKET_TYPES,
    ENCRYPTION_TYPES,
    PUBLIC_ACCESS_BLOCK_TYPES,
    PUBLIC_ACCESS_FLAGS,
    SSE_ALGORITHMS,
    VERSIONING_TYPES,
    check_buckets,
)
from .eks_version import check_eks_version
from .iam import (
    BROAD_WRITE_MANAGED_POLICIES,
    POLICY_ATTACHMENT_TYPES,
    POLICY_TYPES,
    ROLE_POLICY_ATTACHMENT_TYPES,
    ROLE_POLICY_TYPES,
    ROLE_TYPES,
    S3_WRITE_ACTIONS,
    SERVICE_ACCOUNT_SUBJECT,
    STS_AUDIENCE,
    WEB_IDENTITY_ACTION,
    _is_web_identity,  # private, re-exported for the tests
    _model_buckets,  # private, re-exported for the tests
    check_irsa_model_write,
    check_irsa_trust,
    irsa_trust,
)
from .network import (
    ENDPOINT_ROUTE_TABLE_ASSOCIATION_TYPES,
    INTERNET_GATEWAY_TYPES,
    ROUTE_TABLE_ASSOCIATION_TYPES,
    ROUTE_TABLE_TYPES,
    ROUTE_TYPES,
    SUBNET_TYPES,
    VPC_ENDPOINT_TYPES,
    check_gpu_subnets_s3_endpoint,
)
from .nodes import (
    AUTO_DEFAULT_EPHEMERAL_BYTES,
    AUTO_NODECLASS,
    INSTANCE_TYPE_LABEL,
    KARPENTER_NODECLASS,
    NODEPOOL_GROUP,
    RAID0,
    check_gpu_node_classes_nvme,
    gpu_node_classes,
    gpu_node_pools,
)
from .records import (
    PARTITIONS,
    UNKNOWN,
    Resource,
    Violation,
    as_list,
    as_resources,
    conditions,
    iam_match,
    is_unknown,
    k8s,
    policy_document,
    quantity_bytes,
    refers,
    related,
    statements,
)
from .registry import CHECKS, Check, run_all
from .vllm import (
    ANNOTATION_CHUNK,
    ANNOTATION_CONCURRENCY,
    ANNOTATION_TP,
    ANNOTATION_WEIGHTS,
    CHUNK_ENV,
    COMPILE_CACHE_ENV,
    GPU_RESOURCE,
    _loader_config,  # private, re-exported for the tests
    check_vllm_eager,
    check_vllm_gpu_equals_tp,
    check_vllm_loader_concurrency,
    check_vllm_startup_probe,
    flag,
    uses_compile_cache,
    vllm_container,
    vllm_deployments,
)

__all__ = [
    "ACCOUNT_PUBLIC_ACCESS_BLOCK_TYPES",
    "ANNOTATION_CHUNK",
    "ANNOTATION_CONCURRENCY",
    "ANNOTATION_DOMAIN",
    "ANNOTATION_TP",
    "ANNOTATION_WEIGHTS",
    "AUTO_DEFAULT_EPHEMERAL_BYTES",
    "AUTO_NODECLASS",
    "BROAD_WRITE_MANAGED_POLICIES",
    "BUCKET_POLICY_TYPES",
    "BUCKET_TYPES",
    "CHECKS",
    "CHUNK_ENV",
    "COMPILE_CACHE_ENV",
    "Check",
    "ENCRYPTION_TYPES",
    "ENDPOINT_ROUTE_TABLE_ASSOCIATION_TYPES",
    "GPU_RESOURCE",
    "INSTANCE_TYPE_LABEL",
    "INTERNET_GATEWAY_TYPES",
    "KARPENTER_NODECLASS",
    "NODEPOOL_GROUP",
    "PARTITIONS",
    "POLICY_ATTACHMENT_TYPES",
    "POLICY_TYPES",
    "PUBLIC_ACCESS_BLOCK_TYPES",
    "PUBLIC_ACCESS_FLAGS",
    "RAID0",
    "ROLE_POLICY_ATTACHMENT_TYPES",
    "ROLE_POLICY_TYPES",
    "ROLE_TYPES",
    "ROUTE_TABLE_ASSOCIATION_TYPES",
    "ROUTE_TABLE_TYPES",
    "ROUTE_TYPES",
    "Resource",
    "S3_WRITE_ACTIONS",
    "SERVICE_ACCOUNT_SUBJECT",
    "SSE_ALGORITHMS",
    "STS_AUDIENCE",
    "SUBNET_TYPES",
    "UNKNOWN",
    "VERSIONING_TYPES",
    "VPC_ENDPOINT_TYPES",
    "Violation",
    "WEB_IDENTITY_ACTION",
    "as_list",
    "as_resources",
    "check_autoscaling_fits_pool",
    "check_buckets",
    "check_eks_version",
    "check_gpu_node_classes_nvme",
    "check_gpu_subnets_s3_endpoint",
    "check_irsa_model_write",
    "check_irsa_trust",
    "check_vllm_eager",
    "check_vllm_gpu_equals_tp",
    "check_vllm_loader_concurrency",
    "check_vllm_startup_probe",
    "conditions",
    "flag",
    "gpu_node_classes",
    "gpu_node_pools",
    "iam_match",
    "irsa_trust",
    "is_unknown",
    "k8s",
    "policy_document",
    "quantity_bytes",
    "refers",
    "related",
    "run_all",
    "scaled_objects",
    "statements",
    "uses_compile_cache",
    "vllm_container",
    "vllm_deployments",
]
