"""What fits where, and what can be scheduled at all, over whole clusters (issues 20 and 28).

A cluster is a platform's render and every model stack of that platform in the same stacks/
folder, together (tests/support/cluster.py): its nodes (NodePools with their requirements,
labels, taints and limits, the Karpenter-mode system node group, Auto Mode's built-in pools, or
what an example's PlatformArgs say its cluster has) and every pod on it (Deployments at their
replicas plus a rollout's surge pod, DaemonSets on every node they match, Jobs, the Helm releases'
pods from the values warmstart gives them). Each pod must be schedulable on some node (its node
selector, required node affinity and tolerations against the nodes' labels and taints), and all
of them must fit at once: the fixed system group holds its pods, each elastic pool each pod on
one node and all of them within its limits. The planner sizes from the plan; this reads the
objects, so a request or selector changed in a manifest without the planner knowing fails here.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from tests.support import cluster
from tests.support.renders import (
    EXAMPLE_NAMES,
    cluster_from,
    example_cluster,
    shipped_cluster,
)
from tests.support.stacks import (
    ALL_STACK_NAMES,
    ROOT,
    load_stack_doc,
    render_doc,
    render_stack,
)
from warmstart import render
from warmstart.decisions import instances, placement


@pytest.mark.parametrize("stack", ALL_STACK_NAMES)
def test_every_pod_of_every_stack_can_be_scheduled_on_its_cluster(stack):
    assert cluster.unschedulable(shipped_cluster(stack)) == []


@pytest.mark.parametrize("stack", ALL_STACK_NAMES)
def test_every_pod_of_every_stack_fits_its_cluster(stack):
    assert cluster.misfits(shipped_cluster(stack)) == []


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_every_pod_of_every_example_can_be_scheduled_and_fits(name):
    v = example_cluster(name)
    assert cluster.unschedulable(v) == []
    assert cluster.misfits(v) == []


def test_the_shipped_example_uses_no_label_only_warmstart_clusters_have():
    """The routed model of examples/model-on-existing-platform runs on a cluster warmstart did not
    create: no pod may select a label only warmstart's nodes carry."""
    v = example_cluster("model-on-existing-platform")
    routers = [p for p in v.pods if p.name.endswith("-router")]
    assert routers
    for p in v.pods:
        assert placement.NODE_GROUP_LABEL not in (p.spec.get("nodeSelector") or {}), p.name
        if (p.spec.get("nodeSelector") or {}).get(placement.NODEPOOL_LABEL) == placement.GENERAL_PURPOSE_POOL:
            raise AssertionError(f"{p.name} selects warmstart's general-purpose pool")


def test_a_pod_pinned_to_a_label_the_cluster_lacks_is_unschedulable():
    """Finding 2 as it was: a router pinned to `warmstart.io/node-group: system` on a cluster that
    has no such nodes passed every reachability row; the schedulability check refuses it."""
    v = copy.deepcopy(example_cluster("model-on-existing-platform"))
    (router,) = [p for p in v.pods if p.name.endswith("-router")]
    router.spec = {"nodeSelector": {placement.NODE_GROUP_LABEL: placement.SYSTEM_NODE_GROUP}}
    assert [b for b in cluster.unschedulable(v) if router.name in b]


def _pod(v: cluster.ClusterView, name: str) -> cluster.Pod:
    (pod,) = [p for p in v.pods if p.name == name]
    return pod


@pytest.mark.parametrize(("what", "cpu", "gpus"), [("cpu", 500_000, 1), ("gpus", 0, 64)])
def test_a_model_stack_pod_too_large_for_its_platform_is_caught(what, cpu, gpus):
    """staging-llama-3-1-8b's pods are packed on its platform's nodes (staging's NodePools), not on
    the model stack's own render, where there are none: a 500-CPU or 64-GPU vLLM pod must fail."""
    v = copy.deepcopy(shipped_cluster("staging-llama-3-1-8b"))
    assert cluster.misfits(v) == [] and cluster.unschedulable(v) == []
    pod = _pod(v, "inference/llama-3-1-8b")
    if cpu:
        pod.cpu_millis = cpu
        assert any("inference/llama-3-1-8b" in m for m in cluster.misfits(v)), cluster.misfits(v)
    else:
        pod.gpus = gpus
        assert any("inference/llama-3-1-8b" in b for b in cluster.unschedulable(v))


def test_a_router_too_large_for_the_general_purpose_pool_is_caught():
    v = copy.deepcopy(shipped_cluster("staging-llama-3-1-8b"))
    _pod(v, "inference/llama-3-1-8b-router").cpu_millis = 500_000
    assert any("llama-3-1-8b-router" in m for m in cluster.misfits(v))


