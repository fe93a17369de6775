"""What fits where: node allocatable as the EKS AMI computes it, and a deterministic bin-packer.

Pure and typed; no Pulumi. The planner composes a node group's load (`ADDON_DEMANDS`, its own
Deployments, Jobs and DaemonSets) and asks `pack()` / `nodes_needed()` whether it fits; an
unplaceable pod becomes a ConfigError whose text comes from `explain()`.

Allocatable per instance type (`allocatable()`), AL2023 nodeadm at
https://github.com/awslabs/amazon-eks-ami/tree/81fec2e895854f599974fe4d3d72f61c0a9aaffa/nodeadm/internal/kubelet :

- max pods: `default_max_enis * (ipv4_per_eni - 1) + 2` (`eni_max_pods.go`,
  `calculateStandardMaxPods`), ENI figures from that directory's `instance-info.jsonl`;
- kube-reserved CPU by ranges: 6% of the first core, 1% of the second, 0.5% of cores 3-4,
  0.25% of the rest, each range truncated to whole millicores (`config.go`,
  `getCPUMillicoresToReserve`, `cpuPercentageReservedForRanges := []int{600, 100, 50, 25}` in
  1/10000, `getResourceToReserveInRange`);
- kube-reserved memory `11 * maxPods + 255` MiB (`config.go`, `getMemoryMebibytesToReserve`);
- eviction hard `memory.available: 100Mi` (`config.go`, the default `EvictionHard`).

The node's memory *capacity* is less than EC2's figure (firmware, kernel). Before a node exists it
can only be estimated; this module uses Karpenter's documented estimate, `VM_MEMORY_OVERHEAD_PERCENT`
default 0.075 (https://karpenter.sh/docs/reference/settings/), subtracted as
`ceil(ec2_mib * 0.075)`. With it, every row of both instance tables gives exactly the CPU, memory
and pods Karpenter publishes for AL2023
(https://github.com/aws/karpenter-provider-aws/blob/1d927085dd81a9df9301e613f371dac5b4d16bfe/website/content/en/v1.14/reference/instance-types.md),
e.g. m7i.large: 1930m CPU, 6903Mi, 29 pods.

The packer models what kube-scheduler enforces as hard constraints: requests (CPU, memory), the
kubelet's max pods (every pod counts, daemons included), required pod anti-affinity on hostname
(`PodDemand.max_per_node`) and hostname topology spread with `maxSkew: 1, whenUnsatisfiable:
DoNotSchedule` (`PodDemand.spread`, modelled as at most `ceil(pods in the group / nodes)` per node;
kube-scheduler's rule, count on the node minus the least on any node of the group at most 1, is
stricter when some node has no room for the group at all). Preferred (soft) rules are not
constraints and are not modelled. Because a spread group's cap falls as nodes are added, more
nodes can leave more of a spread group unplaced; without spread groups they never do.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from functools import cache
from importlib import resources
from typing import Any

# --- Instance tables --------------------------------------------------------------------------

# Karpenter's default VM memory overhead estimate (https://karpenter.sh/docs/reference/settings/,
# `VM_MEMORY_OVERHEAD_PERCENT`, "default = 0.075").
VM_MEMORY_OVERHEAD_FRACTION = Decimal("0.075")
# nodeadm `config.go` default kubelet config: `EvictionHard: {"memory.available": "100Mi", ...}`.
EVICTION_HARD_MEMORY_MIB = 100
# nodeadm `config.go` `getCPUMillicoresToReserve`: range bounds in millicores and the share of each
# range reserved, in 1/10000.
_CPU_RANGE_BOUNDS_MILLIS = (0, 1000, 2000, 4000)
_CPU_RANGE_RESERVED_PER_10000 = (600, 100, 50, 25)


@dataclass(frozen=True)
class NodeType:
    """One EC2 instance type as the capacity model needs it."""

    instance_type: str
    vcpu: int
    memory_gib: int
    default_max_enis: int
    ipv4_per_eni: int


@dataclass(frozen=True)
class Allocatable:
    """What the kubelet offers pods on one node: CPU in millicores, memory in MiB, pod slots."""

    cpu_millis: int
    memory_mib: int
    pods: int


@cache
def node_types() -> dict[str, NodeType]:
    """Every instance type the model knows: the non-GPU types of `node_instances.csv` and the GPU
    types of `gpu_instances.csv` (vCPU, memory) joined with `gpu_instance_enis.csv` (ENIs)."""
    data = resources.files("warmstart.data")
    out: dict[str, NodeType] = {}
    for r in csv.DictReader(data.joinpath("node_instances.csv").read_text().splitlines()):
        out[r["instance_type"]] = NodeType(r["instance_type"], int(r["vcpu"]), int(r["memory_gib"]),
                                           int(r["default_max_enis"]), int(r["ipv4_per_eni"]))
    gpu = {r["instance_type"]: r for r in csv.DictReader(data.joinpath("gpu_instances.csv").read_text().splitlines())}
    for r in csv.DictReader(data.joinpath("gpu_instance_enis.csv").read_text().splitlines()):
        g = gpu[r["instance_type"]]
        out[r["instance_type"]] = NodeType(r["instance_type"], int(g["vcpu"]), int(g["memory_gib"]),
                                           int(r["default_max_enis"]), int(r["ipv4_per_eni"]))
    return out


def node_type(instance_type: str) -> NodeType:
    """The table row of one instance type; ValueError naming the type and the known ones."""
    try:
        return node_types()[instance_type]
    except KeyError:
        raise ValueError(
            f"unknown instance type {instance_type!r} for the capacity model: the tables "
            f"(warmstart/data/node_instances.csv, gpu_instance_enis.csv) list only "
            f"{', '.join(sorted(node_types()))}") from None


def max_pods(nt: NodeType) -> int:
    """nodeadm `calculateStandardMaxPods`: ENIs on the default card x (IPv4 per ENI - 1) + 2."""
    return nt.default_max_enis * (nt.ipv4_per_eni - 1) + 2


def kube_reserved_cpu_millis(vcpu: int) -> int:
    """nodeadm `getCPUMillicoresToReserve`: each range's share, truncated per range."""
    total = vcpu * 1000
    bounds = (*_CPU_RANGE_BOUNDS_MILLIS, total)
    reserved = 0
    for i, share in enumerate(_CPU_RANGE_RESERVED_PER_10000):
        start, end = bounds[i], bounds[i + 1]
        if total > start:
            reserved += (min(total, end) - start) * share // 10000
    return reserved


