"""Autoscaling a model's Deployment on vLLM's own metrics with KEDA (pure).

What is decided here, from the model and its autoscaling block alone:

- the exact PromQL of each KEDA trigger (`waiting_query`, `kv_cache_query`);
- KEDA's polling interval, cooldown and the HPA behavior: scale-up at once, scale-down held for
  at least the model's start-up budget, because a replica removed too early costs a whole cold
  start to bring back;
- the config rules (`check_spec`, `check_pool_capacity`, `check_pool_can_grow`), whose
  ConfigErrors name the key, the rule with the numbers, and the fix;
- how long a scale-out takes until the new replica serves (`scale_out_estimate`), phase by phase.

Metric names are vLLM 0.33's (`vllm/v1/metrics/loggers.py`,
https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/v1/metrics/loggers.py): the gauges
`vllm:num_requests_waiting` and `vllm:kv_cache_usage_perc` (0-1) carry `model_name` (the
`--served-model-name`, which warmstart sets to the model's name) and `engine`;
`vllm:gpu_cache_usage_perc` no longer exists.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ..errors import ConfigError, Problems
from . import naming
from . import routing as routing_mod
from . import standby as standby_mod
from . import standby_pool as standby_pool_mod
from .gpu_pools import SURGE_PODS, PoolModel, nodes_for, packed_gpus

WAITING_METRIC = "vllm:num_requests_waiting"
RUNNING_METRIC = "vllm:num_requests_running"
KV_CACHE_METRIC = "vllm:kv_cache_usage_perc"
# The label the scrape configuration (manifests/autoscaling.py) copies from the pod's namespace;
# vLLM's own label for the served model name.
NAMESPACE_LABEL = "namespace"
MODEL_LABEL = "model_name"

# production-stack's KEDA default: scale out once more than 5 requests wait per replica
# (https://github.com/vllm-project/production-stack/blob/main/helm/templates/scaledobject-vllm.yaml).
# The config field's default too (warmstart/config.py); an int, as plan.json has always written it.
DEFAULT_TARGET_WAITING_PER_REPLICA = 5
# Requests one engine carries, running plus waiting, before the load asks for another: the
# engine-demand trigger keeps ceil(running + waiting / this) engines awake, so a load the awake
# engines carry without a queue still counts. No public default fits every model; a planning
# ASSUMPTION (an engine of a mid-size model at interactive latency), to be set from
# `vllm:num_requests_running` under the user's own load (docs/autoscaling.md).
DEFAULT_TARGET_REQUESTS_PER_REPLICA = 32
# The HPA keeps its count while desired/current lies within 10 % (`--horizontal-pod-autoscaler-tolerance`),
# which from 11 pods on would swallow the one-pod step that starts a replacement sleeper. The
# engine-demand figure is a whole pod count, so warmstart asks for no tolerance, per direction
# (`behavior.scaleUp.tolerance`, KEP-4951: beta and on by default since Kubernetes 1.35; KEDA
# 2.20.2's ScaledObject schema carries it). On a cluster without the gate the API server drops
# the field and the 10 % applies.
HPA_TOLERANCE = "0"

# The AWS managed collector scrapes no more often than every 30 s ("Scrape interval" in
# https://docs.aws.amazon.com/prometheus/latest/userguide/AMP-collector-how-to.html#AMP-collector-configuration).
SCRAPE_INTERVAL_SECONDS = 30
# The HPA controller asks KEDA's metrics server for the triggers' values every 15 s
# (kube-controller-manager `--horizontal-pod-autoscaler-sync-period`, default 15s,
# https://kubernetes.io/docs/reference/command-line-tools-reference/kube-controller-manager/).
HPA_SYNC_SECONDS = 15
# KEDA checks its triggers on this interval for activation (0 <-> 1) and for cached metrics
# (https://keda.sh/docs/2.20/reference/scaledobject-spec/#pollinginterval, default 30 s);
# the same period as the HPA's, so neither is the slower link.
POLLING_INTERVAL_SECONDS = HPA_SYNC_SECONDS
# A model scaled to zero pods has no vLLM metric to scale on; KEDA's operator reads the routers'
# front queues itself, in the cluster, every second (not through AMP's 30 s scrape). The
# operator's loop checks every trigger each pollingInterval and scales 0 -> 1 itself
# (`startScaleLoop` in https://github.com/kedacore/keda/blob/v2.20.2/pkg/scaling/scale_handler.go,
# `RequestScale` in pkg/scaling/executor/scale_scaledobjects.go); 1 -> N stays the HPA's, at its
# own 15 s sync. The interval holds for every trigger of the ScaledObject, so the waiting query
# also reaches AMP every second for such a model (an instant query over a few series).
FROM_ZERO_POLLING_INTERVAL_SECONDS = 1
# The front queue's JSON field KEDA reads (`valueLocation`, a GJSON path): requests held plus
# those forwarded and not yet answered (warmstart/podside/front_queue.py).
FRONT_QUEUE_VALUE_LOCATION = "demand"
# Kubernetes caps `behavior.*.stabilizationWindowSeconds` at one hour and `policies[].periodSeconds`
# at 30 minutes (HPAScalingRules, autoscaling/v2 validation:
# https://github.com/kubernetes/kubernetes/blob/v1.36.0/pkg/apis/autoscaling/validation/validation.go).
MAX_STABILIZATION_SECONDS = 3600
MAX_POLICY_PERIOD_SECONDS = 1800
# Floor of the scale-down hold: HPA's own default window (5 minutes, same page) for models whose
# start-up budget is shorter.
MIN_SCALE_DOWN_HOLD_SECONDS = 300
# Scale-up rate when the metric asks for more: double, or 4 pods, every 15 s, whichever is more
# (the HPA's default scale-up policies, with no stabilization:
# https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#default-behavior).
SCALE_UP_PERCENT = 100
SCALE_UP_PODS = 4
SCALE_UP_PERIOD_SECONDS = 15

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class AutoscalingSpec:
    """A model's `autoscaling:` block, as the config model hands it over."""

    min_replicas: int
    max_replicas: int
    target_waiting_per_replica: float = DEFAULT_TARGET_WAITING_PER_REPLICA
    """Requests waiting in vLLM's queue per replica above which KEDA adds replicas."""
    kv_cache_usage_ceiling: float | None = None
    """Optional: highest `vllm:kv_cache_usage_perc` (0-1) any replica may run at before KEDA
    adds replicas."""
    standby: int = 0
    """Engines kept asleep beside the awake ones (`models[].standby.count`): KEDA's range and its
    answer count them too, so it never removes the sleepers and keeps them beside what the queue
    needs."""
    target_requests_per_replica: float = DEFAULT_TARGET_REQUESTS_PER_REPLICA
    """Requests (running plus waiting) one engine carries: the engine-demand trigger keeps
    ceil(total / this) engines awake, plus the sleepers."""


