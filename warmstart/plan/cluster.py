"""The cluster layer's decisions and cross-field rules: cluster, system nodes, GPU pools (pure).

The Cluster component plans from its own Args with `plan_cluster_layer` (pools sized by the
models it is told run on them); `plan_cluster()` (called by `stack.plan_stack`) does the same
for a stack, with the stack's planned models. Both raise ConfigErrors naming every broken rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from .. import versions
from ..config import CAPACITY_TYPE_LABEL_VALUE, NAMESPACE, ClusterConfig, GpuPool, StackConfig, SystemNodeGroupConfig
from ..decisions import autoscaling as scaling
from ..decisions import cpu_pool, node_fit, routing, standby, standby_pool
from ..decisions import weights_import as imports
from ..decisions import capacity, gpu_pools, instances, naming, placement, prices
from ..decisions import node_cache as staging
from ..decisions.gpu_pools import PoolModel
from ..decisions.instances import GpuInstance
from ..errors import ConfigError, Problems
from .model import ModelPlan, check_compile_cache_host_path
from .records import CapacityPlan, CpuPoolPlan, PoolPlan

# The Karpenter chart runs two controller replicas with required host anti-affinity and a
# zone spread (https://github.com/aws/karpenter-provider-aws/blob/v1.14.1/charts/karpenter/values.yaml),
# on nodes Karpenter did not launch.
MIN_SYSTEM_NODES = 2
# The type a refused system group's message offers besides more nodes.
LARGER_SYSTEM_TYPE = "m7i.xlarge"
_DEFAULT_SYSTEM = SystemNodeGroupConfig()
# Auto Mode's own NodePools and NodeClass: a GPU pool of the same name would collide with them
# (and a custom NodeClass may not be called `default`;
# https://docs.aws.amazon.com/eks/latest/userguide/create-node-class.html,
# https://docs.aws.amazon.com/eks/latest/userguide/create-node-pool.html).
AUTO_MODE_RESERVED_POOL_NAMES = ("default", "general-purpose", "system")


@dataclass(frozen=True)
class SystemNodeGroupPlan:
    instance_types: tuple[str, ...]
    size: int


@dataclass(frozen=True)
class ClusterPlan:
    """The cluster layer's decisions."""

    mode: placement.ClusterMode
    name: str
    """EKS cluster name (naming.cluster_name; the network layer tags subnets with it)."""
    kubernetes_version: str
    partition: str
    admins: tuple[str, ...]
    """Principals given cluster-admin access entries (sorted, each once)."""
    viewers: tuple[str, ...]
    """Principals given read-only access entries, Secrets included (sorted, each once, none an admin)."""
    log_types: tuple[str, ...]
    log_retention_days: int
    system_node_group: SystemNodeGroupPlan | None
    """karpenter mode only."""
    nvme_check: str
    pools: tuple[PoolPlan, ...]
    endpoint_public_access: bool = True
    """The API server's public endpoint is on (the private one always is)."""
    public_access_cidrs: tuple[str, ...] = ("0.0.0.0/0",)
    """Who may reach the public endpoint (empty when it is off)."""
    cpu_pool: CpuPoolPlan | None = None
    """karpenter mode only: the NodePool of the non-GPU pods."""

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
            "endpointPublicAccess": self.endpoint_public_access,
            "cpuPool": {"name": self.cpu_pool.name, "instanceTypes": list(self.cpu_pool.instance_types),
                        "cpuLimit": self.cpu_pool.cpu_limit} if self.cpu_pool else None,
            "pools": [p.summary() for p in self.pools],
        }


