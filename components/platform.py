"""A serving platform: what every model on a cluster shares, and `PlatformArgs`, the one handle
a model takes to its platform (as pulumi-eks's node groups take `cluster: Cluster | CoreData`).

`ServingPlatform` registers what is cluster-wide: the namespace, the pod-side scripts'
ConfigMaps (one table, below), the node cache's PriorityClasses and node-feature-discovery,
each pool's warm spares, and the ECR pull-through cache of Docker Hub (the nodes' right to fill
it is the Cluster component's, which owns the node roles). Its output is a `PlatformArgs`: the
facts and identifiers it was given, plus what it now runs. A `ServedModel` built from a
`PlatformArgs` needs nothing else: the warmstart stack passes its own, a model stack reads one
from its platform stack's `warmstartPlatform` output, and a program may write one for a cluster
warmstart did not create (examples/model-on-existing-platform).
"""

from typing import NotRequired, Optional, TypedDict

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from warmstart import versions
from warmstart.decisions import image_cache
from warmstart.decisions import placement
from warmstart.manifests import compile_cache, first_token, metrics_proxy, nvme_check
from warmstart.manifests import node_cache as staging_objects
from warmstart.manifests import weights_import as import_job
from warmstart.manifests import routing as router_objects
from warmstart.manifests import standby as standby_objects
from warmstart.plan import platform as facts

from .enums import ClusterMode, NvmeCheckMode
from .node_cache import WarmSpareArgs, register_warm_spares
from .pod_scripts import PodScript
from .serving import LoaderArgs, NonGpuPlacementArgs, ScraperPodsArgs, TolerationArgs

# Every pod-side script a model may need, once per namespace: (name suffix, ConfigMap, script).
POD_SCRIPTS = (
    ("nvme-check", nvme_check.CONFIGMAP_NAME, nvme_check.SCRIPT_KEY),
    ("compile-cache", compile_cache.CONFIGMAP_NAME, compile_cache.SCRIPT_KEY),
    ("first-token", first_token.CONFIGMAP_NAME, first_token.SCRIPT_KEY),
    ("weights-import", import_job.CONFIGMAP_NAME, import_job.SCRIPT_KEY),
    ("weights-stage", staging_objects.STAGE_CONFIGMAP, staging_objects.STAGE_SCRIPT),
    ("weights-select", staging_objects.SELECT_CONFIGMAP, staging_objects.SELECT_SCRIPT),
    ("metrics-proxy", metrics_proxy.CONFIGMAP_NAME, metrics_proxy.SCRIPT_KEY),
    ("standby", standby_objects.CONFIGMAP_NAME, standby_objects.SCRIPT_KEY),
    ("front-queue", router_objects.FRONT_QUEUE_CONFIGMAP, router_objects.FRONT_QUEUE_SCRIPT),
)
# The NVMe start-up check's script component was once called "nvme-guard".
LEGACY_SCRIPT_NAMES = {"nvme-check": "nvme-guard"}
# Namespace of node-feature-discovery, which the node cache's node labels go through.
NFD_NAMESPACE = "node-feature-discovery"


class PlatformPoolArgs(TypedDict):
    """A GPU pool (Karpenter or Auto Mode NodePool) models may run on."""

    name: str
    """The NodePool's name (`karpenter.sh/nodepool`)."""
    instance_types: list[str]
    """Its EC2 GPU instance types."""
    max_gpus: int
    """Its GPU limit (the NodePool's `limits`)."""
    capacity_types: NotRequired[list[str]]
    """`on-demand`, `spot`, `reserved` (default on-demand): a spot pool needs >= 2 replicas."""
    inline_gpus: NotRequired[int]
    """GPUs the platform's own models and warm spares take at their ceiling (default 0)."""
    staged_bytes: NotRequired[int]
    """Bytes of weights the platform's own models stage on each node's NVMe (default 0)."""
    compile_cache_models: NotRequired[int]
    """How many of the platform's own models keep a compile cache on the nodes (default 0)."""


class PlatformCompileCacheArgs(TypedDict):
    """The platform's compile-cache defaults."""

    enabled: NotRequired[bool]
    """Models keep the torch.compile cache on NVMe unless they say otherwise (default true)."""
    host_path: NotRequired[Optional[str]]
    """Node directory of the cache, under the mode's NVMe mount (default: the mode's)."""


class PlatformMonitoringArgs(TypedDict):
    """The metrics a model's autoscaling reads, and who scrapes the pods."""

    server_address: pulumi.Input[str]
    """The Prometheus query endpoint KEDA reads (e.g. the Monitoring component's `serverAddress`)."""
    region: NotRequired[Optional[str]]
    """Region KEDA signs its queries for (Amazon Managed Service for Prometheus); none: unsigned."""
    managed_scraper: NotRequired[bool]
    """The AMP managed collector scrapes the pods, from its ENIs in the VPC (default false)."""
    scraper_pods: NotRequired[list[ScraperPodsArgs]]
    """A Prometheus of your own in the cluster, by namespace and pod labels."""
    keda_namespace: NotRequired[str]
    """Namespace of the KEDA operator that scales the models (default `keda`): a router whose
    model scales from zero pods admits its operator pods to the front queue."""


