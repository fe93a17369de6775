"""The AWS layer as rendered: invariants over every resource of every stack in stacks/, both
network paths, the per-model IRSA roles, and bad inputs failing with the key that is wrong."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml

from tests.support.policy_eval import DENY, allowed, evaluate, statements
from tests.support.stacks import STACK_NAMES, load_stack_doc, policy_json, render_doc
from warmstart import config as config_mod
from warmstart import mocks, render
from warmstart.decisions import iam, naming
from warmstart.decisions.network import (
    ELB_ROLE_TAG,
    INTERNAL_ELB_ROLE_TAG,
    KARPENTER_DISCOVERY_TAG,
)
from warmstart.errors import ConfigErrors
from warmstart.plan import stack as plan_mod

BUCKET = "aws:s3/bucket:Bucket"
VPC = "aws:ec2/vpc:Vpc"
SUBNET = "aws:ec2/subnet:Subnet"
ROUTE = "aws:ec2/route:Route"
RT_ASSOC = "aws:ec2/routeTableAssociation:RouteTableAssociation"
ENDPOINT = "aws:ec2/vpcEndpoint:VpcEndpoint"
ROLE = "aws:iam/role:Role"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
MANAGED_POLICY = "aws:iam/policy:Policy"
EC2_TAG = "aws:ec2/tag:Tag"
BUCKET_SETTINGS = {
    "public_access": "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
    "encryption": "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    "versioning": "aws:s3/bucketVersioning:BucketVersioning",
    "ownership": "aws:s3/bucketOwnershipControls:BucketOwnershipControls",
    "policy": "aws:s3/bucketPolicy:BucketPolicy",
    "lifecycle": "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration",
}
# Resource types of the AWS layer that accept tags.
TAGGABLE = {VPC, SUBNET, ENDPOINT, BUCKET, ROLE, "aws:ec2/internetGateway:InternetGateway",
            "aws:ec2/eip:Eip", "aws:ec2/natGateway:NatGateway", "aws:ec2/routeTable:RouteTable"}
AWS_LAYER_NAMES = ("warmstart-network", "warmstart-storage", "warmstart-identity")
ADMIN = "arn:aws:iam::123456789012:role/platform-admin"


def _mock_id(r: render.Registered) -> str:
    return mocks.fake_id(r.typ, r.name)


def settings_of(rendered: render.Rendered) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """{bucket name: {setting: [inputs of each resource configuring that bucket]}}."""
    out: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for setting, typ in BUCKET_SETTINGS.items():
        for r in rendered.of_type(typ):
            out[r.inputs["bucket"]][setting].append(r.inputs)
    return out


def buckets(rendered: render.Rendered) -> list[str]:
    return [r.inputs["bucket"] for r in rendered.of_type(BUCKET)]


def gpu_route_tables(rendered: render.Rendered) -> set[str]:
    """Route tables of the subnets the GPU nodes use (the network's private subnets)."""
    net = rendered.stack_plan.aws.network
    if not net.create:
        return set(net.private_route_table_ids)
    private = {_mock_id(s) for s in rendered.of_type(SUBNET) if INTERNAL_ELB_ROLE_TAG in s.inputs.get("tags", {})}
    assert private, "no private subnets rendered"
    return {a.inputs["routeTableId"] for a in rendered.of_type(RT_ASSOC) if a.inputs["subnetId"] in private}


def identity_policies(rendered: render.Rendered, but_roles: frozenset[str] = frozenset()) -> list[dict]:
    """Every identity policy any role in the stack gets (inline and customer managed), but the
    inline policies of the roles named in `but_roles`."""
    docs = [policy_json(r.inputs["policy"]) for r in rendered.of_type(ROLE_POLICY) + rendered.of_type(MANAGED_POLICY)
            if r.inputs.get("role") not in but_roles]
    for r in rendered.of_type(ROLE):
        for p in r.inputs.get("inlinePolicies") or []:
            if p.get("policy"):
                docs.append(policy_json(p["policy"]))
    return docs


def web_identity_roles(rendered: render.Rendered) -> list[render.Registered]:
    return [r for r in rendered.of_type(ROLE)
            if any(s.get("Action") == iam.WEB_IDENTITY_ACTION or iam.WEB_IDENTITY_ACTION in (s.get("Action") or [])
                   for s in statements(policy_json(r.inputs["assumeRolePolicy"])))]


# ---- buckets ----------------------------------------------------------------------------

def test_every_stack_creates_both_buckets(rendered):
    aws = rendered.stack_plan.aws
    names = buckets(rendered)
    assert aws.model_bucket in names and aws.compile_cache_bucket in names


def test_every_bucket_has_the_security_baseline(rendered):
    found = settings_of(rendered)
    for name in buckets(rendered):
        s = found[name]
        (pab,) = s["public_access"]
        assert all(pab[k] is True for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls",
                                            "restrictPublicBuckets")), name
        (enc,) = s["encryption"]
        assert enc["rules"] and all(r["applyServerSideEncryptionByDefault"]["sseAlgorithm"] in ("AES256", "aws:kms")
                                    for r in enc["rules"]), name
        (ver,) = s["versioning"]
        assert ver["versioningConfiguration"]["status"] == "Enabled", name
        (own,) = s["ownership"]
        assert own["rule"]["objectOwnership"] == "BucketOwnerEnforced", name
        (pol,) = s["policy"]
        arn = f"arn:aws:s3:::{name}"
        for action, res in (("s3:GetObject", f"{arn}/k"), ("s3:PutObject", f"{arn}/k"), ("s3:ListBucket", arn)):
            assert evaluate(pol["policy"], action, res, {"aws:SecureTransport": "false"}) == DENY, name
            assert evaluate(pol["policy"], action, res, {"aws:SecureTransport": "true", "aws:PrincipalArn": ADMIN,
                                                         "aws:SourceVpce": "vpce-x"}) != DENY, name