def plan_pool(pool: GpuPool, *, mode: placement.ClusterMode, models: Sequence[PoolModel], key: str,
              autoscaled: Mapping[str, scaling.AutoscalingSpec] | None = None,
              model_keys: Mapping[str, str] | None = None, now: datetime | None = None,
              region: str | None = None) -> PoolPlan:
    """One GPU pool's decisions, sized for `models` (the models that run on it, autoscaled ones
    at their maxReplicas), or ConfigErrors keyed `<key>.<field>` (`warmstart:gpuPools[0]`, or
    `ClusterArgs.gpuPools[0]`). `autoscaled`: the autoscaling block of each autoscaled model on
    the pool, keyed by name; `model_keys`: each model's config key, for their errors."""
    scaled = {name: spec for name, spec in (autoscaled or {}).items() if any(m.name == name for m in models)}
    errors = Problems()
    insts = []
    for t in sorted(set(pool.instance_types)):
        try:
            insts.append(instances.lookup(t))
        except instances.UnknownInstanceType as err:
            errors.add(f"{key}.instanceTypes", "unknown GPU instance type", f"use one of: {', '.join(err.known)}", t)
    errors.raise_if_any()
    if mode == "auto" and pool.name in AUTO_MODE_RESERVED_POOL_NAMES:
        errors.add(f"{key}.name", "is the name of one of EKS Auto Mode's built-in NodePools or NodeClass",
                   f"use another name (not {', '.join(AUTO_MODE_RESERVED_POOL_NAMES)})", pool.name)
    if mode == "karpenter" and pool.name == cpu_pool.POOL:
        errors.add(f"{key}.name", "is the name of warmstart's NodePool for non-GPU pods",
                   f"use another name (not {cpu_pool.POOL})", pool.name)
    if mode == "auto":
        unsupported = [x.instance_type for x in insts if not x.auto_mode_supported]
        if unsupported:
            # https://docs.aws.amazon.com/eks/latest/userguide/automode-learn-instances.html
            errors.add(f"{key}.instanceTypes", "EKS Auto Mode does not launch this instance family",
                       "use a supported family, or clusterMode: karpenter", unsupported)
    cached = sum(1 for m in models if m.compile_cache)
    required = gpu_pools.required_nvme_bytes(cached)
    try:
        gpu_pools.check_nvme(insts, required)
    except gpu_pools.PoolError as err:
        errors.add(f"{key}.instanceTypes", f"pool {pool.name!r}: {err.rule}", err.fix, list(pool.instance_types))
        errors.raise_if_any()
    min_nvme = gpu_pools.smallest_nvme_bytes(insts)
    staged = [staging.StagedModel(m.name, m.staged_bytes, m.compile_cache) for m in models if m.staged_bytes]
    try:
        staging.check_capacity(pool.name, insts, staged, cached)
    except staging.NodeCacheError as err:
        errors.add(f"{key}.instanceTypes", err.rule, err.fix, list(pool.instance_types))
    spare = _warm_spare_instance(pool, insts, models, key, errors)
    spare_gpus = pool.warm_nodes * spare.gpu_count if spare else 0

    ephemeral = None
    if mode == "auto":
        try:
            ephemeral = gpu_pools.auto_mode_ephemeral_storage_gib(min_nvme, pool.ephemeral_storage_gib)
        except gpu_pools.PoolError as err:
            errors.add(f"{key}.ephemeralStorageGiB", f"pool {pool.name!r}: {err.rule}", err.fix,
                       pool.ephemeral_storage_gib)
    elif pool.ephemeral_storage_gib is not None:
        errors.add(f"{key}.ephemeralStorageGiB", "only applies to clusterMode: auto (Karpenter's "
                   "EC2NodeClass uses the whole NVMe through instanceStorePolicy: RAID0)",
                   "remove ephemeralStorageGiB", pool.ephemeral_storage_gib)

    if pool.max_gpus is None:
        # The warm spares' nodes count against the limit like any other.
        max_gpus = gpu_pools.default_max_gpus(models, insts) + spare_gpus
    elif scaled:
        # KEDA may ask for every autoscaled model's maxReplicas, and a rollout adds a surge pod.
        max_gpus = pool.max_gpus
        with errors.collect():
            scaling.check_pool_capacity(pool.name, max_gpus, models, scaled, model_keys=model_keys or {},
                                        pool_key=key)
    else:
        max_gpus = pool.max_gpus
        floor = max(gpu_pools.gpus_needed(models), max((m.instance.gpu_count for m in models), default=0))
        if max_gpus < floor:
            errors.add(
                f"{key}.maxGpus", f"pool {pool.name!r}: its models' replicas need nodes with {floor} "
                "GPUs in all, and Karpenter counts whole nodes against the limit",
                f"set maxGpus >= {floor} (>= {gpu_pools.default_max_gpus(models, insts)} leaves room "
                "for a rollout's surge pod), or remove it to derive it", max_gpus)
    if pool.max_gpus is not None and spare is not None and pool.warm_nodes:
        try:
            staging.check_warm_nodes(pool.name, pool.warm_nodes, spare.gpu_count, pool.max_gpus,
                                     gpu_pools.gpus_needed(models, gpu_pools.SURGE_PODS))
        except staging.NodeCacheError as err:
            errors.add(f"{key}.warmNodes", err.rule, err.fix, pool.warm_nodes)
    cap = plan_capacity(pool, mode=mode, key=key, errors=errors, now=now)
    errors.raise_if_any()
    min_tp = min((m.tensor_parallel_size for m in models), default=1)
    # A stack's own price wins (its account's rate); else the shipped on-demand list price.
    listed = prices.pool_price(region, [i.instance_type for i in insts]) if region else None
    return PoolPlan(
        name=pool.name,
        instances=tuple(insts),
        capacity_types=tuple(sorted({CAPACITY_TYPE_LABEL_VALUE[t] for t in cap.types})),
        capacity=cap,
        max_gpus=max_gpus,
        models=tuple(m.name for m in models),
        compile_cache_models=cached,
        required_nvme_bytes=required,
        min_nvme_bytes=min_nvme,
        nvme_label_floor=gpu_pools.nvme_label_floor(required),
        gpu_count_label_floor=gpu_pools.gpu_count_label_floor(min_tp),
        ephemeral_storage_gib=ephemeral,
        warm_nodes=pool.warm_nodes,
        warm_instance=spare if pool.warm_nodes else None,
        hourly_price_usd=pool.hourly_price_usd if pool.hourly_price_usd is not None else
        (listed.usd_per_hour if listed else None),
        price_source="hourlyPriceUsd" if pool.hourly_price_usd is not None else
        f"on-demand list price, {listed.as_of}" if listed else
        f"unknown: {region or 'this region'} is not in warmstart's price table (warmstart/data/ondemand_prices.csv)",
        staged_models=tuple(m.name for m in staged),
    )


