"""The records the planners return (pure data, no planning): what builders and components
take. A builder imports this module alone, never a planner."""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime

from ..config import AutoscalingConfig, LoaderTuning, RoutingConfig
from ..decisions import autoscaling as scaling
from ..decisions import capacity, instances, placement
from ..decisions import node_cache as staging
from ..decisions import naming, routing, tuning
from ..decisions import standby as standby_mod
from ..decisions import standby_pool
from ..decisions import weights_import as imports
from ..decisions.instances import GpuInstance


@dataclass(frozen=True)
class ServingPlan:
    """What one model's serving objects are built from (the VllmModel component's plan, and
    every builder's input in warmstart/manifests)."""

    name: str
    source: str
    bucket: str
    prefix: str
    pool: str | None
    """The NodePool the pods select (`karpenter.sh/nodepool`); None: any node of the instance type."""
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
    weights_import: imports.ImportPlan | None = None
    """The Job that copies the weights into `source` before the pods start; None: they are there."""
    load: staging.LoadPrediction | None = None
    """Predicted weight-load time from S3 and from the node's NVMe, and whether the weights are
    staged on the pool's nodes (`nodeCache`)."""
    weights_digest: str | None = None
    """Immutable name of this version of the weights: the node directory and label value."""
    priority_class_name: str | None = None
    """The serving pods' PriorityClass; None: the cluster's default."""
    standby: standby_mod.StandbyPlan | None = None
    """Engines kept started and asleep (vLLM sleep mode), woken on load; None: none."""
    pooled: standby_pool.PooledStandby | None = None
    """The model's engine sleeps on a standby pool's hosts (`standby.pool`); None: not pooled."""
    node_cache_content_check: staging.ContentCheck = "auto"
    """How the stager checks a staged copy's bytes (`nodeCacheContentCheck`)."""

    @property
    def serving_port(self) -> int:
        """The port vLLM serves on in the model's pods: 8000, or a pooled model's member port (its
        engine's port on the pool's hosts too, so its routers reach both on one port)."""
        return self.pooled.port if self.pooled is not None else routing.VLLM_PORT

    @property
    def staged(self) -> bool:
        """Whether the weights are staged on the nodes' NVMe (the node cache)."""
        return self.load is not None and self.load.staged

    @property
    def rollout_timeout_seconds(self) -> int:
        """How long the pods may take to roll out: the Deployment's `progressDeadlineSeconds`
        and Pulumi's wait for it (`tuning.rollout_timeout_seconds`)."""
        return tuning.rollout_timeout_seconds(self.startup_budget_seconds)

    def script_config_map(self, shared: str, own: bool) -> str:
        """The ConfigMap this model's pods mount a pod-side script from: the namespace's shared
        one (`shared`, `warmstart-<script>`, which a platform ships) or, `own`, the model's own
        copy (`naming.script_config_map`)."""
        return naming.script_config_map(shared, self.name, own)