def test_every_bucket_name_is_a_valid_s3_name(rendered):
    for name in buckets(rendered):
        assert naming.bucket_name_problems(name) == [], name


def test_compile_cache_objects_expire(rendered):
    cache = rendered.stack_plan.aws.compile_cache_bucket
    (lc,) = settings_of(rendered)[cache]["lifecycle"]
    expiring = [r for r in lc["rules"] if r["status"] == "Enabled" and r.get("expiration", {}).get("days")
                and r.get("filter", {}).get("prefix", "") == ""]
    assert expiring, "the cache bucket needs a whole-bucket expiration rule"
    assert expiring[0]["expiration"]["days"] == rendered.stack_plan.config.compile_cache_bucket.expire_after_days
    # Versioned: without a noncurrent rule, expired objects would live on as old versions.
    assert expiring[0]["noncurrentVersionExpiration"]["noncurrentDays"] >= 1


def test_the_model_bucket_is_not_emptied_by_destroy_but_the_cache_is(rendered):
    by_name = {r.inputs["bucket"]: r.inputs for r in rendered.of_type(BUCKET)}
    aws = rendered.stack_plan.aws
    assert by_name[aws.model_bucket]["forceDestroy"] is False
    assert by_name[aws.compile_cache_bucket]["forceDestroy"] is True


# ---- network ----------------------------------------------------------------------------

def test_every_gpu_route_table_is_on_the_s3_gateway_endpoint(rendered):
    (ep,) = rendered.of_type(ENDPOINT)
    assert ep.inputs["vpcEndpointType"] == "Gateway"
    assert ep.inputs["serviceName"] == f"com.amazonaws.{rendered.stack_plan.config.region}.s3"
    tables = gpu_route_tables(rendered)
    assert tables and tables <= set(ep.inputs["routeTableIds"])
    assert ep.inputs["routeTableIds"] == sorted(ep.inputs["routeTableIds"])


def test_every_route_table_that_sends_traffic_to_nat_is_on_the_endpoint(rendered):
    (ep,) = rendered.of_type(ENDPOINT)
    nat_tables = {r.inputs["routeTableId"] for r in rendered.of_type(ROUTE) if r.inputs.get("natGatewayId")}
    assert nat_tables <= set(ep.inputs["routeTableIds"])


