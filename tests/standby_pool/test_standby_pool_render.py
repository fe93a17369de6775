"""A stack with a standby pool, rendered by the real program (Pulumi mocks) in both cluster modes:
every object valid against the schemas (KEDA's and the node classes' too), the pool's hosts and
actuator in the whole-cluster checks, the members wired to the pool (their port, their routers'
selector, their ScaledObjects' figure), and who reaches whom as the VPC CNI's policy agent
enforces it."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

import pytest

from tests.standby_pool.pooled import MODELS, POOL, pooled_doc
from tests.support import reachability as R
from tests.support.stacks import render_doc
from tests.support.validation import validate_rendered
from warmstart import render
from warmstart.decisions import standby as standby_mod
from warmstart.decisions import standby_pool as sp
from warmstart.manifests import serving
from warmstart.manifests import standby_pool as objects

HOSTS = f"{POOL}-engine-host"
ACTUATOR = f"{POOL}-standby-pool"


@functools.cache
def rendered(mode: str) -> render.Rendered:
    return render_doc(pooled_doc(mode), Path(tempfile.mkdtemp(prefix="pooled-")), f"pooled-{mode}")


def by(r: render.Rendered) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in r.kubernetes_objects}


@pytest.mark.parametrize("mode", ["karpenter", "auto"])
def test_a_pooled_stack_renders_valid_objects_in_both_modes(mode):
    r = rendered(mode)
    # Every object against its schema (Kubernetes', KEDA's) and the stack against warmstart's policies.
    validate_rendered(r)
    objs = by(r)
    for kind, name in [("Deployment", HOSTS), ("ConfigMap", HOSTS), ("ServiceAccount", HOSTS),
                       ("NetworkPolicy", HOSTS), ("Deployment", ACTUATOR), ("ConfigMap", ACTUATOR),
                       ("Role", ACTUATOR), ("RoleBinding", ACTUATOR), ("Service", ACTUATOR),
                       ("NetworkPolicy", ACTUATOR), ("ConfigMap", f"{HOSTS}-script"),
                       ("PodDisruptionBudget", HOSTS)]:
        assert (kind, name) in objs, (kind, name)
    # No member keeps a per-model actuator or sleepers.
    assert not any(k == "Deployment" and n.endswith("-standby") for k, n in objs)


def test_each_member_serves_on_its_port_and_is_routed_to_its_awake_engines_alone():
    r = rendered("karpenter")
    objs = by(r)
    for m in r.stack_plan.models:
        port = sp.member_port(m.name)
        pod = objs[("Deployment", m.name)]["spec"]["template"]
        (vllm,) = [c for c in pod["spec"]["containers"] if c["name"] == "vllm"]
        assert f"--port={port}" in vllm["args"] and vllm["ports"][0]["containerPort"] == port
        assert pod["metadata"]["labels"][serving.SERVES_LABEL] == m.name
        args = objs[("Deployment", f"{m.name}-router")]["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--service-discovery-port") + 1] == str(port)
        start = args.index("--selector") + 1
        assert args[start:start + 2] == [f"{serving.ENGINE_LABEL}=awake", f"{serving.SERVES_LABEL}={m.name}"]
        so = objs[("ScaledObject", m.name)]
        (figure,) = [t for t in so["spec"]["triggers"] if t["type"] == "metrics-api"
                     and t["metadata"]["url"].endswith(f"/warmstart/pods/{m.name}")]
        assert figure["metadata"]["url"] == sp.figure_url(POOL, "inference", m.name)
        # KEDA's range is the model's own: the pool's spares are not its pods.
        assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (
            m.autoscaling.min_replicas, m.autoscaling.max_replicas)


def test_non_pooled_models_keep_the_selector_and_port_they_had():
    doc = pooled_doc()
    doc["config"]["warmstart:models"].append({"name": "plain", "source": "org/plain", "weightsGiB": 15, "pool": "h100",
                                              "tensorParallelSize": 1,
                                              "autoscaling": {"minReplicas": 1, "maxReplicas": 2}})
    r = render_doc(doc, Path(tempfile.mkdtemp(prefix="pooled-")), "pooled-plain")
    objs = by(r)
    args = objs[("Deployment", "plain-router")]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--service-discovery-port") + 1] == "8000"
    assert serving.SERVES_LABEL not in objs[("Deployment", "plain")]["spec"]["template"]["metadata"]["labels"]


def test_the_whole_cluster_checks_count_the_hosts_and_the_pool_actuator():
    from warmstart.plan.cluster import non_gpu_pods

    r = rendered("karpenter")
    plan = r.stack_plan
    (pool,) = plan.standby_pools
    (gpu,) = plan.cluster.pools
    own = sum(m.tensor_parallel_size * m.max_replicas for m in plan.models)
    assert gpu.max_gpus >= own + pool.gpus * pool.max_hosts
    assert ACTUATOR in {p.name for p in non_gpu_pods(plan.config, plan.models)}


@functools.cache
def network(mode: str) -> R.Stack:
    return R.stack_model(f"pooled-{mode}", rendered(mode))


def _pod(stack: R.Stack, name: str) -> R.Endpoint:
    return next(e for e in stack.sources if e.name == f"inference/{name}")


@pytest.mark.parametrize("mode", ["karpenter", "auto"])
def test_the_standard_flows_hold_for_a_pooled_stack(mode):
    violations = R.check(network(mode), list(R.FLOWS))
    assert not violations, "\n".join(map(str, violations))


@pytest.mark.parametrize("mode", ["karpenter", "auto"])
def test_a_hosts_member_port_is_reached_by_that_members_routers_alone(mode):
    s = network(mode)
    host = _pod(s, HOSTS)
    for m in MODELS:
        port = sp.member_port(m)
        assert s.cluster.reach(_pod(s, f"{m}-router"), host, port) == "", m
        for other in MODELS:
            if other != m:
                assert s.cluster.reach(_pod(s, f"{other}-router"), host, port) != "", (other, m)
        assert s.cluster.reach(_pod(s, "another-pod"), host, port) != ""
        assert s.cluster.reach(_pod(s, ACTUATOR), host, port) != ""
        # The pool actuator reads the member's own pods (their queues) on the member port.
        assert s.cluster.reach(_pod(s, ACTUATOR), _pod(s, m), port) == ""


@pytest.mark.parametrize("mode", ["karpenter", "auto"])
def test_the_supervisor_is_the_pool_actuators_and_the_figure_kedas(mode):
    s = network(mode)
    host, actuator = _pod(s, HOSTS), _pod(s, ACTUATOR)
    assert s.cluster.reach(actuator, host, sp.SUPERVISOR_PORT) == ""
    for who in [f"{MODELS[0]}-router", MODELS[0], "another-pod"]:
        assert s.cluster.reach(_pod(s, who), host, sp.SUPERVISOR_PORT) != "", who
    keda = next(e for e in s.sources if e.role == "keda-operator")
    assert s.cluster.reach(keda, actuator, standby_mod.FIGURE_PORT) == ""
    assert s.cluster.reach(_pod(s, "another-pod"), actuator, standby_mod.FIGURE_PORT) != ""
    assert s.cluster.reach(actuator, s.api, 443) == ""


def test_the_pool_json_names_the_rendered_host_deployment_and_members():
    objs = by(rendered("karpenter"))
    doc = json.loads(objs[("ConfigMap", ACTUATOR)]["data"]["pool.json"])
    assert doc["hostDeployment"] == HOSTS and sorted(m["model"] for m in doc["members"]) == sorted(MODELS)
    dep = objs[("Deployment", HOSTS)]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert all(labels[k] == v for k, v in doc["hostSelector"].items())
    assert labels == objects.host_pod_labels(POOL)


def test_the_render_prints_each_pooled_path_under_20_s_and_the_pools_cost_once():
    import re

    from tests.standby_pool.pooled import pooled_config
    from warmstart import config
    from warmstart.plan.stack import plan_stack

    table = render.table(plan_stack(config.parse_config(pooled_config()), "pooled"))
    for m in MODELS:
        got = re.search(rf"scale-out {m}: its engine woken on a spare host of standby pool {POOL} answers "
                        r"~([\d.]+)s after the load rises \(signal 1s \+ wake ([\d.]+)s for 15 GiB from host RAM", table)
        assert got and float(got[1]) < 20, table
    pool_lines = [line for line in table.splitlines() if line.startswith(f"standby pool {POOL}:")]
    assert len(pool_lines) == 1, "the spares' cost is the pool's, shown once"
    # p5.48xlarge at its listed $55.04 per node-hour: one H100 of eight against four.
    assert "standby GPUs 1 against 4 for one per-model sleeper each, $6.88/h against $27.52/h" in pool_lines[0]
    # The most the pool holds: its five hosts (the spare plus one per member woken at once).
    assert "(up to $34.40/h for 5 GPU(s) while 4 host(s) serve woken engines)" in pool_lines[0]
    assert re.search(r"replacement holds every engine again after ~\d+s", table)
    # The model rows' $/h are each model's own pods: no row carries the spare.
    assert all("standby" not in line for line in table.splitlines() if line.startswith(tuple(MODELS)))


def test_every_pod_of_the_pool_is_hardened_and_the_stack_passes_every_policy():
    from tests.support.pod_security import assert_pod_hardened
    from warmstart import mocks, policies

    r = rendered("karpenter")
    pool_pods = [o for o in r.kubernetes_objects if o["kind"] == "Deployment" and o["metadata"]["name"] in (HOSTS, ACTUATOR)]
    assert len(pool_pods) == 2
    for o in pool_pods:
        tpl = o["spec"]["template"]
        assert assert_pod_hardened(o["metadata"]["name"], tpl["spec"], tpl["metadata"]["labels"]) >= 1
    # The policy pack knows the host by the label the builder writes (its loader check reads each
    # member's own Deployment, whose arguments the host's engines run).
    from warmstart.policies import vllm as vllm_policies
    assert objects.HOST_NAME == vllm_policies.ENGINE_HOST_NAME
    records = mocks.policy_records(r.resources, r.stack_plan.config.region)
    assert [str(v) for v in policies.run_all(records)] == []


@pytest.mark.parametrize("mode", ["karpenter", "auto"])
def test_every_pod_of_a_pooled_cluster_is_schedulable_and_fits(mode):
    from tests.support import cluster
    from tests.support.renders import cluster_from

    v = cluster_from(f"pooled-{mode}", rendered(mode))
    assert {p.name for p in v.pods} >= {f"inference/{HOSTS}", f"inference/{ACTUATOR}"}
    assert cluster.unschedulable(v) == []
    # The checker's node count rounds each Deployment up to whole nodes of its own ("its GPU pods
    # need N nodes"), which five 1-GPU Deployments on 8-GPU nodes trip with or without a pool (five
    # plain models do too: left to the checker's owner); every other fit, the packing of all the
    # pool's pods at its GPU limit among them, holds.
    assert [m for m in cluster.misfits(v) if "its GPU pods need" not in m] == []
    host = next(p for p in v.pods if p.name == f"inference/{HOSTS}")
    # The hosts land on the pool's GPU nodes only (its NodePool, its instance type, not spot).
    assert {n.group for n in v.where(host)} == {"pool:h100"}


def test_the_hosts_role_reads_the_members_weights_and_nothing_else():
    from tests.support import policy_eval
    from tests.support.stacks import policy_json

    r = rendered("karpenter")
    (pol,) = [x for x in r.resources if x.typ == "aws:iam/rolePolicy:RolePolicy" and x.name.endswith("-host-s3")]
    doc = policy_json(pol.inputs["policy"])
    (role,) = [x for x in r.resources if x.typ == "aws:iam/role:Role" and x.name.endswith("-host-role")]
    trust = policy_json(role.inputs["assumeRolePolicy"])
    assert f"system:serviceaccount:inference:{HOSTS}" in json.dumps(trust)
    bucket = r.stack_plan.aws.buckets.model_bucket
    for m in MODELS:
        assert policy_eval.allowed(doc, "s3:GetObject", f"arn:aws:s3:::{bucket}/org/{m}/model.safetensors")
    assert not policy_eval.allowed(doc, "s3:GetObject", f"arn:aws:s3:::{bucket}/org/another-model/x.safetensors")
    assert not policy_eval.allowed(doc, "s3:PutObject", f"arn:aws:s3:::{bucket}/org/{MODELS[0]}/x")
    sa = by(r)[("ServiceAccount", HOSTS)]
    assert sa["metadata"]["annotations"][serving.IRSA_ROLE_ANNOTATION]


@pytest.mark.parametrize("mode", ["karpenter", "auto"])
def test_a_staged_member_renders_hosts_that_mount_its_node_copy_and_prints_its_wake_from_nvme(mode):
    """chat-a staged by the node cache, level 2: the stack wires the cluster mode's NVMe mount into
    the hosts, the stack stays valid, and the render's wake figure is what the hosts mount."""
    import re

    from tests.standby_pool.pooled import pooled_config
    from warmstart import config
    from warmstart.decisions import node_cache as node_cache_decisions
    from warmstart.decisions import placement
    from warmstart.plan.stack import plan_stack

    doc = pooled_doc(mode, sleepLevel=2)
    doc["config"]["warmstart:models"][0]["nodeCache"] = "on"
    r = render_doc(doc, Path(tempfile.mkdtemp(prefix="pooled-staged-")), f"pooled-staged-{mode}")
    validate_rendered(r)
    pod = by(r)[("Deployment", HOSTS)]["spec"]["template"]["spec"]
    paths = [v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v]
    assert paths == [node_cache_decisions.node_weights_root(placement.NVME_MOUNT[mode], "chat-a")]
    # The member's own staging DaemonSet fills that directory on the hosts' GPU pool.
    assert ("DaemonSet", "chat-a-weights-h100") in by(r)
    cfg = pooled_config(mode, sleepLevel=2)
    cfg["models"][0]["nodeCache"] = "on"
    table = render.table(plan_stack(config.parse_config(cfg), "pooled"))
    for m, source in [("chat-a", "node NVMe"), *((m, "S3") for m in MODELS[1:])]:
        got = re.search(rf"scale-out {m}: its engine woken on a spare host of standby pool {POOL} answers "
                        rf"~([\d.]+)s after the load rises \(signal 1s \+ wake [\d.]+s for 15 GiB from {source} ", table)
        assert got and float(got[1]) < 20, (m, table)
