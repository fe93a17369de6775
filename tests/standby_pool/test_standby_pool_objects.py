"""A standby pool's objects (warmstart/manifests/standby_pool.py): valid against the Kubernetes
schemas, and each a rule of docs/scale-out.md "Pooled standby": the hosts' spec is the plan's, a
host's member port reachable from that member's routers alone, the supervisor from the pool
actuator alone, the actuator's figure from KEDA's operator alone, its Role scoped to the host
Deployment's scale subresource, and the spares kept off spot."""

from __future__ import annotations

import dataclasses
import json

import kubernetes_validate
import pytest

from tests.standby_pool.pooled import MODELS, POOL, pooled_config
from warmstart import config, versions
from warmstart.decisions import placement
from warmstart.decisions import standby as standby_mod
from warmstart.decisions import node_cache as node_cache_decisions
from warmstart.decisions import standby_pool as sp
from warmstart.manifests import network_policy, node_cache, serving
from warmstart.manifests import standby_pool as objects
from warmstart.plan.stack import plan_stack
from warmstart.podside.engine_host import spec as host_spec_file

NS = "inference"


def built(mode: str = "karpenter", **pool):
    p = plan_stack(config.parse_config(pooled_config(mode, **pool)), "pooled")
    (plan,) = p.standby_pools
    w = objects.wiring(plan, p.models, namespace=NS, region="us-east-1", api_server_cidrs=["172.20.0.1/32"],
                       role_arn="arn:aws:iam::123456789012:role/ws-pooled-shared-h100-engine-host-irsa")
    return p, plan, w, {(o["kind"], o["metadata"]["name"]): o for o in objects.objects(plan, w)}


@pytest.mark.parametrize("mode", ["karpenter", "auto"])
def test_every_object_is_valid_in_both_cluster_modes(mode):
    p, plan, w, objs = built(mode)
    for o in objs.values():
        kubernetes_validate.validate(o, versions.DEFAULT_KUBERNETES_VERSION, strict=True)
    assert sorted(k for k, _ in objs) == sorted(["NetworkPolicy", "NetworkPolicy", "ServiceAccount", "ConfigMap",
                                                 "Deployment", "PodDisruptionBudget", "ServiceAccount", "Role",
                                                 "RoleBinding", "ConfigMap", "Service", "Deployment"])
    pdb = objs[("PodDisruptionBudget", plan.deployment_name)]["spec"]
    assert pdb == {"maxUnavailable": 1, "selector": {"matchLabels": objects.host_selector(POOL)}}
    # Policies first: no pod of the pool runs unfenced.
    assert [o["kind"] for o in objects.objects(plan, w)][:2] == ["NetworkPolicy", "NetworkPolicy"]


def test_the_hosts_run_the_plans_spec_which_the_supervisor_reads_back(tmp_path):
    p, plan, w, objs = built()
    cm = objs[("ConfigMap", plan.deployment_name)]
    (tmp_path / "spec.json").write_text(cm["data"]["spec.json"])
    spec = host_spec_file.load(tmp_path / "spec.json")
    assert [e.model for e in spec.engines] == sorted(MODELS)
    by = {m.name: m for m in p.models}
    for e in spec.engines:
        # Each engine serves on its member's port, the one its own pods serve on.
        assert e.port == by[e.model].pooled.port == by[e.model].serving_port
        assert f"--port={e.port}" in e.argv and f"--served-model-name={e.model}" in e.argv
    dep = objs[("Deployment", plan.deployment_name)]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"][:4] == ["python3", "/scripts/engine_host.pyz", "--spec", "/etc/warmstart/engine-host/spec.json"]
    assert c["image"] == plan.image and c["resources"]["limits"][placement.GPU_RESOURCE] == "1"
    assert {p_["containerPort"] for p_ in c["ports"]} == {sp.SUPERVISOR_PORT} | {e.port for e in plan.engines}
    assert c["livenessProbe"]["httpGet"]["path"] == "/livez" and c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert dep["spec"]["replicas"] == plan.spares
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert labels[sp.POOL_LABEL] == POOL and labels[serving.ENGINE_LABEL] == "asleep"
    assert labels["app.kubernetes.io/name"] == "warmstart-engine-host" and labels["app.kubernetes.io/instance"] == POOL
    # A fresh host serves no model: no router's selector matches it until the actuator labels it.
    for m in MODELS:
        selector = serving.worker_selector(m, pooled=True)
        assert not all(labels.get(k) == v for k, v in selector.items())
    env = {e["name"] for e in c["env"]}
    assert standby_mod.DEV_MODE_ENV not in env, "dev mode is per engine (the spec), not the container's"
    # The members keep a compile cache in their own pods; the hosts mount none, so no variable
    # points an engine at a path on the read-only root filesystem.
    assert all(m.compile_cache for m in p.models)
    assert not env & {"XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"}
    mounts = {v["mountPath"] for v in c["volumeMounts"]}
    assert {"/home/warmstart", "/tmp", "/dev/shm"} <= mounts and all(
        not e["value"].startswith("/mnt") for e in c["env"]), c["env"]
    sa = objs[("ServiceAccount", plan.deployment_name)]
    assert sa["metadata"]["annotations"][serving.IRSA_ROLE_ANNOTATION].endswith("-engine-host-irsa")
    assert sa["automountServiceAccountToken"] is False and pod["automountServiceAccountToken"] is False