def test_created_vpc_spans_at_least_two_azs_with_tagged_subnets(rendered):
    subnets = rendered.of_type(SUBNET)
    private = [s for s in subnets if INTERNAL_ELB_ROLE_TAG in s.inputs["tags"]]
    public = [s for s in subnets if ELB_ROLE_TAG in s.inputs["tags"]]
    assert len({s.inputs["availabilityZone"] for s in private}) >= 2
    assert len({s.inputs["availabilityZone"] for s in public}) >= 2
    assert not any(s.inputs["mapPublicIpOnLaunch"] for s in private)
    # Every private subnet routes to the internet through NAT, every public one through the IGW.
    rt_of = {a.inputs["subnetId"]: a.inputs["routeTableId"] for a in rendered.of_type(RT_ASSOC)}
    default = {r.inputs["routeTableId"]: r.inputs for r in rendered.of_type(ROUTE)
               if r.inputs["destinationCidrBlock"] == "0.0.0.0/0"}
    assert all(default[rt_of[_mock_id(s)]].get("natGatewayId") for s in private)
    assert all(default[rt_of[_mock_id(s)]].get("gatewayId", "").startswith("igw-") for s in public)
    # No inline routes: they would delete the endpoint's route on the next update.
    assert not any(r.inputs.get("routes") for r in rendered.of_type("aws:ec2/routeTable:RouteTable"))


def test_karpenter_discovery_tag_is_on_private_subnets_only_in_karpenter_mode(rendered):
    p = rendered.stack_plan
    private = [s for s in rendered.of_type(SUBNET) if INTERNAL_ELB_ROLE_TAG in s.inputs["tags"]]
    tagged = [s.inputs["tags"].get(KARPENTER_DISCOVERY_TAG) for s in rendered.of_type(SUBNET)]
    if p.cluster_mode == "karpenter":
        assert all(s.inputs["tags"][KARPENTER_DISCOVERY_TAG] == naming.cluster_name(p.name_prefix) for s in private)
        assert tagged.count(None) == len(tagged) - len(private), "public subnets must not be Karpenter's"
    else:
        assert set(tagged) == {None}


def test_aws_layer_uses_the_stacks_provider_and_tags(rendered):
    mine = [r for r in rendered.cloud_resources if r.name.startswith(AWS_LAYER_NAMES)]
    assert mine
    for r in mine:
        assert r.provider and "pulumi:providers:aws::warmstart-aws" in r.provider, r.name
        if r.typ in TAGGABLE:
            assert r.inputs.get("tags", {}).get("Name"), f"{r.typ} {r.name} has no Name tag"


@pytest.mark.parametrize("mode", ["auto", "karpenter"])
def test_existing_vpc_path(stack_doc, tmp_path, mode):
    doc = stack_doc("prod")
    doc["config"]["warmstart:clusterMode"] = mode
    subnets = ["subnet-0bbbbbbbbbbbbbbbb", "subnet-0aaaaaaaaaaaaaaaa"]
    tables = ["rtb-0bbbbbbbbbbbbbbbb", "rtb-0aaaaaaaaaaaaaaaa"]
    doc["config"]["warmstart:network"] = {"vpcId": "vpc-0123456789abcdef0", "privateSubnetIds": subnets,
                                          "privateRouteTableIds": tables}
    r = render_doc(doc, tmp_path, stack=f"existing-{mode}")
    assert not r.of_type(VPC) and not r.of_type(SUBNET) and not r.of_type("aws:ec2/natGateway:NatGateway")
    (ep,) = r.of_type(ENDPOINT)
    assert ep.inputs["vpcId"] == "vpc-0123456789abcdef0"
    assert ep.inputs["routeTableIds"] == sorted(tables)
    tags = {(t.inputs["resourceId"], t.inputs["key"], t.inputs["value"]) for t in r.of_type(EC2_TAG)
            if t.inputs["resourceId"].startswith("subnet-")}
    if mode == "karpenter":
        assert tags == {(s, KARPENTER_DISCOVERY_TAG, naming.cluster_name(r.stack_plan.name_prefix)) for s in subnets}
    else:
        assert tags == set()
    # The buckets do not depend on which VPC: same baseline.
    assert len(buckets(r)) == 2


