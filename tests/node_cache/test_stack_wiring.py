"""The node cache as the shipped stacks wire it: dev stages its model, prod keeps a warm spare
and pre-pulls its models' images; Karpenter nodes pull with SOCI."""

from __future__ import annotations

import email

import yaml

from tests.support.stacks import render_stack
from warmstart.manifests import node_cache as objects


def _deployment(r, name):
    (dep,) = [d for d in r.kind("Deployment") if d["metadata"]["name"] == name]
    return dep


def _registered(r, kind, name):
    (x,) = [x for x in r.resources if x.inputs.get("kind") == kind and x.inputs.get("metadata", {}).get("name") == name]
    return x


def test_dev_stages_its_model_and_its_pods_prefer_the_nodes_that_hold_it():
    r = render_stack("dev")
    (m,) = r.stack_plan.models
    assert m.staged and m.weights_digest
    ds = _registered(r, "DaemonSet", objects.daemonset_name(m.name, m.pool))
    dep = _registered(r, "Deployment", m.name)
    # The Deployment rolls only after the DaemonSet (which pulled the same image everywhere).
    assert ds.urn in dep.dependencies
    ds_images = {c["image"] for c in ds.inputs["spec"]["template"]["spec"]["containers"]}
    pod = dep.inputs["spec"]["template"]["spec"]
    (vllm,) = [c for c in pod["containers"] if c["name"] == "vllm"]
    assert ds_images == {vllm["image"]} == {m.image}
    (pref,) = pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert pref["preference"]["matchExpressions"] == [
        {"key": objects.label_key(m.name), "operator": "In", "values": [m.weights_digest]}]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in pod["affinity"]["nodeAffinity"]
    inits = [c["name"] for c in pod["initContainers"]]
    assert inits.index(objects.SELECT_CONTAINER) < inits.index("compile-cache-restore")
    # Both ends of the compile cache key on the picker's choice.
    keyed = [c for c in pod["initContainers"] if c["name"] in ("compile-cache-restore", "compile-cache-publish")]
    assert len(keyed) == 2
    for c in keyed:
        assert {"name": "WARMSTART_WEIGHTS_CHOICE_FILE", "value": objects.CHOICE_FILE} in c["env"]
    # node-feature-discovery turns the staging pods' NodeFeatures into labels; the two
    # PriorityClasses exist.
    (nfd,) = r.of_type("kubernetes:helm.sh/v3:Release")
    assert nfd.inputs["chart"].endswith("node-feature-discovery") and nfd.inputs["values"]["worker"]["enable"] is False
    assert {o["metadata"]["name"] for o in r.kind("PriorityClass")} == {
        objects.STAGING_PRIORITY_CLASS, objects.PLACEHOLDER_PRIORITY_CLASS}


def test_prod_keeps_a_warm_spare_and_pre_pulls_unstaged_images():
    r = render_stack("prod")
    (pool,) = r.stack_plan.cluster.pools
    assert pool.warm_nodes == 1 and not pool.staged_models
    spare = _deployment(r, f"{pool.name}-warm-spare")
    pod = spare["spec"]["template"]["spec"]
    assert spare["spec"]["replicas"] == 1 and pod["priorityClassName"] == objects.PLACEHOLDER_PRIORITY_CLASS
    (pause,) = pod["containers"]
    assert pause["resources"]["requests"]["nvidia.com/gpu"] == str(pool.warm_instance.gpu_count)
    # The spare's GPUs count against the pool's limit.
    (np,) = [p for p in r.kind("NodePool") if p["metadata"]["name"] == pool.name]
    assert int(np["spec"]["limits"]["nvidia.com/gpu"]) == pool.max_gpus
    for m in r.stack_plan.models:
        assert not m.staged
        ds = _registered(r, "DaemonSet", f"{m.name}-image-{m.pool}")
        assert {c["image"] for c in ds.inputs["spec"]["template"]["spec"]["containers"]} == {m.image}
        assert ds.urn in _registered(r, "Deployment", m.name).dependencies


def test_karpenter_nodes_pull_with_soci_parallel_pull():
    r = render_stack("prod")
    # The GPU pool's node class (the general-purpose pool's nodes need no SOCI on NVMe).
    (nc,) = [c for c in r.kind("EC2NodeClass") if c["metadata"]["name"] == r.stack_plan.cluster.pools[0].name]
    msg = email.message_from_string(nc["spec"]["userData"])
    assert msg.is_multipart()
    (part,) = [p for p in msg.get_payload() if p.get_content_type() == "application/node.eks.aws"]
    node_config = yaml.safe_load(part.get_payload())
    assert node_config["kind"] == "NodeConfig" and node_config["spec"]["featureGates"]["FastImagePull"] is True
