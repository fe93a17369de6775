"""A platform a model can be served on without warmstart having created it: the `PlatformArgs`
the ServedModel and ServingPlatform tests build from."""

from __future__ import annotations

import json

import components
from components.platform import PlatformArgs

KUBECONFIG = json.dumps({"apiVersion": "v1", "kind": "Config", "clusters": [], "contexts": [], "users": []})
PLATFORM: PlatformArgs = {
    "stack": "research", "region": "us-east-1", "cluster_name": "research",
    "cluster_mode": components.ClusterMode.KARPENTER, "kubernetes_version": "1.33", "namespace": "inference",
    "name_prefix": "research",
    "oidc_provider_arn": "arn:aws:iam::123456789012:oidc-provider/oidc.eks.us-east-1.amazonaws.com/id/ABC",
    "oidc_issuer": "oidc.eks.us-east-1.amazonaws.com/id/ABC", "vpc_cidrs": ["10.40.0.0/16"],
    "service_cidr": "172.20.0.0/16", "model_bucket": "research-models",
    "pools": [{"name": "h100", "instance_types": ["p5.48xlarge"], "max_gpus": 32}], "kubeconfig": KUBECONFIG,
}
