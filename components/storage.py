"""The model bucket and the compile-cache bucket, each with the baseline a platform team signs
off: private, encrypted at rest, TLS-only, versioned, owner-enforced.
"""

from typing import NotRequired, Optional, Sequence, TypedDict

import pulumi
import pulumi_aws as aws

from warmstart.config import CompileCacheBucketConfig, ModelBucketConfig
from warmstart.decisions import iam
from warmstart.plan.aws import BucketsPlan, plan_buckets

from .section_args import CompileCacheBucketSectionArgs, ModelBucketSectionArgs
from .sections import section_config

# Weight uploads are multi-GiB multipart uploads; parts of an abandoned one are billed until
# aborted.
ABORT_INCOMPLETE_UPLOADS_DAYS = 7
# A cache object replaced or expired is never read again.
CACHE_NONCURRENT_DAYS = 1


# The bucket sections' Args as they were named before they were generated from the config
# (components/section_args.py); Python programs that import these names keep working.
ModelBucketArgs = ModelBucketSectionArgs
CompileCacheBucketArgs = CompileCacheBucketSectionArgs


class ModelStorageArgs(TypedDict):
    """Inputs of the ModelStorage component."""

    name_prefix: str
    """Prefix of derived bucket names and Name tags."""
    region: str
    """AWS region (part of the derived names' hash, and the partition of ARNs)."""
    model_bucket: NotRequired[ModelBucketSectionArgs]
    """The model bucket, as the stack config's `modelBucket` section (default: created, with a
    derived name)."""
    compile_cache: NotRequired[bool]
    """Create the compile-cache bucket (default true)."""
    compile_cache_bucket: NotRequired[CompileCacheBucketSectionArgs]
    """The compile-cache bucket's settings, as the stack config's `compileCacheBucket` section."""
    s3_endpoint_id: NotRequired[pulumi.Input[str]]
    """The S3 Gateway endpoint id the model bucket may be restricted to
    (`modelBucket.restrictToVpcEndpoint`)."""
    account_id: NotRequired[str]
    """AWS account id; part of the derived names' hash, so two accounts' stacks never derive the
    same global bucket name."""
    stack: NotRequired[str]
    """Stack name in the derived names' hash (default: the current Pulumi stack)."""


class SecureBucket(pulumi.ComponentResource):
    """One S3 bucket with warmstart's baseline: public access blocked, SSE-S3 encryption,
    a TLS-only bucket policy, versioning, BucketOwnerEnforced, and lifecycle rules."""

    bucket: pulumi.Output[str]
    """The bucket's name."""
    arn: pulumi.Output[str]
    """The bucket's ARN."""

    def __init__(self, name: str, bucket_name: str, partition: str, name_tag: str,
                 lifecycle_rules: Sequence[aws.s3.BucketLifecycleConfigurationRuleArgs],
                 force_destroy: bool, vpc_endpoint_id: pulumi.Input[str] | None = None,
                 admins: Sequence[str] = (), deployers: Sequence[str] = (), retain: bool = False,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("warmstart:aws:SecureBucket", name, None, opts)
        # `retain`: destroy leaves the bucket and every setting in place (the public access
        # block and the TLS-only policy with it), and only drops them from the stack's state.
        # https://www.pulumi.com/docs/iac/concepts/options/retainondelete/
        bucket = aws.s3.Bucket(f"{name}-bucket", bucket=bucket_name, force_destroy=force_destroy,
                               tags={"Name": name_tag},
                               opts=pulumi.ResourceOptions(parent=self, retain_on_delete=retain))
        # S3 rejects concurrent configuration changes on one bucket ("A conflicting
        # conditional operation is in progress"), so each setting waits for the previous one.
        previous: list[pulumi.Resource] = [bucket]

        def after() -> pulumi.ResourceOptions:
            return pulumi.ResourceOptions(parent=self, depends_on=list(previous), retain_on_delete=retain)

        previous[:] = [aws.s3.BucketPublicAccessBlock(
            f"{name}-public-access", bucket=bucket.bucket, block_public_acls=True, block_public_policy=True,
            ignore_public_acls=True, restrict_public_buckets=True, opts=after())]
        previous[:] = [aws.s3.BucketOwnershipControls(
            f"{name}-ownership", bucket=bucket.bucket,
            # ACLs off: every object belongs to the bucket owner, whoever uploaded it.
            rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"),
            opts=after())]
        previous[:] = [aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-encryption", bucket=bucket.bucket,
            rules=[aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                apply_server_side_encryption_by_default=aws.s3.
                BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                    sse_algorithm="AES256"))],
            opts=after())]
        previous[:] = [aws.s3.BucketVersioning(
            f"{name}-versioning", bucket=bucket.bucket,
            versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(status="Enabled"),
            opts=after())]
        if vpc_endpoint_id is None:
            policy = bucket.bucket.apply(lambda b: iam.to_json(iam.bucket_policy(partition, b)))
        else:
            # The identity running this deployment stays exempt from the endpoint's ListBucket
            # Deny: HeadBucket needs s3:ListBucket, and the provider reads the bucket with it.
            # Named deployers make the policy the same whoever runs (a CI read-only role's
            # preview then sees no change); without them, the running identity is exempt.
            running = pulumi.Output.from_input(list(deployers)) if deployers else \
                _deploying_principal(self).apply(lambda arn: [arn])
            policy = pulumi.Output.all(bucket.bucket, vpc_endpoint_id, running).apply(
                lambda v: iam.to_json(iam.bucket_policy(partition, v[0], v[1], admins, deployers=v[2])))
        previous[:] = [aws.s3.BucketPolicy(f"{name}-policy", bucket=bucket.bucket, policy=policy, opts=after())]
        aws.s3.BucketLifecycleConfiguration(f"{name}-lifecycle", bucket=bucket.bucket,
                                            rules=list(lifecycle_rules), opts=after())
        self.bucket = bucket.bucket
        self.arn = bucket.arn
        self.register_outputs({"bucket": self.bucket, "arn": self.arn})


