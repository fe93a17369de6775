"""The whole warmstart stack as one component: AWS layer, cluster layer, serving objects."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from ..plan import StackPlan
from .cluster import Cluster, ClusterArgs
from . import compile_cache, nvme_guard
from .compile_cache import compile_cache_extras
from .identity import ModelRoles, ModelRolesArgs
from .network import Network, NetworkArgs
from .nvme_guard import nvme_check_extras
from .podside import PodScript
from .storage import Storage, StorageArgs
from .serving import VllmModel, VllmModelArgs, merge_extras


def stack_tags(plan: StackPlan) -> dict[str, str]:
    """Tags on every taggable AWS resource; the stack's own tags win over warmstart's."""
    return {"warmstart:stack": plan.stack, "warmstart:prefix": plan.name_prefix} | dict(plan.config.tags)


class WarmstartStack(pulumi.ComponentResource):
    """Everything one environment needs to serve its models with fast cold starts."""

    models: dict[str, VllmModel]
    """Serving component per model name."""
    network: Network
    """VPC, subnets and S3 Gateway endpoint: `vpc_id`, `private_subnet_ids`, `public_subnet_ids`,
    `private_route_table_ids`, `s3_endpoint_id`."""
    cluster: Cluster
    """EKS cluster (Auto Mode or Karpenter) and GPU pools: `kubernetes_provider`,
    `oidc_provider_arn`, `oidc_issuer` (no `https://`), `name`, `security_group_id`,
    `gpu_pools`, `karpenter` (karpenter mode), `ready` (what serving pods wait for)."""
    storage: Storage
    """Model and compile-cache buckets: `model_bucket`, `compile_cache_bucket` (names; the
    latter None when no model uses the compile cache) and their `*_arn`."""
    identity: ModelRoles
    """One IRSA role per model: `role_arns[model name]`, annotated on its ServiceAccount."""

    def __init__(self, name: str, plan: StackPlan, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("warmstart:index:Stack", name, None, opts)
        cfg = plan.config
        # An explicit provider, so every AWS resource gets the region and default tags from
        # the stack config and nothing from ambient `aws:` settings.
        self.aws_provider = aws.Provider(
            f"{name}-aws", region=cfg.region,
            default_tags=aws.ProviderDefaultTagsArgs(tags=stack_tags(plan)),
            # A stack that names its account never deploys into another one.
            allowed_account_ids=[cfg.account_id] if cfg.account_id else None,
            opts=pulumi.ResourceOptions(parent=self),
        )
        # Layers, in dependency order (each a component in its own module):
        # 1. network: a VPC or an existing one, with the S3 Gateway endpoint -> self.network
        # 2. cluster: EKS Auto Mode or Karpenter, GPU node pools -> self.cluster (the
        #    Kubernetes provider and the OIDC provider for IRSA)
        # 3. storage + identity: buckets, one IRSA role per model -> self.storage, self.identity
        # 4. serving: one VllmModel per model, on the cluster's provider -> self.models
        assert plan.aws is not None  # plan_stack always plans the AWS layer
        aws_opts = pulumi.ResourceOptions(parent=self, providers=[self.aws_provider])
        self.network = Network(f"{name}-network", NetworkArgs(
            plan=plan.aws.network, name_prefix=plan.name_prefix, region=cfg.region), opts=aws_opts)
        assert plan.cluster is not None  # plan_stack always plans the cluster layer
        self.cluster = Cluster(f"{name}-cluster", ClusterArgs(
            plan=plan.cluster, name_prefix=plan.name_prefix, region=cfg.region, vpc_id=self.network.vpc_id,
            private_subnet_ids=self.network.private_subnet_ids, public_subnet_ids=self.network.public_subnet_ids,
            tags=stack_tags(plan)), opts=aws_opts)
        self.storage = Storage(f"{name}-storage", StorageArgs(
            plan=plan.aws, name_prefix=plan.name_prefix, s3_endpoint_id=self.network.s3_endpoint_id),
            opts=aws_opts)
        self.identity = ModelRoles(f"{name}-identity", ModelRolesArgs(
            plan=plan.aws, oidc_provider_arn=self.cluster.oidc_provider_arn, oidc_issuer=self.cluster.oidc_issuer,
            model_bucket=self.storage.model_bucket, compile_cache_bucket=self.storage.compile_cache_bucket),
            opts=aws_opts)
        # Every Kubernetes object goes through the cluster's provider, never an ambient kubeconfig.
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=self.cluster.kubernetes_provider)
        namespace = k8s.core.v1.Namespace(
            f"{name}-namespace",
            metadata={"name": cfg.namespace, "labels": {"app.kubernetes.io/part-of": "warmstart"}},
            opts=k8s_opts,
        )
        # The pod-side scripts: the start-up check that the compile cache really is on the
        # node's NVMe, and the cross-node pre-warm of the compile cache from S3 (field notes 4).
        script_opts = pulumi.ResourceOptions.merge(k8s_opts, pulumi.ResourceOptions(depends_on=[namespace]))
        scripts = [
            PodScript(f"{name}-nvme-guard", cfg.namespace, nvme_guard.CONFIGMAP_NAME, nvme_guard.SCRIPT_KEY,
                      opts=script_opts),
            PodScript(f"{name}-compile-cache", cfg.namespace, compile_cache.CONFIGMAP_NAME,
                      compile_cache.SCRIPT_KEY, opts=script_opts),
        ]
        pools = {p.name: p for p in plan.cluster.pools}
        self.models = {}
        for m in plan.models:
            # The NVMe check runs first: no restore onto a cache path that is not NVMe.
            extras = merge_extras(nvme_check_extras(m, pools[m.pool], plan.cluster),
                                  compile_cache_extras(m, self.storage.compile_cache_bucket, cfg.region))
            self.models[m.name] = VllmModel(
                f"{name}-{m.name}",
                VllmModelArgs(plan=m, namespace=cfg.namespace, region=cfg.region, extras=extras,
                              role_arn=self.identity.role_arns[m.name]),
                opts=pulumi.ResourceOptions(parent=self, provider=self.cluster.kubernetes_provider,
                                            depends_on=[namespace, *scripts, *self.cluster.ready]),
            )
        self.register_outputs({})
