"""A whole cluster as the scheduler and the node autoscalers see it: the nodes a platform has
(its NodePools with their requirements, labels and taints, its managed node group, Auto Mode's
built-in pools, or, on a cluster warmstart did not create, what its PlatformArgs say), the pods
of the platform and of every model stack on it, whether each pod can be scheduled on some node
(`unschedulable`), and whether they fit at once (`misfits`).

Scheduling as kube-scheduler decides it
(https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/,
https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/): every
`nodeSelector` label, one of the required node affinity's terms (its expressions ANDed), and a
toleration for every NoSchedule/NoExecute taint. A node a NodePool launches carries the pool's
name, its requirements' labels, its template labels and taints, and the instance's well-known
labels (https://karpenter.sh/v1.14/concepts/scheduling/#well-known-labels; GPU count only on GPU
instances). Fit: a fixed node group holds all its pods at once (node_fit.pack); an elastic pool
holds each pod on one node of its types and all of them within its `limits`, counted as whole
nodes of its largest type (https://karpenter.sh/v1.14/concepts/nodepools/#speclimits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from warmstart.decisions import cpu_pool, instances, node_fit, placement

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
RELEASE = "kubernetes:helm.sh/v3:Release"
WORKLOADS = ("Deployment", "DaemonSet", "Job", "StatefulSet")
# Auto Mode's built-in `system` pool is tainted for critical add-ons only
# (https://docs.aws.amazon.com/eks/latest/userguide/set-builtin-node-pools.html).
CRITICAL_ADDONS_TAINT = {"key": "CriticalAddonsOnly", "effect": "NoSchedule"}


@dataclass
class NodeKind:
    """Nodes of one kind: their labels (a set of the values one may have, None: some value),
    taints, the group they belong to and its elasticity."""

    name: str
    group: str
    labels: dict[str, frozenset[str] | None]
    taints: list[dict[str, Any]] = field(default_factory=list)
    instance_type: str | None = None
    """None: unknown (a node of a cluster warmstart did not create), or Auto Mode's largest."""
    fixed_nodes: int | None = None
    """A managed node group's size; None: elastic."""
    limits: Mapping[str, str] = field(default_factory=dict)
    managed: bool = False


@dataclass
class Pod:
    kind: str
    name: str
    spec: Mapping[str, Any]
    """nodeSelector, affinity, tolerations."""
    cpu_millis: int
    memory_mib: int
    gpus: int = 0
    count: int = 1
    spread: str | None = None
    max_per_node: int | None = None


# --- Nodes ------------------------------------------------------------------------------------


def _requirement_labels(reqs: Sequence[Mapping[str, Any]]) -> dict[str, frozenset[str] | None]:
    out: dict[str, frozenset[str] | None] = {}
    for r in reqs:
        if r["operator"] == "In":
            out[r["key"]] = frozenset(r["values"])
        elif r["operator"] in ("Exists", "Gt", "Gte", "Lt", "Lte"):
            out[r["key"]] = None
    return out


def _instance_labels(mode: str, instance_type: str) -> dict[str, frozenset[str] | None]:
    out: dict[str, frozenset[str] | None] = {placement.INSTANCE_TYPE_LABEL: frozenset([instance_type]),
                                             "kubernetes.io/os": frozenset(["linux"])}
    if instance_type in instances.catalog():
        gpu = instances.lookup(instance_type)
        out[placement.gpu_count_label(mode)] = frozenset([str(gpu.gpu_count)])  # type: ignore[arg-type]
        if gpu.nvme_total_gb:
            out[placement.local_nvme_label(mode)] = frozenset([str(gpu.nvme_total_gb)])  # type: ignore[arg-type]
    return out


