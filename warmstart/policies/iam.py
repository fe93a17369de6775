"""IRSA roles: trust pinned to one service account and to STS; no write to the model bucket."""

from __future__ import annotations

import re
from typing import Any, Iterator, Mapping, Sequence

from .records import (
    Resource,
    Violation,
    _any_partition,
    as_list,
    conditions,
    iam_match,
    is_unknown,
    k8s,
    policy_document,
    related,
    statements,
)
from .vllm import vllm_container

ROLE_TYPES = ("aws:iam/role:Role",)
ROLE_POLICY_TYPES = ("aws:iam/rolePolicy:RolePolicy",)
ROLE_POLICY_ATTACHMENT_TYPES = ("aws:iam/rolePolicyAttachment:RolePolicyAttachment",)
POLICY_ATTACHMENT_TYPES = ("aws:iam/policyAttachment:PolicyAttachment",)
POLICY_TYPES = ("aws:iam/policy:Policy",)
WEB_IDENTITY_ACTION = "sts:AssumeRoleWithWebIdentity"
STS_AUDIENCE = "sts.amazonaws.com"
SERVICE_ACCOUNT_SUBJECT = re.compile(r"^system:serviceaccount:[a-z0-9]([-a-z0-9]*[a-z0-9])?:[a-z0-9]([-.a-z0-9]*[a-z0-9])?$")
# AWS managed policies that let a role write any bucket.
BROAD_WRITE_MANAGED_POLICIES = ("AmazonS3FullAccess", "AdministratorAccess", "PowerUserAccess")
# Representative S3 actions that change a bucket or its objects; an Action pattern matching any
# of them is a write.
S3_WRITE_ACTIONS = (
    "s3:PutObject", "s3:PutObjectAcl", "s3:PutObjectTagging", "s3:PutObjectRetention",
    "s3:PutObjectLegalHold", "s3:DeleteObject", "s3:DeleteObjectVersion", "s3:DeleteObjectTagging",
    "s3:AbortMultipartUpload", "s3:RestoreObject", "s3:ReplicateObject", "s3:ReplicateDelete",
    "s3:PutBucketPolicy", "s3:DeleteBucketPolicy", "s3:PutBucketAcl", "s3:PutBucketVersioning",
    "s3:PutLifecycleConfiguration", "s3:PutEncryptionConfiguration", "s3:DeleteBucket",
    "s3:PutBucketPublicAccessBlock", "s3:PutReplicationConfiguration",
)


def _is_web_identity(stmt: Mapping[str, Any]) -> bool:
    principal = stmt.get("Principal")
    federated = as_list(principal.get("Federated")) if isinstance(principal, Mapping) else []
    return (WEB_IDENTITY_ACTION in as_list(stmt.get("Action"))
            and any(isinstance(f, str) and "oidc-provider/" in f for f in federated))


def irsa_trust(role: Resource) -> dict[str, Any] | None:
    """The role's trust policy when it is an IRSA role (an OIDC web-identity trust), else None."""
    doc = policy_document(role.props.get("assumeRolePolicy"))
    if doc is None or not any(_is_web_identity(s) for s in statements(doc)):
        return None
    return doc


def check_irsa_trust(resources: Sequence[Resource]) -> list[Violation]:
    """Every IRSA role's trust: `<issuer>:sub` pinned to exactly one service account and
    `<issuer>:aud` to sts.amazonaws.com, both with StringEquals, on the same issuer."""
    policy = "irsa-trust-pinned"
    found: list[Violation] = []
    for role in (r for r in resources if r.typ in ROLE_TYPES):
        doc = irsa_trust(role)
        if doc is None:
            continue
        for i, s in enumerate(statements(doc)):
            if s.get("Effect") != "Allow" or not _is_web_identity(s):
                continue
            where = f"{role.label()}: trust statement {i}"
            federated = [f for f in as_list(s["Principal"]["Federated"]) if isinstance(f, str)]
            issuers = {f.split("oidc-provider/", 1)[1] for f in federated if "oidc-provider/" in f}
            equals = conditions(s, "StringEquals")
            likes = conditions(s, "StringLike", "StringEqualsIgnoreCase", "ForAnyValue:StringLike",
                               "ForAnyValue:StringEquals", "ForAllValues:StringLike", "StringNotEquals")
            subs = {k: v for k, v in equals.items() if k.endswith(":sub")}
            auds = {k: v for k, v in equals.items() if k.endswith(":aud")}
            loose = sorted(k for k in likes if k.endswith((":sub", ":aud")))
            if loose:
                found.append(Violation(policy, role, f"{where} matches {', '.join(loose)} with an operator other "
                                       "than StringEquals; fix: use StringEquals with exact values"))
            if not subs:
                found.append(Violation(policy, role, f"{where} has no StringEquals '<issuer>:sub' condition, so "
                                       "any service account in the cluster can assume the role; fix: add "
                                       "'<issuer>:sub': 'system:serviceaccount:<namespace>:<name>'"))
            for k, v in subs.items():
                values = as_list(v)
                if any(is_unknown(x) for x in values):
                    continue
                if len(values) != 1 or not isinstance(values[0], str) or not SERVICE_ACCOUNT_SUBJECT.match(values[0]):
                    found.append(Violation(policy, role, f"{where} has {k}={v!r}; it must name exactly one "
                                           "service account; fix: one 'system:serviceaccount:<namespace>:<name>' "
                                           "per role"))
            if not auds:
                found.append(Violation(policy, role, f"{where} has no StringEquals '<issuer>:aud' condition; fix: "
                                       f"add '<issuer>:aud': '{STS_AUDIENCE}'"))
            for k, v in auds.items():
                if not any(is_unknown(x) for x in as_list(v)) and as_list(v) != [STS_AUDIENCE]:
                    found.append(Violation(policy, role, f"{where} has {k}={v!r}; the token audience must be "
                                           f"exactly '{STS_AUDIENCE}'; fix: set it so"))
            keyed = {k.rsplit(":", 1)[0] for k in [*subs, *auds]}
            if issuers and keyed and not keyed <= {i.lower() for i in issuers}:
                found.append(Violation(policy, role, f"{where} conditions name issuer(s) {sorted(keyed)} but "
                                       f"the trusted provider is {sorted(issuers)}; fix: key the conditions by "
                                       "the provider's issuer (its URL without https://)"))
    return found