def test_spares_stay_off_spot():
    cfg_pool = {"types": ["spot", "onDemand"]}
    p = plan_stack(config.parse_config({**pooled_config(), "gpuPools": [
        {"name": "h100", "instanceTypes": ["p5.48xlarge"], "capacity": cfg_pool}],
        "models": [m | {"autoscaling": {"minReplicas": 2, "maxReplicas": 3}} for m in pooled_config()["models"]]}),
        "pooled")
    (plan,) = p.standby_pools
    dep = objects.host_deployment_spec(plan, objects.wiring(plan, p.models, namespace=NS, region="us-east-1",
                                                            api_server_cidrs=["172.20.0.1/32"]))
    (term,) = dep["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}]


def test_each_members_port_on_a_host_admits_that_members_routers_alone():
    p, plan, w, objs = built()
    pol = objs[("NetworkPolicy", plan.deployment_name)]["spec"]
    assert pol["podSelector"]["matchLabels"] == objects.host_selector(POOL)
    supervisor, *members = pol["ingress"]
    assert supervisor == {"from": [{"podSelector": {"matchLabels": objects.actuator_selector(POOL)}}],
                          "ports": [{"port": sp.SUPERVISOR_PORT, "protocol": "TCP"}]}
    assert len(members) == len(MODELS)
    for rule, e in zip(members, plan.engines):
        assert rule == {"from": [{"podSelector": {"matchLabels": network_policy.router_selector(e.model)}}],
                        "ports": [{"port": e.port, "protocol": "TCP"}]}


def test_the_pool_actuator_is_least_privilege_and_reads_its_pool_json():
    p, plan, w, objs = built()
    role = objs[("Role", plan.actuator_name)]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
                             {"apiGroups": ["apps"], "resources": ["deployments/scale"],
                              "resourceNames": [plan.deployment_name], "verbs": ["get", "patch", "update"]}]
    pol = objs[("NetworkPolicy", plan.actuator_name)]["spec"]
    assert pol["ingress"] == [{"from": [network_policy.keda_operator_peer("keda")],
                               "ports": [{"port": standby_mod.FIGURE_PORT, "protocol": "TCP"}]}]
    doc = json.loads(objs[("ConfigMap", plan.actuator_name)]["data"]["pool.json"])
    assert doc["pool"] == POOL and doc["hostDeployment"] == plan.deployment_name and doc["spares"] == 1
    assert doc["hostSelector"] == objects.host_selector(POOL) and doc["maxHosts"] == plan.max_hosts
    assert doc["supervisorPort"] == sp.SUPERVISOR_PORT and doc["sleepLevel"] == plan.sleep_level
    by = {m["model"]: m for m in doc["members"]}
    assert set(by) == set(MODELS)
    for m in p.models:
        d = by[m.name]
        assert (d["port"], d["deployment"], d["selector"]) == (m.pooled.port, m.name, serving.selector(m.name))
        assert d["minReplicas"] == m.autoscaling.min_replicas
        assert (d["frontQueue"] is not None) == (m.autoscaling.min_replicas == 0)
        if d["frontQueue"] is not None:
            assert d["frontQueue"] == {"service": m.name, "selector": network_policy.router_selector(m.name),
                                       "port": 30000}
    args = objs[("Deployment", plan.actuator_name)]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:3] == ["/opt/warmstart-standby/standby.pyz", "--pool-spec", "/etc/warmstart/pool/pool.json"]
    assert objects.figure_url(POOL, NS, "chat-a") == (
        f"http://{plan.actuator_name}.{NS}.svc:{standby_mod.FIGURE_PORT}/warmstart/pods/chat-a")


# --- the node cache on the hosts (issue 38 item 4) ----------------------------------------------------


def staged_built(mode: str = "karpenter"):
    """chat-a staged by the node cache on the hosts' GPU pool, the other three not; level 2 (a wake
    reloads the weights)."""
    cfg = pooled_config(mode, sleepLevel=2)
    cfg["models"][0]["nodeCache"] = "on"
    p = plan_stack(config.parse_config(cfg), "pooled")
    (plan,) = p.standby_pools
    w = objects.wiring(plan, p.models, namespace=NS, region="us-east-1", api_server_cidrs=["172.20.0.1/32"],
                       nvme_mount=placement.NVME_MOUNT[mode])
    return p, plan, w, {(o["kind"], o["metadata"]["name"]): o for o in objects.objects(plan, w)}


