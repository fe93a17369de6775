"""The EKS cluster, in EKS Auto Mode or with self-managed Karpenter, and its GPU capacity.

Both modes: a pulumi-eks cluster in the stack's private subnets, access entries only (no
aws-auth ConfigMap), an IAM OIDC provider for IRSA, control-plane logs with a retention,
a Kubernetes provider for everything deployed into the cluster, and one node class plus one
NodePool per GPU pool whose nodes put their ephemeral storage on local NVMe.

- auto: Auto Mode runs the nodes; the GPU node classes name a dedicated node role that has
  the EC2-type access entry with AmazonEKSAutoNodePolicy
  (https://docs.aws.amazon.com/eks/latest/userguide/create-node-class.html#auto-node-access-entry;
  without it nodes never join, silently).
- karpenter: a small managed system node group for the controller and CoreDNS, then the
  Karpenter component (karpenter.py), EC2NodeClasses with RAID0 instance store, and the
  elastic `general-purpose` NodePool every other non-GPU pod runs on.

Access: `admins` get cluster-admin and `viewers` read-only (Secrets included) access entries.
The identity that creates the cluster already has cluster-admin through the creator entry EKS
makes for it (pulumi-eks sets `bootstrapClusterCreatorAdminPermissions`), so it must be in
neither list: a second access entry for it fails the `up` with 409. The entries are the same
whoever runs the program (the nightly drift preview runs as a viewer, `up` as the deployer);
only the check that the creating identity is in neither list asks AWS who runs it.
See docs/cluster-modes.md.
"""

from typing import Any, NotRequired, Optional, TypedDict

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks
import pulumi_kubernetes as k8s

from warmstart import versions
from warmstart.config import ClusterConfig, GpuPool, SystemNodeGroupConfig
from warmstart.decisions import cluster_access, iam, image_cache, karpenter, naming, placement
from warmstart.decisions.network import KARPENTER_DISCOVERY_TAG
from warmstart.errors import ConfigError
from warmstart.plan import platform_rules
from warmstart.plan.cluster import ClusterPlan, plan_cluster_layer, pool_model_of

from .enums import ClusterMode, mode_value
from .gpu_pools import GpuPools, GpuPoolsArgs
from .karpenter import Karpenter, KarpenterArgs
from .section_args import (CapacityBlockSectionArgs, CapacityReservationSectionArgs, ClusterSectionArgs,
                           GpuPoolSectionArgs, PoolCapacitySectionArgs, SystemNodeGroupSectionArgs)
from .sections import nested_section, section_config, section_entry
from .providers import kubernetes_provider

# Auto Mode's built-in NodePools: `system` for add-ons, `general-purpose` for any non-GPU pod.
AUTO_MODE_BUILTIN_POOLS = ("general-purpose", "system")
# The ConfigMap whose `enable-network-policy-controller` turns NetworkPolicy enforcement on in
# Auto Mode.
AUTO_MODE_CNI_CONFIGMAP = "amazon-vpc-cni"


class PoolModelArgs(TypedDict):
    """A model that will run on a GPU pool: what the pool's limits and NVMe floor are sized for."""

    pool: str
    """The pool it runs on (a `gpuPools[].name`)."""
    name: str
    """The model's name."""
    instance_type: str
    """The instance type its pods run on."""
    tensor_parallel_size: int
    """GPUs per pod."""
    replicas: NotRequired[int]
    """Pods (default 1)."""
    compile_cache: NotRequired[bool]
    """Whether it keeps a compile cache on the nodes' NVMe (default true)."""
    staged_bytes: NotRequired[int]
    """Bytes of weights it stages on the nodes' NVMe (the node cache; default 0): a node must
    hold two versions of them."""


