"""Pure AWS-layer decisions: names fit AWS limits for any input, subnet layouts are sound,
and the policies allow exactly what they should (checked by evaluating requests)."""

from __future__ import annotations

import ipaddress
import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.support.policy_eval import DENY, allowed, evaluate, statements
from tests.support.strategies import dns_label, models, prefixes
from warmstart.decisions import iam, naming, network

stacks = st.from_regex(r"\A[a-z0-9][a-z0-9-]{0,30}\Z", fullmatch=True)
regions = st.sampled_from(["us-east-1", "us-west-2", "eu-central-1", "ap-southeast-2", "us-gov-west-1", "cn-north-1"])
purposes = st.sampled_from(["models", "compile-cache"])
accounts = st.none() | st.from_regex(r"\A\d{12}\Z", fullmatch=True)

# An independent statement of S3's rules, to check bucket_name_problems against.
S3_RULES = re.compile(r"^(?!xn--|sthree-|amzn-s3-demo-)(?!.*(-s3alias|--ol-s3|\.mrap|--x-s3|--table-s3)$)"
                      r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")


# ---- bucket names -----------------------------------------------------------------------

@given(prefixes, purposes, stacks, regions, accounts)
def test_derived_bucket_names_are_valid_for_any_stack(prefix, purpose, stack, region, account):
    name = naming.bucket_name(prefix, purpose, stack, region, account)
    assert naming.bucket_name_problems(name) == []
    assert S3_RULES.match(name), name
    assert 3 <= len(name) <= 63


@given(prefixes, purposes, stacks, regions, accounts)
def test_derived_bucket_names_are_deterministic(prefix, purpose, stack, region, account):
    assert naming.bucket_name(prefix, purpose, stack, region, account) == \
        naming.bucket_name(prefix, purpose, stack, region, account)


@given(prefixes, stacks, stacks, regions, regions, accounts, accounts)
def test_different_stacks_regions_or_accounts_derive_different_names(prefix, s1, s2, r1, r2, a1, a2):
    assume((s1, r1, a1) != (s2, r2, a2))
    assert naming.bucket_name(prefix, "models", s1, r1, a1) != naming.bucket_name(prefix, "models", s2, r2, a2)


def test_the_two_buckets_of_a_stack_never_share_a_name():
    assert naming.bucket_name("ws-dev", "models", "dev", "us-west-2") != \
        naming.bucket_name("ws-dev", "compile-cache", "dev", "us-west-2")


@pytest.mark.parametrize("bad", [
    "ab", "a" * 64, "My-Bucket", "bucket_name", "-bucket", "bucket-", "192.168.1.1", "xn--bucket",
    "sthree-bucket", "amzn-s3-demo-bucket", "bucket-s3alias", "bucket--ol-s3", "bucket.mrap",
    "bucket--x-s3", "bucket--table-s3", "a..b", "dotted.bucket", "bucket name",
])
def test_invalid_bucket_names_are_refused(bad):
    assert naming.bucket_name_problems(bad)


@given(st.text(alphabet="abcxyz019-._A ", min_size=0, max_size=70))
def test_bucket_rules_agree_with_an_independent_statement_of_s3s_rules(name):
    assert (naming.bucket_name_problems(name) == []) == bool(S3_RULES.match(name))


# ---- role and cluster names -------------------------------------------------------------

@given(prefixes, models)
def test_role_names_fit_iam_for_any_prefix_and_model(prefix, model):
    name = naming.role_name(prefix, model)
    assert naming.role_name_valid(name)
    assert len(name) <= 64 and re.fullmatch(r"[\w+=,.@-]+", name)


@given(prefixes, models, models)
def test_two_models_never_share_a_role(prefix, m1, m2):
    assume(m1 != m2)
    assert naming.role_name(prefix, m1) != naming.role_name(prefix, m2)


def test_long_names_that_share_a_truncated_stem_still_differ():
    a, b = "x" * 39 + "a", "x" * 39 + "b"
    ra, rb = naming.role_name("p" * 20, a), naming.role_name("p" * 20, b)
    assert ra != rb and len(ra) <= 64 and len(rb) <= 64


@given(prefixes)
def test_cluster_name_fits_eks(prefix):
    name = naming.cluster_name(prefix)
    assert 1 <= len(name) <= 100 and re.fullmatch(r"[0-9A-Za-z][A-Za-z0-9_-]*", name)


@pytest.mark.parametrize("region, partition", [("us-east-1", "aws"), ("cn-north-1", "aws-cn"),
                                               ("us-gov-west-1", "aws-us-gov")])
def test_partition(region, partition):
    assert naming.partition(region) == partition


# ---- subnet layout ----------------------------------------------------------------------

@settings(max_examples=200)
@given(st.integers(16, 22), st.integers(1, 6), st.sampled_from(["10.0.0.0", "172.16.0.0", "192.168.0.0"]))
def test_subnet_layout_is_disjoint_inside_the_vpc_and_usable(prefixlen, azs, base):
    vpc = ipaddress.IPv4Network(f"{base}/{prefixlen}")
    layout = network.subnet_layout(str(vpc), azs)
    nets = [ipaddress.IPv4Network(c) for c in layout.private + layout.public]
    assert len(layout.private) == len(layout.public) == azs
    assert all(n.subnet_of(vpc) for n in nets)
    assert all(not a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1:])
    assert all(n.prefixlen <= 28 for n in nets), "AWS's smallest subnet is /28"
    # Pods take VPC addresses: each private subnet is larger than each public one.
    assert all(ipaddress.IPv4Network(p).num_addresses > ipaddress.IPv4Network(q).num_addresses
               for p in layout.private for q in layout.public)