def test_single_nat_gateway_serves_every_private_route_table(stack_doc, tmp_path):
    doc = stack_doc("dev")
    doc["config"]["warmstart:network"] = {"singleNatGateway": True, "availabilityZones": ["us-west-2a", "us-west-2c"]}
    r = render_doc(doc, tmp_path, stack="one-nat")
    (nat,) = r.of_type("aws:ec2/natGateway:NatGateway")
    nat_routes = [x for x in r.of_type(ROUTE) if x.inputs.get("natGatewayId")]
    assert len(nat_routes) == 2 and {x.inputs["natGatewayId"] for x in nat_routes} == {_mock_id(nat)}
    assert {s.inputs["availabilityZone"] for s in r.of_type(SUBNET)} == {"us-west-2a", "us-west-2c"}


def test_opting_out_of_the_endpoint_is_explicit_and_then_no_endpoint_is_made(stack_doc, tmp_path):
    doc = stack_doc("dev")
    doc["config"]["warmstart:network"] = {"s3GatewayEndpoint": False, "allowS3ViaNat": True}
    r = render_doc(doc, tmp_path, stack="via-nat")
    assert not r.of_type(ENDPOINT)


def test_restricting_the_model_bucket_to_the_endpoint(stack_doc, tmp_path):
    doc = stack_doc("prod")
    doc["config"]["warmstart:modelBucket"] = {"restrictToVpcEndpoint": True, "admins": [ADMIN]}
    r = render_doc(doc, tmp_path, stack="restricted")
    (ep,) = r.of_type(ENDPOINT)
    vpce = _mock_id(ep)
    aws = r.stack_plan.aws
    (pol,) = settings_of(r)[aws.model_bucket]["policy"]
    obj = f"arn:aws:s3:::{aws.model_bucket}/qwen/x.safetensors"
    tls = {"aws:SecureTransport": "true"}
    pod = "arn:aws:iam::123456789012:role/" + aws.access[0].role_name
    assert evaluate(pol["policy"], "s3:GetObject", obj, tls | {"aws:PrincipalArn": pod, "aws:SourceVpce": vpce}) != DENY
    assert evaluate(pol["policy"], "s3:GetObject", obj, tls | {"aws:PrincipalArn": pod}) == DENY
    assert evaluate(pol["policy"], "s3:PutObject", obj, tls | {"aws:PrincipalArn": ADMIN}) != DENY
    # The cache bucket keeps the baseline policy only.
    (cache_pol,) = settings_of(r)[aws.compile_cache_bucket]["policy"]
    assert evaluate(cache_pol["policy"], "s3:GetObject", f"arn:aws:s3:::{aws.compile_cache_bucket}/m/x",
                    tls | {"aws:PrincipalArn": pod}) != DENY


def test_an_existing_model_bucket_is_left_alone(stack_doc, tmp_path):
    doc = stack_doc("dev")
    doc["config"]["warmstart:modelBucket"] = {"name": "team-weights", "create": False}
    r = render_doc(doc, tmp_path, stack="existing-bucket")
    assert buckets(r) == [r.stack_plan.aws.compile_cache_bucket]
    assert r.stack_plan.aws.model_bucket == "team-weights" not in settings_of(r)
    # The model's relative source is in the bucket the stack names.
    assert r.stack_plan.models[0].source == "s3://team-weights/meta-llama/Llama-3.1-8B-Instruct"


def test_no_compile_cache_bucket_when_no_model_uses_it(stack_doc, tmp_path):
    doc = stack_doc("dev")
    doc["config"]["warmstart:compileCache"] = {"enabled": False}
    r = render_doc(doc, tmp_path, stack="no-cache")
    assert buckets(r) == [r.stack_plan.aws.model_bucket]
    assert r.stack_plan.aws.compile_cache_bucket is None


