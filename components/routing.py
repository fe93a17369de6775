"""A prefix-aware router in front of one model's vLLM replicas.

From its Args the component plans the router (`warmstart.decisions.routing.plan`: SMG's
`prefix_hash` policy and its load bound, accounted for two router replicas) and registers the
objects `warmstart.manifests.routing` builds: ServiceAccount, Role and RoleBinding (read pods in
the namespace), the SMG Deployment on non-GPU nodes, its PodDisruptionBudget, the Service that is
the model's endpoint, the NetworkPolicies, and optionally an internal load balancer and the
control-plane key Secret.
"""

from collections.abc import Mapping
from enum import Enum
from typing import Any, NotRequired, Optional, TypedDict

import pulumi
import pulumi_kubernetes as k8s

from warmstart import versions
from warmstart.config import RoutingConfig
from warmstart.errors import ConfigError, ConfigErrors
from warmstart.decisions import routing
from warmstart.decisions.routing import RoutingPlan
from warmstart.manifests import routing as objects
from warmstart.manifests.routing import SERVICE_PORT

from .enums import ClusterMode, mode_value
from .model_args import ModelEntryRoutingArgs
from .providers import kubernetes_provider
from .sections import nested_section
from .serving import NonGpuPlacementArgs, ScraperPodsArgs, non_gpu_placement

DEFAULT_NAMESPACE = "default"


class RoutingPolicy(str, Enum):
    """How the router spreads a model's requests over its replicas (SMG's `--policy`)."""

    PREFIX_HASH = "prefix_hash"
    """Prefix-aware: the same prompt prefix goes to the same replica (its KV cache), unless that
    replica is over the load bound; replicas joining or leaving move about 1/N of the prefixes."""
    ROUND_ROBIN = "round_robin"
    """Plain load balancing, each replica in turn."""


