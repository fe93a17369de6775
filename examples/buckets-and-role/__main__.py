"""The model and compile-cache buckets and one model's IRSA role, for a cluster you already run.

ModelStorage creates both buckets with warmstart's baseline (private, encrypted, TLS-only,
versioned, owner-enforced); ModelRole trusts exactly one ServiceAccount of the cluster's OIDC
provider and may read only the model's weights and read/write only its own cache prefix.
"""

import pulumi
from warmstart_components import ModelRole, ModelRoleArgs, ModelStorage, ModelStorageArgs

cfg = pulumi.Config()
region, prefix, model = cfg.require("region"), cfg.require("namePrefix"), cfg.require("model")
storage = ModelStorage("storage", ModelStorageArgs(name_prefix=prefix, region=region))
role = ModelRole(f"{model}-role", ModelRoleArgs(
    model_name=model,
    # The bucket's name is decided when the program runs (storage.plan), so it is plain here.
    source=f"s3://{storage.plan.model_bucket}/{cfg.require('prefix')}",
    namespace=cfg.get("namespace") or "inference",
    oidc_provider_arn=cfg.require("oidcProviderArn"),
    oidc_issuer=cfg.require("oidcIssuer"),
    name_prefix=prefix,
    region=region,
    compile_cache_bucket=storage.compile_cache_bucket,
))
pulumi.export("modelBucket", storage.model_bucket)
pulumi.export("compileCacheBucket", storage.compile_cache_bucket)
pulumi.export("roleArn", role.role_arn)