@dataclass(frozen=True)
class Trigger:
    """One KEDA prometheus trigger, decided."""

    name: str
    query: str
    threshold: float
    metric_type: str
    """`AverageValue`: the value is divided by the replica count (queue per replica);
    `Value`: compared as it is (a usage ceiling)."""


@dataclass(frozen=True)
class QueueTrigger:
    """KEDA's `metrics-api` trigger on the routers' front queues (a model scaled to zero pods)."""

    url: str
    """`http://<Service>.<namespace>.svc:<pod port><path>`: with `aggregateFromKubeServiceEndpoints`
    KEDA takes the Service and namespace from the host's first two labels and calls every Ready
    endpoint of the Service on the URL's port, which must be the endpoints' (the pods') port
    (`getEndpointsUrlsFromServiceURL`, pkg/scalers/metrics_api_scaler.go at v2.20.2), and sums."""
    value_location: str
    target: float
    """Demand per replica above which the HPA would add replicas: the front queue's own count
    bound, so this trigger activates (0 -> 1) and keeps the last replica while requests are held
    or answered, and leaves 1 -> N to the waiting-requests trigger."""
    activation: float = 0.0
    """Above this KEDA activates the Deployment from zero (`activationTargetValue`)."""


def front_queue_trigger(service: str, namespace: str) -> QueueTrigger:
    """The metrics-api trigger reading `service`'s endpoints (the model's routers) in `namespace`."""
    for what, v in (("service", service), ("namespace", namespace)):
        if not _DNS_LABEL.match(v):
            raise ValueError(f"{what} {v!r} is not a DNS label")
    return QueueTrigger(url=f"http://{service}.{namespace}.svc:{routing_mod.ROUTER_PORT}"
                        f"{routing_mod.FRONT_QUEUE_HELD_PATH}",
                        value_location=FRONT_QUEUE_VALUE_LOCATION, target=float(routing_mod.FRONT_QUEUE_MAX_HELD))