class PlatformArgs(TypedDict):
    """Everything a model needs of the platform it runs on: warmstart's `CoreData`."""

    stack: str
    """The platform's name (its stack), in errors and tags."""
    region: str
    """AWS region of the cluster and the buckets."""
    cluster_name: str
    """EKS cluster name."""
    cluster_mode: ClusterMode
    """EKS Auto Mode or self-managed Karpenter: where the NVMe is mounted, where Jobs run."""
    kubernetes_version: str
    """The cluster's Kubernetes version."""
    namespace: str
    """Existing namespace the models are deployed into."""
    name_prefix: str
    """Prefix of the models' IAM role names."""
    oidc_provider_arn: pulumi.Input[str]
    """ARN of the cluster's IAM OIDC provider (the IRSA trust principal)."""
    oidc_issuer: pulumi.Input[str]
    """The OIDC issuer without `https://`."""
    vpc_cidrs: list[str]
    """Every IPv4 block of the VPC: where pods, the API server's endpoint ENIs and internal load
    balancers' clients are."""
    service_cidr: str
    """The cluster's Service range (the `kubernetes` ClusterIP routers call is in it)."""
    model_bucket: str
    """Bucket a model's relative `source` is a prefix in."""
    pools: list[PlatformPoolArgs]
    """The GPU pools models may run on."""
    kubeconfig: NotRequired[pulumi.Input[str]]
    """Kubeconfig of the cluster; without it a model uses the Kubernetes provider of its resource
    options."""
    compile_cache_bucket: NotRequired[Optional[pulumi.Input[str]]]
    """The compile-cache bucket: a new node's first pod restores the cache from it (default: none)."""
    loader: NotRequired[LoaderArgs]
    """Streamer tuning of models that set none."""
    compile_cache: NotRequired[PlatformCompileCacheArgs]
    """Compile-cache defaults."""
    nvme_check: NotRequired[NvmeCheckMode]
    """What a pod's start-up check does when the cache is not on NVMe (default warn)."""
    models: NotRequired[list[str]]
    """The platform's own models (a model of another name may be added)."""
    node_cache: NotRequired[bool]
    """The platform runs node-feature-discovery, which staged weights' node labels need."""
    image_cache_account: NotRequired[Optional[str]]
    """The account of the ECR pull-through cache of Docker Hub the images come through; none: Docker Hub."""
    monitoring: NotRequired[Optional[PlatformMonitoringArgs]]
    """Metrics for autoscaling (KEDA runs in the cluster); none: models cannot autoscale."""
    pod_scripts: NotRequired[bool]
    """The pod-side scripts' ConfigMaps are in `namespace` already; otherwise each model ships its own."""
    non_gpu_placement: NotRequired[NonGpuPlacementArgs]
    """Where the models' routers and weights-import Jobs run: a warmstart platform's own elastic
    CPU NodePool (`karpenter.sh/nodepool: general-purpose`, either mode), or the nodes of a
    cluster of your own. None given: anywhere off the GPU nodes (a required node affinity on the
    GPU labels)."""


class ServingPlatformArgs(TypedDict):
    """Inputs of the ServingPlatform component: the platform's facts, and what it is to run."""

    platform: PlatformArgs
    """The cluster and what it offers models (its `nodeCache`: run node-feature-discovery for
    staged weights; `podScripts` is set by the component, which ships them)."""
    warm_spares: NotRequired[dict[str, WarmSpareArgs]]
    """Spare nodes kept staged, by pool name (placeholder pods that a serving pod preempts)."""
    docker_hub_credential_arn: NotRequired[pulumi.Input[str]]
    """A Secrets Manager secret (`ecr-pullthroughcache/...`) with Docker Hub credentials: with
    `imageCacheAccount`, the account's ECR pull-through cache of Docker Hub is created."""
    create_namespace: NotRequired[bool]
    """Create the platform's `namespace` (default true). False: it is yours and exists already;
    everything is deployed into it all the same."""
    create_node_feature_discovery: NotRequired[bool]
    """Install node-feature-discovery when the platform stages weights (`nodeCache`; default
    true). False: one of yours runs already, serving the NodeFeature API and allowing the
    `weights.warmstart.io` label namespace; the platform still says it has one."""


