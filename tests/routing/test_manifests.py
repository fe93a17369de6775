"""The router of a model as objects: when a model gets one, what its command line says (read back
by SMG's own argument parser), whom its RBAC and NetworkPolicies let in and out, where it runs,
and the ModelRouter component under the mocks. Every object is validated against the Kubernetes
schemas of the project's default version."""

from __future__ import annotations

import json
import math
from importlib import metadata

import kubernetes_validate
import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmstart import config, mocks, render, versions
from warmstart.decisions import routing
from warmstart.decisions import placement
from warmstart.errors import ConfigError, ConfigErrors
from warmstart.manifests import routing as router, serving

import components
from components.routing import ModelRouter, ModelRouterArgs, RoutingPolicy

K8S_VERSION = versions.DEFAULT_KUBERNETES_VERSION
KUBECONFIG = json.dumps({"apiVersion": "v1", "kind": "Config", "clusters": [], "contexts": [], "users": []})


def _plan(**kw):
    base = dict(model="llama", namespace="ml", mode="auto", cluster_mode="auto", image=versions.SMG_IMAGE)
    return routing.plan(**(base | kw))


def _vllm_pod_labels(model: str, namespace: str = "ml") -> dict[str, str]:
    """The labels of the model's real vLLM pods, from the VllmModel planner and Deployment builder."""
    m = components.serving.plan(components.VllmModelArgs(
        model_name=model, source="s3://team-models/m", weights_gib=15, instance_type="g6e.2xlarge",
        region="us-east-1", namespace=namespace))
    return serving.deployment_spec(m, namespace, "us-east-1")["spec"]["template"]["metadata"]["labels"]


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _parsed(p: routing.RoutingPlan):
    """The container's arguments as the image's own parser reads them (`python3 -m
    smg.launch_router`, from the same smg wheel), plus the key the entrypoint appends."""
    from smg.launch_router import parse_router_args

    return parse_router_args(router.container_args(p) + ["--control-plane-api-keys", "warmstart:operator:admin:k"])


# --------------------------------------------------------------------------------------
# Whether a model gets a router


@given(st.integers(1, 64), st.one_of(st.none(), st.integers(0, 64)))
def test_auto_routes_exactly_the_models_that_can_have_two_replicas(replicas, max_replicas):
    can_scale_out = replicas > 1 or (max_replicas or 0) > 1
    assert routing.wanted("auto", replicas, max_replicas) is can_scale_out
    assert routing.wanted("none", replicas, max_replicas) is False
    # Asked for by name, a router is rendered even for one replica.
    assert routing.wanted("prefix_hash", replicas, max_replicas) and routing.wanted("round_robin", replicas, max_replicas)


def test_one_replica_without_autoscaling_gets_no_router_unless_asked():
    assert not routing.wanted("auto", 1, None) and not routing.wanted("auto", 1, 1)
    assert routing.wanted("auto", 1, 4) and routing.wanted("auto", 3, None)
    with pytest.raises(ValueError, match="unknown routing mode"):
        routing.wanted("prefix", 3)
    # A policy outside warmstart's set is refused by the config, with its key.
    with pytest.raises(ConfigErrors) as err:
        config.parse_spec(config.RoutingConfig, {"policy": "least_load"}, "warmstart:models[0].routing.")
    assert [e.key for e in err.value.errors] == ["warmstart:models[0].routing.policy"]


@given(st.integers(0, 500), st.integers(1, 16))
def test_routers_together_walk_at_the_fleet_wide_excess(excess, routers):
    per = routing.per_router_threshold(excess, routers)
    assert per >= 1
    # Together the routers never allow less than asked, and at most one request per router more.
    assert per * routers >= excess
    assert per == 1 or (per - 1) * routers < excess
    # More routers, each sees less, so each applies a smaller (never larger) share.
    assert routing.per_router_threshold(excess, routers + 1) <= per


def test_two_routers_each_apply_half_of_smgs_default_margin():
    p = _plan()
    assert p.router_replicas == 2
    a = _parsed(p)
    assert a.prefix_hash_balance_abs_threshold == math.ceil(routing.DEFAULT_MAX_EXCESS_REQUESTS / 2)
    assert a.prefix_hash_load_factor == routing.DEFAULT_LOAD_FACTOR
    one = _parsed(_plan(router_replicas=1))
    assert one.prefix_hash_balance_abs_threshold == routing.DEFAULT_MAX_EXCESS_REQUESTS


# --------------------------------------------------------------------------------------
# The command line, read back by SMG's parser