# ---- identity ---------------------------------------------------------------------------

def _run_components(build, region: str = "us-west-2") -> render.Rendered:
    """Register components under the same mocks `warmstart render` uses, without a stack."""
    return render.Rendered(None, mocks.run(build, region=region, stack="unit"))  # type: ignore[arg-type]


def _roles_under_mocks(stack: str):
    """The IRSA roles of a stack's models, one ModelRole component each, on a fake OIDC provider."""
    from components import ModelRole, ModelRoleArgs

    _, sp = render.load_plan(Path(__file__).resolve().parents[2] / "stacks", stack)
    issuer = "oidc.eks.us-west-2.amazonaws.com/id/EXAMPLED539D4633E53DE1B71EXAMPLE"

    def build():
        import pulumi_aws as aws
        oidc = aws.iam.OpenIdConnectProvider("oidc", url=f"https://{issuer}", client_id_lists=["sts.amazonaws.com"])
        for m in sp.models:
            args = ModelRoleArgs(model_name=m.name, source=m.source, namespace=sp.config.namespace,
                                 oidc_provider_arn=oidc.arn, oidc_issuer=f"https://{issuer}",
                                 name_prefix=sp.name_prefix, region=sp.config.region)
            if m.compile_cache:
                args["compile_cache_bucket"] = pulumi.Output.from_input(sp.aws.compile_cache_bucket)
            ModelRole(f"warmstart-identity-{m.name}", args)

    return sp, _run_components(build), issuer


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_model_roles_component_one_pinned_least_privilege_role_per_model(stack):
    sp, r, issuer = _roles_under_mocks(stack)
    (oidc,) = r.of_type("aws:iam/openIdConnectProvider:OpenIdConnectProvider")
    roles = {x.inputs["name"]: x for x in r.of_type(ROLE)}
    assert sorted(roles) == sorted(naming.role_name(sp.name_prefix, m.name) for m in sp.models)
    policies = {x.inputs["role"]: policy_json(x.inputs["policy"]) for x in r.of_type(ROLE_POLICY)}
    for m in sp.models:
        name = naming.role_name(sp.name_prefix, m.name)
        (stmt,) = statements(policy_json(roles[name].inputs["assumeRolePolicy"]))
        assert stmt["Principal"]["Federated"].endswith(f":oidc-provider/{issuer}")
        assert stmt["Condition"] == {"StringEquals": {
            f"{issuer}:sub": f"system:serviceaccount:{sp.config.namespace}:{m.name}",
            f"{issuer}:aud": "sts.amazonaws.com"}}
        doc = policies[name]
        assert allowed(doc, "s3:GetObject", f"arn:aws:s3:::{m.bucket}/{m.prefix}/model.safetensors")
        assert not allowed(doc, "s3:PutObject", f"arn:aws:s3:::{m.bucket}/{m.prefix}/model.safetensors")
        cache = sp.aws.compile_cache_bucket
        assert allowed(doc, "s3:PutObject", f"arn:aws:s3:::{cache}/{m.name}/h/rank_0/x") == m.compile_cache
        # Other models' weights and cache entries are out of reach.
        for other in sp.models:
            if other.name != m.name:
                assert not allowed(doc, "s3:GetObject", f"arn:aws:s3:::{other.bucket}/{other.prefix}/model.safetensors")
                assert not allowed(doc, "s3:PutObject", f"arn:aws:s3:::{cache}/{other.name}/x")


def test_every_irsa_trust_policy_pins_sub_and_aud_to_exactly_one_service_account(rendered):
    for role in web_identity_roles(rendered):
        for stmt in statements(policy_json(role.inputs["assumeRolePolicy"])):
            eq = stmt.get("Condition", {}).get("StringEquals", {})
            subs = [k for k in eq if k.endswith(":sub")]
            auds = [k for k in eq if k.endswith(":aud")]
            assert len(subs) == 1 and len(auds) == 1, role.name
            assert isinstance(eq[subs[0]], str) and re.fullmatch(r"system:serviceaccount:[a-z0-9-]+:[a-z0-9-]+",
                                                                 eq[subs[0]]), role.name
            assert eq[auds[0]] == "sts.amazonaws.com", role.name
            # Nothing looser next to it.
            assert set(stmt["Condition"]) == {"StringEquals"}, role.name