def kube_reserved_memory_mib(pods: int) -> int:
    """nodeadm `getMemoryMebibytesToReserve`: 11 MiB per pod slot plus 255 MiB."""
    return 11 * pods + 255


def node_memory_mib(memory_gib: int) -> int:
    """Estimated node memory capacity: EC2's MiB less Karpenter's VM overhead estimate (rounded up)."""
    ec2_mib = memory_gib * 1024
    overhead = int((ec2_mib * VM_MEMORY_OVERHEAD_FRACTION).to_integral_value(rounding=ROUND_CEILING))
    return ec2_mib - overhead


def managed_node_group_max_pods(vcpu: int) -> int:
    """The ceiling EKS managed node groups put on max pods: 110 below 30 vCPUs, else 250
    (https://docs.aws.amazon.com/eks/latest/userguide/create-managed-node-group.html)."""
    return 110 if vcpu < 30 else 250


def allocatable(instance_type: str, *, managed: bool = False) -> Allocatable:
    """Node allocatable of `instance_type` on an AL2023 EKS node (see the module docstring).

    `managed`: the node belongs to an EKS managed node group, whose max pods EKS caps
    (`managed_node_group_max_pods`; of the system types only the 4xlarge sizes, 234 -> 110). The
    kube-reserved memory stays the one nodeadm computes from the ENI figure: nodeadm derives it
    before a NodeConfig's kubelet settings override `maxPods` (`config.go`,
    `withDefaultReservedResources` then the `40-nodeadm.conf` drop-in), and the larger reservation
    is the conservative reading should EKS pass its own."""
    nt = node_type(instance_type)
    pods = max_pods(nt)
    return allocatable_of(nt.vcpu, nt.memory_gib, pods, managed=managed)


# nodeadm's max pods when it has no ENI figures for the type (kubelet's own default), as
# `withDefaultReservedResources` falls back to (`eni_max_pods.go`, `defaultMaxPods`).
DEFAULT_MAX_PODS = 110


