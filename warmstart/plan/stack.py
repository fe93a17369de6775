"""Resolve a StackConfig into per-model decisions (pure; no Pulumi).

`model.plan_model` decides one model from its own spec (the VllmModel component calls it
with its Args); `plan_stack` resolves a whole stack config, every layer, and reports every broken rule
with its key, rule and fix, all at once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import aws as plan_aws
from . import cluster as plan_cluster
from . import platform_args, platform_rules
from . import standby_pool as plan_standby_pool
from ..config import NAME_PREFIX_MAX, NAMESPACE, CompileCacheConfig, GpuPool, LoaderTuning, ModelConfig, StackConfig
from ..decisions import image_cache, naming, placement, standby_pool
from ..decisions import network as network_rules
from ..errors import ConfigError, Problems, listing
from .model import MANAGED_FLAGS, ModelPlan, compile_cache_host_path, plan_model

__all__ = ["MANAGED_FLAGS", "ModelPlan", "StackPlan", "plan_in_pool", "plan_model", "plan_stack", "plan_stack_model"]


@dataclass(frozen=True)
class StackPlan:
    stack: str
    name_prefix: str
    config: StackConfig
    models: tuple[ModelPlan, ...]
    aws: plan_aws.AwsPlan
    """Network, bucket and role decisions (aws.py)."""
    cluster: plan_cluster.ClusterPlan
    """Cluster, system node group and GPU pool decisions (cluster.py)."""
    standby_pools: tuple[standby_pool.PoolPlan, ...] = ()
    """The standby pools (`standbyPools`), each from its members' own plans (plan/standby_pool.py)."""

    @property
    def cluster_mode(self) -> str:
        return self.config.cluster_mode

    @property
    def derived_bucket_names(self) -> list[str]:
        """The bucket names this stack derives (`naming.bucket_name`, whose hash includes
        `accountId`) instead of taking them from `modelBucket.name` / `compileCacheBucket.name`:
        the model bucket's, and the compile-cache bucket's when a model uses it."""
        cfg, buckets = self.config, self.aws.buckets
        names = [buckets.model_bucket] if cfg.model_bucket.name is None else []
        if cfg.compile_cache_bucket.name is None and buckets.compile_cache_bucket is not None:
            names.append(buckets.compile_cache_bucket)
        return names

    def summary(self) -> dict:
        return {
            "stack": self.stack,
            "clusterMode": self.cluster_mode,
            "region": self.config.region,
            "models": [m.summary() for m in self.models],
            "aws": self.aws.summary(),
            "cluster": self.cluster.summary(),
            **({"standbyPools": [p.summary() for p in self.standby_pools]} if self.standby_pools else {}),
        }


def _pool_instance_type(key: str, m: ModelConfig, pool: GpuPool) -> str:
    """The instance type a stack's model runs on: its own, or its pool's only one."""
    if m.instance_type is None:
        if len(pool.instance_types) != 1:
            raise ConfigError(
                f"{key}.instanceType", f"pool {pool.name!r} has several instance types "
                f"({listing(list(pool.instance_types))}) and the model does not say which it runs on",
                "set instanceType to one of the pool's types")
        return pool.instance_types[0]
    if m.instance_type not in pool.instance_types:
        raise ConfigError(f"{key}.instanceType", f"not one of pool {pool.name!r}'s "
                          f"instanceTypes ({listing(list(pool.instance_types))})",
                          "add it to the pool or pick one of its types", m.instance_type)
    return m.instance_type


def plan_stack_model(i: int, m: ModelConfig, cfg: StackConfig, stack: str) -> ModelPlan:
    """A stack's `models[i]`: its pool, instance type and the stack's defaults, then plan_model,
    by the rules of a model on its platform (platform_rules.py) that a model stack's model has."""
    key = f"{NAMESPACE}:models[{i}]"
    side = platform_rules.environment(stack)
    pools = {p.name: p for p in cfg.gpu_pools}
    problem = platform_rules.pool_problem(m.pool, pools, key, side)
    if problem:
        raise ConfigError(*problem)
    pool = pools[m.pool]
    # An inline model's non-GPU pods go where its platform puts them (platform_facts exports the same).
    plan = plan_in_pool(m, key=key, pool=pool, loader=cfg.loader, compile_cache=cfg.compile_cache,
                        cluster_mode=cfg.cluster_mode, non_gpu=placement.own_platform_placement())
    problem = platform_rules.spot_problem(plan, plan_cluster.pool_capacity_types(pool), key, side)
    if problem:
        raise ConfigError(*problem)
    return plan


