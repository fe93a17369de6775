"""S3 buckets: private (public access block), encrypted, TLS-only, versioned."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .records import (
    Resource,
    Violation,
    _any_partition,
    as_list,
    conditions,
    iam_match,
    is_unknown,
    policy_document,
    related,
    statements,
)

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
