"""IAM and bucket policies as data (pure, no Pulumi).

Components serialize these with `to_json` (inside `Output.apply` where an ARN is only known
at deploy time); nothing here builds JSON by string concatenation.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

VERSION = "2012-10-17"
STS_AUDIENCE = "sts.amazonaws.com"
WEB_IDENTITY_ACTION = "sts:AssumeRoleWithWebIdentity"

# Object and listing actions (data plane) that the VPC-endpoint restriction denies outside
# the endpoint. Bucket configuration actions (PutBucketPolicy and friends) are deliberately
# not in it: the deployer, running outside the VPC, must still be able to manage the bucket.
DATA_ACTIONS = (
    "s3:AbortMultipartUpload",
    "s3:DeleteObject",
    "s3:DeleteObjectVersion",
    "s3:GetObject",
    "s3:GetObjectAttributes",
    "s3:GetObjectVersion",
    "s3:ListBucket",
    "s3:ListBucketMultipartUploads",
    "s3:ListBucketVersions",
    "s3:ListMultipartUploadParts",
    "s3:PutObject",
    "s3:RestoreObject",
)
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


def bucket_policy(partition: str, bucket: str, vpc_endpoint_id: str | None = None,
                  admins: Sequence[str] = ()) -> dict:
    """Deny every request without TLS; with `vpc_endpoint_id`, also deny object reads, writes
    and listings that do not come through that endpoint, unless the caller is one of `admins`
    (S3 UG "Controlling access from VPC endpoints with bucket policies",
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/example-bucket-policies-vpc-endpoint.html).

    The endpoint Deny is scoped to DATA_ACTIONS so the deployer is never locked out of the
    bucket's configuration, and the admin exemption keeps weight uploads possible from
    outside the VPC.
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
        condition: dict[str, Any] = {"StringNotEquals": {"aws:SourceVpce": vpc_endpoint_id}}
        if admins:
            condition["ArnNotLike"] = {"aws:PrincipalArn": sorted(admins)}
        statements.append({
            "Sid": "DenyDataAccessOutsideVpcEndpoint",
            "Effect": "Deny",
            "Principal": "*",
            "Action": list(DATA_ACTIONS),
            "Resource": resources,
            "Condition": condition,
        })
    return {"Version": VERSION, "Statement": statements}