def pool_capacity_types(pool: GpuPool) -> tuple[str, ...]:
    """The purchase options of a pool, in the engines' order: its `capacity.types`, or its
    legacy `capacityTypes` (`on-demand` read as `onDemand`)."""
    if pool.capacity is not None:
        return tuple(pool.capacity.types)
    given = {{"on-demand": "onDemand"}.get(c, c) for c in pool.capacity_types}
    return tuple(t for t in capacity.ENGINE_PRIORITY if t in given)


def plan_capacity(pool: GpuPool, *, mode: placement.ClusterMode, key: str, errors: Problems,
                  now: datetime | None = None) -> CapacityPlan:
    """The pool's `capacity` (or its legacy `capacityTypes`), its rules broken added to `errors`
    under `<key>.capacity...`: a selector the node class CRD would refuse is an error here first."""
    ck = f"{key}.capacity"
    if pool.capacity is None:
        cap = CapacityPlan(pool_capacity_types(pool))
        types_key = f"{key}.capacityTypes"
    else:
        c = pool.capacity
        types_key = f"{ck}.types"
        if "capacity_types" in pool.model_fields_set:
            errors.add(f"{key}.capacityTypes", "is superseded by capacity.types; a pool gives one of the two",
                       "remove capacityTypes and list every purchase option in capacity.types",
                       list(pool.capacity_types))
        problem = capacity.order_problem(c.types)
        if problem:
            errors.add(types_key, problem, "list each type once, in the engines' order", list(c.types))
        reserved = "reserved" in c.types
        if reserved and not c.reservations:
            errors.add(f"{ck}.reservations", "capacity.types has `reserved` but no reservation is selected: the "
                       "engine would find no reserved capacity to launch into",
                       "add reservations: [{id: cr-...}] or [{tags: {...}}] naming your ODCRs or Capacity Blocks, "
                       "or remove `reserved` from capacity.types")
        if c.reservations and not reserved:
            errors.add(f"{ck}.reservations", "selects reservations but capacity.types has no `reserved`, so the "
                       "NodePool could never launch into them (and in Auto Mode any selector stops open-ODCR "
                       "matching cluster-wide)", "add `reserved` first in capacity.types, or remove reservations")
        for j, r in enumerate(c.reservations):
            problem = capacity.selector_term_problem(r.id, r.tags, r.owner_id)
            if problem:
                errors.add(f"{ck}.reservations[{j}]", problem,
                           "give either {id: cr-...} alone, or {tags: {key: value}} with an optional ownerId")
        ids = [r.id for r in c.reservations if r.id]
        if len(set(ids)) != len(ids):
            errors.add(f"{ck}.reservations", "selects the same reservation id twice", "list each id once",
                       sorted({i for i in ids if ids.count(i) > 1}))
        if c.capacity_block is not None:
            if not reserved:
                errors.add(f"{ck}.capacityBlock", "a Capacity Block is reserved capacity, and capacity.types has no "
                           "`reserved`", "add `reserved` to capacity.types, or remove capacityBlock")
            end = c.capacity_block.ends_at
            if end is not None:
                if end.tzinfo is None:
                    errors.add(f"{ck}.capacityBlock.endsAt", "has no time zone, so its instant is ambiguous",
                               "write it with a zone, e.g. 2027-03-01T11:30:00Z", end.isoformat())
                elif end <= (now or datetime.now(timezone.utc)):
                    errors.add(f"{ck}.capacityBlock.endsAt", "is in the past: the Capacity Block has ended, and no "
                               "node can launch into it", "set the end of a current or future Capacity Block, or "
                               "remove capacityBlock and `reserved` to run on-demand", end.isoformat())
        if c.reserved_nodes is not None and not reserved:
            errors.add(f"{ck}.reservedNodes", "counts reserved nodes, but capacity.types has no `reserved`",
                       "remove reservedNodes, or add `reserved` and the reservations", c.reserved_nodes)
        if c.spot_hourly_price_usd is not None and "spot" not in c.types:
            errors.add(f"{ck}.spotHourlyPriceUsd", "prices spot nodes, but capacity.types has no `spot`",
                       "remove spotHourlyPriceUsd, or add `spot` to capacity.types", c.spot_hourly_price_usd)
        if mode == "karpenter":
            problem = capacity.karpenter_version_problem(versions.KARPENTER_VERSION, reserved, c.capacity_block is not None)
            if problem:
                errors.add(types_key, problem, "raise KARPENTER_VERSION in warmstart/versions.py, or remove `reserved`")
        cap = CapacityPlan(
            types=tuple(c.types),
            reservation_terms=tuple((r.id, tuple(sorted(r.tags.items())) if r.tags is not None else None, r.owner_id)
                                    for r in c.reservations),
            capacity_block=c.capacity_block is not None,
            capacity_block_ends_at=c.capacity_block.ends_at if c.capacity_block else None,
            reserved_nodes=c.reserved_nodes,
            spot_hourly_price_usd=c.spot_hourly_price_usd,
        )
    return cap