def test_no_role_can_write_to_the_model_bucket(rendered):
    """None but a weights-import role, which tests/serving/test_weights_import.py holds to its own prefix."""
    aws = rendered.stack_plan.aws
    objects = [f"arn:aws:s3:::{aws.model_bucket}/{a.model_prefix}/model.safetensors" for a in aws.access]
    for doc in identity_policies(rendered, but_roles=frozenset(a.role_name for a in aws.imports)):
        for action in sorted(iam.WRITE_ACTIONS):
            for o in objects:
                assert not allowed(doc, action, o), (action, o)
        # S3 access is always scoped to named buckets (EC2 Describe* and the like have no
        # resource-level permissions, so "*" is legitimate for them).
        for stmt in statements(doc):
            actions = stmt["Action"] if isinstance(stmt["Action"], list) else [stmt["Action"]]
            if stmt["Effect"] == "Allow" and any(a.lower().startswith(("s3:", "*")) for a in actions):
                resources = stmt["Resource"] if isinstance(stmt["Resource"], list) else [stmt["Resource"]]
                assert not any(r in ("*", "arn:aws:s3:::*", "arn:aws:s3:::*/*") for r in resources), stmt


def test_one_role_per_model_annotated_on_its_service_account(rendered):
    p = rendered.stack_plan
    roles = {r.inputs["name"]: r for r in rendered.of_type(ROLE)}
    for m in p.models:
        name = naming.role_name(p.name_prefix, m.name)
        assert name in roles, f"no IRSA role for {m.name}"
        (sa,) = [o for o in rendered.kind("ServiceAccount") if o["metadata"]["name"] == m.name]
        assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"] == \
            f"arn:aws:iam::{mocks.FAKE_ACCOUNT}:role/{name}"


# ---- bad inputs -------------------------------------------------------------------------

def _set(path: str, value: Any):
    def mutate(cfg: dict) -> None:
        keys = path.split(".")
        d = cfg.setdefault(f"warmstart:{keys[0]}", {}) if len(keys) > 1 else cfg
        for k in keys[1:-1]:
            d = d.setdefault(k, {})
        if len(keys) > 1:
            d[keys[-1]] = value
        else:
            cfg[f"warmstart:{keys[0]}"] = value
    return mutate


def _source(value: str):
    def mutate(cfg: dict) -> None:
        cfg["warmstart:models"][0]["source"] = value
    return mutate


EXISTING = {"vpcId": "vpc-0123456789abcdef0", "privateSubnetIds": ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"],
            "privateRouteTableIds": ["rtb-0123456789abcdef0"]}

