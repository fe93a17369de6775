"""One model on a platform: the package's main component.

`ServedModel` takes one `models[]` entry, exactly as a stack config writes it (`ModelEntryArgs`,
generated from the config model `warmstart.config.ModelConfig`, so a model field is declared
once), and a `PlatformArgs` (components/platform.py). It plans the model on the platform
(`warmstart.plan.platform.plan_on_platform`, the path an inline model of a stack is planned by)
and registers the model's resources: its IRSA roles (serving, and its weights import's and
staging pods' where it has them), the `VllmModel` (Deployment, Service, node cache or image
pre-pull, weights import, NetworkPolicies), its router and its KEDA autoscaling. The warmstart
stack, a model stack and a program of your own create it the same way.
"""

import math
from collections.abc import Mapping, Sequence
from typing import Any, NotRequired, Optional, TypedDict

import pulumi

from warmstart import versions
from warmstart.config import ModelConfig
from warmstart.decisions import image_cache, phases
from warmstart.decisions import network as network_rules
from warmstart.decisions import routing as routing_rules
from warmstart.errors import rekeyed
from warmstart.manifests import network_policy
from warmstart.manifests import node_cache as staging_objects
from warmstart.plan.model import ModelPlan
from warmstart.plan.platform import Contract, check_platform_runs, plan_on_platform

from .autoscaling import ModelAutoscaling
from .identity import ModelImportRole, ModelRole
from .model_entry import ModelEntryArgs, model_config
from .platform import PlatformArgs, checked, contract
from .providers import kubernetes_provider
from .routing import ModelRouter
from .sections import section_entry
from .serving import VllmModel, VllmModelArgs
from .standby import ModelStandby

KEY = "ServedModelArgs.model"


class ServedModelArgs(TypedDict):
    """Inputs of the ServedModel component."""

    model: ModelEntryArgs
    """The model: one entry of a stack config's `models` (the same keys, the same rules)."""
    platform: PlatformArgs
    """The platform it runs on (a ServingPlatform's `platform` output, a platform stack's
    `warmstartPlatform` output, or written for a cluster warmstart did not create)."""
    hugging_face_token: NotRequired[pulumi.Input[str]]
    """Hugging Face token (a secret) for the model's `import.huggingFace` of a gated repository."""


def _args(**values: Any) -> dict[str, Any]:
    """Component Args without the keys left unset (the component's defaults apply)."""
    return {k: v for k, v in values.items() if v is not None}


def _scrapers(p: Contract) -> list[dict[str, Any]] | None:
    """The platform's own Prometheus pods as the components' `metricsScrapers` (None: none)."""
    return [{"namespace": ns, "pod_labels": labels} for ns, labels in p.scraper_pods] or None


