"""The whole warmstart stack as one component: the other components, wired together.

`WarmstartStack` validates the stack config as a whole first (`warmstart.plan.plan_stack`:
every broken rule of every layer, keyed by its config key), then maps the config onto each
component's Args; each component decides inside, from its Args, through the same pure
planners. The stack adds only what no single component owns: the AWS provider, the
namespace, the pod-side scripts shared by the namespace's models, and the order of layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s
from pulumi.runtime import config as runtime_config

from warmstart import config
from warmstart.config import StackConfig
from warmstart.manifests import compile_cache, nvme_check
from warmstart.manifests import weights_import as import_job
from warmstart.plan import StackPlan, plan_stack

from .cluster import Cluster, ClusterArgs
from .identity import ModelImportRole, ModelRole
from .network import Network
from .pod_scripts import PodScript
from .serving import VllmModel, VllmModelArgs
from .storage import ModelStorage

# Type tokens and names the components had before they became `warmstart:index:*` components
# in components/ (deployed stacks hold these in their state). Each alias keeps a resource and,
# through Pulumi's inherited child aliases, everything under it, instead of replacing them.
# tests/test_golden.py proves every URN of the old state still resolves.
# https://www.pulumi.com/docs/iac/concepts/options/aliases/
LEGACY_TYPES = {
    "network": "warmstart:aws:Network",
    "storage": "warmstart:aws:Storage",
    "identity": "warmstart:aws:ModelRoles",
    "cluster": "warmstart:cluster:Cluster",
    "model": "warmstart:serving:VllmModel",
}
# The NVMe start-up check's script component was called "nvme-guard".
LEGACY_NVME_SCRIPT_NAME = "nvme-guard"


def stack_config() -> StackConfig:
    """The stack config Pulumi handed this program (engine environment or mocks)."""
    raw = dict(runtime_config.get_config_env()) | dict(runtime_config.CONFIG.get())
    return config.from_pulumi_config(raw)


def stack_tags(plan: StackPlan) -> dict[str, str]:
    """Tags on every taggable AWS resource; the stack's own tags win over warmstart's."""
    return {"warmstart:stack": plan.stack, "warmstart:prefix": plan.name_prefix} | dict(plan.config.tags)


def _args(**values: Any) -> dict[str, Any]:
    """Component Args without the keys the config leaves unset (the component's defaults apply)."""
    return {k: v for k, v in values.items() if v is not None}


def _aliased(opts: pulumi.ResourceOptions, layer: str) -> pulumi.ResourceOptions:
    return pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
        aliases=[pulumi.Alias(type_=LEGACY_TYPES[layer])]))


@dataclass(frozen=True)
class WarmstartStackArgs:
    """Inputs of the whole stack: one environment's validated config."""

    config: StackConfig
    """The stack config (`stacks/Pulumi.<stack>.yaml`, loaded by `stack_config()`)."""
    stack: str
    """The stack's name (part of derived names)."""