@dataclass(frozen=True)
class ModelPlan(ServingPlan):
    """Everything decided for one model: its serving plan, and the stack's per-model record of
    what its router and autoscaling do (`summary()` is its plan.json entry)."""

    routing: RoutingConfig = RoutingConfig()
    """The router in front of the replicas, as configured (`routing_policy` is the resolved one)."""
    autoscaling: AutoscalingConfig | None = None
    """KEDA's replica range and triggers; None: a fixed `replicas`."""

    @property
    def serving(self) -> ServingPlan:
        """What VllmModel and the builders take of this plan."""
        return ServingPlan(**{f.name: getattr(self, f.name) for f in fields(ServingPlan)})

    @property
    def autoscaling_spec(self) -> scaling.AutoscalingSpec | None:
        a = self.autoscaling
        return None if a is None else scaling.AutoscalingSpec(
            min_replicas=a.min_replicas, max_replicas=a.max_replicas,
            target_waiting_per_replica=a.target_waiting_per_replica, kv_cache_usage_ceiling=a.kv_cache_usage_ceiling,
            standby=self.standby.count if self.standby else 0,
            target_requests_per_replica=a.target_requests_per_replica)

    @property
    def routed(self) -> bool:
        """Whether a router fronts the model (`routing.policy`, `auto` resolved)."""
        # A pooled model may have one engine more than its own pods: the one woken on a host.
        return routing.wanted(self.routing.policy, self.replicas, self.max_replicas + (1 if self.pooled else 0))

    @property
    def routing_policy(self) -> str:
        """SMG's `--policy` for the model's router, or `none`."""
        return routing.POLICY_OF[self.routing.policy] if self.routed else "none"

    @property
    def router_ready_timeout_seconds(self) -> int:
        """How long Pulumi waits for the model's routers to be Ready: they are Ready once a vLLM
        pod is, after its rollout and, with `import`, the import Job's deadline."""
        return self.rollout_timeout_seconds + (self.weights_import.deadline_seconds if self.weights_import else 0)

    @property
    def max_replicas(self) -> int:
        """The most serving pods the model can have (standby engines included): what GPU pools are
        sized for."""
        return (self.autoscaling.max_replicas if self.autoscaling else self.replicas) + (
            self.standby.count if self.standby else 0)

    def summary(self) -> dict:
        """The plan.json entry for this model."""
        return ({"import": self.weights_import.summary()} if self.weights_import else {}) | {
            "name": self.name,
            "source": self.source,
            "pool": self.pool,
            "instanceType": self.instance.instance_type,
            "gpuName": self.instance.gpu_model,
            "gpusPerNode": self.instance.gpu_count,
            "tensorParallelSize": self.tensor_parallel_size,
            "replicas": self.replicas,
            "autoscaling": self.autoscaling.model_dump(by_alias=True) if self.autoscaling else None,
            **({"standby": self.standby.summary()} if self.standby else {}),
            **({"standby": self.pooled.summary()} if self.pooled else {}),
            "routing": self.routing_policy,
            "nodeCache": (self.load.summary() | {"digest": self.weights_digest}) if self.load else None,
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
class CapacityPlan:
    """A pool's purchase options and reservations, as the engines take them."""

    types: tuple[str, ...]
    """First choice first (reserved, spot, onDemand): `capacity.types`."""
    reservation_terms: tuple[tuple[str | None, tuple[tuple[str, str], ...] | None, str | None], ...] = ()
    """Each selector term as (id, sorted tags, owner id)."""
    capacity_block: bool = False
    capacity_block_ends_at: datetime | None = None
    reserved_nodes: int | None = None
    """Nodes the reservations hold for the pool; None: unknown."""
    spot_hourly_price_usd: float | None = None

    @property
    def reserved(self) -> bool:
        return "reserved" in self.types

    def selector_terms(self, mode: placement.ClusterMode) -> list[dict]:
        """The node class's `capacityReservationSelectorTerms`, in the mode's spelling."""
        return [capacity.selector_term(mode, i, dict(t) if t is not None else None, o)
                for i, t, o in self.reservation_terms]

    @property
    def placeholder_ids(self) -> tuple[str, ...]:
        return tuple(i for i, _, _ in self.reservation_terms if i == capacity.PLACEHOLDER_RESERVATION_ID)

    def summary(self) -> dict:
        return {
            "types": list(self.types),
            "reservations": self.selector_terms("karpenter"),
            "capacityBlock": self.capacity_block,
            "capacityBlockEndsAt": self.capacity_block_ends_at.isoformat() if self.capacity_block_ends_at else None,
            "reservedNodes": self.reserved_nodes,
        }


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
    warm_nodes: int = 0
    """Spare nodes kept staged by placeholder pods (`warmNodes`)."""
    warm_instance: GpuInstance | None = None
    """The spares' instance type; None without spares."""
    hourly_price_usd: float | None = None
    """The price of one of the pool's nodes per hour: the stack's `hourlyPriceUsd`, else the
    shipped on-demand list price of the pool's region (decisions/prices.py), else None."""
    price_source: str = "unknown"
    """Where `hourly_price_usd` comes from, in words (or why it is unknown)."""
    staged_models: tuple[str, ...] = ()
    """Models whose weights are staged on the pool's nodes."""
    capacity: CapacityPlan = CapacityPlan(("onDemand",))
    """Where the pool's nodes come from (reservations, spot, on-demand), first choice first."""

    @property
    def warm_cost_per_hour(self) -> float | None:
        """What the spares cost per hour; None when the price is not given."""
        return staging.warm_nodes_cost_per_hour(self.warm_nodes, self.hourly_price_usd)

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
            "stagedModels": list(self.staged_models),
            "warmNodes": self.warm_nodes,
            "warmInstanceType": self.warm_instance.instance_type if self.warm_instance else None,
            "warmCostPerHourUsd": self.warm_cost_per_hour,
            "capacity": self.capacity.summary(),
        }


@dataclass(frozen=True)
class CpuPoolPlan:
    """Karpenter mode: the elastic CPU NodePool every non-GPU pod but Karpenter's runs on
    (warmstart/decisions/cpu_pool.py)."""

    name: str
    instance_types: tuple[str, ...]
    cpu_limit: int
    """`limits.cpu`, whole CPUs."""
