"""One model served by vLLM on an EKS cluster, tuned for a fast cold start.

Its Args nest the model as a stack's `models[]` entry (`model`, typed by the generated
`ModelEntryArgs`), beside what places and wires it. From them alone the component decides
everything through the pure planner a stack's models are planned by
(`warmstart.plan.model.plan_model`: tensor parallel degree, streamer concurrency, distributed
loading, pod size, start-up budget), the entry read back through the config model
(`components.model_entry.model_spec`), so no model key is mapped by hand. It registers the
objects `warmstart.manifests` builds: ServiceAccount (with its IRSA role), Deployment, Service
and PodDisruptionBudget, the start-up NVMe check, the compile-cache restore/publish wiring when
a cache bucket is given, and, with a weights import, the Job that copies the weights into
`source` first (its own ServiceAccount, the Hugging Face token Secret, the script's ConfigMap).
"""

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NotRequired, Optional, TypedDict

import pulumi
import pulumi_kubernetes as k8s
from pulumi.provider.experimental.util import camel_case

from warmstart import versions
from warmstart.config import LoaderTuning
from warmstart.decisions import placement
from warmstart.errors import ConfigError, rekeyed
from warmstart.manifests import (
    compile_cache,
    first_token,
    metrics_proxy,
    network_policy,
    nvme_check,
)
from warmstart.manifests import image_prepull as prepull
from warmstart.manifests import node_cache as staging_objects
from warmstart.manifests import standby as standby_objects
from warmstart.manifests import standby_pool as pool_objects
from warmstart.manifests import weights_import as import_job
from warmstart.manifests.serving import (
    HTTP_PORT,
    PodExtras,
    deployment_spec,
    merge_extras,
    pdb_spec,
    service_account_spec,
    service_spec,
)
from warmstart.plan.model import (
    ModelPlan,
    ServingPlan,
    check_compile_cache_host_path,
    compile_cache_host_path,
    plan_model,
)

from .enums import ClusterMode, NvmeCheckMode, mode_value
from .model_entry import ModelEntryArgs, model_spec
from .node_cache import ModelNodeCache
from .pod_scripts import PodScript
from .providers import kubernetes_provider

DEFAULT_NAMESPACE = "default"


class LoaderArgs(TypedDict):
    """Run:ai Model Streamer tuning
    (https://docs.vllm.ai/en/stable/models/extensions/runai_model_streamer/)."""

    chunk_bytes: NotRequired[int]
    """Bytes per ranged S3 read, `RUNAI_STREAMER_CHUNK_BYTESIZE` (default 4 GiB, about one request
    per safetensors shard)."""
    request_timeout_ms: NotRequired[int]
    """Window after which a stalled connection is cut and its part retried (default 10000)."""
    low_speed_limit_bytes_per_second: NotRequired[int]
    """Throughput below which a connection counts as stalled (default 64 KiB/s)."""
    retry_window_seconds: NotRequired[int]
    """How long after its first request a failed chunk is requested again,
    `RUNAI_STREAMER_S3_TIMEOUT` (default 300; 0: a failed chunk fails the load)."""


class HuggingFaceSourceArgs(TypedDict):
    """A Hugging Face Hub repository at a pinned commit (deprecated, with the flat `weightsImport`
    of VllmModelArgs: `model.weightsImport.huggingFace` is a ModelEntryHuggingFaceArgs)."""

    repo: str
    """Repository id, e.g. `meta-llama/Llama-3.1-8B-Instruct`."""
    revision: str
    """The commit (40 hex characters) to copy: a branch or tag could move under the same program."""


class WeightsImportArgs(TypedDict):
    """Where the weights are copied from into `source` before the pods start; exactly one of the two
    (deprecated, with the flat `weightsImport`: `model.weightsImport` is a ModelEntryWeightsImportArgs)."""

    hugging_face: NotRequired[HuggingFaceSourceArgs]
    """From the Hugging Face Hub (a gated repository needs `huggingFaceToken`)."""
    s3: NotRequired[str]
    """From another `s3://bucket/prefix`, which the import role may read."""


