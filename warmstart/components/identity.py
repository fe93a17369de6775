"""One IAM role per model's ServiceAccount (IRSA), least privilege.

Trust: exactly `system:serviceaccount:<namespace>:<model>` through the cluster's OIDC
provider, `:sub` and `:aud` pinned. Permissions: read that model's prefix of the model
bucket; read/write that model's `<model>/` prefix of the compile-cache bucket.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from ..decisions import iam
from ..plan_aws import AwsPlan

ROLE_POLICY_NAME = "s3-access"


@dataclass(frozen=True)
class ModelRolesArgs:
    """Inputs of the per-model IRSA roles."""

    plan: AwsPlan
    """Role names, namespace and each model's prefixes (plan_aws.py)."""
    oidc_provider_arn: pulumi.Input[str]
    """ARN of the cluster's IAM OIDC provider (the trust policy's Federated principal)."""
    oidc_issuer: pulumi.Input[str]
    """The cluster's OIDC issuer host/path, without `https://` (the condition-key prefix)."""
    model_bucket: pulumi.Input[str]
    """Name of the model bucket."""
    compile_cache_bucket: pulumi.Input[str] | None = None
    """Name of the compile-cache bucket, None when no model uses it."""


class ModelRoles(pulumi.ComponentResource):
    """The IRSA roles of every model."""

    role_arns: dict[str, pulumi.Output[str]]
    """Role ARN per model name, for the ServiceAccount's `eks.amazonaws.com/role-arn`."""

    def __init__(self, name: str, args: ModelRolesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("warmstart:aws:ModelRoles", name, None, opts)
        p = args.plan
        self.role_arns = {}
        cache_bucket = args.compile_cache_bucket if args.compile_cache_bucket is not None else ""
        for a in sorted(p.access, key=lambda a: a.model):
            trust = pulumi.Output.all(args.oidc_provider_arn, args.oidc_issuer).apply(
                lambda v, a=a: iam.to_json(iam.irsa_trust_policy(v[0], v[1], p.namespace, a.service_account)))
            role = aws.iam.Role(
                f"{name}-{a.model}", name=a.role_name, assume_role_policy=trust,
                description=f"warmstart: {p.namespace}/{a.service_account} reads its model weights"
                            + (" and its compile cache" if a.cache_prefix else ""),
                tags={"Name": a.role_name, "warmstart:model": a.model},
                opts=pulumi.ResourceOptions(parent=self))
            policy = pulumi.Output.all(args.model_bucket, cache_bucket).apply(
                lambda v, a=a: iam.to_json(iam.model_role_policy(
                    p.partition, v[0], a.model_prefix, v[1] or None, a.cache_prefix)))
            aws.iam.RolePolicy(f"{name}-{a.model}-s3", role=role.name, name=ROLE_POLICY_NAME,
                               policy=policy, opts=pulumi.ResourceOptions(parent=self))
            self.role_arns[a.model] = role.arn
        self.register_outputs({"roleArns": self.role_arns})
