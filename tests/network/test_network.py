"""The Network component alone, from its own Args under Pulumi mocks: a VPC it creates, one it
is given, and the Args it refuses naming the key."""

from __future__ import annotations

from typing import Any

import pytest

import components
from warmstart import mocks

VPC = "vpc-0000000a"
SUBNETS = ["subnet-0000000a", "subnet-0000000b"]


def _network(karpenter_discovery_cluster: str | None = None, **section: Any
             ) -> tuple[components.Network, list[mocks.Registered]]:
    """The Network with `section` as its `network`."""
    return _built({"name_prefix": "team", "region": "us-east-1", "network": section}
                  | ({"karpenter_discovery_cluster": karpenter_discovery_cluster} if karpenter_discovery_cluster else {}))


def _built(args: dict[str, Any]) -> tuple[components.Network, list[mocks.Registered]]:
    built: dict[str, Any] = {}
    resources = mocks.run(lambda: built.setdefault("n", components.Network("net", args)),  # type: ignore[arg-type]
                          region="us-east-1", stack="alone")
    return built["n"], resources


def _count(resources: list[mocks.Registered], typ: str) -> int:
    return sum(r.typ == typ for r in resources)


def test_a_created_vpc_has_public_and_private_subnets_per_az_a_nat_each_and_the_s3_endpoint():
    net, resources = _network(az_count=3)
    assert net.plan.create and net.vpc_cidrs == ["10.0.0.0/16"]
    assert _count(resources, "aws:ec2/vpc:Vpc") == 1
    assert _count(resources, "aws:ec2/subnet:Subnet") == 6
    assert _count(resources, "aws:ec2/natGateway:NatGateway") == 3
    (endpoint,) = [r for r in resources if r.typ == "aws:ec2/vpcEndpoint:VpcEndpoint"]
    assert endpoint.inputs["vpcEndpointType"] == "Gateway" and endpoint.inputs["serviceName"].endswith(".s3")
    assert "warmstart:index:Network" in {r.typ for r in resources}


def test_one_nat_gateway_when_asked():
    _, resources = _network(az_count=2, single_nat_gateway=True)
    assert _count(resources, "aws:ec2/natGateway:NatGateway") == 1


def test_an_existing_vpc_creates_only_the_endpoint_and_the_discovery_tags():
    net, resources = _network(vpc_id=VPC, private_subnet_ids=SUBNETS,
                              private_route_table_ids=["rtb-0000000a"], karpenter_discovery_cluster="team-eks")
    assert not net.plan.create and net.vpc_cidrs == [mocks.EXISTING_VPC_CIDR]
    aws = {r.typ for r in resources if r.typ.startswith("aws:")}
    assert aws == {"aws:ec2/vpcEndpoint:VpcEndpoint", "aws:ec2/tag:Tag"}
    assert sorted(r.inputs["resourceId"] for r in resources if r.typ == "aws:ec2/tag:Tag") == SUBNETS


def test_an_existing_vpc_without_its_route_tables_names_the_arg():
    with pytest.raises(Exception) as err:
        _network(vpc_id=VPC, private_subnet_ids=SUBNETS)
    assert "NetworkArgs.network.privateRouteTableIds" in str(err.value), str(err.value)


def test_the_sections_keys_given_flat_as_before_still_plan_the_same_with_a_warning(monkeypatch):
    import pulumi

    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda msg, resource=None, **_: warned.append(msg))
    nested, _ = _network(az_count=2, single_nat_gateway=True)
    assert warned == []
    flat, resources = _built({"name_prefix": "team", "region": "us-east-1", "az_count": 2, "single_nat_gateway": True})
    assert flat.plan == nested.plan and _count(resources, "aws:ec2/natGateway:NatGateway") == 1
    assert len(warned) == 1 and "NetworkArgs: azCount, singleNatGateway" in warned[0]