def allocatable_of(vcpu: int, memory_gib: int, pods: int = DEFAULT_MAX_PODS, *, managed: bool = False) -> Allocatable:
    """Node allocatable from the figures themselves (a type the tables do not list gets nodeadm's
    fallback max pods)."""
    return Allocatable(
        cpu_millis=vcpu * 1000 - kube_reserved_cpu_millis(vcpu),
        memory_mib=node_memory_mib(memory_gib) - kube_reserved_memory_mib(pods) - EVICTION_HARD_MEMORY_MIB,
        pods=min(pods, managed_node_group_max_pods(vcpu)) if managed else pods,
    )


# --- Kubernetes quantities ---------------------------------------------------------------------
# https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/

_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)([a-zA-Z]*)$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
            "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
            "P": Decimal("1e15"), "E": Decimal("1e18")}


def _quantity(value: str | int | float, what: str) -> Decimal:
    """A Kubernetes quantity's value in base units (cores, bytes)."""
    if isinstance(value, bool):
        raise ValueError(f"{what} quantity {value!r} is not a number")
    if isinstance(value, int | float):
        number = Decimal(str(value))
    else:
        m = _QUANTITY.match(value.strip())
        suffix = m.group(2) if m else None
        if m is None or (suffix not in _BINARY and suffix not in _DECIMAL):
            raise ValueError(f"{what} quantity {value!r} is not a Kubernetes quantity "
                             "(a number with an optional suffix m, k, M, G, Ki, Mi, Gi, ...)")
        try:
            number = Decimal(m.group(1)) * (_BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix])
        except InvalidOperation:
            raise ValueError(f"{what} quantity {value!r} is not a number") from None
    if number < 0:
        raise ValueError(f"{what} quantity {value!r} is negative")
    return number


def _ceil(d: Decimal) -> int:
    return int(d.to_integral_value(rounding=ROUND_CEILING))


def parse_cpu(value: str | int | float) -> int:
    """CPU quantity to millicores, rounded up as the API server does (`"500m"` -> 500,
    `"1"` -> 1000, `"1.5"` -> 1500, `0.1` -> 100)."""
    return _ceil(_quantity(value, "CPU") * 1000)


def parse_memory(value: str | int | float) -> int:
    """Memory quantity to MiB, rounded up (`"512Mi"` -> 512, `"1Gi"` -> 1024, `"100M"` -> 96,
    a bare number is bytes)."""
    return _ceil(_quantity(value, "memory") / 2**20)


def _container_requests(container: Mapping[str, Any]) -> tuple[int, int]:
    requests = (container.get("resources") or {}).get("requests") or {}
    return parse_cpu(requests.get("cpu", 0)), parse_memory(requests.get("memory", 0))


def pod_requests(spec: Mapping[str, Any]) -> tuple[int, int]:
    """A PodSpec's effective requests (CPU millicores, MiB) as the scheduler counts them
    (https://kubernetes.io/docs/concepts/workloads/pods/init-containers/#resource-sharing-within-containers):
    per resource, the larger of the app containers' sum (plus sidecars, init containers with
    `restartPolicy: Always`) and each regular init container's request plus the sidecars started
    before it. Only requests count; a container without one asks for 0."""
    cpu_sidecars = mem_sidecars = 0
    cpu_init = mem_init = 0
    for c in spec.get("initContainers") or []:
        cpu, mem = _container_requests(c)
        if c.get("restartPolicy") == "Always":
            cpu_sidecars += cpu
            mem_sidecars += mem
        else:
            cpu_init = max(cpu_init, cpu + cpu_sidecars)
            mem_init = max(mem_init, mem + mem_sidecars)
    cpu_app = mem_app = 0
    for c in spec.get("containers") or []:
        cpu, mem = _container_requests(c)
        cpu_app += cpu
        mem_app += mem
    return max(cpu_app + cpu_sidecars, cpu_init), max(mem_app + mem_sidecars, mem_init)


# --- Demands -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodDemand:
    """`count` identical pods (a Deployment's replicas, a Job's pods) with their requests.

    `spread`: a group key; pods sharing it are spread over hostnames with `maxSkew: 1,
    whenUnsatisfiable: DoNotSchedule`, modelled as at most ceil(pods in the group / nodes) per
    node. `max_per_node`: required pod anti-affinity on `kubernetes.io/hostname` among this
    demand's own pods (1: never two on a node)."""

    name: str
    cpu_millis: int
    memory_mib: int
    count: int = 1
    spread: str | None = None
    max_per_node: int | None = None

    def __post_init__(self) -> None:
        if self.cpu_millis < 0 or self.memory_mib < 0 or self.count < 0:
            raise ValueError(f"pod demand {self.name!r}: requests and count must not be negative")
        if self.max_per_node is not None and self.max_per_node < 1:
            raise ValueError(f"pod demand {self.name!r}: max_per_node must be at least 1")