# The pool sections' Args as they were named before they were generated from the config
# (components/section_args.py); Python programs that import these names keep working. A
# `GpuPoolArgs` no longer holds its `models`: they are `ClusterArgs.pool_models`, each naming its
# pool (a pool's `models` is still read, with a deprecation warning).
GpuPoolArgs = GpuPoolSectionArgs
PoolCapacityArgs = PoolCapacitySectionArgs
CapacityReservationArgs = CapacityReservationSectionArgs
CapacityBlockArgs = CapacityBlockSectionArgs
SystemNodeGroupArgs = SystemNodeGroupSectionArgs


class ClusterArgs(TypedDict):
    """Inputs of the Cluster component: the cluster's settings and GPU pools, as the stack
    config's `cluster` and `gpuPools` sections, beside what is wired in (the network, the names,
    the sizes a stack's plan derived)."""

    cluster_name: str
    """EKS cluster name."""
    mode: ClusterMode
    """EKS Auto Mode, or self-managed Karpenter."""
    region: str
    """AWS region."""
    vpc_id: pulumi.Input[str]
    """The VPC (e.g. the Network component's `vpcId`)."""
    private_subnet_ids: pulumi.Input[list[str]]
    """Private subnets: control-plane ENIs, system nodes, GPU nodes."""
    gpu_pools: list[GpuPoolSectionArgs]
    """GPU node pools, as the stack config's `gpuPools`."""
    cluster: NotRequired[ClusterSectionArgs]
    """The cluster's settings (access, logs, the Service range, the endpoint, the Karpenter-mode
    system node group), as the stack config's `cluster` section (default: every key at its
    default). Its keys were once given flat at the top of these Args; that still works for a
    Python caller, with a deprecation warning. Its `serviceCidr` unset: EKS picks 10.100.0.0/16
    or 172.20.0.0/16; give it (the warmstart stack does) when NetworkPolicies must name the API
    server's ClusterIP."""
    pool_models: NotRequired[list[PoolModelArgs]]
    """The models that will run on the pools, each naming its pool (sizing only; they are
    deployed by VllmModel). Default: none, so a pool's derived GPU limit is one node of its
    largest type."""
    public_subnet_ids: NotRequired[pulumi.Input[list[str]]]
    """Public subnets for internet-facing load balancers (may be empty)."""
    name_prefix: NotRequired[str]
    """Prefix of the IAM role names (default: the cluster name)."""
    kubernetes_version: NotRequired[str]
    """EKS Kubernetes version."""
    system_node_group_size: NotRequired[int]
    """Karpenter mode: the system node group's size where `cluster.systemNodeGroup.size` is unset,
    as a stack's plan derived it from everything that runs there. Default: the fewest nodes (at
    least 2) that hold the Karpenter controller and CoreDNS."""
    cpu_pool_cpu_limit: NotRequired[int]
    """Karpenter mode: `limits.cpu` of the `general-purpose` NodePool that every non-GPU pod
    (routers, weights imports, KEDA) runs on (default: room for 16 routed, imported model stacks
    plus a node; the warmstart stack adds its own pods)."""
    node_tags: NotRequired[dict[str, str]]
    """Tags of the instances Karpenter or Auto Mode launches for the GPU pools (provider default
    tags do not reach them); the warmstart stack gives the tags it puts on every resource. Once
    `tags`, a name still read with a deprecation warning (it is not the stack config's own
    `tags`, which are only part of these)."""
    image_cache_account: NotRequired[str]
    """The account whose ECR pull-through cache of Docker Hub (repository prefix `docker-hub`,
    e.g. the ServingPlatform component's) serves the nodes' images: every node role may then
    import an image there on its first pull. Default: none."""


def cluster_config(args: ClusterArgs, resource: pulumi.Resource | None = None) -> tuple[ClusterConfig, str]:
    """The `cluster` section of the Args as the config model, and the key of its errors; with
    `system_node_group_size` as the group's size where the section leaves it unset."""
    section, key = nested_section(ClusterConfig, args, "cluster", "ClusterArgs", resource)
    size, group = args.get("system_node_group_size"), section.system_node_group
    if size is not None and group is not None and group.size is None:
        section = section.model_copy(update={"system_node_group": section_config(
            SystemNodeGroupConfig, section_entry(group) | {"size": size}, f"{key}.systemNodeGroup")})
    return section, key


