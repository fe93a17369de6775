"""The AWS layer's decisions and cross-field rules: network, buckets, per-model roles (pure).

Each planner decides from its own part of the config and raises ConfigErrors naming every
broken rule under the key it is given: the Network and ModelStorage components call
`plan_network` and `plan_buckets` with their Args, and `plan_aws()` (called by
`plan.plan_stack`) composes them for a whole stack.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from ..config import NAMESPACE, S3_URI, CompileCacheBucketConfig, ModelBucketConfig, NetworkConfig, StackConfig
from ..decisions import cachekey, naming, network, weights_import
from ..errors import Problems

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
class ImportAccess:
    """What one model's weights-import role may touch: write its model's prefix (no delete),
    and read the S3 prefix it imports from, if any."""

    model: str
    role_name: str
    service_account: str
    model_bucket: str
    model_prefix: str
    source_bucket: str | None
    source_prefix: str | None
    """The `import.s3` location it may read; None for a Hugging Face import."""


@dataclass(frozen=True)
class BucketsPlan:
    """The model bucket and the compile-cache bucket."""

    partition: str
    model_bucket: str
    create_model_bucket: bool
    restrict_model_bucket_to_endpoint: bool
    admins: tuple[str, ...]
    deployers: tuple[str, ...]
    """Roles exempt from the endpoint's listing Deny; empty: the running identity."""
    delete_model_bucket_on_destroy: bool
    compile_cache_bucket: str | None
    """None when no model uses the compile cache (then no cache bucket is created)."""
    cache_expire_after_days: int


@dataclass(frozen=True)
class AwsPlan:
    network: NetworkPlan
    buckets: BucketsPlan
    namespace: str
    access: tuple[ModelAccess, ...]
    imports: tuple[ImportAccess, ...] = ()
    """One import role per model with `import`."""

    @property
    def partition(self) -> str:
        return self.buckets.partition

    @property
    def model_bucket(self) -> str:
        return self.buckets.model_bucket

    @property
    def compile_cache_bucket(self) -> str | None:
        return self.buckets.compile_cache_bucket

    def summary(self) -> dict:
        return {
            "vpc": "create" if self.network.create else self.network.vpc_id,
            "s3GatewayEndpoint": self.network.s3_gateway_endpoint,
            "modelBucket": self.model_bucket,
            "modelBucketCreated": self.buckets.create_model_bucket,
            "compileCacheBucket": self.compile_cache_bucket,
            "roles": {a.model: a.role_name for a in self.access},
        } | ({"importRoles": {a.model: a.role_name for a in self.imports}} if self.imports else {})


