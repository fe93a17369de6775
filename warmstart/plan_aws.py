"""The AWS layer's decisions and cross-field rules: network, buckets, per-model roles (pure).

`plan_aws()` is called by `plan.plan_stack`; it appends a ConfigError (key, rule, fix) for
every broken rule and returns None when there was one.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from .config import NAMESPACE, StackConfig
from .decisions import cachekey, naming, network
from .errors import ConfigError

MODEL_BUCKET_PURPOSE = "models"
CACHE_BUCKET_PURPOSE = "compile-cache"


@dataclass(frozen=True)
class NetworkPlan:
    create: bool
    """True: warmstart creates the VPC; False: it uses `vpc_id`."""
    cidr: str | None
    az_count: int
    availability_zones: tuple[str, ...] | None
    """Pinned AZ names; None means the region's first `az_count` available AZs."""
    layout: network.SubnetLayout | None
    single_nat_gateway: bool
    vpc_id: str | None
    private_subnet_ids: tuple[str, ...]
    private_route_table_ids: tuple[str, ...]
    public_subnet_ids: tuple[str, ...]
    s3_gateway_endpoint: bool
    karpenter_discovery: str | None
    """Cluster name for the `karpenter.sh/discovery` subnet tag (karpenter mode), else None."""


@dataclass(frozen=True)
class ModelAccess:
    """What one model's IRSA role may touch."""

    model: str
    role_name: str
    service_account: str
    model_prefix: str
    cache_prefix: str | None
    """Key prefix (`<model>/`) in the compile-cache bucket, None when the model runs without
    the compile cache (then the role gets no cache access at all)."""


@dataclass(frozen=True)
class AwsPlan:
    partition: str
    network: NetworkPlan
    model_bucket: str
    create_model_bucket: bool
    restrict_model_bucket_to_endpoint: bool
    compile_cache_bucket: str | None
    """None when no model uses the compile cache (then no cache bucket is created)."""
    cache_expire_after_days: int
    admins: tuple[str, ...]
    namespace: str
    access: tuple[ModelAccess, ...]

    def summary(self) -> dict:
        return {
            "vpc": "create" if self.network.create else self.network.vpc_id,
            "s3GatewayEndpoint": self.network.s3_gateway_endpoint,
            "modelBucket": self.model_bucket,
            "modelBucketCreated": self.create_model_bucket,
            "compileCacheBucket": self.compile_cache_bucket,
            "roles": {a.model: a.role_name for a in self.access},
        }


