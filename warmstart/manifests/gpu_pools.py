"""GPU capacity: one node class and one NodePool per `gpuPools` entry, in either cluster mode.

`node_class()` and `node_pool()` build the objects as plain dicts (pure: the tests validate
them against the upstream CRD schemas); the Cluster component registers them.

Both modes use the `karpenter.sh/v1` NodePool; they differ in the node class it points at:
- auto: `eks.amazonaws.com/v1` NodeClass, NVMe used when `ephemeralStorage.size` is below it;
- karpenter: `karpenter.k8s.aws/v1` EC2NodeClass with `instanceStorePolicy: RAID0`.

In Karpenter mode `cpu_node_class()` and `cpu_node_pool()` build the elastic CPU NodePool the
non-GPU pods run on (warmstart/decisions/cpu_pool.py); Auto Mode has its own `general-purpose`.
"""

from __future__ import annotations

from typing import Any

from .. import versions
from ..decisions import placement, soci
from ..plan.records import CpuPoolPlan, PoolPlan

NODEPOOL_API = "karpenter.sh/v1"
# (apiVersion, group, kind) of each mode's node class.
NODE_CLASS: dict[placement.ClusterMode, tuple[str, str, str]] = {
    "auto": ("eks.amazonaws.com/v1", "eks.amazonaws.com", "NodeClass"),
    "karpenter": ("karpenter.k8s.aws/v1", "karpenter.k8s.aws", "EC2NodeClass"),
}

# Karpenter-mode root EBS volume. With RAID0 the kubelet and containerd state live on the
# NVMe (https://karpenter.sh/v1.14/concepts/nodeclasses/#specinstancestorepolicy), so the root
# volume holds the OS only. It is kept well below the
# smallest NVMe the pools allow, so the start-up check's size test can tell the two apart.
ROOT_VOLUME_GIB = 100
# IMDSv2 only, and one hop: pods cannot reach the node role's credentials (they use IRSA).
METADATA_OPTIONS = {"httpEndpoint": "enabled", "httpProtocolIPv6": "disabled",
                    "httpPutResponseHopLimit": 1, "httpTokens": "required"}

# Disruption (both modes). A GPU pod that is evicted starts cold, and a pod evicted while it
# loads loses the minutes already spent streaming weights, so:
# - consolidationPolicy WhenEmpty: Karpenter never moves a running (or loading) serving pod to
#   repack nodes; it only removes a node with no serving pod left on it;
# - consolidateAfter: an emptied node (image and compile cache on its NVMe) is kept 15 min,
#   so a rollout's next pod or a scale back up lands on it warm;
# - one node at a time for any voluntary disruption (drift after an AMI bump, emptiness),
#   on top of each model's PodDisruptionBudget (maxUnavailable 1).
CONSOLIDATION_POLICY = "WhenEmpty"
CONSOLIDATE_AFTER = "15m"
DISRUPTION_BUDGETS = ({"nodes": "1"},)
# Karpenter mode: the AMI is pinned (versions.KARPENTER_AMI_ALIAS), so expiring a node would
# only replace it with an identical one and force cold starts; AMI updates arrive as drift
# when the pin is bumped. Auto Mode keeps its own lifetime cap (it patches its nodes itself).
KARPENTER_EXPIRE_AFTER = "Never"
# Auto Mode NodeClass: enforce NetworkPolicies, allowing what no policy selects (the serving
# and import pods carry their own policies, manifests/network_policy.py).
NETWORK_POLICY_DEFAULT = "DefaultAllow"


def node_class_ref(mode: placement.ClusterMode, pool: PoolPlan) -> dict[str, str]:
    _, group, kind = NODE_CLASS[mode]
    return {"group": group, "kind": kind, "name": pool.name}


def _metadata(pool: PoolPlan | CpuPoolPlan) -> dict[str, Any]:
    return {"name": pool.name, "labels": {"app.kubernetes.io/part-of": "warmstart",
                                          "app.kubernetes.io/managed-by": "pulumi"}}