def _warm_spare_instance(pool: GpuPool, insts: Sequence[GpuInstance], models: Sequence[PoolModel], key: str,
                         errors: Problems) -> GpuInstance | None:
    """The instance type of the pool's warm spare nodes: the one its models run on (a spare only
    helps a pod that selects its type), or the pool's largest without models."""
    if not pool.warm_nodes:
        return None
    types = sorted({m.instance.instance_type for m in models})
    if len(types) > 1:
        errors.add(f"{key}.warmNodes", f"pool {pool.name!r}: its models run on {', '.join(types)}, and a warm spare "
                   "is one instance type, so it would serve only some of them",
                   "put the models of different instance types on separate pools, or set warmNodes: 0", pool.warm_nodes)
        return None
    if types:
        return next(m.instance for m in models)
    return max(insts, key=lambda i: (i.gpu_count, i.instance_type))


def plan_cluster_layer(c: ClusterConfig, pools: Sequence[tuple[GpuPool, Sequence[PoolModel]]], *,
                       mode: placement.ClusterMode, name: str, kubernetes_version: str, region: str,
                       key: str, pools_key: str, autoscaled: Mapping[str, scaling.AutoscalingSpec] | None = None,
                       model_keys: Mapping[str, str] | None = None,
                       system_pods: Sequence[node_fit.PodDemand] = (),
                       non_gpu_pods: Sequence[node_fit.PodDemand] = (), cpu_limit: int | None = None) -> ClusterPlan:
    """The cluster's decisions: its settings `c` (keys `<key>.<field>`) and each pool with the
    models on it (keys `<pools_key>[i].<field>`), or ConfigErrors. `system_pods`: what runs on the
    Karpenter-mode system node group besides the controller and CoreDNS (warmstart puts nothing
    else there); `non_gpu_pods`: the platform's own pods on its CPU NodePool (`non_gpu_pods`),
    which its limit is sized for, unless `cpu_limit` gives it."""
    errors = Problems()
    system = None
    if mode == "karpenter":
        if c.system_node_group is None:
            errors.add(
                f"{key}.systemNodeGroup", "clusterMode: karpenter needs a system node group: the "
                "Karpenter controller must not run on nodes it launches itself, so without one "
                "nothing can launch the first node", "remove `systemNodeGroup: null` to get the "
                f"default ({', '.join(_DEFAULT_SYSTEM.instance_types)} nodes, as many as its pods need), "
                "or use clusterMode: auto")
        elif c.system_node_group.size is not None and c.system_node_group.size < MIN_SYSTEM_NODES:
            errors.add(
                f"{key}.systemNodeGroup.size", f"the Karpenter chart runs {MIN_SYSTEM_NODES} controller "
                "replicas with required anti-affinity across hosts and zones; fewer nodes leave one Pending "
                "and a single node is a single point of failure for all scaling",
                f"set size >= {MIN_SYSTEM_NODES}", c.system_node_group.size)
        else:
            system = plan_system_group(c.system_node_group, system_pods, f"{key}.systemNodeGroup", errors)
        gpu_types = sorted(set(c.system_node_group.instance_types) & set(instances.catalog())
                           if c.system_node_group else set())
        if gpu_types:
            errors.add(f"{key}.systemNodeGroup.instanceTypes", "GPU instance types in the system node "
                       "group would idle their GPUs", "use a general-purpose type such as m7i.large", gpu_types)
    check_access_principals(c, key, errors)
    if not c.endpoint_public_access and "public_access_cidrs" in c.model_fields_set:
        errors.add(f"{key}.publicAccessCidrs", "limits who reaches the public endpoint, but endpointPublicAccess is "
                   "false: there is no public endpoint", "remove publicAccessCidrs, or set endpointPublicAccess: true",
                   list(c.public_access_cidrs))
    planned = []
    for i, (pool, models) in enumerate(pools):
        with errors.collect():
            planned.append(plan_pool(pool, mode=mode, models=models, key=f"{pools_key}[{i}]",
                                     autoscaled=autoscaled, model_keys=model_keys, region=region))
    errors.raise_if_any()
    return ClusterPlan(
        mode=mode,
        name=name,
        kubernetes_version=kubernetes_version,
        partition=naming.partition(region),
        admins=tuple(sorted(set(c.admins))),
        viewers=tuple(sorted(set(c.viewers))),
        log_types=tuple(sorted(set(c.log_types))),
        log_retention_days=c.log_retention_days,
        system_node_group=system,
        nvme_check=c.nvme_check,
        pools=tuple(planned),
        endpoint_public_access=c.endpoint_public_access,
        public_access_cidrs=tuple(c.public_access_cidrs) if c.endpoint_public_access else (),
        cpu_pool=CpuPoolPlan(cpu_pool.POOL, tuple(sorted(cpu_pool.INSTANCE_TYPES)),
                             cpu_limit if cpu_limit is not None else cpu_pool.cpu_limit(non_gpu_pods))
        if mode == "karpenter" else None,
    )