def _deploying_principal(parent: pulumi.Resource) -> pulumi.Output[str]:
    """The `aws:PrincipalArn` of whoever runs this deployment, through the parent's provider.

    For a role session GetCallerIdentity gives `arn:aws:sts::<acct>:assumed-role/<role>/<session>`,
    but `aws:PrincipalArn` holds the role's own ARN, path included
    (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_condition-keys.html#condition-keys-principalarn).
    `aws.iam.get_session_context` turns the first into the second (`issuer_arn`, found with
    iam:GetRole on that role) and passes any other ARN (IAM user, root) through unchanged
    (terraform-provider-aws internal/service/iam/session_context_data_source.go)."""
    opts = pulumi.InvokeOutputOptions(parent=parent)
    caller = aws.get_caller_identity_output(opts=opts)
    return aws.iam.get_session_context_output(arn=caller.arn, opts=opts).issuer_arn


def _whole_bucket() -> aws.s3.BucketLifecycleConfigurationRuleFilterArgs:
    return aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix="")


def _abort_uploads(days: int) -> aws.s3.BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs:
    return aws.s3.BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs(days_after_initiation=days)


class ModelStorage(pulumi.ComponentResource):
    """The model bucket (created, or an existing one by name) and the compile-cache bucket, both
    private, encrypted, TLS-only and versioned."""

    model_bucket: pulumi.Output[str]
    """Name of the bucket holding every model's weights."""
    model_bucket_arn: pulumi.Output[str]
    """Its ARN."""
    compile_cache_bucket: pulumi.Output[Optional[str]]
    """Name of the compile-cache bucket (one key prefix `<model>/` per model); unset when
    `compileCache` is false."""
    compile_cache_bucket_arn: pulumi.Output[Optional[str]]
    """Its ARN; unset when `compileCache` is false."""

    def __init__(self, name: str, args: ModelStorageArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        super().__init__("warmstart:index:ModelStorage", name, None, opts)
        prefix = args["name_prefix"]
        endpoint = args.get("s3_endpoint_id")
        # Every decision is made here, from the Args alone, by the pure planner; the sections are
        # read through the config models, so their defaults and rules are the stack config's.
        self.plan: BucketsPlan = plan_buckets(
            section_config(ModelBucketConfig, args.get("model_bucket") or {}, "ModelStorageArgs.modelBucket"),
            section_config(CompileCacheBucketConfig, args.get("compile_cache_bucket") or {},
                           "ModelStorageArgs.compileCacheBucket"),
            name_prefix=prefix, stack=args.get("stack") or pulumi.get_stack(), region=args["region"],
            account_id=args.get("account_id"), has_s3_endpoint=endpoint is not None,
            compile_cache=args.get("compile_cache", True), model_key="ModelStorageArgs.modelBucket",
            cache_key="ModelStorageArgs.compileCacheBucket", endpoint_fix="pass s3EndpointId")
        p = self.plan
        child = pulumi.ResourceOptions(parent=self)
        if p.create_model_bucket:
            models = SecureBucket(
                f"{name}-models", p.model_bucket, p.partition, f"{prefix}-models",
                lifecycle_rules=[aws.s3.BucketLifecycleConfigurationRuleArgs(
                    id="abort-incomplete-uploads", status="Enabled", filter=_whole_bucket(),
                    abort_incomplete_multipart_upload=_abort_uploads(ABORT_INCOMPLETE_UPLOADS_DAYS))],
                # Weights are the one thing here that is not cheap to rebuild: `destroy` keeps
                # them unless the stack asks otherwise.
                force_destroy=p.delete_model_bucket_on_destroy, retain=not p.delete_model_bucket_on_destroy,
                vpc_endpoint_id=endpoint if p.restrict_model_bucket_to_endpoint else None,
                admins=p.admins, deployers=p.deployers, opts=child)
            self.model_bucket, self.model_bucket_arn = models.bucket, models.arn
        else:
            self.model_bucket = pulumi.Output.from_input(p.model_bucket)
            self.model_bucket_arn = pulumi.Output.from_input(iam.bucket_arn(p.partition, p.model_bucket))

        self.compile_cache_bucket = self.compile_cache_bucket_arn = None
        if p.compile_cache_bucket is not None:
            cache = SecureBucket(
                f"{name}-compile-cache", p.compile_cache_bucket, p.partition, f"{prefix}-compile-cache",
                lifecycle_rules=[aws.s3.BucketLifecycleConfigurationRuleArgs(
                    id="expire-stale-cache", status="Enabled", filter=_whole_bucket(),
                    expiration=aws.s3.BucketLifecycleConfigurationRuleExpirationArgs(days=p.cache_expire_after_days),
                    noncurrent_version_expiration=aws.s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                        noncurrent_days=CACHE_NONCURRENT_DAYS),
                    abort_incomplete_multipart_upload=_abort_uploads(CACHE_NONCURRENT_DAYS))],
                # Every object can be rebuilt by one compile: let `pulumi destroy` empty it.
                force_destroy=True, opts=child)
            self.compile_cache_bucket, self.compile_cache_bucket_arn = cache.bucket, cache.arn
        self.register_outputs({
            "modelBucket": self.model_bucket,
            "compileCacheBucket": self.compile_cache_bucket,
        })
