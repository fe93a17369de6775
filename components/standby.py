"""One model's standby actuator: wakes a sleeping vLLM engine on load, puts the idlest to sleep.

From its Args alone the component decides through `warmstart.decisions.standby` and registers what
`warmstart.manifests.standby` builds: the actuator's NetworkPolicy (first, so its pod never runs
unfenced), its ServiceAccount, a Role that may only list and patch the namespace's pods and read
and raise the model Deployment's replicas (its scale subresource, by name), its RoleBinding, the
Service KEDA's operator reads the actuator's pods figure from (the ScaledObject's `standby-pods`
trigger, which ModelAutoscaling renders for a model with standby) and a one-pod Deployment on the
non-GPU nodes running warmstart/podside/standby/ (see docs/scale-out.md). The model's pods must run with standby (`--enable-sleep-mode` and
`VLLM_SERVER_DEV_MODE=1`: a VllmModel with `standby`, whose serving NetworkPolicy then admits this
actuator to the pods' serving port) behind a router, whose worker selector requires the
`warmstart.io/engine=awake` label this actuator moves.
"""

from collections.abc import Mapping
from typing import Any, NotRequired, Optional, TypedDict

import pulumi
import pulumi_kubernetes as k8s

from warmstart.config import AutoscalingConfig, StandbyConfig
from warmstart.decisions import standby as decide
from warmstart.errors import ConfigError, ConfigErrors
from warmstart.manifests import standby as objects

from .model_args import ModelEntryAutoscalingArgs, ModelEntryStandbyArgs
from .model_args_gen import camel_case
from .pod_scripts import PodScript
from .providers import kubernetes_provider
from .sections import nested_section, section_config
from .serving import NonGpuPlacementArgs, non_gpu_placement

KEY = "ModelStandbyArgs"
# The keys the Args had before they took the model's `autoscaling` section, by the section's field
# each one was (`minAwake` was the model's `autoscaling.minReplicas`). Deprecated, still read.
FLAT_AUTOSCALING = {"min_awake": "min_replicas", "target_waiting_per_replica": "target_waiting_per_replica"}


class ModelStandbyArgs(TypedDict):
    """Inputs of the ModelStandby component."""

    model_name: str
    """The model's name (its vLLM pods' `app.kubernetes.io/instance` and `--served-model-name`)."""
    namespace: str
    """Namespace of the model's pods."""
    weights_gib: float
    """Size of the model's weights in GiB (what a sleeper holds at level 1)."""
    standby: NotRequired[ModelEntryStandbyArgs]
    """The model's `standby` section, as a stack config writes it: `count` (engines kept asleep),
    `sleepLevel`, `awakeIdleSeconds`. Its validation and defaults are the config's. Deprecated,
    still read: those keys at the top of the Args."""
    autoscaling: NotRequired[ModelEntryAutoscalingArgs]
    """The model's `autoscaling` section, as a stack config writes it (standby needs autoscaling):
    the actuator keeps `minReplicas` engines awake and wakes a sleeper when more than
    `targetWaitingPerReplica` requests wait per awake engine. Its validation and defaults are the
    config's (`maxReplicas` is required there). Required, unless the deprecated flat keys are
    given: `minAwake` (= `minReplicas`) and `targetWaitingPerReplica` at the top of the Args."""
    api_server_cidrs: list[str]
    """Where the pod reaches the Kubernetes API: the `kubernetes` Service's ClusterIP as a /32 (the
    AWS network policy agent judges the address before DNAT; replies ride conntrack)."""
    non_gpu_placement: NotRequired[NonGpuPlacementArgs]
    """The non-GPU nodes the actuator runs on (a platform's `nonGpuPlacement`). Default: anywhere
    off the GPU nodes."""
    image: NotRequired[str]
    """Image with python3 for the actuator (default: the router's SMG image)."""
    front_queue: NotRequired[bool]
    """The model's routers hold requests in a front queue (`minReplicas: 0`): the actuator counts
    the held requests as waiting (default false)."""
    ship_pod_script: NotRequired[bool]
    """Create the script's ConfigMap for this model (default true). False when the platform ships
    it to the namespace (`warmstart-standby`)."""
    deployment_name: NotRequired[str]
    """The model's Deployment, whose replicas a wake raises through its scale subresource (default:
    the model's name, as VllmModel names it)."""
    keda_namespace: NotRequired[str]
    """Namespace of KEDA's operator, the one peer that may read the actuator's pods figure
    (default `keda`)."""
    kubeconfig: NotRequired[pulumi.Input[str]]
    """Kubeconfig of the cluster; without it the objects use the provider of the resource
    options (or the ambient one)."""