def plan_system_group(g: SystemNodeGroupConfig, pods: Sequence[node_fit.PodDemand], key: str,
                      errors: Problems) -> SystemNodeGroupPlan | None:
    """The system node group's size: the given one if every pod pinned to it fits (else a
    ConfigError with the numbers), or the fewest nodes (at least two) that hold them all.

    Packed onto the smallest listed type (a managed node group may launch any of them), with the
    kubelet's reservation as the EKS AMI computes it and each node's DaemonSets first
    (warmstart/decisions/node_fit.py). Only DaemonSets, the controller and CoreDNS are not
    warmstart's own: their requests are the published ones cited there."""
    types = tuple(sorted(set(g.instance_types)))
    load = [node_fit.KARPENTER_CONTROLLER, node_fit.COREDNS, *pods]
    known = [t for t in types if t in node_fit.node_types()]
    if len(known) < len(types):
        if g.size is None:
            families = sorted({t.split(".")[0] for t in node_fit.node_types() if t not in instances.catalog()})
            errors.add(f"{key}.size", f"warmstart has no allocatable figures for {sorted(set(types) - set(known))} "
                       "to size the group from", "set size explicitly, or use types warmstart knows (the "
                       f"{', '.join(families)} families, large to 4xlarge)", None)
            return None
        return SystemNodeGroupPlan(types, g.size)  # the user's size, which warmstart cannot check

    def room(t: str) -> tuple[int, int]:
        a = node_fit.allocatable(t, managed=True)
        return a.cpu_millis, a.memory_mib
    smallest = min(types, key=room)
    need = node_fit.nodes_needed(smallest, node_fit.NODE_DAEMONS, load, minimum=MIN_SYSTEM_NODES, managed=True)
    if need is None:
        one = node_fit.pack(node_fit.NodeGroup("system", smallest, 20, managed=True), node_fit.NODE_DAEMONS, load)
        errors.add(f"{key}.instanceTypes", node_fit.explain(one, one.group), "use a larger instance type, e.g. "
                   "m7i.xlarge", list(types))
        return None
    if g.size is not None:
        result = node_fit.pack(node_fit.NodeGroup("system", smallest, g.size, managed=True), node_fit.NODE_DAEMONS,
                               load)
        if not result.fits:
            bigger = node_fit.nodes_needed(LARGER_SYSTEM_TYPE, node_fit.NODE_DAEMONS, load, minimum=MIN_SYSTEM_NODES,
                                           managed=True)
            errors.add(f"{key}.size", node_fit.explain(result, result.group),
                       f"set systemNodeGroup.size: {need} (or leave it unset: warmstart sizes the group)"
                       + (f", or instanceTypes: [{LARGER_SYSTEM_TYPE}] with size {bigger}"
                          if bigger is not None and LARGER_SYSTEM_TYPE not in types else ""), g.size)
        return SystemNodeGroupPlan(types, g.size)
    return SystemNodeGroupPlan(types, need)