class ModelRouterArgs(TypedDict):
    """Inputs of the ModelRouter component."""

    model_name: str
    """The model (the VllmModel's `modelName`): the router discovers exactly its vLLM pods."""
    namespace: NotRequired[str]
    """Namespace of the model's pods, where the router runs (default `default`)."""
    routing: NotRequired[ModelEntryRoutingArgs]
    """The model's `routing` section, as a stack config writes it: `policy` (`auto`, the default,
    is `prefix_hash` here: a router exists only for a routed model; `none` is refused),
    `loadFactor`, `maxExcessRequests` and `internalLoadBalancer` (also put an internal Network
    Load Balancer in front of the routers: Auto Mode provisions it itself; in karpenter mode the
    cluster's cloud provider does, with the legacy NLB annotations). Its validation and defaults
    are the config's. Deprecated, still read: `policy`, `loadFactor`, `maxExcessRequests` and
    `expose` (= `internalLoadBalancer`) at the top of the Args."""
    cluster_mode: NotRequired[ClusterMode]
    """How the cluster runs its nodes, which decides the load balancer's annotations (default auto)."""
    non_gpu_placement: NotRequired[NonGpuPlacementArgs]
    """The non-GPU nodes the routers run on (a node selector and tolerations; the platform's
    `nonGpuPlacement`). Default: anywhere off the GPU nodes."""
    router_replicas: NotRequired[int]
    """Router pods, one per node (default 2, so one can be drained while the other serves)."""
    prefix_tokens: NotRequired[int]
    """Leading tokens hashed to choose a replica (default 256; text counts 4 characters a token)."""
    waiting_requests: NotRequired[int]
    """A replica whose vLLM queue holds this many waiting requests is left out while another
    is below it (default 8, SMG's)."""
    client_cidrs: NotRequired[list[str]]
    """CIDRs besides the namespace's pods that may call the endpoint (needed with
    `routing.internalLoadBalancer`: the load balancer's clients, e.g. the VPC CIDR)."""
    metrics_cidrs: NotRequired[list[str]]
    """CIDRs that may scrape the routers' Prometheus metrics on port 29000 (default none: the
    listener is bound to 127.0.0.1)."""
    metrics_scrapers: NotRequired[list[ScraperPodsArgs]]
    """Pods that may scrape the routers' metrics (a Prometheus in the cluster), by namespace and
    labels; like `metricsCidrs`, they bind the listener for them."""
    vllm_scrape_cidrs: NotRequired[list[str]]
    """CIDRs that may still reach the vLLM pods' port 8000 besides the routers, such as a metrics
    scraper (vLLM serves /metrics on its serving port)."""
    api_server_cidrs: NotRequired[list[str]]
    """Where the routers reach the Kubernetes API, for their egress policy (default any address).
    Tighter: the `kubernetes` Service's ClusterIP as a /32 (the first address of the Service range,
    e.g. 172.20.0.1/32), which pods call and the AWS network policy agent judges before DNAT."""
    ready_timeout_seconds: NotRequired[int]
    """How long `up` waits for the routers to become Ready, which they are once one vLLM pod is:
    give the model's start-up allowance (default 1800)."""
    fence_vllm: NotRequired[bool]
    """Also register the NetworkPolicy that lets only the routers (and `vllmScrapeCidrs`) reach
    the vLLM pods' port 8000 (default true). False when the model's own serving policy already
    admits only its router, as the warmstart stack's does: policies add up, so a looser second
    one would undo it."""
    service_name: NotRequired[str]
    """Name of the endpoint Service (default the model's name, which clients already call)."""
    create_service: NotRequired[bool]
    """Create the endpoint Service (default true). False when the model's own Service (the
    VllmModel component's, with `routed: true`) already sends to the routers, as in the
    warmstart stack: one Service object keeps one owner in the state, so turning routing on or
    off updates the Service in place instead of deleting and re-creating the model's endpoint."""
    image: NotRequired[str]
    """SMG image (default: warmstart's pinned SMG)."""
    front_queue_retry_after_seconds: NotRequired[int]
    """Put a front queue in each router pod that holds requests while the model has no awake
    engine (scale from zero), answering 429 with this Retry-After past its bounds (default 0: no
    front queue). Its script's ConfigMap `warmstart-front-queue` must be in the namespace."""
    front_queue_hold_seconds: NotRequired[int]
    """How long the front queue holds a request before that 429 (1-600, default 120)."""
    front_queue_scaled: NotRequired[bool]
    """KEDA's operator reads the front queues' held count (a model that scales from zero pods):
    its pods (namespace `kedaNamespace`, label `app: keda-operator`) are admitted to the serving
    port (default false)."""
    keda_namespace: NotRequired[str]
    """Namespace of that KEDA operator (default `keda`)."""
    worker_port: NotRequired[int]
    """The port the model's vLLM pods serve on (default 8000; a pooled model's member port)."""
    standby_pool: NotRequired[str]
    """The standby pool the model is a member of (`standby.pool`): the router then discovers pods
    labelled `warmstart.io/serves=<model>` with an awake engine (its own pods and a pool host whose
    engine of the model is awake) and may reach the pool's hosts on `workerPort`."""
    control_plane_api_key: NotRequired[pulumi.Input[str]]
    """Key for SMG's control plane (`Authorization: Bearer <key>` on /workers, /get_loads); pass
    a secret. Without it each router draws a random key that never leaves the pod: discovery
    needs no control plane, so it stays closed."""
    kubeconfig: NotRequired[pulumi.Input[str]]
    """Kubeconfig of the cluster; without it the objects use the Kubernetes provider of the
    resource options (or the ambient one)."""


# The planner's keys of the routing section's fields (`routing.plan` names the policy `mode`).
_SECTION_KEYS = {"mode": "policy", "loadFactor": "loadFactor", "maxExcessRequests": "maxExcessRequests"}


