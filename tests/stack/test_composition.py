"""The cluster as a whole: objects that are valid one by one must also work together (issue 20).

Each test here renders a whole stack (the real program under the mocks) and checks a property
that spans objects: which address a policy must name for the traffic its pod really sends, which
node role pulls which image, which object must exist before which pod. tests/network/test_reachability.py
evaluates every flow of every stack; these are the findings one by one, each against the render
that broke it.
"""

from __future__ import annotations

import copy
import ipaddress
from typing import Any

import pytest
import yaml

from tests.support import reachability as R
from tests.support.stacks import load_stack_doc, policy_json, render_doc, render_stack
from warmstart import mocks, render, versions
from warmstart.decisions import image_cache, network
from warmstart.manifests import network_policy, serving

CLUSTER = "eks:index:Cluster"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
NETPOL = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
ACCOUNT = "123456789012"
CREDENTIAL = f"arn:aws:secretsmanager:us-west-2:{ACCOUNT}:secret:ecr-pullthroughcache/docker-hub-AbCdEf"
EXISTING_VPC = {"vpcId": "vpc-0123456789abcdef0",
                "privateSubnetIds": ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"],
                "privateRouteTableIds": ["rtb-0123456789abcdef0"]}


def _service_cidr(r: render.Rendered) -> str:
    (cluster,) = r.of_type(CLUSTER)
    return cluster.inputs["kubernetesServiceIpAddressRange"]


def _router_policies(r: render.Rendered) -> list[dict[str, Any]]:
    return [p for p in r.kind("NetworkPolicy")
            if p["spec"]["podSelector"]["matchLabels"].get("app.kubernetes.io/name") == network_policy.ROUTER_NAME]


def _allows_https_to(policy: dict[str, Any], address: str) -> bool:
    """Whether the policy lets the pods it selects open TCP 443 to `address`, as the AWS network
    policy agent judges egress (the destination before DNAT): tests/support/reachability.py."""
    ns = policy["metadata"].get("namespace", "default")
    src = R.Endpoint("router", ipaddress.ip_address("10.0.1.10"), "router", ns,
                     dict(policy["spec"]["podSelector"].get("matchLabels") or {}))
    return R.Cluster([policy], [src]).egress(src, ipaddress.ip_address(address), 443, "TCP") == ""


# --- finding 1: the router reaches the API server at the `kubernetes` ClusterIP -----------------

@pytest.mark.parametrize("stack", ["prod", "staging-llama-3-1-8b"])
def test_every_router_may_call_the_kubernetes_service_clusterip(stack):
    r = render_stack(stack)
    platform = render_stack("staging") if stack.startswith("staging-") else r
    api = network.kubernetes_service_ip(_service_cidr(platform))
    routers = _router_policies(r)
    assert routers, f"{stack} routes a model"
    for policy in routers:
        assert _allows_https_to(policy, api), f"{policy['metadata']['name']}: no egress to {api}:443"


@pytest.mark.parametrize("stack", ["prod", "staging-llama-3-1-8b"])
def test_a_routers_only_443_peer_is_the_kubernetes_clusterip(stack):
    """The AWS agent judges the pre-DNAT address and lets replies back by conntrack, so the
    `kubernetes` ClusterIP's /32 is all the API needs: before, every VPC block and the whole
    Service range were open on 443."""
    r = render_stack(stack)
    platform = render_stack("staging") if stack.startswith("staging-") else r
    api = network.kubernetes_service_ip(_service_cidr(platform))
    for policy in _router_policies(r):
        https = [rule for rule in policy["spec"]["egress"] if any(p.get("port") == 443 for p in rule["ports"])]
        assert [rule["to"] for rule in https] == [[{"ipBlock": {"cidr": f"{api}/32"}}]], policy["metadata"]["name"]
        assert not _allows_https_to(policy, "10.0.0.5")  # the API's ENI, dialled directly
        assert not _allows_https_to(policy, str(ipaddress.ip_address(api) + 1))  # another ClusterIP


def test_the_service_cidr_is_the_one_eks_would_pick_so_a_deployed_cluster_is_not_replaced():
    # A VPC in 10.0.0.0/8 gets 172.20.0.0/16 (EKS's default, now explicit); any other VPC 10.100.0.0/16.
    assert _service_cidr(render_stack("prod")) == "172.20.0.0/16"
    assert network.default_service_cidr(["172.31.0.0/16", "100.64.0.0/16"]) == "10.100.0.0/16"
    assert network.default_service_cidr(["172.31.0.0/16", "10.8.0.0/16"]) == "172.20.0.0/16"
    assert network.kubernetes_service_ip("172.20.0.0/16") == "172.20.0.1"