def standby_section(args: Mapping[str, Any], resource: pulumi.Resource | None = None) -> StandbyConfig:
    """The Args' `standby` section as the config model (ConfigErrors keyed
    `ModelStandbyArgs.standby.<key>`; `ModelStandbyArgs.<key>` for the deprecated flat keys)."""
    return nested_section(StandbyConfig, args, "standby", KEY, resource)[0]


def autoscaling_section(args: Mapping[str, Any], resource: pulumi.Resource | None = None) -> AutoscalingConfig:
    """The Args' `autoscaling` section as the config model (ConfigErrors keyed
    `ModelStandbyArgs.autoscaling.<key>`), or what the deprecated flat keys `minAwake` and
    `targetWaitingPerReplica` say of it (keyed by the key they were given by)."""
    flat = {k: args[k] for k in FLAT_AUTOSCALING if args.get(k) is not None}
    if not flat:
        return section_config(AutoscalingConfig, args.get("autoscaling") or {}, f"{KEY}.autoscaling")
    names = ", ".join(camel_case(k) for k in sorted(flat))
    if args.get("autoscaling") is not None:
        raise ConfigError(f"{KEY}.{camel_case(sorted(flat)[0])}", f"is given at the top of {KEY} and `autoscaling` "
                          f"is given too ({names} belong under `autoscaling`)",
                          "give the model's autoscaling section alone (minAwake is its minReplicas)", sorted(flat))
    pulumi.log.warn(f"{KEY}: {names} at the top of the Args are deprecated; pass the model's `autoscaling` "
                    f"section ({KEY}.autoscaling.<key>; minAwake is its minReplicas)", resource=resource)
    given = {FLAT_AUTOSCALING[k]: v for k, v in flat.items()}
    # The flat Args had no maxReplicas, which the actuator does not read and the section requires:
    # read at its least, so only what was given can be refused.
    least = given.get("min_replicas")
    most = max(1, least) if isinstance(least, int) and not isinstance(least, bool) else 1
    try:
        return section_config(AutoscalingConfig, given | {"max_replicas": most}, KEY)
    except ConfigErrors as err:
        raise ConfigErrors([_flat_key(e) for e in err.errors]) from None


def _flat_key(err: ConfigError) -> ConfigError:
    """An error of the section read from the flat keys, under the key it was given by."""
    given = {f"{KEY}.{camel_case(field)}": f"{KEY}.{camel_case(flat)}" for flat, field in FLAT_AUTOSCALING.items()}
    return ConfigError(given.get(err.key, err.key), err.rule, err.fix, err.value)