@dataclass(frozen=True)
class StandbyTrigger:
    """KEDA's `metrics-api` trigger on the standby actuator's pods figure (a model with standby).

    The actuator reads every engine each second and serves `standby.count` plus the most of
    `minReplicas`, the engines the load needs (the engine-demand query's figure, without the
    scrape's delay) and, for a minute after a wake, the engines awake and waking
    (warmstart/podside/standby/decide.py `pods_figure`). Its target is 1 pod (`AverageValue`), so
    the HPA's recommendation is the figure itself (ceil(value / 1), `GetExternalPerPodMetricReplicas`).
    KEDA's metrics server calls the scaler each time the HPA asks (every 15 s), unless
    `useCachedMetrics` is set (https://keda.sh/docs/2.20/concepts/scaling-deployments/#caching-metrics),
    so the figure reaches the HPA one sync after a wake, not a 30 s scrape and a sync later; the
    actuator also raises the Deployment's replicas itself on a wake, and that sync keeps them.

    While the actuator cannot be read (its pod restarting: the Service has no endpoint, the scaler
    errors) the HPA refuses to scale down and still scales up on the other triggers
    (`computeReplicasForMetrics`, decisions/hpa.py `replicas_for_metrics`); no KEDA `fallback`
    is set, which would replace the figure by a fixed count."""

    url: str
    value_location: str
    target: float = 1.0


def standby_trigger(model: str, namespace: str, standby_pool: str | None = None) -> StandbyTrigger:
    """The per-model actuator's figure, or for a pooled model its pool actuator's figure of the model
    (the pooled engine woken for it counted as awake, so its own Deployment scales up behind it)."""
    for what, v in (("model", model), ("namespace", namespace), ("standby pool", standby_pool or "x")):
        if not _DNS_LABEL.match(v):
            raise ValueError(f"{what} {v!r} is not a DNS label")
    url = (standby_mod.figure_url(model, namespace) if standby_pool is None
           else standby_pool_mod.figure_url(standby_pool, namespace, model))
    return StandbyTrigger(url=url, value_location=standby_mod.FIGURE_VALUE_LOCATION)


@dataclass(frozen=True)
class ScalingPlan:
    """Everything the ScaledObject of one model carries."""

    model: str
    namespace: str
    deployment: str
    min_replicas: int
    max_replicas: int
    polling_interval_seconds: int
    cooldown_period_seconds: int
    scale_down_stabilization_seconds: int
    scale_down_period_seconds: int
    triggers: tuple[Trigger, ...]
    queue_trigger: QueueTrigger | None = None
    """Scale from zero pods: the front queues' demand, read by KEDA's operator itself."""
    standby_trigger: StandbyTrigger | None = None
    """With standby: the actuator's pods figure, read by KEDA's operator itself."""

    def summary(self) -> dict:
        return {"minReplicas": self.min_replicas, "maxReplicas": self.max_replicas,
                "pollingIntervalSeconds": self.polling_interval_seconds,
                "scaleDownStabilizationSeconds": self.scale_down_stabilization_seconds,
                "scaleDownPeriodSeconds": self.scale_down_period_seconds,
                "triggers": [{"name": t.name, "query": t.query, "threshold": t.threshold,
                              "metricType": t.metric_type} for t in self.triggers]} | (
            {"frontQueueTrigger": {"url": q.url, "valueLocation": q.value_location, "targetValue": q.target,
                                   "activationTargetValue": q.activation}}
            if (q := self.queue_trigger) is not None else {}) | (
            {"standbyTrigger": {"url": f.url, "valueLocation": f.value_location, "targetValue": f.target}}
            if (f := self.standby_trigger) is not None else {})


def _selector(model: str, namespace: str) -> str:
    # Both are DNS labels (the config enforces it); refuse anything else rather than escape it,
    # so a query can never match another model's series through a crafted name.
    for what, v in (("model", model), ("namespace", namespace)):
        if not _DNS_LABEL.match(v):
            raise ValueError(f"{what} {v!r} is not a DNS label")
    return f'{{{NAMESPACE_LABEL}="{namespace}",{MODEL_LABEL}="{model}"}}'