def plan_in_pool(m: ModelConfig, *, key: str, pool: GpuPool, loader: LoaderTuning, compile_cache: CompileCacheConfig,
                 cluster_mode: str, non_gpu: placement.NonGpuPlacement = placement.ANYWHERE_OFF_GPU) -> ModelPlan:
    """A model on one GPU pool with its platform's defaults (streamer tuning, compile cache, where
    its non-GPU pods go): the one path by which an inline model and a model on an existing
    platform (`platform.plan_on_platform`) are planned."""
    return plan_model(
        m, key=key, instance_type=_pool_instance_type(key, m, pool), pool=pool.name,
        loader=m.loader or loader,
        compile_cache=(not m.eager and compile_cache.enabled) if m.compile_cache is None else m.compile_cache,
        compile_cache_host_path=compile_cache_host_path(cluster_mode, compile_cache.host_path),  # type: ignore[arg-type]
        cluster_mode=cluster_mode, node_cache=m.node_cache, non_gpu=non_gpu)  # type: ignore[arg-type]


def check_derived_name_prefix(prefix: str, stack: str) -> None:
    """The name prefix derived from the stack's name (`ws-<stack>`, no `namePrefix` given) is one
    the platform contract carries (at most platform_args.NAME_PREFIX_MAX characters of IAM's
    name characters: the cluster, IAM role and bucket names are built on it), else the error
    names the stack and the key that overrides it (it was a component Args' field, or a
    traceback from an IAM role name)."""
    limit = platform_args.NAME_PREFIX_MAX
    if len(prefix) <= limit and re.fullmatch(platform_args.NAME_PREFIX, prefix):
        return
    why = f"{len(prefix)} characters, over {limit}" if len(prefix) > limit else "not of IAM's name characters"
    raise ConfigError(f"{NAMESPACE}:namePrefix",
                      f"not set, so it is derived from the stack name {stack!r} as `{prefix}`, which is {why}; "
                      "the cluster, IAM role and bucket names are built on it",
                      f"set warmstart:namePrefix (a DNS label of at most {NAME_PREFIX_MAX} characters) in this "
                      "stack's file, or use a shorter stack name", stack)


def plan_stack(cfg: StackConfig, stack: str) -> StackPlan:
    """All decisions for a stack, or ConfigErrors listing every broken rule of every layer.

    A `models[].source` given as a key prefix (no scheme) is first resolved into
    `s3://<model bucket>/<prefix>` (`plan_aws.resolve_sources`), so every decision below, and
    `StackPlan.config`, see full URIs only."""
    prefix = cfg.name_prefix or f"ws-{stack}"
    if cfg.name_prefix is None:
        check_derived_name_prefix(prefix, stack)
    cfg = plan_aws.resolve_sources(cfg, stack, prefix)
    problems = Problems()
    if cfg.image_cache.ecr_pull_through is not None:
        if cfg.account_id is None:
            problems.add(f"{NAMESPACE}:imageCache.ecrPullThrough", "the cached images' references name the "
                         "account's registry, and warmstart:accountId is not set",
                         "set warmstart:accountId (`warmstart preview` records it on a stack with no resources yet)")
        else:
            cfg = cfg.model_copy(update={"models": [
                m.model_copy(update={"image": image_cache.cached_image(m.image, cfg.account_id, cfg.region)})
                for m in cfg.models]})
    names = [m.name for m in cfg.models]
    for i, name in enumerate(names):
        if names.index(name) != i:
            problems.add(f"{NAMESPACE}:models[{i}].name", "duplicate model name",
                         "give every model a unique name", name)
    for i, why in naming.model_name_clashes(names, [p.name for p in cfg.gpu_pools]):
        problems.add(f"{NAMESPACE}:models[{i}].name", why, "rename the model so that no name warmstart derives "
                     "(<model>-router, -weights, -import, ...) is another model's", names[i])
    _check_monitoring(cfg, problems)
    _check_image_cache(cfg, problems)
    _check_service_cidr(cfg, problems)
    pool_names = [p.name for p in cfg.gpu_pools]
    for i, name in enumerate(pool_names):
        if pool_names.index(name) != i:
            problems.add(f"{NAMESPACE}:gpuPools[{i}].name", "duplicate pool name",
                         "give every pool a unique name", name)
    models: list[ModelPlan] = []
    for i, m in enumerate(cfg.models):
        with problems.collect():
            models.append(plan_stack_model(i, m, cfg, stack))
    # The platform runs what its own models need (so these hold by construction), by the rules a
    # model stack's model meets.
    for m in models:
        for problem in platform_rules.runs_problems(
                m, runs_keda=plan_cluster.runs_autoscaling(cfg, models),
                runs_node_feature_discovery=plan_cluster.runs_node_feature_discovery(cfg, models),
                key=f"{NAMESPACE}:models[{names.index(m.name)}]", side=platform_rules.environment(stack)):
            problems.add(*problem)
    pools = plan_standby_pool.plan_standby_pools(cfg, models, problems)
    cached = {m.name for m in models if m.compile_cache}
    # Each layer has its own rules; all are reported together.
    with problems.collect():
        aws = plan_aws.plan_aws(cfg, stack, prefix, cached)
    with problems.collect():
        cluster = plan_cluster.plan_cluster(cfg, prefix, models, pools)
    problems.raise_if_any()
    return StackPlan(stack=stack, name_prefix=prefix, config=cfg, models=tuple(models), aws=aws, cluster=cluster,
                     standby_pools=pools)