def nodepool_kinds(mode: str, pool: Mapping[str, Any]) -> list[NodeKind]:
    tpl = pool["spec"]["template"]
    reqs = tpl["spec"]["requirements"]
    base = _requirement_labels(reqs)
    base |= {k: frozenset([v]) for k, v in ((tpl.get("metadata") or {}).get("labels") or {}).items()}
    name = pool["metadata"]["name"]
    base[placement.NODEPOOL_LABEL] = frozenset([name])
    if mode == "auto":
        base["eks.amazonaws.com/compute-type"] = frozenset(["auto"])
    types = next((r["values"] for r in reqs if r["key"] == placement.INSTANCE_TYPE_LABEL and r["operator"] == "In"), [])
    return [NodeKind(f"NodePool {name} ({t})", f"pool:{name}", base | _instance_labels(mode, t),
                     list(tpl["spec"].get("taints") or []), t, limits=pool["spec"].get("limits") or {})
            for t in types]


def _taint(t: Mapping[str, Any]) -> dict[str, Any]:
    """A managed node group's taint (EKS API effects NO_SCHEDULE, ...) as Kubernetes writes it."""
    effect = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
    return {"key": t["key"], **({"value": t["value"]} if t.get("value") else {}),
            "effect": effect.get(t["effect"], t["effect"])}


def node_group_kinds(resources: Sequence[Any]) -> list[NodeKind]:
    out = []
    for g in [r for r in resources if r.typ == NODE_GROUP]:
        labels = {k: frozenset([v]) for k, v in (g.inputs.get("labels") or {}).items()}
        for t in g.inputs["instanceTypes"]:
            out.append(NodeKind(f"node group {g.inputs.get('nodeGroupName', g.name)} ({t})", "system",
                                labels | _instance_labels("karpenter", t), [_taint(x) for x in g.inputs.get("taints") or []],
                                t, fixed_nodes=g.inputs["scalingConfig"]["desiredSize"], managed=True))
    return out


def auto_mode_builtin_kinds() -> list[NodeKind]:
    common = {"eks.amazonaws.com/compute-type": frozenset(["auto"]), "kubernetes.io/os": frozenset(["linux"]),
              placement.INSTANCE_TYPE_LABEL: None}
    return [NodeKind("Auto Mode general-purpose", f"pool:{placement.GENERAL_PURPOSE_POOL}",
                     common | {placement.NODEPOOL_LABEL: frozenset([placement.GENERAL_PURPOSE_POOL])}),
            NodeKind("Auto Mode system", "pool:system", common | {placement.NODEPOOL_LABEL: frozenset(["system"])},
                     [CRITICAL_ADDONS_TAINT])]


def platform_args_kinds(args: Mapping[str, Any]) -> list[NodeKind]:
    """What a PlatformArgs says a cluster warmstart did not create has: its GPU pools (tainted as
    warmstart's are, the stricter reading), and its non-GPU nodes (`non_gpu_placement`'s labels,
    with the taints its tolerations name; none given: plain untainted nodes)."""
    mode = str(getattr(args["cluster_mode"], "value", args["cluster_mode"]))
    out = []
    for p in args["pools"]:
        for t in p["instance_types"]:
            out.append(NodeKind(f"pool {p['name']} ({t})", f"pool:{p['name']}", {
                placement.NODEPOOL_LABEL: frozenset([p["name"]])} | _instance_labels(mode, t),
                [{"key": placement.GPU_TAINT_KEY, "effect": placement.GPU_TAINT_EFFECT}], t,
                limits={placement.GPU_RESOURCE: str(p["max_gpus"])} if p.get("max_gpus") else {}))
    given = args.get("non_gpu_placement") or {}
    labels = {k: frozenset([v]) for k, v in (given.get("node_selector") or {}).items()}
    taints = [{"key": t["key"], **({"value": t["value"]} if t.get("value") else {}), "effect": t.get("effect") or "NoSchedule"}
              for t in given.get("tolerations") or [] if t.get("key")]
    out.append(NodeKind("the cluster's non-GPU nodes", "foreign", labels | {"kubernetes.io/os": frozenset(["linux"])}, taints))
    return out


# --- Matching ---------------------------------------------------------------------------------


