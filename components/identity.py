"""One IAM role for one model's ServiceAccount (IRSA), least privilege; and one for its weights import.

Trust: exactly `system:serviceaccount:<namespace>:<serviceAccount>` through the cluster's OIDC
provider, `:sub` and `:aud` both pinned
(https://docs.aws.amazon.com/eks/latest/userguide/associate-service-account-role.html).
Permissions: read the model's prefix of its weights bucket; read/write the model's own
`<model>/` prefix of the compile-cache bucket when one is given. No write to the weights, no
delete, no wildcard resource.

`ModelImportRole` is the separate role of a model's weights-import Job (ServiceAccount
`<model>-import`): it may write only the model's own prefix (no delete) and read the S3 prefix
it imports from; the serving role never gains a write to the weights.
"""

from typing import NotRequired, Optional, TypedDict

import pulumi
import pulumi_aws as aws

from warmstart.config import S3_URI
from warmstart.decisions import iam, naming
from warmstart.errors import ConfigError
from warmstart.plan.aws import ImportAccess, ModelAccess, import_access, model_access

ROLE_POLICY_NAME = "s3-access"
IMPORT_POLICY_NAME = "weights-import"


class ModelRoleArgs(TypedDict):
    """Inputs of the ModelRole component."""

    model_name: str
    """The model's name: its key prefix in the compile-cache bucket, and the default
    ServiceAccount name."""
    source: str
    """`s3://bucket/prefix` of the model's weights: the role may read exactly that prefix."""
    namespace: str
    """Namespace of the ServiceAccount that assumes the role."""
    oidc_provider_arn: pulumi.Input[str]
    """ARN of the cluster's IAM OIDC provider (the trust policy's Federated principal)."""
    oidc_issuer: pulumi.Input[str]
    """The cluster's OIDC issuer, with or without `https://` (the trust conditions' key prefix)."""
    name_prefix: str
    """Prefix of the role's name: `<namePrefix>-<model>-irsa`."""
    region: str
    """AWS region (the partition of the ARNs)."""
    service_account: NotRequired[str]
    """The ServiceAccount that assumes the role (default: the model's name)."""
    compile_cache_bucket: NotRequired[pulumi.Input[str]]
    """Name of the compile-cache bucket; without it the role gets no cache access at all."""


class ModelRole(pulumi.ComponentResource):
    """The IRSA role one model's pods assume: read its weights, read/write its compile cache."""

    role_arn: pulumi.Output[str]
    """The role's ARN, for the ServiceAccount's `eks.amazonaws.com/role-arn` annotation."""
    role_name: pulumi.Output[str]
    """The role's name."""

    def __init__(self, name: str, args: ModelRoleArgs, opts: Optional[pulumi.ResourceOptions] = None, *,
                 legacy_parent: Optional[pulumi.Input[str]] = None) -> None:
        """Python programs may name `legacy_parent`: the URN of the component that held the role
        and its policy before (the warmstart stack's one `ModelRoles` of every model), so they
        are adopted from there. The engine passes a parent's old URN on to its children only
        when the parent itself was found by an alias (pulumi/pulumi
        `pkg/resource/deploy/step_generator.go` `generateAliases`), and this component is one
        per model where the old one held them all, so the children alias it themselves."""
        super().__init__("warmstart:index:ModelRole", name, None, opts)
        source, namespace = args["source"], args["namespace"]
        children = pulumi.ResourceOptions(parent=self, aliases=[pulumi.Alias(parent=legacy_parent)]
                                          if legacy_parent is not None else None)
        bucket, prefix = _source(source)
        cache_bucket = args.get("compile_cache_bucket")
        # Every decision is made here, from the Args alone, by the pure planner.
        self.access: ModelAccess = model_access(
            args["model_name"], prefix, name_prefix=args["name_prefix"],
            service_account=args.get("service_account"), compile_cache=cache_bucket is not None)
        a, partition = self.access, naming.partition(args["region"])
        trust = pulumi.Output.all(args["oidc_provider_arn"], args["oidc_issuer"]).apply(
            lambda v: iam.to_json(iam.irsa_trust_policy(v[0], v[1].removeprefix("https://"), namespace,
                                                        a.service_account)))
        role = aws.iam.Role(
            name, name=a.role_name, assume_role_policy=trust,
            description=f"warmstart: {namespace}/{a.service_account} reads its model weights"
                        + (" and its compile cache" if a.cache_prefix else ""),
            tags={"Name": a.role_name, "warmstart:model": a.model},
            opts=children)
        policy = pulumi.Output.from_input(cache_bucket if cache_bucket is not None else "").apply(
            lambda cache: iam.to_json(iam.model_role_policy(
                partition, bucket, a.model_prefix, cache or None, a.cache_prefix)))
        attached = aws.iam.RolePolicy(f"{name}-s3", role=role.name, name=ROLE_POLICY_NAME, policy=policy,
                                      opts=children)
        # The ARN resolves only once the policy is attached, so the ServiceAccount (and the pods
        # admitted with it) never assume a role that cannot read the weights yet.
        self.role_arn = pulumi.Output.all(role.arn, attached.id).apply(lambda v: v[0])
        self.role_name = role.name
        self.register_outputs({"roleArn": self.role_arn, "roleName": self.role_name})