BAD_INPUTS = [
    ("existing-vpc-without-route-tables",
     [_set("network", {k: v for k, v in EXISTING.items() if k != "privateRouteTableIds"})],
     "warmstart:network.privateRouteTableIds", "an existing VPC needs the route tables"),
    ("existing-vpc-one-subnet", [_set("network", EXISTING | {"privateSubnetIds": ["subnet-0123456789abcdef0"]})],
     "warmstart:network.privateSubnetIds", "at least two private subnets"),
    ("more-route-tables-than-subnets",
     [_set("network", EXISTING | {"privateRouteTableIds": ["rtb-0000000000000000a", "rtb-0000000000000000b",
                                                          "rtb-0000000000000000c"]})],
     "warmstart:network.privateRouteTableIds", "more route tables than there are private subnets"),
    ("subnets-without-vpc", [_set("network", {"privateSubnetIds": ["subnet-0123456789abcdef0"]})],
     "warmstart:network.privateSubnetIds", "vpcId is not set"),
    ("az-count-with-existing-vpc", [_set("network", EXISTING | {"azCount": 2})],
     "warmstart:network.azCount", "only applies to a VPC warmstart creates"),
    ("public-cidr", [_set("network.cidr", "8.8.0.0/16")], "warmstart:network.cidr", "not a private"),
    ("cidr-too-small", [_set("network.cidr", "10.0.0.0/24")], "warmstart:network.cidr", "not a usable VPC CIDR"),
    ("azs-of-another-region", [_set("network.availabilityZones", ["eu-west-1a", "eu-west-1b"])],
     "warmstart:network.availabilityZones", "not AZ names of region"),
    ("az-count-disagrees", [_set("network.availabilityZones", ["us-west-2a", "us-west-2b"]), _set("network.azCount", 3)],
     "warmstart:network.azCount", "disagrees"),
    ("nat-only-gpu-subnets", [_set("network.s3GatewayEndpoint", False)],
     "warmstart:network.s3GatewayEndpoint", "reach S3 only through NAT"),
    ("invalid-bucket-name", [_set("modelBucket.name", "Warmstart_Models")], "warmstart:modelBucket.name",
     "not a valid S3 bucket name"),
    ("dotted-bucket-name", [_set("modelBucket.name", "warmstart.models")], "warmstart:modelBucket.name",
     "must not contain dots"),
    ("cache-bucket-is-model-bucket", [_set("modelBucket.name", "team-weights"),
                                      _set("compileCacheBucket.name", "team-weights")],
     "warmstart:compileCacheBucket.name", "is the model bucket"),
    ("source-outside-model-bucket", [_source("s3://someone-elses-bucket/llama")], "warmstart:models[0].source",
     "is not the stack's model bucket"),
    ("existing-bucket-without-name", [_set("modelBucket", {"create": False})], "warmstart:modelBucket.name",
     "must be named"),
    ("restrict-existing-bucket", [_set("modelBucket.create", False), _set("modelBucket.restrictToVpcEndpoint", True),
                                  _set("modelBucket.admins", [ADMIN])],
     "warmstart:modelBucket.restrictToVpcEndpoint", "only writes the policy of a bucket it creates"),
    ("restrict-without-endpoint", [_set("modelBucket.restrictToVpcEndpoint", True), _set("modelBucket.admins", [ADMIN]),
                                   _set("network", {"s3GatewayEndpoint": False, "allowS3ViaNat": True})],
     "warmstart:modelBucket.restrictToVpcEndpoint", "needs an S3 Gateway endpoint"),
    ("restrict-without-admins", [_set("modelBucket.restrictToVpcEndpoint", True)],
     "warmstart:modelBucket.restrictToVpcEndpoint", "nobody outside the VPC"),
]


def _plan(doc: dict) -> plan_mod.StackPlan:
    values = {k.split(":", 1)[1]: v for k, v in doc["config"].items()}
    return plan_mod.plan_stack(config_mod.parse_config(values), "dev")