class StandbyArgs(TypedDict):
    """Engines kept started and asleep beside the awake ones (vLLM sleep mode, docs/scale-out.md;
    deprecated, with the flat `standby`: `model.standby` is a ModelEntryStandbyArgs)."""

    count: NotRequired[int]
    """Engines kept asleep (default 1)."""
    sleep_level: NotRequired[int]
    """vLLM sleep level: 1 (default, weights to host RAM, which the pod's memory must hold) or 2
    (weights dropped and reloaded on wake)."""
    awake_idle_seconds: NotRequired[int]
    """Idle time after which an awake engine may go back to sleep (default 300)."""


class ScraperPodsArgs(TypedDict):
    """Pods of a Prometheus that scrapes the metrics ports."""

    namespace: str
    """Their namespace."""
    pod_labels: dict[str, str]
    """Labels that select exactly them."""


class TolerationArgs(TypedDict):
    """One pod toleration, as Kubernetes writes it."""

    key: NotRequired[str]
    """The taint's key (none with `Exists`: every taint)."""
    operator: NotRequired[str]
    """`Equal` (default) or `Exists`."""
    value: NotRequired[str]
    """The taint's value (with `Equal`)."""
    effect: NotRequired[str]
    """`NoSchedule`, `PreferNoSchedule` or `NoExecute` (none: every effect)."""


class NonGpuPlacementArgs(TypedDict):
    """Where a platform's non-GPU pods (routers, weights-import Jobs) run."""

    node_selector: NotRequired[dict[str, str]]
    """Labels of the nodes they select, e.g. `karpenter.sh/nodepool: general-purpose`."""
    tolerations: NotRequired[list[TolerationArgs]]
    """Taints of those nodes the pods tolerate."""


