"""Who can reach whom over the whole render of every stack (issue 20): the flow table of
tests/support/reachability.py, evaluated as the AWS network-policy agent enforces NetworkPolicy,
on every stack in stacks/, on held-back variants, on broken copies of each finding; and the
evaluator itself on tiny hand-written policies."""

from __future__ import annotations

import copy
import functools
import ipaddress
import itertools

import pytest

from tests.support import reachability as R
from tests.support import renders
from tests.support.renders import EXAMPLE_NAMES
from tests.support.stacks import (
    ALL_STACK_NAMES,
    load_stack_doc,
    render_doc,
    render_stack,
)
from warmstart import mocks
from warmstart.decisions import network

ROWS = {R.flow_id(row): row for row in R.FLOWS}

# (stack, flow) pairs the render on main gets wrong, pending the lead's fixes: delete an entry
# when its fix is merged (strict xfail turns a fixed pair into a failure until then).
PENDING: dict[tuple[str, str], str] = {}


def _params(stacks):
    return [pytest.param(s, f, id=f"{s}:{f}", marks=[pytest.mark.xfail(strict=True, reason=PENDING[s, f])]
                         if (s, f) in PENDING else []) for s in stacks for f in ROWS]


def _assert_flow(stack: R.Stack, flow: str) -> None:
    violations = R.check(stack, [ROWS[flow]])
    assert not violations, "\n".join(map(str, violations))


@functools.cache
def shipped(name: str) -> R.Stack:
    """A stack of stacks/ as endpoints, on its whole cluster: its platform's objects (policies,
    pods) and every model stack of that platform in stacks/, together."""
    r = render_stack(name)
    platform = renders.platform_of(r) or r
    renders_ = [platform] + [render_stack(s) for s in renders.model_stacks_of(platform.stack_plan.stack)]
    objects = [o for x in renders_ for o in x.kubernetes_objects]
    hub = set().union(*(R.hub_models(x.stack_plan) for x in renders_))
    return R.stack_model(name, r, renders.platform_of(r), objects=objects, hub_imports=hub)


@pytest.mark.parametrize(("stack", "flow"), _params(ALL_STACK_NAMES))
def test_shipped_stack_flow(stack, flow):
    _assert_flow(shipped(stack), flow)


@functools.cache
def example(name: str) -> R.Stack:
    """An example (components alone on a cluster the user has), checked with its own facts: its
    PlatformArgs' VPC blocks, Service range and cluster mode (its network is not in the program;
    pods get addresses in two subnets of its first block)."""
    program, raw = renders.example(name)
    mode, vpcs, service = renders.example_facts(raw)
    first = ipaddress.ip_network(vpcs[0])
    subnets = list(first.subnets(new_prefix=min(32, first.prefixlen + 3)))[:2]
    net = R.Network([ipaddress.ip_network(c) for c in vpcs], subnets, [], ipaddress.ip_network(service),
                    mode == "auto")
    return R.stack_model(f"examples/{name}", program, network=net)


def test_an_example_is_checked_with_its_own_facts():
    """model-on-existing-platform's cluster is a Karpenter cluster on 10.40.0.0/16 with the
    172.20.0.0/16 Service range (its PlatformArgs), not the shipped stacks' Auto Mode VPC."""
    st = example("model-on-existing-platform")
    _, raw = renders.example("model-on-existing-platform")
    platform = renders.example_platform(raw)
    assert platform is not None
    blocks = [ipaddress.ip_network(c) for c in platform["vpc_cidrs"]]
    assert all(any(e.ip in b for b in blocks) for e in st.sources if e.namespace)
    assert st.api.cluster_ip in ipaddress.ip_network(platform["service_cidr"])
    assert not isinstance(st.dns, R.Endpoint)  # Karpenter mode: CoreDNS pods behind kube-dns


@pytest.mark.parametrize(("name", "flow"), _params(EXAMPLE_NAMES))
def test_example_flow(name, flow):
    _assert_flow(example(name), flow)