class ModelStandby(pulumi.ComponentResource):
    """The standby actuator of one vLLM model: it wakes a sleeping engine when the awake ones'
    queue passes the target, and puts the idlest awake engine back to sleep when it has been idle."""

    deployment_name: pulumi.Output[str]
    """Name of the actuator's Deployment."""

    def __init__(self, name: str, args: ModelStandbyArgs, opts: Optional[pulumi.ResourceOptions] = None, *,
                 plan: decide.StandbyPlan | None = None) -> None:
        super().__init__("warmstart:index:ModelStandby", name, None, opts)
        model = args["model_name"]
        # The model's sections, read back through the config models they are generated from (no
        # field of theirs is declared here).
        standby, autoscaling = standby_section(args, self), autoscaling_section(args, self)
        if standby.pool is not None:
            raise ConfigError(f"{KEY}.standby.pool", f"{model}: names standby pool '{standby.pool}', whose actuator "
                              "is the pool's (a WarmstartStack renders it with the pool's hosts); a pooled model has "
                              "no actuator of its own", "remove pool for per-model standby, or declare the pool in "
                              "the stack's warmstart:standbyPools", standby.pool)
        if plan is None:
            # The component alone plans its model's standby; inside a stack (ServedModel) it reads the
            # model's plan (plan/model.py), so standby is planned once.
            plan = decide.plan_standby(count=standby.count, sleep_level=standby.sleep_level,
                                       awake_idle_seconds=standby.awake_idle_seconds,
                                       weights_bytes=int(args["weights_gib"] * 2**30))
        self.plan = decide.plan_actuator(
            model=model, namespace=args["namespace"], image=args.get("image") or objects.IMAGE, standby=plan,
            min_awake=autoscaling.min_replicas, target_waiting=autoscaling.target_waiting_per_replica,
            non_gpu=non_gpu_placement(args.get("non_gpu_placement"), "ModelStandbyArgs.nonGpuPlacement"),
            api_server_cidrs=args["api_server_cidrs"], front_queue=bool(args.get("front_queue")),
            deployment=args.get("deployment_name") or model,
            # The ScaledObject's maxReplicaCount (decisions/autoscaling.py `plan_scaling`); the
            # deprecated flat keys carry no maxReplicas: no bound then (the HPA's own holds).
            max_pods=autoscaling.max_replicas + plan.count if args.get("autoscaling") is not None else 0,
            target_requests=autoscaling.target_requests_per_replica,
            keda_namespace=args.get("keda_namespace") or "keda")
        child = pulumi.ResourceOptions(parent=self)
        if args.get("kubeconfig") is not None:
            provider = kubernetes_provider(name, args["kubeconfig"], child)
            child = pulumi.ResourceOptions(parent=self, provider=provider)
        ship = bool(args.get("ship_pod_script", True))
        script_map = self.plan.script_config_map(objects.CONFIGMAP_NAME, ship)
        needs: list[pulumi.Resource] = []
        if ship:
            needs.append(PodScript(f"{name}-script", args["namespace"], script_map, objects.SCRIPT_KEY, opts=child))
        for obj in objects.objects(self.plan, script_map):
            kind, meta = obj["kind"], obj["metadata"]
            after = pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=list(needs)))
            suffix = {"NetworkPolicy": "netpol",
                      "ServiceAccount": "sa", "Role": "role", "RoleBinding": "role-binding", "Service": "service",
                      "Deployment": "deployment"}[kind]
            if kind == "NetworkPolicy":
                r: pulumi.Resource = k8s.networking.v1.NetworkPolicy(f"{name}-{suffix}", metadata=meta,
                                                                     spec=obj["spec"], opts=after)
            elif kind == "ServiceAccount":
                r = k8s.core.v1.ServiceAccount(f"{name}-{suffix}", metadata=meta,
                                               automount_service_account_token=True, opts=after)
            elif kind == "Role":
                r = k8s.rbac.v1.Role(f"{name}-{suffix}", metadata=meta, rules=obj["rules"], opts=after)
            elif kind == "RoleBinding":
                r = k8s.rbac.v1.RoleBinding(f"{name}-{suffix}", metadata=meta, role_ref=obj["roleRef"],
                                            subjects=obj["subjects"], opts=after)
            elif kind == "Service":
                r = k8s.core.v1.Service(f"{name}-{suffix}", metadata=meta, spec=obj["spec"], opts=after)
            else:
                r = k8s.apps.v1.Deployment(f"{name}-{suffix}", metadata=meta, spec=obj["spec"], opts=after)
                self.deployment_name = pulumi.Output.from_input(meta["name"])
            needs.append(r)
        self.register_outputs({"deploymentName": self.deployment_name})
