"""Every container image and Helm chart version warmstart deploys, pinned in one place.

Images carry a digest where the upstream digest is known; a tag-only image is flagged in
`warmstart render`'s table so a stack can pin its own digest.
"""

from __future__ import annotations

# vLLM >= 0.11.1 is needed for `distributed` in --model-loader-extra-config (added by
# https://github.com/vllm-project/vllm/pull/27230). Stacks should pin their image by digest.
VLLM_IMAGE = "vllm/vllm-openai:v0.33.0"

# Karpenter 1.14.1, published chart, installed as in
# https://karpenter.sh/v1.14/getting-started/getting-started-with-karpenter/
KARPENTER_CHART = "oci://public.ecr.aws/karpenter/karpenter"
KARPENTER_VERSION = "1.14.1"
KARPENTER_CONTROLLER_IMAGE = (
    "public.ecr.aws/karpenter/controller:1.14.1"
    "@sha256:723130949e4cab989461ff07d1be4cd781d63515432494641b33c235f300ae23"
)

# Kubernetes version a stack targets when it does not say; also the schema version the
# rendered objects are validated against.
DEFAULT_KUBERNETES_VERSION = "1.33"

# Karpenter's CRDs as their own chart, so `helm upgrade` updates them (Helm installs a
# chart's crds/ folder only on first install; see "CRD Upgrades" in
# https://karpenter.sh/v1.14/upgrading/upgrade-guide/). Same version as the controller.
KARPENTER_CRD_CHART = "oci://public.ecr.aws/karpenter/karpenter-crd"

# EKS-optimized AL2023 AMI release for Karpenter's EC2NodeClass (`amiSelectorTerms.alias`).
# Pinned: `@latest` makes every node drift, i.e. be replaced, on each weekly AMI release
# (https://karpenter.sh/v1.14/concepts/nodeclasses/#specamiselectorterms). GPU instance types get
# the release's NVIDIA variant. Bump deliberately.
KARPENTER_AMI_ALIAS = "al2023@v20260903"

# NVIDIA device plugin (karpenter mode only: Auto Mode has the plugin built in,
# https://docs.aws.amazon.com/eks/latest/userguide/auto-accelerated.html). Official chart
# repository and a pinned chart version (release-0.20 line).
NVIDIA_DEVICE_PLUGIN_REPO = "https://nvidia.github.io/k8s-device-plugin"
NVIDIA_DEVICE_PLUGIN_CHART = "nvidia-device-plugin"
NVIDIA_DEVICE_PLUGIN_VERSION = "0.20.1"
