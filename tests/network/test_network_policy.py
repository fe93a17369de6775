"""NetworkPolicies, pod security contexts and NetworkPolicy enforcement, on the rendered stacks
and on the pure builders."""

from __future__ import annotations

import json

import jsonschema
import kubernetes_validate
import pytest

from tests.support.pod_security import _selects, assert_pod_hardened
from tests.support.stacks import ROOT, render_stack
from warmstart.manifests import gpu_pools, network_policy, serving
from warmstart.manifests import standby as standby_objects
from warmstart.manifests import weights_import as import_job

K8S_VERSION = "1.33"
EKS = "eks:index:Cluster"


def _pods(rendered):
    """(object, pod spec, pod labels) of every workload with a pod template."""
    for obj in rendered.kubernetes_objects:
        if obj["kind"] in ("Deployment", "Job", "DaemonSet", "StatefulSet"):
            tpl = obj["spec"]["template"]
            yield obj, tpl["spec"], tpl["metadata"]["labels"]


def _vllm_deployments(rendered):
    return [d for d in rendered.kind("Deployment")
            if d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/name") == "vllm"]




# ---------------------------------------------------------------------------------------------
# Rendered stacks


def test_every_pod_is_selected_by_a_policy_with_ingress_and_egress(rendered):
    policies = rendered.kind("NetworkPolicy")
    pods = list(_pods(rendered))
    assert pods
    for obj, _, pod_labels in pods:
        mine = [p for p in policies if _selects(p, obj["metadata"]["namespace"], pod_labels)]
        assert mine, f"{obj['kind']} {obj['metadata']['name']} has no NetworkPolicy"
        assert all(set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"} for p in mine)
    for p in policies:
        kubernetes_validate.validate(p, K8S_VERSION, strict=True)


def _vpc_cidrs(rendered) -> list[str]:
    """The VPC blocks the stack's render names (a model stack's come from its platform)."""
    plan = rendered.stack_plan
    return list(plan.contract.vpc_cidrs) if hasattr(plan, "contract") else [plan.config.network.cidr]


def test_serving_pods_accept_only_the_vllm_port_and_send_only_dns_and_https(rendered):
    plans = {m.name: m for m in rendered.stack_plan.models}
    scraped = any(m.autoscaling for m in plans.values())
    for dep in _vllm_deployments(rendered):
        ns, labels = dep["metadata"]["namespace"], dep["spec"]["template"]["metadata"]["labels"]
        (policy,) = [p for p in rendered.kind("NetworkPolicy") if _selects(p, ns, labels)]
        rule, *scrape = policy["spec"]["ingress"]
        assert rule["ports"] == [{"protocol": "TCP", "port": serving.HTTP_PORT}]
        ports = sorted((p["protocol"], p["port"]) for r in policy["spec"]["egress"] for p in r["ports"])
        assert ports == [("TCP", 53), ("TCP", 443), ("UDP", 53)]
        # A routed model's pods take requests from its routers only; an unrouted one's from its
        # own namespace. The managed Prometheus collector, when a model autoscales, reaches only
        # the metrics-only port: an ipBlock of the VPC would admit every pod.
        m = plans[dep["metadata"]["name"]]
        # A standby model's actuator (it calls vLLM's sleep routes) is admitted beside the routers.
        peers = ([{"podSelector": {"matchLabels": network_policy.router_selector(m.name)}}]
                 + ([{"podSelector": {"matchLabels": standby_objects.selector(m.name)}}] if m.standby else [])
                 if m.routed else [{"podSelector": {}}])
        assert rule["from"] == peers
        assert scrape == ([{"from": [{"ipBlock": {"cidr": c}} for c in _vpc_cidrs(rendered)],
                            "ports": [{"protocol": "TCP", "port": serving.METRICS_PORT}]}] if scraped else [])


def test_import_pods_accept_nothing(stack_name):
    rendered = render_stack(stack_name)
    for job in rendered.kind("Job"):
        labels = job["spec"]["template"]["metadata"]["labels"]
        (policy,) = [p for p in rendered.kind("NetworkPolicy") if _selects(p, job["metadata"]["namespace"], labels)]
        assert "Ingress" in policy["spec"]["policyTypes"] and not policy["spec"].get("ingress")
        assert policy["spec"]["egress"] == network_policy.egress_rules()






def test_every_container_is_non_root_read_only_without_capabilities(rendered):
    checked = sum(assert_pod_hardened(obj["metadata"]["name"], spec, labels) for obj, spec, labels in _pods(rendered))
    assert checked


def test_writable_paths_of_the_read_only_vllm_container(rendered):
    for dep in _vllm_deployments(rendered):
        spec = dep["spec"]["template"]["spec"]
        (vllm,) = spec["containers"]
        env = {e["name"]: e.get("value") for e in vllm["env"]}
        mounts = {m["mountPath"]: m["name"] for m in vllm["volumeMounts"]}
        empty = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
        # HOME, /tmp and the working directory are emptyDirs; the user name resolves without
        # /etc/passwd; the caches are under HOME or the compile-cache mount.
        assert mounts[env["HOME"]] in empty and mounts[env["TMPDIR"]] in empty and vllm["workingDir"] == env["HOME"]
        assert env["USER"] and env["LOGNAME"]
        cache = env.get("XDG_CACHE_HOME", env["HOME"])
        assert any(cache == p or cache.startswith(p + "/") for p in mounts)


def test_the_cache_owner_runs_before_anything_writes_the_cache(rendered):
    for dep in rendered.kind("Deployment"):
        inits = dep["spec"]["template"]["spec"].get("initContainers", [])
        names = [c["name"] for c in inits]
        writers = [i for i, c in enumerate(inits) if c["name"] != serving.CACHE_OWNER_CONTAINER and any(
            m["name"] == serving.COMPILE_CACHE_VOLUME and not m.get("readOnly") for m in c.get("volumeMounts", []))]
        if serving.CACHE_OWNER_CONTAINER in names:
            assert all(names.index(serving.CACHE_OWNER_CONTAINER) < i for i in writers)
        else:
            assert not writers


# ---------------------------------------------------------------------------------------------
# Enforcement


def _auto_mode_node_class_validator() -> jsonschema.Draft7Validator:
    schema = json.loads((ROOT / "tests/schemas/eks-auto-mode/nodeclass.eks.amazonaws.com_v1.reconstructed.schema.json")
                        .read_text())
    return jsonschema.Draft7Validator(schema)


def test_enforcement_is_on_in_both_cluster_modes(stack_name):
    rendered = render_stack(stack_name)
    (eks,) = [r.inputs for r in rendered.resources if r.typ == EKS]
    if rendered.stack_plan.cluster_mode == "auto":
        (cm,) = [o for o in rendered.kind("ConfigMap") if o["metadata"]["name"] == "amazon-vpc-cni"]
        assert cm["metadata"]["namespace"] == "kube-system"
        assert cm["data"] == {"enable-network-policy-controller": "true"}
        classes = rendered.kind("NodeClass")
        assert classes and all(c["spec"]["networkPolicy"] == "DefaultAllow" for c in classes)
        for c in classes:
            _auto_mode_node_class_validator().validate(c)
        assert "vpcCniOptions" not in eks
    else:
        assert eks["vpcCniOptions"]["enableNetworkPolicy"] is True
        assert not [o for o in rendered.kind("ConfigMap") if o["metadata"]["name"] == "amazon-vpc-cni"]


def test_the_node_class_field_is_one_the_schema_knows():
    validator = _auto_mode_node_class_validator()
    props = validator.schema["properties"]["spec"]["properties"]
    assert gpu_pools.NETWORK_POLICY_DEFAULT in props["networkPolicy"]["enum"]
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({"apiVersion": "eks.amazonaws.com/v1", "kind": "NodeClass", "metadata": {"name": "x"},
                            "spec": {"role": "r", "subnetSelectorTerms": [{"id": "s"}],
                                     "securityGroupSelectorTerms": [{"id": "g"}], "networkPolicy": "Enforce"}})


# ---------------------------------------------------------------------------------------------
# Pure builders


def test_with_a_router_only_its_pods_and_the_scrapers_reach_vllm():
    router = network_policy.router_selector("m")
    assert router == {"app.kubernetes.io/name": "router", "app.kubernetes.io/instance": "m"}
    p = network_policy.serving_network_policy("m", "ns", router=router, client_namespaces=["apps"],
                                              metrics_cidrs=["10.0.64.0/19", "10.0.32.0/19", "10.0.64.0/19"])
    kubernetes_validate.validate(p, K8S_VERSION, strict=True)
    rule, scrape = p["spec"]["ingress"]
    assert rule == {"from": [{"podSelector": {"matchLabels": router}}], "ports": [{"protocol": "TCP", "port": 8000}]}
    assert scrape == {"from": [{"ipBlock": {"cidr": "10.0.32.0/19"}}, {"ipBlock": {"cidr": "10.0.64.0/19"}}],
                      "ports": [{"protocol": "TCP", "port": serving.METRICS_PORT}]}
    # The policy selects the vLLM pods, not the router's.
    assert p["spec"]["podSelector"]["matchLabels"] == serving.selector("m")
    assert not router.items() <= serving.labels("m").items()


def test_without_a_router_the_namespace_and_the_named_client_namespaces_reach_vllm():
    p = network_policy.serving_network_policy("m", "ns", client_namespaces=["b", "a", "b"])
    (rule,) = p["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {}},
                            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "a"}}},
                            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "b"}}}]
    kubernetes_validate.validate(p, K8S_VERSION, strict=True)


