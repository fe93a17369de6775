"""IRSA roles: trust pinned to one service account and to STS; no write to the model bucket,
except a model's weights-import role writing exactly its own model's prefix."""

from __future__ import annotations

import re
from typing import Any, Iterator, Mapping, Sequence

from ..decisions import iam as iam_decisions
from ..decisions import weights_import
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
        uri = model_uri(c)
        if uri is not None:
            out.add(uri[0])
    return out


_S3_MODEL = r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/([^\s\"')]+?)/?"


def model_uri(container: Mapping[str, Any]) -> tuple[str, str] | None:
    """(bucket, prefix) of the model a vLLM container streams: its first `s3://` argument, or,
    for a node-cached model, the S3 fallback named in its start-up shell line
    (manifests/node_cache.py `serving_command`)."""
    for a in as_list(container.get("args")):
        m = re.fullmatch(r"(?:--model=)?" + _S3_MODEL, a) if isinstance(a, str) else None
        if m:
            return m.group(1), m.group(2)
    for a in as_list(container.get("command")):
        m = re.search(r"echo " + _S3_MODEL + r"\)", a) if isinstance(a, str) else None
        if m:
            return m.group(1), m.group(2)
    return None


def _may_match_under(pattern: str, prefix: str) -> bool:
    """Whether the IAM pattern matches some string that starts with `prefix` (`*` any run, `?`
    one character): i.e. it reaches at least one object under that prefix."""
    states = {(0, 0)}
    seen = set()
    while states:
        i, j = states.pop()
        if (i, j) in seen:
            continue
        seen.add((i, j))
        if j == len(prefix):
            return True  # every rest of a pattern matches some suffix
        if i == len(pattern):
            continue
        c = pattern[i]
        if c == "*":
            states |= {(i + 1, j), (i, j + 1)}
        elif c == "?" or c == prefix[j]:
            states.add((i + 1, j + 1))
    return False


def _writes(stmt: Mapping[str, Any], bucket: str) -> bool:
    """Whether the statement lets a principal change the bucket or any object in it (a write
    scoped to one prefix counts: `arn:aws:s3:::bucket/some/prefix/*` reaches objects)."""
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
    return any(iam_match(p, targets[0]) or _may_match_under(p, targets[0] + "/") for p in res)


# A model's weights-import Job (warmstart/manifests/weights_import.py) runs as the
# ServiceAccount `<model>-import` and may write exactly these actions on exactly
# `arn:<partition>:s3:::<bucket>/<prefix>/*`, the model's own source: no delete, no other key.
IMPORT_SERVICE_ACCOUNT_SUFFIX = weights_import.service_account("")  # "-import"
IMPORT_WRITE_ACTIONS = frozenset(iam_decisions.IMPORT_WRITE_ACTIONS)
# Tags an import role carries (components/identity.py), read only while its trust is unknown.
IMPORT_PURPOSE_TAG, IMPORT_PURPOSE, MODEL_TAG = "warmstart:purpose", "weights-import", "warmstart:model"


def _model_sources(resources: Sequence[Resource]) -> dict[tuple[str, str], tuple[str, str]]:
    """(namespace, model) -> (bucket, prefix) of each vLLM Deployment's `s3://bucket/prefix`."""
    out = {}
    for dep in k8s(resources, "Deployment", "apps"):
        c = vllm_container(dep)
        meta = dep.props.get("metadata")
        if c is None or not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
            continue
        uri = model_uri(c)
        if uri is not None:
            out[(str(meta.get("namespace") or "default"), meta["name"])] = uri
    return out


def _import_role_of(role: Resource, sources: Mapping[tuple[str, str], tuple[str, str]]
                    ) -> tuple[str, tuple[str, str]] | None:
    """(model, (bucket, prefix)) when the role is that model's weights-import role: its trust names
    exactly `system:serviceaccount:<namespace>:<model>-import` of a Deployment's namespace and
    model. While a preview does not know the trust yet, its import tags stand in (the trust is
    checked by irsa-trust-pinned, and by this check again on `up`)."""
    doc = irsa_trust(role)
    if doc is None:
        if not is_unknown(role.props.get("assumeRolePolicy")):
            return None
        tags = role.props.get("tags")
        if not isinstance(tags, Mapping) or tags.get(IMPORT_PURPOSE_TAG) != IMPORT_PURPOSE:
            return None
        hits = [(model, loc) for (ns, model), loc in sources.items() if model == tags.get(MODEL_TAG)]
        return hits[0] if len(hits) == 1 else None
    subjects = {str(v) for s in statements(doc) if s.get("Effect") == "Allow" and _is_web_identity(s)
                for k, v in conditions(s, "StringEquals").items() if k.endswith(":sub")
                for v in as_list(v)}
    if len(subjects) != 1:
        return None
    m = re.match(r"^system:serviceaccount:([^:]+):(.+)$", subjects.pop())
    if m is None or not m.group(2).endswith(IMPORT_SERVICE_ACCOUNT_SUFFIX):
        return None
    model = m.group(2)[: -len(IMPORT_SERVICE_ACCOUNT_SUFFIX)]
    loc = sources.get((m.group(1), model))
    return (model, loc) if loc else None


def _confined_import_write(stmt: Mapping[str, Any], bucket: str, prefix: str) -> bool:
    """An import role's write statement that touches only its model's prefix with only the
    import's actions: plain Action and Resource lists, no wildcard action, no NotAction or
    NotResource, every resource exactly `arn:<partition>:s3:::<bucket>/<prefix>/*`."""
    if "NotAction" in stmt or "NotResource" in stmt:
        return False
    actions = [a for a in as_list(stmt.get("Action")) if isinstance(a, str)]
    writes = [a for a in actions if any(iam_match(a, w, False) for w in S3_WRITE_ACTIONS)]
    if any(a not in IMPORT_WRITE_ACTIONS for a in writes):
        return False
    own = f"arn:aws:s3:::{bucket}/{prefix.strip('/')}/*"
    resources = as_list(stmt.get("Resource"))
    return bool(resources) and all(isinstance(r, str) and _any_partition(r) == own for r in resources)


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
    serving pods only read weights, and a compromised pod must not be able to replace them.
    The one exception is a model's weights-import role (trusted by exactly the ServiceAccount
    `<model>-import`), and only for statements that write that model's own prefix with the
    import's actions; any other write of it, anywhere in a model bucket, still fails."""
    policy = "irsa-no-model-bucket-write"
    buckets = _model_buckets(resources)
    found: list[Violation] = []
    if not buckets:
        return found
    sources = _model_sources(resources)
    for role in (r for r in resources if r.typ in ROLE_TYPES):
        if irsa_trust(role) is None and not is_unknown(role.props.get("assumeRolePolicy")):
            continue
        importer = _import_role_of(role, sources)
        for where, value in _role_policies(resources, role):
            doc = policy_document(value)
            if doc is None:
                continue
            for bucket in sorted(buckets):
                writes = [s for s in statements(doc) if _writes(s, bucket)]
                if importer is not None:
                    model, (own_bucket, own_prefix) = importer
                    stray = [s for s in writes if not (bucket == own_bucket
                                                       and _confined_import_write(s, own_bucket, own_prefix))]
                    if stray:
                        found.append(Violation(
                            policy, role, f"{role.label()}: {where} allows writing the model bucket '{bucket}' "
                            f"beyond what the weights import of model '{model}' needs; fix: write only "
                            f"{', '.join(sorted(IMPORT_WRITE_ACTIONS))} on arn:aws:s3:::{own_bucket}/"
                            f"{own_prefix}/* (no delete, no wildcard, no other prefix)"))
                    continue
                if writes:
                    found.append(Violation(policy, role, f"{role.label()}: {where} allows writing the model "
                                           f"bucket '{bucket}'; serving roles only read weights; fix: grant "
                                           "s3:GetObject (and s3:ListBucket) on it, write access only to the "
                                           "compile-cache bucket (a weights import has its own role, trusted "
                                           "by `<model>-import`)"))
    return found