def _network(cfg: StackConfig, name_prefix: str, errors: list[ConfigError]) -> NetworkPlan | None:
    n = cfg.network
    key = f"{NAMESPACE}:network"
    given = n.model_fields_set
    bad = len(errors)
    discovery = naming.cluster_name(name_prefix) if cfg.cluster_mode == "karpenter" else None
    if n.vpc_id is None:
        for field, alias in (("private_subnet_ids", "privateSubnetIds"),
                             ("private_route_table_ids", "privateRouteTableIds"),
                             ("public_subnet_ids", "publicSubnetIds")):
            if getattr(n, field):
                errors.append(ConfigError(f"{key}.{alias}", "only applies to an existing VPC, but "
                                          "network.vpcId is not set (warmstart creates the VPC)",
                                          f"set network.vpcId, or remove {alias}"))
        azs = tuple(n.availability_zones) if n.availability_zones else None
        if azs is not None:
            if "az_count" in given and n.az_count != len(azs):
                errors.append(ConfigError(f"{key}.azCount", f"disagrees with the {len(azs)} "
                                          "availabilityZones given", "remove azCount", n.az_count))
            if len(set(azs)) != len(azs):
                errors.append(ConfigError(f"{key}.availabilityZones", "lists an AZ twice",
                                          "list each AZ once", list(azs)))
            bad_azs = [a for a in azs if not (a.startswith(cfg.region) and a[len(cfg.region):].isalpha()
                                              and len(a) == len(cfg.region) + 1)]
            if bad_azs:
                errors.append(ConfigError(f"{key}.availabilityZones", f"not AZ names of region "
                                          f"{cfg.region}", f"use names like {cfg.region}a", bad_azs))
        az_count = len(azs) if azs else n.az_count
        layout = None
        try:
            cidr = ipaddress.IPv4Network(n.cidr)
            if not cidr.is_private:
                errors.append(ConfigError(f"{key}.cidr", "is not a private (RFC 1918) range",
                                          "use e.g. 10.0.0.0/16", n.cidr))
            else:
                layout = network.subnet_layout(str(cidr), az_count)
        except ValueError as err:
            errors.append(ConfigError(f"{key}.cidr", f"not a usable VPC CIDR ({err})",
                                      f"use a network address from /{network.MIN_VPC_PREFIX} to "
                                      f"/{network.MAX_VPC_PREFIX}, e.g. 10.0.0.0/16", n.cidr))
        if len(errors) > bad:
            return None
        return NetworkPlan(create=True, cidr=n.cidr, az_count=az_count, availability_zones=azs,
                           layout=layout, single_nat_gateway=n.single_nat_gateway, vpc_id=None,
                           private_subnet_ids=(), private_route_table_ids=(), public_subnet_ids=(),
                           s3_gateway_endpoint=n.s3_gateway_endpoint, karpenter_discovery=discovery)

    for field, alias in (("cidr", "cidr"), ("availability_zones", "availabilityZones"),
                         ("az_count", "azCount"), ("single_nat_gateway", "singleNatGateway")):
        if field in given:
            errors.append(ConfigError(f"{key}.{alias}", "only applies to a VPC warmstart creates, "
                                      f"but network.vpcId={n.vpc_id!r} is given",
                                      f"remove {alias}, or remove vpcId to create a VPC"))
    if len(n.private_subnet_ids) < 2:
        errors.append(ConfigError(f"{key}.privateSubnetIds", "an existing VPC needs at least two "
                                  "private subnets in different AZs (EKS requires two AZs)",
                                  "list the private subnets the GPU nodes use", n.private_subnet_ids))
    if not n.private_route_table_ids:
        errors.append(ConfigError(f"{key}.privateRouteTableIds", "an existing VPC needs the route "
                                  "tables of its private subnets: without them the S3 Gateway "
                                  "endpoint cannot be attached and GPU nodes pull weights through NAT",
                                  "list the route table of every private subnet (aws ec2 "
                                  "describe-route-tables --filters Name=association.subnet-id,Values=<id>)"))
    elif len(n.private_route_table_ids) > len(n.private_subnet_ids):
        errors.append(ConfigError(f"{key}.privateRouteTableIds", "lists more route tables than there "
                                  "are private subnets (each subnet has exactly one)",
                                  "list only the route tables of privateSubnetIds",
                                  n.private_route_table_ids))
    for field, alias in (("private_subnet_ids", "privateSubnetIds"),
                         ("private_route_table_ids", "privateRouteTableIds"),
                         ("public_subnet_ids", "publicSubnetIds")):
        ids = getattr(n, field)
        if len(set(ids)) != len(ids):
            errors.append(ConfigError(f"{key}.{alias}", "lists an id twice", "list each id once", ids))
    overlap = set(n.private_subnet_ids) & set(n.public_subnet_ids)
    if overlap:
        errors.append(ConfigError(f"{key}.publicSubnetIds", "a subnet cannot be both private and public",
                                  "remove it from one list", sorted(overlap)))
    if len(errors) > bad:
        return None
    return NetworkPlan(create=False, cidr=None, az_count=len(n.private_subnet_ids), availability_zones=None,
                       layout=None, single_nat_gateway=False, vpc_id=n.vpc_id,
                       private_subnet_ids=tuple(sorted(n.private_subnet_ids)),
                       private_route_table_ids=tuple(sorted(n.private_route_table_ids)),
                       public_subnet_ids=tuple(sorted(n.public_subnet_ids)),
                       s3_gateway_endpoint=n.s3_gateway_endpoint, karpenter_discovery=discovery)


def _bucket(key: str, given: str | None, derived: str, errors: list[ConfigError]) -> str:
    if given is None:
        return derived
    problems = naming.bucket_name_problems(given)
    if problems:
        errors.append(ConfigError(key, "not a valid S3 bucket name: " + "; ".join(problems),
                                  "use 3-63 lowercase letters, digits and hyphens, starting and "
                                  "ending with a letter or digit, or remove the key to derive one",
                                  given))
    return given


