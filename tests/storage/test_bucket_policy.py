"""The model bucket's policy with `restrictToVpcEndpoint`, checked by evaluating requests (the
identity policy and the bucket policy together, tests/support/policy_eval.py): the identity that
deploys keeps managing and reading the bucket's configuration from outside the VPC, object
data stays reachable only through the endpoint or by admins, and plain HTTP is denied to all."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.support.policy_eval import ALLOW, DENY, evaluate_all, statements
from warmstart import mocks
from warmstart.decisions import iam

ACCOUNT = "123456789012"
BUCKET = "ws-prod-models-0a1b2c3d"
BUCKET_ARN = f"arn:aws:s3:::{BUCKET}"
PREFIX = "qwen/Qwen2.5-7B"
OBJECT = f"{BUCKET_ARN}/{PREFIX}/model-00001-of-00004.safetensors"
VPCE = "vpce-0123456789abcdef0"

DEPLOYER = f"arn:aws:iam::{ACCOUNT}:role/ci/warmstart-deploy"
ADMIN = f"arn:aws:iam::{ACCOUNT}:role/platform-admin"
SSO_ADMINS = f"arn:aws:iam::{ACCOUNT}:role/aws-reserved/sso.amazonaws.com/AWSReservedSSO_Admin_*"
SSO_ADMIN = f"arn:aws:iam::{ACCOUNT}:role/aws-reserved/sso.amazonaws.com/AWSReservedSSO_Admin_0123abcd"
POD = f"arn:aws:iam::{ACCOUNT}:role/ws-prod-qwen-irsa"
OTHER = f"arn:aws:iam::{ACCOUNT}:role/data-science"

# Identity policies: the deployer, the admins and any other team role may do anything in S3
# by their own IAM policy; a model's pods have exactly their ModelRole policy.
S3_ANYTHING = {"Version": iam.VERSION, "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
POD_POLICY = iam.model_role_policy("aws", BUCKET, PREFIX, None, None)

# What pulumi-aws (terraform-provider-aws) calls on an aws.s3.Bucket and its configuration
# resources to read and update them, as IAM actions, all on the bucket resource: HeadBucket is
# s3:ListBucket (internal/service/s3/bucket.go resourceBucketRead; API_HeadBucket.html), the
# rest are the GetBucket*/Put*/Delete* calls of the Bucket, BucketPolicy, BucketVersioning,
# BucketPublicAccessBlock, BucketOwnershipControls, BucketServerSideEncryptionConfiguration
# and BucketLifecycleConfiguration resources.
PROVIDER_READS = (
    "s3:ListBucket", "s3:GetBucketPolicy", "s3:GetBucketAcl", "s3:GetBucketCORS", "s3:GetBucketWebsite",
    "s3:GetBucketVersioning", "s3:GetAccelerateConfiguration", "s3:GetBucketRequestPayment",
    "s3:GetBucketLogging", "s3:GetLifecycleConfiguration", "s3:GetReplicationConfiguration",
    "s3:GetEncryptionConfiguration", "s3:GetBucketObjectLockConfiguration", "s3:GetBucketLocation",
    "s3:GetBucketTagging", "s3:GetBucketPublicAccessBlock", "s3:GetBucketOwnershipControls",
)
PROVIDER_WRITES = (
    "s3:PutBucketPolicy", "s3:DeleteBucketPolicy", "s3:PutBucketVersioning", "s3:PutEncryptionConfiguration",
    "s3:PutLifecycleConfiguration", "s3:PutBucketPublicAccessBlock", "s3:PutBucketOwnershipControls",
    "s3:PutBucketTagging", "s3:DeleteBucket",
)
OBJECT_ACTIONS = (
    "s3:GetObject", "s3:GetObjectVersion", "s3:GetObjectAttributes", "s3:GetObjectTagging", "s3:PutObject",
    "s3:PutObjectTagging", "s3:DeleteObject", "s3:DeleteObjectVersion", "s3:AbortMultipartUpload",
    "s3:ListMultipartUploadParts", "s3:RestoreObject",
)
LISTINGS = ("s3:ListBucket", "s3:ListBucketVersions", "s3:ListBucketMultipartUploads")


def restricted(admins=(ADMIN, SSO_ADMINS), deployers=(DEPLOYER,)) -> dict:
    return iam.bucket_policy("aws", BUCKET, VPCE, list(admins), deployers=list(deployers))


def outside(principal: str | None, **extra: Any) -> dict[str, Any]:
    """A TLS request from outside the VPC (no aws:SourceVpce), signed by `principal` (None:
    anonymous, so no aws:PrincipalArn either)."""
    ctx: dict[str, Any] = {"aws:SecureTransport": "true"}
    if principal is not None:
        ctx["aws:PrincipalArn"] = principal
    return ctx | extra


def through_endpoint(principal: str, vpce: str = VPCE, **extra: Any) -> dict[str, Any]:
    return outside(principal, **extra) | {"aws:SourceVpce": vpce}


def assert_deployer_manages_the_bucket(policy: dict) -> None:
    """The deployer, outside the VPC and not an admin, may HeadBucket (s3:ListBucket) and read
    and write every bucket setting the provider manages: nothing in the bucket policy denies it."""
    for action in PROVIDER_READS + PROVIDER_WRITES:
        got = evaluate_all([S3_ANYTHING, policy], action, BUCKET_ARN, outside(DEPLOYER))
        assert got == ALLOW, f"{action} by the deployer outside the VPC: {got}"


# ---- the deployer -----------------------------------------------------------------------

def test_the_deployer_reads_and_updates_the_bucket_from_outside_the_vpc():
    assert_deployer_manages_the_bucket(restricted())


def _without_deployer_exemption(policy: dict) -> dict:
    broken = copy.deepcopy(policy)
    for st in statements(broken):
        arns = st.get("Condition", {}).get("ArnNotLike", {}).get("aws:PrincipalArn")
        if arns and DEPLOYER in arns:
            arns.remove(DEPLOYER)
    assert broken != policy, "the deployer exemption was not found to remove"
    return broken


@pytest.mark.parametrize("broken", [
    _without_deployer_exemption(restricted()),
    restricted(deployers=()),
], ids=["exemption-removed", "no-deployer-passed"])
def test_the_deployer_check_fails_on_a_policy_that_locks_the_deployer_out(broken):
    with pytest.raises(AssertionError, match="s3:ListBucket"):
        assert_deployer_manages_the_bucket(broken)


def test_the_deployer_gets_no_object_data_and_no_other_listing_outside_the_vpc():
    doc = restricted()
    for action in OBJECT_ACTIONS:
        assert evaluate_all([S3_ANYTHING, doc], action, OBJECT, outside(DEPLOYER)) == DENY, action
    for action in ("s3:ListBucketVersions", "s3:ListBucketMultipartUploads"):
        assert evaluate_all([S3_ANYTHING, doc], action, BUCKET_ARN, outside(DEPLOYER)) == DENY, action


def test_a_deployer_who_is_an_admin_does_not_change_the_document():
    """Whichever admin deploys, the policy stays the same (no diff between two admins' runs)."""
    base = restricted(deployers=())
    assert restricted(deployers=(ADMIN,)) == base
    assert restricted(deployers=(SSO_ADMIN,)) == base  # matched by the wildcard
    assert restricted(deployers=(DEPLOYER,)) != base


def test_the_document_does_not_depend_on_input_order():
    a = iam.to_json(restricted(admins=(SSO_ADMINS, ADMIN), deployers=(DEPLOYER, OTHER)))
    b = iam.to_json(restricted(admins=(ADMIN, SSO_ADMINS, ADMIN), deployers=(OTHER, DEPLOYER)))
    assert a == b


# ---- admins, pods, everyone else -----------------------------------------------------------

@pytest.mark.parametrize("admin", [ADMIN, SSO_ADMIN])
def test_an_admin_outside_the_vpc_reads_and_writes_objects_and_lists(admin):
    doc = restricted()
    for action in OBJECT_ACTIONS:
        assert evaluate_all([S3_ANYTHING, doc], action, OBJECT, outside(admin)) == ALLOW, action
    for action in LISTINGS:
        assert evaluate_all([S3_ANYTHING, doc], action, BUCKET_ARN, outside(admin)) == ALLOW, action


def test_a_model_role_reads_its_weights_through_the_endpoint():
    doc = restricted()
    assert evaluate_all([POD_POLICY, doc], "s3:GetObject", OBJECT, through_endpoint(POD)) == ALLOW
    assert evaluate_all([POD_POLICY, doc], "s3:ListBucket", BUCKET_ARN,
                        through_endpoint(POD, **{"s3:prefix": f"{PREFIX}/"})) == ALLOW


@pytest.mark.parametrize("principal,identity", [(POD, POD_POLICY), (OTHER, S3_ANYTHING), (None, S3_ANYTHING)],
                         ids=["model-role", "other-role", "anonymous"])
@pytest.mark.parametrize("where", ["outside", "another-endpoint"])
def test_anyone_not_exempt_is_denied_objects_and_listing_unless_through_the_endpoint(principal, identity, where):
    doc = restricted()
    ctx = outside(principal) if where == "outside" else outside(principal) | {"aws:SourceVpce": "vpce-other"}
    for action in OBJECT_ACTIONS:
        assert evaluate_all([identity, doc], action, OBJECT, ctx) == DENY, action
    for action in LISTINGS:
        assert evaluate_all([identity, doc], action, BUCKET_ARN, ctx | {"s3:prefix": f"{PREFIX}/"}) == DENY, action


def test_through_the_endpoint_the_bucket_policy_denies_nobody_over_tls():
    doc = restricted()
    for principal in (POD, OTHER, DEPLOYER, ADMIN):
        for action in OBJECT_ACTIONS:
            assert evaluate_all([S3_ANYTHING, doc], action, OBJECT, through_endpoint(principal)) == ALLOW
        for action in LISTINGS + PROVIDER_READS:
            assert evaluate_all([S3_ANYTHING, doc], action, BUCKET_ARN, through_endpoint(principal)) == ALLOW


@pytest.mark.parametrize("doc", [restricted(), iam.bucket_policy("aws", BUCKET)], ids=["restricted", "baseline"])
def test_plain_http_is_denied_to_everyone(doc):
    for principal in (DEPLOYER, ADMIN, SSO_ADMIN, POD, OTHER, None):
        for via in ({}, {"aws:SourceVpce": VPCE}):
            ctx = outside(principal) | via | {"aws:SecureTransport": "false"}
            for action in OBJECT_ACTIONS:
                assert evaluate_all([S3_ANYTHING, doc], action, OBJECT, ctx) == DENY, (principal, action)
            for action in LISTINGS + PROVIDER_READS + PROVIDER_WRITES:
                assert evaluate_all([S3_ANYTHING, doc], action, BUCKET_ARN, ctx) == DENY, (principal, action)


# ---- the component resolves the deployer ----------------------------------------------------

def _model_bucket_policy(monkeypatch, caller_arn: str | None = None, deployers: tuple[str, ...] = ()) -> dict:
    """The model bucket's policy that ModelStorage registers under the mocks, restricted to an
    endpoint; `caller_arn`: what GetCallerIdentity answers (default: the mocks' own caller)."""
    import json

    from components import ModelStorage

    if caller_arn is not None:
        real_call = mocks.FakeCloud.call

        def call(self, args):
            if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
                return {"accountId": ACCOUNT, "arn": caller_arn, "userId": "AROAEXAMPLE:session"}
            return real_call(self, args)

        monkeypatch.setattr(mocks.FakeCloud, "call", call)

    def build():
        ModelStorage("storage", {
            "name_prefix": "ws-unit", "region": "us-east-1", "account_id": ACCOUNT, "stack": "unit",
            "model_bucket": {"restrict_to_vpc_endpoint": True, "admins": [ADMIN], "deployers": list(deployers)},
            "s3_endpoint_id": VPCE, "compile_cache": False,
        })

    found = mocks.run(build, region="us-east-1", stack="unit")
    (policy,) = [r.inputs["policy"] for r in found if r.typ == "aws:s3/bucketPolicy:BucketPolicy"]
    return json.loads(policy)


def _list_bucket_exempt(policy: dict) -> list[str]:
    (st,) = [s for s in statements(policy) if s.get("Sid") == "DenyListBucketOutsideVpcEndpoint"]
    return st["Condition"]["ArnNotLike"]["aws:PrincipalArn"]


def test_model_storage_exempts_the_identity_that_deploys(monkeypatch):
    policy = _model_bucket_policy(monkeypatch)
    caller = f"arn:aws:iam::{mocks.FAKE_ACCOUNT}:user/render"  # the mocks' GetCallerIdentity
    assert _list_bucket_exempt(policy) == sorted([ADMIN, caller])
    assert evaluate_all([S3_ANYTHING, policy], "s3:ListBucket", f"arn:aws:s3:::{_bucket(policy)}",
                        outside(caller)) == ALLOW


def test_model_storage_exempts_an_assumed_roles_role_not_its_session(monkeypatch):
    session = f"arn:aws:sts::{ACCOUNT}:assumed-role/warmstart-deploy/GitHubActions"
    policy = _model_bucket_policy(monkeypatch, session)
    assert _list_bucket_exempt(policy) == sorted([ADMIN, f"arn:aws:iam::{ACCOUNT}:role/warmstart-deploy"])


def _bucket(policy: dict) -> str:
    (st,) = [s for s in statements(policy) if s.get("Sid") == "DenyListBucketOutsideVpcEndpoint"]
    return st["Resource"].removeprefix("arn:aws:s3:::")


def test_named_deployers_make_the_policy_the_same_whoever_runs(monkeypatch):
    """A CI deploy role and its read-only drift-check role, both named: each keeps HeadBucket,
    and the document does not change with the identity that runs the preview."""
    reader = f"arn:aws:iam::{ACCOUNT}:role/ci/warmstart-read-only"
    by_deployer = _model_bucket_policy(monkeypatch, f"arn:aws:sts::{ACCOUNT}:assumed-role/warmstart-deploy/ci",
                                       deployers=(DEPLOYER, reader))
    by_reader = _model_bucket_policy(monkeypatch, f"arn:aws:sts::{ACCOUNT}:assumed-role/warmstart-read-only/ci",
                                     deployers=(DEPLOYER, reader))
    assert by_deployer == by_reader
    assert _list_bucket_exempt(by_reader) == sorted([ADMIN, DEPLOYER, reader])
    for principal in (DEPLOYER, reader):
        assert evaluate_all([S3_ANYTHING, by_reader], "s3:ListBucket", f"arn:aws:s3:::{_bucket(by_reader)}",
                            outside(principal)) == ALLOW
        assert evaluate_all([S3_ANYTHING, by_reader], "s3:GetObject", f"arn:aws:s3:::{_bucket(by_reader)}/x",
                            outside(principal)) == DENY
