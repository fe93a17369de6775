"""Self-managed Karpenter on the cluster (clusterMode: karpenter), and the NVIDIA device plugin.

- The node role Karpenter passes to GPU nodes, with its EC2_LINUX access entry
  (https://docs.aws.amazon.com/eks/latest/userguide/creating-access-entries.html).
- The interruption queue, its policy and the EventBridge rules that feed it.
- The controller's IRSA role with the reference permissions (decisions/karpenter.py).
- The CRD chart, then the controller chart, pinned; the controller pinned to the system
  node group. The NVIDIA device plugin chart (Auto Mode has it built in; Karpenter nodes do not).
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from warmstart import versions
from warmstart.decisions import iam, karpenter
from warmstart.manifests.serving import IRSA_ROLE_ANNOTATION
from warmstart.plan.cluster import ClusterPlan


@dataclass(frozen=True)
class KarpenterArgs:
    """Inputs of the Karpenter controller."""

    plan: ClusterPlan
    """Cluster name and partition."""
    name_prefix: str
    """Prefix of IAM names."""
    region: str
    """Region of the cluster (scopes the controller's permissions)."""
    oidc_provider_arn: pulumi.Input[str]
    """The cluster's IAM OIDC provider (IRSA trust)."""
    oidc_issuer: pulumi.Input[str]
    """The issuer without `https://` (IRSA condition-key prefix)."""
    kubernetes_provider: k8s.Provider
    """The cluster's Kubernetes provider (for the charts)."""
    system_nodes: pulumi.Resource
    """The system node group the controller runs on (the charts wait for it)."""
    cluster: pulumi.Resource
    """The EKS cluster (access entries wait for it)."""


class Karpenter(pulumi.ComponentResource):
    """Karpenter controller, its AWS plumbing, and the NVIDIA device plugin (a part of the
    Cluster component in karpenter mode; not hosted on its own)."""

    node_role: aws.iam.Role
    """Role of the GPU nodes Karpenter launches (its NAME goes in every EC2NodeClass)."""
    controller_role: aws.iam.Role
    """The controller's IRSA role."""
    queue: aws.sqs.Queue
    """Interruption queue (named after the cluster, as the chart's settings expect)."""
    controller: k8s.helm.v3.Release
    """The controller release; node classes and pools wait for it (it serves their CRDs)."""
    device_plugin: k8s.helm.v3.Release
    """The NVIDIA device plugin release."""

    def __init__(self, name: str, args: KarpenterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("warmstart:cluster:Karpenter", name, None, opts)
        p = args.plan
        child = pulumi.ResourceOptions(parent=self)
        account_id = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(parent=self)).account_id

        # Node role + EC2_LINUX access entry: without the entry, nodes boot and never join.
        node_role_name = f"{args.name_prefix}-karpenter-node"
        self.node_role = aws.iam.Role(
            f"{name}-node", name=node_role_name, assume_role_policy=iam.to_json(karpenter.ec2_trust_policy()),
            description=f"warmstart: GPU nodes Karpenter launches for cluster {p.name}",
            tags={"Name": node_role_name}, opts=child)
        attachments = [aws.iam.RolePolicyAttachment(
            f"{name}-node-{policy}", role=self.node_role.name,
            policy_arn=karpenter.managed_policy_arn(p.partition, policy), opts=child)
            for policy in karpenter.KARPENTER_NODE_ROLE_POLICIES]
        node_access = aws.eks.AccessEntry(
            f"{name}-node-access", cluster_name=p.name, principal_arn=self.node_role.arn, type="EC2_LINUX",
            opts=pulumi.ResourceOptions(parent=self, depends_on=[args.cluster]))

        # Interruption queue: EventBridge -> SQS -> controller, so a node is drained before
        # EC2 reclaims it (spot, rebalance, scheduled health events).
        self.queue = aws.sqs.Queue(
            f"{name}-interruption", name=p.name,
            message_retention_seconds=karpenter.QUEUE_MESSAGE_RETENTION_SECONDS,
            sqs_managed_sse_enabled=True, opts=child)
        aws.sqs.QueuePolicy(
            f"{name}-interruption", queue_url=self.queue.url,
            policy=self.queue.arn.apply(lambda arn: iam.to_json(karpenter.interruption_queue_policy(arn))),
            opts=child)
        for suffix, pattern in karpenter.INTERRUPTION_EVENTS.items():
            rule = aws.cloudwatch.EventRule(
                f"{name}-{suffix}", name=f"{p.name}-karpenter-{suffix}"[:64],
                description=f"Karpenter interruption handling for {p.name}: {pattern['detail-type'][0]}",
                event_pattern=iam.to_json(pattern), opts=child)
            aws.cloudwatch.EventTarget(
                f"{name}-{suffix}", rule=rule.name, arn=self.queue.arn,
                target_id="KarpenterInterruptionQueueTarget", opts=child)

        # Controller role (IRSA for kube-system/karpenter) with the reference permissions.
        controller_role_name = f"{args.name_prefix}-karpenter-controller"
        trust = pulumi.Output.all(args.oidc_provider_arn, args.oidc_issuer).apply(
            lambda v: iam.to_json(iam.irsa_trust_policy(
                v[0], v[1], karpenter.CONTROLLER_NAMESPACE, karpenter.CONTROLLER_SERVICE_ACCOUNT)))
        self.controller_role = aws.iam.Role(
            f"{name}-controller", name=controller_role_name, assume_role_policy=trust,
            description=f"warmstart: Karpenter controller of cluster {p.name}",
            tags={"Name": controller_role_name}, opts=child)
        documents = pulumi.Output.all(account_id, self.node_role.arn, self.queue.arn).apply(
            lambda v: karpenter.controller_policies(p.partition, args.region, v[0], p.name, v[1], v[2]))
        for short in ("node-lifecycle", "iam-integration", "eks-integration", "interruption",
                      "zonal-shift", "resource-discovery"):
            policy = aws.iam.Policy(
                f"{name}-{short}", name=f"{args.name_prefix}-karpenter-{short}",
                description=f"warmstart: Karpenter controller of {p.name}, {short} (reference: Karpenter "
                            f"v{versions.KARPENTER_VERSION} getting-started template)",
                policy=documents.apply(lambda d, short=short: iam.to_json(d[short])), opts=child)
            attachments.append(aws.iam.RolePolicyAttachment(
                f"{name}-controller-{short}", role=self.controller_role.name, policy_arn=policy.arn, opts=child))

        k8s_opts = dict(parent=self, provider=args.kubernetes_provider)
        # CRDs from their own chart, so upgrades update them (a chart's crds/ folder is only
        # applied on first install; https://karpenter.sh/v1.14/upgrading/upgrade-guide/#crd-upgrades).
        crds = k8s.helm.v3.Release(
            f"{name}-crd", name="karpenter-crd", chart=versions.KARPENTER_CRD_CHART,
            version=versions.KARPENTER_VERSION, namespace=karpenter.CONTROLLER_NAMESPACE,
            opts=pulumi.ResourceOptions(**k8s_opts, depends_on=[args.cluster]))
        self.controller = k8s.helm.v3.Release(
            f"{name}-controller", name="karpenter", chart=versions.KARPENTER_CHART,
            version=versions.KARPENTER_VERSION, namespace=karpenter.CONTROLLER_NAMESPACE, skip_crds=True,
            values=karpenter.controller_values(
                p.name, p.name, {IRSA_ROLE_ANNOTATION: self.controller_role.arn}, versions.KARPENTER_CONTROLLER_IMAGE,
                reserved_capacity=any(pool.capacity.reserved for pool in p.pools)),
            opts=pulumi.ResourceOptions(**k8s_opts, depends_on=[crds, args.system_nodes, node_access, *attachments]))
        self.device_plugin = k8s.helm.v3.Release(
            f"{name}-nvidia-device-plugin", name="nvidia-device-plugin", chart=versions.NVIDIA_DEVICE_PLUGIN_CHART,
            repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=versions.NVIDIA_DEVICE_PLUGIN_REPO),
            version=versions.NVIDIA_DEVICE_PLUGIN_VERSION, namespace=karpenter.CONTROLLER_NAMESPACE,
            values=karpenter.device_plugin_values(),
            opts=pulumi.ResourceOptions(**k8s_opts, depends_on=[args.system_nodes]))
        self.register_outputs({"nodeRoleName": self.node_role.name, "queueName": self.queue.name})