def test_an_empty_router_selector_is_refused():
    # {} would select every pod of the namespace: the opposite of "only the router".
    with pytest.raises(ValueError, match="router selector"):
        network_policy.serving_network_policy("m", "ns", router={})


def test_the_import_policy_selects_the_import_pods_only():
    p = network_policy.weights_import_network_policy("m", "ns")
    kubernetes_validate.validate(p, K8S_VERSION, strict=True)
    sel = p["spec"]["podSelector"]["matchLabels"]
    assert sel.items() <= import_job.labels("m").items()
    assert not sel.items() <= serving.labels("m").items()
    assert not sel.items() <= import_job.labels("other").items()


def test_egress_is_dns_and_https_to_any_address():
    rules = network_policy.egress_rules()
    assert all("to" not in r for r in rules)  # see the module docstring: S3 has no fixed CIDRs
    ports = sorted((p["protocol"], p["port"]) for r in rules for p in r["ports"])
    assert ports == [("TCP", 53), ("TCP", 443), ("UDP", 53)]


def test_a_scraper_cidr_that_is_not_a_network_is_refused():
    with pytest.raises(ValueError, match="not a network"):
        network_policy.serving_network_policy("m", "ns", metrics_cidrs=["10.0.32.7/19"])
    with pytest.raises(ValueError, match="not a network"):
        network_policy.serving_network_policy("m", "ns", metrics_cidrs=["scraper.internal"])


def test_the_egress_only_and_deny_all_shapes():
    sel = {"app.kubernetes.io/name": "warmstart-weights", "app.kubernetes.io/instance": "m"}
    egress = network_policy.egress_only_network_policy("m-weights", "ns", sel)
    deny = network_policy.deny_all_network_policy("p-warm-spare", "ns", sel)
    for p in (egress, deny):
        kubernetes_validate.validate(p, K8S_VERSION, strict=True)
        assert p["spec"]["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in p["spec"]
        assert p["spec"]["podSelector"]["matchLabels"] == sel
    assert egress["spec"]["egress"] == network_policy.egress_rules()
    assert "egress" not in deny["spec"]
    for build in (network_policy.egress_only_network_policy, network_policy.deny_all_network_policy):
        with pytest.raises(ValueError, match="empty pod selector"):
            build("x", "ns", {})