def test_a_gpu_pod_larger_than_its_node_is_caught():
    v = copy.deepcopy(shipped_cluster("dev"))
    _pod(v, "inference/llama-3-1-8b").cpu_millis = 8000  # a g6e.2xlarge has 8 vCPUs, less the kubelet's share
    assert [m for m in cluster.misfits(v) if "inference/llama-3-1-8b " in m]


def test_the_system_group_holds_only_what_karpenter_needs():
    """Karpenter mode: only the controller selects the system node group; everything else of
    warmstart's runs on the elastic general-purpose NodePool, so the group is sized for the
    controller and CoreDNS (two nodes) whatever the models."""
    v = shipped_cluster("prod")
    system = [p.name for p in v.pods if p.kind != "DaemonSet" and {n.group for n in v.where(p)} == {"system"}]
    assert system == ["karpenter"]
    assert render_stack("prod").stack_plan.cluster.system_node_group.size == 2
    for p in v.pods:
        assert placement.NODE_GROUP_LABEL not in (p.spec.get("nodeSelector") or {}) or p.name == "karpenter", p.name


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
    v = cluster_from("every-gpu-type", r)
    assert cluster.misfits(v) == [] and cluster.unschedulable(v) == []


# --- Several routed, imported model stacks on one platform, in both modes ----------------------

MODEL_STACKS = 3


def _platform_with_model_stacks(folder: Path, mode: str) -> tuple[render.Rendered, list[render.Rendered]]:
    """staging as the platform (in `mode`, with room on its pool) and three routed, imported,
    autoscaled model stacks on it, in one stacks/ folder."""
    folder.mkdir()
    platform = load_stack_doc("staging")
    platform["config"]["warmstart:clusterMode"] = mode
    platform["config"]["warmstart:gpuPools"][0]["maxGpus"] = 4 * MODEL_STACKS
    (folder / "Pulumi.staging.yaml").write_text(yaml.safe_dump(platform))
    names = []
    for i in range(MODEL_STACKS):
        doc = load_stack_doc("staging-llama-3-1-8b")
        model = doc["config"]["warmstart:model"]
        model["name"] = f"llama-{i}"
        model["source"] = f"meta-llama/llama-{i}"
        model["import"] = {"s3": f"s3://upstream-models/llama-{i}"}
        model["nodeCache"] = "off"
        names.append(f"staging-llama-{i}")
        (folder / f"Pulumi.{names[-1]}.yaml").write_text(yaml.safe_dump(doc))
    return (render.run_program(folder, "staging", program_dir=ROOT),
            [render.run_program(folder, n, program_dir=ROOT) for n in names])


@pytest.mark.parametrize("mode", ["auto", "karpenter"])
def test_a_platform_with_several_routed_imported_model_stacks_renders_and_packs(tmp_path, mode):
    platform, stacks = _platform_with_model_stacks(tmp_path / "stacks", mode)
    v = cluster_from("staging", platform, stacks)
    routers = [p for p in v.pods if p.name.endswith("-router")]
    imports = [p for p in v.pods if p.kind == "Job"]
    assert len(routers) == MODEL_STACKS and len(imports) == MODEL_STACKS
    assert cluster.unschedulable(v) == []
    assert cluster.misfits(v) == []
    # Every router and import lands on the elastic general-purpose pool, never on fixed nodes.
    for p in routers + imports:
        assert {n.group for n in v.where(p)} == {f"pool:{placement.GENERAL_PURPOSE_POOL}"}, p.name
    if mode == "karpenter":
        assert platform.stack_plan.cluster.system_node_group.size == 2


def test_the_same_model_stacks_pinned_to_the_system_group_would_not_fit(tmp_path):
    """The finding itself: with the routers and import Jobs pinned to `warmstart.io/node-group:
    system`, as before, three routed model stacks overflow the platform's two system nodes and
    the check says so with the numbers."""
    platform, stacks = _platform_with_model_stacks(tmp_path / "stacks", "karpenter")
    v = copy.deepcopy(cluster_from("staging", platform, stacks))
    for p in v.pods:
        if p.name.endswith("-router") or p.kind == "Job":
            p.spec = {"nodeSelector": {placement.NODE_GROUP_LABEL: placement.SYSTEM_NODE_GROUP}}
    found = cluster.misfits(v)
    assert any("node group 'system' (2 x m7i.large" in m and "cannot place" in m for m in found), found
