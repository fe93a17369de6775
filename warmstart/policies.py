"""warmstart's guardrails as pure checks over a stack's resources.

Every check is a function `(resources) -> list[Violation]` over `Resource(typ, name, props)`
records. The SAME functions run in two places:

- inside the Pulumi policy pack (`policy/`, adapters in `warmstart/policy_pack.py`) on what a
  real `pulumi preview` / `up` is about to deploy: props are the engine's view of the resource,
  with values not known yet during a preview replaced by `UNKNOWN`;
- in tests, over `warmstart.render.run_program(...)` (`from_rendered()`), where the Pulumi mocks
  answered every registration.

A check never reports what it cannot see: an `UNKNOWN` value (a preview of a resource whose
inputs come from resources not created yet) skips that part of the check, and the same check
runs again on `up` with the values resolved. Relationships between resources (a bucket and its
public access block, a subnet and its route table) are followed both by value (names, ids,
ARNs) and by the engine's property dependencies, so they hold in a preview too.

No Pulumi import here: the checks depend only on the decision modules' constants and rules.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping, Sequence

from .decisions import instances, placement, tuning

# Kept in serving.py, where the Deployment is written; imported so the key is spelled once.
from .decisions.placement import ANNOTATION_DOMAIN


# --------------------------------------------------------------------------------------
# Records


class _Unknown:
    """A value the engine does not know yet (preview of a resource that depends on others)."""

    _instance: "_Unknown | None" = None

    def __new__(cls) -> "_Unknown":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<unknown>"


UNKNOWN: Any = _Unknown()


def is_unknown(value: Any) -> bool:
    return value is UNKNOWN


@dataclass(frozen=True)
class Resource:
    """One resource as a policy sees it: Pulumi type token, logical name, properties."""

    typ: str
    name: str
    props: Mapping[str, Any]
    urn: str = ""
    deps: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Property name -> keys (URNs) of the resources that property was computed from."""

    @property
    def key(self) -> str:
        return self.urn or f"{self.typ}::{self.name}"

    def identities(self) -> set[str]:
        """The values other resources may reference this one by: id, ARN, name, bucket."""
        return {v for k in ("id", "arn", "name", "bucket") if isinstance(v := self.props.get(k), str)}

    def get(self, *path: str | int, default: Any = None) -> Any:
        """A nested property; `default` where a step is missing, UNKNOWN where one is unknown."""
        cur: Any = self.props
        for p in path:
            if is_unknown(cur):
                return UNKNOWN
            if isinstance(p, int):
                if not isinstance(cur, list) or p >= len(cur):
                    return default
                cur = cur[p]
            else:
                if not isinstance(cur, Mapping) or p not in cur:
                    return default
                cur = cur[p]
        return cur

    def label(self) -> str:
        """How a message names the resource: its Kubernetes name or physical name, and logical name."""
        meta = self.props.get("metadata")
        if isinstance(meta, Mapping) and isinstance(meta.get("name"), str):
            ns = meta.get("namespace")
            return f"{self.props.get('kind', self.typ)} {ns + '/' if isinstance(ns, str) else ''}{meta['name']}"
        physical = next((v for k in ("bucket", "name") if isinstance(v := self.props.get(k), str)), None)
        kind = self.typ.rsplit(":", 1)[-1]
        return f"{kind} '{physical}' ({self.name})" if physical and physical != self.name else f"{kind} '{self.name}'"


@dataclass(frozen=True)
class Violation:
    policy: str
    resource: Resource
    message: str

    def __str__(self) -> str:
        return f"[{self.policy}] {self.message}"


def as_resources(items: Iterable[Any]) -> list[Resource]:
    """Resources from Resource, (typ, name, props) tuples, or objects with typ/name/inputs."""
    out = []
    for it in items:
        if isinstance(it, Resource):
            out.append(it)
        elif isinstance(it, tuple):
            out.append(Resource(*it))
        else:
            out.append(Resource(it.typ, it.name, it.inputs))
    return out


def from_rendered(rendered: Any) -> list[Resource]:
    """Records for a `render.run_program()` result, with the outputs the Pulumi mocks answered
    (ids, ARNs, names), which is what other resources referenced during the render."""
    from .render import FakeCloud  # late: render pulls in the Pulumi SDK
    from pulumi.runtime import MockResourceArgs

    mocks = FakeCloud(region=rendered.stack_plan.config.region)
    out = []
    for r in rendered.resources:
        rid, outputs = mocks.new_resource(MockResourceArgs(r.typ, r.name, dict(r.inputs)))
        out.append(Resource(r.typ, r.name, {"id": rid} | outputs))
    return out


# --------------------------------------------------------------------------------------
# Helpers


def refers(src: Resource, prop: str, target: Resource) -> bool | None:
    """Does `src.props[prop]` reference `target`? True, False, or None (not knowable yet)."""
    deps = src.deps.get(prop, ())
    if target.key in deps:
        return True
    value = src.props.get(prop)
    values = value if isinstance(value, list) else [value]
    ids = target.identities()
    if any(isinstance(v, str) and v in ids for v in values):
        return True
    # An unknown value came from other resources' outputs, and the engine lists every one of
    # them as a dependency of the property: with dependencies recorded, absence is an answer.
    return None if any(is_unknown(v) for v in values) and not deps else False