def _check_monitoring(cfg: StackConfig, problems: Problems) -> None:
    """A Prometheus of the user's own must be named to the NetworkPolicies, or it scrapes nothing
    and KEDA's trigger has no data (every warmstart pod is behind a policy)."""
    mon, key = cfg.monitoring, f"{NAMESPACE}:monitoring"
    autoscales = plan_cluster.runs_autoscaling(cfg, cfg.models)
    if mon.prometheus_url and autoscales and mon.scraper is None:
        problems.add(f"{key}.scraper", "prometheusUrl names your own Prometheus, but not its pods: the "
                     "NetworkPolicies admit only named scrapers to the metrics ports, so nothing would be scraped "
                     "and autoscaling would never act",
                     "add monitoring.scraper: {namespace: monitoring, podLabels: {app.kubernetes.io/name: prometheus}} "
                     "(your Prometheus server pods' namespace and labels)")
    if mon.scraper is not None and not mon.prometheus_url:
        problems.add(f"{key}.scraper", "names scraper pods, but without prometheusUrl warmstart runs the AMP "
                     "managed collector, which is admitted by itself", "remove monitoring.scraper, or set "
                     "monitoring.prometheusUrl to that Prometheus", mon.scraper.namespace)


def _check_image_cache(cfg: StackConfig, problems: Problems) -> None:
    """ECR pull-through rules read their upstream credentials from a secret in the rule's own
    account and region (https://docs.aws.amazon.com/AmazonECR/latest/userguide/pull-through-cache-creating-secret.html)."""
    ecr = cfg.image_cache.ecr_pull_through
    if ecr is None:
        return
    _, _, _, region, account, *_ = ecr.credential_arn.split(":")
    where = []
    if region != cfg.region:
        where.append(f"region {region} (the stack's is {cfg.region})")
    if cfg.account_id is not None and account != cfg.account_id:
        where.append(f"account {account} (the stack's is {cfg.account_id})")
    if where:
        problems.add(f"{NAMESPACE}:imageCache.ecrPullThrough.credentialArn", f"the secret is in {' and '.join(where)}; "
                     "ECR reads a pull-through cache rule's credentials only from a secret in the rule's account and "
                     "region", f"create the ecr-pullthroughcache/ secret in account {cfg.account_id or account}, region "
                     f"{cfg.region}, and give its ARN", ecr.credential_arn)


def _check_service_cidr(cfg: StackConfig, problems: Problems) -> None:
    """A Service range EKS would refuse fails the cluster's creation; check it against a created
    VPC's CIDR now (an existing VPC's blocks are read from AWS when the program runs)."""
    cidr = cfg.cluster.service_cidr
    if cidr is None:
        return
    why = network_rules.service_cidr_problem(cidr, [] if cfg.network.vpc_id else [cfg.network.cidr])
    if why:
        problems.add(f"{NAMESPACE}:cluster.serviceCidr", why, "use a /16 in 10.0.0.0/8, 172.16.0.0/12 or "
                     "192.168.0.0/16 outside the VPC, or leave it unset for EKS's default", cidr)