def plan_aws(cfg: StackConfig, stack: str, name_prefix: str, compile_cache_models: set[str],
             errors: list[ConfigError]) -> AwsPlan | None:
    """The AWS layer's decisions, or None after appending every broken rule to `errors`."""
    bad = len(errors)
    net = _network(cfg, name_prefix, errors)
    n = cfg.network
    if not n.s3_gateway_endpoint and not n.allow_s3_via_nat:
        errors.append(ConfigError(
            f"{NAMESPACE}:network.s3GatewayEndpoint", "without the S3 Gateway endpoint the GPU "
            "subnets reach S3 only through NAT: every node pulling weights shares the NAT "
            "gateway's bandwidth and pays its per-GB charge (field notes 3)",
            "set s3GatewayEndpoint: true, or opt out explicitly with network.allowS3ViaNat: true", False))

    mb = cfg.model_bucket
    mkey = f"{NAMESPACE}:modelBucket"
    if not mb.create and mb.name is None:
        errors.append(ConfigError(f"{mkey}.name", "an existing model bucket (create: false) must be "
                                  "named", "set modelBucket.name to the bucket that holds the weights"))
    model_bucket = _bucket(f"{mkey}.name", mb.name, naming.bucket_name(
        name_prefix, MODEL_BUCKET_PURPOSE, stack, cfg.region, cfg.account_id), errors)
    if mb.restrict_to_vpc_endpoint:
        if not mb.create:
            errors.append(ConfigError(f"{mkey}.restrictToVpcEndpoint", "warmstart only writes the "
                                      "policy of a bucket it creates", "set create: true, or add the "
                                      "aws:SourceVpce condition to the existing bucket's own policy", True))
        if not n.s3_gateway_endpoint:
            errors.append(ConfigError(f"{mkey}.restrictToVpcEndpoint", "needs the stack's S3 Gateway "
                                      "endpoint, but network.s3GatewayEndpoint is false",
                                      "set network.s3GatewayEndpoint: true", True))
        if not mb.admins:
            errors.append(ConfigError(f"{mkey}.restrictToVpcEndpoint", "with no admins, nobody outside "
                                      "the VPC could upload or inspect weights",
                                      "list the roles that upload weights under modelBucket.admins", True))

    cb = cfg.compile_cache_bucket
    cache_bucket = _bucket(f"{NAMESPACE}:compileCacheBucket.name", cb.name, naming.bucket_name(
        name_prefix, CACHE_BUCKET_PURPOSE, stack, cfg.region, cfg.account_id), errors)
    if cache_bucket == model_bucket:
        errors.append(ConfigError(f"{NAMESPACE}:compileCacheBucket.name", "is the model bucket: the "
                                  "cache's lifecycle rule would delete model weights",
                                  "use a separate bucket for the compile cache", cache_bucket))

    access = []
    for i, m in enumerate(cfg.models):
        if m.bucket != model_bucket:
            errors.append(ConfigError(
                f"{NAMESPACE}:models[{i}].source", f"{m.name}: bucket {m.bucket!r} is not the "
                f"stack's model bucket {model_bucket!r}; its role may read only the model bucket",
                f"copy the weights to s3://{model_bucket}/{m.prefix}, or set "
                f"modelBucket.name: {m.bucket}", m.source))
        access.append(ModelAccess(
            model=m.name, role_name=naming.role_name(name_prefix, m.name), service_account=m.name,
            model_prefix=m.prefix,
            cache_prefix=cachekey.cache_key_prefix(m.name) if m.name in compile_cache_models else None))
    if len(errors) > bad or net is None:
        return None
    return AwsPlan(
        partition=naming.partition(cfg.region),
        network=net,
        model_bucket=model_bucket,
        create_model_bucket=mb.create,
        restrict_model_bucket_to_endpoint=mb.restrict_to_vpc_endpoint,
        compile_cache_bucket=cache_bucket if compile_cache_models else None,
        cache_expire_after_days=cb.expire_after_days,
        admins=tuple(sorted(mb.admins)),
        namespace=cfg.namespace,
        access=tuple(access),
    )
