"""The elastic CPU NodePool of a warmstart platform, and what its non-GPU pods need of it (pure).

Karpenter's getting-started runs only the controller (and what it needs) on a fixed node group,
and everything else on nodes Karpenter launches
(https://karpenter.sh/v1.14/getting-started/getting-started-with-karpenter/); Auto Mode's built-in
`general-purpose` NodePool does the same for non-GPU pods
(https://docs.aws.amazon.com/eks/latest/userguide/set-builtin-node-pools.html). warmstart follows
both: in Karpenter mode it adds a `general-purpose` NodePool of its own (on-demand m6i/m7i nodes,
no GPU taint), so the routers and weights-import Jobs of any number of model stacks, KEDA and
node-feature-discovery land there, and the system node group holds the controller and CoreDNS.

Karpenter counts the capacity of the nodes it launched against a NodePool's `limits`
(https://karpenter.sh/v1.14/concepts/nodepools/#speclimits), whole nodes: the CPU limit is the
platform's own non-GPU pods at their peak, plus `MODEL_STACKS_CPU_MILLIS` kept for its model
stacks, plus one node of the largest type for the last node's unused part. Auto Mode's
`general-purpose` has no limit warmstart sets; there a pod only has to fit one of its nodes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from . import node_fit, placement

POOL = placement.GENERAL_PURPOSE_POOL
# On-demand general-purpose types the capacity model has figures for (warmstart/data/node_instances.csv);
# two generations, so one type's shortage in a zone does not stop a launch.
INSTANCE_TYPES = ("m6i.2xlarge", "m6i.large", "m6i.xlarge", "m7i.2xlarge", "m7i.large", "m7i.xlarge")
# What a platform keeps for its model stacks' non-GPU pods: 16 routed, imported model stacks at
# their peak (2 routers + a surge pod at 500m, and an import Job at 500m: 2 CPU each).
MODEL_STACKS_CPU_MILLIS = 32_000
# Auto Mode's general-purpose pool launches C, M and R instances of generation 5 or later,
# amd64, on-demand (the set-builtin-node-pools page above); the largest of them has 192 vCPUs
# (m7i.48xlarge, 768 GiB). A pod larger than that fits no node of the pool.
AUTO_MODE_LARGEST_VCPU = 192
AUTO_MODE_LARGEST_MEMORY_GIB = 768


def largest_type() -> str:
    return max(INSTANCE_TYPES, key=lambda t: (node_fit.node_type(t).vcpu, t))


def largest_allocatable(mode: placement.ClusterMode) -> node_fit.Allocatable:
    """What one node of the mode's `general-purpose` pool can offer a pod at most."""
    if mode == "auto":
        return node_fit.allocatable_of(AUTO_MODE_LARGEST_VCPU, AUTO_MODE_LARGEST_MEMORY_GIB)
    return node_fit.allocatable(largest_type())


def cpu_limit(own_pods: Sequence[node_fit.PodDemand]) -> int:
    """The Karpenter-mode pool's `limits.cpu` (whole CPUs) for a platform whose own non-GPU pods
    are `own_pods` (see the module docstring)."""
    own = sum(p.cpu_millis * p.count for p in own_pods)
    last_node = node_fit.node_type(largest_type()).vcpu * 1000
    return math.ceil((own + MODEL_STACKS_CPU_MILLIS + last_node) / 1000)


@dataclass(frozen=True)
class Room:
    """What a model's non-GPU pods ask of the pool, and why it does not hold them (empty: it does)."""

    requested_millis: int
    problems: tuple[str, ...]


def check_pods(mode: placement.ClusterMode, pods: Sequence[node_fit.PodDemand], *,
               budget_millis: int | None) -> Room:
    """Each pod fits one node of the mode's pool beside the node's DaemonSets, and (Karpenter
    mode) all of them at once fit `budget_millis`, what the pool's limit keeps for them."""
    alloc = largest_allocatable(mode)
    daemon_cpu = sum(d.cpu_millis for d in node_fit.NODE_DAEMONS)
    daemon_mem = sum(d.memory_mib for d in node_fit.NODE_DAEMONS)
    problems = []
    for p in pods:
        if p.cpu_millis > alloc.cpu_millis - daemon_cpu or p.memory_mib > alloc.memory_mib - daemon_mem:
            problems.append(f"{p.name} requests {p.cpu_millis}m CPU and {p.memory_mib}Mi, more than the largest "
                            f"{POOL} node offers a pod ({alloc.cpu_millis - daemon_cpu}m CPU, "
                            f"{alloc.memory_mib - daemon_mem}Mi beside its DaemonSets)")
    total = sum(p.cpu_millis * p.count for p in pods)
    if budget_millis is not None and total > budget_millis:
        parts = " + ".join(f"{p.count} x {p.cpu_millis}m ({p.name})" for p in pods)
        problems.append(f"its non-GPU pods request {parts} = {total}m CPU at their peak, more than the "
                        f"{budget_millis}m the {POOL} NodePool's CPU limit keeps for model stacks")
    return Room(total, tuple(problems))