def runs_autoscaling(cfg: StackConfig, models: Sequence[Any]) -> bool:
    """Whether the platform runs KEDA and metrics collection: a model autoscales (`models`:
    ModelConfigs or ModelPlans) or model stacks may (`modelStacks.autoscaling`)."""
    return cfg.model_stacks.autoscaling or any(m.autoscaling for m in models)


def runs_node_feature_discovery(cfg: StackConfig, models: Sequence[ModelPlan]) -> bool:
    """Whether the platform runs node-feature-discovery: a model is staged (its node labels) or
    model stacks' models may be (`modelStacks.nodeCache`)."""
    return cfg.model_stacks.node_cache or any(m.staged for m in models)


def non_gpu_pods(cfg: StackConfig, models: Sequence[ModelPlan]) -> list[node_fit.PodDemand]:
    """What a platform itself runs on its non-GPU nodes (the CPU NodePool in Karpenter mode, Auto
    Mode's general-purpose pool): KEDA (autoscaling), node-feature-discovery (a staged model), each
    routed model's routers (its replicas plus a rollout's surge pod, spread over hosts) and each
    weights import Job (they may all run in the same `up`). Model stacks' routers and imports are
    their own (`model_non_gpu_pods`)."""
    pods: list[node_fit.PodDemand] = []
    if runs_autoscaling(cfg, models):
        pods += node_fit.KEDA_PODS
    if runs_node_feature_discovery(cfg, models):
        pods += node_fit.NFD_PODS
    for m in models:
        pods += model_non_gpu_pods(m)
    for p in cfg.standby_pools:
        # One pool actuator pod per standby pool (its Deployment recreates, no surge).
        pods.append(node_fit.PodDemand(standby_pool.pool_actuator_name(p.name),
                                       node_fit.parse_cpu(standby.ACTUATOR_REQUESTS["cpu"]),
                                       node_fit.parse_memory(standby.ACTUATOR_REQUESTS["memory"])))
    return pods


