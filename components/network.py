"""The network the cluster and GPU nodes run in, and the S3 Gateway endpoint on it.

Either a VPC warmstart creates (public and private subnets per AZ, NAT for egress, subnets
tagged for load balancers and Karpenter) or an existing VPC given by id. In both, the S3
Gateway endpoint sits on every private route table, so weights and compile-cache objects
travel to the GPU nodes without crossing a NAT gateway
(https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html#model-loading-auto-mode-s3).
"""

from typing import NotRequired, Optional, TypedDict

import pulumi
import pulumi_aws as aws

from warmstart.config import NetworkConfig
from warmstart.decisions import naming
from warmstart.decisions.network import ELB_ROLE_TAG, INTERNAL_ELB_ROLE_TAG, KARPENTER_DISCOVERY_TAG
from warmstart.plan.aws import NetworkPlan, plan_network

from .section_args import NetworkSectionArgs
from .sections import nested_section

ANYWHERE = "0.0.0.0/0"


class NetworkArgs(TypedDict):
    """Inputs of the Network component: a VPC warmstart creates (the default), or an existing one
    by `network.vpcId`; either way with the S3 Gateway endpoint on every private route table."""

    name_prefix: str
    """Prefix of every Name tag."""
    region: str
    """AWS region (the S3 endpoint service is regional)."""
    network: NotRequired[NetworkSectionArgs]
    """The network itself, as the stack config's `network` section (default: a created VPC with
    every key at its default). Its keys were once given flat at the top of these Args; that still
    works for a Python caller, with a deprecation warning."""
    karpenter_discovery_cluster: NotRequired[Optional[str]]
    """Karpenter mode: the EKS cluster name to tag the private subnets with
    (`karpenter.sh/discovery`), so its EC2NodeClasses find them."""


def existing_vpc_cidrs(vpc_id: str, opts: pulumi.InvokeOptions) -> list[str]:
    """The IPv4 CIDR blocks associated with an existing VPC, secondary ones included
    (https://docs.aws.amazon.com/vpc/latest/userguide/vpc-cidr-blocks.html): policies that name
    "the VPC" must cover every block pods may get an address from."""
    vpc = aws.ec2.get_vpc(id=vpc_id, opts=opts)
    blocks = [a.cidr_block for a in (vpc.cidr_block_associations or []) if a.state in (None, "", "associated")]
    return sorted(set(blocks) | {vpc.cidr_block})


def _sorted_ids(*ids: pulumi.Input[str]) -> pulumi.Output[list[str]]:
    return pulumi.Output.all(*ids).apply(lambda v: sorted(v))


