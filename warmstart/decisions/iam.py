"""IAM and bucket policies as data (pure, no Pulumi).

Components serialize these with `to_json` (inside `Output.apply` where an ARN is only known
at deploy time); nothing here builds JSON by string concatenation.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

VERSION = "2012-10-17"
STS_AUDIENCE = "sts.amazonaws.com"
WEB_IDENTITY_ACTION = "sts:AssumeRoleWithWebIdentity"

# What the VPC-endpoint restriction (bucket_policy) denies outside the endpoint, and why it is
# cut this way:
# - Every action on an object resource (`s3:*` on `<bucket>/*`): reads, writes, deletes, tags,
#   multipart parts, restores. An object-resource statement can never match a bucket-level
#   request, so no bucket configuration call is ever caught by it.
# - The bucket-level listings. `s3:ListBucket` is also what HeadBucket needs ("To use this
#   operation, you must have permissions to perform the s3:ListBucket action",
#   https://docs.aws.amazon.com/AmazonS3/latest/API/API_HeadBucket.html), and
#   terraform-provider-aws, which pulumi-aws wraps, starts every read of an aws.s3.Bucket
#   with HeadBucket (internal/service/s3/bucket.go: resourceBucketRead -> findBucket). So
#   ListBucket gets a statement of its own that also exempts the deploying principal:
#   without that, `pulumi refresh` and every later update of the bucket get 403 outside the
#   VPC. ListObjects needs the same action, so the deployer can list keys (never read them).
# - Nothing else: the rest of what the provider reads and writes is bucket configuration
#   (GetBucketPolicy, GetBucketAcl, GetBucketCORS, GetBucketWebsite, GetBucketVersioning,
#   GetAccelerateConfiguration, GetBucketRequestPayment, GetBucketLogging,
#   GetLifecycleConfiguration, GetReplicationConfiguration, GetEncryptionConfiguration,
#   GetBucketObjectLockConfiguration, GetBucketTagging, GetBucketPublicAccessBlock,
#   GetBucketOwnershipControls and their Put/Delete twins), all on the bucket resource, none
#   denied.
_LISTINGS_ADMINS_ONLY = ("s3:ListBucketMultipartUploads", "s3:ListBucketVersions")
_HEAD_BUCKET_ACTION = "s3:ListBucket"
# Actions that change a bucket's contents; no IRSA role may have any of them on the model bucket.
WRITE_ACTIONS = frozenset({
    "s3:PutObject", "s3:DeleteObject", "s3:DeleteObjectVersion", "s3:AbortMultipartUpload",
    "s3:RestoreObject", "s3:PutObjectAcl", "s3:PutObjectTagging", "s3:ReplicateObject",
})


def to_json(doc: dict[str, Any]) -> str:
    """The one serialization of a policy document: sorted keys, so renders never diff."""
    return json.dumps(doc, sort_keys=True)


def bucket_arn(partition: str, bucket: str) -> str:
    return f"arn:{partition}:s3:::{bucket}"


def objects_arn(partition: str, bucket: str, prefix: str) -> str:
    """Every object under `prefix/` (the prefix is given without its trailing slash)."""
    return f"{bucket_arn(partition, bucket)}/{prefix.strip('/')}/*"


def service_account_subject(namespace: str, service_account: str) -> str:
    return f"system:serviceaccount:{namespace}:{service_account}"


def irsa_trust_policy(oidc_provider_arn: str, oidc_issuer: str, namespace: str, service_account: str) -> dict:
    """Trust for exactly one Kubernetes ServiceAccount through the cluster's OIDC provider
    (https://docs.aws.amazon.com/eks/latest/userguide/associate-service-account-role.html):
    both `:sub` and `:aud` pinned with StringEquals, so no other
    ServiceAccount, and no token minted for another audience, can assume the role."""
    issuer = oidc_issuer.removeprefix("https://").rstrip("/")
    return {
        "Version": VERSION,
        "Statement": [{
            "Sid": "ServiceAccount",
            "Effect": "Allow",
            "Principal": {"Federated": oidc_provider_arn},
            "Action": WEB_IDENTITY_ACTION,
            "Condition": {"StringEquals": {
                f"{issuer}:sub": service_account_subject(namespace, service_account),
                f"{issuer}:aud": STS_AUDIENCE,
            }},
        }],
    }


def _list_under(partition: str, bucket: str, prefix: str) -> dict:
    p = prefix.strip("/")
    return {
        "Effect": "Allow",
        "Action": "s3:ListBucket",
        "Resource": bucket_arn(partition, bucket),
        "Condition": {"StringLike": {"s3:prefix": [f"{p}/", f"{p}/*"]}},
    }


def model_role_policy(partition: str, model_bucket: str, model_prefix: str,
                      cache_bucket: str | None, cache_prefix: str | None) -> dict:
    """What one model's pods may do: read its own weights, and read/write its own key prefix
    of the compile-cache bucket (when it uses the cache). Nothing else: no wildcard resource,
    no write to the model bucket, no delete anywhere."""
    statements = [
        {"Sid": "ReadModelWeights", "Effect": "Allow", "Action": "s3:GetObject",
         "Resource": objects_arn(partition, model_bucket, model_prefix)},
        {"Sid": "ListModelWeights", **_list_under(partition, model_bucket, model_prefix)},
    ]
    if cache_bucket is not None and cache_prefix is not None:
        statements += [
            {"Sid": "ReadWriteCompileCache", "Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"],
             "Resource": objects_arn(partition, cache_bucket, cache_prefix)},
            {"Sid": "ListCompileCache", **_list_under(partition, cache_bucket, cache_prefix)},
        ]
    return {"Version": VERSION, "Statement": statements}


def pool_host_role_policy(partition: str, sources: list[tuple[str, str]] | tuple[tuple[str, str], ...]) -> dict:
    """What a standby pool's engine hosts may do: read each member's weights, (bucket, prefix) by
    member, and nothing else (no compile cache: the hosts keep none; no write anywhere). A host is
    one trust domain, so its role is the union of its members' reads and no more."""
    if not sources:
        raise ValueError("a pool host reads at least one member's weights")
    statements = []
    for i, (bucket, prefix) in enumerate(sorted(set(sources))):
        statements += [
            {"Sid": f"ReadMemberWeights{i}", "Effect": "Allow", "Action": "s3:GetObject",
             "Resource": objects_arn(partition, bucket, prefix)},
            {"Sid": f"ListMemberWeights{i}", **_list_under(partition, bucket, prefix)},
        ]
    return {"Version": VERSION, "Statement": statements}


# What a weights import writes with: PutObject covers CreateMultipartUpload, UploadPart,
# UploadPartCopy and CompleteMultipartUpload; AbortMultipartUpload and ListMultipartUploadParts
# let the managed transfer clean up a failed multipart upload. No delete of any kind.
IMPORT_WRITE_ACTIONS = ("s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts")


def import_role_policy(partition: str, model_bucket: str, model_prefix: str,
                       source_bucket: str | None = None, source_prefix: str | None = None) -> dict:
    """What one model's weights-import Job may do: write (never delete) and read its own model's
    prefix, the read for the idempotency check and the verification, and, for an `import.s3`,
    read the source prefix. Nothing else: not another model's prefix, not the compile cache."""
    statements: list[dict] = [
        {"Sid": "WriteModelWeights", "Effect": "Allow", "Action": list(IMPORT_WRITE_ACTIONS),
         "Resource": objects_arn(partition, model_bucket, model_prefix)},
        {"Sid": "ReadModelWeights", "Effect": "Allow", "Action": "s3:GetObject",
         "Resource": objects_arn(partition, model_bucket, model_prefix)},
        {"Sid": "ListModelWeights", **_list_under(partition, model_bucket, model_prefix)},
    ]
    if source_bucket is not None and source_prefix is not None:
        statements += [
            {"Sid": "ReadImportSource", "Effect": "Allow", "Action": "s3:GetObject",
             "Resource": objects_arn(partition, source_bucket, source_prefix)},
            {"Sid": "ListImportSource", **_list_under(partition, source_bucket, source_prefix)},
        ]
    return {"Version": VERSION, "Statement": statements}


def _arn_like(pattern: str, arn: str) -> bool:
    """IAM's ArnLike on whole ARNs: `*` any run of characters, `?` one character."""
    return re.fullmatch(".*".join(".".join(map(re.escape, part.split("?"))) for part in pattern.split("*")),
                        arn) is not None


def bucket_policy(partition: str, bucket: str, vpc_endpoint_id: str | None = None,
                  admins: Sequence[str] = (), deployers: Sequence[str] = ()) -> dict:
    """Deny every request without TLS. With `vpc_endpoint_id`, also deny what does not come
    through that endpoint (`aws:SourceVpce`; S3 UG "Controlling access from VPC endpoints with
    bucket policies",
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/example-bucket-policies-vpc-endpoint.html):
    - `DenyObjectAccessOutsideVpcEndpoint`: every object action, except by `admins`;
    - `DenyListingOutsideVpcEndpoint`: ListBucketVersions and ListBucketMultipartUploads,
      except by `admins`;
    - `DenyListBucketOutsideVpcEndpoint`: ListBucket, which HeadBucket needs, except by
      `admins` and `deployers` (the principals that run `pulumi up`/`refresh`).
    Bucket configuration actions are in no statement, so a deployer always manages the bucket.

    `admins` and `deployers` are matched against `aws:PrincipalArn` with ArnNotLike: for a
    role session that key is the role's ARN, not the `assumed-role/...` session ARN
    (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_condition-keys.html#condition-keys-principalarn).
    A deployer already matched by an admin pattern is left out, so the document does not
    depend on which admin deployed last.
    """
    resources = [bucket_arn(partition, bucket), f"{bucket_arn(partition, bucket)}/*"]
    statements: list[dict] = [{
        "Sid": "DenyInsecureTransport",
        "Effect": "Deny",
        "Principal": "*",
        "Action": "s3:*",
        "Resource": resources,
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
    }]
    if vpc_endpoint_id is not None:
        admin_arns = sorted(set(admins))
        listers = sorted(set(admin_arns) | {d for d in deployers if not any(_arn_like(a, d) for a in admin_arns)})

        def outside_endpoint_unless(principals: list[str]) -> dict[str, Any]:
            condition: dict[str, Any] = {"StringNotEquals": {"aws:SourceVpce": vpc_endpoint_id}}
            if principals:
                condition["ArnNotLike"] = {"aws:PrincipalArn": principals}
            return condition

        statements += [{
            "Sid": "DenyObjectAccessOutsideVpcEndpoint",
            "Effect": "Deny",
            "Principal": "*",
            "Action": "s3:*",
            "Resource": resources[1],
            "Condition": outside_endpoint_unless(admin_arns),
        }, {
            "Sid": "DenyListingOutsideVpcEndpoint",
            "Effect": "Deny",
            "Principal": "*",
            "Action": list(_LISTINGS_ADMINS_ONLY),
            "Resource": resources[0],
            "Condition": outside_endpoint_unless(admin_arns),
        }, {
            "Sid": "DenyListBucketOutsideVpcEndpoint",
            "Effect": "Deny",
            "Principal": "*",
            "Action": _HEAD_BUCKET_ACTION,
            "Resource": resources[0],
            "Condition": outside_endpoint_unless(listers),
        }]
    return {"Version": VERSION, "Statement": statements}
