"""Node labels, taints and NVMe paths: the one place these strings are spelled."""

from __future__ import annotations

import posixpath
from typing import Literal

ClusterMode = Literal["auto", "karpenter"]

# Annotations warmstart writes on the objects it renders (the tuning a Deployment was built
# from, script digests), read back by the policy pack.
ANNOTATION_DOMAIN = "warmstart.io"

GPU_RESOURCE = "nvidia.com/gpu"
# Every GPU NodePool carries this taint; every serving pod tolerates it.
GPU_TAINT_KEY = GPU_RESOURCE
GPU_TAINT_EFFECT = "NoSchedule"

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"

# Auto Mode and Karpenter use different label domains
# (https://docs.aws.amazon.com/eks/latest/userguide/create-node-pool.html,
# https://karpenter.sh/v1.14/concepts/scheduling/#well-known-labels).
LABEL_DOMAIN: dict[ClusterMode, str] = {"auto": "eks.amazonaws.com", "karpenter": "karpenter.k8s.aws"}


def local_nvme_label(mode: ClusterMode) -> str:
    return f"{LABEL_DOMAIN[mode]}/instance-local-nvme"


def gpu_count_label(mode: ClusterMode) -> str:
    return f"{LABEL_DOMAIN[mode]}/instance-gpu-count"


# Where each mode mounts the node's NVMe (RAID0 over all drives): Auto Mode's ephemeral
# storage, Karpenter's `instanceStorePolicy: RAID0` on AL2023
# (https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html,
# https://karpenter.sh/v1.14/concepts/nodeclasses/#specinstancestorepolicy).
NVME_MOUNT: dict[ClusterMode, str] = {"auto": "/mnt/.ephemeral", "karpenter": "/mnt/k8s-disks/0"}


def compile_cache_host_path(mode: ClusterMode) -> str:
    """Default node directory of the compile cache, identical on every node of a mode."""
    return f"{NVME_MOUNT[mode]}/compile-cache"


def under(path: str, root: str) -> bool:
    """`path` is strictly below `root` (both normalised)."""
    path, root = posixpath.normpath(path), posixpath.normpath(root)
    return path != root and posixpath.commonpath([path, root]) == root


# Inside the container the cache is always here, so its paths are the same on every node.
COMPILE_CACHE_MOUNT = "/compile-cache"

# Label on the karpenter-mode system node group; the Karpenter controller is pinned to it
# (Karpenter must not run on nodes it launches).
NODE_GROUP_LABEL = "warmstart.io/node-group"
SYSTEM_NODE_GROUP = "system"

# The NVIDIA device plugin chart's default node affinity matches this label (its "force a
# GPU deployment" term), so GPU NodePools set it instead of needing node-feature-discovery.
NVIDIA_GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
