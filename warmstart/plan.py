"""Resolve a StackConfig into per-model decisions (pure; no Pulumi).

Every cross-field rule lives here, and every violation is reported with its key, rule and fix,
all at once.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from . import plan_aws, plan_cluster
from .config import NAMESPACE, LoaderTuning, ModelConfig, StackConfig
from .decisions import instances, placement, tuning
from .decisions.instances import GIB, GpuInstance
from .errors import ConfigError, ConfigErrors

# Flags warmstart derives; a model's extraArgs may not set them, or two sources of truth
# would disagree on the cluster.
MANAGED_FLAGS = (
    "--tensor-parallel-size",
    "--load-format",
    "--model-loader-extra-config",
    "--enforce-eager",
    "--max-model-len",
    "--gpu-memory-utilization",
    "--port",
    "--host",
)


@dataclass(frozen=True)
class ModelPlan:
    """Everything decided for one model."""

    name: str
    source: str
    bucket: str
    prefix: str
    pool: str
    instance: GpuInstance
    tensor_parallel_size: int
    weights_bytes: int
    loader: LoaderTuning
    concurrency: int
    distributed: bool
    eager: bool
    compile_cache: bool
    compile_cache_host_path: str
    startup_budget_seconds: int
    pod: tuning.PodSize
    replicas: int
    image: str
    max_model_len: int | None
    gpu_memory_utilization: float
    extra_args: tuple[str, ...]

    def summary(self) -> dict:
        """The plan.json entry for this model."""
        return {
            "name": self.name,
            "source": self.source,
            "pool": self.pool,
            "instanceType": self.instance.instance_type,
            "gpuName": self.instance.gpu_model,
            "gpusPerNode": self.instance.gpu_count,
            "tensorParallelSize": self.tensor_parallel_size,
            "replicas": self.replicas,
            "weightsBytes": self.weights_bytes,
            "chunkBytes": self.loader.chunk_bytes,
            "concurrency": self.concurrency,
            "distributed": self.distributed,
            "eager": self.eager,
            "compileCache": self.compile_cache,
            "compileCacheHostPath": self.compile_cache_host_path,
            "startupBudgetSeconds": self.startup_budget_seconds,
            "image": self.image,
            "imagePinnedByDigest": "@sha256:" in self.image,
        }


@dataclass(frozen=True)
class StackPlan:
    stack: str
    name_prefix: str
    config: StackConfig
    models: tuple[ModelPlan, ...]
    aws: plan_aws.AwsPlan | None = None
    """Network, bucket and role decisions (plan_aws.py)."""
    cluster: plan_cluster.ClusterPlan | None = None
    """Cluster, system node group and GPU pool decisions (plan_cluster.py)."""

    @property
    def cluster_mode(self) -> str:
        return self.config.cluster_mode

    def summary(self) -> dict:
        return {
            "stack": self.stack,
            "clusterMode": self.cluster_mode,
            "region": self.config.region,
            "models": [m.summary() for m in self.models],
        } | ({"aws": self.aws.summary()} if self.aws else {}) | (
            {"cluster": self.cluster.summary()} if self.cluster else {})


def _plan_model(i: int, m: ModelConfig, cfg: StackConfig, errors: list[ConfigError]) -> ModelPlan | None:
    key = f"{NAMESPACE}:models[{i}]"
    pools = {p.name: p for p in cfg.gpu_pools}
    pool = pools.get(m.pool)
    if pool is None:
        errors.append(ConfigError(f"{key}.pool", f"no gpuPools entry named {m.pool!r}",
                                  f"use one of: {', '.join(sorted(pools))}", m.pool))
        return None
    if m.instance_type is None:
        if len(pool.instance_types) != 1:
            errors.append(ConfigError(
                f"{key}.instanceType", f"pool {pool.name!r} has several instance types "
                f"({', '.join(pool.instance_types)}) and the model does not say which it runs on",
                "set instanceType to one of the pool's types"))
            return None
        itype = pool.instance_types[0]
    else:
        itype = m.instance_type
        if itype not in pool.instance_types:
            errors.append(ConfigError(f"{key}.instanceType", f"not one of pool {pool.name!r}'s "
                                      f"instanceTypes ({', '.join(pool.instance_types)})",
                                      "add it to the pool or pick one of its types", itype))
            return None
    try:
        inst = instances.lookup(itype)
    except instances.UnknownInstanceType as err:
        errors.append(ConfigError(f"{key}.instanceType", "unknown GPU instance type",
                                  f"use one of: {', '.join(err.known)}", itype))
        return None

    weights = int(m.weights_gib * GIB)
    requested = None if m.tensor_parallel_size == "auto" else m.tensor_parallel_size
    try:
        tp = tuning.choose_tensor_parallel(weights, inst, requested, m.gpu_memory_utilization)
    except tuning.TuningError as err:
        errors.append(ConfigError(f"{key}.tensorParallelSize",
                                  f"{m.name}: {err.rule}", err.fix, m.tensor_parallel_size))
        return None

    loader = m.loader or cfg.loader
    distributed = tp > 1
    compile_cache = (not m.eager and cfg.compile_cache.enabled) if m.compile_cache is None else m.compile_cache
    ok = True
    if m.eager and distributed:
        errors.append(ConfigError(
            f"{key}.eager", f"{m.name}: --enforce-eager breaks distributed loading, which "
            f"tensorParallelSize={tp} turns on (field notes 2: error or silent fallback to rank 0 "
            "loading and an NCCL broadcast)", "set eager: false, or use a model that fits on one GPU", True))
        ok = False
    if m.eager and compile_cache:
        errors.append(ConfigError(
            f"{key}.compileCache", f"{m.name}: --enforce-eager disables torch.compile, so the "
            "compile cache would never be written", "set compileCache: false or eager: false", True))
        ok = False
    for arg in m.extra_args:
        flag = arg.split("=", 1)[0]
        if flag in MANAGED_FLAGS:
            errors.append(ConfigError(
                f"{key}.extraArgs", f"{flag} is derived by warmstart", f"remove it and set the "
                "matching model key (tensorParallelSize, eager, maxModelLen, gpuMemoryUtilization)", arg))
            ok = False
    if not ok:
        return None

    host_path = cfg.compile_cache.host_path or placement.compile_cache_host_path(cfg.cluster_mode)
    return ModelPlan(
        name=m.name,
        source=m.source,
        bucket=m.bucket,
        prefix=m.prefix,
        pool=pool.name,
        instance=inst,
        tensor_parallel_size=tp,
        weights_bytes=weights,
        loader=loader,
        concurrency=tuning.loader_concurrency(weights, loader.chunk_bytes),
        distributed=distributed,
        eager=m.eager,
        compile_cache=compile_cache,
        compile_cache_host_path=posixpath.normpath(host_path),
        startup_budget_seconds=tuning.startup_budget_seconds(weights),
        pod=tuning.pod_size(inst, tp),
        replicas=m.replicas,
        image=m.image,
        max_model_len=m.max_model_len,
        gpu_memory_utilization=m.gpu_memory_utilization,
        extra_args=tuple(m.extra_args),
    )


def plan_stack(cfg: StackConfig, stack: str) -> StackPlan:
    """All decisions for a stack, or ConfigErrors listing every broken rule."""
    errors: list[ConfigError] = []
    names = [m.name for m in cfg.models]
    for i, name in enumerate(names):
        if names.index(name) != i:
            errors.append(ConfigError(f"{NAMESPACE}:models[{i}].name", "duplicate model name",
                                      "give every model a unique name", name))
    pool_names = [p.name for p in cfg.gpu_pools]
    for i, name in enumerate(pool_names):
        if pool_names.index(name) != i:
            errors.append(ConfigError(f"{NAMESPACE}:gpuPools[{i}].name", "duplicate pool name",
                                      "give every pool a unique name", name))
    for i, pool in enumerate(cfg.gpu_pools):
        for itype in pool.instance_types:
            try:
                instances.lookup(itype)
            except instances.UnknownInstanceType as err:
                errors.append(ConfigError(f"{NAMESPACE}:gpuPools[{i}].instanceTypes",
                                          "unknown GPU instance type",
                                          f"use one of: {', '.join(err.known)}", itype))
    models = [_plan_model(i, m, cfg, errors) for i, m in enumerate(cfg.models)]
    prefix = cfg.name_prefix or f"ws-{stack}"
    # AWS layer (network, buckets, roles): its own rules, reported with the rest.
    cached = {m.name for m in models if m and m.compile_cache}
    aws = plan_aws.plan_aws(cfg, stack, prefix, cached, errors)
    # Cluster layer (node pools, NVMe guard): its own rules, reported with the rest.
    cluster = plan_cluster.plan_cluster(cfg, prefix, models, errors)
    if errors:
        raise ConfigErrors(errors)
    return StackPlan(stack=stack, name_prefix=prefix, config=cfg, models=tuple(m for m in models if m), aws=aws,
                     cluster=cluster)