def node_class(mode: placement.ClusterMode, pool: PoolPlan, *, role: Any, subnet_terms: Any,
               security_group_terms: Any, tags: dict[str, str] | None = None) -> dict[str, Any]:
    """The pool's node class. `role` is the node IAM role NAME; selector terms may be Outputs."""
    api, _, kind = NODE_CLASS[mode]
    if mode == "auto":
        assert pool.ephemeral_storage_gib is not None
        spec: dict[str, Any] = {
            "role": role,
            "subnetSelectorTerms": subnet_terms,
            "securityGroupSelectorTerms": security_group_terms,
            # Below the pool's smallest NVMe (plan_cluster / gpu_pools), so Auto Mode formats
            # the NVMe as RAID0 for ephemeral storage; at or above it the cache lands on EBS.
            "ephemeralStorage": {"size": f"{pool.ephemeral_storage_gib}Gi"},
            # Nodes of this class enforce NetworkPolicies (with the cluster's network policy
            # controller on, components/cluster.py); pods no policy selects stay open
            # (https://docs.aws.amazon.com/eks/latest/userguide/auto-net-pol.html).
            "networkPolicy": NETWORK_POLICY_DEFAULT,
            # No `tags`: custom tags need extra tagging permissions on the cluster role
            # (https://docs.aws.amazon.com/eks/latest/userguide/create-node-class.html); the
            # cluster's tags reach the nodes through Auto Mode.
        }
    else:
        spec = {
            "role": role,
            "amiSelectorTerms": [{"alias": versions.KARPENTER_AMI_ALIAS}],
            "subnetSelectorTerms": subnet_terms,
            "securityGroupSelectorTerms": security_group_terms,
            # Without it Karpenter ignores the instance-store disks
            # (https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html#model-loading-nvme-instance-store).
            "instanceStorePolicy": "RAID0",
            "blockDeviceMappings": [{"deviceName": "/dev/xvda", "rootVolume": True, "ebs": {
                "volumeSize": f"{ROOT_VOLUME_GIB}Gi", "volumeType": "gp3", "encrypted": True,
                "deleteOnTermination": True}}],
            "metadataOptions": METADATA_OPTIONS,
            # nodeadm's NodeConfig: SOCI parallel pull (`FastImagePull`), with the SOCI store on
            # the RAID0 array (warmstart/decisions/soci.py; Auto Mode has it built in).
            "userData": soci.user_data(),
            # Provider default tags do not reach instances Karpenter launches; these do.
            "tags": dict(sorted((tags or {}).items())),
        }
    if pool.capacity.reservation_terms:
        # The reservations the pool launches into (ODCRs or Capacity Blocks); the terms are ORed.
        # Karpenter: https://karpenter.sh/docs/tasks/odcrs/ (EC2NodeClass `ownerID`); Auto Mode:
        # https://docs.aws.amazon.com/eks/latest/userguide/auto-odcr.html (NodeClass `owner`).
        spec["capacityReservationSelectorTerms"] = pool.capacity.selector_terms(mode)
    return {"apiVersion": api, "kind": kind, "metadata": _metadata(pool), "spec": spec}


def requirements(mode: placement.ClusterMode, pool: PoolPlan) -> list[dict[str, Any]]:
    """What a node must be to join the pool: one of its instance types, of one of its capacity
    types (`reserved` only with the node class's reservation selector: both engines then try the
    reservations first, then spot, then on-demand), with NVMe that holds what the pool caches,
    and enough GPUs; a node without NVMe never matches (the label is absent there)."""
    reqs = [
        {"key": placement.INSTANCE_TYPE_LABEL, "operator": "In", "values": list(pool.instance_types)},
        {"key": placement.CAPACITY_TYPE_LABEL, "operator": "In", "values": list(pool.capacity_types)},
        {"key": placement.local_nvme_label(mode), "operator": "Gt", "values": [str(pool.nvme_label_floor)]},
        {"key": placement.gpu_count_label(mode), "operator": "Gt", "values": [str(pool.gpu_count_label_floor)]},
    ]
    return sorted(reqs, key=lambda r: r["key"])


