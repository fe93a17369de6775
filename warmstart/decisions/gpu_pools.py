"""GPU node pool decisions: NVMe sizing, the NodePool's label floors, GPU limits (pure).

The silent failure these functions guard against: a compile cache on a `hostPath` that is not
backed by the node's NVMe lands on the root EBS volume with no error ("Set the cache path to
NVMe instance store" in
https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html).

- Auto Mode RAID0s the NVMe and puts ephemeral storage on it only while the NodeClass
  `ephemeralStorage.size` is SMALLER than the instance's total NVMe ("Considerations" in
  https://docs.aws.amazon.com/eks/latest/userguide/automode-learn-instances.html).
- Karpenter uses the NVMe only with `instanceStorePolicy: RAID0`
  (https://karpenter.sh/v1.14/concepts/nodeclasses/#specinstancestorepolicy).
- Either way a node type without NVMe has nothing to RAID: the pool must not allow one.

Units: bytes (`*_bytes`) unless the name says GiB/GB. EC2 reports instance store in decimal
GB (`InstanceStorageInfo.TotalSizeInGB`, GpuInstance.nvme_total_gb); Kubernetes quantities
here are GiB. Every comparison between the two is made in bytes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .instances import GB, GIB, GpuInstance

# What the NVMe of every GPU node must hold besides any cache, reserved before a pool is
# accepted. On both modes the node's ephemeral storage lives there once RAID0 is on: the
# container images (a vLLM image unpacks to ~20 GiB; a rollout briefly keeps two versions,
# compressed layers plus snapshots) and pod scratch (logs, emptyDirs).
NODE_EPHEMERAL_RESERVE_BYTES = 100 * GIB
# Per model with the compile cache on. AWS measured ~15 MB of artifacts for a 60 GB model
# (ml-inference-fast-model-loading page above); one directory per model keeps an entry per
# configuration that ran on the node (TP degree, image), so reserve over 300x the measured size.
COMPILE_CACHE_RESERVE_BYTES = 5 * GIB

# Auto Mode's own default `ephemeralStorage.size`
# (https://docs.aws.amazon.com/eks/latest/userguide/create-node-class.html). With NVMe present
# the size is only a threshold (Auto Mode then uses a 20 GiB EBS data volume), so the default
# is kept whenever it is safely below the NVMe.
AUTO_MODE_DEFAULT_EPHEMERAL_GIB = 80
# The default is at most this share of the smallest NVMe, a margin for whatever unit and
# rounding Auto Mode compares in (the docs call the NVMe label "gibibytes" but EC2's total is GB).
AUTO_MODE_EPHEMERAL_MAX_SHARE = 0.5
AUTO_MODE_EPHEMERAL_RANGE_GIB = (1, 59000)  # NodeClass ephemeralStorage.size range in Gi

# In-flight pods per model during a rollout: Deployments roll with maxSurge 1.
SURGE_PODS = 1


class PoolError(ValueError):
    """A pool rule broken; the plan adds the config key."""

    def __init__(self, rule: str, fix: str) -> None:
        self.rule = rule
        self.fix = fix
        super().__init__(f"{rule}; fix: {fix}")


def required_nvme_bytes(compile_cache_models: int) -> int:
    """NVMe every node of a pool must have: the node's own ephemeral data plus the compile
    cache of each model on the pool that uses it."""
    if compile_cache_models < 0:
        raise ValueError("compile_cache_models must be >= 0")
    return NODE_EPHEMERAL_RESERVE_BYTES + compile_cache_models * COMPILE_CACHE_RESERVE_BYTES


def check_nvme(instances: Sequence[GpuInstance], required_bytes: int) -> None:
    """Every instance type has local NVMe, and enough of it for `required_bytes`."""
    missing = sorted(i.instance_type for i in instances if i.nvme_total_gb <= 0)
    if missing:
        raise PoolError(
            f"{', '.join(missing)} {'has' if len(missing) == 1 else 'have'} no local NVMe instance "
            "store: a node of this type would put the compile cache on its root EBS volume "
            "silently",
            "use instance types with local NVMe (every g5, g6, g6e, g7e, p4d, p5 type has it)")
    small = sorted((i for i in instances if not nvme_fits(i, required_bytes)), key=lambda i: i.instance_type)
    if small:
        names = ", ".join(f"{i.instance_type} ({i.nvme_total_gb} GB)" for i in small)
        raise PoolError(
            f"NVMe of {names} cannot hold the {required_bytes / GIB:.0f} GiB each node caches there "
            f"({NODE_EPHEMERAL_RESERVE_BYTES / GIB:.0f} GiB for images and pod scratch plus "
            f"{COMPILE_CACHE_RESERVE_BYTES / GIB:.0f} GiB per compile-cached model)",
            "use larger instance types of the family, or fewer compile-cached models on the pool")


def nvme_fits(instance: GpuInstance, required_bytes: int) -> bool:
    """The instance's NVMe holds `required_bytes`, and its NVMe label passes the pool's floor."""
    return (instance.nvme_total_bytes >= required_bytes
            and nvme_label_admits(instance, nvme_label_floor(required_bytes)))


def smallest_nvme_bytes(instances: Iterable[GpuInstance]) -> int:
    return min(i.nvme_total_bytes for i in instances)


def max_ephemeral_storage_gib(min_nvme_bytes: int) -> int:
    """The largest whole GiB size strictly below `min_nvme_bytes` (0 when none is)."""
    return max(0, math.ceil(min_nvme_bytes / GIB) - 1)


def auto_mode_ephemeral_storage_gib(min_nvme_bytes: int, requested_gib: int | None = None) -> int:
    """The Auto Mode NodeClass `ephemeralStorage.size` (GiB) for a pool whose smallest NVMe is
    `min_nvme_bytes`: strictly below it, so Auto Mode RAID0s the NVMe on every node type of
    the pool (the Auto Mode rule in the module docstring).

    Comparing GiB against EC2's decimal GB in bytes is the conservative reading: a size below
    the byte count is also below the GB number read as GiB.
    """
    limit = max_ephemeral_storage_gib(min_nvme_bytes)
    lo, hi = AUTO_MODE_EPHEMERAL_RANGE_GIB
    if requested_gib is not None:
        if requested_gib * GIB >= min_nvme_bytes:
            raise PoolError(
                f"ephemeralStorageGiB={requested_gib} is not smaller than the pool's smallest NVMe "
                f"({min_nvme_bytes / GB:.0f} GB = {min_nvme_bytes / GIB:.0f} GiB): Auto Mode would "
                "then skip the RAID0 and the compile cache would not be on the NVMe",
                f"remove ephemeralStorageGiB (default {AUTO_MODE_DEFAULT_EPHEMERAL_GIB}) or set it "
                f"below {limit + 1}")
        if not lo <= requested_gib <= hi:
            raise PoolError(f"ephemeralStorageGiB={requested_gib} is outside Auto Mode's {lo}-{hi} GiB",
                            f"use {lo}-{min(hi, limit)}")
        return requested_gib
    share = math.floor(min_nvme_bytes * AUTO_MODE_EPHEMERAL_MAX_SHARE / GIB)
    size = min(AUTO_MODE_DEFAULT_EPHEMERAL_GIB, share, limit)
    if size < lo:
        raise PoolError(f"the pool's smallest NVMe ({min_nvme_bytes / GB:.1f} GB) leaves no valid "
                        "ephemeralStorage size below it", "use instance types with more NVMe")
    return size


def nvme_label_floor(required_bytes: int) -> int:
    """N for the NodePool requirement `<domain>/instance-local-nvme Gt N`.

    The label is absent on types without NVMe, so any `Gt` excludes them; N is the required
    amount in whole GB, so a type whose NVMe could not hold the cache is excluded too. (The
    label is EC2's GB total; N in GB is also below the total when read as GiB.)
    """
    return max(0, math.ceil(required_bytes / GB) - 1)


def nvme_label_admits(instance: GpuInstance, floor: int) -> bool:
    """Whether a node of `instance` passes `instance-local-nvme Gt floor` whichever unit (GB,
    or GB converted to GiB) the node's label is in."""
    return min(instance.nvme_total_gb, math.floor(instance.nvme_total_bytes / GIB)) > floor


def gpu_count_label_floor(min_gpus: int) -> int:
    """N for `<domain>/instance-gpu-count Gt N`: nodes with at least `min_gpus` GPUs."""
    return max(0, min_gpus - 1)


@dataclass(frozen=True)
class PoolModel:
    """What the pool limit needs to know of one model on the pool."""

    instance: GpuInstance
    tensor_parallel_size: int
    replicas: int
    name: str = ""
    compile_cache: bool = False
    """Whether the model keeps a compile cache on the node's NVMe."""
    staged_bytes: int = 0
    """Bytes of weights the model stages on the node's NVMe (the node cache); 0: none."""
    min_replicas: int | None = None
    """The fewest replicas the model runs (an autoscaled model's minReplicas); None: `replicas`."""

    @property
    def fewest_replicas(self) -> int:
        return self.replicas if self.min_replicas is None else self.min_replicas


def nodes_for(m: PoolModel, pods: int) -> int:
    """Nodes of the model's type that hold `pods` of its pods (pods never span nodes)."""
    per_node = m.instance.gpu_count // m.tensor_parallel_size
    if per_node < 1:
        raise PoolError(f"tensorParallelSize={m.tensor_parallel_size} exceeds the "
                        f"{m.instance.gpu_count} GPUs of {m.instance.instance_type}",
                        "use a smaller tensorParallelSize or a larger instance type")
    return math.ceil(pods / per_node)


def packed_gpus(demand: Iterable[tuple[PoolModel, int]]) -> int:
    """GPUs of the whole nodes that hold every (model, pods) of a pool, pods of one instance type
    packed together: Karpenter counts `limits` against the capacity of the nodes it launched,
    whole nodes (https://karpenter.sh/docs/concepts/nodepools/#speclimits), and it launches nodes
    only for pods the scheduler cannot place on the nodes already there, whichever model they
    belong to. So 15 one-GPU pods of three models need two 8-GPU nodes (16 GPUs), not three.
    Pods of `tensorParallelSize` GPUs are packed first-fit decreasing; with sizes that divide the
    node's GPUs (warmstart's TPs are powers of two) that is the fewest nodes."""
    by_type: dict[str, tuple[int, list[int]]] = {}
    for m, pods in demand:
        if pods <= 0:
            continue
        nodes_for(m, pods)  # refuses a TP larger than the node
        gpus, sizes = by_type.setdefault(m.instance.instance_type, (m.instance.gpu_count, []))
        sizes.extend([m.tensor_parallel_size] * pods)
    total = 0
    for gpus, sizes in by_type.values():
        free: list[int] = []
        for size in sorted(sizes, reverse=True):
            for i, left in enumerate(free):
                if left >= size:
                    free[i] -= size
                    break
            else:
                free.append(gpus - size)
        total += len(free) * gpus
    return total


def gpus_needed(models: Iterable[PoolModel], surge: int = 0) -> int:
    """GPUs of the nodes the pool must launch for every model's replicas plus `surge` pods each,
    packed (`packed_gpus`)."""
    return packed_gpus((m, m.replicas + surge) for m in models)


def default_max_gpus(models: Sequence[PoolModel], instances: Sequence[GpuInstance]) -> int:
    """Default NodePool GPU limit: every model at its replicas plus one surging pod; a pool
    with no model may still launch one node of its largest type."""
    need = gpus_needed(models, SURGE_PODS)
    return max(need, max(i.gpu_count for i in instances))


def launch_nodes(instances: Sequence[GpuInstance], max_gpus: int) -> list[tuple[GpuInstance, int]]:
    """The nodes a pool may hold within its GPU limit that have the most vCPUs in all, per
    instance type: what a vCPU quota must allow for the pool.

    Karpenter (and Auto Mode, which runs it) keeps launching nodes of a NodePool until their
    GPUs reach its `limits` (https://karpenter.sh/docs/concepts/nodepools/#speclimits),
    whichever pods ask: the models of another stack on the pool (a platform's model stacks),
    a rollout's surge, the warm spares. So the limit, not what the inline models need, bounds
    the nodes. No node is launched past it: the scheduler drops every instance type whose
    capacity exceeds what the limit has left (kubernetes-sigs/karpenter
    pkg/controllers/provisioning/scheduling/scheduler.go `filterByRemainingResources`), so the
    nodes are whole ones within `max_gpus`. With several instance types the worst case is the
    mix of whole nodes within `max_gpus` GPUs with the most vCPUs (a g6e.16xlarge has 1 GPU
    and 64 vCPUs, a g6e.12xlarge 4 GPUs and 48): an unbounded knapsack, solved exactly over
    the GPU count."""
    types = sorted({i.instance_type: i for i in instances}.values(), key=lambda i: i.instance_type)
    limit = max(0, max_gpus)
    # most[g]: the most vCPUs of whole nodes with at most g GPUs; last[g]: the type of one of
    # those nodes (None: most[g] == most[g - 1]).
    most = [0] * (limit + 1)
    last: list[int | None] = [None] * (limit + 1)
    for g in range(1, limit + 1):
        most[g] = most[g - 1]
        for k, inst in enumerate(types):
            if 0 < inst.gpu_count <= g and most[g - inst.gpu_count] + inst.vcpu > most[g]:
                most[g], last[g] = most[g - inst.gpu_count] + inst.vcpu, k
    counts = [0] * len(types)
    g = limit
    while g > 0:
        k = last[g]
        if k is None:
            g -= 1
        else:
            counts[k] += 1
            g -= types[k].gpu_count
    return [(inst, n) for inst, n in zip(types, counts) if n]