def routing_section(args: Mapping[str, Any], resource: pulumi.Resource | None = None) -> tuple[RoutingConfig, str]:
    """The Args' `routing` section as the config model, and the key its errors are under
    (`ModelRouterArgs.routing`; `ModelRouterArgs` for the deprecated flat keys)."""
    if "expose" not in args:
        return nested_section(RoutingConfig, args, "routing", "ModelRouterArgs", resource)
    # The flat Args called `internalLoadBalancer` `expose`: read as that field, its errors
    # under the key it was given by.
    given = {**{k: v for k, v in args.items() if k != "expose"}, "internal_load_balancer": args["expose"]}
    try:
        return nested_section(RoutingConfig, given, "routing", "ModelRouterArgs", resource)
    except ConfigErrors as err:
        raise ConfigErrors([_expose_key(e) for e in err.errors]) from None
    except ConfigError as err:
        raise _expose_key(err) from None


def _expose_key(err: ConfigError) -> ConfigError:
    if err.key != "ModelRouterArgs.internalLoadBalancer":
        return err
    return ConfigError("ModelRouterArgs.expose", err.rule, err.fix, err.value)


def plan(args: ModelRouterArgs, resource: pulumi.Resource | None = None) -> RoutingPlan:
    """The router's decisions from its Args alone (ConfigErrors keyed `ModelRouterArgs.*`, the
    routing section's `ModelRouterArgs.routing.*`)."""
    section, where = routing_section(args, resource)
    try:
        return routing.plan(
            args["model_name"], args.get("namespace") or DEFAULT_NAMESPACE, section.policy,
            mode_value(args.get("cluster_mode", ClusterMode.AUTO)),  # type: ignore[arg-type]
            args.get("image") or versions.SMG_IMAGE, key="ModelRouterArgs",
            router_replicas=args.get("router_replicas", routing.ROUTER_REPLICAS),
            load_factor=section.load_factor, max_excess_requests=section.max_excess_requests,
            prefix_tokens=args.get("prefix_tokens", routing.DEFAULT_PREFIX_TOKENS),
            waiting_requests=args.get("waiting_requests", routing.DEFAULT_WAITING_REQUESTS),
            client_cidrs=args.get("client_cidrs") or (), metrics_cidrs=args.get("metrics_cidrs") or (),
            metrics_pods=[(s["namespace"], s["pod_labels"]) for s in args.get("metrics_scrapers") or []],
            vllm_scrape_cidrs=args.get("vllm_scrape_cidrs") or (),
            api_server_cidrs=args.get("api_server_cidrs", ["0.0.0.0/0"]),
            expose=section.internal_load_balancer, ready_timeout_seconds=args.get(
                "ready_timeout_seconds", routing.DEFAULT_READY_TIMEOUT_SECONDS),
            non_gpu=non_gpu_placement(args.get("non_gpu_placement"), "ModelRouterArgs.nonGpuPlacement"),
            front_queue_retry_after_seconds=args.get("front_queue_retry_after_seconds", 0),
            front_queue_hold_seconds=args.get("front_queue_hold_seconds", routing.FRONT_QUEUE_HOLD_SECONDS),
            front_queue_scaled=bool(args.get("front_queue_scaled")), keda_namespace=args.get("keda_namespace", "keda"),
            worker_port=args.get("worker_port", routing.VLLM_PORT), standby_pool=args.get("standby_pool") or None)
    except ConfigErrors as err:
        # The planner's rules on the section's fields (`policy: none` has no router) are
        # reported under the section's key, as the config's own are.
        raise ConfigErrors([_section_key(e, where) for e in err.errors]) from None
    except ConfigError as err:
        raise _section_key(err, where) from None


def _section_key(err: ConfigError, where: str) -> ConfigError:
    field = err.key.removeprefix("ModelRouterArgs.")
    if err.key.startswith("ModelRouterArgs.") and field in _SECTION_KEYS:
        return ConfigError(f"{where}.{_SECTION_KEYS[field]}", err.rule, err.fix, err.value)
    return err


