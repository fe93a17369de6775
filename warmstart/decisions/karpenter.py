"""Self-managed Karpenter: controller permissions, interruption events, chart values (pure).

The controller's IAM follows Karpenter's own reference, the getting-started CloudFormation
template of v1.14 (tests/schemas/SOURCES.md), statement for statement, scoped to
this stack's cluster, node role and queue. It is written here as data rather than copied, so
the scoping is visible and testable.
"""

from __future__ import annotations

from typing import Any

from . import capacity, iam, placement

CONTROLLER_NAMESPACE = "kube-system"
# The chart's fullname; `serviceAccount.name: ""` means this
# (https://github.com/aws/karpenter-provider-aws/blob/v1.14.1/charts/karpenter/values.yaml).
CONTROLLER_SERVICE_ACCOUNT = "karpenter"

# Tag keys Karpenter puts on what it creates and later matches on (its IAM conditions).
NODEPOOL_TAG = "karpenter.sh/nodepool"
NODECLAIM_TAG = "karpenter.sh/nodeclaim"
EC2NODECLASS_TAG = "karpenter.k8s.aws/ec2nodeclass"
CLUSTER_NAME_TAG = "eks:eks-cluster-name"
REGION_TAG = "topology.kubernetes.io/region"


def cluster_owned_tag(cluster_name: str) -> str:
    return f"kubernetes.io/cluster/{cluster_name}"


# Interruption handling, as in Karpenter's reference CloudFormation template
# (https://karpenter.sh/v1.14/reference/cloudformation/#interruption-handling): EventBridge
# delivers these to the controller's SQS queue so it drains a node before EC2 takes it away.
# Rule suffix -> event pattern.
INTERRUPTION_EVENTS: dict[str, dict[str, list[str]]] = {
    "health": {"source": ["aws.health"], "detail-type": ["AWS Health Event"]},
    "spot-interruption": {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]},
    "rebalance": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]},
    "instance-state-change": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance State-change Notification"]},
    "capacity-reservation-interruption": {
        "source": ["aws.ec2"], "detail-type": ["EC2 Capacity Reservation Instance Interruption Warning"]},
}
# Interruption messages are useless after a few minutes (the reference template's value).
QUEUE_MESSAGE_RETENTION_SECONDS = 300

# AWS managed policies of the node role Karpenter passes to its instances (the reference
# template's KarpenterNodeRole).
KARPENTER_NODE_ROLE_POLICIES = (
    "AmazonEC2ContainerRegistryPullOnly",
    "AmazonEKSWorkerNodePolicy",
    "AmazonEKS_CNI_Policy",
    "AmazonSSMManagedInstanceCore",
)
# Same for EKS managed node groups (the karpenter-mode system node group).
SYSTEM_NODE_ROLE_POLICIES = KARPENTER_NODE_ROLE_POLICIES
# Node role of a custom Auto Mode NodeClass
# (https://docs.aws.amazon.com/eks/latest/userguide/auto-learn-iam.html#auto-learn-node-iam-role).
AUTO_NODE_ROLE_POLICIES = ("AmazonEC2ContainerRegistryPullOnly", "AmazonEKSWorkerNodeMinimalPolicy")

# Controller requests = limits, as the reference install sets them
# (https://karpenter.sh/v1.14/getting-started/getting-started-with-karpenter/).
CONTROLLER_RESOURCES = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}


def managed_policy_arn(partition: str, name: str) -> str:
    return f"arn:{partition}:iam::aws:policy/{name}"