def node_tags(args: ClusterArgs, resource: pulumi.Resource | None = None) -> dict[str, str]:
    """`node_tags`, or the deprecated `tags` it was called before."""
    if "tags" not in args:
        return dict(args.get("node_tags") or {})
    if "node_tags" in args:
        raise ConfigError("ClusterArgs.tags", "is the deprecated name of nodeTags, and nodeTags is given too",
                          "give only nodeTags")
    pulumi.log.warn("ClusterArgs: `tags` is deprecated; pass the nodes' tags as `nodeTags`", resource=resource)
    return dict(args["tags"] or {})  # type: ignore[typeddict-item]


def _pool_models(args: ClusterArgs, resource: pulumi.Resource | None) -> list[tuple[str, dict[str, Any]]]:
    """Each model a pool is sized for with its key: `pool_models`, then the deprecated `models`
    of each pool (given with their pool's name)."""
    found = [(f"ClusterArgs.poolModels[{j}]", dict(m)) for j, m in enumerate(args.get("pool_models") or [])]
    for i, pool in enumerate(args["gpu_pools"]):
        legacy = pool.get("models")  # type: ignore[typeddict-item]
        if legacy:
            pulumi.log.warn(f"ClusterArgs.gpuPools[{i}].models is deprecated; pass the models as "
                            "`poolModels`, each with its `pool`", resource=resource)
            found += [(f"ClusterArgs.gpuPools[{i}].models[{j}]", {"pool": pool.get("name")} | dict(m))
                      for j, m in enumerate(legacy)]
    return found


def plan(args: ClusterArgs, resource: pulumi.Resource | None = None,
         config: tuple[ClusterConfig, str] | None = None) -> ClusterPlan:
    """The cluster's decisions from its Args alone (pure planners; ConfigErrors keyed `ClusterArgs.*`);
    `config`: what `cluster_config(args)` gave, when the caller has it already."""
    section, key = config or cluster_config(args, resource)
    models = _pool_models(args, resource)
    names = [str(p.get("name")) for p in args["gpu_pools"]]
    side = platform_rules.cluster_component(args["cluster_name"])
    for where, m in models:
        # The one rule of a model's pool (a stack's models, a model stack's, a ServedModel's).
        problem = platform_rules.pool_problem(m.get("pool"), names, where, side)  # type: ignore[arg-type]
        if problem:
            raise ConfigError(*problem)
    pools = []
    for i, pool in enumerate(args["gpu_pools"]):
        where = f"ClusterArgs.gpuPools[{i}]"
        spec = section_config(GpuPool, {k: v for k, v in pool.items() if k != "models"}, where)
        pools.append((spec, [pool_model_of(m["name"], m["instance_type"], m["tensor_parallel_size"],
                                           m.get("replicas", 1), m.get("compile_cache", True), key=at,
                                           staged_bytes=m.get("staged_bytes", 0))
                             for at, m in models if m["pool"] == spec.name]))
    return plan_cluster_layer(
        section, pools, mode=mode_value(args["mode"]),  # type: ignore[arg-type]
        name=args["cluster_name"], kubernetes_version=args.get("kubernetes_version") or versions.DEFAULT_KUBERNETES_VERSION,
        region=args["region"], key=key, pools_key="ClusterArgs.gpuPools",
        cpu_limit=args.get("cpu_pool_cpu_limit"))