@pytest.mark.parametrize("cidr", ["10.0.0.0/15", "10.0.0.0/23"])
def test_subnet_layout_refuses_vpcs_it_cannot_split(cidr):
    with pytest.raises(ValueError):
        network.subnet_layout(cidr, 3)


# ---- IRSA trust -------------------------------------------------------------------------

PROVIDER = "arn:aws:iam::123456789012:oidc-provider/oidc.eks.us-west-2.amazonaws.com/id/ABC"
ISSUER = "oidc.eks.us-west-2.amazonaws.com/id/ABC"


@given(dns_label(63), models, st.sampled_from([ISSUER, "https://" + ISSUER, ISSUER + "/"]))
def test_trust_pins_sub_and_aud_to_exactly_one_service_account(ns, sa, issuer):
    doc = iam.irsa_trust_policy(PROVIDER, issuer, ns, sa)
    (stmt,) = statements(doc)
    assert stmt["Effect"] == "Allow" and stmt["Action"] == "sts:AssumeRoleWithWebIdentity"
    assert stmt["Principal"] == {"Federated": PROVIDER}
    # Only StringEquals: a StringLike would accept wildcards.
    assert list(stmt["Condition"]) == ["StringEquals"]
    assert stmt["Condition"]["StringEquals"] == {
        f"{ISSUER}:sub": f"system:serviceaccount:{ns}:{sa}",
        f"{ISSUER}:aud": "sts.amazonaws.com",
    }


# ---- model role permissions -------------------------------------------------------------

MB, CB = "models-bucket", "cache-bucket"


def obj(bucket: str, key: str) -> str:
    return f"arn:aws:s3:::{bucket}/{key}"