class ModelRouter(pulumi.ComponentResource):
    """SMG in front of one model's vLLM replicas: the same prompt prefix reaches the replica that
    holds its KV cache, a replica over the load bound is skipped, and only Ready pods get traffic.
    Python programs also get `plan`, every decision."""

    service_name: pulumi.Output[str]
    """The endpoint Service's name."""
    endpoint: pulumi.Output[str]
    """OpenAI-compatible API base URL inside the cluster: `http://<service>.<namespace>.svc:8000/v1`."""

    def __init__(self, name: str, args: ModelRouterArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        super().__init__("warmstart:index:ModelRouter", name, None, opts)
        self.plan: RoutingPlan = plan(args, self)
        p = self.plan
        child = pulumi.ResourceOptions(parent=self)
        if args.get("kubeconfig") is not None:
            provider = kubernetes_provider(name, args["kubeconfig"], child)
            child = pulumi.ResourceOptions(parent=self, provider=provider)

        sa = objects.service_account_spec(p)
        account = k8s.core.v1.ServiceAccount(f"{name}-sa", metadata=sa["metadata"],
                                             automount_service_account_token=True, opts=child)
        role = objects.role_spec(p)
        role_res = k8s.rbac.v1.Role(f"{name}-role", metadata=role["metadata"], rules=role["rules"], opts=child)
        binding = objects.role_binding_spec(p)
        binding_res = k8s.rbac.v1.RoleBinding(f"{name}-rolebinding", metadata=binding["metadata"],
                                              role_ref=binding["roleRef"], subjects=binding["subjects"], opts=child)
        # The routers' own egress policy first: a pod started before it exists would run unfenced.
        fence = objects.router_network_policy_spec(p)
        fence_res = k8s.networking.v1.NetworkPolicy(f"{name}-netpol", metadata=fence["metadata"],
                                                    spec=fence["spec"], opts=child)
        before_pods: list[pulumi.Resource] = [account, role_res, binding_res, fence_res]
        key = args.get("control_plane_api_key")
        if key is not None:
            secret = objects.control_plane_secret_spec(p, pulumi.Output.secret(key))
            before_pods.append(k8s.core.v1.Secret(f"{name}-control-plane", metadata=secret["metadata"],
                                                  type=secret["type"], string_data=secret["stringData"], opts=child))
        dep = objects.deployment_spec(p)
        timeout = f"{p.ready_timeout_seconds}s"
        k8s.apps.v1.Deployment(
            f"{name}-deployment", metadata=dep["metadata"], spec=dep["spec"],
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(
                depends_on=before_pods, custom_timeouts=pulumi.CustomTimeouts(create=timeout, update=timeout))))
        pdb = objects.pdb_spec(p)
        k8s.policy.v1.PodDisruptionBudget(f"{name}-pdb", metadata=pdb["metadata"], spec=pdb["spec"], opts=child)
        if args.get("fence_vllm", True):
            vllm_fence = objects.vllm_network_policy_spec(p)
            k8s.networking.v1.NetworkPolicy(f"{name}-vllm-netpol", metadata=vllm_fence["metadata"],
                                            spec=vllm_fence["spec"], opts=child)
        svc = objects.service_spec(p, args.get("service_name"))
        if args.get("create_service", True):
            service = k8s.core.v1.Service(f"{name}-service", metadata=svc["metadata"], spec=svc["spec"], opts=child)
            self.service_name = service.metadata.apply(lambda md: md["name"] if isinstance(md, dict) else md.name)
        else:
            self.service_name = pulumi.Output.from_input(svc["metadata"]["name"])
        if p.expose:
            lb = objects.load_balancer_service_spec(p)
            k8s.core.v1.Service(f"{name}-internal-lb", metadata=lb["metadata"], spec=lb["spec"], opts=child)
        self.endpoint = pulumi.Output.all(self.service_name, p.namespace).apply(
            lambda v: f"http://{v[0]}.{v[1]}.svc:{SERVICE_PORT}/v1")
        self.register_outputs({"serviceName": self.service_name, "endpoint": self.endpoint})


__all__ = ["ModelRouter", "ModelRouterArgs", "RoutingPolicy", "ScraperPodsArgs", "plan", "routing_section"]
