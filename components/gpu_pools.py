"""GPU capacity: one node class and one NodePool per GPU pool, on the cluster's provider; in
Karpenter mode also the elastic CPU NodePool of the non-GPU pods, on the same node role, subnets
and security groups.

A part of the Cluster component (not hosted on its own); the objects themselves are built by
`warmstart.manifests.gpu_pools` (pure, validated against the upstream CRD schemas).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from warmstart.manifests.gpu_pools import cpu_node_class, cpu_node_pool, node_class, node_pool
from warmstart.plan.cluster import ClusterPlan


@dataclass(frozen=True)
class GpuPoolsArgs:
    """Inputs of the GPU pools."""

    plan: ClusterPlan
    """Mode and per-pool decisions (the Cluster component's plan)."""
    node_role_name: pulumi.Input[str]
    """IAM role NAME the node classes give their nodes (it must have the mode's access entry)."""
    subnet_selector_terms: pulumi.Input[list[dict]]
    """Where GPU nodes go: the private subnets."""
    security_group_selector_terms: pulumi.Input[list[dict]]
    """Security groups of GPU nodes: the cluster security group."""
    tags: dict[str, str] = field(default_factory=dict)
    """EC2 tags of the launched instances (karpenter mode)."""


class GpuPools(pulumi.ComponentResource):
    """Node class + NodePool per GPU pool, on the cluster's Kubernetes provider."""

    node_classes: dict[str, k8s.apiextensions.CustomResource]
    """Node class (NodeClass or EC2NodeClass) per pool name."""
    node_pools: dict[str, k8s.apiextensions.CustomResource]
    """NodePool per pool name (the Karpenter-mode CPU pool's too)."""

    def __init__(self, name: str, args: GpuPoolsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("warmstart:cluster:GpuPools", name, None, opts)
        mode = args.plan.mode
        self.node_classes, self.node_pools = {}, {}
        for pool in args.plan.pools:
            nc = node_class(mode, pool, role=args.node_role_name, subnet_terms=args.subnet_selector_terms,
                            security_group_terms=args.security_group_selector_terms, tags=args.tags)
            self.node_classes[pool.name] = k8s.apiextensions.CustomResource(
                f"{name}-{pool.name}-nodeclass", api_version=nc["apiVersion"], kind=nc["kind"],
                metadata=nc["metadata"], spec=nc["spec"], opts=pulumi.ResourceOptions(parent=self))
            np_ = node_pool(mode, pool)
            self.node_pools[pool.name] = k8s.apiextensions.CustomResource(
                f"{name}-{pool.name}-nodepool", api_version=np_["apiVersion"], kind=np_["kind"],
                metadata=np_["metadata"], spec=np_["spec"],
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.node_classes[pool.name]]))
        cpu = args.plan.cpu_pool
        if cpu is not None:
            nc = cpu_node_class(cpu, role=args.node_role_name, subnet_terms=args.subnet_selector_terms,
                                security_group_terms=args.security_group_selector_terms, tags=args.tags)
            self.node_classes[cpu.name] = k8s.apiextensions.CustomResource(
                f"{name}-{cpu.name}-nodeclass", api_version=nc["apiVersion"], kind=nc["kind"],
                metadata=nc["metadata"], spec=nc["spec"], opts=pulumi.ResourceOptions(parent=self))
            np_ = cpu_node_pool(cpu)
            self.node_pools[cpu.name] = k8s.apiextensions.CustomResource(
                f"{name}-{cpu.name}-nodepool", api_version=np_["apiVersion"], kind=np_["kind"],
                metadata=np_["metadata"], spec=np_["spec"],
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.node_classes[cpu.name]]))
        self.register_outputs({})