def _source(source: str, key: str = "ModelRoleArgs.source") -> tuple[str, str]:
    """(bucket, prefix) of an `s3://bucket/prefix` source, or a ConfigError naming the key."""
    m = S3_URI.match(source)
    if m is None:
        raise ConfigError(key, "must be s3://bucket/prefix with a valid bucket name "
                          "and a non-empty prefix", "give the model's S3 URI", source)
    return m["bucket"], m["prefix"].rstrip("/")


class ModelImportRoleArgs(TypedDict):
    """Inputs of the ModelImportRole component."""

    model_name: str
    """The model's name; the role's ServiceAccount is `<model>-import` unless `serviceAccount` says otherwise."""
    source: str
    """`s3://bucket/prefix` of the model's weights (the model's `source`): the role may write,
    never delete, exactly that prefix."""
    namespace: str
    """Namespace of the import Job's ServiceAccount."""
    oidc_provider_arn: pulumi.Input[str]
    """ARN of the cluster's IAM OIDC provider (the trust policy's Federated principal)."""
    oidc_issuer: pulumi.Input[str]
    """The cluster's OIDC issuer, with or without `https://` (the trust conditions' key prefix)."""
    name_prefix: str
    """Prefix of the role's name: `<namePrefix>-<model>-import` (shortened with a hash past 64 characters)."""
    region: str
    """AWS region (the partition of the ARNs)."""
    import_s3: NotRequired[str]
    """The `s3://bucket/prefix` the weights are imported from, which the role may then read;
    omit it for a Hugging Face import."""
    service_account: NotRequired[str]
    """The ServiceAccount that assumes the role (default `<model>-import`, never the serving one)."""


class ModelImportRole(pulumi.ComponentResource):
    """The IRSA role of one model's weights-import Job: write (never delete) its model's prefix,
    and read the S3 prefix it imports from. The serving role stays read-only."""

    role_arn: pulumi.Output[str]
    """The role's ARN, for the import ServiceAccount's annotation; known only once its policy is
    attached, so a Job that uses it never starts without its permissions."""
    role_name: pulumi.Output[str]
    """The role's name."""

    def __init__(self, name: str, args: ModelImportRoleArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        super().__init__("warmstart:index:ModelImportRole", name, None, opts)
        namespace = args["namespace"]
        bucket, prefix = _source(args["source"], "ModelImportRoleArgs.source")
        src_bucket = src_prefix = None
        if args.get("import_s3") is not None:
            src_bucket, src_prefix = _source(args["import_s3"], "ModelImportRoleArgs.importS3")
        # Every decision is made here, from the Args alone, by the pure planner.
        self.access: ImportAccess = import_access(
            args["model_name"], bucket, prefix, name_prefix=args["name_prefix"], source_bucket=src_bucket,
            source_prefix=src_prefix, service_account=args.get("service_account"))
        a, partition = self.access, naming.partition(args["region"])
        trust = pulumi.Output.all(args["oidc_provider_arn"], args["oidc_issuer"]).apply(
            lambda v: iam.to_json(iam.irsa_trust_policy(v[0], v[1].removeprefix("https://"), namespace,
                                                        a.service_account)))
        role = aws.iam.Role(
            name, name=a.role_name, assume_role_policy=trust,
            description=f"warmstart: {namespace}/{a.service_account} imports the weights of {a.model}",
            tags={"Name": a.role_name, "warmstart:model": a.model, "warmstart:purpose": "weights-import"},
            opts=pulumi.ResourceOptions(parent=self))
        policy = aws.iam.RolePolicy(
            f"{name}-s3-write", role=role.name, name=IMPORT_POLICY_NAME,
            policy=iam.to_json(iam.import_role_policy(partition, a.model_bucket, a.model_prefix,
                                                      a.source_bucket, a.source_prefix)),
            opts=pulumi.ResourceOptions(parent=self))
        self.role_arn = pulumi.Output.all(role.arn, policy.id).apply(lambda v: v[0])
        self.role_name = role.name
        self.register_outputs({"roleArn": self.role_arn, "roleName": self.role_name})