@pytest.mark.parametrize("case, mutations, key, message", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_fails_naming_its_key(case, mutations, key, message):
    doc = copy.deepcopy(load_stack_doc("dev"))
    for mutate in mutations:
        mutate(doc["config"])
    with pytest.raises(ConfigErrors) as err:
        _plan(doc)
    hits = [e for e in err.value.errors if e.key == key and message in e.rule]
    assert hits, f"expected {key}: {message!r}; got {err.value}"
    assert hits[0].fix


def test_a_relative_source_is_a_prefix_in_the_stacks_model_bucket():
    """A source without a scheme is resolved once, into the model bucket's name as the AWS
    planner derives it (with accountId when set): everything after sees the full URI."""
    from warmstart.decisions import naming

    doc = copy.deepcopy(load_stack_doc("dev"))
    assert doc["config"]["warmstart:models"][0]["source"] == "meta-llama/Llama-3.1-8B-Instruct"
    rel = _plan(doc)
    bucket = naming.bucket_name("ws-dev", "models", "dev", "us-west-2")
    full = f"s3://{bucket}/meta-llama/Llama-3.1-8B-Instruct"
    assert rel.aws.model_bucket == bucket
    assert rel.config.models[0].source == full == rel.models[0].source
    assert rel.aws.imports[0].model_bucket == bucket and rel.aws.access[0].model_prefix == "meta-llama/Llama-3.1-8B-Instruct"
    spelled = copy.deepcopy(doc)
    spelled["config"]["warmstart:models"][0]["source"] = full + "/"
    assert _plan(spelled).summary() == rel.summary()
    doc["config"]["warmstart:accountId"] = "111122223333"
    mine = _plan(doc)
    assert mine.aws.model_bucket == naming.bucket_name("ws-dev", "models", "dev", "us-west-2", "111122223333") != bucket
    assert mine.models[0].source == f"s3://{mine.aws.model_bucket}/meta-llama/Llama-3.1-8B-Instruct"
    # A name the stack gives is the bucket a relative source is in; an invalid one is its own error.
    doc["config"]["warmstart:modelBucket"] = {"name": "Team_Weights"}
    with pytest.raises(ConfigErrors) as err:
        _plan(doc)
    assert [e.key for e in err.value.errors] == ["warmstart:modelBucket.name"]


def test_the_dev_stack_itself_plans(stack_name):
    assert _plan(load_stack_doc(stack_name)).aws is not None


@pytest.mark.servers
def test_bad_aws_input_through_the_cli_exits_2_without_traceback(tmp_path):
    doc = copy.deepcopy(load_stack_doc("dev"))
    doc["config"]["warmstart:network"] = {"s3GatewayEndpoint": False}
    (tmp_path / "stacks").mkdir()
    (tmp_path / "Pulumi.yaml").write_text("name: warmstart\nruntime: python\n")
    (tmp_path / "stacks" / "Pulumi.bad.yaml").write_text(yaml.safe_dump(doc))
    proc = subprocess.run([sys.executable, "-m", "warmstart.cli", "render", "--stack", "bad"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "warmstart:network.s3GatewayEndpoint" in proc.stderr and "allowS3ViaNat" in proc.stderr
    assert not (tmp_path / "build").exists()


def test_destroy_keeps_the_model_bucket_and_its_settings_unless_asked(rendered, tmp_path, stack_doc):
    """The weights are the one thing a stack holds that is not cheap to rebuild: `destroy`
    leaves a created model bucket (and its public access block and TLS-only policy) in place,
    and empties and deletes the compile-cache bucket."""
    def bucket_resources(r, purpose):
        return [x for x in r.cloud_resources if f"-storage-{purpose}" in x.name]

    models, cache = bucket_resources(rendered, "models"), bucket_resources(rendered, "compile-cache")
    assert models and all(x.retain_on_delete for x in models)
    assert all(x.inputs.get("forceDestroy") is False for x in models if x.typ == BUCKET)
    assert cache and not any(x.retain_on_delete for x in cache)
    doc = stack_doc(rendered.stack_plan.stack)
    doc["config"]["warmstart:modelBucket"] = dict(doc["config"].get("warmstart:modelBucket", {}), deleteOnDestroy=True)
    r = render_doc(doc, tmp_path)
    assert not any(x.retain_on_delete for x in bucket_resources(r, "models"))
    assert [x.inputs["forceDestroy"] for x in bucket_resources(r, "models") if x.typ == BUCKET] == [True]


def test_a_service_account_is_annotated_only_after_its_roles_policy_exists(rendered):
    """The role ARN a ServiceAccount carries depends on the role's policy, so `up` creates the
    ServiceAccount (and then the pods) only once the role may read the weights."""
    policies_by_role = {p.inputs["role"]: p for p in rendered.of_type(ROLE_POLICY)}
    accounts = [r for r in rendered.of_type("kubernetes:core/v1:ServiceAccount")
                if r.inputs["metadata"].get("annotations", {}).get("eks.amazonaws.com/role-arn")]
    assert accounts
    for sa in accounts:
        role_name = sa.inputs["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].rsplit("/", 1)[-1]
        assert policies_by_role[role_name].urn in sa.dependencies, sa.name