class VllmModelArgs(TypedDict):
    """Inputs of the VllmModel component: the model (`model`, a stack's `models[]` entry) and
    what places it in a cluster and wires it to other resources."""

    model: NotRequired[ModelEntryArgs]
    """The model: one entry of a stack config's `models` (the same keys, the same rules), with
    what a model without a platform changes: `source` is `s3://bucket/prefix` in full (no model
    bucket resolves a key prefix), `instanceType` is required (no pool's types to choose from),
    `pool` is the Karpenter / Auto Mode NodePool the pods must land on (leave it out for any
    node of `instanceType`), and `nodeCache` defaults to `off` (staging needs `nodeCacheRoleArn`
    and node-feature-discovery in the cluster). `routing` and `autoscaling` are recorded in
    `plan` for the ModelRouter and ModelAutoscaling a program adds (VllmModel creates neither);
    with `autoscaling`, `replicas` is the count of the first create only. `standby` runs the pods
    for standby engines (the ModelStandby component wakes and sleeps them). Required, unless the
    deprecated flat model keys below are given instead."""
    region: str
    """AWS region of the weights bucket (the streamer's S3 client needs it explicitly)."""
    namespace: NotRequired[str]
    """Existing namespace of the objects (default `default`)."""
    cluster_mode: NotRequired[ClusterMode]
    """How the cluster runs its GPU nodes, which decides where their NVMe is mounted (default auto)."""
    compile_cache_host_path: NotRequired[str]
    """Node directory of the cache, under the mode's NVMe mount (default
    `/mnt/.ephemeral/compile-cache` or `/mnt/k8s-disks/0/compile-cache`)."""
    compile_cache_bucket: NotRequired[pulumi.Input[str]]
    """Compile-cache bucket: with it, the first pod on a new node restores the cache from S3 and
    the first healthy pod publishes it."""
    nvme_check: NotRequired[NvmeCheckMode]
    """What the start-up check does when the cache is not on NVMe (default warn)."""
    role_arn: NotRequired[pulumi.Input[str]]
    """IAM role the ServiceAccount assumes through IRSA (e.g. the ModelRole component's `roleArn`)."""
    kubeconfig: NotRequired[pulumi.Input[str]]
    """Kubeconfig of the cluster; without it the objects use the Kubernetes provider of the
    resource options (or the ambient one)."""
    ship_pod_scripts: NotRequired[bool]
    """Create this model's ConfigMaps for the pod-side scripts (default true). False when one
    `PodScript` per namespace already ships them, as the warmstart stack does."""
    import_role_arn: NotRequired[pulumi.Input[str]]
    """IAM role of the import Job's own ServiceAccount `<model>-import` (e.g. the ModelImportRole
    component's `roleArn`), the only one that may write the model's prefix. Needed with
    `model.weightsImport`: a Job on non-GPU nodes copies the weights into `source`, verifies them
    against `weightsGib` and writes a manifest; the Deployment waits for it, and an unchanged
    `up` copies nothing."""
    hugging_face_token: NotRequired[pulumi.Input[str]]
    """Hugging Face token (pass a secret) for a gated or private `model.weightsImport.huggingFace`
    repository; it reaches only the import Job, through a Kubernetes Secret."""
    network_policies: NotRequired[bool]
    """Create the model's NetworkPolicies (default true): the vLLM port only from the router or
    the clients below, egress DNS and HTTPS only; the import Job egress only. They act only
    where the cluster enforces NetworkPolicies (the Cluster component turns that on)."""
    router_pod_labels: NotRequired[dict[str, str]]
    """Labels of the model's router pods, when a router fronts the model (a ModelRouter with
    `createService: false`): then only they reach the vLLM port, and the model's Service sends
    to them (default: no router; the Service sends to the vLLM pods)."""
    client_namespaces: NotRequired[list[str]]
    """Without a router: other namespaces whose pods may call the model (its own namespace
    always may)."""
    metrics_scraper_cidrs: NotRequired[list[str]]
    """CIDRs a metrics scraper outside the cluster reads `/metrics` from (e.g. the subnets of an
    Amazon Managed Service for Prometheus collector); default none. They reach the pods'
    metrics-only port (8001, `metrics`), never the serving port."""
    metrics_scrapers: NotRequired[list[ScraperPodsArgs]]
    """Pods of a Prometheus in the cluster that read `/metrics`, by namespace and labels; like
    `metricsScraperCidrs`, admitted to the metrics-only port alone."""
    prepull_image: NotRequired[bool]
    """With `pool` and weights not staged: an idle pod of the model's image on every node of
    the pool (a DaemonSet the Deployment waits for), so the image is on each node before a pod
    needs it (default true)."""
    node_cache_role_arn: NotRequired[pulumi.Input[str]]
    """IAM role of the staging pods' ServiceAccount `<model>-weights` (with `nodeCache` on or
    auto; see docs/node-cache.md): read-only on `source`, its IRSA trust pinned to that one
    ServiceAccount (e.g. a ModelRole with `serviceAccount: <model>-weights`)."""
    autoscaled: NotRequired[bool]
    """An autoscaler (KEDA, the ModelAutoscaling component) owns the replica count: `replicas`
    is the count of the first create only, and `up` and the drift check never reset it (implied
    by `model.autoscaling`)."""
    non_gpu_placement: NotRequired[NonGpuPlacementArgs]
    """The non-GPU nodes the weights-import Job runs on (a node selector and tolerations; a
    platform's `nonGpuPlacement`). Default: anywhere off the GPU nodes."""

    # Deprecated: the model's keys flat, before `model` (each folded into it, read only without it).
    model_name: NotRequired[str]
    """Deprecated: `model.name`."""
    source: NotRequired[str]
    """Deprecated: `model.source`."""
    weights_gib: NotRequired[float]
    """Deprecated: `model.weightsGib`."""
    instance_type: NotRequired[str]
    """Deprecated: `model.instanceType`."""
    tensor_parallel_size: NotRequired[Optional[int]]
    """Deprecated: `model.tensorParallelSize` (omitted there for auto)."""
    replicas: NotRequired[int]
    """Deprecated: `model.replicas`."""
    image: NotRequired[str]
    """Deprecated: `model.image`."""
    max_model_len: NotRequired[int]
    """Deprecated: `model.maxModelLen`."""
    gpu_memory_utilization: NotRequired[float]
    """Deprecated: `model.gpuMemoryUtilization`."""
    eager: NotRequired[bool]
    """Deprecated: `model.eager`."""
    extra_args: NotRequired[list[str]]
    """Deprecated: `model.extraArgs`."""
    loader: NotRequired[LoaderArgs]
    """Deprecated: `model.loader`."""
    node_pool: NotRequired[str]
    """Deprecated: `model.pool`."""
    compile_cache: NotRequired[bool]
    """Deprecated: `model.compileCache`."""
    weights_import: NotRequired[WeightsImportArgs]
    """Deprecated: `model.weightsImport`."""
    node_cache: NotRequired[str]
    """Deprecated: `model.nodeCache`."""
    node_cache_content_check: NotRequired[str]
    """Deprecated: `model.nodeCacheContentCheck`."""
    standby: NotRequired[StandbyArgs]
    """Deprecated: `model.standby`."""


