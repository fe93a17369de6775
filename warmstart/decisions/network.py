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