def waiting_query(model: str, namespace: str, standby_offset: float = 0) -> str:
    """Requests waiting in every replica's queue, summed into ONE sample: KEDA's prometheus
    scaler rejects a result with more than one element (`ExecutePromQuery` in
    https://github.com/kedacore/keda/blob/v2.20.2/pkg/scalers/prometheus_scaler.go).
    `standby_offset` (standby.keda_standby_offset) is added so the answer includes the sleepers;
    `or vector(0)` keeps the sum defined when no engine reports (all asleep at zero load)."""
    q = f"sum({WAITING_METRIC}{_selector(model, namespace)})"
    return q if not standby_offset else f"(({q}) or vector(0)) + {standby_offset:g}"


def demand_query(model: str, namespace: str, per_replica: float, standby: int = 0) -> str:
    """The pods the load needs: ceil((running + waiting) / per_replica) awake engines, plus the
    `standby` sleepers, as ONE sample (vLLM 0.33's gauges `vllm:num_requests_running` and
    `vllm:num_requests_waiting`, summed over every engine; a sleeping engine reports 0 of both).
    Its trigger's target is 1 pod (`AverageValue`), so the HPA's answer,
    ceil(value / 1) (`GetExternalPerPodMetricReplicas`, replica_calculator.go), is the figure itself.

    Counting running requests is what keeps a sleeper for every step: after a wake the woken
    engine's requests keep the figure at the awake engines plus `standby`, so the HPA starts a
    replacement (which sleeps as soon as it has loaded) and does not remove it while that load
    holds; a load fewer engines carry lowers the figure, and the HPA scales down after its window.
    `or vector(0)` keeps each sum defined when no engine reports (every pod asleep or loading)."""
    if not (per_replica > 0 and math.isfinite(per_replica)):
        raise ValueError("per_replica must be a positive number")
    sel = _selector(model, namespace)
    load = f"(sum({RUNNING_METRIC}{sel}) or vector(0)) + (sum({WAITING_METRIC}{sel}) or vector(0))"
    q = f"ceil(({load}) / {per_replica:g})"
    return f"{q} + {standby}" if standby else q


def demand_figure(running: float, waiting: float, per_replica: float, standby: int = 0) -> int:
    """What `demand_query` evaluates to, given the summed gauges (the scale-out bench reads its
    engines' /metrics through this)."""
    return math.ceil((running + waiting) / per_replica) + standby


def kv_cache_query(model: str, namespace: str) -> str:
    """The fullest replica's KV-cache usage (0-1): a ceiling holds for every replica, so the
    maximum, not the mean, is compared with it."""
    return f"max({KV_CACHE_METRIC}{_selector(model, namespace)})"


def triggers(model: str, namespace: str, spec: AutoscalingSpec) -> tuple[Trigger, ...]:
    offset = standby_mod.keda_standby_offset(spec.standby, spec.target_waiting_per_replica)
    out = [Trigger("waiting-requests", waiting_query(model, namespace, offset), spec.target_waiting_per_replica,
                   "AverageValue"),
           Trigger("engine-demand", demand_query(model, namespace, spec.target_requests_per_replica, spec.standby),
                   1, "AverageValue")]
    if spec.kv_cache_usage_ceiling is not None:
        out.append(Trigger("kv-cache-usage", kv_cache_query(model, namespace), spec.kv_cache_usage_ceiling, "Value"))
    return tuple(out)


def scale_down_hold_seconds(startup_budget_seconds: int) -> int:
    """How long the HPA keeps the highest recent recommendation before removing replicas: the
    model's start-up budget (a replica taken away now costs that much to bring back), at least
    HPA's default 5 minutes, at most the 1 hour Kubernetes allows."""
    if startup_budget_seconds < 0:
        raise ValueError("startup_budget_seconds must be >= 0")
    return min(MAX_STABILIZATION_SECONDS, max(MIN_SCALE_DOWN_HOLD_SECONDS, startup_budget_seconds))