class Cluster(pulumi.ComponentResource):
    """An EKS cluster, in Auto Mode or with Karpenter, with GPU node pools whose nodes keep their
    caches on RAID0 NVMe.

    Besides the outputs, Python programs get `kubernetes_provider` (for every object deployed
    into the cluster), `eks`, `karpenter`, `system_node_group`, `gpu_pools` and `ready` (what
    serving pods must wait for)."""

    cluster_name: pulumi.Output[str]
    """EKS cluster name."""
    kubeconfig: pulumi.Output[str]
    """Kubeconfig (JSON, secret) that authenticates with `aws eks get-token`."""
    oidc_provider_arn: pulumi.Output[str]
    """ARN of the cluster's IAM OIDC provider (IRSA trust principal)."""
    oidc_issuer: pulumi.Output[str]
    """OIDC issuer WITHOUT `https://` (IRSA condition-key prefix, e.g. `oidc.eks.<region>...`)."""
    security_group_id: pulumi.Output[str]
    """The EKS-created cluster security group, shared by the control plane and every node."""
    gpu_node_role_name: pulumi.Output[str]
    """Name of the IAM role of the GPU nodes (the node classes name it)."""

    def __init__(self, name: str, args: ClusterArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        super().__init__("warmstart:index:Cluster", name, None, opts)
        # Every decision is made here, from the Args alone, by the pure planners; the sections are
        # read through the config models, so their defaults and rules are the stack config's.
        self.config, self._key = cluster_config(args, self)
        self.plan: ClusterPlan = plan(args, self, (self.config, self._key))
        p = self.plan
        service_cidr = self.config.service_cidr
        # Before anything is registered: an `up` it refuses must not have started the cluster.
        self._check_creator_not_listed()
        name_prefix = args.get("name_prefix") or p.name
        region = args["region"]
        private_subnet_ids = args["private_subnet_ids"]
        child = pulumi.ResourceOptions(parent=self)

        # EKS writes control-plane logs to this group; creating it first sets a retention
        # (EKS's own group would keep them forever).
        log_group = aws.cloudwatch.LogGroup(
            f"{name}-logs", name=f"/aws/eks/{p.name}/cluster", retention_in_days=p.log_retention_days, opts=child)

        auto = p.mode == "auto"
        self.eks = eks.Cluster(
            f"{name}-eks",
            name=p.name,
            version=p.kubernetes_version,
            kubernetes_service_ip_address_range=service_cidr,
            vpc_id=args["vpc_id"],
            private_subnet_ids=private_subnet_ids,
            public_subnet_ids=args.get("public_subnet_ids", []),
            # The private endpoint always (nodes and pods reach the API inside the VPC); the public
            # one as the stack says, for the blocks it names
            # (https://docs.aws.amazon.com/eks/latest/userguide/cluster-endpoint.html).
            endpoint_private_access=True,
            endpoint_public_access=p.endpoint_public_access,
            public_access_cidrs=list(p.public_access_cidrs) if p.endpoint_public_access else None,
            # Access entries only: no aws-auth ConfigMap to drift.
            authentication_mode=eks.AuthenticationMode.API,
            create_oidc_provider=True,
            enabled_cluster_log_types=list(p.log_types),
            skip_default_node_group=True,
            # Nodes and control plane share the EKS-created cluster security group (the one
            # GPU node classes select), instead of pulumi-eks's separate node/cluster groups.
            skip_default_security_groups=True,
            tags={"Name": p.name},
            # Auto Mode: compute, block storage and load balancing managed by EKS, the
            # built-in pools for add-ons and non-GPU pods; GPU pools are ours (below).
            auto_mode=eks.AutoModeOptionsArgs(
                enabled=True, compute_config=eks.ClusterComputeConfigArgs(node_pools=list(AUTO_MODE_BUILTIN_POOLS)),
            ) if auto else None,
            bootstrap_self_managed_addons=False if auto else None,
            # Karpenter mode: the VPC CNI add-on pulumi-eks installs runs its network policy agent,
            # so NetworkPolicies are enforced
            # (https://docs.aws.amazon.com/eks/latest/userguide/cni-network-policy-configure.html).
            # Auto Mode ignores VPC CNI options; its enforcement is the ConfigMap below.
            vpc_cni_options=None if auto else eks.VpcCniOptionsArgs(enable_network_policy=True),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[log_group]),
        )
        after_cluster = pulumi.ResourceOptions(parent=self, depends_on=[self.eks])
        self.oidc_provider_arn = self.eks.oidc_provider_arn
        self.oidc_issuer = self.eks.oidc_issuer
        self.security_group_id = self.eks.cluster_security_group_id
        self.cluster_name = pulumi.Output.from_input(p.name)
        self.service_cidr = service_cidr
        self.kubeconfig = pulumi.Output.secret(self.eks.kubeconfig_json)
        self.kubernetes_provider = kubernetes_provider(name, self.eks.kubeconfig_json, child)

        for role, arns, policy in (("admin", p.admins, cluster_access.CLUSTER_ADMIN_ACCESS_POLICY),
                                   ("viewer", p.viewers, cluster_access.VIEWER_ACCESS_POLICY)):
            for arn in arns:
                key = naming.short_hash(arn)
                entry = aws.eks.AccessEntry(f"{name}-{role}-{key}", cluster_name=p.name, principal_arn=arn,
                                            type="STANDARD", opts=after_cluster)
                aws.eks.AccessPolicyAssociation(
                    f"{name}-{role}-{key}", cluster_name=p.name, principal_arn=arn,
                    policy_arn=cluster_access.access_policy_arn(p.partition, policy),
                    access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"),
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[entry]))

        self.karpenter = None
        self.system_node_group = None
        k8s_child = pulumi.ResourceOptions(parent=self, provider=self.kubernetes_provider)
        if auto:
            # Auto Mode enforces NetworkPolicies only once this ConfigMap turns the network
            # policy controller on (and on nodes whose NodeClass sets `networkPolicy`,
            # manifests/gpu_pools.py): https://docs.aws.amazon.com/eks/latest/userguide/auto-net-pol.html
            k8s.core.v1.ConfigMap(
                f"{name}-network-policy", metadata={"name": AUTO_MODE_CNI_CONFIGMAP, "namespace": "kube-system"},
                data={"enable-network-policy-controller": "true"}, opts=k8s_child)
            role, node_access = self._auto_mode_node_role(name, name_prefix)
            self.gpu_node_role = role
            subnets = pulumi.Output.from_input(private_subnet_ids).apply(
                lambda ids: [{"id": i} for i in sorted(ids)])
            groups = pulumi.Output.from_input(self.security_group_id).apply(lambda sg: [{"id": sg}])
            pool_deps: list[pulumi.Resource] = [self.eks, node_access]
        else:
            assert p.system_node_group is not None  # plan_cluster requires it in karpenter mode
            self.system_node_group = self._system_node_group(name, name_prefix, private_subnet_ids)
            # Karpenter finds the security group by the same discovery tag the network layer
            # puts on the private subnets.
            sg_tag = aws.ec2.Tag(f"{name}-sg-discovery", resource_id=self.security_group_id,
                                 key=KARPENTER_DISCOVERY_TAG, value=p.name, opts=after_cluster)
            self.karpenter = Karpenter(f"{name}-karpenter", KarpenterArgs(
                plan=p, name_prefix=name_prefix, region=region,
                oidc_provider_arn=self.oidc_provider_arn, oidc_issuer=self.oidc_issuer,
                kubernetes_provider=self.kubernetes_provider, system_nodes=self.system_node_group,
                cluster=self.eks), opts=child)
            self.gpu_node_role = self.karpenter.node_role
            discovery = [{"tags": {KARPENTER_DISCOVERY_TAG: p.name}}]
            subnets, groups = discovery, discovery
            pool_deps = [self.karpenter.controller, sg_tag]

        self.gpu_pools = GpuPools(f"{name}-gpu", GpuPoolsArgs(
            plan=p, node_role_name=self.gpu_node_role.name, subnet_selector_terms=subnets,
            security_group_selector_terms=groups, tags=node_tags(args, self)),
            opts=pulumi.ResourceOptions.merge(k8s_child, pulumi.ResourceOptions(depends_on=pool_deps)))
        self.gpu_node_role_name = self.gpu_node_role.name
        # Every role whose nodes pull images: the GPU nodes', and the non-GPU nodes' (Auto Mode's
        # built-in pools run as the cluster's Auto Mode node role, which pulumi-eks creates; the
        # Karpenter-mode system node group as its own role).
        self.node_role_names: list[pulumi.Output[str]] = [
            self.gpu_node_role_name, self.eks.auto_mode_node_role_name if auto else self.system_node_role_name]
        self.ready = [self.gpu_pools] + ([self.karpenter.device_plugin] if self.karpenter else [])
        if args.get("image_cache_account"):
            self.ready += self._pull_through_access(name, region, args["image_cache_account"], opts)
        self.register_outputs({
            "clusterName": self.cluster_name,
            "oidcProviderArn": self.oidc_provider_arn,
            "oidcIssuer": self.oidc_issuer,
            "kubeconfig": self.kubeconfig,
            "securityGroupId": self.security_group_id,
            "gpuNodeRoleName": self.gpu_node_role_name,
        })

    def _pull_through_access(self, name: str, region: str, account: str, opts: Optional[pulumi.ResourceOptions]
                             ) -> list[pulumi.Resource]:
        """Each node role that can be the first to pull a cached image may import it: the GPU
        nodes', and the non-GPU nodes', where the weights import Job runs the model's image before
        any GPU node has pulled it (https://docs.aws.amazon.com/AmazonECR/latest/userguide/pull-through-cache-iam.html)."""
        p = self.plan
        policy = iam.to_json(image_cache.node_pull_through_policy(p.partition, region, account))
        # These were the warmstart stack's own children, `<stack>-<which>-node-pull-through`.
        legacy = name.removesuffix("-cluster")
        parent = opts.parent if opts is not None else None
        return [aws.iam.RolePolicy(
            f"{name}-{which}-node-pull-through", role=role, name="warmstart-pull-through", policy=policy,
            opts=pulumi.ResourceOptions(parent=self, aliases=[pulumi.Alias(
                name=f"{legacy}-{which}-node-pull-through", parent=parent)] if parent is not None else None))
            for which, role in zip(("gpu", "system"), self.node_role_names)]

    def _check_creator_not_listed(self) -> None:
        """Refuse an `up` that would create the cluster as a principal listed in `admins` or
        `viewers`: EKS gives the creator an access entry of its own, so ours would fail with 409
        "already in use" after the cluster exists. A preview only warns (the read-only CI role
        that previews is a viewer, and never creates the cluster).

        Why a check and not "skip the deployer's entry": which entries exist must not depend on
        who runs the program. The drift preview runs as the read-only role, `up` as the deployer;
        an entry skipped for whoever runs would show up as a change in every drift check (or be
        deleted by the next `up` of another identity). Once the cluster exists, its creator is
        no longer who runs the program, so nothing is compared (listing the creator then fails
        with EKS's own 409; docs/cluster-modes.md says how to adopt its entry instead)."""
        p = self.plan
        if not (p.admins or p.viewers):
            return
        opts = pulumi.InvokeOptions(parent=self)
        if p.name in (aws.eks.get_clusters(opts=opts).names or []):
            return
        deployer = deploying_principal(opts)
        for field, arns in (("admins", p.admins), ("viewers", p.viewers)):
            if deployer not in arns:
                continue
            error = ConfigError(
                f"{self._key}.{field}", f"lists the identity that is creating cluster {p.name}: EKS gives "
                "the cluster's creator a cluster-admin access entry of its own "
                "(bootstrapClusterCreatorAdminPermissions), so a second one fails with 409 \"already in use\"",
                f"remove it from cluster.{field} (it is admin as the creator), or create the cluster as another "
                "identity", deployer)
            if pulumi.runtime.is_dry_run():
                pulumi.log.warn(f"{error} (an `up` as this identity is refused)", resource=self)
            else:
                raise error

    def _auto_mode_node_role(self, name: str, name_prefix: str) -> tuple[aws.iam.Role, pulumi.Resource]:
        """Node role of the GPU NodeClasses and its EC2-type access entry
        (https://docs.aws.amazon.com/eks/latest/userguide/create-node-class.html)."""
        p = self.plan
        child = pulumi.ResourceOptions(parent=self)
        role_name = f"{name_prefix}-gpu-node"
        role = aws.iam.Role(
            f"{name}-gpu-node", name=role_name, assume_role_policy=iam.to_json(karpenter.ec2_trust_policy()),
            description=f"warmstart: GPU nodes of EKS Auto Mode cluster {p.name}",
            tags={"Name": role_name}, opts=child)
        for policy in karpenter.AUTO_NODE_ROLE_POLICIES:
            aws.iam.RolePolicyAttachment(f"{name}-gpu-node-{policy}", role=role.name,
                                         policy_arn=karpenter.managed_policy_arn(p.partition, policy), opts=child)
        # EKS creates this entry only for the cluster's own Auto Mode node role; a NodeClass
        # that names another role without it launches nodes that never join.
        entry = aws.eks.AccessEntry(f"{name}-gpu-node", cluster_name=p.name, principal_arn=role.arn, type="EC2",
                                    opts=pulumi.ResourceOptions(parent=self, depends_on=[self.eks]))
        association = aws.eks.AccessPolicyAssociation(
            f"{name}-gpu-node", cluster_name=p.name, principal_arn=role.arn,
            policy_arn=cluster_access.access_policy_arn(p.partition, cluster_access.AUTO_NODE_ACCESS_POLICY),
            access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[entry]))
        return role, association

    def _system_node_group(self, name: str, name_prefix: str,
                           subnet_ids: pulumi.Input[list[str]]) -> aws.eks.NodeGroup:
        """Managed node group for the Karpenter controller and the add-ons (karpenter mode)."""
        p = self.plan
        assert p.system_node_group is not None  # plan_cluster_layer plans one in karpenter mode
        child = pulumi.ResourceOptions(parent=self)
        role_name = f"{name_prefix}-system-node"
        role = aws.iam.Role(
            f"{name}-system-node", name=role_name, assume_role_policy=iam.to_json(karpenter.ec2_trust_policy()),
            description=f"warmstart: system nodes of cluster {p.name}", tags={"Name": role_name}, opts=child)
        self.system_node_role_name = role.name
        attachments = [aws.iam.RolePolicyAttachment(
            f"{name}-system-node-{policy}", role=role.name,
            policy_arn=karpenter.managed_policy_arn(p.partition, policy), opts=child)
            for policy in karpenter.SYSTEM_NODE_ROLE_POLICIES]
        size = p.system_node_group.size
        # EKS creates the EC2_LINUX access entry of a managed node group's role itself.
        return aws.eks.NodeGroup(
            f"{name}-system", cluster_name=p.name, node_group_name=f"{p.name}-system",
            node_role_arn=role.arn, subnet_ids=subnet_ids,
            instance_types=list(p.system_node_group.instance_types), capacity_type="ON_DEMAND",
            ami_type="AL2023_x86_64_STANDARD",
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(desired_size=size, min_size=size, max_size=size + 1),
            update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1),
            labels={placement.NODE_GROUP_LABEL: placement.SYSTEM_NODE_GROUP},
            tags={"Name": f"{p.name}-system"},
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.eks, *attachments]))


def deploying_principal(opts: pulumi.InvokeOptions) -> str:
    """The IAM principal ARN of whoever runs the program, as EKS names it in an access entry:
    an IAM user as it is, an assumed-role session as its role's ARN, path included (what
    `aws.iam.get_session_context` answers, with iam:GetRole; STS GetCallerIdentity gives the
    session, `arn:aws:sts::<acct>:assumed-role/<role>/<session>`). Plain invokes: the answer is
    known while the program runs, in a preview as in an `up`."""
    arn = aws.get_caller_identity(opts=opts).arn
    if ":assumed-role/" in arn:
        arn = aws.iam.get_session_context(arn=arn, opts=opts).issuer_arn
    return arn