@pytest.mark.parametrize("namespace", ["ml", "default"])
def test_discovery_watches_exactly_the_models_vllm_pods_on_their_port(namespace):
    p = _plan(namespace=namespace)
    a = _parsed(p)
    assert a.discovery_provider == "kubernetes" and a.backend == "vllm" and a.policy == "prefix_hash"
    assert a.selector == serving.worker_selector("llama"), "the model's pods with an awake engine"
    assert a.service_discovery_namespace == namespace, "a namespaced watch, so a Role suffices"
    assert a.service_discovery_port == serving.HTTP_PORT
    assert _matches(a.selector, _vllm_pod_labels("llama", namespace))
    assert not _matches(a.selector, _vllm_pod_labels("llama-8b", namespace)), "another model's pods"
    assert not _matches(a.selector, router.labels("llama")), "the router's own pods"
    asleep = _vllm_pod_labels("llama", namespace) | {serving.ENGINE_LABEL: "asleep"}
    assert not _matches(a.selector, asleep), "a pod the standby actuator is putting to sleep"


def test_listeners_match_the_container_ports_and_metrics_stay_local_unless_fenced():
    for metrics in ((), ("10.0.0.0/16",)):
        p = _plan(metrics_cidrs=metrics)
        a = _parsed(p)
        c = router.deployment_spec(p)["spec"]["template"]["spec"]["containers"][0]
        ports = {x["name"]: x["containerPort"] for x in c["ports"]}
        assert ports["http"] == a.port and ports["probe"] == a.health_check_port
        assert c["readinessProbe"]["httpGet"]["port"] == c["livenessProbe"]["httpGet"]["port"] == "probe"
        if metrics:
            assert a.prometheus_host == "0.0.0.0" and ports["metrics"] == a.prometheus_port
        else:
            assert a.prometheus_host == "127.0.0.1" and "metrics" not in ports


def test_round_robin_carries_no_prefix_flags():
    a = _parsed(_plan(mode="round_robin"))
    assert a.policy == "round_robin"
    assert "--prefix-hash-load-factor" not in router.container_args(_plan(mode="round_robin"))


# --------------------------------------------------------------------------------------
# The objects


CASES = [dict(cluster_mode=mode, expose=expose, client_cidrs=("10.0.0.0/16",) if expose else (),
              metrics_cidrs=metrics) for mode in ("auto", "karpenter") for expose in (False, True)
         for metrics in ((), ("10.1.0.0/24",))]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['cluster_mode']}-expose{c['expose']}-m{len(c['metrics_cidrs'])}")
def test_every_object_validates_against_the_kubernetes_schemas(case):
    p = _plan(**case)
    objs = router.objects(p) + [router.control_plane_secret_spec(p, "k")]
    for obj in objs:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        assert obj["metadata"]["namespace"] == "ml"
    kinds = sorted(o["kind"] for o in objs)
    assert kinds.count("Service") == (2 if case["expose"] else 1)
    assert not {"ClusterRole", "ClusterRoleBinding"} & set(kinds)


def test_rbac_reads_pods_in_the_namespace_and_nothing_else():
    p = _plan()
    sa, role, binding = router.service_account_spec(p), router.role_spec(p), router.role_binding_spec(p)
    assert role["kind"] == "Role" and role["metadata"]["namespace"] == p.namespace
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": p.namespace}]
    pod = router.deployment_spec(p)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    # The router calls the API, so its token is mounted; warmstart's other accounts keep theirs off.
    assert sa["automountServiceAccountToken"] is True and pod["automountServiceAccountToken"] is True


def test_selectors_pick_router_pods_for_the_endpoint_and_vllm_pods_for_the_fence():
    p = _plan()
    dep = router.deployment_spec(p)
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert pod_labels == {"app.kubernetes.io/name": "router", "app.kubernetes.io/instance": "llama",
                          "app.kubernetes.io/component": "router", "app.kubernetes.io/part-of": "warmstart"}
    assert _matches(dep["spec"]["selector"]["matchLabels"], pod_labels)
    svc = router.service_spec(p)
    assert svc["metadata"]["name"] == "llama", "clients keep the model's Service name"
    assert svc["spec"]["ports"][0]["port"] == serving.HTTP_PORT and svc["spec"]["ports"][0]["targetPort"] == "http"
    for selector in (svc["spec"]["selector"], router.pdb_spec(p)["spec"]["selector"]["matchLabels"]):
        assert _matches(selector, pod_labels) and not _matches(selector, _vllm_pod_labels("llama"))
    assert not _matches(svc["spec"]["selector"], router.labels("llama-8b"))


