"""Subnet layout of a VPC warmstart creates (pure, no Pulumi)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

# Subnet tags the AWS Load Balancer Controller discovers subnets by (EKS UG "subnet
# requirements"), and the tag Karpenter's EC2NodeClass selects subnets by
# (https://karpenter.sh/v1.14/concepts/nodeclasses/#specsubnetselectorterms).
ELB_ROLE_TAG = "kubernetes.io/role/elb"
INTERNAL_ELB_ROLE_TAG = "kubernetes.io/role/internal-elb"
KARPENTER_DISCOVERY_TAG = "karpenter.sh/discovery"

# A VPC is split into 8 blocks: one private block per AZ, the last block is split again into
# 8 public blocks. Private subnets are large because the VPC CNI gives every pod a VPC
# address; public subnets only hold NAT gateways and load balancers.
MAX_AZS = 6
MIN_VPC_PREFIX = 16  # AWS: a VPC's CIDR is /16 to /28
MAX_VPC_PREFIX = 22  # so a public subnet is still /28, AWS's smallest


@dataclass(frozen=True)
class SubnetLayout:
    private: tuple[str, ...]
    """One private subnet CIDR per AZ, in AZ order."""
    public: tuple[str, ...]
    """One public subnet CIDR per AZ, in AZ order."""


def subnet_layout(vpc_cidr: str, az_count: int) -> SubnetLayout:
    """Disjoint private and public subnet CIDRs inside `vpc_cidr`, one of each per AZ.

    With a /16 VPC: private subnets are /19 (8,187 usable addresses), public /22.
    """
    net = ipaddress.IPv4Network(vpc_cidr)
    if not MIN_VPC_PREFIX <= net.prefixlen <= MAX_VPC_PREFIX:
        raise ValueError(f"VPC CIDR must be /{MIN_VPC_PREFIX} to /{MAX_VPC_PREFIX}")
    if not 1 <= az_count <= MAX_AZS:
        raise ValueError(f"az_count must be 1 to {MAX_AZS}")
    blocks = list(net.subnets(prefixlen_diff=3))
    public_blocks = list(blocks[-1].subnets(prefixlen_diff=3))
    return SubnetLayout(
        private=tuple(str(b) for b in blocks[:az_count]),
        public=tuple(str(b) for b in public_blocks[:az_count]),
    )


# The Kubernetes Service range of an EKS cluster. Pods reach the API server at the ClusterIP of
# `default/kubernetes`, the first host of this range; the AWS network policy agent judges egress
# before kube-proxy's DNAT, so a policy must name this address, not the API server's ENIs
# (aws/aws-network-policy-agent `pkg/ebpf/c/tc.v4egress.bpf.c`; aws/amazon-network-policy-controller-k8s
# `pkg/resolvers/endpoints.go`, `getMatchingServiceClusterIPs`: only Services with a selector are
# added, and `kubernetes` has none).
#
# Without `serviceIpv4Cidr` EKS assigns 10.100.0.0/16 or 172.20.0.0/16
# (https://docs.aws.amazon.com/eks/latest/APIReference/API_KubernetesNetworkConfigRequest.html);
# which one follows the VPC: 172.20.0.0/16 when any of its CIDR blocks is in 10.0.0.0/8, as the
# EKS AMI's bootstrap.sh mirrored it for the cluster DNS address
# (https://github.com/awslabs/amazon-eks-ami/blob/v20231116/files/bootstrap.sh, `TEN_RANGE`).
# warmstart sets that same range explicitly, so a cluster EKS already numbered keeps its range
# (the field is create-only: another value would replace the cluster).
EKS_SERVICE_CIDR_TEN = "172.20.0.0/16"
EKS_SERVICE_CIDR_OTHER = "10.100.0.0/16"
_TEN = ipaddress.IPv4Network("10.0.0.0/8")
# The blocks EKS accepts a custom service range from, /24 to /12 (the API reference above).
SERVICE_CIDR_BLOCKS = tuple(ipaddress.IPv4Network(c) for c in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))


def default_service_cidr(vpc_cidrs: "list[str] | tuple[str, ...]") -> str:
    """The Service range EKS gives a cluster in a VPC with these CIDR blocks."""
    nets = [ipaddress.IPv4Network(c) for c in vpc_cidrs]
    return EKS_SERVICE_CIDR_TEN if any(n.subnet_of(_TEN) for n in nets) else EKS_SERVICE_CIDR_OTHER


def service_cidr_problem(service_cidr: str, vpc_cidrs: "list[str] | tuple[str, ...]") -> str | None:
    """Why EKS would refuse `service_cidr` for a VPC with `vpc_cidrs`, or None."""
    try:
        net = ipaddress.IPv4Network(service_cidr)
    except ValueError as err:
        return f"is not a network address ({err})"
    if not 12 <= net.prefixlen <= 24:
        return "must be between /12 and /24"
    if not any(net.subnet_of(b) for b in SERVICE_CIDR_BLOCKS):
        return "must lie in 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16"
    for c in vpc_cidrs:
        if net.overlaps(ipaddress.IPv4Network(c)):
            return f"overlaps the VPC's CIDR block {c}"
    return None


def kubernetes_service_ip(service_cidr: str) -> str:
    """The ClusterIP of `default/kubernetes`: the range's first host
    (https://kubernetes.io/docs/concepts/services-networking/cluster-ip-allocation/)."""
    return str(next(ipaddress.IPv4Network(service_cidr).hosts()))


# The EKS API server's public endpoint: open to 0.0.0.0/0 unless limited, up to 40 blocks
# (https://docs.aws.amazon.com/eks/latest/APIReference/API_VpcConfigRequest.html, `publicAccessCidrs`;
# https://docs.aws.amazon.com/eks/latest/userguide/service-quotas.html).
EKS_PUBLIC_ACCESS_CIDRS = ("0.0.0.0/0",)
MAX_PUBLIC_ACCESS_CIDRS = 40
# Ranges no client reaches the public endpoint from (RFC 1918, RFC 6598, loopback, link-local,
# multicast and reserved: https://www.iana.org/assignments/iana-ipv4-special-registry/).
_NEVER_PUBLIC = tuple(ipaddress.IPv4Network(c) for c in (
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
    "224.0.0.0/4", "240.0.0.0/4"))


def public_access_cidr_problem(cidr: str) -> str | None:
    """Why `cidr` cannot be one of the EKS public endpoint's `publicAccessCidrs`, or None: it
    must be an IPv4 block with its host bits zero, of public addresses (the public endpoint
    sees a client's public address; a private or reserved block matches no one, and EKS refuses
    it)."""
    try:
        net = ipaddress.IPv4Network(cidr, strict=True)
    except ValueError as err:
        return f"is not an IPv4 CIDR block with its host bits zero ({err})"
    if "/" not in cidr:
        return "is not a CIDR block (address/prefix length)"
    if net.prefixlen and any(net.overlaps(b) for b in _NEVER_PUBLIC):
        return ("is or overlaps a private, shared, loopback, link-local or multicast range, which the public "
                "endpoint never sees a client from")
    return None