@pytest.mark.parametrize("mode", ["karpenter", "auto"])
def test_a_staged_members_engine_reads_its_node_copy_and_the_others_s3(mode, tmp_path):
    p, plan, w, objs = staged_built(mode)
    for o in objs.values():
        kubernetes_validate.validate(o, versions.DEFAULT_KUBERNETES_VERSION, strict=True)
    by = {m.name: m for m in p.models}
    staged = by["chat-a"]
    assert staged.staged and not any(by[m].staged for m in MODELS[1:])
    pod = objs[("Deployment", plan.deployment_name)]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    # The member's node directory, where its staging DaemonSet copies it (the same hostPath as its
    # own pods'), mounted read-only in the one container; none for an unstaged member.
    (vol,) = [v for v in pod["volumes"] if "hostPath" in v]
    assert vol["hostPath"]["path"] == node_cache_decisions.node_weights_root(placement.NVME_MOUNT[mode], "chat-a")
    assert vol["hostPath"]["path"].startswith(placement.NVME_MOUNT[mode] + "/")
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == vol["name"]]
    assert mount["readOnly"] is True and mount["mountPath"] == "/weights/chat-a"
    # The picker's script and the choice folder are mounted too; the picker env is chat-a's alone.
    mounted = {m["mountPath"] for m in c["volumeMounts"]}
    assert {node_cache.SCRIPT_MOUNT, node_cache.CHOICE_MOUNT} <= mounted
    (tmp_path / "spec.json").write_text(objs[("ConfigMap", plan.deployment_name)]["data"]["spec.json"])
    engines = {e.model: e for e in host_spec_file.load(tmp_path / "spec.json").engines}
    a = engines["chat-a"]
    assert a.env["WARMSTART_WEIGHTS_DIGEST"] == staged.weights_digest
    assert a.env["WARMSTART_WEIGHTS_SOURCE"] == staged.source
    assert a.env["WARMSTART_WEIGHTS_PATH"] == f"/weights/chat-a/{staged.weights_digest}"
    assert a.env["WARMSTART_WEIGHTS_ROOT"] == "/weights/chat-a" and a.env["WARMSTART_LOADING_HOLD_S"] == "0"
    assert a.argv[:2] == ("sh", "-c") and node_cache.SELECT_SCRIPT in a.argv[2] and "vllm serve" in a.argv[2]
    # The pool's flags still follow the member's own, as positional arguments of the script.
    assert f"--port={a.port}" in a.argv[4:] and "--enable-sleep-mode" in a.argv[4:]
    for model in MODELS[1:]:
        e = engines[model]
        assert e.argv[:3] == ("vllm", "serve", by[model].source)
        assert not any(k.startswith("WARMSTART_WEIGHTS") for k in e.env)
    # The hosts prefer, never require, the nodes holding chat-a's copy.
    pref = pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert pref == [{"weight": 100, "preference": {"matchExpressions": [
        {"key": node_cache.label_key("chat-a"), "operator": "In", "values": [staged.weights_digest]}]}}]
    # Its wake is planned from the node's NVMe, the others' from S3.
    assert plan.path("chat-a").wake_source == "node NVMe"
    assert {plan.path(m).wake_source for m in MODELS[1:]} == {"S3"}


def test_unstaged_members_mount_no_node_cache_and_a_staged_one_needs_the_node_mount():
    p, plan, w, objs = built()
    pod = objs[("Deployment", plan.deployment_name)]["spec"]["template"]["spec"]
    assert not any("hostPath" in v for v in pod["volumes"])
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in pod["affinity"]["nodeAffinity"]
    spec = json.loads(objs[("ConfigMap", plan.deployment_name)]["data"]["spec.json"])
    assert all(e["argv"][:2] == ["vllm", "serve"] for e in spec["engines"])
    # A plan that counts a wake from the node's NVMe is never rendered onto hosts that do not mount it.
    p, plan, w, _ = staged_built()
    with pytest.raises(ValueError, match="chat-a"):
        objects.objects(plan, dataclasses.replace(w, nvme_mount=None))


def test_a_member_staged_on_another_gpu_pool_is_read_from_s3_on_the_hosts():
    """Its staging DaemonSet runs on its own pool's nodes only: the hosts' nodes hold no copy."""
    cfg = pooled_config(sleepLevel=2)
    cfg["gpuPools"].append({"name": "h100-b", "instanceTypes": ["p5.48xlarge"]})
    cfg["models"][0] |= {"nodeCache": "on", "pool": "h100-b"}
    p = plan_stack(config.parse_config(cfg), "pooled")
    (plan,) = p.standby_pools
    assert next(m for m in p.models if m.name == "chat-a").staged
    assert plan.path("chat-a").wake_source == "S3" and not plan.engine("chat-a").staged
    w = objects.wiring(plan, p.models, namespace=NS, region="us-east-1", api_server_cidrs=["172.20.0.1/32"],
                       nvme_mount=placement.NVME_MOUNT["karpenter"])
    pod = objects.host_deployment_spec(plan, w)["spec"]["template"]["spec"]
    assert not any("hostPath" in v for v in pod["volumes"])