# ---------------------------------------------------------------------------------------------
# Held-back variants of prod (Karpenter, a routed autoscaled model, the managed collector)

VPC = "vpc-0a1b2c3d4e5f60718"
# An existing VPC outside 10.0.0.0/16, with a secondary CIDR block holding one private subnet.
VPC_CIDRS = ("172.31.0.0/16", "100.64.0.0/16")
SUBNETS = {"subnet-0a1b2c3d4e5f60711": "172.31.0.0/19", "subnet-0a1b2c3d4e5f60712": "172.31.32.0/19",
           "subnet-0a1b2c3d4e5f60713": "100.64.0.0/19"}
PROMETHEUS = ("monitoring", {"app.kubernetes.io/name": "prometheus", "prometheus": "k8s"})


def _existing_vpc(doc):
    doc["config"]["warmstart:network"] = {"vpcId": VPC, "privateSubnetIds": list(SUBNETS),
                                          "privateRouteTableIds": ["rtb-0a1b2c3d4e5f60711"]}


def _two_routed(doc):
    first, second = doc["config"]["warmstart:models"][:2]
    first["routing"] = {"internalLoadBalancer": True}
    second["autoscaling"] = {"minReplicas": 1, "maxReplicas": 2}
    # room for two models' routers on the system group (issue 20 finding 3 is not this check's)
    doc["config"]["warmstart:cluster"] = {"systemNodeGroup": {"instanceTypes": ["m7i.2xlarge"], "size": 3}}


def _named_prometheus(doc):
    doc["config"]["warmstart:monitoring"] = {
        "prometheusUrl": "http://prometheus-operated.monitoring.svc:9090",
        "scraper": {"namespace": PROMETHEUS[0], "podLabels": PROMETHEUS[1]}}


def _standby_from_zero(doc):
    # prod's standby model at minReplicas 0: only the sleeper, and a front queue in each router pod
    doc["config"]["warmstart:models"][0]["autoscaling"]["minReplicas"] = 0


def _zero_pods(doc):
    # prod's autoscaled model without standby at minReplicas 0: zero pods, KEDA reads the front queues
    model = doc["config"]["warmstart:models"][0]
    model.pop("standby")
    model["autoscaling"]["minReplicas"] = 0


VARIANTS = {"existing-vpc": _existing_vpc, "two-routed-karpenter": _two_routed, "named-prometheus": _named_prometheus,
            "standby-from-zero": _standby_from_zero, "zero-pods": _zero_pods}


_variants: dict[str, tuple] = {}


def variant(name: str, tmp_path_factory, objects=None) -> R.Stack:
    """A variant as endpoints (with `objects` in place of its render's Kubernetes objects)."""
    if name not in _variants:
        doc = copy.deepcopy(load_stack_doc("prod"))
        VARIANTS[name](doc)
        with pytest.MonkeyPatch.context() as mp:
            # As AWS would answer for the existing VPC: its CIDR blocks, the secondary one too.
            mp.setitem(mocks.EXISTING_VPCS, VPC, list(VPC_CIDRS))
            r = render_doc(doc, tmp_path_factory.mktemp(name), name)
        net = R.network_of(r, vpc_cidrs=VPC_CIDRS, subnet_cidrs=SUBNETS) if name == "existing-vpc" else None
        _variants[name] = (r, net)
    r, net = _variants[name]
    return R.stack_model(name, r, network=net, objects=objects)


@pytest.mark.parametrize(("name", "flow"), _params(VARIANTS))
def test_variant_flow(name, flow, tmp_path_factory):
    _assert_flow(variant(name, tmp_path_factory), flow)