def _expression_ok(e: Mapping[str, Any], node: NodeKind) -> bool:
    k, op, values = e["key"], e["operator"], set(e.get("values") or [])
    have = node.labels.get(k, frozenset()) if k in node.labels else None
    present = k in node.labels
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op == "In":
        return present and (have is None or bool(set(have) & values))
    if op == "NotIn":
        return not present or have is None or bool(set(have) - values)
    if op in ("Gt", "Lt"):
        (n,) = values
        return present and (have is None or any((int(v) > int(n)) if op == "Gt" else (int(v) < int(n)) for v in have))
    raise ValueError(f"unknown operator {op}")


def _tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if t.get("operator") == "Exists" and not t.get("key"):
            return True
        if t.get("key") != taint["key"]:
            continue
        if t.get("operator") == "Exists" or t.get("value") == taint.get("value"):
            return True
    return False


def why_not(pod: Pod, node: NodeKind) -> str:
    """'' when the pod can be scheduled on a node of this kind, else the first reason."""
    for k, v in (pod.spec.get("nodeSelector") or {}).items():
        if k not in node.labels or (node.labels[k] is not None and v not in node.labels[k]):  # type: ignore[operator]
            return f"nodeSelector {k}={v}"
    required = (((pod.spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")
    if required and not any(all(_expression_ok(e, node) for e in term.get("matchExpressions") or [])
                            for term in required):
        return "required node affinity"
    for taint in node.taints:
        if taint["effect"] in ("NoSchedule", "NoExecute") and not _tolerates(pod.spec.get("tolerations") or [], taint):
            return f"taint {taint['key']}:{taint['effect']}"
    if pod.gpus and node.instance_type is not None and node.instance_type in instances.catalog() \
            and pod.gpus > instances.lookup(node.instance_type).gpu_count:
        return f"{pod.gpus} GPUs"
    if pod.gpus and (node.instance_type is None or node.instance_type not in instances.catalog()):
        return "no GPUs"
    return ""


# --- Pods -------------------------------------------------------------------------------------


def _gpus(spec: Mapping[str, Any]) -> int:
    return sum(int((c.get("resources") or {}).get("requests", {}).get(placement.GPU_RESOURCE, 0))
               for c in spec.get("containers") or [])


def object_pods(objects: Sequence[Mapping[str, Any]]) -> list[Pod]:
    out = []
    for o in objects:
        kind, spec = o["kind"], o.get("spec", {})
        if kind not in WORKLOADS:
            continue
        count = 1
        if kind == "Deployment":
            surge = spec.get("strategy", {}).get("rollingUpdate", {}).get("maxSurge", 1)
            count = spec.get("replicas", 1) + (surge if isinstance(surge, int) else 1)
        pod = spec["template"]["spec"]
        cpu, mem = node_fit.pod_requests(pod)
        name = f"{o['metadata'].get('namespace', 'default')}/{o['metadata']['name']}"
        spread = name if any(c.get("whenUnsatisfiable") == "DoNotSchedule" and c.get("topologyKey") == "kubernetes.io/hostname"
                             for c in pod.get("topologySpreadConstraints") or []) else None
        out.append(Pod(kind, name, pod, cpu, mem, _gpus(pod), count, spread))
    return out


def release_pods(resources: Sequence[Any]) -> list[Pod]:
    """The Helm releases' pods with the requests, selectors and tolerations warmstart's values
    give them, and each chart's own scheduling defaults."""
    out = []
    for rel in [r for r in resources if r.typ == RELEASE]:
        values, name = rel.inputs.get("values") or {}, rel.inputs.get("name") or rel.name
        if name == "karpenter":
            req = values["controller"]["resources"]["requests"]
            # The chart's defaults: `karpenter.sh/nodepool DoesNotExist`, CriticalAddonsOnly tolerated
            # (https://github.com/aws/karpenter-provider-aws/blob/v1.14.1/charts/karpenter/values.yaml).
            spec = {"nodeSelector": values.get("nodeSelector") or {}, "tolerations": [
                {"key": "CriticalAddonsOnly", "operator": "Exists"}], "affinity": {"nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": placement.NODEPOOL_LABEL, "operator": "DoesNotExist"}]}]}}}}
            out.append(Pod("Release", "karpenter", spec, node_fit.parse_cpu(req["cpu"]), node_fit.parse_memory(req["memory"]),
                           count=values["replicas"], max_per_node=1))
        elif name == "keda":
            spec = {k: values[k] for k in ("nodeSelector", "tolerations", "affinity") if values.get(k)}
            for part in ("operator", "metricServer", "webhooks"):
                req = values["resources"][part]["requests"]
                out.append(Pod("Release", f"keda-{part}", spec, node_fit.parse_cpu(req["cpu"]),
                               node_fit.parse_memory(req["memory"])))
        elif name == "node-feature-discovery":
            for part, demand in (("master", node_fit.NFD_MASTER), ("gc", node_fit.NFD_GC)):
                spec = {k: values[part][k] for k in ("nodeSelector", "tolerations", "affinity") if values[part].get(k)}
                out.append(Pod("Release", f"nfd-{part}", spec, demand.cpu_millis, demand.memory_mib))
        elif name == "nvidia-device-plugin":
            # The chart's default affinity (its "force a GPU deployment" term) and GPU toleration.
            spec = {"tolerations": [{"key": placement.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [
                            {"key": placement.NVIDIA_GPU_PRESENT_LABEL, "operator": "In", "values": ["true"]}]}]}}}}
            out.append(Pod("DaemonSet", "nvidia-device-plugin", spec, 0, 0))
    return out


