"""Who may act in the cluster: the EKS access policies of its access entries (pure).

An access entry gives an IAM principal Kubernetes permissions through EKS access policies,
associated with it at cluster scope
(https://docs.aws.amazon.com/eks/latest/userguide/access-entries.html). The Cluster component
creates one per `admins` and `viewers` principal, and one for the nodes of an Auto Mode custom
NodeClass (whose EC2-type entry its node role needs).
"""

from __future__ import annotations

# Access policy Auto Mode nodes of a custom NodeClass need on their EC2-type access entry
# (https://docs.aws.amazon.com/eks/latest/userguide/create-node-class.html#auto-node-access-entry).
AUTO_NODE_ACCESS_POLICY = "AmazonEKSAutoNodePolicy"
CLUSTER_ADMIN_ACCESS_POLICY = "AmazonEKSClusterAdminPolicy"
# `cluster.viewers`: get/list/watch on every resource of every API group, Secrets included
# (where Helm keeps release state) and custom resources (NodePools, node classes), which is what
# `pulumi refresh` reads. AmazonEKSViewPolicy would not do: it lists fixed built-in resources
# only, without Secrets or any CRD
# (https://docs.aws.amazon.com/eks/latest/userguide/access-policy-permissions.html#access-policy-permissions-amazoneksadminviewpolicy).
VIEWER_ACCESS_POLICY = "AmazonEKSAdminViewPolicy"


def access_policy_arn(partition: str, name: str) -> str:
    """The ARN of an EKS access policy (`arn:<partition>:eks::aws:cluster-access-policy/<name>`)."""
    return f"arn:{partition}:eks::aws:cluster-access-policy/{name}"
