"""Every container image and Helm chart version warmstart deploys, pinned in one place.

Images carry a digest where the upstream digest is known; a tag-only image is flagged in
`warmstart render`'s table so a stack can pin its own digest.
"""

from __future__ import annotations

# vLLM >= 0.11.1 is needed for `distributed` in --model-loader-extra-config
# (reference/vllm-facts.md 1.1). Stacks should pin their image by digest.
VLLM_IMAGE = "vllm/vllm-openai:v0.33.0"

# Karpenter 1.14.1, published chart (reference/eks-facts.md 1.2).
KARPENTER_CHART = "oci://public.ecr.aws/karpenter/karpenter"
KARPENTER_VERSION = "1.14.1"
KARPENTER_CONTROLLER_IMAGE = (
    "public.ecr.aws/karpenter/controller:1.14.1"
    "@sha256:723130949e4cab989461ff07d1be4cd781d63515432494641b33c235f300ae23"
)

# Kubernetes version a stack targets when it does not say; also the schema version the
# rendered objects are validated against.
DEFAULT_KUBERNETES_VERSION = "1.33"