def test_the_variants_are_what_they_claim(tmp_path_factory):
    vpc = variant("existing-vpc", tmp_path_factory)
    blocks = [ipaddress.ip_network(c) for c in VPC_CIDRS]
    assert all(any(e.ip in b for b in blocks) for e in vpc.sources if e.namespace)
    assert {e.ip in blocks[1] for e in vpc.sources if e.role == "scraper"} == {True, False}
    assert not any(b.overlaps(ipaddress.ip_network("10.0.0.0/16")) for b in blocks)
    # the render read the VPC's blocks from the answers above (finding 5's fix), both of them
    named = {peer["ipBlock"]["cidr"] for p in vpc.cluster.policies for r in p["spec"].get("ingress", [])
             for peer in r.get("from", []) if "ipBlock" in peer}
    assert set(VPC_CIDRS) <= named
    two = variant("two-routed-karpenter", tmp_path_factory)
    assert len({e.model for e in two.sources if e.role == "router"}) == 2 and two.exposed
    assert not isinstance(two.dns, R.Endpoint)  # Karpenter mode: CoreDNS pods behind kube-dns


def test_the_named_prometheus_is_read_from_the_config(tmp_path_factory):
    prometheus = [e for e in variant("named-prometheus", tmp_path_factory).sources if e.role == "scraper"]
    assert [(e.namespace, dict(e.labels)) for e in prometheus] == [PROMETHEUS]


def test_every_flow_is_exercised_somewhere(tmp_path_factory):
    """No row of the table is vacuous over the shipped stacks and the variants."""
    stacks = [shipped(s) for s in ALL_STACK_NAMES] + [variant(v, tmp_path_factory) for v in VARIANTS]
    for flow, (_, srcs, dsts, _, _) in ROWS.items():
        assert any(R.members(st, srcs, m) and R.members(st, dsts, m) for st in stacks for m in st.models), flow


# ---------------------------------------------------------------------------------------------
# A broken copy of each finding fails the check, naming stack, flow, source, destination, port


def _broken(stack_name: str, edit) -> list[R.Violation]:
    r = render_stack(stack_name)
    objects = copy.deepcopy(r.kubernetes_objects)
    for o in objects:
        if o["kind"] == "NetworkPolicy":
            edit(o)
    return R.check(R.stack_model(stack_name, r, renders.platform_of(r), objects=objects))


def _selects(policy, name):
    return (policy["spec"]["podSelector"].get("matchLabels") or {}).get(R.NAME) == name


def _network(stack_name) -> R.Network:
    r = render_stack(stack_name)
    return R.network_of(r, renders.platform_of(r))


def _replace_egress(policy, covers, rule):
    """Drop the egress rules that could carry `covers` (a port), put `rule` in their place."""
    def carries(r):
        return not r.get("ports") or any(p.get("port") in (covers, None) for p in r["ports"])
    policy["spec"]["egress"] = [r for r in policy["spec"].get("egress") or [] if not carries(r)] + [rule]


def _found(violations, stack, flow, source, destination, port):
    hits = [v for v in violations if (v.stack, v.flow, v.source, v.destination, v.port)
            == (stack, flow, source, destination, port)]
    assert hits, "\n".join(map(str, violations)) or "no violation"
    return hits[0]


@pytest.mark.parametrize(("stack", "model"), [("prod", "qwen-67b"), ("staging-llama-3-1-8b", "llama-3-1-8b")])
def test_router_api_egress_to_the_vpc_cidr_only_fails(stack, model):
    net = _network(stack)

    def edit(p):
        if _selects(p, "router"):
            _replace_egress(p, 443, {"to": [{"ipBlock": {"cidr": str(net.vpc_cidrs[0])}}], "ports": [tcp(443)]})
    v = _found(_broken(stack, edit), stack, "routers -> api-server (https)", f"inference/{model}-router",
               "Service default/kubernetes", "443/TCP")
    assert f"egress to {net.service_cidr.network_address + 1}:443/TCP" in v.why and v.must == "allow"