def model_non_gpu_pods(m: ModelPlan) -> list[node_fit.PodDemand]:
    """One model's pods off the GPU nodes: its routers (replicas plus a surge pod; with their front
    queues when the model holds requests at zero awake engines, with standby or at zero pods), its
    standby actuator and its import Job."""
    pods = []
    queue = m.autoscaling is not None and m.autoscaling.min_replicas == 0
    if m.routed:
        cpu, mem = node_fit.parse_cpu(routing.ROUTER_REQUESTS["cpu"]), node_fit.parse_memory(routing.ROUTER_REQUESTS["memory"])
        if queue:
            cpu += node_fit.parse_cpu(routing.FRONT_QUEUE_REQUESTS["cpu"])
            mem += node_fit.parse_memory(routing.FRONT_QUEUE_REQUESTS["memory"])
        pods.append(node_fit.PodDemand(f"{m.name}-router", cpu, mem, count=routing.ROUTER_REPLICAS + 1,
                                       spread=f"{m.name}-router"))
    if m.standby is not None:
        # One actuator pod (its Deployment recreates, no surge).
        pods.append(node_fit.PodDemand(f"{m.name}-standby", node_fit.parse_cpu(standby.ACTUATOR_REQUESTS["cpu"]),
                                       node_fit.parse_memory(standby.ACTUATOR_REQUESTS["memory"])))
    if m.weights_import is not None:
        pods.append(node_fit.PodDemand(f"{m.name}-import", node_fit.parse_cpu(m.weights_import.cpu),
                                       node_fit.parse_memory(imports.IMPORT_REQUESTS["memory"])))
    return pods


