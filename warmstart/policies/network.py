"""Network: the route tables of the subnets GPU nodes run in carry the S3 Gateway endpoint.

Without the endpoint, GPU nodes in private subnets pull weights through a NAT gateway, whose
bandwidth every node of the subnet shares and which charges per GB; with it, S3 traffic stays
on the AWS network and bypasses NAT ("Accelerate model loading on Amazon EKS",
https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html).
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from .nodes import gpu_node_classes, gpu_node_pools
from .records import Resource, Violation, as_list, is_unknown, refers, related

SUBNET_TYPES = ("aws:ec2/subnet:Subnet",)
ROUTE_TABLE_TYPES = ("aws:ec2/routeTable:RouteTable",)
ROUTE_TABLE_ASSOCIATION_TYPES = ("aws:ec2/routeTableAssociation:RouteTableAssociation",)
ROUTE_TYPES = ("aws:ec2/route:Route",)
INTERNET_GATEWAY_TYPES = ("aws:ec2/internetGateway:InternetGateway",)
VPC_ENDPOINT_TYPES = ("aws:ec2/vpcEndpoint:VpcEndpoint",)
ENDPOINT_ROUTE_TABLE_ASSOCIATION_TYPES = ("aws:ec2/vpcEndpointRouteTableAssociation:VpcEndpointRouteTableAssociation",)


def _is_s3_gateway(ep: Resource) -> bool | None:
    service, kind = ep.props.get("serviceName"), ep.props.get("vpcEndpointType")
    if is_unknown(service) or is_unknown(kind):
        return None
    # vpcEndpointType defaults to Gateway (pulumi-aws 7.51.1).
    return (isinstance(service, str) and re.fullmatch(r"com\.amazonaws\.[a-z0-9-]+\.s3", service) is not None
            and (kind is None or str(kind).lower() == "gateway"))


def _public_route_tables(resources: Sequence[Resource]) -> set[str]:
    """Keys of route tables with a route to an internet gateway."""
    igws = [r for r in resources if r.typ in INTERNET_GATEWAY_TYPES]
    out = set()
    for rt in (r for r in resources if r.typ in ROUTE_TABLE_TYPES):
        routes = related(resources, ROUTE_TYPES, "routeTableId", rt)[0]
        inline = [x for x in as_list(rt.props.get("routes")) if isinstance(x, Mapping)]
        gws = [x.props.get("gatewayId") for x in routes] + [x.get("gatewayId") for x in inline]
        if any(isinstance(g, str) and g.startswith("igw-") for g in gws) or any(
                refers(x, "gatewayId", igw) for x in routes for igw in igws):
            out.add(rt.key)
    return out


def _has_unknown(value: Any) -> bool:
    if isinstance(value, Mapping):
        return any(_has_unknown(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_unknown(v) for v in value)
    return is_unknown(value)


def _selected_subnets(resources: Sequence[Resource], subnets: list[Resource]) -> list[Resource] | None:
    """Subnets the GPU node classes select (`subnetSelectorTerms` by tag or id, or, in a
    preview where the ids are unknown, the subnets their spec depends on); None when no
    selector can be read."""
    terms: list[Mapping[str, Any]] = []
    depended: set[str] = set()
    unreadable = False
    for nc in gpu_node_classes(resources).values():
        if nc is None:
            continue
        raw = nc.get("spec", "subnetSelectorTerms")
        unreadable |= _has_unknown(raw)
        terms += [t for t in as_list(raw) if isinstance(t, Mapping) and not _has_unknown(t)]
        depended |= set(nc.deps.get("spec", ()))
    chosen = []
    for s in subnets:
        tags = s.props.get("tags") if isinstance(s.props.get("tags"), Mapping) else {}
        for t in terms:
            by_tag = isinstance(t.get("tags"), Mapping) and t["tags"] and all(
                v == "*" and k in tags or tags.get(k) == v for k, v in t["tags"].items())
            by_id = isinstance(t.get("id"), str) and t["id"] in s.identities()
            if by_tag or by_id:
                chosen.append(s)
                break
        else:
            if s.key in depended:
                chosen.append(s)
    if not terms and not unreadable or unreadable and not chosen:
        return None
    return chosen


def check_gpu_subnets_s3_endpoint(resources: Sequence[Resource]) -> list[Violation]:
    """The route table of every subnet GPU nodes run in is on an S3 Gateway endpoint, so weight
    pulls bypass NAT. GPU subnets: those the GPU node classes select; failing
    that, every subnet of the stack without a route to an internet gateway."""
    policy = "gpu-subnets-s3-gateway-endpoint"
    found: list[Violation] = []
    endpoints = [(ep, _is_s3_gateway(ep)) for ep in resources if ep.typ in VPC_ENDPOINT_TYPES]
    s3_endpoints = [ep for ep, is_s3 in endpoints if is_s3 is not False]
    subnets = [r for r in resources if r.typ in SUBNET_TYPES]
    # A stack that only deploys models onto a cluster and network it does not own (a component
    # used alone) cannot see the nodes' path to S3; the stack that owns them is checked instead.
    owns_gpu_capacity = bool(gpu_node_pools(resources))
    if not s3_endpoints:
        if subnets or owns_gpu_capacity:
            anchor = subnets[0] if subnets else next(iter(gpu_node_pools(resources) or resources))
            found.append(Violation(policy, anchor, "the stack has no S3 Gateway VPC endpoint, so GPU nodes pull "
                                   "weights through NAT (shared bandwidth, per-GB charge); fix: set "
                                   "warmstart:network.s3GatewayEndpoint: true"))
        return found
    if not subnets:
        # An existing VPC: its subnets and their route tables are not in the stack; the endpoint
        # must at least carry route tables (the configured private ones).
        for ep in s3_endpoints:
            rts = ep.props.get("routeTableIds")
            assoc = related(resources, ENDPOINT_ROUTE_TABLE_ASSOCIATION_TYPES, "vpcEndpointId", ep)
            if not is_unknown(rts) and not as_list(rts) and not assoc[0] and not assoc[1]:
                found.append(Violation(policy, ep, f"{ep.label()} is on no route table; fix: list the private "
                                       "subnets' route tables in warmstart:network.privateRouteTableIds"))
        return found

    public = _public_route_tables(resources)
    selected = _selected_subnets(resources, subnets)
    tables = {rt.key: rt for rt in resources if rt.typ in ROUTE_TABLE_TYPES}
    candidates = selected if selected is not None else subnets
    for s in candidates:
        assocs, maybe = related(resources, ROUTE_TABLE_ASSOCIATION_TYPES, "subnetId", s)
        rts = [rt for a in assocs for rt in tables.values() if refers(a, "routeTableId", rt)]
        if selected is None and any(rt.key in public for rt in rts):
            continue  # a public subnet: no GPU node runs there
        if not assocs:
            if not maybe:
                found.append(Violation(policy, s, f"{s.label()} has no route table association in the stack, so "
                                       "it uses the VPC's main route table, which no S3 endpoint is on; fix: "
                                       "associate it with a private route table on the endpoint"))
            continue
        for rt in rts:
            on = [refers(ep, "routeTableIds", rt) for ep in s3_endpoints]
            on += [refers(a, "routeTableId", rt) for ep in s3_endpoints
                   for a in related(resources, ENDPOINT_ROUTE_TABLE_ASSOCIATION_TYPES, "vpcEndpointId", ep)[0]]
            if not any(on) and None not in on:
                found.append(Violation(policy, s, f"{s.label()} (GPU nodes) routes through {rt.label()}, which is "
                                       "not on the S3 Gateway endpoint, so weight pulls go through NAT; fix: add "
                                       "the route table to the endpoint's routeTableIds"))
    return found