def test_a_broken_router_policy_is_caught():
    (policy,) = _router_policies(render_stack("prod"))
    broken = copy.deepcopy(policy)
    for rule in broken["spec"]["egress"]:
        if any(p.get("port") == 443 for p in rule.get("ports", [])):
            rule["to"] = [{"ipBlock": {"cidr": "10.0.0.0/16"}}]  # the VPC only, as before the fix
    assert not _allows_https_to(broken, "172.20.0.1")


def test_the_router_resolves_names_on_auto_mode_too():
    # Auto Mode's resolver runs on the node, not as kube-dns pods: DNS egress names no pods.
    (policy,) = _router_policies(render_stack("staging-llama-3-1-8b"))
    dns = [rule for rule in policy["spec"]["egress"] if any(p["port"] == 53 for p in rule["ports"])]
    assert dns == [network_policy.egress_rules()[0]]


# --- finding 5: an existing VPC's real blocks, secondary ones too --------------------------------

def test_an_existing_vpc_outside_10_0_is_named_by_its_real_blocks(tmp_path, monkeypatch):
    monkeypatch.setitem(mocks.EXISTING_VPCS, EXISTING_VPC["vpcId"], ["172.31.0.0/16", "100.64.0.0/16"])
    doc = load_stack_doc("prod")
    doc["config"]["warmstart:network"] = dict(EXISTING_VPC)
    r = render_doc(doc, tmp_path, stack="existing-vpc")
    assert _service_cidr(r) == "10.100.0.0/16"  # no 10.0.0.0/8 block: EKS's other default
    blocks = {"172.31.0.0/16", "100.64.0.0/16"}
    cidrs = {p["ipBlock"]["cidr"] for pol in r.kind("NetworkPolicy") for rule in pol["spec"].get("ingress", [])
             + pol["spec"].get("egress", []) for p in rule.get("from", rule.get("to", [])) if "ipBlock" in p}
    assert "10.0.0.0/16" not in cidrs
    assert blocks <= cidrs  # the collector's scrapes come from either block
    (router,) = _router_policies(r)
    # The API at its ClusterIP; no VPC address on 443 (the agent judges before DNAT).
    assert _allows_https_to(router, "10.100.0.1") and not _allows_https_to(router, "100.64.0.9")
    assert set(r.outputs["warmstartPlatform"]["vpcCidrs"]) == blocks


# --- finding 4: no scraper admission opens vLLM's serving port -----------------------------------

@pytest.mark.parametrize("stack", ["prod", "dev"])
def test_no_ip_block_reaches_the_vllm_serving_port(stack):
    for policy in render_stack(stack).kind("NetworkPolicy"):
        if policy["spec"]["podSelector"]["matchLabels"] != serving.selector(policy["metadata"]["name"]):
            continue
        for rule in policy["spec"].get("ingress", []):
            if any(p["port"] == serving.HTTP_PORT for p in rule["ports"]):
                assert not [p for p in rule["from"] if "ipBlock" in p], policy["metadata"]["name"]


# --- finding 6: a Prometheus of the stack's own is admitted, exactly it -------------------------

def test_a_named_prometheus_reaches_the_metrics_ports_only(tmp_path):
    doc = load_stack_doc("prod")
    scraper = {"namespace": "monitoring", "podLabels": {"app.kubernetes.io/name": "prometheus"}}
    doc["config"]["warmstart:monitoring"] = {"prometheusUrl": "http://prometheus-operated.monitoring.svc:9090",
                                             "scraper": scraper}
    r = render_doc(doc, tmp_path, stack="own-prometheus")
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
    (vllm,) = [p for p in r.kind("NetworkPolicy") if p["metadata"]["name"] == "qwen-67b"]
    assert vllm["spec"]["ingress"][1:] == [{"from": [peer], "ports": [{"protocol": "TCP", "port": serving.METRICS_PORT}]}]
    assert peer not in vllm["spec"]["ingress"][0]["from"]
    (router,) = _router_policies(r)
    assert {"from": [peer], "ports": [{"port": 29000, "protocol": "TCP"}]} in router["spec"]["ingress"]
    (dep,) = [d for d in r.kind("Deployment") if d["metadata"]["name"] == "qwen-67b-router"]
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--prometheus-host") + 1] == "0.0.0.0"


# --- finding 2: whoever may pull a cached image first may import it ------------------------------

