"""Node classes: the GPU nodes' ephemeral storage, and so the compile cache, on NVMe.

The compile-cache hostPath is fast only on the NVMe instance store; EKS Auto Mode uses the NVMe
only when the NodeClass `ephemeralStorage.size` is below the instance's NVMe capacity, and
Karpenter only with `instanceStorePolicy: RAID0` ("Accelerate model loading on Amazon EKS",
https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..decisions import instances, placement
from .records import Resource, Violation, as_list, is_unknown, k8s, quantity_bytes
from .vllm import vllm_deployments

NODEPOOL_GROUP = "karpenter.sh"
AUTO_NODECLASS = ("eks.amazonaws.com", "NodeClass")
KARPENTER_NODECLASS = ("karpenter.k8s.aws", "EC2NodeClass")
INSTANCE_TYPE_LABEL = placement.INSTANCE_TYPE_LABEL
# Auto Mode's default NodeClass ephemeral storage when `ephemeralStorage.size` is not set
# (https://docs.aws.amazon.com/eks/latest/userguide/create-node-class.html).
AUTO_DEFAULT_EPHEMERAL_BYTES = 80 * 2**30
RAID0 = "RAID0"


def gpu_node_pools(resources: Sequence[Resource]) -> list[Resource]:
    """NodePools GPU pods land on: tainted for GPUs, or selected by a vLLM Deployment."""
    wanted = set()
    for d in vllm_deployments(resources):
        sel = d.get("spec", "template", "spec", "nodeSelector", default={})
        if isinstance(sel, Mapping) and isinstance(sel.get(placement.NODEPOOL_LABEL), str):
            wanted.add(sel[placement.NODEPOOL_LABEL])
    out = []
    for np in k8s(resources, "NodePool", NODEPOOL_GROUP):
        taints = as_list(np.get("spec", "template", "spec", "taints"))
        tainted = any(isinstance(t, Mapping) and t.get("key") == placement.GPU_TAINT_KEY for t in taints)
        if tainted or np.get("metadata", "name") in wanted:
            out.append(np)
    return out


def gpu_node_classes(resources: Sequence[Resource]) -> dict[str, Resource | None]:
    """NodePool key -> the node class its nodeClassRef names (None when not in the stack)."""
    out: dict[str, Resource | None] = {}
    for np in gpu_node_pools(resources):
        ref = np.get("spec", "template", "spec", "nodeClassRef", default={})
        ref = ref if isinstance(ref, Mapping) else {}
        match = [nc for nc in k8s(resources, str(ref.get("kind")), ref.get("group"))
                 if nc.get("metadata", "name") == ref.get("name")]
        out[np.key] = match[0] if match else None
    return out


def _requirement(np: Resource, key: str) -> list[Mapping[str, Any]]:
    reqs = as_list(np.get("spec", "template", "spec", "requirements"))
    return [r for r in reqs if isinstance(r, Mapping) and r.get("key") == key]


def _pool_nvme(np: Resource, mode_domain: str) -> tuple[float | None, str]:
    """The smallest NVMe capacity (bytes) any node of the pool can have, and how it was found."""
    types = [v for r in _requirement(np, INSTANCE_TYPE_LABEL) if r.get("operator") == "In"
             for v in as_list(r.get("values"))]
    if types:
        known = instances.catalog()
        unknown = [t for t in types if t not in known]
        if unknown:
            return None, f"instance type(s) {unknown} are not in warmstart's GPU table"
        smallest = min(types, key=lambda t: known[t].nvme_total_bytes)
        return float(known[smallest].nvme_total_bytes), f"{smallest} has {known[smallest].nvme_total_gb} GB of NVMe"
    bounds = []
    for r in _requirement(np, f"{mode_domain}/instance-local-nvme"):
        vals = as_list(r.get("values"))
        if r.get("operator") in ("Gt", "Gte") and vals and str(vals[0]).isdigit():
            # The label is EC2's TotalSizeInGB (decimal GB), as Karpenter sets it in
            # https://github.com/aws/karpenter-provider-aws/blob/v1.14.1/pkg/providers/instancetype/types.go
            bounds.append(int(vals[0]) * instances.GB + (instances.GB if r.get("operator") == "Gt" else 0))
    if bounds:
        return float(max(bounds)), f"the pool requires {mode_domain}/instance-local-nvme above {max(bounds) // instances.GB - 1} GB"
    return None, ("the pool neither pins instance types (node.kubernetes.io/instance-type In) nor requires "
                  f"{mode_domain}/instance-local-nvme, so its nodes may have no NVMe")


def check_gpu_node_classes_nvme(resources: Sequence[Resource]) -> list[Violation]:
    """The node class of every GPU NodePool puts node ephemeral storage (and the compile-cache
    hostPath) on the NVMe instance store: Auto Mode only when `ephemeralStorage.size` is below
    the pool's smallest NVMe capacity; Karpenter only with `instanceStorePolicy: RAID0`.
    Otherwise Kubernetes silently creates the hostPath on the root EBS volume."""
    policy = "gpu-node-classes-nvme"
    found: list[Violation] = []
    pools = {np.key: np for np in gpu_node_pools(resources)}
    for key, nc in gpu_node_classes(resources).items():
        np = pools[key]
        ref = np.get("spec", "template", "spec", "nodeClassRef", default={})
        if nc is None:
            found.append(Violation(policy, np, f"{np.label()} uses {ref.get('kind')} '{ref.get('name')}', which this "
                                   "stack does not declare, so its NVMe backing cannot be checked; fix: give GPU "
                                   "pools a node class declared in the stack"))
            continue
        group = str(nc.props.get("apiVersion", "")).rsplit("/", 1)[0]
        domain = placement.LABEL_DOMAIN["auto" if group == AUTO_NODECLASS[0] else "karpenter"]
        nvme, why = _pool_nvme(np, domain)
        if nvme is not None and nvme <= 0:
            found.append(Violation(policy, nc, f"{nc.label()} serves {np.label()}, whose {why}: no instance store, "
                                   "so the compile cache can only land on EBS; fix: use instance types with NVMe"))
            continue
        if (group, nc.props.get("kind")) == AUTO_NODECLASS:
            size_q = nc.get("spec", "ephemeralStorage", "size")
            if is_unknown(size_q):
                continue
            size = AUTO_DEFAULT_EPHEMERAL_BYTES if size_q is None else quantity_bytes(size_q)
            shown = size_q or "80Gi (default)"
            if size is None:
                found.append(Violation(policy, nc, f"{nc.label()}: ephemeralStorage.size={size_q!r} is not a quantity"))
            elif nvme is None:
                found.append(Violation(policy, nc, f"{nc.label()} serves {np.label()}: {why}; Auto Mode uses NVMe only "
                                       f"when ephemeralStorage.size ({shown}) is below the instance's NVMe; fix: pin "
                                       "instance types with NVMe in the pool"))
            elif size >= nvme:
                found.append(Violation(policy, nc, f"{nc.label()}: ephemeralStorage.size={shown} is not below the "
                                       f"NVMe capacity ({why}); Auto Mode then skips the RAID0 and the compile cache "
                                       f"lands on EBS; fix: set ephemeralStorage.size below {int(nvme // 2**30)}Gi"))
        elif (group, nc.props.get("kind")) == KARPENTER_NODECLASS:
            isp = nc.get("spec", "instanceStorePolicy")
            if is_unknown(isp):
                continue
            if isp != RAID0:
                found.append(Violation(policy, nc, f"{nc.label()} serves {np.label()} with instanceStorePolicy={isp!r}; "
                                       "without RAID0 Karpenter ignores the NVMe and /mnt/k8s-disks/0 does not exist, "
                                       "so the compile cache lands on EBS; fix: set spec.instanceStorePolicy: RAID0"))
            elif nvme is None:
                found.append(Violation(policy, nc, f"{nc.label()} serves {np.label()}: {why}; fix: pin instance types "
                                       "with NVMe in the pool"))
    return found