def scale_down_period_seconds(startup_budget_seconds: int) -> int:
    """Removals are one pod per this period. While the window holds the whole budget (it is at
    most the one hour Kubernetes allows), the window alone keeps a pod a scale-up started while it
    loads, so once the window has passed the pods go at the HPA's own pace (one per 15 s sync) and a
    falling load is back at the floor within one window; past the cap, the period keeps the
    spacing of removals at least the budget (up to Kubernetes's 30 minutes)."""
    if startup_budget_seconds <= MAX_STABILIZATION_SECONDS:
        return SCALE_UP_PERIOD_SECONDS
    return min(MAX_POLICY_PERIOD_SECONDS, max(SCALE_UP_PERIOD_SECONDS, startup_budget_seconds))


def plan_scaling(model: str, namespace: str, spec: AutoscalingSpec, startup_budget_seconds: int,
                 deployment: str | None = None, front_queue_service: str | None = None,
                 standby_pool: str | None = None) -> ScalingPlan:
    """The ScaledObject's decisions for one model (whose spec passed `check_spec`).
    `front_queue_service`: the Service in front of the model's routers when their front queues
    hold requests; at zero pods (minReplicas 0, no standby) KEDA reads them to scale from zero."""
    hold = scale_down_hold_seconds(startup_budget_seconds)
    from_zero = spec.min_replicas + spec.standby == 0
    if from_zero and front_queue_service is None:
        raise ValueError(f"{model}: zero pods needs the front queues' Service to scale from")
    queue = front_queue_trigger(front_queue_service, namespace) if from_zero and front_queue_service else None
    return ScalingPlan(
        model=model, namespace=namespace, deployment=deployment or model,
        # Pods, awake plus standby: the sleepers are never KEDA's to remove.
        min_replicas=spec.min_replicas + spec.standby, max_replicas=spec.max_replicas + spec.standby,
        polling_interval_seconds=FROM_ZERO_POLLING_INTERVAL_SECONDS if queue else POLLING_INTERVAL_SECONDS,
        queue_trigger=queue,
        standby_trigger=standby_trigger(model, namespace) if spec.standby else
        standby_trigger(model, namespace, standby_pool) if standby_pool else None,
        # cooldownPeriod only governs the last replica's removal (1 -> 0), so it matters at zero
        # pods only; it waits out the budget there too, counted from the last poll that found a
        # trigger active (a request held or in flight).
        cooldown_period_seconds=max(hold, startup_budget_seconds),
        scale_down_stabilization_seconds=hold,
        scale_down_period_seconds=scale_down_period_seconds(startup_budget_seconds),
        triggers=triggers(model, namespace, spec),
    )


def hpa_behavior(p: ScalingPlan) -> dict:
    """`advanced.horizontalPodAutoscalerConfig.behavior` (autoscaling/v2 HPABehavior)."""
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "tolerance": HPA_TOLERANCE,
            "selectPolicy": "Max",
            "policies": [
                {"type": "Percent", "value": SCALE_UP_PERCENT, "periodSeconds": SCALE_UP_PERIOD_SECONDS},
                {"type": "Pods", "value": SCALE_UP_PODS, "periodSeconds": SCALE_UP_PERIOD_SECONDS},
            ],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": p.scale_down_stabilization_seconds,
            "tolerance": HPA_TOLERANCE,
            "selectPolicy": "Min",
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": p.scale_down_period_seconds}],
        },
    }


# --------------------------------------------------------------------------------------
# Config rules