KEY = "VllmModelArgs"
MODEL_KEY = f"{KEY}.model"
# The deprecated flat model keys, each with the key of `model` it is folded into. Frozen: a new
# model key is a key of `model` only (ModelEntryArgs, generated from the config model).
FLAT_MODEL_KEYS: dict[str, str] = {
    "model_name": "name", "node_pool": "pool",
    **{k: k for k in ("source", "weights_gib", "instance_type", "tensor_parallel_size", "replicas", "image",
                      "max_model_len", "gpu_memory_utilization", "eager", "extra_args", "loader", "compile_cache",
                      "weights_import", "node_cache", "node_cache_content_check", "standby")}}


@dataclass(frozen=True)
class ModelEntry:
    """The model entry of a VllmModel's Args, as given (`model`) or folded from the deprecated
    flat keys, and the keys its errors are reported under (the ones the program wrote)."""

    values: Mapping[str, Any]
    flat: bool

    def key(self, field: str) -> str:
        """The Args key of one of the entry's fields (snake_case) as the program wrote it."""
        if self.flat:
            return f"{KEY}.{camel_case(next(k for k, v in FLAT_MODEL_KEYS.items() if v == field))}"
        return f"{MODEL_KEY}.{camel_case(field)}"

    @contextmanager
    def as_written(self) -> Iterator[None]:
        """Errors keyed `VllmModelArgs.model.<key>` re-keyed as the program wrote them (flat)."""
        if not self.flat:
            yield
            return
        with rekeyed(MODEL_KEY, KEY, {camel_case(v): camel_case(k) for k, v in FLAT_MODEL_KEYS.items()}):
            yield


def model_entry(args: VllmModelArgs) -> ModelEntry:
    """The model entry of `args`: `model`, or the deprecated flat keys folded into one
    (ConfigError for both at once, for neither, or for a key VllmModelArgs does not have)."""
    unknown = sorted(set(args) - set(VllmModelArgs.__annotations__))
    if unknown:
        raise ConfigError(f"{KEY}.{camel_case(unknown[0])}", f"is no key of {KEY} (unknown: {', '.join(unknown)})",
                          "remove it, or give the model's keys in `model` (ModelEntryArgs)")
    flat = {FLAT_MODEL_KEYS[k]: v for k, v in args.items() if k in FLAT_MODEL_KEYS and v is not None}
    entry = args.get("model")
    if entry is not None and flat:
        given = sorted(k for k, v in args.items() if k in FLAT_MODEL_KEYS and v is not None)
        raise ConfigError(f"{KEY}.{camel_case(given[0])}", "the deprecated flat model keys are read only without "
                          f"`model`, and both are given ({', '.join(camel_case(k) for k in given)})",
                          "move them into model: " + ", ".join(
                              f"{camel_case(k)} -> model.{camel_case(FLAT_MODEL_KEYS[k])}" for k in given))
    if entry is None and not flat:
        raise ConfigError(f"{KEY}.model", "is required: the model VllmModel serves",
                          "give model: {name, source, weightsGib, instanceType, ...} (a stack's models[] entry)")
    return ModelEntry(dict(entry) if entry is not None else flat, flat=entry is None)


def non_gpu_placement(given: NonGpuPlacementArgs | None, key: str) -> placement.NonGpuPlacement:
    """A component's `nonGpuPlacement` as the planners take it (ConfigError keyed `key`)."""
    try:
        return placement.placement_from_args(given)  # type: ignore[arg-type]
    except ValueError as err:
        raise ConfigError(key, str(err), "give {nodeSelector: {label: value}, tolerations: [{key, operator, "
                          "value, effect}]}") from None