def check_access_principals(c: ClusterConfig, key: str, errors: Problems) -> None:
    """`admins` and `viewers` name each principal once, and no principal in both: EKS keeps one
    access entry per principal, so a second CreateAccessEntry for it fails with 409
    ResourceInUseException "already in use", halfway through an `up`
    (https://docs.aws.amazon.com/eks/latest/APIReference/API_CreateAccessEntry.html)."""
    for field, arns in (("admins", c.admins), ("viewers", c.viewers)):
        repeated = sorted({a for a in arns if arns.count(a) > 1})
        if repeated:
            errors.add(f"{key}.{field}", "lists the same principal more than once (EKS allows one access "
                       "entry per principal)", "list each ARN once", repeated)
    both = sorted(set(c.admins) & set(c.viewers))
    if both:
        errors.add(f"{key}.viewers", "names a principal that is also in admins: a principal has one access "
                   "entry, and cluster-admin already reads everything a viewer can",
                   "remove it from viewers (or from admins, to make it read-only)", both)


def pool_model_of(name: str, instance_type: str, tensor_parallel_size: int, replicas: int,
                  compile_cache: bool, *, key: str, staged_bytes: int = 0) -> PoolModel:
    """A model a pool is sized for, given by hand (the Cluster component's `models`)."""
    try:
        inst = instances.lookup(instance_type)
    except instances.UnknownInstanceType as err:
        raise ConfigError(f"{key}.instanceType", "unknown GPU instance type",
                          f"use one of: {', '.join(err.known)}", instance_type) from None
    return PoolModel(inst, tensor_parallel_size, replicas, name=name, compile_cache=compile_cache,
                     staged_bytes=staged_bytes)


def pool_model(m: ModelPlan) -> PoolModel:
    """What a pool's sizing needs to know of one planned model."""
    # An autoscaled model's pool must hold its maxReplicas: KEDA may ask for that many.
    return PoolModel(m.instance, m.tensor_parallel_size, m.max_replicas, name=m.name, compile_cache=m.compile_cache,
                     staged_bytes=m.weights_bytes if m.staged else 0,
                     min_replicas=m.autoscaling.min_replicas if m.autoscaling is not None else m.replicas)


def host_pool_model(pool: standby_pool.PoolPlan) -> PoolModel:
    """A standby pool's engine hosts as what a GPU pool is sized for: `maxHosts` pods of `gpus`
    GPUs (the pool actuator may raise the hosts' Deployment that far)."""
    return PoolModel(instances.lookup(pool.instance_type), pool.gpus, pool.max_hosts, name=pool.deployment_name,
                     compile_cache=False, staged_bytes=0, min_replicas=pool.spares)


def plan_cluster(cfg: StackConfig, name_prefix: str, models: Sequence[ModelPlan],
                 standby_pools: Sequence[standby_pool.PoolPlan] = ()) -> ClusterPlan:
    """A stack's cluster layer, its pools sized by the stack's (valid) planned models and its
    standby pools' engine hosts."""
    errors = Problems()
    with errors.collect():
        check_compile_cache_host_path(cfg.compile_cache.host_path, cfg.cluster_mode,
                                      f"{NAMESPACE}:compileCache.hostPath")
    cluster = None
    with errors.collect():
        cluster = plan_cluster_layer(
            cfg.cluster, [(p, [pool_model(m) for m in models if m.pool == p.name]
                           + [host_pool_model(s) for s in standby_pools if s.gpu_pool == p.name])
                          for p in cfg.gpu_pools],
            mode=cfg.cluster_mode, name=naming.cluster_name(name_prefix), kubernetes_version=cfg.kubernetes_version,
            region=cfg.region, key=f"{NAMESPACE}:cluster", pools_key=f"{NAMESPACE}:gpuPools",
            autoscaled={m.name: m.autoscaling_spec for m in models if m.autoscaling_spec is not None},
            model_keys={m.name: f"{NAMESPACE}:models[{i}]" for i, m in enumerate(cfg.models)},
            non_gpu_pods=non_gpu_pods(cfg, models))
    errors.raise_if_any()
    assert cluster is not None  # else raise_if_any raised
    return cluster