class Network(pulumi.ComponentResource):
    """VPC, subnets, NAT and the S3 Gateway endpoint GPU nodes pull weights through."""

    vpc_id: pulumi.Output[str]
    """The VPC's id."""
    private_subnet_ids: pulumi.Output[list[str]]
    """Private subnets (sorted) for the cluster and GPU nodes."""
    public_subnet_ids: pulumi.Output[list[str]]
    """Public subnets (sorted) for internet-facing load balancers; empty for an existing VPC
    that names none."""
    private_route_table_ids: pulumi.Output[list[str]]
    """Route tables of the private subnets (sorted); each carries the S3 endpoint's route."""
    vpc_cidrs: list[str]
    """Every IPv4 CIDR block of the VPC (primary and secondary), the range pod addresses come from:
    the created VPC's `cidr`, or what AWS reports for an existing one (a plain invoke, so it is
    known while the program runs, in a preview as in an `up`)."""
    s3_endpoint_id: pulumi.Output[Optional[str]]
    """The S3 Gateway endpoint's id (`vpce-...`, the `aws:SourceVpce` value); unset when
    `network.s3GatewayEndpoint` is false."""

    def __init__(self, name: str, args: NetworkArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        super().__init__("warmstart:index:Network", name, None, opts)
        # Every decision is made here, from the Args alone, by the pure planner; the section is
        # read through the config model, so its defaults and rules are the stack config's.
        network, key = nested_section(NetworkConfig, args, "network", "NetworkArgs", self)
        self.plan: NetworkPlan = plan_network(
            network, region=args["region"], karpenter_discovery=args.get("karpenter_discovery_cluster"), key=key)
        p = self.plan
        region, name_prefix = args["region"], args["name_prefix"]
        if p.create:
            assert p.cidr is not None
            self.vpc_cidrs = [p.cidr]
            self._create(name, p, region, name_prefix)
        else:
            assert p.vpc_id is not None
            self.vpc_cidrs = existing_vpc_cidrs(p.vpc_id, pulumi.InvokeOptions(parent=self))
            self.vpc_id = pulumi.Output.from_input(p.vpc_id)
            self.private_subnet_ids = pulumi.Output.from_input(list(p.private_subnet_ids))
            self.public_subnet_ids = pulumi.Output.from_input(list(p.public_subnet_ids))
            self.private_route_table_ids = pulumi.Output.from_input(list(p.private_route_table_ids))
            if p.karpenter_discovery:
                # Karpenter's EC2NodeClass finds subnets by this tag; an ec2.Tag adds it to a
                # subnet this stack does not own and removes only that tag on destroy.
                for subnet_id in p.private_subnet_ids:
                    aws.ec2.Tag(f"{name}-discovery-{subnet_id}", resource_id=subnet_id,
                                key=KARPENTER_DISCOVERY_TAG, value=p.karpenter_discovery,
                                opts=pulumi.ResourceOptions(parent=self))

        self.s3_endpoint_id = None  # type: ignore[assignment]
        if p.s3_gateway_endpoint:
            endpoint = aws.ec2.VpcEndpoint(
                f"{name}-s3",
                vpc_id=self.vpc_id,
                service_name=naming.s3_service_name(region),
                vpc_endpoint_type="Gateway",
                # Route tables on the endpoint itself (not VpcEndpointRouteTableAssociation):
                # one resource owns the full set, so a missing table shows up as a diff.
                route_table_ids=self.private_route_table_ids,
                # No endpoint policy (full access): the nodes also pull ECR image layers, which
                # ECR serves from its own S3 buckets, through this endpoint. Bucket access is
                # limited by the IRSA roles and bucket policies instead.
                tags={"Name": f"{name_prefix}-s3"},
                opts=pulumi.ResourceOptions(parent=self),
            )
            self.s3_endpoint_id = endpoint.id

        self.register_outputs({
            "vpcId": self.vpc_id,
            "vpcCidrs": self.vpc_cidrs,
            "privateSubnetIds": self.private_subnet_ids,
            "publicSubnetIds": self.public_subnet_ids,
            "privateRouteTableIds": self.private_route_table_ids,
            "s3EndpointId": self.s3_endpoint_id,
        })

    def _create(self, name: str, p: NetworkPlan, region: str, prefix: str) -> None:
        assert p.layout is not None  # plan_network lays out every VPC it creates
        child = pulumi.ResourceOptions(parent=self)
        count = p.az_count
        if p.availability_zones:
            zones = pulumi.Output.from_input(list(p.availability_zones))
        else:
            found = aws.get_availability_zones_output(
                state="available",
                # Only the region's regular AZs: Local and Wavelength Zones are opt-in.
                filters=[aws.GetAvailabilityZonesFilterArgs(name="opt-in-status", values=["opt-in-not-required"])],
                opts=pulumi.InvokeOutputOptions(parent=self),
            )

            def first(names: list[str] | None) -> list[str]:
                names = sorted(names or [])
                if len(names) < count:
                    raise ValueError(f"region {region} reports {len(names)} available AZs, "
                                     f"warmstart:network.azCount is {count}")
                return names[:count]

            zones = found.names.apply(first)

        vpc = aws.ec2.Vpc(
            f"{name}-vpc", cidr_block=p.cidr,
            # EKS needs both for private endpoint access and node registration.
            enable_dns_support=True, enable_dns_hostnames=True,
            tags={"Name": f"{prefix}-vpc"}, opts=child)
        igw = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=vpc.id, tags={"Name": f"{prefix}-igw"}, opts=child)
        public_rt = aws.ec2.RouteTable(f"{name}-public", vpc_id=vpc.id, tags={"Name": f"{prefix}-public"}, opts=child)
        # Routes are separate resources, never inline `routes`: inline routes would make the
        # route table own every route and delete the S3 endpoint's prefix-list route.
        aws.ec2.Route(f"{name}-public-default", route_table_id=public_rt.id,
                      destination_cidr_block=ANYWHERE, gateway_id=igw.id, opts=child)

        public, private, private_rts, nats = [], [], [], []
        for i in range(count):
            az = zones.apply(lambda z, i=i: z[i])
            letter = f"az{i + 1}"
            pub = aws.ec2.Subnet(
                f"{name}-public-{letter}", vpc_id=vpc.id, cidr_block=p.layout.public[i], availability_zone=az,
                map_public_ip_on_launch=False,
                tags={"Name": f"{prefix}-public-{letter}", ELB_ROLE_TAG: "1"}, opts=child)
            aws.ec2.RouteTableAssociation(f"{name}-public-{letter}", subnet_id=pub.id,
                                          route_table_id=public_rt.id, opts=child)
            public.append(pub)
            if i == 0 or not p.single_nat_gateway:
                eip = aws.ec2.Eip(f"{name}-nat-{letter}", domain="vpc",
                                  tags={"Name": f"{prefix}-nat-{letter}"}, opts=child)
                nats.append(aws.ec2.NatGateway(
                    f"{name}-nat-{letter}", allocation_id=eip.allocation_id, subnet_id=pub.id,
                    connectivity_type="public", tags={"Name": f"{prefix}-nat-{letter}"},
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[igw])))
            private_tags = {"Name": f"{prefix}-private-{letter}", INTERNAL_ELB_ROLE_TAG: "1"}
            if p.karpenter_discovery:
                private_tags[KARPENTER_DISCOVERY_TAG] = p.karpenter_discovery
            priv = aws.ec2.Subnet(
                f"{name}-private-{letter}", vpc_id=vpc.id, cidr_block=p.layout.private[i], availability_zone=az,
                map_public_ip_on_launch=False, tags=private_tags, opts=child)
            rt = aws.ec2.RouteTable(f"{name}-private-{letter}", vpc_id=vpc.id,
                                    tags={"Name": f"{prefix}-private-{letter}"}, opts=child)
            aws.ec2.Route(f"{name}-private-{letter}-default", route_table_id=rt.id,
                          destination_cidr_block=ANYWHERE, nat_gateway_id=nats[-1].id, opts=child)
            aws.ec2.RouteTableAssociation(f"{name}-private-{letter}", subnet_id=priv.id,
                                          route_table_id=rt.id, opts=child)
            private.append(priv)
            private_rts.append(rt)

        self.vpc_id = vpc.id
        self.availability_zones = zones
        self.private_subnet_ids = _sorted_ids(*(s.id for s in private))
        self.public_subnet_ids = _sorted_ids(*(s.id for s in public))
        self.private_route_table_ids = _sorted_ids(*(rt.id for rt in private_rts))
