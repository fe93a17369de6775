"""The cluster layer's decisions and cross-field rules: cluster, system nodes, GPU pools (pure).

`plan_cluster()` is called by `plan.plan_stack`; it appends a ConfigError (key, rule, fix)
for every broken rule, so the user sees them together with the other layers' errors.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from .config import NAMESPACE, GpuPool, StackConfig, SystemNodeGroupConfig
from .decisions import gpu_pools, instances, naming, placement
from .decisions.instances import GpuInstance
from .errors import ConfigError

# The Karpenter chart runs two controller replicas with required host anti-affinity and a
# zone spread (eks-facts 1.2), on nodes Karpenter did not launch.
MIN_SYSTEM_NODES = 2
_DEFAULT_SYSTEM = SystemNodeGroupConfig()
# Auto Mode's own NodePools and NodeClass: a GPU pool of the same name would collide with them
# (and a custom NodeClass may not be called `default`; eks-facts 2.1, 2.3).
AUTO_MODE_RESERVED_POOL_NAMES = ("default", "general-purpose", "system")


@dataclass(frozen=True)
class SystemNodeGroupPlan:
    instance_types: tuple[str, ...]
    size: int


@dataclass(frozen=True)
class PoolPlan:
    """Everything decided for one GPU pool (one NodePool and its node class)."""

    name: str
    instances: tuple[GpuInstance, ...]
    """The pool's instance types, sorted by name."""
    capacity_types: tuple[str, ...]
    max_gpus: int
    """NodePool `limits` on `nvidia.com/gpu`."""
    models: tuple[str, ...]
    """Models that run on the pool."""
    compile_cache_models: int
    """How many of them keep a compile cache on the node's NVMe."""
    required_nvme_bytes: int
    """NVMe every node of the pool must have (reserve plus caches)."""
    min_nvme_bytes: int
    """The smallest NVMe of the pool's instance types."""
    nvme_label_floor: int
    """N in the requirement `<domain>/instance-local-nvme Gt N`."""
    gpu_count_label_floor: int
    """N in the requirement `<domain>/instance-gpu-count Gt N` (the smallest TP on the pool, less one)."""
    ephemeral_storage_gib: int | None
    """Auto Mode NodeClass `ephemeralStorage.size` in GiB; None in karpenter mode."""

    @property
    def instance_types(self) -> tuple[str, ...]:
        return tuple(i.instance_type for i in self.instances)

    def summary(self) -> dict:
        return {
            "name": self.name,
            "instanceTypes": list(self.instance_types),
            "capacityTypes": list(self.capacity_types),
            "maxGpus": self.max_gpus,
            "minNvmeGB": self.min_nvme_bytes // instances.GB,
            "requiredNvmeBytes": self.required_nvme_bytes,
            "ephemeralStorageGiB": self.ephemeral_storage_gib,
            "models": list(self.models),
        }


@dataclass(frozen=True)
class ClusterPlan:
    """The cluster layer's decisions."""

    mode: placement.ClusterMode
    name: str
    """EKS cluster name (naming.cluster_name; the network layer tags subnets with it)."""
    kubernetes_version: str
    partition: str
    admins: tuple[str, ...]
    log_types: tuple[str, ...]
    log_retention_days: int
    system_node_group: SystemNodeGroupPlan | None
    """karpenter mode only."""
    nvme_check: str
    pools: tuple[PoolPlan, ...]

    @property
    def nvme_mount(self) -> str:
        return placement.NVME_MOUNT[self.mode]

    def summary(self) -> dict:
        return {
            "name": self.name,
            "mode": self.mode,
            "kubernetesVersion": self.kubernetes_version,
            "systemNodes": self.system_node_group.size if self.system_node_group else None,
            "nvmeCheck": self.nvme_check,
            "pools": [p.summary() for p in self.pools],
        }


def _under(path: str, root: str) -> bool:
    path, root = posixpath.normpath(path), posixpath.normpath(root)
    return path != root and posixpath.commonpath([path, root]) == root