# --- The cluster ------------------------------------------------------------------------------


@dataclass
class ClusterView:
    """One cluster: its nodes and every pod on it (the platform's and its model stacks')."""

    name: str
    nodes: list[NodeKind]
    pods: list[Pod]

    def where(self, pod: Pod) -> list[NodeKind]:
        return [n for n in self.nodes if not why_not(pod, n)]


def view(name: str, mode: str, resources: Sequence[Any], objects: Sequence[Mapping[str, Any]],
         platform_args: Mapping[str, Any] | None = None) -> ClusterView:
    """A cluster from the cloud resources and Kubernetes objects of its platform and model stacks
    (`platform_args`: a cluster warmstart did not create, as a program describes it)."""
    if platform_args is not None:
        nodes = platform_args_kinds(platform_args)
    else:
        nodes = [k for o in objects if o["kind"] == "NodePool" for k in nodepool_kinds(mode, o)]
        nodes += node_group_kinds(resources)
        if mode == "auto":
            nodes += auto_mode_builtin_kinds()
    return ClusterView(name, nodes, object_pods(objects) + release_pods(resources))


def unschedulable(v: ClusterView) -> list[str]:
    """Each pod no node of the cluster admits, with why the nearest node refuses it."""
    bad = []
    for pod in v.pods:
        if not v.where(pod):
            reasons = "; ".join(f"{n.name}: {why_not(pod, n)}" for n in v.nodes)
            bad.append(f"{pod.kind} {pod.name} ({reasons})")
    return bad


def _demand(p: Pod) -> node_fit.PodDemand:
    return node_fit.PodDemand(p.name, p.cpu_millis, p.memory_mib, count=p.count, spread=p.spread,
                              max_per_node=p.max_per_node)