def test_only_the_router_and_named_scrapers_reach_vllm_serving_port():
    p = _plan(vllm_scrape_cidrs=("10.2.0.0/24",))
    pol = router.vllm_network_policy_spec(p)
    assert _matches(pol["spec"]["podSelector"]["matchLabels"], _vllm_pod_labels("llama"))
    assert not _matches(pol["spec"]["podSelector"]["matchLabels"], _vllm_pod_labels("llama-8b"))
    assert pol["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = pol["spec"]["ingress"]
    assert rule["ports"] == [{"port": serving.HTTP_PORT, "protocol": "TCP"}]
    pods = [s["podSelector"]["matchLabels"] for s in rule["from"] if "podSelector" in s]
    assert pods == [router.selector("llama")]
    assert [s["ipBlock"]["cidr"] for s in rule["from"] if "ipBlock" in s] == ["10.2.0.0/24"]
    assert all("namespaceSelector" not in s for s in rule["from"]), "no other namespace"


@pytest.mark.parametrize("metrics", [(), ("10.1.0.0/24",)])
def test_router_fence_metrics_only_from_named_cidrs_egress_only_to_its_needs(metrics):
    p = _plan(metrics_cidrs=metrics, client_cidrs=("10.0.0.0/16",), expose=True)
    pol = router.router_network_policy_spec(p)
    assert pol["spec"]["podSelector"]["matchLabels"] == router.selector("llama")
    assert set(pol["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    by_port = {r["ports"][0]["port"]: r for r in pol["spec"]["ingress"]}
    serving_sources = by_port[routing.ROUTER_PORT]["from"]
    assert {"podSelector": {}} in serving_sources and {"ipBlock": {"cidr": "10.0.0.0/16"}} in serving_sources
    if metrics:
        assert by_port[routing.METRICS_PORT]["from"] == [{"ipBlock": {"cidr": "10.1.0.0/24"}}]
    else:
        assert routing.METRICS_PORT not in by_port
    assert set(by_port) <= {routing.ROUTER_PORT, routing.PROBE_PORT, routing.METRICS_PORT}
    egress_ports = {(port["port"], port["protocol"]) for r in pol["spec"]["egress"] for port in r["ports"]}
    assert egress_ports == {(serving.HTTP_PORT, "TCP"), (53, "UDP"), (53, "TCP"), (443, "TCP")}
    (to_vllm,) = [r for r in pol["spec"]["egress"] if r["ports"][0]["port"] == serving.HTTP_PORT]
    assert to_vllm["to"] == [{"podSelector": {"matchLabels": serving.selector("llama")}}]


@pytest.mark.parametrize("mode", ["auto", "karpenter"])
def test_routers_run_spread_on_the_non_gpu_nodes_the_import_job_uses(mode):
    # Alone, with no placement given: anywhere off the GPU nodes, by affinity, no warmstart label.
    p = _plan(cluster_mode=mode)
    dep = router.deployment_spec(p)
    pod = dep["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod and pod["affinity"] == placement.off_gpu_affinity()
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {e["key"] for t in terms for e in t["matchExpressions"]} >= {
        placement.gpu_count_label("auto"), placement.gpu_count_label("karpenter"), placement.NVIDIA_GPU_PRESENT_LABEL}
    assert "tolerations" not in pod, "no GPU toleration: never on a GPU node"
    # Given one (a platform's), exactly its selector and tolerations, as the import Job gets them.
    given = placement.NonGpuPlacement((("node-role", "cpu"),), (placement.Toleration("dedicated", "Equal", "cpu",
                                                                                     "NoSchedule"),))
    pod = router.deployment_spec(_plan(cluster_mode=mode, non_gpu=given))["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"node-role": "cpu"} and "affinity" not in pod
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "cpu", "effect": "NoSchedule"}]
    assert dep["spec"]["replicas"] == 2
    (host,) = [t for t in pod["topologySpreadConstraints"] if t["topologyKey"] == "kubernetes.io/hostname"]
    assert host["whenUnsatisfiable"] == "DoNotSchedule" and host["maxSkew"] == 1
    assert host["labelSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert router.pdb_spec(p)["spec"]["maxUnavailable"] == 1


def test_router_container_is_locked_down_and_pinned():
    p = _plan()
    pod = router.deployment_spec(p)["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert {"cpu", "memory"} <= set(c["resources"]["requests"])
    assert c["image"] == versions.SMG_IMAGE and not c["image"].endswith(":latest")
    # The image tag is the version of the wheel the routing tests run.
    assert versions.SMG_IMAGE.rsplit(":", 1)[1] == versions.SMG_VERSION == metadata.version("smg")
    # The control-plane key comes from an optional Secret's volume, never from the object itself.
    (key_env,) = [e for e in c["env"] if e["name"] == router.CONTROL_PLANE_KEY_FILE_ENV]
    (vol,) = [v for v in pod["volumes"] if v["name"] == router.CONTROL_PLANE_VOLUME]
    assert vol["secret"]["optional"] is True
    assert key_env["value"].startswith(router.CONTROL_PLANE_KEY_DIR + "/")
    assert "--control-plane-api-keys" not in c["args"] and "--control-plane-api-keys" in c["command"][2]
    # SMG drains for its grace period plus 5 s of listener settling; Kubernetes waits longer.
    assert pod["terminationGracePeriodSeconds"] > routing.SHUTDOWN_GRACE_SECONDS + routing.DRAIN_SETTLE_SECONDS


@pytest.mark.parametrize("mode", ["auto", "karpenter"])
def test_internal_load_balancer_in_both_modes(mode):
    p = _plan(cluster_mode=mode, expose=True, client_cidrs=("10.0.0.0/16",))
    lb = router.load_balancer_service_spec(p)
    ann = lb["metadata"]["annotations"]
    assert lb["spec"]["type"] == "LoadBalancer" and lb["spec"]["selector"] == router.selector("llama")
    if mode == "auto":
        assert lb["spec"]["loadBalancerClass"] == "eks.amazonaws.com/nlb"
        assert ann["service.beta.kubernetes.io/aws-load-balancer-scheme"] == "internal"
    else:
        assert "loadBalancerClass" not in lb["spec"]
        assert ann["service.beta.kubernetes.io/aws-load-balancer-internal"] == "true"
    assert "internet-facing" not in json.dumps(lb)
    assert not any(o["spec"].get("type") == "LoadBalancer" for o in router.objects(_plan(cluster_mode=mode))
                   if o["kind"] == "Service"), "off by default"


@pytest.mark.parametrize("kw, key, rule", [
    ({"expose": True}, "routing.clientCidrs", "expose is on"),
    ({"load_factor": 0.9}, "routing.loadFactor", ">= 1.0"),
    ({"waiting_requests": 0}, "routing.waitingRequests", ">= 1"),
    ({"metrics_cidrs": ("10.0.0.300/24",)}, "routing.metricsCidrs[0]", "not a CIDR"),
    ({"mode": "none"}, "routing.mode", "for a router"),
    ({"api_server_cidrs": ()}, "routing.apiServerCidrs", "Kubernetes API"),
])
def test_bad_router_inputs_name_the_key_and_the_rule(kw, key, rule):
    with pytest.raises(ConfigErrors) as err:
        _plan(**kw)
    text = str(err.value)
    assert key in text and rule in text and "fix:" in text, text


# --------------------------------------------------------------------------------------
# The component under the mocks


def _router_alone(**overrides):
    args = ModelRouterArgs(model_name="llama", namespace="ml", kubeconfig=KUBECONFIG) | overrides  # type: ignore[operator]
    built: dict = {}

    def program():
        built["r"] = ModelRouter("llama", args)
        built["r"].endpoint.apply(lambda v: built.setdefault("endpoint", v))

    resources = mocks.run(program, region="us-east-1", stack="alone")
    return built["r"], resources, built.get("endpoint")


def test_the_component_registers_the_planned_objects_and_exposes_the_endpoint():
    r, resources, endpoint = _router_alone(cluster_mode=components.ClusterMode.KARPENTER)
    objs = [x.inputs for x in resources if render.is_kubernetes_object(x)]
    for obj in objs:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    assert sorted((o["kind"], o["metadata"]["name"]) for o in objs) == sorted(
        (o["kind"], o["metadata"]["name"]) for o in router.objects(r.plan))
    (dep,) = [o for o in objs if o["kind"] == "Deployment"]
    assert dep["spec"] == json.loads(json.dumps(router.deployment_spec(r.plan)["spec"]))
    assert dep["spec"]["template"]["spec"]["affinity"] == placement.off_gpu_affinity()
    (provider,) = [x for x in resources if x.typ == "pulumi:providers:kubernetes"]
    assert all(x.provider and provider.urn in x.provider for x in resources if render.is_kubernetes_object(x))
    (comp,) = [x for x in resources if x.typ == "warmstart:index:ModelRouter"]
    assert comp.name == "llama"
    assert not [x for x in resources if x.typ == "kubernetes:core/v1:Secret"], "no key given, no Secret"
    assert endpoint == "http://llama.ml.svc:8000/v1", "the model's URL, unchanged by the router"


def test_a_given_control_plane_key_reaches_the_pods_only_through_its_secret():
    r, resources, _ = _router_alone(control_plane_api_key="not-in-the-deployment", routing={"policy": "round_robin"})
    (secret,) = [x.inputs for x in resources if x.typ == "kubernetes:core/v1:Secret"]
    assert secret["metadata"]["name"] == router.control_plane_secret_name("llama")
    (dep,) = [x.inputs for x in resources if x.typ == "kubernetes:apps/v1:Deployment"]
    assert "not-in-the-deployment" not in json.dumps(dep)
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    (vol,) = [v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == router.CONTROL_PLANE_VOLUME]
    assert vol["secret"]["secretName"] == secret["metadata"]["name"]
    assert r.plan.policy == "round_robin"


def test_without_the_vllm_fence_only_the_routers_own_policy_is_registered():
    _, resources, _ = _router_alone(fence_vllm=False)
    policies = [x.inputs for x in resources if x.typ == "kubernetes:networking.k8s.io/v1:NetworkPolicy"]
    assert [p["spec"]["podSelector"]["matchLabels"] for p in policies] == [router.selector("llama")]


def test_the_component_names_the_arg_it_cannot_use():
    with pytest.raises(ConfigErrors, match="ModelRouterArgs.clientCidrs"):
        _router_alone(routing={"internal_load_balancer": True})


def _router_plan(**overrides):
    return components.routing.plan(ModelRouterArgs(model_name="llama", namespace="ml") | overrides)  # type: ignore[operator]


@pytest.mark.parametrize("routing_section, key", [
    ({"policy": "none"}, "ModelRouterArgs.routing.policy"),
    ({"policy": "least_load"}, "ModelRouterArgs.routing.policy"),
    ({"load_factor": 0.9}, "ModelRouterArgs.routing.loadFactor"),
    ({"max_excess_requests": -1}, "ModelRouterArgs.routing.maxExcessRequests"),
    ({"load_factor": float("inf")}, "ModelRouterArgs.routing.loadFactor"),
])
def test_the_routing_sections_errors_are_keyed_by_the_nested_key(routing_section, key):
    with pytest.raises(ConfigErrors) as err:
        _router_plan(routing=routing_section)
    assert [e.key for e in err.value.errors] == [key]


def test_a_routers_auto_policy_is_prefix_hash_and_the_sections_defaults_are_the_configs():
    p = _router_plan(routing={"policy": "auto"})
    assert p == _router_plan() and p.policy == "prefix_hash"
    d = config.RoutingConfig()
    assert (p.expose, p.load_factor, p.max_excess_requests) == (False, d.load_factor, d.max_excess_requests)


def test_the_flat_keys_of_before_plan_what_the_section_plans_with_a_warning(monkeypatch):
    import pulumi

    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda msg, resource=None, **_: warned.append(msg))
    cidrs = {"client_cidrs": ["10.0.0.0/16"]}
    nested = _router_plan(routing={"policy": "round_robin", "load_factor": 1.5, "max_excess_requests": 2,
                                   "internal_load_balancer": True}, **cidrs)
    assert warned == []
    flat = _router_plan(policy=RoutingPolicy.ROUND_ROBIN, load_factor=1.5, max_excess_requests=2, expose=True, **cidrs)
    assert flat == nested and (flat.policy, flat.expose, flat.max_excess_requests) == ("round_robin", True, 2)
    assert len(warned) == 1 and "ModelRouterArgs: internalLoadBalancer, loadFactor" in warned[0]
    # Flat, an error keeps the key it had at the top of the Args.
    with pytest.raises(ConfigErrors) as err:
        _router_plan(load_factor=0.5)
    assert [e.key for e in err.value.errors] == ["ModelRouterArgs.loadFactor"]
    with pytest.raises(ConfigError, match="ModelRouterArgs.loadFactor"):
        _router_plan(load_factor=1.5, routing={"policy": "round_robin"})
    with pytest.raises(ConfigErrors) as err:
        _router_plan(expose="sometimes")
    assert [e.key for e in err.value.errors] == ["ModelRouterArgs.expose"]