def plan_serving(args: VllmModelArgs) -> ModelPlan:
    """The model's decisions from its Args alone (ConfigErrors keyed `VllmModelArgs.*` as the
    program wrote them): the entry is read back through the config model
    (`components.model_entry.model_spec`) and planned whole by `plan_model`, the planner of a
    stack's models; its router and autoscaling objects are other components'."""
    entry = model_entry(args)
    mode = mode_value(args.get("cluster_mode", ClusterMode.AUTO))
    host_path = args.get("compile_cache_host_path")
    with entry.as_written():
        spec, pool = model_spec(entry.values, MODEL_KEY)
        if spec.instance_type is None:
            raise ConfigError(f"{MODEL_KEY}.instanceType", "is required: a model without a platform has no pool "
                              "whose instance types to choose from, and the type decides the tensor-parallel "
                              "degree and the pod's size", "give the GPU instance type of the nodes, e.g. g6e.xlarge")
        check_compile_cache_host_path(host_path, mode, f"{KEY}.compileCacheHostPath")  # type: ignore[arg-type]
        return plan_model(
            spec, key=MODEL_KEY, instance_type=spec.instance_type, pool=pool,
            loader=spec.loader or LoaderTuning(),
            compile_cache=not spec.eager if spec.compile_cache is None else spec.compile_cache,
            compile_cache_host_path=compile_cache_host_path(mode, host_path),  # type: ignore[arg-type]
            cluster_mode=mode, import_key=f"{MODEL_KEY}.weightsImport",  # type: ignore[arg-type]
            # Staging needs a staging role and node-feature-discovery, which a cluster of one's own
            # may not have: off unless asked for (a stack's platform has both; its default is auto).
            node_cache=spec.node_cache if "node_cache" in spec.model_fields_set else "off",
            autoscaled=bool(args.get("autoscaled")),
            non_gpu=non_gpu_placement(args.get("non_gpu_placement"), f"{KEY}.nonGpuPlacement"))