def _plan_pool(i: int, pool: GpuPool, cfg: StackConfig, models: list, errors: list[ConfigError]) -> PoolPlan | None:
    key = f"{NAMESPACE}:gpuPools[{i}]"
    mode = cfg.cluster_mode
    try:
        insts = tuple(sorted({t: instances.lookup(t) for t in pool.instance_types}.values(),
                             key=lambda x: x.instance_type))
    except instances.UnknownInstanceType:
        return None  # plan_stack already reported it, with the known types
    bad = len(errors)
    if mode == "auto" and pool.name in AUTO_MODE_RESERVED_POOL_NAMES:
        errors.append(ConfigError(f"{key}.name", "is the name of one of EKS Auto Mode's built-in NodePools "
                                  "or NodeClass", f"use another name (not {', '.join(AUTO_MODE_RESERVED_POOL_NAMES)})",
                                  pool.name))
    if mode == "auto":
        unsupported = [x.instance_type for x in insts if not x.auto_mode_supported]
        if unsupported:
            errors.append(ConfigError(f"{key}.instanceTypes", "EKS Auto Mode does not launch this "
                                      "instance family (eks-facts 2.4)", "use a supported family, or "
                                      "clusterMode: karpenter", unsupported))
    on_pool = [m for m in models if m is not None and m.pool == pool.name]
    cached = sum(1 for m in on_pool if m.compile_cache)
    required = gpu_pools.required_nvme_bytes(cached)
    try:
        gpu_pools.check_nvme(insts, required)
    except gpu_pools.PoolError as err:
        errors.append(ConfigError(f"{key}.instanceTypes", f"pool {pool.name!r}: {err.rule}", err.fix,
                                  list(pool.instance_types)))
        return None
    min_nvme = gpu_pools.smallest_nvme_bytes(insts)

    ephemeral = None
    if mode == "auto":
        try:
            ephemeral = gpu_pools.auto_mode_ephemeral_storage_gib(min_nvme, pool.ephemeral_storage_gib)
        except gpu_pools.PoolError as err:
            errors.append(ConfigError(f"{key}.ephemeralStorageGiB", f"pool {pool.name!r}: {err.rule}",
                                      err.fix, pool.ephemeral_storage_gib))
    elif pool.ephemeral_storage_gib is not None:
        errors.append(ConfigError(f"{key}.ephemeralStorageGiB", "only applies to clusterMode: auto "
                                  "(Karpenter's EC2NodeClass uses the whole NVMe through "
                                  "instanceStorePolicy: RAID0)", "remove ephemeralStorageGiB",
                                  pool.ephemeral_storage_gib))

    pool_models = [gpu_pools.PoolModel(m.instance, m.tensor_parallel_size, m.replicas) for m in on_pool]
    if pool.max_gpus is None:
        max_gpus = gpu_pools.default_max_gpus(pool_models, insts)
    else:
        max_gpus = pool.max_gpus
        need = gpu_pools.gpus_needed(pool_models)
        one_node = max((m.instance.gpu_count for m in on_pool), default=0)
        floor = max(need, one_node)
        if max_gpus < floor:
            errors.append(ConfigError(
                f"{key}.maxGpus", f"pool {pool.name!r}: its models' replicas need nodes with {floor} "
                "GPUs in all, and Karpenter counts whole nodes against the limit",
                f"set maxGpus >= {floor} (>= {gpu_pools.default_max_gpus(pool_models, insts)} leaves room "
                "for a rollout's surge pod), or remove it to derive it", max_gpus))
    if len(errors) > bad:
        return None
    min_tp = min((m.tensor_parallel_size for m in on_pool), default=1)
    return PoolPlan(
        name=pool.name,
        instances=insts,
        capacity_types=tuple(sorted(set(pool.capacity_types))),
        max_gpus=max_gpus,
        models=tuple(m.name for m in on_pool),
        compile_cache_models=cached,
        required_nvme_bytes=required,
        min_nvme_bytes=min_nvme,
        nvme_label_floor=gpu_pools.nvme_label_floor(required),
        gpu_count_label_floor=gpu_pools.gpu_count_label_floor(min_tp),
        ephemeral_storage_gib=ephemeral,
    )


def plan_cluster(cfg: StackConfig, name_prefix: str, models: list, errors: list[ConfigError]) -> ClusterPlan | None:
    """The cluster layer's decisions, or None after appending every broken rule to `errors`.

    `models` are the ModelPlans in config order (None where a model had errors)."""
    bad = len(errors)
    mode = cfg.cluster_mode
    c = cfg.cluster
    key = f"{NAMESPACE}:cluster"
    system = None
    if mode == "karpenter":
        if c.system_node_group is None:
            errors.append(ConfigError(
                f"{key}.systemNodeGroup", "clusterMode: karpenter needs a system node group: the "
                "Karpenter controller must not run on nodes it launches itself, so without one "
                "nothing can launch the first node", "remove `systemNodeGroup: null` to get the "
                f"default ({_DEFAULT_SYSTEM.size} x {', '.join(_DEFAULT_SYSTEM.instance_types)}), "
                "or use clusterMode: auto"))
        elif c.system_node_group.size < MIN_SYSTEM_NODES:
            errors.append(ConfigError(
                f"{key}.systemNodeGroup.size", f"the Karpenter chart runs {MIN_SYSTEM_NODES} controller replicas with "
                "required anti-affinity across hosts and zones; fewer nodes leave one Pending and "
                "a single node is a single point of failure for all scaling",
                f"set size >= {MIN_SYSTEM_NODES}", c.system_node_group.size))
        else:
            system = SystemNodeGroupPlan(tuple(sorted(set(c.system_node_group.instance_types))),
                                         c.system_node_group.size)
        gpu_types = sorted(set(c.system_node_group.instance_types) & set(instances.catalog())
                           if c.system_node_group else set())
        if gpu_types:
            errors.append(ConfigError(f"{key}.systemNodeGroup.instanceTypes", "GPU instance types in "
                                      "the system node group would idle their GPUs",
                                      "use a general-purpose type such as m7i.large", gpu_types))

    host_path = cfg.compile_cache.host_path
    if host_path is not None and not _under(host_path, placement.NVME_MOUNT[mode]):
        errors.append(ConfigError(
            f"{NAMESPACE}:compileCache.hostPath", f"is not under {placement.NVME_MOUNT[mode]}, where "
            f"clusterMode: {mode} mounts the node's NVMe: the cache would silently land on the "
            "root EBS volume (field notes 4)", f"use a path under {placement.NVME_MOUNT[mode]}/ or "
            "remove hostPath for the default", host_path))

    pools = [_plan_pool(i, p, cfg, models, errors) for i, p in enumerate(cfg.gpu_pools)]
    if len(errors) > bad or any(p is None for p in pools):
        return None
    return ClusterPlan(
        mode=mode,
        name=naming.cluster_name(name_prefix),
        kubernetes_version=cfg.kubernetes_version,
        partition=naming.partition(cfg.region),
        admins=tuple(sorted(set(c.admins))),
        log_types=tuple(sorted(set(c.log_types))),
        log_retention_days=c.log_retention_days,
        system_node_group=system,
        nvme_check=c.nvme_check,
        pools=tuple(pools),
    )