class ServingPlatform(pulumi.ComponentResource):
    """What every model on a cluster shares (namespace, pod-side scripts, the node cache's
    PriorityClasses and node-feature-discovery, warm spares, the Docker Hub pull-through
    cache); its `platform` output is the `PlatformArgs` a ServedModel takes."""

    platform: pulumi.Output[PlatformArgs]
    """This platform, as a ServedModel's `platform` input."""

    def __init__(self, name: str, args: ServingPlatformArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        super().__init__("warmstart:index:ServingPlatform", name, None, opts)
        # Its children were once the warmstart stack's own (`pulumi up` keeps them by alias).
        parent = opts.parent if opts is not None else None
        legacy = [pulumi.Alias(parent=parent)] if parent is not None else []
        # Every child waits for what the platform waits for (the cluster's nodes and pools).
        child = pulumi.ResourceOptions(parent=self, aliases=legacy,
                                       depends_on=list(opts.depends_on or []) if opts is not None else [])  # type: ignore[arg-type]
        given = checked(args["platform"], "ServingPlatformArgs.platform")
        ns = given["namespace"]
        # A namespace of the user's own (createNamespace: false) is only deployed into.
        namespace: list[pulumi.Resource] = [k8s.core.v1.Namespace(
            f"{name}-namespace", metadata={"name": ns, "labels": {"app.kubernetes.io/part-of": "warmstart"}},
            opts=child)] if args.get("create_namespace", True) else []
        scripts_opts = pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=namespace))
        ready: list[pulumi.Resource] = list(namespace)
        for suffix, config_map, key in POD_SCRIPTS:
            old = LEGACY_SCRIPT_NAMES.get(suffix)
            renamed = [pulumi.Alias(name=f"{name}-{old}", parent=parent)] if old and parent is not None else []
            ready.append(PodScript(f"{name}-{suffix}", ns, config_map, key, opts=pulumi.ResourceOptions.merge(
                scripts_opts, pulumi.ResourceOptions(aliases=renamed))))
        spares = {pool: s for pool, s in (args.get("warm_spares") or {}).items() if s["warm_nodes"] > 0}
        stages = bool(given.get("node_cache"))
        node_cache: list[pulumi.Resource] = []
        if stages or spares:
            for pc in staging_objects.priority_class_specs():
                node_cache.append(k8s.scheduling.v1.PriorityClass(
                    f"{name}-{pc['metadata']['name']}", metadata=pc["metadata"], value=pc["value"],
                    global_default=pc["globalDefault"], preemption_policy=pc["preemptionPolicy"],
                    description=pc["description"], opts=child))
        if stages and args.get("create_node_feature_discovery", True):
            # Only the master and its garbage collector, on non-GPU nodes
            # (https://kubernetes-sigs.github.io/node-feature-discovery/v0.19/deployment/helm.html).
            values = staging_objects.nfd_values(placement.placement_from_args(given.get("non_gpu_placement")))
            node_cache.append(k8s.helm.v3.Release(
                f"{name}-node-feature-discovery", name="node-feature-discovery", chart=versions.NFD_CHART,
                version=versions.NFD_VERSION, namespace=NFD_NAMESPACE, create_namespace=True,
                values=values, opts=child))
        ready += node_cache
        for pool, spare in spares.items():
            register_warm_spares(name, pool, ns, spare, child, after=[*namespace, *node_cache])
        account, credential = given.get("image_cache_account"), args.get("docker_hub_credential_arn")
        if account and credential is not None:
            ready.append(aws.ecr.PullThroughCacheRule(
                f"{name}-docker-hub-cache", ecr_repository_prefix=image_cache.DOCKER_HUB_PREFIX,
                upstream_registry_url=image_cache.DOCKER_HUB_URL, credential_arn=credential, opts=child))
        self.ready = ready
        """What a model's Kubernetes objects wait for (Python programs)."""
        self.args: PlatformArgs = given | {"pod_scripts": True, "node_cache": stages}  # type: ignore[assignment]
        """The platform as plain `PlatformArgs` (Python programs; outputs stay outputs)."""
        self.platform = pulumi.Output.from_input(self.args)  # type: ignore[arg-type]
        self.register_outputs({"platform": self.platform})


def contract(args: PlatformArgs, key: str = facts.ARGS_KEY) -> facts.Contract:
    """The checked, plan-time view of a `PlatformArgs`, validated as strictly as a stack file
    (warmstart/plan/platform_args.py): ConfigErrors keyed `<key>.<camelCaseKey>`."""
    return facts.from_args(args, key)


def checked(args: PlatformArgs, key: str = facts.ARGS_KEY) -> PlatformArgs:
    """A `PlatformArgs` validated (as `contract`), with snake_case keys whichever spelling it
    was given in; wired values (Outputs) as given."""
    return facts.checked_args(args, key)  # type: ignore[return-value]


__all__ = ["NonGpuPlacementArgs", "PlatformArgs", "PlatformCompileCacheArgs", "PlatformMonitoringArgs", "PlatformPoolArgs",
           "ServingPlatform", "ServingPlatformArgs", "TolerationArgs", "checked", "contract"]