def related(resources: Sequence[Resource], types: Iterable[str], prop: str, target: Resource
            ) -> tuple[list[Resource], bool]:
    """Resources of `types` whose `prop` references `target`, and whether some might (unknown)."""
    types = set(types)
    found, maybe = [], False
    for r in resources:
        if r.typ in types:
            hit = refers(r, prop, target)
            if hit:
                found.append(r)
            elif hit is None:
                maybe = True
    return found, maybe


def as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def policy_document(value: Any) -> dict[str, Any] | None:
    """An IAM policy as data (JSON string or object); None when unknown or not parseable."""
    if is_unknown(value) or value is None:
        return None
    if isinstance(value, Mapping):
        return dict(value)
    try:
        doc = json.loads(value)
    except (TypeError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def statements(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [s for s in as_list(doc.get("Statement")) if isinstance(s, Mapping)]


def iam_match(pattern: str, value: str, case_sensitive: bool = True) -> bool:
    """IAM wildcard matching: `*` any run, `?` one character, nothing else special."""
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, value, 0 if case_sensitive else re.IGNORECASE) is not None


def conditions(stmt: Mapping[str, Any], *operators: str) -> dict[str, Any]:
    """Condition keys (lower-cased; IAM condition keys are case-insensitive) under `operators`."""
    cond = stmt.get("Condition")
    out: dict[str, Any] = {}
    if not isinstance(cond, Mapping):
        return out
    wanted = {o.lower() for o in operators}
    for op, block in cond.items():
        if op.lower() in wanted and isinstance(block, Mapping):
            for k, v in block.items():
                out[k.lower()] = v
    return out


_QUANTITY = re.compile(r"^([0-9.]+(?:[eE][-+]?[0-9]+)?)([KMGTPE]i?|k|m)?$")
_SUFFIX = {None: 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60, "m": 1e-3}


def quantity_bytes(q: Any) -> float | None:
    """A Kubernetes quantity ("80Gi", "500G", 1000) in bytes; None if unparseable."""
    if isinstance(q, (int, float)) and not isinstance(q, bool):
        return float(q)
    if not isinstance(q, str):
        return None
    m = _QUANTITY.match(q.strip())
    return float(m.group(1)) * _SUFFIX[m.group(2)] if m else None


def k8s(resources: Sequence[Resource], kind: str, group: str | None = None) -> list[Resource]:
    """Kubernetes objects of a kind (and API group), whatever type token they came in as."""
    out = []
    for r in resources:
        if not r.typ.startswith("kubernetes:") or r.props.get("kind") != kind:
            continue
        api = r.props.get("apiVersion")
        if group is None or (isinstance(api, str) and api.rsplit("/", 1)[0] == group):
            out.append(r)
    return out


# --------------------------------------------------------------------------------------
# S3 buckets: private, encrypted, TLS-only, versioned

BUCKET_TYPES = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")
PUBLIC_ACCESS_BLOCK_TYPES = ("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",)
ACCOUNT_PUBLIC_ACCESS_BLOCK_TYPES = ("aws:s3/accountPublicAccessBlock:AccountPublicAccessBlock",)
ENCRYPTION_TYPES = (
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2",
)
VERSIONING_TYPES = ("aws:s3/bucketVersioning:BucketVersioning", "aws:s3/bucketVersioningV2:BucketVersioningV2")
BUCKET_POLICY_TYPES = ("aws:s3/bucketPolicy:BucketPolicy",)
PUBLIC_ACCESS_FLAGS = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
SSE_ALGORITHMS = ("AES256", "aws:kms", "aws:kms:dsse")
PARTITIONS = ("aws", "aws-cn", "aws-us-gov")


def _find_values(obj: Any, key: str) -> list[Any]:
    if isinstance(obj, Mapping):
        return [v for k, x in obj.items() for v in ([x] if k == key else []) + _find_values(x, key)]
    if isinstance(obj, list):
        return [v for x in obj for v in _find_values(x, key)]
    return []


def _denies_insecure_transport(doc: Mapping[str, Any], bucket: str | None) -> bool:
    for s in statements(doc):
        if s.get("Effect") != "Deny":
            continue
        principal = s.get("Principal")
        if not (principal == "*" or (isinstance(principal, Mapping) and "*" in as_list(principal.get("AWS")))):
            continue
        if not any(a in ("*", "s3:*") for a in as_list(s.get("Action"))):
            continue
        flags = conditions(s, "Bool", "BoolIfExists").get("aws:securetransport")
        if not any(str(f).lower() == "false" for f in as_list(flags)):
            continue
        if bucket is not None:
            res = [r for r in as_list(s.get("Resource")) if isinstance(r, str)]
            need = (f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/any-object")
            if not all(any(iam_match(_any_partition(r), n) for r in res) for n in need):
                continue
        return True
    return False


def _any_partition(arn_pattern: str) -> str:
    for p in PARTITIONS:
        if arn_pattern.startswith(f"arn:{p}:"):
            return "arn:aws:" + arn_pattern[len(f"arn:{p}:"):]
    return arn_pattern


def check_buckets(resources: Sequence[Resource]) -> list[Violation]:
    """Every S3 bucket: public access block all true, default encryption, a bucket policy
    denying non-TLS requests, versioning enabled."""
    policy = "s3-bucket-guardrails"
    found: list[Violation] = []
    account_pab = [r for r in resources if r.typ in ACCOUNT_PUBLIC_ACCESS_BLOCK_TYPES
                   and all(r.props.get(f) is True for f in PUBLIC_ACCESS_FLAGS)]
    for b in (r for r in resources if r.typ in BUCKET_TYPES):
        name = b.props.get("bucket") if isinstance(b.props.get("bucket"), str) else None

        def bad(msg: str) -> None:
            found.append(Violation(policy, b, f"{b.label()}: {msg}"))

        pabs, maybe = related(resources, PUBLIC_ACCESS_BLOCK_TYPES, "bucket", b)
        if not pabs and not maybe and not account_pab:
            bad("has no public access block; fix: add an aws.s3.BucketPublicAccessBlock with "
                + ", ".join(f"{f}=True" for f in PUBLIC_ACCESS_FLAGS))
        for pab in pabs:
            off = [f"{f}={pab.props.get(f)!r}" for f in PUBLIC_ACCESS_FLAGS
                   if not is_unknown(pab.props.get(f)) and pab.props.get(f) is not True]
            if off:
                bad(f"public access block {pab.name} has {', '.join(off)}; all four settings must be "
                    "true so no ACL or policy can make the bucket public; fix: set them to True")

        sses, maybe = related(resources, ENCRYPTION_TYPES, "bucket", b)
        inline = b.props.get("serverSideEncryptionConfiguration")
        algos = _find_values([s.props.get("rules") for s in sses] + [inline], "sseAlgorithm")
        if not is_unknown(inline) and not maybe and not any(a in SSE_ALGORITHMS for a in algos if not is_unknown(a)) \
                and not any(is_unknown(a) for a in algos):
            bad(f"has no default encryption ({'sseAlgorithm=' + repr(algos) if algos else 'no SSE configuration'}); "
                f"fix: add an aws.s3.BucketServerSideEncryptionConfiguration with sseAlgorithm one of {SSE_ALGORITHMS}")

        pols, maybe = related(resources, BUCKET_POLICY_TYPES, "bucket", b)
        docs = [policy_document(p.props.get("policy")) for p in pols]
        if not maybe and all(d is not None for d in docs) and not any(_denies_insecure_transport(d, name) for d in docs):
            bad("its bucket policy does not deny requests without TLS; fix: add a statement Effect=Deny, "
                "Principal='*', Action='s3:*', Resource=[bucket ARN, bucket ARN + '/*'], "
                "Condition={'Bool': {'aws:SecureTransport': 'false'}}" if pols else
                "has no bucket policy, so plain-HTTP requests are allowed; fix: add an aws.s3.BucketPolicy "
                "denying s3:* when aws:SecureTransport is false")

        vers, maybe = related(resources, VERSIONING_TYPES, "bucket", b)
        statuses = [v.get("versioningConfiguration", "status") for v in vers]
        inline_v = b.get("versioning", "enabled")
        if not maybe and not is_unknown(inline_v) and not any(is_unknown(s) for s in statuses) \
                and "Enabled" not in statuses and inline_v is not True:
            bad(f"is not versioned ({'status ' + repr(statuses) if statuses else 'no BucketVersioning'}); an "
                "overwritten or deleted object cannot be recovered; fix: add an aws.s3.BucketVersioning with "
                "versioningConfiguration.status='Enabled'")
    return found


# --------------------------------------------------------------------------------------
# IRSA roles: trust pinned to one service account and STS; no write to the model bucket

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


# --------------------------------------------------------------------------------------
# Network: the GPU subnets' route tables carry the S3 Gateway endpoint

SUBNET_TYPES = ("aws:ec2/subnet:Subnet",)
ROUTE_TABLE_TYPES = ("aws:ec2/routeTable:RouteTable",)
ROUTE_TABLE_ASSOCIATION_TYPES = ("aws:ec2/routeTableAssociation:RouteTableAssociation",)
ROUTE_TYPES = ("aws:ec2/route:Route",)
INTERNET_GATEWAY_TYPES = ("aws:ec2/internetGateway:InternetGateway",)
VPC_ENDPOINT_TYPES = ("aws:ec2/vpcEndpoint:VpcEndpoint",)
ENDPOINT_ROUTE_TABLE_ASSOCIATION_TYPES = ("aws:ec2/vpcEndpointRouteTableAssociation:VpcEndpointRouteTableAssociation",)


def _is_s3_gateway(ep: Resource) -> bool | None:
    service, kind = ep.props.get("serviceName"), ep.props.get("vpcEndpointType")
    if is_unknown(service) or is_unknown(kind):
        return None
    # vpcEndpointType defaults to Gateway (pulumi-aws 7.51.1).
    return (isinstance(service, str) and re.fullmatch(r"com\.amazonaws\.[a-z0-9-]+\.s3", service) is not None
            and (kind is None or str(kind).lower() == "gateway"))


def _public_route_tables(resources: Sequence[Resource]) -> set[str]:
    """Keys of route tables with a route to an internet gateway."""
    igws = [r for r in resources if r.typ in INTERNET_GATEWAY_TYPES]
    out = set()
    for rt in (r for r in resources if r.typ in ROUTE_TABLE_TYPES):
        routes = related(resources, ROUTE_TYPES, "routeTableId", rt)[0]
        inline = [x for x in as_list(rt.props.get("routes")) if isinstance(x, Mapping)]
        gws = [x.props.get("gatewayId") for x in routes] + [x.get("gatewayId") for x in inline]
        if any(isinstance(g, str) and g.startswith("igw-") for g in gws) or any(
                refers(x, "gatewayId", igw) for x in routes for igw in igws):
            out.add(rt.key)
    return out


def _has_unknown(value: Any) -> bool:
    if isinstance(value, Mapping):
        return any(_has_unknown(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_unknown(v) for v in value)
    return is_unknown(value)


def _selected_subnets(resources: Sequence[Resource], subnets: list[Resource]) -> list[Resource] | None:
    """Subnets the GPU node classes select (`subnetSelectorTerms` by tag or id, or, in a
    preview where the ids are unknown, the subnets their spec depends on); None when no
    selector can be read."""
    terms: list[Mapping[str, Any]] = []
    depended: set[str] = set()
    unreadable = False
    for nc in gpu_node_classes(resources).values():
        if nc is None:
            continue
        raw = nc.get("spec", "subnetSelectorTerms")
        unreadable |= _has_unknown(raw)
        terms += [t for t in as_list(raw) if isinstance(t, Mapping) and not _has_unknown(t)]
        depended |= set(nc.deps.get("spec", ()))
    chosen = []
    for s in subnets:
        tags = s.props.get("tags") if isinstance(s.props.get("tags"), Mapping) else {}
        for t in terms:
            by_tag = isinstance(t.get("tags"), Mapping) and t["tags"] and all(
                v == "*" and k in tags or tags.get(k) == v for k, v in t["tags"].items())
            by_id = isinstance(t.get("id"), str) and t["id"] in s.identities()
            if by_tag or by_id:
                chosen.append(s)
                break
        else:
            if s.key in depended:
                chosen.append(s)
    if not terms and not unreadable or unreadable and not chosen:
        return None
    return chosen


def check_gpu_subnets_s3_endpoint(resources: Sequence[Resource]) -> list[Violation]:
    """The route table of every subnet GPU nodes run in is on an S3 Gateway endpoint, so weight
    pulls bypass NAT (field notes 3). GPU subnets: those the GPU node classes select; failing
    that, every subnet of the stack without a route to an internet gateway."""
    policy = "gpu-subnets-s3-gateway-endpoint"
    found: list[Violation] = []
    endpoints = [(ep, _is_s3_gateway(ep)) for ep in resources if ep.typ in VPC_ENDPOINT_TYPES]
    s3_endpoints = [ep for ep, is_s3 in endpoints if is_s3 is not False]
    subnets = [r for r in resources if r.typ in SUBNET_TYPES]
    serves_gpus = bool(gpu_node_pools(resources)) or bool(vllm_deployments(resources))
    if not s3_endpoints:
        if subnets or serves_gpus:
            anchor = subnets[0] if subnets else next(iter(vllm_deployments(resources) or resources))
            found.append(Violation(policy, anchor, "the stack has no S3 Gateway VPC endpoint, so GPU nodes pull "
                                   "weights through NAT (shared bandwidth, per-GB charge); fix: set "
                                   "warmstart:network.s3GatewayEndpoint: true"))
        return found
    if not subnets:
        # An existing VPC: its subnets and their route tables are not in the stack; the endpoint
        # must at least carry route tables (the configured private ones).
        for ep in s3_endpoints:
            rts = ep.props.get("routeTableIds")
            assoc = related(resources, ENDPOINT_ROUTE_TABLE_ASSOCIATION_TYPES, "vpcEndpointId", ep)
            if not is_unknown(rts) and not as_list(rts) and not assoc[0] and not assoc[1]:
                found.append(Violation(policy, ep, f"{ep.label()} is on no route table; fix: list the private "
                                       "subnets' route tables in warmstart:network.privateRouteTableIds"))
        return found

    public = _public_route_tables(resources)
    selected = _selected_subnets(resources, subnets)
    tables = {rt.key: rt for rt in resources if rt.typ in ROUTE_TABLE_TYPES}
    candidates = selected if selected is not None else subnets
    for s in candidates:
        assocs, maybe = related(resources, ROUTE_TABLE_ASSOCIATION_TYPES, "subnetId", s)
        rts = [rt for a in assocs for rt in tables.values() if refers(a, "routeTableId", rt)]
        if selected is None and any(rt.key in public for rt in rts):
            continue  # a public subnet: no GPU node runs there
        if not assocs:
            if not maybe:
                found.append(Violation(policy, s, f"{s.label()} has no route table association in the stack, so "
                                       "it uses the VPC's main route table, which no S3 endpoint is on; fix: "
                                       "associate it with a private route table on the endpoint"))
            continue
        for rt in rts:
            on = [refers(ep, "routeTableIds", rt) for ep in s3_endpoints]
            on += [refers(a, "routeTableId", rt) for ep in s3_endpoints
                   for a in related(resources, ENDPOINT_ROUTE_TABLE_ASSOCIATION_TYPES, "vpcEndpointId", ep)[0]]
            if not any(on) and None not in on:
                found.append(Violation(policy, s, f"{s.label()} (GPU nodes) routes through {rt.label()}, which is "
                                       "not on the S3 Gateway endpoint, so weight pulls go through NAT; fix: add "
                                       "the route table to the endpoint's routeTableIds"))
    return found


# --------------------------------------------------------------------------------------
# Node classes: GPU nodes' compile cache on NVMe

NODEPOOL_GROUP = "karpenter.sh"
AUTO_NODECLASS = ("eks.amazonaws.com", "NodeClass")
KARPENTER_NODECLASS = ("karpenter.k8s.aws", "EC2NodeClass")
INSTANCE_TYPE_LABEL = placement.INSTANCE_TYPE_LABEL
# Auto Mode's default NodeClass ephemeral storage when `ephemeralStorage.size` is not set
# (eks-facts 2.1).
AUTO_DEFAULT_EPHEMERAL_BYTES = 80 * 2**30
RAID0 = "RAID0"


def vllm_deployments(resources: Sequence[Resource]) -> list[Resource]:
    return [d for d in k8s(resources, "Deployment", "apps") if vllm_container(d) is not None]


def gpu_node_pools(resources: Sequence[Resource]) -> list[Resource]:
    """NodePools GPU pods land on: tainted for GPUs, or selected by a vLLM Deployment."""
    wanted = set()
    for d in vllm_deployments(resources):
        sel = d.get("spec", "template", "spec", "nodeSelector", default={})
        if isinstance(sel, Mapping) and isinstance(sel.get(placement.NODEPOOL_LABEL), str):
            wanted.add(sel[placement.NODEPOOL_LABEL])
    out = []
    for np in k8s(resources, "NodePool", NODEPOOL_GROUP):
        taints = as_list(np.get("spec", "template", "spec", "taints"))
        tainted = any(isinstance(t, Mapping) and t.get("key") == placement.GPU_TAINT_KEY for t in taints)
        if tainted or np.get("metadata", "name") in wanted:
            out.append(np)
    return out


def gpu_node_classes(resources: Sequence[Resource]) -> dict[str, Resource | None]:
    """NodePool key -> the node class its nodeClassRef names (None when not in the stack)."""
    out: dict[str, Resource | None] = {}
    for np in gpu_node_pools(resources):
        ref = np.get("spec", "template", "spec", "nodeClassRef", default={})
        ref = ref if isinstance(ref, Mapping) else {}
        match = [nc for nc in k8s(resources, str(ref.get("kind")), ref.get("group"))
                 if nc.get("metadata", "name") == ref.get("name")]
        out[np.key] = match[0] if match else None
    return out


def _requirement(np: Resource, key: str) -> list[Mapping[str, Any]]:
    reqs = as_list(np.get("spec", "template", "spec", "requirements"))
    return [r for r in reqs if isinstance(r, Mapping) and r.get("key") == key]


def _pool_nvme(np: Resource, mode_domain: str) -> tuple[float | None, str]:
    """The smallest NVMe capacity (bytes) any node of the pool can have, and how it was found."""
    types = [v for r in _requirement(np, INSTANCE_TYPE_LABEL) if r.get("operator") == "In"
             for v in as_list(r.get("values"))]
    if types:
        known = instances.catalog()
        unknown = [t for t in types if t not in known]
        if unknown:
            return None, f"instance type(s) {unknown} are not in warmstart's GPU table"
        smallest = min(types, key=lambda t: known[t].nvme_total_bytes)
        return float(known[smallest].nvme_total_bytes), f"{smallest} has {known[smallest].nvme_total_gb} GB of NVMe"
    bounds = []
    for r in _requirement(np, f"{mode_domain}/instance-local-nvme"):
        vals = as_list(r.get("values"))
        if r.get("operator") in ("Gt", "Gte") and vals and str(vals[0]).isdigit():
            # The label is EC2's TotalSizeInGB (decimal GB; eks-facts 1.4).
            bounds.append(int(vals[0]) * instances.GB + (instances.GB if r.get("operator") == "Gt" else 0))
    if bounds:
        return float(max(bounds)), f"the pool requires {mode_domain}/instance-local-nvme above {max(bounds) // instances.GB - 1} GB"
    return None, ("the pool neither pins instance types (node.kubernetes.io/instance-type In) nor requires "
                  f"{mode_domain}/instance-local-nvme, so its nodes may have no NVMe")


def check_gpu_node_classes_nvme(resources: Sequence[Resource]) -> list[Violation]:
    """The node class of every GPU NodePool puts node ephemeral storage (and the compile-cache
    hostPath) on the NVMe instance store: Auto Mode only when `ephemeralStorage.size` is below
    the pool's smallest NVMe capacity; Karpenter only with `instanceStorePolicy: RAID0`.
    Otherwise Kubernetes silently creates the hostPath on the root EBS volume (field notes 4)."""
    policy = "gpu-node-classes-nvme"
    found: list[Violation] = []
    pools = {np.key: np for np in gpu_node_pools(resources)}
    for key, nc in gpu_node_classes(resources).items():
        np = pools[key]
        ref = np.get("spec", "template", "spec", "nodeClassRef", default={})
        if nc is None:
            found.append(Violation(policy, np, f"{np.label()} uses {ref.get('kind')} '{ref.get('name')}', which this "
                                   "stack does not declare, so its NVMe backing cannot be checked; fix: give GPU "
                                   "pools a node class declared in the stack"))
            continue
        group = str(nc.props.get("apiVersion", "")).rsplit("/", 1)[0]
        domain = placement.LABEL_DOMAIN["auto" if group == AUTO_NODECLASS[0] else "karpenter"]
        nvme, why = _pool_nvme(np, domain)
        if nvme is not None and nvme <= 0:
            found.append(Violation(policy, nc, f"{nc.label()} serves {np.label()}, whose {why}: no instance store, "
                                   "so the compile cache can only land on EBS; fix: use instance types with NVMe"))
            continue
        if (group, nc.props.get("kind")) == AUTO_NODECLASS:
            size_q = nc.get("spec", "ephemeralStorage", "size")
            if is_unknown(size_q):
                continue
            size = AUTO_DEFAULT_EPHEMERAL_BYTES if size_q is None else quantity_bytes(size_q)
            shown = size_q or "80Gi (default)"
            if size is None:
                found.append(Violation(policy, nc, f"{nc.label()}: ephemeralStorage.size={size_q!r} is not a quantity"))
            elif nvme is None:
                found.append(Violation(policy, nc, f"{nc.label()} serves {np.label()}: {why}; Auto Mode uses NVMe only "
                                       f"when ephemeralStorage.size ({shown}) is below the instance's NVMe; fix: pin "
                                       "instance types with NVMe in the pool"))
            elif size >= nvme:
                found.append(Violation(policy, nc, f"{nc.label()}: ephemeralStorage.size={shown} is not below the "
                                       f"NVMe capacity ({why}); Auto Mode then skips the RAID0 and the compile cache "
                                       f"lands on EBS; fix: set ephemeralStorage.size below {int(nvme // 2**30)}Gi"))
        elif (group, nc.props.get("kind")) == KARPENTER_NODECLASS:
            isp = nc.get("spec", "instanceStorePolicy")
            if is_unknown(isp):
                continue
            if isp != RAID0:
                found.append(Violation(policy, nc, f"{nc.label()} serves {np.label()} with instanceStorePolicy={isp!r}; "
                                       "without RAID0 Karpenter ignores the NVMe and /mnt/k8s-disks/0 does not exist, "
                                       "so the compile cache lands on EBS; fix: set spec.instanceStorePolicy: RAID0"))
            elif nvme is None:
                found.append(Violation(policy, nc, f"{nc.label()} serves {np.label()}: {why}; fix: pin instance types "
                                       "with NVMe in the pool"))
    return found


# --------------------------------------------------------------------------------------
# vLLM Deployments

GPU_RESOURCE = placement.GPU_RESOURCE
ANNOTATION_WEIGHTS = f"{ANNOTATION_DOMAIN}/weights-bytes"
ANNOTATION_CHUNK = f"{ANNOTATION_DOMAIN}/chunk-bytes"
ANNOTATION_CONCURRENCY = f"{ANNOTATION_DOMAIN}/concurrency"
ANNOTATION_TP = f"{ANNOTATION_DOMAIN}/tensor-parallel-size"
COMPILE_CACHE_ENV = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "VLLM_CACHE_ROOT")
CHUNK_ENV = "RUNAI_STREAMER_CHUNK_BYTESIZE"


def vllm_container(dep: Resource) -> Mapping[str, Any] | None:
    """The vLLM server container of a Deployment (command `vllm ...` or a vLLM image)."""
    for c in as_list(dep.get("spec", "template", "spec", "containers")):
        if not isinstance(c, Mapping):
            continue
        cmd = [x for x in as_list(c.get("command")) if isinstance(x, str)]
        image = c.get("image") if isinstance(c.get("image"), str) else ""
        if (cmd and cmd[0].rsplit("/", 1)[-1] == "vllm") or "vllm" in image.rsplit("/", 1)[-1]:
            return c
    return None


def flag(args: Sequence[Any], *names: str) -> str | None:
    """The value of `--name=value` or `--name value` in an argument list (last wins)."""
    value = None
    args = [a for a in args if isinstance(a, str)]
    for i, a in enumerate(args):
        for n in names:
            if a.startswith(n + "="):
                value = a[len(n) + 1:]
            elif a == n and i + 1 < len(args):
                value = args[i + 1]
    return value


def _args(c: Mapping[str, Any]) -> list[str]:
    return [a for a in [*as_list(c.get("command")), *as_list(c.get("args"))] if isinstance(a, str)]


def _env(c: Mapping[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in as_list(c.get("env")) if isinstance(e, Mapping) and "name" in e}


def _loader_config(c: Mapping[str, Any]) -> dict[str, Any] | None:
    raw = flag(_args(c), "--model-loader-extra-config")
    try:
        doc = json.loads(raw) if raw else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _annotation(dep: Resource, key: str) -> Any:
    ann = dep.get("metadata", "annotations", default={})
    return ann.get(key) if isinstance(ann, Mapping) else None


def _int(v: Any) -> int | None:
    """An integer from an annotation, a quantity string or a number; the engine's wire format
    carries every number as a double, so 2.0 is 2."""
    if isinstance(v, bool):
        return None
    if isinstance(v, float):
        return int(v) if v.is_integer() else None
    try:
        return int(str(v))
    except (TypeError, ValueError):
        return None


def uses_compile_cache(c: Mapping[str, Any]) -> bool:
    env = _env(c)
    mounts = [m.get("mountPath") for m in as_list(c.get("volumeMounts")) if isinstance(m, Mapping)]
    return any(k in env for k in COMPILE_CACHE_ENV) or placement.COMPILE_CACHE_MOUNT in mounts


def check_vllm_eager(resources: Sequence[Resource]) -> list[Violation]:
    """`--enforce-eager` never runs with distributed loading or a compile cache: eager breaks
    distributed loading (error, or a silent fallback to rank-0 loading plus an NCCL
    broadcast) and never writes the compile cache (field notes 2, 4)."""
    policy = "vllm-no-eager-with-distributed-or-cache"
    found = []
    for dep in vllm_deployments(resources):
        c = vllm_container(dep)
        assert c is not None
        if "--enforce-eager" not in _args(c):
            continue
        loader = _loader_config(c) or {}
        if loader.get("distributed") is True:
            found.append(Violation(policy, dep, f"{dep.label()} runs --enforce-eager with distributed loading "
                                   "(--model-loader-extra-config distributed=true); eager breaks it; fix: drop "
                                   "--enforce-eager (warmstart: eager: false) or run at tensorParallelSize 1"))
        if uses_compile_cache(c):
            found.append(Violation(policy, dep, f"{dep.label()} runs --enforce-eager with a compile cache mounted; "
                                   "eager never writes it; fix: drop one (warmstart: eager: false or "
                                   "compileCache: false)"))
    return found


def check_vllm_loader_concurrency(resources: Sequence[Resource]) -> list[Violation]:
    """Streamer concurrency = ceil(weights / chunk) from the sizes the Deployment declares
    (annotations), and the chunk in effect (RUNAI_STREAMER_CHUNK_BYTESIZE) is the declared one
    (field notes 2)."""
    policy = "vllm-loader-concurrency"
    found = []
    for dep in vllm_deployments(resources):
        c = vllm_container(dep)
        assert c is not None
        weights, chunk, declared = (_int(_annotation(dep, k)) for k in (ANNOTATION_WEIGHTS, ANNOTATION_CHUNK,
                                                                        ANNOTATION_CONCURRENCY))
        if None in (weights, chunk, declared) or weights <= 0 or chunk <= 0:
            found.append(Violation(policy, dep, f"{dep.label()} does not declare positive integer annotations "
                                   f"{ANNOTATION_WEIGHTS}, {ANNOTATION_CHUNK} and {ANNOTATION_CONCURRENCY}; fix: "
                                   "deploy it through warmstart, which writes them"))
            continue
        expected = tuning.loader_concurrency(weights, max(chunk, tuning.MIN_S3_CHUNK_BYTES))
        if declared != expected:
            found.append(Violation(policy, dep, f"{dep.label()} declares concurrency {declared} for {weights} bytes "
                                   f"in {chunk}-byte chunks; the rule ceil(weights/chunk) gives {expected}; fix: "
                                   f"concurrency {expected}"))
        loader = _loader_config(c)
        if loader is None:
            found.append(Violation(policy, dep, f"{dep.label()} has no parseable --model-loader-extra-config, so the "
                                   "streamer runs with its default concurrency; fix: pass "
                                   f'--model-loader-extra-config={{"concurrency": {expected}, ...}}'))
        elif loader.get("concurrency") != declared:
            found.append(Violation(policy, dep, f"{dep.label()} streams with concurrency "
                                   f"{loader.get('concurrency')!r} but declares {declared}; fix: make them agree "
                                   f"({expected})"))
        env_chunk = _int(_env(c).get(CHUNK_ENV))
        if env_chunk != chunk:
            found.append(Violation(policy, dep, f"{dep.label()} declares {chunk}-byte chunks but "
                                   f"{CHUNK_ENV}={_env(c).get(CHUNK_ENV)!r}, so the concurrency is computed for "
                                   f"another chunk size; fix: set {CHUNK_ENV}={chunk}"))
    return found


def check_vllm_gpu_equals_tp(resources: Sequence[Resource]) -> list[Violation]:
    """The pod requests exactly tensor-parallel-size (x pipeline-parallel-size) GPUs: fewer and
    vLLM cannot start its ranks, more and GPUs sit idle and block other replicas."""
    policy = "vllm-gpu-request-equals-tp"
    found = []
    for dep in vllm_deployments(resources):
        c = vllm_container(dep)
        assert c is not None
        args = _args(c)
        tp = _int(flag(args, "--tensor-parallel-size", "-tp") or 1)
        pp = _int(flag(args, "--pipeline-parallel-size", "-pp") or 1)
        res = c.get("resources") if isinstance(c.get("resources"), Mapping) else {}
        req = _int((res.get("requests") or {}).get(GPU_RESOURCE)) if isinstance(res.get("requests"), Mapping) else None
        lim = _int((res.get("limits") or {}).get(GPU_RESOURCE)) if isinstance(res.get("limits"), Mapping) else None
        gpus = lim if lim is not None else req
        if tp is None or pp is None:
            found.append(Violation(policy, dep, f"{dep.label()}: --tensor-parallel-size / --pipeline-parallel-size "
                                   "is not an integer"))
            continue
        want = tp * pp
        if req is not None and lim is not None and req != lim:
            found.append(Violation(policy, dep, f"{dep.label()} requests {req} but limits {lim} {GPU_RESOURCE}; "
                                   "extended resources need requests == limits; fix: set both to "
                                   f"{want}"))
        if gpus != want:
            found.append(Violation(policy, dep, f"{dep.label()} gets {gpus if gpus is not None else 'no'} "
                                   f"{GPU_RESOURCE} but runs --tensor-parallel-size={tp}"
                                   f"{f' x --pipeline-parallel-size={pp}' if pp != 1 else ''}; fix: request "
                                   f"{want} GPU(s)"))
        ann_tp = _int(_annotation(dep, ANNOTATION_TP))
        if ann_tp is not None and ann_tp != tp:
            found.append(Violation(policy, dep, f"{dep.label()} declares {ANNOTATION_TP}={ann_tp} but runs "
                                   f"--tensor-parallel-size={tp}; fix: make them agree"))
    return found


def check_vllm_startup_probe(resources: Sequence[Resource]) -> list[Violation]:
    """A startup probe owns the loading phase, so liveness never kills a pod still streaming
    weights or compiling (vLLM binds its port only when ready)."""
    policy = "vllm-startup-probe"
    found = []
    for dep in vllm_deployments(resources):
        c = vllm_container(dep)
        assert c is not None
        probe = c.get("startupProbe")
        if not isinstance(probe, Mapping) or not any(k in probe for k in ("httpGet", "tcpSocket", "exec", "grpc")):
            found.append(Violation(policy, dep, f"{dep.label()} has no startup probe, so the liveness probe runs "
                                   "while weights stream and can kill a loading pod; fix: add a startupProbe on "
                                   "/health whose failureThreshold x periodSeconds covers the start-up budget"))
    return found


# --------------------------------------------------------------------------------------
# The set


@dataclass(frozen=True)
class Check:
    name: str
    description: str
    fn: Callable[[Sequence[Resource]], list[Violation]]
    scope: Literal["stack", "resource"]
    """`resource`: runs per resource before it is created or updated (blocks an `up` early);
    `stack`: sees every resource (relationships), runs after the update on `up`."""
    types: tuple[str, ...] = ()
    """For `resource` scope: the type tokens it applies to (empty: any)."""


CHECKS: tuple[Check, ...] = (
    Check("s3-bucket-guardrails", "S3 buckets are private (public access block all true), encrypted, "
          "TLS-only and versioned", check_buckets, "stack"),
    Check("irsa-trust-pinned", "IRSA role trust is pinned to one service account (:sub) and to "
          "sts.amazonaws.com (:aud)", check_irsa_trust, "resource", ROLE_TYPES),
    Check("irsa-no-model-bucket-write", "No IRSA role can write the model bucket", check_irsa_model_write, "stack"),
    Check("gpu-subnets-s3-gateway-endpoint", "GPU subnets' route tables are on an S3 Gateway endpoint",
          check_gpu_subnets_s3_endpoint, "stack"),
    Check("gpu-node-classes-nvme", "GPU node classes put ephemeral storage on NVMe (Auto Mode: size below "
          "NVMe capacity; Karpenter: instanceStorePolicy RAID0)", check_gpu_node_classes_nvme, "stack"),
    Check("vllm-no-eager-with-distributed-or-cache", "vLLM does not run --enforce-eager with distributed "
          "loading or a compile cache", check_vllm_eager, "resource"),
    Check("vllm-loader-concurrency", "vLLM streamer concurrency matches ceil(weights / chunk) from the declared "
          "sizes", check_vllm_loader_concurrency, "resource"),
    Check("vllm-gpu-request-equals-tp", "vLLM pods request exactly tensor-parallel-size GPUs",
          check_vllm_gpu_equals_tp, "resource"),
    Check("vllm-startup-probe", "vLLM containers have a startup probe", check_vllm_startup_probe, "resource"),
)


def run_all(resources: Iterable[Any]) -> list[Violation]:
    """Every check over a stack's resources."""
    rs = as_resources(resources)
    return [v for c in CHECKS for v in c.fn(rs)]
