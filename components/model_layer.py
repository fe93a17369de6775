"""One model's resources on a platform: what an environment stack creates per inline model and a
model stack creates for its one model, from the same code (components/stack.py,
components/model_stack.py).

A model's resources are its IRSA role (and its import's and its staging pods' roles), the
VllmModel component (Deployment, Service, the node cache or the image pre-pull, the weights
import, NetworkPolicies), its router and its KEDA autoscaling. `ModelPlatform` is what they
need of the environment: names, the cluster's identity provider, buckets, providers, and what
must exist first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi

from warmstart import versions
from warmstart.config import ModelConfig
from warmstart.decisions import image_cache
from warmstart.manifests import network_policy
from warmstart.manifests import node_cache as staging_objects
from warmstart.manifests import serving as serving_objects
from warmstart.plan.model import ModelPlan

from .autoscaling import ModelAutoscaling
from .identity import ModelImportRole, ModelRole
from .routing import ModelRouter, RoutingPolicy
from .serving import VllmModel, VllmModelArgs

Aliasing = Callable[[pulumi.ResourceOptions, str], pulumi.ResourceOptions]


def _args(**values: Any) -> dict[str, Any]:
    """Component Args without the keys left unset (the component's defaults apply)."""
    return {k: v for k, v in values.items() if v is not None}


def _scraper_args(p: "ModelPlatform") -> list[dict[str, Any]] | None:
    """The platform's own Prometheus pods as the components' `metricsScrapers` (None: none)."""
    return [{"namespace": ns, "pod_labels": dict(labels)} for ns, labels in p.scraper_pods] or None


def _no_aliases(opts: pulumi.ResourceOptions, _layer: str) -> pulumi.ResourceOptions:
    return opts


@dataclass
class ModelPlatform:
    """What a model's resources need of the environment they run in."""

    name: str
    """Prefix of the resources' names (the stack component's name)."""
    namespace: str
    region: str
    cluster_mode: str
    name_prefix: str
    """Prefix of the AWS names (IAM roles)."""
    nvme_check: str
    vpc_cidrs: Sequence[str]
    """Every IPv4 block of the VPC: where pod addresses, the API server's endpoint ENIs and the
    internal load balancer's clients are."""
    service_cidr: str
    """The cluster's Service range: the `kubernetes` ClusterIP the routers call is in it."""
    oidc_provider_arn: pulumi.Input[str]
    oidc_issuer: pulumi.Input[str]
    compile_cache_bucket: pulumi.Input[str] | None
    aws_provider: pulumi.ProviderResource
    kubernetes_provider: pulumi.ProviderResource
    managed_scraper: bool
    """The AMP managed collector scrapes the pods (from the VPC), so it may reach vLLM's port."""
    image_cache_account: str | None = None
    """The account whose ECR pull-through cache serves Docker Hub images (the models' images are
    rewritten by the plan; the router's here); None: pull from Docker Hub."""
    scraper_pods: Sequence[tuple[str, Mapping[str, str]]] = ()
    """A Prometheus of the stack's own, by namespace and pod labels (`monitoring.scraper`): admitted
    to the metrics ports."""
    monitoring_server: pulumi.Input[str] | None = None
    """The Prometheus endpoint KEDA queries; None: no autoscaling on this platform."""
    monitoring_region: str | None = None
    """Region KEDA signs its queries for (AMP); None for an unsigned endpoint."""
    k8s_after: Sequence[pulumi.Resource] = ()
    """What every Kubernetes object of a model waits for (namespace, shared scripts, nodes)."""
    import_after: Sequence[pulumi.Resource] = ()
    """What a weights import also waits for (the model bucket)."""
    autoscaling_after: Sequence[pulumi.Resource] = ()
    """What a ScaledObject also waits for (KEDA, which serves its CRD)."""
    hugging_face_token: pulumi.Input[str] | None = None
    ship_pod_scripts: bool = False
    """Each model ships its own pod-side scripts (a platform that ships none)."""
    aliases: Aliasing = field(default=_no_aliases)
    """The environment stack's legacy aliases per layer (`identity`, `model`); none elsewhere."""


@dataclass
class ModelResources:
    """The components one model got."""

    role: ModelRole
    import_role: ModelImportRole | None
    staging_role: ModelRole | None
    model: VllmModel
    router: ModelRouter | None
    autoscaler: ModelAutoscaling | None


def deploy_model(parent: pulumi.Resource, p: ModelPlatform, spec: ModelConfig, m: ModelPlan) -> ModelResources:
    """Every resource of one planned model, as children of `parent`."""
    name = p.name
    aws_opts = pulumi.ResourceOptions(parent=parent, providers=[p.aws_provider])
    role = ModelRole(f"{name}-identity-{m.name}", _args(
        model_name=m.name, source=m.source, namespace=p.namespace, oidc_provider_arn=p.oidc_provider_arn,
        oidc_issuer=p.oidc_issuer, name_prefix=p.name_prefix, region=p.region,
        compile_cache_bucket=p.compile_cache_bucket if m.compile_cache else None,
    ), opts=p.aliases(aws_opts, "identity"))
    imp = m.weights_import
    # A model with `import` also gets the role of its import Job: write its own prefix only.
    import_role = ModelImportRole(f"{name}-import-{m.name}", _args(
        model_name=m.name, source=m.source, namespace=p.namespace, oidc_provider_arn=p.oidc_provider_arn,
        oidc_issuer=p.oidc_issuer, name_prefix=p.name_prefix, region=p.region,
        import_s3=imp.source if imp.kind == "s3" else None,
    ), opts=aws_opts) if imp is not None else None
    # A staged model: the staging pods' own read-only role, trusted by their one ServiceAccount.
    staging_role = ModelRole(f"{name}-staging-{m.name}", _args(
        model_name=staging_objects.service_account_name(m.name), source=m.source, namespace=p.namespace,
        service_account=staging_objects.service_account_name(m.name), oidc_provider_arn=p.oidc_provider_arn,
        oidc_issuer=p.oidc_issuer, name_prefix=p.name_prefix, region=p.region), opts=aws_opts) if m.staged else None

    k8s_after = list(p.k8s_after)
    router = _router(parent, p, m, k8s_after)
    model_args: VllmModelArgs = _args(  # type: ignore[assignment]
        model_name=m.name, source=m.source, weights_gib=spec.weights_gib, instance_type=m.instance.instance_type,
        region=p.region, namespace=p.namespace,
        tensor_parallel_size=None if spec.tensor_parallel_size == "auto" else spec.tensor_parallel_size,
        replicas=m.replicas, image=m.image, max_model_len=m.max_model_len,
        gpu_memory_utilization=m.gpu_memory_utilization, eager=m.eager, extra_args=list(m.extra_args),
        loader=m.loader.model_dump(), cluster_mode=p.cluster_mode, node_pool=m.pool,
        compile_cache=m.compile_cache, compile_cache_host_path=m.compile_cache_host_path,
        compile_cache_bucket=p.compile_cache_bucket if m.compile_cache else None,
        nvme_check=p.nvme_check, role_arn=role.role_arn, ship_pod_scripts=p.ship_pod_scripts,
        weights_import=spec.weights_import.model_dump(exclude_none=True) if spec.weights_import else None,
        node_cache=m.load.mode if m.load else None,
        node_cache_role_arn=staging_role.role_arn if staging_role else None,
        import_role_arn=import_role.role_arn if import_role else None,
        hugging_face_token=p.hugging_face_token if imp and imp.kind == "huggingFace" else None,
        router_pod_labels=network_policy.router_selector(m.name) if router is not None else None,
        # Scrapers reach vLLM's metrics-only port, never its serving port: the managed collector
        # from its ENIs in the VPC's subnets, a Prometheus of the stack's own by its pods.
        metrics_scraper_cidrs=list(p.vpc_cidrs) if p.managed_scraper else None,
        metrics_scrapers=_scraper_args(p),
        autoscaled=True if m.autoscaling is not None else None)
    # An import writes into the model bucket, which this same `up` may be creating.
    after = [*k8s_after, *(p.import_after if imp else [])]
    model = VllmModel(f"{name}-{m.name}", model_args, opts=p.aliases(pulumi.ResourceOptions(
        parent=parent, provider=p.kubernetes_provider, depends_on=after), "model"),
        router=[router] if router is not None else [])
    autoscaler = None
    a = m.autoscaling
    if a is not None:
        if p.monitoring_server is None:
            raise ValueError(f"{m.name} autoscales but the platform has no metrics endpoint")  # plan refuses it first
        autoscaler = ModelAutoscaling(f"{name}-{m.name}-autoscaling", _args(
            model_name=m.name, namespace=p.namespace, min_replicas=a.min_replicas, max_replicas=a.max_replicas,
            startup_budget_seconds=m.startup_budget_seconds, server_address=p.monitoring_server,
            region=p.monitoring_region, target_waiting_per_replica=a.target_waiting_per_replica,
            kv_cache_usage_ceiling=a.kv_cache_usage_ceiling),
            opts=pulumi.ResourceOptions(parent=parent, provider=p.kubernetes_provider,
                                        depends_on=[*p.autoscaling_after, model]))
    return ModelResources(role, import_role, staging_role, model, router, autoscaler)


def _router(parent: pulumi.Resource, p: ModelPlatform, m: ModelPlan,
            after: list[pulumi.Resource]) -> ModelRouter | None:
    """An SMG router in front of a model that can have several replicas. The model's own Service
    (VllmModel, `routerPodLabels`) sends to it, so clients keep one URL; the router does not wait
    for the model, which waits for it (its pods are Ready once one vLLM pod is)."""
    if not m.routed:
        return None
    vpc = list(p.vpc_cidrs)
    wait = m.startup_budget_seconds + serving_objects.NODE_LAUNCH_SECONDS + (
        m.weights_import.deadline_seconds if m.weights_import else 0)
    return ModelRouter(f"{p.name}-{m.name}-router", _args(
        model_name=m.name, namespace=p.namespace, policy=RoutingPolicy(m.routing_policy),
        cluster_mode=p.cluster_mode, load_factor=m.routing.load_factor,
        max_excess_requests=m.routing.max_excess_requests,
        client_cidrs=vpc if m.routing.internal_load_balancer else None,
        # The routers' metrics listener serves only metrics: the managed collector's ENIs are in
        # the VPC's subnets, a Prometheus of your own is named by its pods.
        metrics_cidrs=vpc if p.managed_scraper else None,
        metrics_scrapers=_scraper_args(p),
        # Pods reach the API at the `kubernetes` ClusterIP (judged before DNAT), its endpoints are
        # ENIs in the VPC (warmstart/decisions/network.py).
        api_server_cidrs=[p.service_cidr, *vpc],
        expose=m.routing.internal_load_balancer, ready_timeout_seconds=wait,
        image=image_cache.cached_image(versions.SMG_IMAGE, p.image_cache_account, p.region)
        if p.image_cache_account else None,
        # The model's serving NetworkPolicy admits only its routers, and its Service is the endpoint.
        fence_vllm=False, create_service=False),
        opts=pulumi.ResourceOptions(parent=parent, provider=p.kubernetes_provider, depends_on=after))