class ServedModel(pulumi.ComponentResource):
    """One model served by vLLM on a warmstart platform (or one described by `PlatformArgs`):
    its IRSA roles, weights import, node cache, serving objects, router and autoscaling, each
    decided from the model entry and the platform alone."""

    role_arn: pulumi.Output[str]
    """The serving pods' IAM role (IRSA)."""
    service_name: pulumi.Output[str]
    """In-cluster Service name: the model's one endpoint, routed or not."""
    endpoint: pulumi.Output[str]
    """OpenAI-compatible API base URL inside the cluster: `http://<service>.<namespace>.svc:8000/v1`."""

    def __init__(self, name: str, args: ServedModelArgs, opts: Optional[pulumi.ResourceOptions] = None, *,
                 autoscaling_after: Sequence[pulumi.Resource] = (),
                 legacy_types: Mapping[str, str] | None = None) -> None:
        """Name it `<prefix>-<model name>`: its resources are then named `<prefix>-identity-<model>`,
        `<prefix>-<model>-router`, ... as in the warmstart stack. Every Kubernetes object waits
        for `opts.depends_on` (the platform); Python programs may also name `autoscaling_after`
        (KEDA, which serves the ScaledObject's CRD) and `legacy_types` ({layer: old type token}
        of the stack's own earlier layout, kept by alias)."""
        super().__init__("warmstart:index:ServedModel", name, None, opts)
        opts = opts or pulumi.ResourceOptions()
        platform = checked(args["platform"])
        p = contract(platform)
        self.config: ModelConfig = model_config(args["model"], KEY)
        # Every decision is made here, from the model entry and the platform alone.
        self.plan: ModelPlan = plan_on_platform(self.config, p, KEY)
        check_platform_runs(self.plan, p, KEY)
        m = self.plan
        self.platform = p
        prefix = name.removesuffix(f"-{m.name}")
        parent = opts.parent

        def child(layer: str, **more: Any) -> pulumi.ResourceOptions:
            # A model's resources were once the children of what now holds its ServedModel.
            aliases = [pulumi.Alias(parent=parent)] if parent is not None else []
            if parent is not None and legacy_types and layer in legacy_types:
                aliases.append(pulumi.Alias(type_=legacy_types[layer], parent=parent))
            return pulumi.ResourceOptions(parent=self, aliases=aliases, **more)

        after = list(opts.depends_on or [])  # type: ignore[arg-type]
        # A platform given by its kubeconfig gets a provider of this model's own; else the
        # Kubernetes provider of the resource options (the warmstart stack's cluster's).
        kubeconfig = platform.get("kubeconfig")
        kube: dict[str, Any] = {"provider": kubernetes_provider(
            name, kubeconfig, pulumi.ResourceOptions(parent=self))} if kubeconfig is not None else {}
        wired = dict(oidc_provider_arn=p.oidc_provider_arn, oidc_issuer=p.oidc_issuer, name_prefix=p.name_prefix,
                     region=p.region, namespace=p.namespace, source=m.source)
        bucket = p.compile_cache_bucket if m.compile_cache else None
        # Before the components, every model's role was a child of the stack's one ModelRoles
        # component (`<prefix>-identity`): the role and its policy alias that old parent.
        legacy_roles = None
        if parent is not None and legacy_types and "identity" in legacy_types:
            def old_roles(urn: str, layer: str = legacy_types["identity"]) -> str:
                head, project, qualified, _ = urn.split("::")
                return f"{head}::{project}::{qualified}${layer}::{prefix}-identity"
            legacy_roles = parent.urn.apply(old_roles)
        self.role = ModelRole(f"{prefix}-identity-{m.name}", _args(
            model_name=m.name, compile_cache_bucket=bucket, **wired), opts=child("identity"),
            legacy_parent=legacy_roles)
        imp = m.weights_import
        # A model with `import` also gets the role of its import Job: write its own prefix only.
        self.import_role = ModelImportRole(f"{prefix}-import-{m.name}", _args(
            model_name=m.name, import_s3=imp.source if imp.kind == "s3" else None, **wired),
            opts=child("import")) if imp is not None else None
        # A staged model: the staging pods' own read-only role, trusted by their one ServiceAccount.
        staging_sa = staging_objects.service_account_name(m.name)
        self.staging_role = ModelRole(f"{prefix}-staging-{m.name}", _args(
            model_name=staging_sa, service_account=staging_sa, **wired), opts=child("staging")) if m.staged else None

        # The inner components' sections are the model entry's, key for key; any other of their
        # Args is derived here and reported as the block itself.
        with rekeyed("ModelRouterArgs", f"{KEY}.routing", {}), \
                rekeyed("ModelRouterArgs.routing", f"{KEY}.routing"):
            self.router = self._router(prefix, p, m, child("router", depends_on=after, **kube))
        scraped_cidrs = list(p.vpc_cidrs) if p.managed_scraper else None
        token = args.get("hugging_face_token")
        # The serving objects are built from this model's plan (made once, above); the Args
        # carry the model entry as given and the wiring.
        model_args: VllmModelArgs = _args(  # type: ignore[assignment]
            model=args["model"], region=p.region, namespace=p.namespace, cluster_mode=p.cluster_mode,
            compile_cache_bucket=bucket, nvme_check=p.nvme_check, role_arn=self.role.role_arn,
            ship_pod_scripts=not p.pod_scripts,
            node_cache_role_arn=self.staging_role.role_arn if self.staging_role else None,
            import_role_arn=self.import_role.role_arn if self.import_role else None,
            hugging_face_token=token if imp and imp.kind == "huggingFace" else None,
            router_pod_labels=network_policy.router_selector(m.name) if self.router is not None else None,
            # Scrapers reach vLLM's metrics-only port, never its serving port: the managed collector
            # from its ENIs in the VPC's subnets, a Prometheus of the platform's own by its pods.
            metrics_scraper_cidrs=scraped_cidrs, metrics_scrapers=_scrapers(p),
            autoscaled=True if m.autoscaling is not None else None,
            non_gpu_placement=p.non_gpu_placement.args() if p.non_gpu_placement.given else None)
        self.model = VllmModel(f"{prefix}-{m.name}", model_args, opts=child("model", depends_on=after, **kube),
                               router=[self.router] if self.router is not None else [], plan=m)
        self.autoscaler = None
        a = m.autoscaling
        if a is not None:
            assert p.monitoring is not None  # check_platform_runs
            with rekeyed("ModelAutoscalingArgs", f"{KEY}.autoscaling", {}), \
                    rekeyed("ModelAutoscalingArgs.autoscaling", f"{KEY}.autoscaling"):
                self.autoscaler = ModelAutoscaling(f"{prefix}-{m.name}-autoscaling", _args(
                    model_name=m.name, namespace=p.namespace, autoscaling=section_entry(a),
                    startup_budget_seconds=m.startup_budget_seconds, server_address=p.monitoring["server_address"],
                    region=p.monitoring.get("region") or None,
                    standby=section_entry(self.config.standby) if self.config.standby is not None else None,
                    # The routers' front queue holds requests while no engine is awake (minReplicas 0);
                    # without standby KEDA scales from zero pods on it (the model's Service's endpoints).
                    front_queue=True if a.min_replicas == 0 else None,
                    standby_pool=m.pooled.pool if m.pooled is not None else None),
                    opts=child("autoscaling", depends_on=[*after, *autoscaling_after, self.model], **kube))
        self.standby = None
        if m.standby is not None and a is not None:
            # The actuator that wakes and sleeps the model's standby engines (docs/scale-out.md).
            # The model entry's standby and autoscaling sections, key for key.
            self.standby = ModelStandby(f"{prefix}-{m.name}-standby", _args(
                model_name=m.name, namespace=p.namespace, weights_gib=self.config.weights_gib,
                standby=section_entry(self.config.standby), autoscaling=section_entry(a),
                api_server_cidrs=[f"{network_rules.kubernetes_service_ip(p.service_cidr)}/32"],
                non_gpu_placement=p.non_gpu_placement.args() if p.non_gpu_placement.given else None,
                image=image_cache.cached_image(versions.SMG_IMAGE, p.image_cache_account, p.region)
                if p.image_cache_account else None,
                front_queue=a.min_replicas == 0 or None, ship_pod_script=not p.pod_scripts,
                keda_namespace=(p.monitoring or {}).get("keda_namespace") or None),
                opts=child("standby", depends_on=[*after, self.model], **kube), plan=m.standby)
        self.role_arn = self.role.role_arn
        self.service_name = self.model.service_name
        self.endpoint = self.model.endpoint
        self.register_outputs({"roleArn": self.role_arn, "serviceName": self.service_name, "endpoint": self.endpoint})

    @staticmethod
    def _router(prefix: str, p: Contract, m: ModelPlan, opts: pulumi.ResourceOptions) -> ModelRouter | None:
        """An SMG router in front of a model that can have several replicas. The model's own Service
        (VllmModel, `routerPodLabels`) sends to it, so clients keep one URL; the router does not wait
        for the model, which waits for it (its pods are Ready once one vLLM pod is)."""
        if not m.routed:
            return None
        vpc = list(p.vpc_cidrs)
        wait = m.router_ready_timeout_seconds
        return ModelRouter(f"{prefix}-{m.name}-router", _args(
            # The model's routing section as written, its policy replaced by the plan's resolved
            # one: `auto` is resolved by the model's replicas, which a router alone does not know
            # (to it `auto` always means prefix_hash). Inside the section, not a separate input,
            # so a routing field still has one key in the router's Args.
            model_name=m.name, namespace=p.namespace,
            routing={**section_entry(m.routing), "policy": m.routing_policy},
            cluster_mode=p.cluster_mode,
            non_gpu_placement=p.non_gpu_placement.args() if p.non_gpu_placement.given else None,
            client_cidrs=vpc if m.routing.internal_load_balancer else None,
            # The routers' metrics listener serves only metrics: the managed collector's ENIs are in
            # the VPC's subnets, a Prometheus of your own is named by its pods.
            metrics_cidrs=vpc if p.managed_scraper else None,
            metrics_scrapers=_scrapers(p),
            # Pods reach the API at the `kubernetes` ClusterIP only (kube-client's in-cluster config
            # dials KUBERNETES_SERVICE_HOST). The AWS network policy agent judges egress on the
            # address the pod sent to, before kube-proxy's DNAT
            # (https://github.com/aws/aws-network-policy-agent/blob/main/pkg/ebpf/c/tc.v4egress.bpf.c,
            # `handle_egress`), and lets the replies of a flow it allowed back in by its conntrack
            # entry (`aws_conntrack_map`, tc.v4ingress.bpf.c), so that one /32 suffices: no VPC
            # block, no other ClusterIP.
            api_server_cidrs=[f"{network_rules.kubernetes_service_ip(p.service_cidr)}/32"],
            ready_timeout_seconds=wait,
            image=image_cache.cached_image(versions.SMG_IMAGE, p.image_cache_account, p.region)
            if p.image_cache_account else None,
            # The model's serving NetworkPolicy admits only its routers, and its Service is the endpoint.
            fence_vllm=False, create_service=False,
            worker_port=m.serving_port if m.pooled is not None else None,
            standby_pool=m.pooled.pool if m.pooled is not None else None,
            **_front_queue(m, (p.monitoring or {}).get("keda_namespace", "keda"))), opts=opts)


def _front_queue(m: ModelPlan, keda_namespace: str) -> dict[str, Any]:
    """The router Args of a model at minReplicas 0: its routers hold requests until an engine
    serves, and tell a client past the bound when to come back. With standby engines that is the
    predicted wake; with zero pods the predicted cold start of a new replica on a new node (after
    a scale to zero Karpenter consolidates the empty GPU node; a pool's warm spares are not in the
    PlatformArgs a model is planned from), held for up to twice that, and KEDA reads the queues."""
    if m.autoscaling is None or m.autoscaling.min_replicas != 0:
        return {}
    if m.standby is not None:
        return {"front_queue_retry_after_seconds": math.ceil(phases.predict_standby_start(
            m.weights_bytes, m.instance, m.standby.sleep_level).total_seconds) + 1}
    ready = phases.predict_from_zero(m.weights_bytes, m.instance, compile_cached=m.compile_cache).total_seconds
    return {"front_queue_retry_after_seconds": math.ceil(ready) + 1,
            "front_queue_hold_seconds": routing_rules.front_queue_hold_seconds(ready), "front_queue_scaled": True,
            "keda_namespace": keda_namespace}


__all__ = ["ServedModel", "ServedModelArgs"]
