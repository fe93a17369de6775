"""The whole warmstart stack as one component: the other components, wired together.

`WarmstartStack` validates the stack config as a whole first (`warmstart.plan.stack.plan_stack`:
every broken rule of every layer, keyed by its config key), then maps the config onto each
component's Args; each component decides inside, from its Args, through the same pure
planners. The stack adds only what no single component owns: the AWS provider, the
namespace, the pod-side scripts shared by the namespace's models, and the order of layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s
from pulumi.runtime import config as runtime_config

from warmstart import config
from warmstart.config import StackConfig
from warmstart.manifests import compile_cache, first_token, metrics_proxy, nvme_check
from warmstart import versions
from warmstart.decisions import iam, image_cache
from warmstart.decisions import network as network_rules
from warmstart.errors import ConfigError
from warmstart.decisions import weights_import as imports
from warmstart.manifests import node_cache as staging_objects
from warmstart.manifests import weights_import as import_job
from warmstart.plan import platform as platform_contract
from warmstart.plan.stack import StackPlan, plan_stack

from .autoscaling import ModelAutoscaling
from .cluster import Cluster, ClusterArgs
from .identity import ModelImportRole, ModelRole
from .monitoring import Monitoring
from .node_cache import register_warm_spares
from .network import Network
from .pod_scripts import PodScript
from .model_layer import ModelPlatform, _args, deploy_model
from .routing import ModelRouter
from .serving import VllmModel
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
# Namespace of node-feature-discovery, which the node cache's node labels go through.
NFD_NAMESPACE = "node-feature-discovery"
# The NVMe start-up check's script component was called "nvme-guard".
LEGACY_NVME_SCRIPT_NAME = "nvme-guard"


def program_config() -> dict[str, str]:
    """The flat config map Pulumi handed this program (engine environment or mocks)."""
    return dict(runtime_config.get_config_env()) | dict(runtime_config.CONFIG.get())


def stack_config() -> StackConfig:
    """The environment stack config Pulumi handed this program."""
    return config.from_pulumi_config(program_config())


def stack_tags(plan: StackPlan) -> dict[str, str]:
    """Tags on every taggable AWS resource; the stack's own tags win over warmstart's."""
    return {"warmstart:stack": plan.stack, "warmstart:prefix": plan.name_prefix} | dict(plan.config.tags)


def plan_has_managed_scraper(plan: StackPlan) -> bool:
    """Whether the stack creates the AMP managed collector (a model, or a model stack, may
    autoscale and the stack names no Prometheus of its own)."""
    return platform_contract.plan_runs_autoscaling(plan) and not plan.config.monitoring.prometheus_url


def scraper_pods(cfg: StackConfig) -> list[tuple[str, dict[str, str]]]:
    """The stack's own Prometheus pods (`monitoring.scraper`), which the metrics ports admit."""
    sc = cfg.monitoring.scraper
    return [(sc.namespace, dict(sc.pod_labels))] if sc is not None else []


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
        n = cfg.network
        # 1. network: a VPC or an existing one, with the S3 Gateway endpoint.
        # Only the keys the config sets: the component's own defaults and rules apply to the rest.
        self.network = Network(f"{name}-network", _args(
            name_prefix=plan.name_prefix, region=cfg.region,
            karpenter_discovery_cluster=plan.aws.network.karpenter_discovery, **n.model_dump(exclude_unset=True),
        ), opts=_aliased(aws_opts, "network"))
        # 2. cluster: EKS Auto Mode or Karpenter, GPU pools sized for the models on them.
        c = cfg.cluster
        pools = [_args(name=p.name, instance_types=p.instance_types,
                       capacity_types=p.capacity_types if "capacity_types" in p.model_fields_set else None,
                       capacity=p.capacity.model_dump(mode="json", exclude_none=True) if p.capacity else None,
                       max_gpus=p.max_gpus, ephemeral_storage_gib=p.ephemeral_storage_gib,
                       warm_nodes=p.warm_nodes or None, hourly_price_usd=p.hourly_price_usd,
                       models=[_args(name=m.name, instance_type=m.instance.instance_type,
                                     # A pool holds an autoscaled model at its maxReplicas.
                                     tensor_parallel_size=m.tensor_parallel_size, replicas=m.max_replicas,
                                     compile_cache=m.compile_cache,
                                     staged_bytes=m.weights_bytes if m.staged else None)
                               for m in plan.models if m.pool == p.name])
                 for p in cfg.gpu_pools]
        # The Service range, explicit so the routers' policy can name the API server's ClusterIP:
        # the stack's, or the one EKS would pick for this VPC (decisions/network.py).
        service_cidr = c.service_cidr or network_rules.default_service_cidr(self.network.vpc_cidrs)
        why = network_rules.service_cidr_problem(service_cidr, self.network.vpc_cidrs)
        if why:
            raise ConfigError(f"{config.NAMESPACE}:cluster.serviceCidr", f"{service_cidr} {why}",
                              "set cluster.serviceCidr to a /16 outside every CIDR block of the VPC", service_cidr)
        cluster_args: ClusterArgs = _args(  # type: ignore[assignment]
            cluster_name=plan.cluster.name, mode=cfg.cluster_mode, region=cfg.region, service_cidr=service_cidr,
            vpc_id=self.network.vpc_id, private_subnet_ids=self.network.private_subnet_ids,
            public_subnet_ids=self.network.public_subnet_ids, gpu_pools=pools, name_prefix=plan.name_prefix,
            kubernetes_version=cfg.kubernetes_version, admins=c.admins, viewers=c.viewers, log_types=c.log_types,
            log_retention_days=c.log_retention_days,
            # The size the plan derived from what runs there (plan_cluster.plan_system_group).
            system_node_group=_args(instance_types=list(plan.cluster.system_node_group.instance_types),
                                    size=plan.cluster.system_node_group.size)
            if plan.cluster.system_node_group else None,
            tags=stack_tags(plan))
        self.cluster = Cluster(f"{name}-cluster", cluster_args, opts=_aliased(aws_opts, "cluster"))
        self.image_cache = self._image_cache(name, plan, aws_opts)
        # 3. storage and identity: the buckets, then one IRSA role per model.
        mb, cb = cfg.model_bucket, cfg.compile_cache_bucket
        cached = plan.aws.buckets.compile_cache_bucket is not None
        self.storage = ModelStorage(f"{name}-storage", _args(
            name_prefix=plan.name_prefix, region=cfg.region, stack=args.stack, account_id=cfg.account_id,
            model_bucket=mb.model_dump(exclude_unset=True),
            compile_cache=cached, compile_cache_bucket=_args(name=cb.name, expire_after_days=cb.expire_after_days),
            s3_endpoint_id=self.network.s3_endpoint_id,
        ), opts=_aliased(aws_opts, "storage"))
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
            PodScript(f"{name}-first-token", cfg.namespace, first_token.CONFIGMAP_NAME, first_token.SCRIPT_KEY,
                      opts=script_opts),
        ]
        # Every script a model may need, so a model stack on this platform finds them too.
        scripts += [
            PodScript(f"{name}-weights-import", cfg.namespace, import_job.CONFIGMAP_NAME, import_job.SCRIPT_KEY,
                      opts=script_opts),
            PodScript(f"{name}-weights-stage", cfg.namespace, staging_objects.STAGE_CONFIGMAP,
                      staging_objects.STAGE_SCRIPT, opts=script_opts),
            PodScript(f"{name}-weights-select", cfg.namespace, staging_objects.SELECT_CONFIGMAP,
                      staging_objects.SELECT_SCRIPT, opts=script_opts),
            PodScript(f"{name}-metrics-proxy", cfg.namespace, metrics_proxy.CONFIGMAP_NAME, metrics_proxy.SCRIPT_KEY,
                      opts=script_opts),
        ]
        scripts += self._node_cache_platform(name, plan, k8s_opts, namespace)
        # The token is read as a secret, so it stays encrypted in the state and never reaches
        # plan.json; only the import Jobs of Hugging Face imports get it, through a Secret.
        hf_token = (pulumi.Config(config.NAMESPACE).get_secret("huggingFaceToken")
                    if any(m.weights_import and m.weights_import.kind == "huggingFace" for m in plan.models) else None)
        self._autoscaling(name, plan, namespace)
        self.platform = ModelPlatform(
            name=name, namespace=cfg.namespace, region=cfg.region, cluster_mode=cfg.cluster_mode,
            name_prefix=plan.name_prefix, nvme_check=c.nvme_check, vpc_cidrs=self.network.vpc_cidrs,
            image_cache_account=cfg.account_id if cfg.image_cache.ecr_pull_through else None,
            service_cidr=service_cidr, scraper_pods=scraper_pods(cfg),
            oidc_provider_arn=self.cluster.oidc_provider_arn, oidc_issuer=self.cluster.oidc_issuer,
            compile_cache_bucket=self.storage.compile_cache_bucket, aws_provider=self.aws_provider,
            kubernetes_provider=self.cluster.kubernetes_provider, managed_scraper=plan_has_managed_scraper(plan),
            monitoring_server=self.monitoring.server_address if self.monitoring else None,
            monitoring_region=cfg.region if self.monitoring and not cfg.monitoring.prometheus_url else None,
            k8s_after=[namespace, *scripts, *self.cluster.ready, *self.image_cache], import_after=[self.storage],
            autoscaling_after=[self.monitoring] if self.monitoring else [],
            hugging_face_token=hf_token, aliases=_aliased)
        self.roles, self.import_roles, self.staging_roles = {}, {}, {}
        self.models, self.routers, self.autoscalers = {}, {}, {}
        for spec, m in zip(cfg.models, plan.models):
            r = deploy_model(self, self.platform, spec, m)
            self.roles[m.name], self.models[m.name] = r.role, r.model
            for table, value in ((self.import_roles, r.import_role), (self.staging_roles, r.staging_role),
                                 (self.routers, r.router), (self.autoscalers, r.autoscaler)):
                if value is not None:
                    table[m.name] = value
        # What this environment's model stacks read through their StackReference.
        self.platform_contract = platform_contract.facts(plan) | {
            "vpcCidrs": list(self.network.vpc_cidrs), "serviceCidr": service_cidr,
            "oidcProviderArn": self.cluster.oidc_provider_arn, "oidcIssuer": self.cluster.oidc_issuer,
            "monitoring": {"serverAddress": self.monitoring.server_address,
                           "region": self.platform.monitoring_region,
                           "managedScraper": plan_has_managed_scraper(plan),
                           "scraperPods": [{"namespace": ns, "podLabels": dict(labels)}
                                           for ns, labels in self.platform.scraper_pods]} if self.monitoring else None}
        self.register_outputs({})

    def _autoscaling(self, name: str, plan: StackPlan, namespace: k8s.core.v1.Namespace) -> None:
        """5. autoscaling: metrics (a managed Prometheus workspace and its collector, or the
        stack's own endpoint) and KEDA, when a model autoscales or model stacks may
        (`modelStacks.autoscaling`); each model's ScaledObject is its own (model_layer.py)."""
        cfg = plan.config
        self.monitoring = None
        if not platform_contract.plan_runs_autoscaling(plan):
            return
        aws_opts = pulumi.ResourceOptions(parent=self, providers=[self.aws_provider, self.cluster.kubernetes_provider],
                                          depends_on=[namespace, *self.cluster.ready])
        # The collector scrapes the cluster by its ARN: `arn:<partition>:eks:<region>:<account>:cluster/<name>`
        # (https://docs.aws.amazon.com/eks/latest/userguide/security_iam_service-with-iam.html).
        caller = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(parent=self))
        cluster_arn = caller.account_id.apply(
            lambda account: f"arn:{plan.cluster.partition}:eks:{cfg.region}:{account}:cluster/{plan.cluster.name}")
        url = cfg.monitoring.prometheus_url
        self.monitoring = Monitoring(f"{name}-monitoring", _args(
            cluster_name=plan.cluster.name, cluster_mode=cfg.cluster_mode, region=cfg.region,
            name_prefix=plan.name_prefix, oidc_provider_arn=self.cluster.oidc_provider_arn,
            oidc_issuer=self.cluster.oidc_issuer, namespaces=[cfg.namespace],
            # A model stack's model may be routed too: scrape routers' metrics whenever any could exist.
            router=any(m.routed for m in plan.models) or plan.config.model_stacks.autoscaling,
            cluster_arn=None if url else cluster_arn,
            subnet_ids=None if url else self.network.private_subnet_ids,
            security_group_ids=None if url else [self.cluster.security_group_id],
            prometheus_url=url, tags=stack_tags(plan)), opts=aws_opts)

    def _image_cache(self, name: str, plan: StackPlan, aws_opts: pulumi.ResourceOptions) -> list[pulumi.Resource]:
        """The ECR pull-through cache of Docker Hub, and the GPU nodes' right to fill it on a first
        pull (warmstart/decisions/image_cache.py); nothing without `imageCache.ecrPullThrough`."""
        cfg, ecr = plan.config, plan.config.image_cache.ecr_pull_through
        if ecr is None:
            return []
        assert cfg.account_id is not None  # plan_stack requires it
        rule = aws.ecr.PullThroughCacheRule(
            f"{name}-docker-hub-cache", ecr_repository_prefix=image_cache.DOCKER_HUB_PREFIX,
            upstream_registry_url=image_cache.DOCKER_HUB_URL, credential_arn=ecr.credential_arn, opts=aws_opts)
        policy = iam.to_json(image_cache.node_pull_through_policy(plan.cluster.partition, cfg.region, cfg.account_id))
        # Each node role that can be the first to pull a cached image: the GPU nodes', and the
        # non-GPU nodes', where the weights import Job runs the model's image before any GPU node
        # has pulled it (https://docs.aws.amazon.com/AmazonECR/latest/userguide/pull-through-cache-iam.html).
        access = [aws.iam.RolePolicy(f"{name}-{which}-node-pull-through", role=role, name="warmstart-pull-through",
                                     policy=policy, opts=aws_opts)
                  for which, role in zip(("gpu", "system"), self.cluster.node_role_names)]
        return [rule, *access]

    def _node_cache_platform(self, name: str, plan: StackPlan, k8s_opts: pulumi.ResourceOptions,
                             namespace: k8s.core.v1.Namespace) -> list[pulumi.Resource]:
        """The node cache's cluster-wide parts, when a model is staged or a pool keeps warm
        spares: node-feature-discovery (its master turns the staging pods' NodeFeature objects
        into node labels), the two low PriorityClasses, and each pool's placeholder pods."""
        cfg = plan.config
        pools = [p for p in plan.cluster.pools if p.warm_nodes]
        if not platform_contract.plan_runs_node_cache(plan):
            return []
        out: list[pulumi.Resource] = []
        for pc in staging_objects.priority_class_specs():
            out.append(k8s.scheduling.v1.PriorityClass(
                f"{name}-{pc['metadata']['name']}", metadata=pc["metadata"], value=pc["value"],
                global_default=pc["globalDefault"], preemption_policy=pc["preemptionPolicy"],
                description=pc["description"], opts=k8s_opts))
        if platform_contract.plan_stages(plan):
            # Only the master and its garbage collector, on non-GPU nodes
            # (https://kubernetes-sigs.github.io/node-feature-discovery/v0.19/deployment/helm.html).
            values = staging_objects.nfd_values()
            where = imports.node_selector(cfg.cluster_mode)
            for part in ("master", "gc"):
                values[part] = values.get(part, {}) | {"nodeSelector": dict(where)}
            out.append(k8s.helm.v3.Release(
                f"{name}-node-feature-discovery", name="node-feature-discovery", chart=versions.NFD_CHART,
                version=versions.NFD_VERSION, namespace=NFD_NAMESPACE, create_namespace=True,
                values=values, opts=pulumi.ResourceOptions.merge(k8s_opts, pulumi.ResourceOptions(
                    depends_on=list(self.cluster.ready)))))
        for p in pools:
            assert p.warm_instance is not None
            register_warm_spares(name, p.name, cfg.namespace, {
                "warm_nodes": p.warm_nodes, "instance_type": p.warm_instance.instance_type,
                "gpus": p.warm_instance.gpu_count}, k8s_opts, after=[namespace, *out])
        return out