@pytest.mark.parametrize(("stack", "model"), [("prod", "qwen-67b"), ("staging-llama-3-1-8b", "llama-3-1-8b")])
def test_router_api_egress_to_the_vpc_and_the_whole_service_range_fails(stack, model):
    """The router's API egress before it was the ClusterIP's /32: every VPC block and the whole
    Service range on 443. The routers still reach the API, and also what they need not."""
    net = _network(stack)

    def edit(p):
        if _selects(p, "router"):
            _replace_egress(p, 443, {"to": [{"ipBlock": {"cidr": str(c)}} for c in (net.service_cidr, *net.vpc_cidrs)],
                                     "ports": [tcp(443)]})
    violations = _broken(stack, edit)
    flow = "routers -> not-the-api (https)"
    assert not [v for v in violations if v.flow == "routers -> api-server (https)"]
    for destination in ("EKS API endpoint ENI, dialled directly", "another ClusterIP of the Service range",
                        "a VPC client outside the cluster"):
        v = _found(violations, stack, flow, f"inference/{model}-router", destination, "443/TCP")
        assert v.must == "deny"


def test_vllm_port_admitting_the_vpc_cidr_fails():
    cidr = str(_network("prod").vpc_cidrs[0])

    def edit(p):
        if _selects(p, "vllm"):
            p["spec"].setdefault("ingress", []).append(
                {"from": [{"ipBlock": {"cidr": cidr}}], "ports": [tcp(8000)]})
    violations = _broken("prod", edit)
    for source in ("elsewhere/another-pod", "inference/another-pod", "a VPC client outside the cluster"):
        v = _found(violations, "prod", "all-but-routers -> routed-vllm (http)", source, "inference/qwen-67b",
                   "http/TCP")
        assert v.must == "deny" and v.why == ""
    _found(violations, "prod", "outsiders -> vllm (http)", "elsewhere/another-pod", "inference/llama-4-scout",
           "http/TCP")


def test_a_front_queue_without_its_keda_row_fails(tmp_path_factory):
    """Zero pods: without the router policy's row for KEDA's operator, KEDA cannot read the held
    requests it scales from zero on."""
    variant("zero-pods", tmp_path_factory)  # rendered once, then its objects edited
    objects = copy.deepcopy(_variants["zero-pods"][0].kubernetes_objects)
    for p in objects:
        if p["kind"] == "NetworkPolicy" and _selects(p, "router"):
            p["spec"]["ingress"] = [r for r in p["spec"]["ingress"]
                                    if not any("namespaceSelector" in peer for peer in r.get("from", []))]
    v = _found(R.check(variant("zero-pods", tmp_path_factory, objects=objects)), "zero-pods",
               "keda-operator -> from-zero-routers (http)", "keda/keda-operator", "inference/qwen-67b-router",
               "http/TCP")
    assert v.must == "allow" and "ingress from" in v.why


def test_policies_naming_the_default_cidr_in_an_existing_vpc_fail(tmp_path_factory):
    objects = copy.deepcopy(variant("existing-vpc", tmp_path_factory).cluster.policies)
    for p in objects:  # finding 5: every ipBlock of the VPC's blocks back to the default 10.0.0.0/16
        for rule in p["spec"].get("ingress", []) + p["spec"].get("egress", []):
            for peer in rule.get("from", []) + rule.get("to", []):
                if peer.get("ipBlock", {}).get("cidr") in VPC_CIDRS:
                    peer["ipBlock"] = {"cidr": "10.0.0.0/16"}
    others = [o for o in _variants["existing-vpc"][0].kubernetes_objects if o["kind"] != "NetworkPolicy"]
    violations = R.check(variant("existing-vpc", tmp_path_factory, objects=others + objects))
    v = _found(violations, "existing-vpc", "scrapers -> scraped-routers (metrics)",
               "AMP managed collector ENI in 172.31.0.0/19", "inference/qwen-67b-router", "metrics/TCP")
    assert "ingress from 172.31.31.251 on 29000/TCP" in v.why


