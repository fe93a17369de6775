"""The whole warmstart stack as one component: the other components, composed.

`WarmstartStack` validates the stack config as a whole first (`warmstart.plan.stack.plan_stack`:
every broken rule of every layer, keyed by its config key), then hands each component its
sections of the config as they are (the components' section Args are generated from the config
models, components/section_args.py) beside what is wired in; each component decides inside,
from its Args, through the same pure planners. The stack registers no cloud or Kubernetes
resource of its own (a test holds it to that): only its AWS provider and the components, in the
order of the layers: Network, Cluster, ModelStorage, Monitoring, the ServingPlatform, and one
ServedModel per model on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from warmstart import config
from warmstart.config import ModelConfig, StackConfig
from warmstart import versions
from warmstart.decisions import image_cache, placement
from warmstart.decisions import network as network_rules
from warmstart.manifests import standby_pool as pool_objects
from warmstart.errors import ConfigError, rekeyed
from warmstart.plan import platform as platform_contract
from warmstart.plan.stack import StackPlan, plan_stack

from warmstart.sdk_private import program_config
from .autoscaling import ModelAutoscaling
from .cluster import Cluster, ClusterArgs
from .identity import ModelImportRole, ModelRole
from .monitoring import Monitoring
from .network import Network
from .platform import PlatformArgs, ServingPlatform
from .routing import ModelRouter
from .sections import section_entry
from .served_model import KEY as SERVED_MODEL_KEY
from .served_model import ServedModel, _args
from .serving import VllmModel
from .standby_pool import StandbyPool
from .storage import ModelStorage

# Type tokens and names the components had before they became `warmstart:index:*` components
# in components/ (deployed stacks hold these in their state). Each alias keeps a resource and,
# through Pulumi's inherited child aliases, everything under it, instead of replacing them.
# tests/golden/test_golden.py proves every URN of the old state still resolves.
# https://www.pulumi.com/docs/iac/concepts/options/aliases/
LEGACY_TYPES = {
    "network": "warmstart:aws:Network",
    "storage": "warmstart:aws:Storage",
    "identity": "warmstart:aws:ModelRoles",
    "cluster": "warmstart:cluster:Cluster",
    "model": "warmstart:serving:VllmModel",
}


def stack_config() -> StackConfig:
    """The environment stack config Pulumi handed this program."""
    return config.from_pulumi_config(config.with_stack_file(program_config(), pulumi.get_stack()))


def stack_tags(plan: StackPlan) -> dict[str, str]:
    """Tags on every taggable AWS resource; the stack's own tags win over warmstart's."""
    return {"warmstart:stack": plan.stack, "warmstart:prefix": plan.name_prefix} | dict(plan.config.tags)


def model_entry(spec: ModelConfig) -> dict[str, Any]:
    """A config model entry as a ServedModel's `model` (snake_case keys, only what was set, so
    a default stays the component's and `replicas` stays unset where the stack left it)."""
    return spec.model_dump(exclude_unset=True)


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
    serving_platform: ServingPlatform
    """What the models share: namespace, pod-side scripts, node cache, warm spares, image cache."""
    platform: PlatformArgs
    """That platform as the `PlatformArgs` each model runs on (exported for model stacks)."""
    served: dict[str, ServedModel]
    """Each model on the platform, by model name (the components below are their parts)."""
    roles: dict[str, ModelRole]
    """The IRSA role of each model, by model name."""
    import_roles: dict[str, ModelImportRole]
    """The weights-import role of each model with `import`, by model name."""
    staging_roles: dict[str, ModelRole]
    """The node-cache staging pods' read-only role of each staged model, by model name."""
    models: dict[str, VllmModel]
    """The serving component of each model, by model name."""
    routers: dict[str, ModelRouter]
    """The router of each routed model, by model name."""
    monitoring: Monitoring | None
    """Metrics collection and KEDA, when a model autoscales."""
    autoscalers: dict[str, ModelAutoscaling]
    """The KEDA autoscaling of each model with `autoscaling`, by model name."""

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
        # Each component takes its section of the config nested, as the config gives it (only the
        # keys the stack sets: the config model's defaults and rules apply to the rest), beside
        # what is wired in from other components and what the plan derived.
        # 1. network: a VPC or an existing one, with the S3 Gateway endpoint.
        self.network = Network(f"{name}-network", _args(
            name_prefix=plan.name_prefix, region=cfg.region, network=section_entry(cfg.network),
            karpenter_discovery_cluster=plan.aws.network.karpenter_discovery,
        ), opts=_aliased(aws_opts, "network"))
        # 2. cluster: EKS Auto Mode or Karpenter, GPU pools sized for the models on them.
        # The Service range, explicit so the routers' policy can name the API server's ClusterIP:
        # the stack's, or the one EKS would pick for this VPC (decisions/network.py).
        service_cidr = cfg.cluster.service_cidr or network_rules.default_service_cidr(self.network.vpc_cidrs)
        why = network_rules.service_cidr_problem(service_cidr, self.network.vpc_cidrs)
        if why:
            raise ConfigError(f"{config.NAMESPACE}:cluster.serviceCidr", f"{service_cidr} {why}",
                              "set cluster.serviceCidr to a /16 outside every CIDR block of the VPC", service_cidr)
        cluster_args: ClusterArgs = _args(  # type: ignore[assignment]
            cluster_name=plan.cluster.name, mode=cfg.cluster_mode, region=cfg.region,
            vpc_id=self.network.vpc_id, private_subnet_ids=self.network.private_subnet_ids,
            public_subnet_ids=self.network.public_subnet_ids, name_prefix=plan.name_prefix,
            kubernetes_version=cfg.kubernetes_version,
            cluster=section_entry(cfg.cluster) | {"service_cidr": service_cidr},
            gpu_pools=[section_entry(p) for p in cfg.gpu_pools],
            pool_models=[_args(pool=m.pool, name=m.name, instance_type=m.instance.instance_type,
                               # A pool holds an autoscaled model at its maxReplicas.
                               tensor_parallel_size=m.tensor_parallel_size, replicas=m.max_replicas,
                               compile_cache=m.compile_cache, staged_bytes=m.weights_bytes if m.staged else None)
                         for m in plan.models]
                        + [_args(pool=s.gpu_pool, name=s.deployment_name, instance_type=s.instance_type,
                                 tensor_parallel_size=s.gpus, replicas=s.max_hosts, compile_cache=False)
                           for s in plan.standby_pools],
            # The sizes the plan derived from what runs there (plan_cluster.plan_system_group).
            system_node_group_size=plan.cluster.system_node_group.size if plan.cluster.system_node_group else None,
            cpu_pool_cpu_limit=plan.cluster.cpu_pool.cpu_limit if plan.cluster.cpu_pool else None,
            node_tags=stack_tags(plan),
            image_cache_account=cfg.account_id if cfg.image_cache.ecr_pull_through else None)
        self.cluster = Cluster(f"{name}-cluster", cluster_args, opts=_aliased(aws_opts, "cluster"))
        # 3. storage: the model and compile-cache buckets.
        cached = plan.aws.buckets.compile_cache_bucket is not None
        self.storage = ModelStorage(f"{name}-storage", _args(
            name_prefix=plan.name_prefix, region=cfg.region, stack=args.stack, account_id=cfg.account_id,
            model_bucket=section_entry(cfg.model_bucket), compile_cache=cached,
            compile_cache_bucket=section_entry(cfg.compile_cache_bucket), s3_endpoint_id=self.network.s3_endpoint_id,
        ), opts=_aliased(aws_opts, "storage"))
        # Every Kubernetes object goes through the cluster's provider, never an ambient kubeconfig.
        providers = [self.aws_provider, self.cluster.kubernetes_provider]
        # 4. autoscaling: metrics and KEDA, when a model (or a model stack) may autoscale.
        self.monitoring = self._autoscaling(name, plan)
        # 5. the platform: namespace, pod-side scripts, node cache, warm spares, image cache.
        ecr = cfg.image_cache.ecr_pull_through
        self.serving_platform = ServingPlatform(name, _args(platform=_args(
            **platform_contract.platform_facts(plan), vpc_cidrs=list(self.network.vpc_cidrs), service_cidr=service_cidr,
            oidc_provider_arn=self.cluster.oidc_provider_arn, oidc_issuer=self.cluster.oidc_issuer,
            compile_cache_bucket=self.storage.compile_cache_bucket,
            # What the Monitoring component made of the stack's `monitoring` section.
            monitoring=self.monitoring.platform_monitoring if self.monitoring else None),
            warm_spares={p.name: {"warm_nodes": p.warm_nodes, "instance_type": p.warm_instance.instance_type,
                                  "gpus": p.warm_instance.gpu_count}
                         for p in plan.cluster.pools if p.warm_nodes and p.warm_instance is not None} or None,
            docker_hub_credential_arn=ecr.credential_arn if ecr else None,
            # Parts the user may own already (namespaceCreate, nodeFeatureDiscovery.create).
            create_namespace=False if not cfg.namespace_create else None,
            create_node_feature_discovery=False if not cfg.node_feature_discovery.create else None),
            opts=pulumi.ResourceOptions(parent=self, providers=providers, depends_on=list(self.cluster.ready)))
        self.platform: PlatformArgs = self.serving_platform.args
        """The platform every model here runs on, as a ServedModel's `platform`."""
        # The token is read as a secret, so it stays encrypted in the state and never reaches
        # plan.json; only the import Jobs of Hugging Face imports get it, through a Secret.
        hf_token = (pulumi.Config(config.NAMESPACE).get_secret("huggingFaceToken")
                    if any(m.weights_import and m.weights_import.kind == "huggingFace" for m in plan.models) else None)
        # 6. models: one ServedModel per `models[]` entry, on the platform.
        self.served: dict[str, ServedModel] = {}
        for i, spec in enumerate(cfg.models):
            # A rule only a component checks is reported under the stack key, not the Args'.
            with rekeyed(SERVED_MODEL_KEY, f"{config.NAMESPACE}:models[{i}]"):
                self.served[spec.name] = ServedModel(
                    f"{name}-{spec.name}", _args(model=model_entry(spec), platform=self.platform, hugging_face_token=hf_token),
                    opts=pulumi.ResourceOptions(parent=self, providers=providers, depends_on=[
                        self.serving_platform, *self.cluster.ready, self.storage]),
                    autoscaling_after=[self.monitoring] if self.monitoring else [], legacy_types=LEGACY_TYPES)
        # 7. standby pools: spare engine hosts shared by their member models (after the members, whose
        # routers and NetworkPolicies the hosts' policies name).
        self.standby_pools = self._standby_pools(name, plan, service_cidr, providers)
        served = self.served.values()
        self.roles = {s.plan.name: s.role for s in served}
        self.import_roles = {s.plan.name: s.import_role for s in served if s.import_role is not None}
        self.staging_roles = {s.plan.name: s.staging_role for s in served if s.staging_role is not None}
        self.models = {s.plan.name: s.model for s in served}
        self.routers = {s.plan.name: s.router for s in served if s.router is not None}
        self.autoscalers = {s.plan.name: s.autoscaler for s in served if s.autoscaler is not None}
        # What this environment's model stacks read through their StackReference.
        self.platform_contract = platform_contract.document(self.platform)
        self.register_outputs({})

    def _standby_pools(self, name: str, plan: StackPlan, service_cidr: str,
                       providers: list[pulumi.ProviderResource]) -> dict[str, StandbyPool]:
        cfg = plan.config
        out: dict[str, StandbyPool] = {}
        for pool in plan.standby_pools:
            wiring = pool_objects.wiring(
                pool, plan.models, namespace=cfg.namespace, region=cfg.region,
                api_server_cidrs=[f"{network_rules.kubernetes_service_ip(service_cidr)}/32"],
                non_gpu=placement.own_platform_placement(),
                actuator_image=image_cache.cached_image(versions.SMG_IMAGE, cfg.account_id, cfg.region)
                if cfg.image_cache.ecr_pull_through and cfg.account_id else pool_objects.actuator_objects.IMAGE,
                keda_namespace=cfg.monitoring.keda.namespace, nvme_mount=plan.cluster.nvme_mount)
            members = [self.served[m] for m in pool.members]
            out[pool.name] = StandbyPool(
                f"{name}-standby-pool-{pool.name}", pool, wiring, name_prefix=plan.name_prefix,
                oidc_provider_arn=self.cluster.oidc_provider_arn, oidc_issuer=self.cluster.oidc_issuer,
                region=cfg.region,
                opts=pulumi.ResourceOptions(parent=self, providers=providers,
                                            depends_on=[self.serving_platform, *self.cluster.ready, *members]))
        return out

    def _autoscaling(self, name: str, plan: StackPlan) -> Monitoring | None:
        """Metrics (a managed Prometheus workspace and its collector, or the stack's own endpoint)
        and KEDA, when a model autoscales or model stacks may (`modelStacks.autoscaling`); each
        model's ScaledObject is its ServedModel's."""
        cfg = plan.config
        if not platform_contract.plan_runs_autoscaling(plan):
            return None
        aws_opts = pulumi.ResourceOptions(parent=self, providers=[self.aws_provider, self.cluster.kubernetes_provider],
                                          depends_on=list(self.cluster.ready))
        # The collector scrapes the cluster by its ARN: `arn:<partition>:eks:<region>:<account>:cluster/<name>`
        # (https://docs.aws.amazon.com/eks/latest/userguide/security_iam_service-with-iam.html).
        caller = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(parent=self))
        cluster_arn = caller.account_id.apply(
            lambda account: f"arn:{plan.cluster.partition}:eks:{cfg.region}:{account}:cluster/{plan.cluster.name}")
        url = cfg.monitoring.prometheus_url
        return Monitoring(f"{name}-monitoring", _args(
            cluster_name=plan.cluster.name, cluster_mode=cfg.cluster_mode, region=cfg.region,
            name_prefix=plan.name_prefix, oidc_provider_arn=self.cluster.oidc_provider_arn,
            oidc_issuer=self.cluster.oidc_issuer, namespaces=[cfg.namespace],
            # A model stack's model may be routed too: scrape routers' metrics whenever any could exist.
            router=any(m.routed for m in plan.models) or plan.config.model_stacks.autoscaling,
            cluster_arn=None if url else cluster_arn,
            subnet_ids=None if url else self.network.private_subnet_ids,
            security_group_ids=None if url else [self.cluster.security_group_id],
            monitoring=section_entry(cfg.monitoring), tags=stack_tags(plan)), opts=aws_opts)