def plan_network(n: NetworkConfig, *, region: str, karpenter_discovery: str | None, key: str) -> NetworkPlan:
    """The network's decisions, or ConfigErrors keyed `<key>.<field>` (`warmstart:network`, or
    `NetworkArgs` for the component alone). `karpenter_discovery`: the cluster name to tag the
    private subnets with for Karpenter, None in Auto Mode."""
    errors = Problems()
    given = n.model_fields_set
    if not n.s3_gateway_endpoint and not n.allow_s3_via_nat:
        # https://docs.aws.amazon.com/vpc/latest/privatelink/vpc-endpoints-s3.html
        errors.add(
            f"{key}.s3GatewayEndpoint", "without the S3 Gateway endpoint the GPU subnets reach S3 "
            "only through NAT: every node pulling weights shares the NAT gateway's bandwidth and "
            "pays its per-GB charge", "set s3GatewayEndpoint: true, or opt out explicitly with "
            "allowS3ViaNat: true", False)
    if n.vpc_id is None:
        for field, alias in (("private_subnet_ids", "privateSubnetIds"),
                             ("private_route_table_ids", "privateRouteTableIds"),
                             ("public_subnet_ids", "publicSubnetIds")):
            if getattr(n, field):
                errors.add(f"{key}.{alias}", "only applies to an existing VPC, but vpcId is not set "
                           "(warmstart creates the VPC)", f"set vpcId, or remove {alias}")
        azs = tuple(n.availability_zones) if n.availability_zones else None
        if azs is not None:
            if "az_count" in given and n.az_count != len(azs):
                errors.add(f"{key}.azCount", f"disagrees with the {len(azs)} availabilityZones given",
                           "remove azCount", n.az_count)
            if len(set(azs)) != len(azs):
                errors.add(f"{key}.availabilityZones", "lists an AZ twice", "list each AZ once", list(azs))
            bad_azs = [a for a in azs if not (a.startswith(region) and a[len(region):].isalpha()
                                              and len(a) == len(region) + 1)]
            if bad_azs:
                errors.add(f"{key}.availabilityZones", f"not AZ names of region {region}",
                           f"use names like {region}a", bad_azs)
        az_count = len(azs) if azs else n.az_count
        layout = None
        try:
            cidr = ipaddress.IPv4Network(n.cidr)
            if not cidr.is_private:
                errors.add(f"{key}.cidr", "is not a private (RFC 1918) range", "use e.g. 10.0.0.0/16", n.cidr)
            else:
                layout = network.subnet_layout(str(cidr), az_count)
        except ValueError as err:
            errors.add(f"{key}.cidr", f"not a usable VPC CIDR ({err})",
                       f"use a network address from /{network.MIN_VPC_PREFIX} to "
                       f"/{network.MAX_VPC_PREFIX}, e.g. 10.0.0.0/16", n.cidr)
        errors.raise_if_any()
        return NetworkPlan(create=True, cidr=n.cidr, az_count=az_count, availability_zones=azs,
                           layout=layout, single_nat_gateway=n.single_nat_gateway, vpc_id=None,
                           private_subnet_ids=(), private_route_table_ids=(), public_subnet_ids=(),
                           s3_gateway_endpoint=n.s3_gateway_endpoint, karpenter_discovery=karpenter_discovery)

    for field, alias in (("cidr", "cidr"), ("availability_zones", "availabilityZones"),
                         ("az_count", "azCount"), ("single_nat_gateway", "singleNatGateway")):
        if field in given:
            errors.add(f"{key}.{alias}", f"only applies to a VPC warmstart creates, but vpcId={n.vpc_id!r} "
                       "is given", f"remove {alias}, or remove vpcId to create a VPC")
    if len(n.private_subnet_ids) < 2:
        errors.add(f"{key}.privateSubnetIds", "an existing VPC needs at least two private subnets in "
                   "different AZs (EKS requires two AZs)", "list the private subnets the GPU nodes use",
                   n.private_subnet_ids)
    if not n.private_route_table_ids:
        errors.add(f"{key}.privateRouteTableIds", "an existing VPC needs the route tables of its private "
                   "subnets: without them the S3 Gateway endpoint cannot be attached and GPU nodes pull "
                   "weights through NAT", "list the route table of every private subnet (aws ec2 "
                   "describe-route-tables --filters Name=association.subnet-id,Values=<id>)")
    elif len(n.private_route_table_ids) > len(n.private_subnet_ids):
        errors.add(f"{key}.privateRouteTableIds", "lists more route tables than there are private "
                   "subnets (each subnet has exactly one)", "list only the route tables of privateSubnetIds",
                   n.private_route_table_ids)
    for field, alias in (("private_subnet_ids", "privateSubnetIds"),
                         ("private_route_table_ids", "privateRouteTableIds"),
                         ("public_subnet_ids", "publicSubnetIds")):
        ids = getattr(n, field)
        if len(set(ids)) != len(ids):
            errors.add(f"{key}.{alias}", "lists an id twice", "list each id once", ids)
    overlap = set(n.private_subnet_ids) & set(n.public_subnet_ids)
    if overlap:
        errors.add(f"{key}.publicSubnetIds", "a subnet cannot be both private and public",
                   "remove it from one list", sorted(overlap))
    errors.raise_if_any()
    return NetworkPlan(create=False, cidr=None, az_count=len(n.private_subnet_ids), availability_zones=None,
                       layout=None, single_nat_gateway=False, vpc_id=n.vpc_id,
                       private_subnet_ids=tuple(sorted(n.private_subnet_ids)),
                       private_route_table_ids=tuple(sorted(n.private_route_table_ids)),
                       public_subnet_ids=tuple(sorted(n.public_subnet_ids)),
                       s3_gateway_endpoint=n.s3_gateway_endpoint, karpenter_discovery=karpenter_discovery)