class VllmModel(pulumi.ComponentResource):
    """One model served by vLLM on EKS, tuned for a fast cold start: Run:ai streamer concurrency
    and distributed loading, the compile cache on NVMe (pre-warmed from S3 with a bucket), and
    probes that never kill a loading pod. Python programs also get `plan`, every decision
    (a `ModelPlan`: also the entry's routing and autoscaling, for the components that act on them)."""

    service_name: pulumi.Output[str]
    """In-cluster Service name."""
    endpoint: pulumi.Output[str]
    """OpenAI-compatible API base URL inside the cluster: `http://<service>.<namespace>.svc:8000/v1`."""

    def __init__(self, name: str, args: VllmModelArgs, opts: Optional[pulumi.ResourceOptions] = None, *,
                 router: Sequence[pulumi.Resource] = (), plan: ModelPlan | ServingPlan | None = None) -> None:
        """`router` (Python programs): the model's router resources (ModelRouter), with
        `routerPodLabels` given; the Service switches to the routers only once they are up, so
        turning routing on never leaves the endpoint without a backend. The NetworkPolicy comes
        before any pod and admits only the routers from the start: while routing is turned on
        for a running model, clients that call its Service are refused until the routers are
        Ready (seconds, as the vLLM pods are already Ready).

        `plan` (Python programs): the model's plan, made already from its model entry
        (ServedModel plans it on its platform, the one planning of that model); `args.model`
        is then not read again, the wiring is."""
        super().__init__("warmstart:index:VllmModel", name, None, opts)
        # Every decision is made from the Args alone, by the pure planner, unless made already.
        self._entry = model_entry(args)
        self.plan: ServingPlan = plan if plan is not None else plan_serving(args)
        m = self.plan
        if m.standby is not None and not args.get("router_pod_labels"):
            # Standby turns on vLLM's dev routes (/sleep, /wake_up, /collective_rpc), and a
            # sleeping engine stays Ready: only a router's worker selector keeps it out of the
            # traffic, and only with a router does the NetworkPolicy keep the namespace's pods
            # off vLLM's port (docs/scale-out.md).
            raise ConfigError(f"{KEY}.routerPodLabels", f"{m.name}: a model with standby engines needs a router in "
                              "front of it, and none is given", "put a ModelRouter in front and pass its pod labels "
                              "(routerPodLabels), or remove standby")
        # An autoscaler owns the replica count: one the entry declares, or one wired beside it.
        autoscaled = bool(args.get("autoscaled")) or (isinstance(m, ModelPlan) and m.autoscaling is not None)
        ns = args.get("namespace") or DEFAULT_NAMESPACE
        child = pulumi.ResourceOptions(parent=self)
        if args.get("kubeconfig") is not None:
            provider = kubernetes_provider(name, args["kubeconfig"], child)
            child = pulumi.ResourceOptions(parent=self, provider=provider)

        bucket = args.get("compile_cache_bucket") if m.compile_cache else None
        scripts: list[pulumi.Resource] = []
        # Without a platform's scripts in the namespace, the model ships its own copies (each
        # ConfigMap's name is the plan's).
        ship = bool(args.get("ship_pod_scripts", True))
        probe_map = m.script_config_map(first_token.CONFIGMAP_NAME, ship)
        if ship:
            scripts.append(PodScript(f"{name}-first-token", ns, probe_map, first_token.SCRIPT_KEY, opts=child))
        # Scrapers read vLLM's metrics through the pod's metrics-only port (never its serving port).
        scraped = bool(args.get("metrics_scraper_cidrs") or args.get("metrics_scrapers"))
        proxy_map = m.script_config_map(metrics_proxy.CONFIGMAP_NAME, ship and scraped)
        if scraped and ship:
            scripts.append(PodScript(f"{name}-metrics-proxy", ns, proxy_map, metrics_proxy.SCRIPT_KEY, opts=child))
        nvme_map = m.script_config_map(nvme_check.CONFIGMAP_NAME, ship and m.compile_cache)
        cache_map = m.script_config_map(compile_cache.CONFIGMAP_NAME, ship and m.compile_cache)
        if ship and m.compile_cache:
            scripts.append(PodScript(f"{name}-nvme-check", ns, nvme_map, nvme_check.SCRIPT_KEY, opts=child))
            if bucket is not None:
                scripts.append(PodScript(f"{name}-compile-cache", ns, cache_map, compile_cache.SCRIPT_KEY,
                                         opts=child))
        # A staged model's picker writes the choice the compile-cache restore keys on.
        picker = staging_objects.serving_extras(
            model=m.name, source=m.source, digest=m.weights_digest, image=m.image,
            nvme_mount=placement.NVME_MOUNT[mode_value(args.get("cluster_mode", ClusterMode.AUTO))],
            # A pod streaming from S3 holds the node's copier off this long at most.
            pause_seconds=math.ceil(2 * m.load.s3_seconds) + 60,
            script_config_map=m.script_config_map(staging_objects.SELECT_CONFIGMAP, ship)) if m.staged and m.load \
            else PodExtras()
        # In this order: the NVMe check (no write onto a cache path that is not NVMe), the picker,
        # the compile cache's restore and publish, and the first-token sidecar, which times the
        # pod's first answer and keeps its cold-start record in the compile-cache bucket
        # (`warmstart coldstart --history`), past the Events' expiry.
        extras = merge_extras(
            nvme_check.nvme_check_extras(m, mode_value(args.get("nvme_check", NvmeCheckMode.WARN)), nvme_map),
            picker,
            compile_cache.compile_cache_extras(m, bucket, args["region"], cache_map, weights_choice=m.staged),
            first_token.first_token_extras(m, bucket, args["region"], probe_map,
                                           state_volume=compile_cache.STATE_VOLUME if bucket is not None else None,
                                           weights_choice=bool(m.staged and m.load)),
            metrics_proxy.metrics_proxy_extras(m.image, proxy_map, m.serving_port) if scraped else PodExtras())

        sa = service_account_spec(m, ns, args.get("role_arn"))
        service_account = k8s.core.v1.ServiceAccount(f"{name}-sa", metadata=sa["metadata"],
                                                     automount_service_account_token=False, opts=child)
        # The IRSA webhook injects credentials when it admits a pod whose ServiceAccount it
        # finds; a pod admitted before the ServiceAccount exists never gets them.
        before_pods: list[pulumi.Resource] = [*scripts, service_account]
        if args.get("network_policies", True):
            # Before any pod (the import Job's included): a pod started before the policy that
            # selects it runs unfenced; a routed model's policy admits only its routers from the
            # start, without waiting for them to be Ready.
            before_pods.extend(self._network_policies(name, args, ns, child))
        if m.weights_import is not None:
            before_pods.append(self._weights_import(name, args, ns, pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=list(before_pods)))))
        if m.staged:
            # Weights in S3 (the import, if any) -> staged on every node of the pool, with the
            # model's image pulled there (Pulumi awaits the DaemonSet's rollout) -> pods roll.
            before_pods.extend(self._node_cache(name, args, ns, child, list(before_pods)))
        elif m.pool is not None and args.get("prepull_image", True):
            # Not staged: the image alone goes onto every node of the pool before the pods roll.
            before_pods.append(self._image_prepull(name, ns, child))
        dep = deployment_spec(m, ns, args["region"], extras)
        timeout = m.rollout_timeout_seconds
        k8s.apps.v1.Deployment(
            f"{name}-deployment", metadata=dep["metadata"], spec=dep["spec"],
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(
                depends_on=before_pods,
                # KEDA scales the Deployment through its scale subresource; a re-applied count would
                # undo it on every `up` (https://keda.sh/docs/2.20/concepts/scaling-deployments/).
                ignore_changes=["spec.replicas"] if autoscaled else None,
                custom_timeouts=pulumi.CustomTimeouts(create=f"{timeout}s", update=f"{timeout}s"))))
        routed = args.get("router_pod_labels")
        after_router = pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=list(router)))
        # The model's one endpoint: the same Service object, in front of the routers when routed.
        svc = service_spec(m, ns, routed)
        service = k8s.core.v1.Service(f"{name}-service", metadata=svc["metadata"], spec=svc["spec"],
                                      opts=after_router if routed else child)
        pdb = pdb_spec(m, ns)
        k8s.policy.v1.PodDisruptionBudget(f"{name}-pdb", metadata=pdb["metadata"], spec=pdb["spec"], opts=child)
        self.service_name = service.metadata.apply(lambda md: md["name"] if isinstance(md, dict) else md.name)
        self.endpoint = pulumi.Output.all(self.service_name, ns).apply(
            lambda v: f"http://{v[0]}.{v[1]}.svc:{HTTP_PORT}/v1")
        self.register_outputs({"serviceName": self.service_name, "endpoint": self.endpoint})

    def _node_cache(self, name: str, args: VllmModelArgs, ns: str, child: pulumi.ResourceOptions,
                    after: list[pulumi.Resource]) -> list[pulumi.Resource]:
        """The staging DaemonSet of the model's pool (and its ServiceAccount, RBAC, scripts)."""
        m = self.plan
        if m.pool is None:
            pool, cache = self._entry.key("pool"), self._entry.key("node_cache")
            raise ConfigError(pool, "the node cache stages the weights on one NodePool's nodes, and no "
                              f"{pool.removeprefix(KEY + '.')} is given",
                              f"set {pool.removeprefix(KEY + '.')}, or {cache.removeprefix(KEY + '.')}: off")
        if args.get("node_cache_role_arn") is None:
            raise ConfigError("VllmModelArgs.nodeCacheRoleArn", "the staging pods read the weights with their own "
                              "IAM role (one IRSA trust per ServiceAccount)", "pass a ModelRole's roleArn with "
                              f"serviceAccount: {m.name}-weights")
        ship = args.get("ship_pod_scripts", True)
        cache = ModelNodeCache(f"{name}-node-cache", {
            "model_name": m.name, "source": m.source, "digest": m.weights_digest, "image": m.image,
            "pools": [m.pool], "weights_gib": m.weights_bytes / 2**30, "region": args["region"], "namespace": ns,
            "cluster_mode": args.get("cluster_mode", ClusterMode.AUTO), "role_arn": args["node_cache_role_arn"],
            # In the warmstart stack the namespace's scripts and the PriorityClasses are the stack's.
            "ship_pod_scripts": ship, "create_priority_classes": ship,
            "content_check": m.node_cache_content_check},
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=after)))
        return list(cache.daemon_sets)

    def _image_prepull(self, name: str, ns: str, child: pulumi.ResourceOptions) -> k8s.apps.v1.DaemonSet:
        m = self.plan
        fence = prepull.network_policy_spec(m, ns)
        k8s.networking.v1.NetworkPolicy(f"{name}-image-netpol", metadata=fence["metadata"], spec=fence["spec"],
                                        opts=child)
        ds = prepull.daemonset_spec(m, ns)
        wait = prepull.ROLLOUT_TIMEOUT_SECONDS
        return k8s.apps.v1.DaemonSet(f"{name}-image-prepull", metadata=ds["metadata"], spec=ds["spec"],
                                     opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(
                                         custom_timeouts=pulumi.CustomTimeouts(create=f"{wait}s", update=f"{wait}s"))))

    def _network_policies(self, name: str, args: VllmModelArgs, ns: str, child: pulumi.ResourceOptions
                          ) -> list[pulumi.Resource]:
        """The serving pods' NetworkPolicy, and the import Job's when there is one."""
        m = self.plan
        try:
            policies = [network_policy.serving_network_policy(
                m.name, ns, router=args.get("router_pod_labels"), client_namespaces=args.get("client_namespaces") or (),
                metrics_cidrs=args.get("metrics_scraper_cidrs") or (),
                metrics_pods=[(sc["namespace"], tuple(sc["pod_labels"].items()))
                              for sc in args.get("metrics_scrapers") or []],
                # A standby model's actuator (the ModelStandby component) calls the sleep routes; a
                # pooled model's pool actuator reads its engines' queues (/metrics).
                actuator=standby_objects.selector(m.name) if m.standby is not None else
                pool_objects.actuator_selector(m.pooled.pool) if m.pooled is not None else None,
                port=m.serving_port)]
        except ValueError as exc:
            key = ("metricsScraperCidrs" if "CIDR" in str(exc) else
                   "metricsScrapers" if "scraper pod" in str(exc) else "routerPodLabels")
            raise ConfigError(f"VllmModelArgs.{key}", str(exc), "give CIDR networks such as 10.0.32.0/19 and "
                              "the router pods' non-empty labels") from None
        if m.weights_import is not None:
            policies.append(network_policy.weights_import_network_policy(m.name, ns))
        return [k8s.networking.v1.NetworkPolicy(f"{name}-{suffix}", metadata=policy["metadata"], spec=policy["spec"],
                                                opts=child)
                for suffix, policy in zip(("netpol", "import-netpol"), policies)]

    def _weights_import(self, name: str, args: VllmModelArgs, ns: str, child: pulumi.ResourceOptions
                        ) -> k8s.batch.v1.Job:
        """The import Job (and its ServiceAccount, token Secret and script): the Deployment waits
        for it, as pulumi-kubernetes waits for a Job to complete."""
        m = self.plan
        imp = m.weights_import
        assert imp is not None
        role_arn = args.get("import_role_arn")
        if role_arn is None:
            raise ConfigError("VllmModelArgs.importRoleArn", "a weights import needs its own IAM role: the "
                              "serving role may only read the weights", "pass the ModelImportRole component's "
                              "roleArn for this model")
        needs: list[pulumi.Resource] = []
        script_map = m.script_config_map(import_job.CONFIGMAP_NAME, bool(args.get("ship_pod_scripts", True)))
        if args.get("ship_pod_scripts", True):
            needs.append(PodScript(f"{name}-weights-import", ns, script_map, import_job.SCRIPT_KEY, opts=child))
        sa = import_job.service_account_spec(m, ns, role_arn)
        needs.append(k8s.core.v1.ServiceAccount(f"{name}-import-sa", metadata=sa["metadata"],
                                                automount_service_account_token=False, opts=child))
        token, secret_name = args.get("hugging_face_token"), None
        if token is not None and imp.kind == "huggingFace":
            secret = import_job.token_secret_spec(m, ns, pulumi.Output.secret(token))
            secret_name = secret["metadata"]["name"]
            needs.append(k8s.core.v1.Secret(f"{name}-hf-token", metadata=secret["metadata"], type=secret["type"],
                                            string_data=secret["stringData"], opts=child))
        job = import_job.job_spec(m, ns, args["region"], script_map, secret_name)
        wait = m.weights_import.pulumi_wait_seconds
        return k8s.batch.v1.Job(
            f"{name}-import", metadata=job["metadata"], spec=job["spec"],
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(
                depends_on=needs, delete_before_replace=True,
                custom_timeouts=pulumi.CustomTimeouts(create=f"{wait}s", update=f"{wait}s"))))


# The component's planner, by the name Python programs have used.
plan = plan_serving

__all__ = ["FLAT_MODEL_KEYS", "HuggingFaceSourceArgs", "LoaderArgs", "ModelEntryArgs", "StandbyArgs", "VllmModel",
           "VllmModelArgs", "WeightsImportArgs", "model_entry", "plan", "plan_serving", "versions"]