def check_spec(spec: AutoscalingSpec, *, key: str, model: str, front_queue: bool = False,
               replicas: int | None = None, replicas_key: str | None = None) -> None:
    """The block's own rules, all reported together (ConfigErrors keyed `<key>.<field>`, e.g.
    `warmstart:models[0].autoscaling.maxReplicas`). `replicas`: the model's `replicas` when the
    user set it explicitly (None otherwise); it must lie within [min, max]."""
    p = Problems()
    if spec.min_replicas < 0:
        p.add(f"{key}.minReplicas", f"{model}: must be >= 0", "set minReplicas >= 1", spec.min_replicas)
    elif spec.min_replicas == 0 and not front_queue:
        p.add(f"{key}.minReplicas",
              f"{model}: minReplicas=0 needs the router's front queue, which holds requests while no engine "
              "serves and tells KEDA to scale back out, and the model has no router (routing.policy none, or "
              "auto with at most one replica)",
              "set minReplicas >= 1, or give the model a router (routing.policy: prefix_hash or round_robin, "
              "or maxReplicas >= 2)", 0)
    if spec.max_replicas < 1:
        p.add(f"{key}.maxReplicas", f"{model}: must be >= 1", "set maxReplicas >= 1", spec.max_replicas)
    if spec.min_replicas > spec.max_replicas:
        p.add(f"{key}.minReplicas", f"{model}: minReplicas={spec.min_replicas} is above maxReplicas="
              f"{spec.max_replicas}", f"set minReplicas <= {spec.max_replicas} or maxReplicas >= {spec.min_replicas}",
              spec.min_replicas)
    elif spec.min_replicas == spec.max_replicas:
        p.add(f"{key}.maxReplicas", f"{model}: equals minReplicas={spec.min_replicas}, so KEDA could never "
              "change the replica count", f"set maxReplicas > {spec.min_replicas}, or remove autoscaling and set "
              f"replicas: {spec.min_replicas}", spec.max_replicas)
    if not (spec.target_requests_per_replica > 0 and math.isfinite(spec.target_requests_per_replica)):
        p.add(f"{key}.targetRequestsPerReplica", f"{model}: must be a positive number of requests",
              f"use e.g. {DEFAULT_TARGET_REQUESTS_PER_REPLICA:g}", spec.target_requests_per_replica)
    if not (spec.target_waiting_per_replica > 0 and math.isfinite(spec.target_waiting_per_replica)):
        p.add(f"{key}.targetWaitingPerReplica", f"{model}: must be a positive number of requests",
              f"use e.g. {DEFAULT_TARGET_WAITING_PER_REPLICA:g}", spec.target_waiting_per_replica)
    c = spec.kv_cache_usage_ceiling
    if c is not None and not 0 < c <= 1:
        p.add(f"{key}.kvCacheUsageCeiling", f"{model}: {KV_CACHE_METRIC} is a fraction (0-1]",
              "use e.g. 0.8 for 80 %", c)
    if replicas is not None and spec.min_replicas <= spec.max_replicas and not (
            spec.min_replicas <= replicas <= spec.max_replicas):
        p.add(replicas_key or f"{key.rsplit('.', 1)[0]}.replicas",
              f"{model}: the replica count belongs to KEDA once autoscaling is on, and {replicas} is outside "
              f"[minReplicas={spec.min_replicas}, maxReplicas={spec.max_replicas}]",
              "remove replicas (the Deployment starts at minReplicas)", replicas)
    p.raise_if_any()


def initial_replicas(spec: AutoscalingSpec) -> int:
    """The Deployment's `replicas` on its first create; KEDA owns the field from then on."""
    return spec.min_replicas + spec.standby


def capacity_pool_model(m: PoolModel, spec: AutoscalingSpec | None) -> PoolModel:
    """The model as the pool's GPU limit must see it: at `maxReplicas` when autoscaled."""
    return m if spec is None else replace(m, replicas=spec.max_replicas + spec.standby)


@dataclass(frozen=True)
class PoolDemand:
    """GPUs one model may take on its pool at its ceiling (plus a rollout's surge pod)."""

    model: str
    pods: int
    nodes: int
    gpus: int
    autoscaled: bool
    standby: int = 0

    def describe(self, m: PoolModel) -> str:
        kind = "maxReplicas" if self.autoscaled else "replicas"
        asleep = f"+standby.count={self.standby}" if self.standby else ""
        return (f"{self.model} {kind}={self.pods - SURGE_PODS - self.standby}{asleep}+{SURGE_PODS} surge = {self.pods} pods x "
                f"TP {m.tensor_parallel_size} on {m.instance.instance_type} = {self.nodes} nodes x "
                f"{m.instance.gpu_count} GPUs = {self.gpus}")


def pool_demand(models: Sequence[PoolModel], autoscaled: Mapping[str, AutoscalingSpec]) -> list[PoolDemand]:
    """Per model on a pool: pods at the ceiling (maxReplicas when autoscaled, else replicas) plus
    one surge pod, in whole nodes of its type, as Karpenter counts them against `limits`."""
    out = []
    for m in models:
        spec = autoscaled.get(m.name)
        cm = capacity_pool_model(m, spec)
        pods = cm.replicas + SURGE_PODS
        nodes = nodes_for(cm, pods)
        out.append(PoolDemand(m.name, pods, nodes, nodes * m.instance.gpu_count, spec is not None,
                              spec.standby if spec is not None else 0))
    return out


