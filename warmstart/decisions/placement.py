"""Node labels, taints and NVMe paths: the one place these strings are spelled."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

ClusterMode = Literal["auto", "karpenter"]

# Annotations warmstart writes on the objects it renders (the tuning a Deployment was built
# from, script digests), read back by the policy pack.
ANNOTATION_DOMAIN = "warmstart.io"

GPU_RESOURCE = "nvidia.com/gpu"
# Every GPU NodePool carries this taint; every serving pod tolerates it.
GPU_TAINT_KEY = GPU_RESOURCE
GPU_TAINT_EFFECT = "NoSchedule"

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# A pod annotated so keeps Karpenter (and Auto Mode) from consolidating or drifting its node
# away while it runs (https://karpenter.sh/docs/concepts/disruption/#pod-level-controls).
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
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
# (Karpenter must not run on nodes it launches). Nothing else of warmstart's selects it.
NODE_GROUP_LABEL = "warmstart.io/node-group"
SYSTEM_NODE_GROUP = "system"

# The NVIDIA device plugin chart's default node affinity matches this label (its "force a
# GPU deployment" term), so GPU NodePools set it instead of needing node-feature-discovery.
NVIDIA_GPU_PRESENT_LABEL = "nvidia.com/gpu.present"


# --- Where non-GPU pods run -------------------------------------------------------------------
# Routers, weights-import Jobs, KEDA and node-feature-discovery need no GPU and must neither wait
# for a GPU node nor keep one alive. On warmstart's own clusters they go to an elastic CPU NodePool
# of this name: Auto Mode's built-in `general-purpose`
# (https://docs.aws.amazon.com/eks/latest/userguide/set-builtin-node-pools.html), and in Karpenter
# mode warmstart's own NodePool of the same name, so both modes select it the same way. The fixed
# system node group keeps only what Karpenter itself needs, as Karpenter's getting-started runs it
# (https://karpenter.sh/v1.14/getting-started/getting-started-with-karpenter/).
GENERAL_PURPOSE_POOL = "general-purpose"

# Labels a GPU node carries on the clusters warmstart knows: Karpenter's and Auto Mode's GPU-count
# labels (set only on instances with GPUs; https://karpenter.sh/v1.14/concepts/scheduling/#well-known-labels,
# https://docs.aws.amazon.com/eks/latest/userguide/create-node-pool.html) and the NVIDIA label
# GPU feature discovery / node-feature-discovery set (and warmstart's Karpenter GPU pools).
GPU_NODE_LABELS_ABSENT = tuple(sorted(gpu_count_label(m) for m in LABEL_DOMAIN))


@dataclass(frozen=True)
class Toleration:
    """One pod toleration, as Kubernetes writes it."""

    key: str | None = None
    operator: str = "Equal"
    value: str | None = None
    effect: str | None = None

    def as_dict(self) -> dict[str, str]:
        out = {"key": self.key, "operator": self.operator, "value": self.value, "effect": self.effect}
        return {k: v for k, v in out.items() if v is not None}


@dataclass(frozen=True)
class NonGpuPlacement:
    """Where a platform's non-GPU pods (routers, import Jobs) go: a node selector and the
    tolerations its nodes need (`PlatformArgs.non_gpu_placement`). Neither given: anywhere off
    the GPU nodes, by a required node affinity on the GPU labels."""

    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()

    @property
    def given(self) -> bool:
        return bool(self.node_selector or self.tolerations)

    @property
    def selector(self) -> dict[str, str]:
        return dict(self.node_selector)

    def args(self) -> dict[str, Any]:
        """As `PlatformArgs.non_gpu_placement` (snake_case keys)."""
        return {"node_selector": self.selector, "tolerations": [t.as_dict() for t in self.tolerations]}

    def pod_fields(self) -> dict[str, Any]:
        """The PodSpec fields that place a pod: `nodeSelector` and `tolerations` as given, or,
        with neither, a required node affinity that keeps the pod off every GPU node."""
        if not self.given:
            return {"affinity": off_gpu_affinity()}
        out: dict[str, Any] = {"nodeSelector": self.selector}
        if self.tolerations:
            out["tolerations"] = [t.as_dict() for t in self.tolerations]
        return out


def off_gpu_affinity() -> dict[str, Any]:
    """A required node affinity matching only nodes without a GPU label (one term: its
    expressions are ANDed; a `NotIn` also matches a node without the label)."""
    expressions = [{"key": k, "operator": "DoesNotExist"} for k in GPU_NODE_LABELS_ABSENT]
    expressions.append({"key": NVIDIA_GPU_PRESENT_LABEL, "operator": "NotIn", "values": ["true"]})
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": expressions}]}}}


def own_platform_placement() -> NonGpuPlacement:
    """A warmstart platform's own: its elastic CPU NodePool (either mode)."""
    return NonGpuPlacement(node_selector=((NODEPOOL_LABEL, GENERAL_PURPOSE_POOL),))


ANYWHERE_OFF_GPU = NonGpuPlacement()

TOLERATION_OPERATORS = ("Equal", "Exists")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def placement_from_args(given: Mapping[str, Any] | None) -> NonGpuPlacement:
    """`PlatformArgs.non_gpu_placement` as a NonGpuPlacement (None or {}: anywhere off the GPU
    nodes); ValueError naming the broken field."""
    if not given:
        return ANYWHERE_OFF_GPU
    selector = given.get("node_selector") or {}
    if not isinstance(selector, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in selector.items()):
        raise ValueError("non_gpu_placement.node_selector must map label keys to string values")
    tolerations = []
    for i, t in enumerate(given.get("tolerations") or []):
        if not isinstance(t, Mapping):
            raise ValueError(f"non_gpu_placement.tolerations[{i}] must be an object {{key, operator, value, effect}}")
        op = t.get("operator") or "Equal"
        if op not in TOLERATION_OPERATORS:
            raise ValueError(f"non_gpu_placement.tolerations[{i}].operator must be one of {TOLERATION_OPERATORS}")
        if t.get("effect") and t["effect"] not in TAINT_EFFECTS:
            raise ValueError(f"non_gpu_placement.tolerations[{i}].effect must be one of {TAINT_EFFECTS}")
        tolerations.append(Toleration(t.get("key") or None, op, t.get("value") if op == "Equal" else None,
                                      t.get("effect") or None))
    return NonGpuPlacement(tuple(sorted(selector.items())), tuple(tolerations))
