"""One model's Deployment scaled by KEDA on vLLM's queue (and, optionally, its KV-cache usage).

From its Args alone the component decides through `warmstart.decisions.autoscaling` (the exact
PromQL, the polling interval, a scale-up at once and a scale-down held for the model's start-up
budget) and registers what `warmstart.manifests.autoscaling` builds: a TriggerAuthentication
(AMP: SigV4 with the KEDA operator's role) and the ScaledObject on the model's Deployment.

The KEDA CRDs come with KEDA's chart: give `dependsOn` the Monitoring component's `keda`
release. The Deployment's `replicas` belongs to KEDA from then on; its owner must ignore that
field (`ignoreChanges: ["spec.replicas"]`), or every `pulumi up` resets what KEDA decided.
"""

from typing import NotRequired, Optional, TypedDict

import pulumi
import pulumi_kubernetes as k8s

from warmstart.config import AutoscalingConfig, StandbyConfig
from warmstart.decisions import autoscaling as decide
from warmstart.errors import ConfigError
from warmstart.manifests import autoscaling as objects

from .model_args import ModelEntryAutoscalingArgs, ModelEntryStandbyArgs
from .providers import kubernetes_provider
from .sections import nested_section, section_config

KEY = "ModelAutoscalingArgs"


class ModelAutoscalingArgs(TypedDict):
    """Inputs of the ModelAutoscaling component."""

    model_name: str
    """The model's name: vLLM's `--served-model-name` (the queries' `model_name`) and the
    ScaledObject's name."""
    namespace: str
    """Namespace of the model's Deployment (the queries' `namespace`)."""
    autoscaling: NotRequired[ModelEntryAutoscalingArgs]
    """The model's `autoscaling` section, as a stack config writes it: `minReplicas` (>= 1 unless
    `frontQueue`), `maxReplicas` (required), `targetWaitingPerReplica`, `targetRequestsPerReplica`, `kvCacheUsageCeiling`.
    Its validation and defaults are the config's. Deprecated, still read: those keys at the top
    of the Args."""
    startup_budget_seconds: int
    """The model's start-up budget: scale-down waits at least this long."""
    server_address: pulumi.Input[str]
    """Prometheus-compatible base URL KEDA queries (the Monitoring component's `serverAddress`)."""
    deployment_name: NotRequired[str]
    """The Deployment KEDA scales (default: the model's name)."""
    region: NotRequired[str]
    """AWS region of the AMP workspace: KEDA signs its queries with SigV4 as the operator's role.
    Omit for an endpoint that takes unsigned queries."""
    standby: NotRequired[ModelEntryStandbyArgs]
    """The model's `standby` section, as a stack config writes it, when it keeps engines asleep:
    KEDA's range is `minReplicas`/`maxReplicas` plus `count` pods, and its query keeps them beside
    the awake pods the queue asks for. Default: none."""
    standby_pool: NotRequired[str]
    """The standby pool the model is a member of (`standby.pool`): KEDA also reads the model's pods
    figure from the pool's actuator (`/warmstart/pods/<model>`), where the engine woken for it on a
    pool host counts as awake."""
    standby_count: NotRequired[int]
    """Deprecated (removed in 2.0.0): `standby.count`."""
    front_queue: NotRequired[bool]
    """A queue in front of the model holds requests while no replica exists, so `minReplicas: 0`
    is allowed (default false: the router does not queue without replicas). With no standby
    engines KEDA then scales from zero pods on the front queues' held and in-flight requests,
    which its operator reads every second from each endpoint of `frontQueueService`."""
    front_queue_service: NotRequired[str]
    """The Service whose endpoints are the front queues (the model's routers' pods, on the
    router's serving port 30000): default the model's own Service, named as the model."""
    kubeconfig: NotRequired[pulumi.Input[str]]
    """Kubeconfig of the cluster; without it the objects use the provider of the resource
    options (or the ambient one)."""


def standby_count(args: ModelAutoscalingArgs, resource: pulumi.Resource | None = None) -> int:
    """The engines the model keeps asleep: its `standby` section's `count`, read back through the
    config model (errors keyed `ModelAutoscalingArgs.standby.<key>`), or the deprecated
    `standbyCount`; 0 without either."""
    count = args.get("standby_count")
    if count is None:
        given = args.get("standby")
        if given is None:
            return 0
        section = section_config(StandbyConfig, given, f"{KEY}.standby")
        # A pooled model keeps no sleepers of its own: the pool's hosts hold its engine.
        return 0 if section.pool is not None else section.count
    if args.get("standby") is not None:
        raise ConfigError(f"{KEY}.standbyCount", "is given and `standby` is given too (standbyCount is "
                          "standby.count)", "give the model's standby section alone", count)
    pulumi.log.warn(f"{KEY}: standbyCount is deprecated; pass the model's `standby` section "
                    f"({KEY}.standby.count)", resource=resource)
    return section_config(StandbyConfig, {"count": count}, KEY).count


class ModelAutoscaling(pulumi.ComponentResource):
    """KEDA autoscaling of one vLLM Deployment on vLLM's own metrics."""

    scaled_object_name: pulumi.Output[str]
    """Name of the ScaledObject (KEDA names its HPA `keda-hpa-<name>`)."""

    def __init__(self, name: str, args: ModelAutoscalingArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        super().__init__("warmstart:index:ModelAutoscaling", name, None, opts)
        model, namespace = args["model_name"], args["namespace"]
        section, where = nested_section(AutoscalingConfig, args, "autoscaling", "ModelAutoscalingArgs", self)
        spec = decide.AutoscalingSpec(
            min_replicas=section.min_replicas, max_replicas=section.max_replicas,
            target_waiting_per_replica=section.target_waiting_per_replica,
            kv_cache_usage_ceiling=section.kv_cache_usage_ceiling, standby=standby_count(args, self),
            target_requests_per_replica=section.target_requests_per_replica)
        # The section's rules beyond its own fields' (minReplicas 0 needs a front queue, ...),
        # under the section's key.
        decide.check_spec(spec, key=where, model=model, front_queue=bool(args.get("front_queue")))
        # Every decision is made here, from the Args alone, by the pure planner.
        self.plan = decide.plan_scaling(model, namespace, spec, args["startup_budget_seconds"],
                                        args.get("deployment_name"),
                                        front_queue_service=args.get("front_queue_service", model)
                                        if args.get("front_queue") else None,
                                        standby_pool=args.get("standby_pool") or None)
        child = pulumi.ResourceOptions(parent=self)
        if args.get("kubeconfig") is not None:
            provider = kubernetes_provider(name, args["kubeconfig"], child)
            child = pulumi.ResourceOptions(parent=self, provider=provider)
        region = args.get("region")
        auth_name = None
        after = child
        if region is not None:
            auth = _custom(f"{name}-trigger-auth", objects.trigger_authentication(model, namespace), child)
            auth_name = objects.trigger_authentication_name(model)
            after = pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[auth]))
        so = _custom(f"{name}-scaled-object",
                     objects.scaled_object(self.plan, args["server_address"], region=region, authentication=auth_name),
                     after)
        self.scaled_object_name = pulumi.Output.all(so.id).apply(lambda _: self.plan.model)
        self.register_outputs({"scaledObjectName": self.scaled_object_name})


def _custom(name: str, obj: dict, opts: pulumi.ResourceOptions) -> k8s.apiextensions.CustomResource:
    return k8s.apiextensions.CustomResource(
        name, api_version=obj["apiVersion"], kind=obj["kind"], metadata=obj["metadata"],
        spec=obj["spec"], opts=opts)
