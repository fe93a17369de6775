"""One model's standby actuator: wakes a sleeping vLLM engine on load, puts the idlest to sleep.

From its Args alone the component decides through `warmstart.decisions.standby` and registers what
`warmstart.manifests.standby` builds: the actuator's NetworkPolicy (first, so its pod never runs
unfenced), its ServiceAccount, a Role that may only list and patch the namespace's pods, its
RoleBinding and a one-pod Deployment on the non-GPU nodes running warmstart/podside/standby.py
(see docs/scale-out.md). The model's pods must run with standby (`--enable-sleep-mode`,
`VLLM_SERVER_DEV_MODE=1` and the sleep-aware readiness: a VllmModel with `standby`, whose serving
NetworkPolicy then admits this actuator to the pods' serving port).
"""

from typing import NotRequired, Optional, TypedDict

import pulumi
import pulumi_kubernetes as k8s

from warmstart.decisions import standby as decide
from warmstart.manifests import standby as objects

from .pod_scripts import PodScript
from .providers import kubernetes_provider
from .serving import NonGpuPlacementArgs, non_gpu_placement


class ModelStandbyArgs(TypedDict):
    """Inputs of the ModelStandby component."""

    model_name: str
    """The model's name (its vLLM pods' `app.kubernetes.io/instance` and `--served-model-name`)."""
    namespace: str
    """Namespace of the model's pods."""
    weights_gib: float
    """Size of the model's weights in GiB (what a sleeper holds at level 1)."""
    count: int
    """Engines kept asleep."""
    min_awake: int
    """Fewest awake engines (the model's `autoscaling.minReplicas`)."""
    api_server_cidrs: list[str]
    """Where the pod reaches the Kubernetes API: the `kubernetes` Service's ClusterIP as a /32 (the
    AWS network policy agent judges the address before DNAT; replies ride conntrack)."""
    sleep_level: NotRequired[int]
    """vLLM sleep level, 1 (default: weights to host RAM) or 2 (weights dropped, reloaded on wake)."""
    awake_idle_seconds: NotRequired[int]
    """Idle time after which an awake engine may go back to sleep (default 300)."""
    target_waiting_per_replica: NotRequired[float]
    """Requests waiting per awake engine above which a sleeper is woken (default 5, KEDA's)."""
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
    kubeconfig: NotRequired[pulumi.Input[str]]
    """Kubeconfig of the cluster; without it the objects use the provider of the resource
    options (or the ambient one)."""


class ModelStandby(pulumi.ComponentResource):
    """The standby actuator of one vLLM model: it wakes a sleeping engine when the awake ones'
    queue passes the target, and puts the idlest awake engine back to sleep when it has been idle."""

    deployment_name: pulumi.Output[str]
    """Name of the actuator's Deployment."""

    def __init__(self, name: str, args: ModelStandbyArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        super().__init__("warmstart:index:ModelStandby", name, None, opts)
        model = args["model_name"]
        plan = decide.plan_standby(count=args["count"], sleep_level=args.get("sleep_level", 1),
                                   awake_idle_seconds=args.get("awake_idle_seconds", 300),
                                   weights_bytes=int(args["weights_gib"] * 2**30))
        self.plan = decide.plan_actuator(
            model=model, namespace=args["namespace"], image=args.get("image") or objects.IMAGE, standby=plan,
            min_awake=args["min_awake"], target_waiting=args.get("target_waiting_per_replica", 5.0),
            non_gpu=non_gpu_placement(args.get("non_gpu_placement"), "ModelStandbyArgs.nonGpuPlacement"),
            api_server_cidrs=args["api_server_cidrs"], front_queue=bool(args.get("front_queue")))
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
                      "ServiceAccount": "sa", "Role": "role", "RoleBinding": "role-binding",
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
            else:
                r = k8s.apps.v1.Deployment(f"{name}-{suffix}", metadata=meta, spec=obj["spec"], opts=after)
                self.deployment_name = pulumi.Output.from_input(meta["name"])
            needs.append(r)
        self.register_outputs({"deploymentName": self.deployment_name})