def _dns_to_kube_dns_pods(p):
    if _selects(p, "router"):
        _replace_egress(p, 53, {"to": [{"namespaceSelector": {"matchLabels": {R.NAME_LABEL: "kube-system"}},
                                        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                                "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]})


def test_router_dns_to_kube_dns_pods_fails_on_auto_mode_only():
    stack = "staging-llama-3-1-8b"
    violations = _broken(stack, _dns_to_kube_dns_pods)
    for proto in ("UDP", "TCP"):
        _found(violations, stack, "routers -> dns (dns)", "inference/llama-3-1-8b-router",
               "node-local DNS (Auto Mode)", f"53/{proto}")
    # In Karpenter mode the controller adds the kube-dns ClusterIP: the selector matches its Service.
    assert not [v for v in _broken("prod", _dns_to_kube_dns_pods) if v.flow == "routers -> dns (dns)"]


# ---------------------------------------------------------------------------------------------
# The evaluator on tiny hand-written policies

NET = ipaddress.ip_network("10.0.0.0/16")
PUBLIC = ipaddress.ip_address("198.51.100.1")
_IPS: dict[tuple[str, str], ipaddress.IPv4Address] = {}
_NEXT = itertools.count(10)


def pod(name, ns="app", ports=(), **labels):
    ip = _IPS.setdefault((ns, name), NET.network_address + next(_NEXT))
    return R.Endpoint(f"{ns}/{name}", ip, name, ns, {"name": name, **labels}, list(ports))


def tcp(port):
    return {"port": port, "protocol": "TCP"}


def to_pods(ports=(), **labels):
    return {"to": [{"podSelector": {"matchLabels": labels}}], "ports": list(ports)}


def egress(selects, *rules, ns="app"):
    """A policy isolating `selects` for egress only, with `rules`."""
    return {"metadata": {"name": f"{selects}-egress", "namespace": ns},
            "spec": {"podSelector": {"matchLabels": {"name": selects}}, "policyTypes": ["Egress"],
                     "egress": list(rules)}}


def ingress(selects, *rules, ns="app", name=None):
    """A policy isolating `selects` for ingress only, with `rules`."""
    return {"metadata": {"name": name or f"{selects}-ingress", "namespace": ns},
            "spec": {"podSelector": {"matchLabels": {"name": selects}}, "policyTypes": ["Ingress"],
                     "ingress": list(rules)}}


A, B = pod("a"), pod("b", ports=[("http", 8000, "TCP")], tier="x")
SVC = R.Service("b", "app", ipaddress.ip_address("172.20.0.100"), {"name": "b", "tier": "x"},
                [("http", 80, "http", "TCP")])
API = R.Service("kubernetes", "default", ipaddress.ip_address("172.20.0.1"), None, [("https", 443, 443, "TCP")],
                [R.Endpoint("api", ipaddress.ip_address("10.0.0.5"), "api")])


def test_a_service_is_judged_on_its_cluster_ip_before_dnat():
    c = R.Cluster([egress("a", {"to": [{"ipBlock": {"cidr": f"{B.ip}/32"}}], "ports": [tcp(8000)]})], [A, B], [SVC])
    assert c.reach(A, B, "http") == ""  # the pod's own address is allowed ...
    assert "egress to 172.20.0.100:80/TCP" in c.reach(A, SVC, "http")  # ... its Service's ClusterIP is not


def test_a_selector_peer_adds_the_cluster_ip_of_a_service_it_matches():
    # the Service port whose targetPort is the rule's (named) port
    assert R.Cluster([egress("a", to_pods([{"port": "http", "protocol": "TCP"}], name="b"))], [A, B], [SVC]).reach(
        A, SVC, "http") == ""
    # a numeric rule port: the Service's named targetPort resolves on B to it
    assert R.Cluster([egress("a", to_pods([tcp(8000)], name="b"))], [A, B], [SVC]).reach(A, SVC, "http") == ""
    # ... unless on another backend the name leads to a port the rule does not allow: then the
    # ClusterIP is left out (hasTargetPortBypass), though the allowed pod itself stays reachable
    odd = R.Endpoint("app/b-odd", NET.network_address + 250, "b", "app", B.labels, [("http", 9000, "TCP")])
    c = R.Cluster([egress("a", to_pods([tcp(8000)], name="b"))], [A, B, odd], [SVC])
    assert c.reach(A, SVC, "http") != "" and c.reach(A, B, "http") == ""
    # the peer's selector is matched against the Service's selector as labels: a peer asking for a
    # label the Service's selector lacks selects the pods, not the Service
    extra = pod("b2", ports=B.ports, tier="x", extra="y")
    svc = R.Service("b2", "app", ipaddress.ip_address("172.20.0.101"), {"name": "b2", "tier": "x"}, SVC.ports)
    c = R.Cluster([egress("a", to_pods(name="b2", tier="x", extra="y"))], [A, extra], [svc])
    assert c.reach(A, extra, "http") == "" and c.reach(A, svc, "http") != ""
    # a Service without a selector (`default/kubernetes`) is matched by no labelled peer
    c = R.Cluster([egress("a", {"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"name": "b"}}}],
                                "ports": [tcp(443)]})], [A, B], [API])
    assert c.reach(A, API, 443) != ""


def test_a_namespace_peer_without_pod_selector_adds_a_selectorless_service():
    # getMatchingServiceClusterIPs: an absent podSelector is the empty selector, which matches the
    # empty label set of a Service without a selector, such as `default/kubernetes`
    peer = {"namespaceSelector": {"matchLabels": {R.NAME_LABEL: "default"}}}
    assert R.Cluster([egress("a", {"to": [peer], "ports": [tcp(443)]})], [A], [API]).reach(A, API, 443) == ""
    assert R.Cluster([egress("a", {"to": [peer], "ports": [tcp(8443)]})], [A], [API]).reach(A, API, 443) != ""


def test_an_ip_block_matches_pods_of_every_namespace():
    other = pod("c", ns="elsewhere")
    c = R.Cluster([ingress("b", {"from": [{"ipBlock": {"cidr": str(NET)}}], "ports": [tcp(8000)]})], [A, B, other])
    assert c.reach(other, B, "http") == ""
    block = {"cidr": str(NET), "except": [f"{other.ip}/32"]}
    c = R.Cluster([ingress("b", {"from": [{"ipBlock": block}], "ports": [tcp(8000)]})], [A, B, other])
    assert c.reach(other, B, "http") != "" and c.reach(A, B, "http") == ""


def test_default_deny_once_selected_per_direction():
    stranger = pod("c")
    c = R.Cluster([ingress("b", {"from": [{"podSelector": {"matchLabels": {"name": "a"}}}]})], [A, B, stranger])
    assert c.reach(stranger, B, "http") != ""  # isolated for ingress
    assert c.reach(A, B, "http") == ""
    assert c.reach(B, A, 1234) == ""  # B's egress and A's ingress are not isolated
    # policyTypes absent: Ingress, plus Egress only when the policy has egress rules
    c = R.Cluster([{"metadata": {"name": "p", "namespace": "app"}, "spec": {"podSelector": {}}}], [A, B])
    assert c.reach(A, B, "http") != "" and c.egress(A, B.ip, 8000, "TCP") == ""


def test_policies_add_up():
    stranger = pod("c")

    def allow(who):
        return ingress("b", {"from": [{"podSelector": {"matchLabels": {"name": who}}}]}, name=f"from-{who}")
    c = R.Cluster([allow("a"), allow("c")], [A, B, stranger])
    assert c.reach(A, B, "http") == "" and c.reach(stranger, B, "http") == ""
    assert R.Cluster([allow("a")], [A, B, stranger]).reach(stranger, B, "http") != ""


def test_no_to_is_every_destination_and_no_ports_every_port():
    c = R.Cluster([egress("a", {"ports": [tcp(443)]}, {"to": [{"ipBlock": {"cidr": "192.0.2.0/24"}}]})], [A])
    assert c.egress(A, PUBLIC, 443, "TCP") == ""
    assert c.egress(A, PUBLIC, 80, "TCP") != ""
    assert c.egress(A, ipaddress.ip_address("192.0.2.9"), 80, "UDP") == ""


def test_named_ports_resolve_against_the_pods_container_ports():
    router = pod("r", ports=[("http", 30000, "TCP"), ("metrics", 29000, "TCP")])
    c = R.Cluster([ingress("r", {"ports": [{"port": "http", "protocol": "TCP"}]})], [A, router])
    assert c.reach(A, router, "http") == "" and c.reach(A, router, 30000) == ""
    assert c.reach(A, router, "metrics") != ""
    # egress: a named port resolves per destination pod, and never for a CIDR
    c = R.Cluster([egress("a", {"to": [{"podSelector": {}}, {"ipBlock": {"cidr": "0.0.0.0/0"}}],
                                "ports": [{"port": "metrics", "protocol": "TCP"}]})], [A, router])
    assert c.reach(A, router, "metrics") == "" and c.reach(A, router, "http") != ""
    assert c.egress(A, PUBLIC, 29000, "TCP") != ""


def test_the_service_cidr_default_follows_the_vpc():
    def default(*cidrs):
        return network.default_service_cidr(list(cidrs))
    assert default("10.0.0.0/16") == "172.20.0.0/16"
    assert default("172.31.0.0/16") == "10.100.0.0/16"
    assert default("172.31.0.0/16", "10.8.0.0/16") == "172.20.0.0/16"


def test_snat_through_a_nodeport_would_void_an_exposed_routers_client_fence(tmp_path_factory):
    """The agent admits a node's own IP on every port of the pods on it. Karpenter mode's NLB has
    instance targets: with `externalTrafficPolicy: Cluster` kube-proxy SNATs each client to the
    receiving node's IP, so a client reaches the router on any port, past `clientCidrs`. The
    render says `Local` (client address kept); without it the row fails."""
    st = variant("two-routed-karpenter", tmp_path_factory)
    assert st.exposed and not st.snat_exposed
    r, _ = _variants["two-routed-karpenter"]
    objs = copy.deepcopy(r.kubernetes_objects)
    (lb,) = [o for o in objs if o["kind"] == "Service" and o["spec"].get("type") == "LoadBalancer"]
    assert lb["spec"].pop("externalTrafficPolicy") == "Local"
    snat = variant("two-routed-karpenter", tmp_path_factory, objects=objs)
    assert snat.snat_exposed
    violations = R.check(snat, [ROWS["lb-clients-as-seen -> exposed-routers (any)"]])
    assert violations and all("own IP" in v.source for v in violations)


def test_the_nodes_own_ip_reaches_every_port_of_a_vllm_pod_on_it():
    """What the agent's node-IP rule exposes, as the evaluator now models it: the vLLM pod's own
    node reaches every port, its serving port included, whatever the policies say; a pod of a
    foreign namespace does not."""
    st = shipped("prod")
    (vllm,) = [e for e in st.sources if e.role == "vllm" and e.model == "qwen-67b"]
    (node,) = [e for e in st.sources if e.role == "node" and e.node == vllm.node]
    assert st.cluster.reach(node, vllm, "http") == ""
    (foreign,) = [e for e in st.sources if e.role == "foreign" and e.namespace == "elsewhere"]
    assert st.cluster.reach(foreign, vllm, "http")
    other = [e for e in st.sources if e.role == "node" and e.node != vllm.node]
    assert other and all(st.cluster.reach(n, vllm, "http") for n in other)