@dataclass(frozen=True)
class DaemonDemand:
    """One pod per node (a DaemonSet), taken off every node before any other pod."""

    name: str
    cpu_millis: int
    memory_mib: int

    def __post_init__(self) -> None:
        if self.cpu_millis < 0 or self.memory_mib < 0:
            raise ValueError(f"daemon demand {self.name!r}: requests must not be negative")


@dataclass(frozen=True)
class NodeGroup:
    """A fixed-size group of identical nodes; `managed`: an EKS managed node group (the
    Karpenter-mode system group), whose max pods EKS caps (see `allocatable`)."""

    name: str
    instance_type: str
    nodes: int
    managed: bool = False


# --- Packing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeFree:
    """What is left on one node after packing."""

    cpu_millis: int
    memory_mib: int
    pods: int


@dataclass(frozen=True)
class PackResult:
    """The outcome of `pack()`.

    `placed`: node index (0 .. nodes-1, every node present) -> the pod instances on it, daemons
    first (daemon instances are named `daemon@<index>`, pods `name#<n>` counting from 1).
    `unplaced`: pod instances that fit nowhere, in packing order. `free`: per node, what is left.
    """

    group: NodeGroup
    allocatable: Allocatable
    placed: dict[int, list[str]]
    unplaced: list[str]
    free: list[NodeFree]
    requested_cpu_millis: int = 0
    """Everything asked for: daemons on every node plus every pod instance."""
    requested_memory_mib: int = 0
    requested_pods: int = 0
    demands: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Pod instance name -> (CPU millicores, MiB) requested, for the explanation."""

    @property
    def fits(self) -> bool:
        return not self.unplaced


def _instances(pods: Sequence[PodDemand]) -> list[tuple[PodDemand, str]]:
    names = [p.name for p in pods]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"pod demands must have distinct names; repeated: {', '.join(duplicates)}")
    out = [(p, f"{p.name}#{i}") for p in pods for i in range(1, p.count + 1)]
    # First-fit decreasing: biggest CPU first, then memory, ties by name (then instance number).
    out.sort(key=lambda pi: (-pi[0].cpu_millis, -pi[0].memory_mib, pi[0].name, int(pi[1].rsplit("#", 1)[1])))
    return out


def pack(group: NodeGroup, daemons: Sequence[DaemonDemand], pods: Sequence[PodDemand]) -> PackResult:
    """Place `daemons` on every node, then `pods` first-fit decreasing onto `group`'s nodes.

    Deterministic: pods in order of CPU, then memory (both descending), then name; each onto the
    lowest-numbered node with room for its CPU, memory and a pod slot that its `max_per_node`
    and `spread` group allow."""
    if group.nodes < 0:
        raise ValueError(f"node group {group.name!r}: nodes must not be negative, got {group.nodes}")
    alloc = allocatable(group.instance_type, managed=group.managed)
    n = group.nodes
    cpu = [alloc.cpu_millis] * n
    mem = [alloc.memory_mib] * n
    slots = [alloc.pods] * n
    placed: dict[int, list[str]] = {i: [] for i in range(n)}
    unplaced: list[str] = []
    demands: dict[str, tuple[int, int]] = {}

    for d in daemons:
        for i in range(n):
            name = f"{d.name}@{i}"
            demands[name] = (d.cpu_millis, d.memory_mib)
            if d.cpu_millis <= cpu[i] and d.memory_mib <= mem[i] and slots[i] >= 1:
                cpu[i] -= d.cpu_millis
                mem[i] -= d.memory_mib
                slots[i] -= 1
                placed[i].append(name)
            else:
                unplaced.append(name)

    group_sizes: dict[str, int] = {}
    for p in pods:
        if p.spread is not None:
            group_sizes[p.spread] = group_sizes.get(p.spread, 0) + p.count
    per_demand = [dict.fromkeys((p.name for p in pods), 0) for _ in range(n)]
    per_group = [dict.fromkeys(group_sizes, 0) for _ in range(n)]

    for p, name in _instances(pods):
        demands[name] = (p.cpu_millis, p.memory_mib)
        for i in range(n):
            if p.cpu_millis > cpu[i] or p.memory_mib > mem[i] or slots[i] < 1:
                continue
            if p.max_per_node is not None and per_demand[i][p.name] >= p.max_per_node:
                continue
            if p.spread is not None and per_group[i][p.spread] >= math.ceil(group_sizes[p.spread] / n):
                continue
            cpu[i] -= p.cpu_millis
            mem[i] -= p.memory_mib
            slots[i] -= 1
            per_demand[i][p.name] += 1
            if p.spread is not None:
                per_group[i][p.spread] += 1
            placed[i].append(name)
            break
        else:
            unplaced.append(name)

    return PackResult(
        group=group, allocatable=alloc, placed=placed, unplaced=unplaced,
        free=[NodeFree(cpu[i], mem[i], slots[i]) for i in range(n)],
        requested_cpu_millis=n * sum(d.cpu_millis for d in daemons) + sum(p.cpu_millis * p.count for p in pods),
        requested_memory_mib=n * sum(d.memory_mib for d in daemons) + sum(p.memory_mib * p.count for p in pods),
        requested_pods=n * len(daemons) + sum(p.count for p in pods),
        demands=demands,
    )


def nodes_needed(instance_type: str, daemons: Sequence[DaemonDemand], pods: Sequence[PodDemand], *,
                 minimum: int, limit: int = 20, managed: bool = False) -> int | None:
    """The smallest node count in [minimum, limit] at which `pack()` leaves nothing unplaced, or
    None if even `limit` nodes do not hold it (a pod bigger than one node never fits)."""
    if minimum < 1:
        raise ValueError(f"minimum node count must be at least 1, got {minimum}")
    for n in range(minimum, limit + 1):
        if pack(NodeGroup("probe", instance_type, n, managed), daemons, pods).fits:
            return n
    return None


def _cpu(millis: int) -> str:
    return f"{millis}m"


def explain(result: PackResult, group: NodeGroup) -> str:
    """One line for a ConfigError: what did not fit, where, and the numbers."""
    alloc = result.allocatable
    head = (f"node group {group.name!r} ({group.nodes} x {group.instance_type}, allocatable per node "
            f"{_cpu(alloc.cpu_millis)} CPU, {alloc.memory_mib}Mi memory, {alloc.pods} pods)")
    totals = (f"requested {_cpu(result.requested_cpu_millis)} CPU, {result.requested_memory_mib}Mi memory, "
              f"{result.requested_pods} pods against {_cpu(group.nodes * alloc.cpu_millis)} CPU, "
              f"{group.nodes * alloc.memory_mib}Mi memory, {group.nodes * alloc.pods} pods in all")
    if result.fits:
        return f"{head}: every pod fits; {totals}"
    missing = ", ".join(f"{name} ({_cpu(result.demands[name][0])} CPU, {result.demands[name][1]}Mi)"
                        for name in result.unplaced)
    largest = (f"the most free on one node is {_cpu(max((f.cpu_millis for f in result.free), default=0))} CPU, "
               f"{max((f.memory_mib for f in result.free), default=0)}Mi memory, "
               f"{max((f.pods for f in result.free), default=0)} pods")
    return f"{head} cannot place {missing}: {totals}; {largest}"


# --- Published requests of what runs on the nodes ----------------------------------------------
# Each figure with its public source. "Unverified" marks a figure that no EKS-published manifest
# confirmed; the value then is the conservative (larger) one.

# kube-proxy, EKS add-on DaemonSet: cpu 100m, no memory request. UNVERIFIED: EKS publishes no
# manifest of the add-on and none was found to confirm the figure; 100m is the figure warmstart was
# given for the add-on and the larger of the values in circulation. The upstream DaemonSet leaves
# it to a template
# (https://github.com/kubernetes/kubernetes/blob/4a0608cb77f6a53af41cb4a453af104a4d4a0610/cluster/addons/kube-proxy/kube-proxy-ds.yaml).
KUBE_PROXY = DaemonDemand("kube-proxy", cpu_millis=100, memory_mib=0)

# aws-node, the VPC CNI DaemonSet (the EKS add-on is built from this manifest), with the network
# policy agent warmstart turns on: containers `aws-node` cpu 25m and `aws-eks-nodeagent` cpu 25m
# (init container `aws-vpc-cni-init` 25m, less than the sum), no memory requests:
# https://github.com/aws/amazon-vpc-cni-k8s/blob/b52188387f2e2f10bf289ace929d6a63b176a4fa/config/master/aws-k8s-cni.yaml
# (v1.23.1). Verified.
AWS_NODE = DaemonDemand("aws-node", cpu_millis=25 + 25, memory_mib=0)

# CoreDNS, EKS add-on: 2 replicas (https://docs.aws.amazon.com/eks/latest/userguide/managing-coredns.html,
# "two replicas of the CoreDNS image are deployed by default"), requests cpu 100m / memory 70Mi, pod
# anti-affinity on hostname *preferred* (weight 100) and zone spread `ScheduleAnyway`: both soft, so
# no constraint here. Verified against eksctl's copy of the Deployment EKS installs for Kubernetes
# 1.34 (eks/coredns:v1.13.2-eksbuild.1):
# https://github.com/eksctl-io/eksctl/blob/be29848c93d1b82493b7a3d392a09412817bb39b/pkg/addons/default/assets/coredns-1.34.json
# (the same requests as upstream's manifest,
# https://github.com/kubernetes/kubernetes/blob/eac438fcd83c5e36cb4ad91fd3ad7364fb0a2dff/cluster/addons/dns/coredns/coredns.yaml.base).
COREDNS = PodDemand("coredns", cpu_millis=100, memory_mib=70, count=2)

# Karpenter controller: warmstart's own requests (warmstart/decisions/karpenter.py
# CONTROLLER_RESOURCES, 1 CPU / 1Gi) and replicas (2); the chart's required pod anti-affinity on
# hostname keeps the two apart
# (https://github.com/aws/karpenter-provider-aws/blob/v1.14.1/charts/karpenter/values.yaml `affinity`).
KARPENTER_CONTROLLER = PodDemand("karpenter", cpu_millis=1000, memory_mib=1024, count=2, max_per_node=1)

# KEDA (kedacore/charts v2.20.2): operator, metrics API server and admission webhooks, one pod each,
# at warmstart's KEDA_RESOURCES requests (warmstart/manifests/autoscaling.py: 100m / 100Mi, the
# chart's defaults, https://github.com/kedacore/charts/blob/v2.20.2/keda/values.yaml `resources`).
KEDA_OPERATOR = PodDemand("keda-operator", cpu_millis=100, memory_mib=100)
KEDA_METRICS_APISERVER = PodDemand("keda-operator-metrics-apiserver", cpu_millis=100, memory_mib=100)
KEDA_ADMISSION_WEBHOOKS = PodDemand("keda-admission-webhooks", cpu_millis=100, memory_mib=100)

# node-feature-discovery v0.19.0 chart (warmstart runs master and gc only): nfd-master requests
# cpu 100m / memory 128Mi, nfd-gc cpu 10m / memory 128Mi, one replica each:
# https://github.com/kubernetes-sigs/node-feature-discovery/blob/v0.19.0/deployment/helm/node-feature-discovery/values.yaml
# (`master.resources`, `gc.resources`, `replicaCount`). Verified.
NFD_MASTER = PodDemand("nfd-master", cpu_millis=100, memory_mib=128)
NFD_GC = PodDemand("nfd-gc", cpu_millis=10, memory_mib=128)

# Not installed by warmstart (components/cluster.py creates no eks-pod-identity-agent add-on), so
# not listed.

# The add-ons by name, for the planner to compose a node group's load.
ADDON_DEMANDS: dict[str, DaemonDemand | PodDemand] = {
    d.name: d for d in (KUBE_PROXY, AWS_NODE, COREDNS, KARPENTER_CONTROLLER, KEDA_OPERATOR,
                        KEDA_METRICS_APISERVER, KEDA_ADMISSION_WEBHOOKS, NFD_MASTER, NFD_GC)
}
# Every node of an EKS cluster in Karpenter mode runs these two.
NODE_DAEMONS: tuple[DaemonDemand, ...] = (KUBE_PROXY, AWS_NODE)
KEDA_PODS: tuple[PodDemand, ...] = (KEDA_OPERATOR, KEDA_METRICS_APISERVER, KEDA_ADMISSION_WEBHOOKS)
NFD_PODS: tuple[PodDemand, ...] = (NFD_MASTER, NFD_GC)
