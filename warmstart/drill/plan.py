"""What a drill run would do and what it predicts, before it touches the cluster: pure functions
of the stack's plan and the command's bounds, so the dry run prints exactly what a real run does.

A run changes at most these, each recorded where a restore finds it (restore.py):
- a load Job (created; bounded by its own `activeDeadlineSeconds`, removed by the Job
  controller's `ttlSecondsAfterFinished`);
- for a model without autoscaling, the Deployment's replicas through the scale subresource
  (the previous count kept in the Deployment's `warmstart.io/drill-replicas` annotation): an
  autoscaled model is left to its autoscaler, whose answer to the load is what the drill measures
  (a replica count the drill set would be overwritten at the HPA's next sync anyway);
- one standalone pod cloned from the model's pod template with the caches bypassed (`--fallback`,
  on by default), bounded by its own `activeDeadlineSeconds`; the Deployment's template is never
  changed, which would roll every GPU pod;
- with `--lose-prepared-node` only: a node holding staged weights cordoned and its model pods
  evicted;
- the restore Job with its ServiceAccount, Role and RoleBinding, which undoes the rest at the
  run's expiry if the client is gone.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from ..coldstart.report import SLOW_FACTOR, SLOW_MIN_EXTRA_S
from ..decisions import autoscaling as scaling
from ..decisions import capacity, phases
from ..manifests.serving import ENGINE_LABEL, HTTP_PORT
from . import restore as _restore

# Paths a new replica can take, fastest first (docs/drill.md). `s3 fallback`: a pod of a model
# whose weights are staged on its nodes that landed on a node without them (the weights picker's
# miss, warmstart/podside/weights_select.py) and streamed from S3, its degraded start.
WAKE, WARM_SPARE, NEW_NODE, COLD = "wake", "warm spare", "new node", "cold"
S3_FALLBACK = "s3 fallback"
PATHS = (WAKE, WARM_SPARE, S3_FALLBACK, NEW_NODE, COLD)

# Where a run is recorded on the objects it changed (restore.py reads them).
RUN_LABEL = "warmstart.io/drill-run"
EXPIRES_ANNOTATION = "warmstart.io/drill-expires"
REPLICAS_ANNOTATION = "warmstart.io/drill-replicas"
CORDON_ANNOTATION = "warmstart.io/drill-cordoned"
DO_NOT_DISRUPT, PROTECT_ANNOTATION = _restore.DO_NOT_DISRUPT, _restore.PROTECT_ANNOTATION
# How long the drill retries an eviction the PodDisruptionBudget refuses (429, "retry later",
# https://kubernetes.io/docs/concepts/scheduling-eviction/api-eviction/) before it says so.
EVICTION_RETRY_S = 120

# Bounds no flag can lift: the drill must stay a drill on a shared cluster.
MAX_DURATION_S = 3600
MAX_RATE = 50.0
MAX_CONCURRENCY = 256
# After the load ends, how long the run waits for the replicas the step started to serve: a new
# node's whole start is predicted at ~5-6 minutes for the shipped stacks (warmstart render).
DEFAULT_SETTLE_S = 900
# Slack the restore Job leaves after the run's own deadline before it acts: a client still
# running restores first.
RESTORE_SLACK_S = 300


@dataclass(frozen=True)
class Bounds:
    """The load: `rate` requests per second for `duration_s`, at most `concurrency` in flight and
    `max_requests` in all; each prompt one of `prefix_groups` shared prefixes plus its own tail."""

    rate: float = 4.0
    duration_s: int = 600
    concurrency: int = 32
    max_requests: int = 0
    """0: rate x duration."""
    max_tokens: int = 32
    prefix_groups: int = 8
    settle_s: int = DEFAULT_SETTLE_S

    @property
    def request_cap(self) -> int:
        whole = math.ceil(self.rate * self.duration_s)
        return min(whole, self.max_requests) if self.max_requests else whole

    @property
    def deadline_s(self) -> int:
        """The whole run: the load, then the settle wait for the last replica."""
        return self.duration_s + self.settle_s


def check_bounds(b: Bounds) -> list[tuple[str, str, str, Any]]:
    """(flag, rule, fix, value) for each bound out of range."""
    out = []
    if not 0 < b.rate <= MAX_RATE:
        out.append(("--rate", f"requests per second in (0, {MAX_RATE:g}]", f"pass --rate between 0.1 and {MAX_RATE:g}", b.rate))
    if not 10 <= b.duration_s <= MAX_DURATION_S:
        out.append(("--duration", f"seconds in [10, {MAX_DURATION_S}]", "pass a shorter --duration", b.duration_s))
    if not 1 <= b.concurrency <= MAX_CONCURRENCY:
        out.append(("--concurrency", f"in [1, {MAX_CONCURRENCY}]", "pass a smaller --concurrency", b.concurrency))
    if b.max_requests < 0:
        out.append(("--max-requests", ">= 0 (0: rate x duration)", "pass 0 or a positive count", b.max_requests))
    if not 1 <= b.max_tokens <= 1024:
        out.append(("--max-tokens", "in [1, 1024]", "pass a smaller --max-tokens", b.max_tokens))
    if not 1 <= b.prefix_groups <= 64:
        out.append(("--prefix-groups", "in [1, 64]", "pass between 1 and 64", b.prefix_groups))
    if not 0 <= b.settle_s <= MAX_DURATION_S:
        out.append(("--settle", f"seconds in [0, {MAX_DURATION_S}]", "pass a shorter --settle", b.settle_s))
    return out


@dataclass(frozen=True)
class Prediction:
    """A path's predicted seconds from the replica being requested (the load step for a wake) to
    its first successful inference, and where the number comes from."""

    seconds: float
    basis: str

    def limit(self) -> float:
        """The tolerance: the cold-start report's bar for a slow phase (more than SLOW_FACTOR x and
        at least SLOW_MIN_EXTRA_S over; warmstart/coldstart/report.py)."""
        return max(self.seconds * SLOW_FACTOR, self.seconds + SLOW_MIN_EXTRA_S)

    def tolerance(self) -> str:
        return f"<= {self.limit():.1f} s (max({SLOW_FACTOR:g}x, +{SLOW_MIN_EXTRA_S:g} s))"


def predictions(m: Any, warm_nodes: int) -> dict[str, Prediction]:
    """Each path's prediction, from the constants `warmstart render` prints (decisions/phases.py):
    a wake (standby models; the actuator's signal is not counted, the step's start is the wake's
    request), a pod on a warm spare (pools with warmNodes), on a new node, and the cache-bypassed
    pod (`cold`: weights streamed from S3, compile and engine state cold, on a node that already
    has the image)."""
    out: dict[str, Prediction] = {}
    if m.standby is not None:
        s = phases.predict_standby_start(m.weights_bytes, m.instance, m.standby.sleep_level)
        out[WAKE] = Prediction(s.wake + s.first_token, phases.FMA_README)
    staged = bool(getattr(m, "staged", False))
    if warm_nodes:
        w = phases.predict_cold_start(m.weights_bytes, m.instance, new_node=False, compile_cached=m.compile_cache,
                                      image_present=True, weights_source="node-cache" if staged else "s3")
        out[WARM_SPARE] = Prediction(w.total_seconds, phases.EKS_GUIDE)
    if staged:
        f = phases.predict_cold_start(m.weights_bytes, m.instance, new_node=False, compile_cached=m.compile_cache,
                                      image_present=True, weights_source="s3")
        out[S3_FALLBACK] = Prediction(f.total_seconds, phases.EKS_GUIDE)
    n = phases.predict_cold_start(m.weights_bytes, m.instance, new_node=True, compile_cached=m.compile_cache,
                                  image_present=False, parallel_pull=True)
    out[NEW_NODE] = Prediction(n.total_seconds, phases.EKS_GUIDE)
    c = phases.predict_cold_start(m.weights_bytes, m.instance, new_node=False, compile_cached=False,
                                  image_present=True)
    out[COLD] = Prediction(c.total_seconds, phases.BLOG)
    return out


def wake_only(m: Any) -> Prediction | None:
    """The wake phase alone (what the actuator's record times), for the wake line's detail."""
    if m.standby is None:
        return None
    return Prediction(phases.wake_seconds(m.weights_bytes, m.standby.sleep_level, m.instance), phases.FMA_README)


# The switch the pod scripts honour (warmstart/podside/compile_cache.py's restore): set only on
# the drill's standalone pod, never on the Deployment's template.
BYPASS_ENV = "WARMSTART_CACHE_BYPASS"


def load_job_name(run_id: str) -> str:
    return f"drill-load-{run_id}"


def fallback_pod_name(model: str, run_id: str) -> str:
    return f"{model}-drill-cold-{run_id}"[:63].rstrip("-")


def restore_name(run_id: str) -> str:
    return f"drill-restore-{run_id}"


def router_url(model: str, namespace: str) -> str:
    """The model's one endpoint (its Service, in front of the routers when it has them,
    warmstart/manifests/serving.py `service_spec`), from inside the cluster."""
    return f"http://{model}.{namespace}.svc:{HTTP_PORT}"


@dataclass(frozen=True)
class Change:
    """One change a run makes, as the dry run prints it, and how it is undone."""

    verb: str
    target: str
    detail: str
    undo: str


@dataclass(frozen=True)
class Cost:
    """What the drill's own replicas can cost at most, at the price `warmstart render` uses (the
    pool's first-choice capacity, `capacity.price_of`): the GPUs of every pod the drill can add
    (an autoscaled model up to `maxReplicas` from `minReplicas`, or the one replica it adds
    itself; the bypassed pod; with --lose-prepared-node the evicted pods' replacements) for the
    run and, for an autoscaled model, the HPA's scale-down hold after it
    (decisions/autoscaling.py `scale_down_hold_seconds`); and the whole nodes a launch for them
    bills (pods never span nodes)."""

    pods: int
    gpus: int
    hours: float
    nodes: int
    node_hour_usd: float | None
    price_key: str
    gpus_per_node: int
    where: str = "the stack file"
    source: str = ""
    """Where the node-hour comes from, as the render's price line says it (hourlyPriceUsd, the
    shipped on-demand list price and its date), or why it is unknown."""

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.hours

    @property
    def gpu_usd(self) -> float | None:
        return None if self.node_hour_usd is None else self.gpu_hours * self.node_hour_usd / self.gpus_per_node

    @property
    def nodes_usd(self) -> float | None:
        return None if self.node_hour_usd is None else self.nodes * self.hours * self.node_hour_usd

    def text(self) -> str:
        held = (f"at most {self.gpus} GPU(s) ({self.pods} pod(s)) for up to {self.hours:.2f} h: "
                f"{self.gpu_hours:.1f} GPU-hours")
        if self.node_hour_usd is None:
            why = f" ({self.source.removeprefix('unknown: ')})" if self.source.startswith("unknown: ") else ""
            return (f"{held}; price unknown{why}: set gpuPools[].{self.price_key} in {self.where} "
                    "(warmstart render prices nodes with it)")
        return (f"{held} x {capacity.usd(self.node_hour_usd)}/node-hour ({self.source or self.price_key}) / "
                f"{self.gpus_per_node} GPUs "
                f"= {capacity.usd(self.gpu_usd)}; {capacity.usd(self.nodes_usd)} if each needs a node of its own "
                f"({self.nodes} node(s) launched)")


def cost(m: Any, pool: Any, bounds: Bounds, *, fallback: bool, lose_node: bool,
         listed: tuple[float | None, str] | None = None) -> Cost:
    per_node = max(1, m.instance.gpu_count // m.tensor_parallel_size)
    hold = 0
    if m.autoscaling is not None:
        added = m.autoscaling.max_replicas - m.autoscaling.min_replicas
        hold = scaling.scale_down_hold_seconds(m.startup_budget_seconds)
    else:
        added = 1
    evicted = per_node if lose_node else 0
    pods = added + (1 if fallback else 0) + evicted
    nodes = math.ceil((added + (1 if fallback else 0)) / per_node) + (1 if lose_node else 0)
    ctype = pool.capacity.types[0] if pool is not None else "onDemand"
    if pool is not None:
        price = capacity.price_of(ctype, pool.hourly_price_usd, pool.capacity.spot_hourly_price_usd)
        # The pool plan's price is the stack's own hourlyPriceUsd or the shipped list price
        # (plan/cluster.py `price_source` says which), as the render's table shows it.
        source = "capacity.spotHourlyPriceUsd" if ctype == "spot" else pool.price_source
    else:
        price, source = listed if listed is not None else (None, "unknown")
    key = "capacity.spotHourlyPriceUsd" if ctype == "spot" else "hourlyPriceUsd"
    return Cost(pods, pods * m.tensor_parallel_size, (bounds.deadline_s + hold) / 3600, nodes, price, key,
                m.instance.gpu_count, "the stack file" if pool is not None else "the platform stack's file",
                source)


@dataclass
class DrillPlan:
    stack: str
    model: str
    namespace: str
    run_id: str
    started_at: datetime
    bounds: Bounds
    predictions: dict[str, Prediction]
    scale_to: int | None
    """The replicas the drill sets itself (a model without autoscaling); None: left to the autoscaler."""
    fallback: bool
    lose_node: bool
    changes: list[Change] = field(default_factory=list)
    cost: Cost | None = None

    @property
    def expires_at(self) -> datetime:
        return self.started_at + timedelta(seconds=self.bounds.deadline_s + RESTORE_SLACK_S)


def new_run_id(now: datetime) -> str:
    """Short, DNS-label safe, sortable by time: `d<yymmddHHMM>-<4 hex>`."""
    return f"d{now.strftime('%y%m%d%H%M')}-{secrets.token_hex(2)}"


def plan(stack: str, m: Any, namespace: str, warm_nodes: int, bounds: Bounds, *, fallback: bool = True,
         lose_node: bool = False, now: datetime | None = None, run_id: str | None = None,
         pool: Any = None, listed: tuple[float | None, str] | None = None) -> DrillPlan:
    """What a run of the drill on model `m` does, change by change. `pool`: the model's GPU pool
    plan (its price), None in a model stack, whose node-hour and its source are `listed` (the
    render's `model_stack_price`)."""
    now = now or datetime.now(timezone.utc)
    rid = run_id or new_run_id(now)
    scale_to = None if m.autoscaling is not None else m.replicas + 1
    p = DrillPlan(stack, m.name, namespace, rid, now, bounds, predictions(m, warm_nodes), scale_to, fallback,
                  lose_node, cost=cost(m, pool, bounds, fallback=fallback, lose_node=lose_node, listed=listed))
    exp = p.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    p.changes.append(Change(
        "create", f"Job {namespace}/{load_job_name(rid)}",
        f"{bounds.rate:g} requests/s for {bounds.duration_s} s (at most {bounds.request_cap} requests, "
        f"{bounds.concurrency} in flight), {bounds.prefix_groups} shared prefixes, through "
        f"{router_url(m.name, namespace)}; activeDeadlineSeconds {bounds.duration_s + 120}",
        "deleted at the end (ttlSecondsAfterFinished 600 removes it anyway)"))
    if scale_to is not None:
        p.changes.append(Change(
            "patch", f"Deployment {namespace}/{m.name} (scale subresource)",
            f"replicas {m.replicas} -> {scale_to} (no autoscaling: the drill adds the replica itself); "
            f"annotation {REPLICAS_ANNOTATION}={m.replicas}",
            f"replicas back to {m.replicas}, the annotation removed"))
    else:
        a = m.autoscaling
        p.changes.append(Change(
            "none", f"Deployment {namespace}/{m.name}",
            f"left to its autoscaler (replicas {a.min_replicas}-{a.max_replicas}, a standby engine woken first)"
            if m.standby else f"left to its autoscaler (replicas {a.min_replicas}-{a.max_replicas})",
            "the autoscaler scales back after its cooldown"))
    if fallback:
        p.changes.append(Change(
            "create", f"Pod {namespace}/{fallback_pod_name(m.name, rid)}",
            "cloned from the Deployment's pod template, node weights cache and compile caches bypassed "
            f"({BYPASS_ENV}=1), out of the router (no {ENGINE_LABEL} label); "
            f"activeDeadlineSeconds {bounds.deadline_s}", "deleted"))
    if lose_node:
        p.changes.append(Change(
            "patch", "Node <a node holding staged weights of the model, chosen at run time>",
            f"cordoned (spec.unschedulable true, annotation {CORDON_ANNOTATION}={rid}) and kept from Karpenter's "
            f"consolidation ({DO_NOT_DISRUPT}=true unless already set); its pods of the model evicted (policy/v1 "
            f"Eviction, which honours the PodDisruptionBudget: a 429 is retried for {EVICTION_RETRY_S} s, then reported)",
            f"uncordoned, the annotations removed ({DO_NOT_DISRUPT} only if the drill set it)"))
    p.changes.append(Change(
        "create", f"ServiceAccount, Role, RoleBinding and Job {namespace}/{restore_name(rid)}"
        + (" (and a ClusterRole/ClusterRoleBinding to uncordon)" if lose_node else ""),
        f"the in-cluster expiry: at {exp} it undoes whatever this run left (a lost connection, a killed client)",
        "deleted at the end; left alone, it deletes its own objects after acting"))
    return p


def describe(p: DrillPlan) -> str:
    """The dry run's text: every change, the bounds and the predictions the run is held to."""
    lines = [f"drill {p.run_id} on stack {p.stack}, model {p.model} (namespace {p.namespace}); expires {p.expires_at:%Y-%m-%dT%H:%M:%SZ}",
             "", "changes:"]
    for c in p.changes:
        lines.append(f"  {c.verb:6s} {c.target}\n         {c.detail}\n         restore: {c.undo}")
    b = p.bounds
    lines += ["", "bounds:", f"  load      {b.rate:g} requests/s for {b.duration_s} s, at most {b.request_cap} requests, "
              f"{b.concurrency} in flight; then up to {b.settle_s} s for the replicas it started (run deadline "
              f"{b.deadline_s} s)"]
    if p.cost is not None:
        lines.append(f"  cost      {p.cost.text()}")
    lines += ["", "predicted (request -> first successful inference), pass when measured is within the tolerance:"]
    for path, pr in p.predictions.items():
        lines.append(f"  {path:10s} {pr.seconds:7.1f} s  {pr.tolerance()}  [{pr.basis}]")
    return "\n".join(lines)