def _bucket(key: str, given: str | None, derived: str, errors: Problems) -> str:
    if given is None:
        return derived
    problems = naming.bucket_name_problems(given)
    if problems:
        errors.add(key, "not a valid S3 bucket name: " + "; ".join(problems),
                   "use 3-63 lowercase letters, digits and hyphens, starting and ending with a letter "
                   "or digit, or remove the key to derive one", given)
    return given


def model_bucket_name(mb: ModelBucketConfig, *, name_prefix: str, stack: str, region: str,
                      account_id: str | None) -> str:
    """The model bucket's name: the one `mb` gives, or the derived `<prefix>-models-<hash8>`."""
    if mb.name is not None:
        return mb.name
    return naming.bucket_name(name_prefix, MODEL_BUCKET_PURPOSE, stack, region, account_id)


def derives_bucket_name(cfg: StackConfig) -> bool:
    """Whether the stack derives a bucket name (`naming.bucket_name`, whose hash includes
    `accountId`): its model bucket or its compile-cache bucket has no `name`."""
    return cfg.model_bucket.name is None or cfg.compile_cache_bucket.name is None


def resolve_sources(cfg: StackConfig, stack: str, name_prefix: str) -> StackConfig:
    """`cfg` with every relative `models[].source` (a key prefix, no scheme) made
    `s3://<model bucket>/<prefix>`, the model bucket named as `plan_buckets` names it (given or
    derived); `cfg` itself when every source is a full URI already."""
    if not any(m.relative for m in cfg.models):
        return cfg
    bucket = model_bucket_name(cfg.model_bucket, name_prefix=name_prefix, stack=stack, region=cfg.region,
                               account_id=cfg.account_id)
    return cfg.model_copy(update={"models": [m.in_bucket(bucket) for m in cfg.models]})


def plan_buckets(mb: ModelBucketConfig, cb: CompileCacheBucketConfig, *, name_prefix: str, stack: str,
                 region: str, account_id: str | None, has_s3_endpoint: bool, compile_cache: bool,
                 model_key: str, cache_key: str, endpoint_fix: str) -> BucketsPlan:
    """The two buckets' names and settings, or ConfigErrors keyed under `model_key` /
    `cache_key`. `compile_cache`: whether any model uses the cache (else no cache bucket);
    `has_s3_endpoint`: whether an S3 Gateway endpoint exists to restrict the model bucket to."""
    errors = Problems()
    if not mb.create and mb.name is None:
        errors.add(f"{model_key}.name", "an existing model bucket (create: false) must be named",
                   "set the name of the bucket that holds the weights")
    model_bucket = _bucket(f"{model_key}.name", mb.name, model_bucket_name(
        mb, name_prefix=name_prefix, stack=stack, region=region, account_id=account_id), errors)
    if mb.restrict_to_vpc_endpoint:
        if not mb.create:
            errors.add(f"{model_key}.restrictToVpcEndpoint", "warmstart only writes the policy of a bucket "
                       "it creates", "set create: true, or add the aws:SourceVpce condition to the "
                       "existing bucket's own policy", True)
        if not has_s3_endpoint:
            errors.add(f"{model_key}.restrictToVpcEndpoint", "needs an S3 Gateway endpoint, and there is "
                       "none", endpoint_fix, True)
        if not mb.admins:
            errors.add(f"{model_key}.restrictToVpcEndpoint", "with no admins, nobody outside the VPC could "
                       "upload or inspect weights", f"list the roles that upload weights under "
                       f"{model_key.rsplit(':', 1)[-1]}.admins", True)
    cache_bucket = _bucket(f"{cache_key}.name", cb.name, naming.bucket_name(
        name_prefix, CACHE_BUCKET_PURPOSE, stack, region, account_id), errors)
    if cache_bucket == model_bucket:
        errors.add(f"{cache_key}.name", "is the model bucket: the cache's lifecycle rule would delete "
                   "model weights", "use a separate bucket for the compile cache", cache_bucket)
    errors.raise_if_any()
    return BucketsPlan(
        partition=naming.partition(region),
        model_bucket=model_bucket,
        create_model_bucket=mb.create,
        restrict_model_bucket_to_endpoint=mb.restrict_to_vpc_endpoint,
        admins=tuple(sorted(mb.admins)),
        deployers=tuple(sorted(set(mb.deployers))),
        delete_model_bucket_on_destroy=mb.delete_on_destroy,
        compile_cache_bucket=cache_bucket if compile_cache else None,
        cache_expire_after_days=cb.expire_after_days,
    )