def node_pool(mode: placement.ClusterMode, pool: PoolPlan) -> dict[str, Any]:
    """The pool's `karpenter.sh/v1` NodePool."""
    template_spec: dict[str, Any] = {
        "nodeClassRef": node_class_ref(mode, pool),
        "requirements": requirements(mode, pool),
        # Only pods that tolerate it (the serving pods) land on GPU nodes.
        "taints": [{"key": placement.GPU_TAINT_KEY, "effect": placement.GPU_TAINT_EFFECT}],
    }
    template: dict[str, Any] = {"spec": template_spec}
    if mode == "karpenter":
        template_spec["expireAfter"] = KARPENTER_EXPIRE_AFTER
        # Selects the nodes for the NVIDIA device plugin's DaemonSet (its default affinity).
        template["metadata"] = {"labels": {placement.NVIDIA_GPU_PRESENT_LABEL: "true"}}
    return {
        "apiVersion": NODEPOOL_API,
        "kind": "NodePool",
        "metadata": _metadata(pool),
        "spec": {
            "template": template,
            # Karpenter counts the GPUs of the nodes it launched against this.
            "limits": {placement.GPU_RESOURCE: str(pool.max_gpus)},
            "disruption": {"consolidationPolicy": CONSOLIDATION_POLICY, "consolidateAfter": CONSOLIDATE_AFTER,
                           "budgets": [dict(b) for b in DISRUPTION_BUDGETS]},
        },
    }


# --- Karpenter mode: the elastic CPU NodePool of the non-GPU pods ----------------------------
# Root volume of its nodes (kubelet, images and pod scratch live there): the 80 GiB a weights
# import's Hub download may take (decisions/weights_import.py NODE_EPHEMERAL_BYTES, as much as Auto
# Mode's default NodeClass gives its general-purpose nodes,
# https://docs.aws.amazon.com/eks/latest/userguide/create-node-class.html), plus the model's vLLM
# image unpacked (about 20 GiB) and the OS.
CPU_ROOT_VOLUME_GIB = 120
# Routers and KEDA keep a PodDisruptionBudget; the pool repacks underused nodes, one at a time.
CPU_CONSOLIDATION_POLICY = "WhenEmptyOrUnderutilized"
CPU_CONSOLIDATE_AFTER = "5m"


def cpu_node_class(pool: CpuPoolPlan, *, role: Any, subnet_terms: Any, security_group_terms: Any,
                   tags: dict[str, str] | None = None) -> dict[str, Any]:
    """The CPU pool's EC2NodeClass: the GPU pools' node role, subnets, security groups, AMI pin
    and instance metadata settings (IMDSv2, one hop), an encrypted root volume, no instance store."""
    api, _, kind = NODE_CLASS["karpenter"]
    spec = {
        "role": role,
        "amiSelectorTerms": [{"alias": versions.KARPENTER_AMI_ALIAS}],
        "subnetSelectorTerms": subnet_terms,
        "securityGroupSelectorTerms": security_group_terms,
        "blockDeviceMappings": [{"deviceName": "/dev/xvda", "rootVolume": True, "ebs": {
            "volumeSize": f"{CPU_ROOT_VOLUME_GIB}Gi", "volumeType": "gp3", "encrypted": True,
            "deleteOnTermination": True}}],
        "metadataOptions": METADATA_OPTIONS,
        "tags": dict(sorted((tags or {}).items())),
    }
    return {"apiVersion": api, "kind": kind, "metadata": _metadata(pool), "spec": spec}


def cpu_node_pool(pool: CpuPoolPlan) -> dict[str, Any]:
    """The CPU pool's NodePool: on-demand general-purpose types, no taint (any pod without a GPU
    may land here, Karpenter's own controller never: its affinity excludes every node a NodePool
    launched), capped at the planned CPU limit."""
    _, group, kind = NODE_CLASS["karpenter"]
    reqs = [
        {"key": placement.INSTANCE_TYPE_LABEL, "operator": "In", "values": list(pool.instance_types)},
        {"key": placement.CAPACITY_TYPE_LABEL, "operator": "In", "values": ["on-demand"]},
        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
    ]
    return {
        "apiVersion": NODEPOOL_API,
        "kind": "NodePool",
        "metadata": _metadata(pool),
        "spec": {
            "template": {"spec": {
                "nodeClassRef": {"group": group, "kind": kind, "name": pool.name},
                "requirements": sorted(reqs, key=lambda r: r["key"]),
            }},
            "limits": {"cpu": str(pool.cpu_limit)},
            "disruption": {"consolidationPolicy": CPU_CONSOLIDATION_POLICY, "consolidateAfter": CPU_CONSOLIDATE_AFTER,
                           "budgets": [dict(b) for b in DISRUPTION_BUDGETS]},
        },
    }