def misfits(v: ClusterView) -> list[str]:
    """What does not fit: a fixed group that cannot hold its pods at once, a pod larger than every
    node it may go to, or an elastic pool whose limits cannot hold its pods at once."""
    bad: list[str] = []
    groups: dict[str, list[NodeKind]] = {}
    for n in v.nodes:
        groups.setdefault(n.group, []).append(n)
    load: dict[str, list[Pod]] = {g: [] for g in groups}
    daemons: dict[str, list[Pod]] = {g: [] for g in groups}
    for pod in v.pods:
        fits = v.where(pod)
        if not fits:
            continue  # unschedulable() says why
        if pod.kind == "DaemonSet":
            for g in {n.group for n in fits}:
                daemons[g].append(pod)
            continue
        # An elastic pool grows for a pod it admits; a pod only fixed nodes admit must fit them.
        elastic = [n for n in fits if n.fixed_nodes is None]
        load[(elastic or fits)[0].group].append(pod)
    for g, kinds in groups.items():
        pods = load[g]
        node_daemons = list(node_fit.NODE_DAEMONS) + [node_fit.DaemonDemand(d.name, d.cpu_millis, d.memory_mib)
                                                      for d in daemons[g]]
        known = [n for n in kinds if n.instance_type in node_fit.node_types()]
        if kinds[0].fixed_nodes is not None:
            smallest = min(known, key=lambda n: node_fit.allocatable(n.instance_type, managed=True).cpu_millis)
            extra = [node_fit.COREDNS] if g == "system" else []
            result = node_fit.pack(node_fit.NodeGroup(g, smallest.instance_type, kinds[0].fixed_nodes, managed=True),
                                   node_daemons, extra + [_demand(p) for p in pods])
            if not result.fits:
                bad.append(node_fit.explain(result, result.group))
            continue
        if not pods:
            continue
        if not known:
            # Auto Mode's general-purpose pool (no limit warmstart sets): each pod fits its largest node.
            if g == f"pool:{placement.GENERAL_PURPOSE_POOL}" and any(n.name.startswith("Auto Mode") for n in kinds):
                alloc = cpu_pool.largest_allocatable("auto")
                for p in pods:
                    if p.cpu_millis > alloc.cpu_millis or p.memory_mib > alloc.memory_mib:
                        bad.append(f"{p.kind} {p.name} ({p.cpu_millis}m CPU, {p.memory_mib}Mi) fits no node of {g} "
                                   f"(at most {alloc.cpu_millis}m, {alloc.memory_mib}Mi)")
            continue  # a cluster warmstart did not create: its nodes' sizes are not known
        for p in pods:
            one = node_fit.PodDemand(p.name, p.cpu_millis, p.memory_mib)
            if not any(node_fit.pack(node_fit.NodeGroup(g, n.instance_type, 1), node_daemons, [one]).fits
                       and not why_not(p, n) for n in known):
                bad.append(f"{p.kind} {p.name} ({p.cpu_millis}m CPU, {p.memory_mib}Mi, {p.gpus} GPUs) fits no node of "
                           f"{g} ({', '.join(n.instance_type for n in known)})")  # type: ignore[misc]
        bad += _within_limits(g, known, pods, node_daemons)
    return bad


def _within_limits(g: str, kinds: Sequence[NodeKind], pods: Sequence[Pod],
                   daemons: Sequence[node_fit.DaemonDemand]) -> list[str]:
    """All of the pool's pods at once on the nodes its limits allow (whole nodes of its largest type)."""
    limits = kinds[0].limits
    if not limits:
        return []
    big = max(kinds, key=lambda n: (instances.lookup(n.instance_type).gpu_count if n.instance_type in instances.catalog()
                                    else 0, node_fit.node_type(n.instance_type).vcpu))
    nt = node_fit.node_type(big.instance_type)
    gpus_per_node = instances.lookup(big.instance_type).gpu_count if big.instance_type in instances.catalog() else 0
    caps = []
    if "cpu" in limits:
        caps.append(node_fit.parse_cpu(limits["cpu"]) // (nt.vcpu * 1000))
    if placement.GPU_RESOURCE in limits and gpus_per_node:
        caps.append(int(limits[placement.GPU_RESOURCE]) // gpus_per_node)
    nodes = min(caps) if caps else 0
    out = []
    gpu_nodes = sum(math.ceil(p.count / (gpus_per_node // p.gpus)) for p in pods if p.gpus and gpus_per_node >= p.gpus)
    if gpu_nodes > nodes:
        out.append(f"{g}: its GPU pods need {gpu_nodes} nodes of {big.instance_type}, its limits {dict(limits)} allow {nodes}")
    result = node_fit.pack(node_fit.NodeGroup(g, big.instance_type, nodes), daemons, [_demand(p) for p in pods])
    if not result.fits:
        out.append(f"{g} at its limits {dict(limits)}: " + node_fit.explain(result, result.group))
    return out