def model_access(model: str, prefix: str, *, name_prefix: str, service_account: str | None = None,
                 compile_cache: bool) -> ModelAccess:
    """What one model's IRSA role may touch: its weights' prefix and, with the compile cache,
    its own prefix of the cache bucket."""
    return ModelAccess(model=model, role_name=naming.role_name(name_prefix, model),
                       service_account=service_account or model, model_prefix=prefix,
                       cache_prefix=cachekey.cache_key_prefix(model) if compile_cache else None)


def import_access(model: str, model_bucket: str, model_prefix: str, *, name_prefix: str,
                  source_bucket: str | None = None, source_prefix: str | None = None,
                  service_account: str | None = None) -> ImportAccess:
    """What one model's import role may touch: its model's prefix, and its S3 source if any."""
    return ImportAccess(model=model, role_name=naming.import_role_name(name_prefix, model),
                        service_account=service_account or weights_import.service_account(model),
                        model_bucket=model_bucket, model_prefix=model_prefix.strip("/"),
                        source_bucket=source_bucket, source_prefix=source_prefix.strip("/") if source_prefix else None)


def plan_aws(cfg: StackConfig, stack: str, name_prefix: str, compile_cache_models: set[str]) -> AwsPlan:
    """A stack's AWS layer: network, buckets and one role per model, or ConfigErrors."""
    errors = Problems()
    net = buckets = None
    with errors.collect():
        discovery = naming.cluster_name(name_prefix) if cfg.cluster_mode == "karpenter" else None
        net = plan_network(cfg.network, region=cfg.region, karpenter_discovery=discovery,
                           key=f"{NAMESPACE}:network")
    with errors.collect():
        buckets = plan_buckets(
            cfg.model_bucket, cfg.compile_cache_bucket, name_prefix=name_prefix, stack=stack,
            region=cfg.region, account_id=cfg.account_id, has_s3_endpoint=cfg.network.s3_gateway_endpoint,
            # A platform without inline models keeps the bucket for its model stacks' models.
            compile_cache=bool(compile_cache_models) or (not cfg.models and cfg.compile_cache.enabled),
            model_key=f"{NAMESPACE}:modelBucket",
            cache_key=f"{NAMESPACE}:compileCacheBucket", endpoint_fix="set network.s3GatewayEndpoint: true")
    model_bucket = cfg.model_bucket.name if buckets is None else buckets.model_bucket
    for i, m in enumerate(cfg.models):
        # A relative source is in the model bucket by definition (plan.plan_stack resolves it first).
        if model_bucket is not None and m.bucket is not None and m.bucket != model_bucket:
            errors.add(
                f"{NAMESPACE}:models[{i}].source", f"{m.name}: bucket {m.bucket!r} is not the "
                f"stack's model bucket {model_bucket!r}; its role may read only the model bucket",
                f"copy the weights to s3://{model_bucket}/{m.prefix} and write source: {m.prefix} (a key "
                f"prefix in the stack's bucket), or set modelBucket.name: {m.bucket}", m.source)
    errors.raise_if_any()
    assert net is not None and buckets is not None  # else raise_if_any raised
    access = tuple(model_access(m.name, m.prefix, name_prefix=name_prefix,
                                compile_cache=m.name in compile_cache_models) for m in cfg.models)
    imports = []
    for m in cfg.models:
        if m.weights_import is None:
            continue
        src = S3_URI.match(m.weights_import.s3) if m.weights_import.s3 else None
        imports.append(import_access(m.name, m.bucket or buckets.model_bucket, m.prefix, name_prefix=name_prefix,
                                     source_bucket=src["bucket"] if src else None,
                                     source_prefix=src["prefix"] if src else None))
    return AwsPlan(network=net, buckets=buckets, namespace=cfg.namespace, access=access, imports=tuple(imports))