class WarmstartStack(pulumi.ComponentResource):
    """Everything one environment needs to serve its models with fast cold starts."""

    plan: StackPlan
    """Every decision of the stack (also `warmstart render`'s plan.json)."""
    network: Network
    """VPC, subnets and the S3 Gateway endpoint."""
    cluster: Cluster
    """EKS cluster (Auto Mode or Karpenter) and its GPU pools."""
    storage: ModelStorage
    """Model and compile-cache buckets."""
    roles: dict[str, ModelRole]
    """The IRSA role of each model, by model name."""
    import_roles: dict[str, ModelImportRole]
    """The weights-import role of each model with `import`, by model name."""
    models: dict[str, VllmModel]
    """The serving component of each model, by model name."""

    def __init__(self, name: str, args: WarmstartStackArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("warmstart:index:Stack", name, None, opts)
        self.plan = plan = plan_stack(args.config, args.stack)
        cfg = plan.config  # relative model sources resolved into the model bucket
        # An explicit provider, so every AWS resource gets the region and default tags from
        # the stack config and nothing from ambient `aws:` settings.
        self.aws_provider = aws.Provider(
            f"{name}-aws", region=cfg.region,
            default_tags=aws.ProviderDefaultTagsArgs(tags=stack_tags(plan)),
            # A stack that names its account never deploys into another one.
            allowed_account_ids=[cfg.account_id] if cfg.account_id else None,
            opts=pulumi.ResourceOptions(parent=self),
        )
        aws_opts = pulumi.ResourceOptions(parent=self, providers=[self.aws_provider])
        n = cfg.network
        # 1. network: a VPC or an existing one, with the S3 Gateway endpoint.
        # Only the keys the config sets: the component's own defaults and rules apply to the rest.
        self.network = Network(f"{name}-network", _args(
            name_prefix=plan.name_prefix, region=cfg.region,
            karpenter_discovery_cluster=plan.aws.network.karpenter_discovery, **n.model_dump(exclude_unset=True),
        ), opts=_aliased(aws_opts, "network"))
        # 2. cluster: EKS Auto Mode or Karpenter, GPU pools sized for the models on them.
        c = cfg.cluster
        pools = [_args(name=p.name, instance_types=p.instance_types, capacity_types=p.capacity_types,
                       max_gpus=p.max_gpus, ephemeral_storage_gib=p.ephemeral_storage_gib,
                       models=[_args(name=m.name, instance_type=m.instance.instance_type,
                                     tensor_parallel_size=m.tensor_parallel_size, replicas=m.replicas,
                                     compile_cache=m.compile_cache)
                               for m in plan.models if m.pool == p.name])
                 for p in cfg.gpu_pools]
        cluster_args: ClusterArgs = _args(  # type: ignore[assignment]
            cluster_name=plan.cluster.name, mode=cfg.cluster_mode, region=cfg.region,
            vpc_id=self.network.vpc_id, private_subnet_ids=self.network.private_subnet_ids,
            public_subnet_ids=self.network.public_subnet_ids, gpu_pools=pools, name_prefix=plan.name_prefix,
            kubernetes_version=cfg.kubernetes_version, admins=c.admins, viewers=c.viewers, log_types=c.log_types,
            log_retention_days=c.log_retention_days,
            system_node_group=c.system_node_group.model_dump() if c.system_node_group else None,
            tags=stack_tags(plan))
        self.cluster = Cluster(f"{name}-cluster", cluster_args, opts=_aliased(aws_opts, "cluster"))
        # 3. storage and identity: the buckets, then one IRSA role per model.
        mb, cb = cfg.model_bucket, cfg.compile_cache_bucket
        cached = any(m.compile_cache for m in plan.models)
        self.storage = ModelStorage(f"{name}-storage", _args(
            name_prefix=plan.name_prefix, region=cfg.region, stack=args.stack, account_id=cfg.account_id,
            model_bucket=mb.model_dump(exclude_unset=True),
            compile_cache=cached, compile_cache_bucket=_args(name=cb.name, expire_after_days=cb.expire_after_days),
            s3_endpoint_id=self.network.s3_endpoint_id,
        ), opts=_aliased(aws_opts, "storage"))
        self.roles = {
            m.name: ModelRole(f"{name}-identity-{m.name}", _args(
                model_name=m.name, source=m.source, namespace=cfg.namespace,
                oidc_provider_arn=self.cluster.oidc_provider_arn, oidc_issuer=self.cluster.oidc_issuer,
                name_prefix=plan.name_prefix, region=cfg.region,
                compile_cache_bucket=self.storage.compile_cache_bucket if m.compile_cache else None,
            ), opts=_aliased(aws_opts, "identity"))
            for m in sorted(plan.models, key=lambda m: m.name)
        }
        # A model with `import` also gets the role of its import Job: write its own prefix only.
        self.import_roles = {
            m.name: ModelImportRole(f"{name}-import-{m.name}", _args(
                model_name=m.name, source=m.source, namespace=cfg.namespace,
                oidc_provider_arn=self.cluster.oidc_provider_arn, oidc_issuer=self.cluster.oidc_issuer,
                name_prefix=plan.name_prefix, region=cfg.region,
                import_s3=m.weights_import.source if m.weights_import.kind == "s3" else None,
            ), opts=aws_opts)
            for m in sorted(plan.models, key=lambda m: m.name) if m.weights_import is not None
        }

        # 4. serving: the namespace, the pod-side scripts it shares, one VllmModel per model.
        # Every Kubernetes object goes through the cluster's provider, never an ambient kubeconfig.
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=self.cluster.kubernetes_provider)
        namespace = k8s.core.v1.Namespace(
            f"{name}-namespace",
            metadata={"name": cfg.namespace, "labels": {"app.kubernetes.io/part-of": "warmstart"}},
            opts=k8s_opts,
        )
        # The start-up check that the compile cache really is on the node's NVMe, and the
        # cross-node pre-warm of the compile cache from S3, once for the whole namespace.
        script_opts = pulumi.ResourceOptions.merge(k8s_opts, pulumi.ResourceOptions(depends_on=[namespace]))
        scripts = [
            PodScript(f"{name}-nvme-check", cfg.namespace, nvme_check.CONFIGMAP_NAME, nvme_check.SCRIPT_KEY,
                      opts=pulumi.ResourceOptions.merge(script_opts, pulumi.ResourceOptions(
                          aliases=[pulumi.Alias(name=f"{name}-{LEGACY_NVME_SCRIPT_NAME}")]))),
            PodScript(f"{name}-compile-cache", cfg.namespace, compile_cache.CONFIGMAP_NAME,
                      compile_cache.SCRIPT_KEY, opts=script_opts),
        ]
        if self.import_roles:
            scripts.append(PodScript(f"{name}-weights-import", cfg.namespace, import_job.CONFIGMAP_NAME,
                                     import_job.SCRIPT_KEY, opts=script_opts))
        # The token is read as a secret, so it stays encrypted in the state and never reaches
        # plan.json; only the import Jobs of Hugging Face imports get it, through a Secret.
        hf_token = (pulumi.Config(config.NAMESPACE).get_secret("huggingFaceToken")
                    if any(m.weights_import and m.weights_import.kind == "huggingFace" for m in plan.models) else None)
        self.models = {}
        for spec, m in zip(cfg.models, plan.models):
            imp = m.weights_import
            model_args: VllmModelArgs = _args(  # type: ignore[assignment]
                model_name=m.name, source=m.source, weights_gib=spec.weights_gib, instance_type=m.instance.instance_type,
                region=cfg.region, namespace=cfg.namespace,
                tensor_parallel_size=None if spec.tensor_parallel_size == "auto" else spec.tensor_parallel_size,
                replicas=m.replicas, image=m.image, max_model_len=m.max_model_len,
                gpu_memory_utilization=m.gpu_memory_utilization, eager=m.eager, extra_args=list(m.extra_args),
                loader=m.loader.model_dump(), cluster_mode=cfg.cluster_mode, node_pool=m.pool,
                compile_cache=m.compile_cache, compile_cache_host_path=m.compile_cache_host_path,
                compile_cache_bucket=self.storage.compile_cache_bucket if m.compile_cache else None,
                nvme_check=c.nvme_check, role_arn=self.roles[m.name].role_arn, ship_pod_scripts=False,
                weights_import=spec.weights_import.model_dump(exclude_none=True) if spec.weights_import else None,
                import_role_arn=self.import_roles[m.name].role_arn if imp else None,
                hugging_face_token=hf_token if imp and imp.kind == "huggingFace" else None)
            # An import writes into the model bucket, which this same `up` may be creating.
            after = [namespace, *scripts, *self.cluster.ready, *([self.storage] if imp else [])]
            self.models[m.name] = VllmModel(
                f"{name}-{m.name}", model_args,
                opts=_aliased(pulumi.ResourceOptions(parent=self, provider=self.cluster.kubernetes_provider,
                                                     depends_on=after), "model"),
            )
        self.register_outputs({})