def ec2_trust_policy() -> dict[str, Any]:
    """Trust of a node role: EC2 instances assume it."""
    return {"Version": iam.VERSION, "Statement": [{
        "Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}


def _ec2(partition: str, region: str, resource: str, account: str = "*") -> str:
    return f"arn:{partition}:ec2:{region}:{account}:{resource}"


def controller_policies(partition: str, region: str, account_id: str, cluster_name: str,
                        node_role_arn: str, queue_arn: str) -> dict[str, dict[str, Any]]:
    """The controller's six policy documents, keyed by a short name, in the reference's split.

    Scoping: every mutating EC2 action requires the `kubernetes.io/cluster/<cluster>: owned`
    tag (on the request or the resource) plus a `karpenter.sh/nodepool` tag, so the
    controller can touch only what it launched for this cluster; PassRole only for this
    stack's node role, only to EC2; the queue and the cluster by ARN; reads pinned to the region.
    """
    owned = cluster_owned_tag(cluster_name)
    cluster_arn = f"arn:{partition}:eks:{region}:{account_id}:cluster/{cluster_name}"
    profiles = f"arn:{partition}:iam::{account_id}:instance-profile/*"
    launched = ["fleet/*", "instance/*", "volume/*", "network-interface/*", "launch-template/*",
                "spot-instances-request/*"]
    request_tagged = {
        "StringEquals": {f"aws:RequestTag/{owned}": "owned", f"aws:RequestTag/{CLUSTER_NAME_TAG}": cluster_name},
        "StringLike": {f"aws:RequestTag/{NODEPOOL_TAG}": "*"},
    }
    resource_tagged = {
        "StringEquals": {f"aws:ResourceTag/{owned}": "owned"},
        "StringLike": {f"aws:ResourceTag/{NODEPOOL_TAG}": "*"},
    }

    def doc(*statements: dict[str, Any]) -> dict[str, Any]:
        return {"Version": iam.VERSION, "Statement": list(statements)}

    node_lifecycle = doc(
        {"Sid": "AllowScopedEC2InstanceAccessActions", "Effect": "Allow",
         "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
         "Resource": [_ec2(partition, region, "image/*", ""), _ec2(partition, region, "snapshot/*", "")]
                     + [_ec2(partition, region, r) for r in ("security-group/*", "subnet/*",
                                                             "capacity-reservation/*", "placement-group/*")]},
        {"Sid": "AllowScopedEC2LaunchTemplateAccessActions", "Effect": "Allow",
         "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
         "Resource": _ec2(partition, region, "launch-template/*"), "Condition": resource_tagged},
        {"Sid": "AllowScopedEC2InstanceActionsWithTags", "Effect": "Allow",
         "Action": ["ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate"],
         "Resource": [_ec2(partition, region, r) for r in launched], "Condition": request_tagged},
        {"Sid": "AllowScopedResourceCreationTagging", "Effect": "Allow", "Action": "ec2:CreateTags",
         "Resource": [_ec2(partition, region, r) for r in launched],
         "Condition": {"StringEquals": request_tagged["StringEquals"] | {
             "ec2:CreateAction": ["RunInstances", "CreateFleet", "CreateLaunchTemplate"]},
             "StringLike": request_tagged["StringLike"]}},
        {"Sid": "AllowScopedResourceTagging", "Effect": "Allow", "Action": "ec2:CreateTags",
         "Resource": _ec2(partition, region, "instance/*"),
         "Condition": resource_tagged | {
             "StringEqualsIfExists": {f"aws:RequestTag/{CLUSTER_NAME_TAG}": cluster_name},
             "ForAllValues:StringEquals": {"aws:TagKeys": [CLUSTER_NAME_TAG, NODECLAIM_TAG, "Name"]}}},
        {"Sid": "AllowScopedDeletion", "Effect": "Allow",
         "Action": ["ec2:TerminateInstances", "ec2:DeleteLaunchTemplate"],
         "Resource": [_ec2(partition, region, "instance/*"), _ec2(partition, region, "launch-template/*")],
         "Condition": resource_tagged},
    )
    profile_resource_tagged = {"StringEquals": {f"aws:ResourceTag/{owned}": "owned",
                                                f"aws:ResourceTag/{REGION_TAG}": region},
                               "StringLike": {f"aws:ResourceTag/{EC2NODECLASS_TAG}": "*"}}
    profile_request_tagged = {"StringEquals": {f"aws:RequestTag/{owned}": "owned",
                                               f"aws:RequestTag/{CLUSTER_NAME_TAG}": cluster_name,
                                               f"aws:RequestTag/{REGION_TAG}": region},
                              "StringLike": {f"aws:RequestTag/{EC2NODECLASS_TAG}": "*"}}
    iam_integration = doc(
        {"Sid": "AllowPassingInstanceRole", "Effect": "Allow", "Action": "iam:PassRole",
         "Resource": node_role_arn,
         "Condition": {"StringEquals": {"iam:PassedToService": ["ec2.amazonaws.com", "ec2.amazonaws.com.cn"]}}},
        {"Sid": "AllowScopedInstanceProfileCreationActions", "Effect": "Allow",
         "Action": ["iam:CreateInstanceProfile"], "Resource": profiles, "Condition": profile_request_tagged},
        {"Sid": "AllowScopedInstanceProfileTagActions", "Effect": "Allow", "Action": ["iam:TagInstanceProfile"],
         "Resource": profiles,
         "Condition": {"StringEquals": profile_resource_tagged["StringEquals"] | profile_request_tagged["StringEquals"],
                       "StringLike": profile_resource_tagged["StringLike"] | profile_request_tagged["StringLike"]}},
        {"Sid": "AllowScopedInstanceProfileActions", "Effect": "Allow",
         "Action": ["iam:AddRoleToInstanceProfile", "iam:RemoveRoleFromInstanceProfile", "iam:DeleteInstanceProfile"],
         "Resource": profiles, "Condition": profile_resource_tagged},
    )
    eks_integration = doc(
        {"Sid": "AllowAPIServerEndpointDiscovery", "Effect": "Allow", "Action": "eks:DescribeCluster",
         "Resource": cluster_arn})
    interruption = doc(
        {"Sid": "AllowInterruptionQueueActions", "Effect": "Allow",
         "Action": ["sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"], "Resource": queue_arn})
    zonal_shift = doc(
        {"Sid": "AllowZonalShiftStatusReadOnly", "Effect": "Allow", "Action": ["arc-zonal-shift:GetManagedResource"],
         "Resource": "*", "Condition": {"StringEquals": {"arc-zonal-shift:ResourceIdentifier": cluster_arn}}})
    resource_discovery = doc(
        {"Sid": "AllowRegionalReadActions", "Effect": "Allow", "Resource": "*",
         "Action": sorted(f"ec2:{a}" for a in (
             "DescribeCapacityReservations", "DescribeImages", "DescribeInstances", "DescribeInstanceStatus",
             "DescribeInstanceTypeOfferings", "DescribeInstanceTypes", "DescribeLaunchTemplates",
             "DescribePlacementGroups", "DescribeSecurityGroups", "DescribeSpotPriceHistory", "DescribeSubnets")),
         "Condition": {"StringEquals": {"aws:RequestedRegion": region}}},
        {"Sid": "AllowSSMReadActions", "Effect": "Allow", "Action": "ssm:GetParameter",
         "Resource": f"arn:{partition}:ssm:{region}::parameter/aws/service/*"},
        {"Sid": "AllowPricingReadActions", "Effect": "Allow", "Action": "pricing:GetProducts", "Resource": "*"},
        {"Sid": "AllowUnscopedInstanceProfileListAction", "Effect": "Allow", "Action": "iam:ListInstanceProfiles",
         "Resource": "*"},
        {"Sid": "AllowInstanceProfileReadActions", "Effect": "Allow", "Action": "iam:GetInstanceProfile",
         "Resource": profiles},
    )
    return {
        "node-lifecycle": node_lifecycle,
        "iam-integration": iam_integration,
        "eks-integration": eks_integration,
        "interruption": interruption,
        "zonal-shift": zonal_shift,
        "resource-discovery": resource_discovery,
    }


def interruption_queue_policy(queue_arn: str) -> dict[str, Any]:
    """EventBridge (and SQS) may send to the queue; nobody may use it without TLS."""
    return {"Version": iam.VERSION, "Id": "EC2InterruptionPolicy", "Statement": [
        {"Sid": "AllowEventsToSend", "Effect": "Allow",
         "Principal": {"Service": ["events.amazonaws.com", "sqs.amazonaws.com"]},
         "Action": "sqs:SendMessage", "Resource": queue_arn},
        {"Sid": "DenyHTTP", "Effect": "Deny", "Principal": "*", "Action": "sqs:*", "Resource": queue_arn,
         "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
    ]}


def split_image(image: str) -> dict[str, str]:
    """`repo:tag@sha256:d` -> the chart's controller.image {repository, tag, digest}."""
    ref, _, digest = image.partition("@")
    repository, _, tag = ref.rpartition(":")
    return {"repository": repository, "tag": tag, "digest": digest}


def controller_values(cluster_name: str, queue_name: str, service_account_annotations: dict[str, Any],
                      image: str, reserved_capacity: bool = False) -> dict[str, Any]:
    """Helm values of the Karpenter chart.

    The annotations carry the IRSA role (a value may be a Pulumi Output). The controller is pinned to the
    system node group by label, on top of the chart's own `karpenter.sh/nodepool DoesNotExist`
    affinity, so it never lands on a node it launched.

    `reserved_capacity`: some pool launches into capacity reservations, which needs the
    `ReservedCapacity` feature gate (https://karpenter.sh/docs/tasks/odcrs/). It is on by default
    in the pinned chart, and set explicitly here so that a pool's reservations never depend on a
    chart default. The permissions the nodeclasses page names for reservations are in the reference
    policy already: `ec2:DescribeCapacityReservations` (resource discovery) and RunInstances /
    CreateFleet on `capacity-reservation/*` (node lifecycle)
    (https://karpenter.sh/docs/concepts/nodeclasses/#speccapacityreservationselectorterms).
    """
    settings: dict[str, Any] = {"clusterName": cluster_name, "interruptionQueue": queue_name}
    if reserved_capacity:
        settings["featureGates"] = {capacity.RESERVED_CAPACITY_FEATURE_GATE: True}
    return {
        "settings": settings,
        "serviceAccount": {"create": True, "name": CONTROLLER_SERVICE_ACCOUNT,
                           "annotations": service_account_annotations},
        "controller": {"image": split_image(image), "resources": CONTROLLER_RESOURCES},
        "nodeSelector": {"kubernetes.io/os": "linux", placement.NODE_GROUP_LABEL: placement.SYSTEM_NODE_GROUP},
        # The node's resolver (the VPC's), not cluster DNS: CoreDNS may run on nodes Karpenter
        # launches and removes, and the controller must resolve the AWS APIs to launch any node.
        # The chart once defaulted to `Default` and now to `ClusterFirst`
        # (https://github.com/aws/karpenter-provider-aws/issues/5817); the API server it reaches
        # by the `kubernetes` Service's IP, which needs no DNS.
        "dnsPolicy": "Default",
        "replicas": 2,
    }


def device_plugin_values() -> dict[str, Any]:
    """Helm values of the NVIDIA device plugin chart.

    The chart's default affinity selects nodes labelled by node-feature-discovery, or
    `nvidia.com/gpu.present=true`; GPU NodePools set the latter, so no NFD is needed. Its
    default tolerations already include the `nvidia.com/gpu` taint.
    """
    return {"gfd": {"enabled": False}, "nfd": {"enabled": False}}