def _model_buckets(resources: Sequence[Resource]) -> set[str]:
    """Buckets the vLLM Deployments stream weights from (their `s3://bucket/prefix` model)."""
    out = set()
    for dep in k8s(resources, "Deployment", "apps"):
        c = vllm_container(dep)
        if c is None:
            continue
        for a in [*as_list(c.get("args")), *as_list(c.get("command"))]:
            if isinstance(a, str):
                m = re.match(r"^(?:--model=)?s3://([^/]+)/", a)
                if m:
                    out.add(m.group(1))
    return out


def _writes(stmt: Mapping[str, Any], bucket: str) -> bool:
    if stmt.get("Effect") != "Allow":
        return False
    if "NotAction" in stmt:
        excluded = [a for a in as_list(stmt["NotAction"]) if isinstance(a, str)]
        acts = [w for w in S3_WRITE_ACTIONS if not any(iam_match(p, w, False) for p in excluded)]
    else:
        pats = [a for a in as_list(stmt.get("Action")) if isinstance(a, str)]
        acts = [w for w in S3_WRITE_ACTIONS if any(iam_match(p, w, False) for p in pats)]
    if not acts:
        return False
    targets = (f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/any-object")
    if "NotResource" in stmt:
        excluded = [_any_partition(r) for r in as_list(stmt["NotResource"]) if isinstance(r, str)]
        return any(not any(iam_match(p, t) for p in excluded) for t in targets)
    res = [_any_partition(r) for r in as_list(stmt.get("Resource")) if isinstance(r, str)]
    return any(iam_match(p, t) for p in res for t in targets)


def _role_policies(resources: Sequence[Resource], role: Resource) -> Iterator[tuple[str, Any]]:
    """(where, policy document value) for every policy granted to the role."""
    for p in as_list(role.props.get("inlinePolicies")):
        if isinstance(p, Mapping):
            yield f"inline policy {p.get('name')!r}", p.get("policy")
    for rp in related(resources, ROLE_POLICY_TYPES, "role", role)[0]:
        yield f"role policy {rp.name}", rp.props.get("policy")
    arns = [a.props.get("policyArn") for a in related(resources, ROLE_POLICY_ATTACHMENT_TYPES, "role", role)[0]]
    arns += [a.props.get("policyArn") for a in related(resources, POLICY_ATTACHMENT_TYPES, "roles", role)[0]]
    arns += as_list(role.props.get("managedPolicyArns"))
    managed = [r for r in resources if r.typ in POLICY_TYPES]
    for arn in arns:
        if not isinstance(arn, str):
            continue
        if arn.split(":")[4:5] == ["aws"] and arn.rsplit("/", 1)[-1] in BROAD_WRITE_MANAGED_POLICIES:
            yield f"AWS managed policy {arn}", {"Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
        for pol in managed:
            if arn in pol.identities():
                yield f"policy {pol.name}", pol.props.get("policy")


def check_irsa_model_write(resources: Sequence[Resource]) -> list[Violation]:
    """No IRSA role (nor a role whose trust is not known yet) may write the model bucket: the
    serving pods only read weights, and a compromised pod must not be able to replace them."""
    policy = "irsa-no-model-bucket-write"
    buckets = _model_buckets(resources)
    found: list[Violation] = []
    if not buckets:
        return found
    for role in (r for r in resources if r.typ in ROLE_TYPES):
        if irsa_trust(role) is None and not is_unknown(role.props.get("assumeRolePolicy")):
            continue
        for where, value in _role_policies(resources, role):
            doc = policy_document(value)
            if doc is None:
                continue
            for bucket in sorted(buckets):
                if any(_writes(s, bucket) for s in statements(doc)):
                    found.append(Violation(policy, role, f"{role.label()}: {where} allows writing the model "
                                           f"bucket '{bucket}'; serving roles only read weights; fix: grant "
                                           "s3:GetObject (and s3:ListBucket) on it, write access only to the "
                                           "compile-cache bucket"))
    return found