def pool_gpus_needed(models: Sequence[PoolModel], autoscaled: Mapping[str, AutoscalingSpec]) -> int:
    """The pool's GPU limit that holds every model at its ceiling plus one surge pod, the pods of
    all of them packed onto whole nodes (`gpu_pools.packed_gpus`): the maxReplicas-aware
    replacement of `gpu_pools.default_max_gpus`."""
    return packed_gpus((capacity_pool_model(m, autoscaled.get(m.name)),
                        capacity_pool_model(m, autoscaled.get(m.name)).replicas + SURGE_PODS) for m in models)


def default_pool_max_gpus(models: Sequence[PoolModel], autoscaled: Mapping[str, AutoscalingSpec],
                          largest_node_gpus: int) -> int:
    """Default NodePool GPU limit (`maxGpus` not set): every model at maxReplicas (or replicas)
    plus a surge pod; a pool with no model may still launch one node of its largest type."""
    return max(pool_gpus_needed(models, autoscaled), largest_node_gpus)


def check_pool_capacity(pool: str, max_gpus: int, models: Sequence[PoolModel],
                        autoscaled: Mapping[str, AutoscalingSpec], *, model_keys: Mapping[str, str],
                        pool_key: str) -> None:
    """A pool whose `maxGpus` cannot hold every model at its ceiling plus one surge pod is a
    config error, with the numbers. Keyed `<model key>.autoscaling.maxReplicas` of each
    autoscaled model on the pool (`model_keys`: name -> `warmstart:models[i]`), or
    `<pool_key>.maxGpus` when no model on it autoscales."""
    demand = pool_demand(models, autoscaled)
    need = pool_gpus_needed(models, autoscaled)
    if need <= max_gpus:
        return
    by_name = {m.name: m for m in models}
    detail = "; ".join(d.describe(by_name[d.model]) for d in demand)
    rule = (f"pool {pool!r} allows maxGpus={max_gpus} but its models at their ceiling plus one surge pod each "
            f"need {need} GPUs packed on whole nodes ({detail}), so Karpenter would stop launching nodes before "
            "KEDA reaches maxReplicas and the extra pods would stay Pending")
    p = Problems()
    scaled = [d for d in demand if d.autoscaled]
    for d in scaled:
        m = by_name[d.model]
        spare = max_gpus - pool_gpus_needed([o for o in models if o.name != d.model], autoscaled)
        per_node = m.instance.gpu_count // m.tensor_parallel_size
        fit = (spare // m.instance.gpu_count) * per_node - SURGE_PODS - d.standby if spare > 0 else -SURGE_PODS
        lower = (f"lower {d.model}'s maxReplicas to {fit}" if fit >= max(1, autoscaled[d.model].min_replicas)
                 else f"move {d.model} to another pool")
        if d.standby:
            # Standby engines hold GPUs of the pool too (KEDA's range is maxReplicas + standby.count).
            lower += f", or lower its standby.count from {d.standby}"
        p.add(f"{model_keys[d.model]}.autoscaling.maxReplicas", rule,
              f"{lower}, or raise {pool_key}.maxGpus to >= {need} (or remove it to derive it)",
              autoscaled[d.model].max_replicas)
    if not scaled:
        p.add(f"{pool_key}.maxGpus", rule, f"set maxGpus >= {need}, or remove it to derive it", max_gpus)
    p.raise_if_any()


def check_pool_can_grow(pool: str | None, *, key: str, model: str) -> None:
    """Autoscaling adds pods that need new GPU nodes: a model not tied to a NodePool (the
    VllmModel component without `nodePool`) has nothing warmstart sized to launch them."""
    if pool is None:
        raise ConfigError(f"{key}.maxReplicas", f"{model}: is not on a NodePool, so no pool limit was sized for "
                          "its maxReplicas and nothing warmstart manages launches nodes for the pods KEDA adds",
                          "run the model on a gpuPools entry (nodePool), or remove autoscaling", None)


# --------------------------------------------------------------------------------------
# How long a scale-out takes


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float
    source: str
    """Where the number comes from (a URL, or the warmstart constant and its own source)."""
    skipped_with_warm_spare: bool = False
    """A warm spare node (already launched, image pulled) takes this phase off the path."""


@dataclass(frozen=True)
class ScaleOutEstimate:
    """Upper bounds, phase by phase, from the queue building up to the new replica serving."""

    phases: tuple[Phase, ...]

    @property
    def cold_seconds(self) -> float:
        """With a new node to launch."""
        return sum(p.seconds for p in self.phases)

    @property
    def warm_spare_seconds(self) -> float:
        """With a spare node up and its image pulled."""
        return sum(p.seconds for p in self.phases if not p.skipped_with_warm_spare)


def detection_phases(scrape_interval_s: int = SCRAPE_INTERVAL_SECONDS, hpa_sync_s: int = HPA_SYNC_SECONDS,
                     polling_interval_s: int = POLLING_INTERVAL_SECONDS) -> tuple[Phase, ...]:
    """From a queue building up to the Deployment asking for another pod: a scrape to see it,
    then the slower of the HPA's sync and KEDA's polling to act on it."""
    return (
        Phase("metric scrape", scrape_interval_s,
              "AMP managed collector scrape interval (>= 30 s): https://docs.aws.amazon.com/prometheus/latest/"
              "userguide/AMP-collector-how-to.html#AMP-collector-configuration"),
        Phase("HPA sync / KEDA polling", max(hpa_sync_s, polling_interval_s),
              "kube-controller-manager --horizontal-pod-autoscaler-sync-period (15 s) and the ScaledObject's "
              "pollingInterval"),
    )


def scale_out_estimate(*, node_launch_s: float, node_launch_source: str, image_s: float, image_source: str,
                       weights_s: float, weights_source: str, compile_s: float, compile_source: str,
                       detection: Sequence[Phase] | None = None,
                       engine: Sequence[Phase] = ()) -> ScaleOutEstimate:
    """The whole path; the caller passes the cold-start constants or measurements it has, each
    with its source, so the render never shows a number without one. `engine`: the engine
    phases after the compile (engine init, CUDA graphs) as their own steps, when the caller
    keeps them out of `compile_s`."""
    return ScaleOutEstimate(tuple(detection if detection is not None else detection_phases()) + (
        Phase("node launch", node_launch_s, node_launch_source, skipped_with_warm_spare=True),
        Phase("image pull", image_s, image_source, skipped_with_warm_spare=True),
        Phase("weights", weights_s, weights_source),
        Phase("compile / engine start", compile_s, compile_source),
    ) + tuple(engine))


# --------------------------------------------------------------------------------------
# The KEDA operator's IAM

# Exactly the query actions (the AWS managed AmazonPrometheusQueryAccess policy's set,
# https://docs.aws.amazon.com/prometheus/latest/userguide/security-iam-awsmanpol.html): KEDA's
# prometheus scaler only calls /api/v1/query, the rest lets an operator debug with the same role.
AMP_QUERY_ACTIONS = ("aps:GetLabels", "aps:GetMetricMetadata", "aps:GetSeries", "aps:QueryMetrics")


def keda_query_policy(workspace_arn: str) -> dict:
    """What the KEDA operator may do: query the one workspace, nothing else (no write, no
    other workspace, no wildcard resource)."""
    if not re.fullmatch(r"arn:aws[a-z-]*:aps:[a-z0-9-]+:[0-9]{12}:workspace/[A-Za-z0-9_-]+", workspace_arn):
        raise ValueError(f"{workspace_arn!r} is not an AMP workspace ARN")
    return {"Version": "2012-10-17", "Statement": [{
        "Sid": "QueryOneWorkspace", "Effect": "Allow", "Action": list(AMP_QUERY_ACTIONS), "Resource": workspace_arn}]}


def keda_operator_role_name(name_prefix: str) -> str:
    """`<namePrefix>-keda-operator` (a name prefix is at most 20 characters, so this stays
    within IAM's 64)."""
    name = f"{name_prefix}-keda-operator"
    if not naming.role_name_valid(name):
        raise ValueError(f"{name!r} is not a valid IAM role name")
    return name