@given(st.from_regex(r"\A[a-z0-9]+(/[a-z0-9.-]+){0,3}\Z", fullmatch=True), models, st.booleans())
def test_model_role_reads_only_its_prefix_and_writes_only_its_cache_prefix(prefix, model, cache):
    doc = iam.model_role_policy("aws", MB, prefix, CB if cache else None, f"{model}/" if cache else None)
    assert allowed(doc, "s3:GetObject", obj(MB, f"{prefix}/model-00001.safetensors"))
    assert allowed(doc, "s3:ListBucket", f"arn:aws:s3:::{MB}", {"s3:prefix": f"{prefix}/"})
    # A sibling prefix that merely starts with the same characters is someone else's model.
    assert not allowed(doc, "s3:GetObject", obj(MB, f"{prefix}-other/config.json"))
    assert not allowed(doc, "s3:ListBucket", f"arn:aws:s3:::{MB}", {"s3:prefix": ""})
    assert not allowed(doc, "s3:ListBucket", f"arn:aws:s3:::{MB}")
    for write in sorted(iam.WRITE_ACTIONS):
        assert not allowed(doc, write, obj(MB, f"{prefix}/model-00001.safetensors"))
    assert not allowed(doc, "s3:DeleteObject", obj(CB, f"{model}/x"))
    assert allowed(doc, "s3:PutObject", obj(CB, f"{model}/abc/rank_0/x")) == cache
    assert allowed(doc, "s3:GetObject", obj(CB, f"{model}/abc/rank_0/x")) == cache
    assert not allowed(doc, "s3:PutObject", obj(CB, f"{model}x/abc"))
    assert not allowed(doc, "s3:PutObject", obj(CB, f"other-{model}/abc"))
    assert allowed(doc, "s3:ListBucket", f"arn:aws:s3:::{CB}", {"s3:prefix": f"{model}/"}) == cache
    assert not allowed(doc, "s3:ListBucket", f"arn:aws:s3:::{CB}", {"s3:prefix": ""})
    for stmt in statements(doc):
        assert stmt["Effect"] == "Allow"
        for r in ([stmt["Resource"]] if isinstance(stmt["Resource"], str) else stmt["Resource"]):
            assert r != "*" and not r.endswith(":::*") and not r.endswith("/*/*")


# ---- bucket policy ----------------------------------------------------------------------

BUCKET = "arn:aws:s3:::b"
ADMIN = "arn:aws:iam::123456789012:role/platform-admin"
VPCE = "vpce-0123456789abcdef0"


@pytest.mark.parametrize("vpce", [None, VPCE])
def test_bucket_policy_denies_every_request_without_tls(vpce):
    doc = iam.bucket_policy("aws", "b", vpce, [ADMIN])
    for action, res in (("s3:GetObject", BUCKET + "/k"), ("s3:PutObject", BUCKET + "/k"),
                        ("s3:PutBucketPolicy", BUCKET), ("s3:ListBucket", BUCKET)):
        assert evaluate(doc, action, res, {"aws:SecureTransport": "false", "aws:PrincipalArn": ADMIN,
                                           "aws:SourceVpce": VPCE}) == DENY
        assert evaluate(doc, action, res, {"aws:SecureTransport": "true", "aws:PrincipalArn": ADMIN,
                                           "aws:SourceVpce": VPCE}) != DENY


def test_endpoint_restriction_denies_data_outside_the_endpoint_but_never_locks_out_admins():
    doc = iam.bucket_policy("aws", "b", VPCE, [ADMIN, "arn:aws:iam::123456789012:role/sso/Admin*"])
    pod = "arn:aws:iam::123456789012:role/ws-dev-m-irsa"
    tls = {"aws:SecureTransport": "true"}
    # The pods, through the endpoint: not denied.
    assert evaluate(doc, "s3:GetObject", BUCKET + "/k", tls | {"aws:PrincipalArn": pod, "aws:SourceVpce": VPCE}) != DENY
    # Anyone else's data access from outside, or through another endpoint: denied.
    for ctx in ({"aws:PrincipalArn": pod}, {"aws:PrincipalArn": pod, "aws:SourceVpce": "vpce-other"}):
        for action in ("s3:GetObject", "s3:PutObject", "s3:DeleteObject"):
            assert evaluate(doc, action, BUCKET + "/k", tls | ctx) == DENY
        assert evaluate(doc, "s3:ListBucket", BUCKET, tls | ctx) == DENY
    # Named admins (also by wildcard) upload weights from a laptop.
    for admin in (ADMIN, "arn:aws:iam::123456789012:role/sso/AdminTeam"):
        assert evaluate(doc, "s3:PutObject", BUCKET + "/k", tls | {"aws:PrincipalArn": admin}) != DENY
    # Bucket configuration stays manageable by the deployer from outside the VPC.
    assert evaluate(doc, "s3:PutBucketPolicy", BUCKET, tls | {"aws:PrincipalArn": pod}) != DENY


def test_policies_serialize_deterministically():
    a = iam.to_json(iam.bucket_policy("aws", "b", VPCE, ["arn:aws:iam::1:role/z", "arn:aws:iam::1:role/a"]))
    b = iam.to_json(iam.bucket_policy("aws", "b", VPCE, ["arn:aws:iam::1:role/a", "arn:aws:iam::1:role/z"]))
    assert a == b
