"""What fits where, over the whole render of every stack (issue 20).

Every pod a stack runs is read from its render (Deployments at their replicas plus a rollout's
surge pod, DaemonSets on every node of their pool, Jobs, the Helm releases' pods from the values
warmstart gives them) and bin-packed onto the nodes it is pinned to, with the kubelet's
reservation as the EKS AMI computes it (warmstart/decisions/node_fit.py):
- the Karpenter-mode system node group, a fixed number of nodes: everything must fit at once;
- each GPU pool, whose NodePool adds nodes up to its limit: each pod must fit one node of the
  pool's instance type beside the pool's DaemonSets, GPUs included.
The planner sizes the system group from the plan; this reads the objects, so a request changed in
a manifest without the planner knowing fails here.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest


from tests.support.renders import EXAMPLE_NAMES, example, node_group_of, workloads
from tests.conftest import ALL_STACK_NAMES, load_stack_doc, render_doc, render_stack
from warmstart import render
from warmstart.decisions import node_fit, instances, placement

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
RELEASE = "kubernetes:helm.sh/v3:Release"


def _release_pods(r: render.Rendered) -> list[tuple[str, node_fit.PodDemand]]:
    """The Helm releases' pods with the requests and nodes warmstart's values give them."""
    out = []
    for rel in r.of_type(RELEASE):
        values, name = rel.inputs.get("values") or {}, rel.inputs.get("name") or rel.name
        where = node_group_of(values.get("nodeSelector") or {})
        if name == "karpenter":
            req = values["controller"]["resources"]["requests"]
            out.append((where, node_fit.PodDemand("karpenter", node_fit.parse_cpu(req["cpu"]),
                                                  node_fit.parse_memory(req["memory"]), count=values["replicas"],
                                                  max_per_node=1)))
        elif name == "keda":
            for part in ("operator", "metricServer", "webhooks"):
                req = values["resources"][part]["requests"]
                out.append((where, node_fit.PodDemand(f"keda-{part}", node_fit.parse_cpu(req["cpu"]),
                                                      node_fit.parse_memory(req["memory"]))))
        elif name == "node-feature-discovery":
            for part, demand in (("master", node_fit.NFD_MASTER), ("gc", node_fit.NFD_GC)):
                out.append((node_group_of(values[part]["nodeSelector"]), demand))
    return out


def _system_group(r: render.Rendered) -> node_fit.NodeGroup | None:
    groups = r.of_type(NODE_GROUP)
    if not groups:
        return None
    (g,) = groups
    types = g.inputs["instanceTypes"]
    smallest = min(types, key=lambda t: node_fit.allocatable(t, managed=True).cpu_millis)
    return node_fit.NodeGroup("system", smallest, g.inputs["scalingConfig"]["desiredSize"], managed=True)


def _system_load(r: render.Rendered) -> tuple[list[node_fit.DaemonDemand], list[node_fit.PodDemand]]:
    """The DaemonSets on every system node and the pods pinned to the system group."""
    pods = [node_fit.COREDNS]
    daemons = list(node_fit.NODE_DAEMONS)
    for kind, name, spec, count in workloads(r):
        if node_group_of(spec.get("nodeSelector") or {}) != "system":
            continue
        cpu, mem = node_fit.pod_requests(spec)
        if kind == "DaemonSet":
            daemons.append(node_fit.DaemonDemand(name, cpu, mem))
        else:
            spread = name if spec.get("topologySpreadConstraints") else None
            pods.append(node_fit.PodDemand(name, cpu, mem, count=count, spread=spread))
    pods += [d for where, d in _release_pods(r) if where == "system"]
    return daemons, pods


def system_group_fit(r: render.Rendered, nodes: int | None = None) -> node_fit.PackResult | None:
    """Every pod pinned to the system node group, packed onto it (or onto `nodes` of its nodes)."""
    group = _system_group(r)
    if group is None:
        return None
    if nodes is not None:
        group = node_fit.NodeGroup(group.name, group.instance_type, nodes, managed=True)
    return node_fit.pack(group, *_system_load(r))


def _gpu_nodepools(r: Any) -> dict[str, list[str]]:
    out = {}
    for pool in [o for o in r.kubernetes_objects if o["kind"] == "NodePool"]:
        reqs = pool["spec"]["template"]["spec"]["requirements"]
        types = [v for q in reqs if q["key"] == "node.kubernetes.io/instance-type" for v in q["values"]]
        out[pool["metadata"]["name"]] = types
    return out


def gpu_pool_misfits(r: Any) -> list[str]:
    """Each pod on a GPU pool that fits no node of the pool's instance types beside the pool's
    DaemonSets (CPU, memory, pods and GPUs). A pod pinned to an instance type on a cluster the
    program does not own (an example) is held against one such node."""
    pools = _gpu_nodepools(r)
    for _, _, spec, _ in workloads(r):
        pool = node_group_of(spec.get("nodeSelector") or {})
        if pool is not None and pool.startswith("type:"):
            pools[pool] = [pool.removeprefix("type:")]
    work = workloads(r)
    bad = []
    for pool, types in pools.items():
        daemons = list(node_fit.NODE_DAEMONS) + [
            node_fit.DaemonDemand(name, *node_fit.pod_requests(spec)) for kind, name, spec, _ in work
            if kind == "DaemonSet" and node_group_of(spec.get("nodeSelector") or {}) == pool]
        for kind, name, spec, _ in work:
            if kind == "DaemonSet" or node_group_of(spec.get("nodeSelector") or {}) != pool:
                continue
            wanted = spec.get("nodeSelector", {}).get("node.kubernetes.io/instance-type")
            gpus = sum(int(c.get("resources", {}).get("requests", {}).get(placement.GPU_RESOURCE, 0))
                       for c in spec.get("containers", []))
            fits = False
            for t in [t for t in types if wanted in (None, t)]:
                one = node_fit.pack(node_fit.NodeGroup(pool, t, 1), daemons,
                                    [node_fit.PodDemand(name, *node_fit.pod_requests(spec))])
                fits = fits or (one.fits and gpus <= instances.lookup(t).gpu_count)
            if not fits:
                bad.append(f"{kind} {name} on pool {pool} ({', '.join(types)})")
    return bad


@pytest.mark.parametrize("stack", ALL_STACK_NAMES)
def test_every_pod_of_every_stack_fits_its_nodes(stack):
    r = render_stack(stack)
    result = system_group_fit(r)
    if result is not None:
        assert result.fits, node_fit.explain(result, result.group)
    assert gpu_pool_misfits(r) == []


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_every_pod_of_every_example_fits_its_nodes(name):
    program, _ = example(name)
    assert gpu_pool_misfits(program) == []


def test_two_routed_models_in_karpenter_mode_get_a_system_group_that_holds_them(tmp_path):
    doc = load_stack_doc("prod")
    models = doc["config"]["warmstart:models"]
    models[1]["replicas"] = 2  # llama-4-scout now has a router too
    models[1]["import"] = {"s3": "s3://upstream-models/scout"}
    doc["config"]["warmstart:gpuPools"][0]["maxGpus"] = 64
    r = render_doc(doc, tmp_path, stack="two-routed")
    result = system_group_fit(r)
    assert result is not None and result.fits, node_fit.explain(result, result.group)
    assert result.group.nodes > render_stack("prod").stack_plan.cluster.system_node_group.size
    # One node fewer would leave a pod Pending: the planner took the fewest.
    assert not system_group_fit(r, nodes=result.group.nodes - 1).fits


def test_the_shipped_prod_system_group_was_too_small_at_two_nodes():
    # The finding: 2 x m7i.large cannot hold what prod pins there; the planner now asks for 3.
    fit = system_group_fit(render_stack("prod"))
    assert fit is not None and fit.group.nodes == 3 and fit.fits
    assert not system_group_fit(render_stack("prod"), nodes=2).fits


def test_a_gpu_pod_larger_than_its_node_is_caught():
    r = copy.deepcopy(render_stack("dev"))  # the session's render is shared: mutate a copy
    assert gpu_pool_misfits(r) == []
    (dep,) = [o for o in r.kind("Deployment") if o["metadata"]["name"] == "llama-3-1-8b"]
    (vllm,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
    vllm["resources"]["requests"]["cpu"] = "8"  # a g6e.2xlarge has 8 vCPUs, less the kubelet's share
    assert gpu_pool_misfits(r) == ["Deployment llama-3-1-8b on pool l40s (g6e.2xlarge)"]


def test_on_every_gpu_type_a_staged_scraped_pod_fits_beside_the_nodes_daemonsets(tmp_path):
    """The most a GPU node runs besides vLLM: the node cache's staging DaemonSet, the node's own
    DaemonSets, and the pod's sidecars (compile cache, first token, metrics). On a 4-vCPU type
    (g5/g6/g6e.xlarge) the pod's GPU share of the CPU used to leave them too little."""
    doc = load_stack_doc("dev")
    types = [t for t in instances.catalog() if instances.lookup(t).nvme_total_gb]
    doc["config"]["warmstart:gpuPools"] = [
        {"name": f"p{i}", "instanceTypes": [t], "maxGpus": 4 * instances.lookup(t).gpu_count} for i, t in enumerate(types)]
    doc["config"]["warmstart:models"] = [
        {"name": f"m{i}", "source": f"m{i}", "weightsGiB": 1, "pool": f"p{i}", "nodeCache": "on",
         "autoscaling": {"minReplicas": 1, "maxReplicas": 2}} for i in range(len(types))]
    r = render_doc(doc, tmp_path, stack="every-gpu-type")
    assert {"g6e.xlarge", "g6.xlarge", "g5.xlarge"} <= set(types)
    assert gpu_pool_misfits(r) == []