def test_every_node_role_may_fill_the_pull_through_cache(tmp_path):
    doc = load_stack_doc("prod")
    doc["config"]["warmstart:accountId"] = ACCOUNT
    doc["config"]["warmstart:imageCache"] = {"ecrPullThrough": {"credentialArn": CREDENTIAL.replace("us-west-2", "us-east-1")}}
    doc["config"]["warmstart:models"][1]["import"] = {"s3": "s3://upstream-models/scout"}
    r = render_doc(doc, tmp_path, stack="ecr-import")
    granted = {str(p.inputs["role"]) for p in r.of_type(ROLE_POLICY) if p.inputs["name"] == "warmstart-pull-through"}
    node_roles = {str(role.inputs["name"]) for role in r.of_type("aws:iam/role:Role")
                  if "ec2.amazonaws.com" in str(role.inputs["assumeRolePolicy"])}
    assert granted == node_roles and len(granted) == 2, (granted, node_roles)
    for p in r.of_type(ROLE_POLICY):
        if p.inputs["name"] == "warmstart-pull-through":
            (stmt,) = policy_json(p.inputs["policy"])["Statement"]
            assert sorted(stmt["Action"]) == sorted(image_cache.PULL_THROUGH_ACTIONS)
    # The router and the import Job run cached images too.
    images = {c["image"] for o in r.kubernetes_objects if o["kind"] in ("Deployment", "Job", "DaemonSet")
              for c in o["spec"]["template"]["spec"].get("containers", [])}
    assert image_cache.cached_image(versions.SMG_IMAGE, ACCOUNT, "us-east-1") in images
    assert not [i for i in images if image_cache.is_docker_hub(i)]


def test_docker_hub_written_out_is_docker_hub():
    assert image_cache.cached_image("docker.io/lightseekorg/smg:1.13.0", ACCOUNT, "us-east-1") == \
        f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com/docker-hub/lightseekorg/smg:1.13.0"
    assert image_cache.cached_image("index.docker.io/library/ubuntu:24.04", ACCOUNT, "us-east-1").endswith(
        "/docker-hub/library/ubuntu:24.04")
    assert image_cache.cached_image("docker.io/ubuntu:24.04", ACCOUNT, "us-east-1").endswith("/docker-hub/library/ubuntu:24.04")
    assert not image_cache.is_docker_hub("public.ecr.aws/karpenter/controller:1.14.1")
    assert not image_cache.is_docker_hub("nvcr.io/nvidia/k8s-device-plugin:v0.17.0")


# --- finding 7 (m6): a routed model's pods never run without their policy ------------------------

def test_the_serving_policy_comes_before_the_pods_and_does_not_wait_for_the_router():
    r = render_stack("prod")
    (policy,) = [res for res in r.of_type(NETPOL) if res.inputs["metadata"]["name"] == "qwen-67b"]
    (dep,) = [res for res in r.of_type(DEPLOYMENT) if res.inputs["metadata"]["name"] == "qwen-67b"]
    assert policy.urn in dep.dependencies
    router_urns = {res.urn for res in r.resources if "-qwen-67b-router" in res.name}
    assert not router_urns & set(policy.dependencies)


def test_the_collector_scrapes_a_port_the_vllm_pods_serve_metrics_on_and_nothing_else():
    r = render_stack("prod")
    (scraper,) = r.of_type("aws:amp/scraper:Scraper")
    jobs = {j["job_name"]: j for j in yaml.safe_load(scraper.inputs["scrapeConfiguration"])["scrape_configs"]}
    name, port_name = jobs["vllm"]["relabel_configs"][0]["regex"].split(";")
    for dep in r.kind("Deployment"):
        pod = dep["spec"]["template"]
        if pod["metadata"]["labels"].get("app.kubernetes.io/name") != name:
            continue
        ports = {p["name"]: (c["name"], p["containerPort"]) for c in pod["spec"]["containers"] + pod["spec"].get(
            "initContainers", []) for p in c.get("ports", [])}
        assert ports[port_name] == ("metrics-proxy", serving.METRICS_PORT)
        (policy,) = [p for p in r.kind("NetworkPolicy") if p["metadata"]["name"] == dep["metadata"]["name"]]
        scrape_rule = policy["spec"]["ingress"][1]
        assert scrape_rule["ports"] == [{"protocol": "TCP", "port": serving.METRICS_PORT}]


def test_a_service_range_that_overlaps_an_existing_vpc_is_refused_before_anything_is_created(tmp_path, monkeypatch):
    # EKS's own default for a VPC in 10.0.0.0/8 is 172.20.0.0/16; with a 172.20 block as well, EKS
    # would refuse the cluster, so the program refuses first, naming the key.
    monkeypatch.setitem(mocks.EXISTING_VPCS, EXISTING_VPC["vpcId"], ["10.1.0.0/16", "172.20.0.0/16"])
    doc = load_stack_doc("dev")
    doc["config"]["warmstart:network"] = dict(EXISTING_VPC)
    with pytest.raises(Exception, match=r"warmstart:cluster\.serviceCidr.*overlaps the VPC's CIDR block 172\.20\.0\.0/16"):
        render_doc(doc, tmp_path, stack="overlap")
